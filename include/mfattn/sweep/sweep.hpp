#pragma once
/// \file sweep.hpp
/// `mfattn sweep`: a grid of `mfattn run` cases from one sweep file (docs/sweeps.md).
///
/// A sweep file is a base config (any `run` option; sections are prefixes, as for
/// `run --config`) plus an [axes] section whose keys are `run` option names and whose values
/// are whitespace-separated lists, [zip] / [zip.LABEL] groups of axes that advance together,
/// and a [derived] section of `option = expression` lines. The cases are the Cartesian
/// product of the factors (each plain axis, each zip group; file order, last fastest); each
/// is the base plus one value per axis plus the derived values, turned into `run` arguments
/// and parsed by parse_run_arguments (the one option table, no second key list).
///
/// Case id: 64-bit FNV-1a of the case's resolved parameters that differ from the `run`
/// defaults, as "name=value\n" lines sorted by name, leaving out the execution options that do
/// not change the trajectory (out, config, threads, quiet, overwrite, resume), printed as 16
/// hex digits. The case writes DIR/<id>.h5 (first DIR/<id>.h5.part, renamed when it ends).
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mfattn/app/config.hpp"

namespace mfattn {

struct SweepAxis {
  std::string name;                 ///< a `run` option name, e.g. "n"
  std::vector<std::string> values;  ///< as written in the sweep file
  bool zipped = false;              ///< from a [zip] or [zip.LABEL] section
  std::string zip_label;            ///< LABEL of [zip.LABEL]; empty for [zip] and for [axes]
};

/// One `option = expression` line of [derived].
struct SweepDerived {
  std::string name;        ///< a numeric `run` option, e.g. "dt"
  std::string expression;  ///< as written
  std::size_t line = 0;    ///< its line in the sweep file
};

struct SweepCase {
  std::size_t index = 0;               ///< position in the grid (last factor fastest)
  std::string id;                      ///< 16 hex digits
  std::vector<std::string> values;     ///< one per axis
  std::vector<std::string> derived;    ///< one per derived option, the text passed to `run`
  std::vector<std::string> arguments;  ///< `run` arguments (base, axes, derived), without --out
};

struct SweepPlan {
  std::string path;                         ///< the sweep file
  std::vector<std::string> base_arguments;  ///< `run` arguments of the base config
  bool sets_threads = false;                ///< the file sets --threads (base, axis or derived)
  /// Every axis, factor by factor: a zip group's axes side by side (in file order).
  std::vector<SweepAxis> axes;
  /// The factors of the product, first (slowest) to last (fastest), each as the indices into
  /// `axes` of its axes: one for a plain axis, the group's for a zip group.
  std::vector<std::vector<std::size_t>> factors;
  std::vector<SweepDerived> derived;  ///< in file order
  std::vector<SweepCase> cases;
};

/// Called once the base, the axes and the derived expressions are read, before the cases
/// are expanded and checked: the plan without cases and the number of cases (the product of
/// the factor lengths).
using SweepCountHook = std::function<void(const SweepPlan&, std::size_t)>;

/// Reads and expands a sweep file and validates every case. Throws UsageError with one line
/// naming the key, the axis and value, or the derived option's line, at fault. `counted`, when given, hears the number
/// of cases first.
SweepPlan load_sweep(const std::string& path, const SweepCountHook& counted = {});
/// The same from the file's text; `origin` names it in messages.
SweepPlan make_sweep(const std::string& text, const std::string& origin, const SweepCountHook& counted = {});

/// 64-bit FNV-1a.
std::uint64_t fnv1a64(std::string_view bytes);
/// The "name=value" lines that the id hashes (sorted by name).
std::vector<std::string> id_parameters(const RunConfig& cfg);
/// The case id of a resolved configuration: 16 lower-case hex digits.
std::string case_id(const RunConfig& cfg);
/// "name=value" for each axis, then each derived option, of a case, joined by `separator`.
std::string case_values_text(const SweepPlan& plan, const SweepCase& c, const std::string& separator);

/// One share of a sweep: cases with index % count == index.
struct Shard {
  std::size_t index = 0, count = 1;
};
/// Parses "I/N" (0 <= I < N). Throws UsageError.
Shard parse_shard(const std::string& text);
/// The share of a Slurm array task: (SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN) /
/// SLURM_ARRAY_TASK_STEP of SLURM_ARRAY_TASK_COUNT; nullopt when ID or COUNT is unset.
/// Throws UsageError when the task id does not map onto 0..COUNT-1.
std::optional<Shard> slurm_shard();
/// The grid indices that a share runs on one of `ranks` processes: the shard's cases
/// (index % count == shard index), then every ranks-th of those starting at `rank`.
std::vector<std::size_t> assigned_cases(std::size_t case_count, Shard shard, int rank = 0,
                                        int ranks = 1);
/// assigned_cases(...).size(), without listing them.
std::size_t assigned_count(std::size_t case_count, Shard shard, int rank = 0, int ranks = 1);

struct SweepOptions {
  std::string config;   ///< the sweep file
  std::string out_dir;  ///< default: default_out_dir(config)
  int jobs = 1;
  int threads = 0;             ///< --threads: each case's threads (0: max(1, cores / jobs))
  std::optional<Shard> shard;  ///< --shard, else the Slurm array task, else everything
  bool resume = false;   ///< continue interrupted cases (run --resume) instead of restarting
  bool dry_run = false;  ///< list the cases of this share and their status; write nothing
};
/// Parses `mfattn sweep` arguments (without the subcommand). Throws UsageError.
SweepOptions parse_sweep_arguments(const std::vector<std::string>& args);
/// The sweep file's stem next to it: "experiments/sweeps/grid.ini" -> "experiments/sweeps/grid".
std::string default_out_dir(const std::string& sweep_path);

/// Where one case stands in DIR.
struct CaseStatus {
  enum class State { Complete, Failed, Running, Interrupted, Missing } state = State::Missing;
  std::string text;  ///< "complete", "failed: ...", "running", "interrupted: SIGTERM", "missing"
};
/// complete / failed: <the file's /run status or the exit code in DIR/<id>.log> / running
/// (another process holds DIR/<id>.lock) / interrupted: <signal> (the sweep stopped it on a
/// signal; its .part stays) / missing.
CaseStatus case_status(const std::string& dir, const std::string& id);
/// True while some process holds the case lock DIR/<id>.lock.
bool case_locked(const std::string& dir, const std::string& id);

/// Writes DIR/manifest.csv and DIR/manifest.json (each through a temporary file and a rename)
/// from the files present: one row per case of the plan. Returns the status of every case.
/// Throws IoError.
std::vector<CaseStatus> write_manifest(const SweepPlan& plan, const std::string& dir);
/// One CSV field quoted per RFC 4180 (only when it holds a comma, quote, CR or LF).
std::string csv_field(const std::string& text);

/// `mfattn sweep`: returns an ExitCode. Case lines go to `out`, errors to `err`.
int sweep_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
/// The text of `mfattn sweep --help`.
std::string sweep_usage();
/// True when this build can spread a sweep over MPI ranks (CMake MFATTN_MPI found MPI).
bool sweep_built_with_mpi();

}  // namespace mfattn
