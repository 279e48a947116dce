#pragma once
/// \file analyze.hpp
/// `mfattn analyze FILE [--json] [--replica R|all] [--min-decades D]`: collapse and metastability summary of a
/// finished, running or interrupted mfattn file (docs/model.md section 6, docs/analyze.md).
///
/// Per frame f (time t_f) of one replica it uses the stored n_clusters, min_inner and energy;
/// files without n_clusters (or min_inner) get them recomputed from the stored positions with
/// the definition of observables.hpp (tokens with p > 0, delta_c = cluster_delta).
///   collapsed        min_inner(T) >= 1 - collapse_delta at the last frame
///   collapse_time    the first t_k with min_inner(t_f) >= 1 - collapse_delta for every f >= k
///                    (none when the last frame is not collapsed)
///   plateaus         maximal runs of consecutive frames with the same n_clusters, in time
///                    order: t_start, t_end = times of the run's first and last frame,
///                    dwell = t_end - t_start, decades = log10(t_end / t_start) when t_start > 0
///                    (undefined for the plateau that starts at t = 0: the initial state is
///                    not a metastable one), energy_end = energy at its last frame. A plateau
///                    is metastable when decades >= metastable_decades (1) and it is not the
///                    final one (the final plateau is where the run ends; it is marked final).
///   merge_times      frames where n_clusters decreases from the previous frame (time, from, to);
///                    split_times the same for increases
///   energy_monotone  no frame has E_f < E_{f-1} - energy_tolerance * max(|E_f|, |E_{f-1}|)
///                    (unknown when an energy is not finite, e.g. beta = 0); shown next to
///                    /parameters/gradient_flow, which says whether E must be nondecreasing
///   energy_staircase energy_end of every plateau, in order
#include <cstddef>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace mfattn {

struct AnalysisSettings {
  /// delta_c of recomputed cluster counts; a file whose /parameters carry `cluster-delta`
  /// uses that value instead (so recomputed counts match the stored ones).
  double cluster_delta = 1e-4;
  /// collapsed: min_inner >= 1 - collapse_delta. The same default as the cluster delta: a
  /// collapsed state is one cluster in which every pair is an edge. Follows `cluster-delta`
  /// of the file too.
  double collapse_delta = 1e-4;
  double metastable_decades = 1.0;
  double energy_tolerance = 1e-12;  ///< relative
};

struct Plateau {
  std::size_t clusters = 0;
  std::size_t first_frame = 0, last_frame = 0;
  double t_start = 0.0, t_end = 0.0, dwell = 0.0;
  double decades = 0.0;     ///< NaN when undefined
  double energy_end = 0.0;  ///< NaN when the file has no finite energy there
  bool metastable = false;
  bool final = false;
};

struct ClusterChange {
  std::size_t frame = 0;
  double time = 0.0;
  std::size_t from = 0, to = 0;
};

/// Per-frame series of one replica (all of the same length, at least one frame).
struct AnalysisSeries {
  std::vector<double> time;
  std::vector<std::size_t> clusters;
  std::vector<double> min_inner;
  std::vector<double> energy;  ///< may be empty (no energy): energies are then unknown
};

struct Analysis {
  // What was read.
  std::string file;
  std::optional<std::string> status;  ///< /run/status
  std::size_t replica = 0, replicas = 1, n = 0, d = 0, frames = 0;
  double t_first = 0.0, t_last = 0.0;
  bool clusters_from_positions = false;  ///< n_clusters recomputed (older file)
  double cluster_delta = 1e-4, collapse_delta = 1e-4;
  // Collapse.
  std::size_t final_clusters = 0;
  bool collapsed = false;
  std::optional<double> collapse_time;
  double min_inner_final = 0.0;
  double marginal_spread_final = 0.0;            ///< NaN when unknown
  std::optional<double> conditional_spread_final;  ///< only when the file has it
  // Metastability.
  std::vector<Plateau> plateaus;
  std::vector<ClusterChange> merges, splits;
  std::vector<double> energy_staircase;
  // Energy.
  double energy_final = 0.0;  ///< NaN when unknown
  std::optional<bool> energy_monotone;
  double energy_largest_drop = 0.0;  ///< largest relative decrease between frames (0 if none)
  std::optional<bool> gradient_flow;  ///< /parameters/gradient_flow
  /// Whether the file has an energy at all (states imported from another model have none).
  bool energy_in_file = true;
  /// /parameters/state_space: "sphere", or "euclidean" for imported states that are not unit
  /// vectors (their observables are those of their directions; docs/import.md).
  std::string state_space = "sphere";
};

/// The time-series part of the analysis (collapse, plateaus, merges, energy).
Analysis analyze_series(const AnalysisSeries& series, const AnalysisSettings& settings = {});

/// Reads `path` (replica `replica`) and analyses it. Throws IoError for unreadable or foreign
/// files and files without a complete frame, UsageError for a replica the file does not have.
Analysis analyze_file(const std::string& path, std::size_t replica = 0,
                      AnalysisSettings settings = {});

/// Plateaus shorter than this many decades are left out of the text listing by default: the
/// one-frame plateaus of a merging cascade (0 decades) say nothing (--min-decades D).
inline constexpr double kDefaultListedDecades = 0.05;

/// Whether the text lists plateau `p`: the final one, one of at least `min_decades` decades,
/// or one whose decades are undefined (it starts at t = 0) and that spans more than one frame.
bool plateau_listed(const Plateau& p, double min_decades);

/// One item per line: the collapse, a one-line summary of the metastable plateaus, the
/// plateaus plateau_listed keeps (and how many it left out), merges, splits, the energy.
void write_analysis_text(const Analysis& analysis, std::ostream& out,
                         double min_decades = kDefaultListedDecades);

/// `--replica all`: every replica of one file (analyses[r] of replica r) summed up: how many
/// collapsed, the replicas per final cluster count, the collapse times (min, median, max over
/// the collapsed ones), the replicas per number of metastable plateaus and the metastable
/// plateaus per cluster count; the JSON adds one short record per replica.
void write_replicas_text(const std::vector<Analysis>& analyses, std::ostream& out);
void write_replicas_json(const std::vector<Analysis>& analyses, std::ostream& out);
/// Exactly one JSON object (and a newline): numbers with 17 significant digits, NaN and
/// infinities as null, absent values as null. Every plateau, merge and split, each with
/// "listed": whether the text at min_decades lists it (a change: exactly, not folded into a
/// net step), and each plateau with "initial" (the first, before clustering starts).
void write_analysis_json(const Analysis& analysis, std::ostream& out,
                         double min_decades = kDefaultListedDecades);

/// `mfattn analyze FILE [--json] [--replica R|all] [--min-decades D]`; returns an exit code
/// (2 usage, 4 I/O).
int analyze_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace mfattn
