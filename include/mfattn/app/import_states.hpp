#pragma once
/// \file import_states.hpp
/// `mfattn import STATES.npy|npz --out FILE.h5` and `mfattn.io.write`: another model's token
/// states (a network's hidden states layer by layer, a trajectory of any other code) written as
/// an mfattn particle file, through the run's own H5MD writer, so that `analyze`, `info`,
/// `view`, `animate` and the plots take it (docs/import.md).
///
/// The states x_i(t_f) of frame f are stored as given in /particles/tokens/position (bits
/// kept). When every row is a unit vector (| |x| - 1 | <= 1e-12) the file says state_space =
/// "sphere"; otherwise "euclidean": the states live in R^d and everything that reads
/// positions as points of the sphere reads their directions x / |x| instead. Per frame the
/// file carries the observables of the directions u_i = x_i / |x_i| of the tokens with
/// presence > 0 (docs/model.md section 6, the run's definitions):
///   n_clusters       components of the graph <u_i, u_j> > 1 - cluster_delta
///   min_inner        min_{i != j} <u_i, u_j>
///   marginal_spread  1 - the largest eigenvalue of (1/m) sum_i u_i u_i^T
///   norm_mean        (1/m) sum_i |x_i| (1 on the sphere)
/// No model made these states: the file has no kernel, beta, integrator, energy or seed, and
/// says so (/parameters/command = "import"); the parameters a caller gives are stored as given.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <stdexcept>
#include <string>
#include <vector>

#include "mfattn/app/stop_signals.hpp"
#include "mfattn/core/evaluation_watch.hpp"
#include "mfattn/io/h5md.hpp"

namespace mfattn {

struct ImportedStates {
  std::size_t frames = 0, replicas = 1, n = 0, d = 0;
  /// [frames][replicas][n][d], row-major; finite, no zero row.
  std::vector<double> states;
  /// The frames' times, strictly increasing and finite; empty: 0, 1, ..., frames - 1 (the
  /// layer index of hidden states).
  std::vector<double> times;
  /// Per token, each empty or n long: presence (>= 0; tokens of presence 0 are stored and left
  /// out of the observables, as null tokens of a run), prompt_id, and the sequence positions
  /// (empty: 0, 1, ..., n - 1).
  std::vector<double> presence;
  std::vector<std::int32_t> prompt_id;
  std::vector<double> sequence_position;
  /// The caller's /parameters, stored as given (names the file writes itself are refused).
  std::vector<Parameter> parameters;
  std::string source;  ///< what the states came from: /parameters/source
  double cluster_delta = 1e-4;
  bool deflate = false;
};

/// An import stopped by a signal (`stop` became non-zero) before its file was created.
struct ImportInterrupted : std::runtime_error {
  explicit ImportInterrupted(int signal)
      : std::runtime_error("interrupted before the file was written"), signal(signal) {}
  int signal;
};

/// Checks the states (std::invalid_argument naming the frame, replica and token of the first
/// bad row, or the bad time, label or parameter), computes the observables, then writes the file
/// at `path` whole or not at all (published under its name once complete; an existing file is
/// replaced only with overwrite). `stop` (may be null), once non-zero, ends the import with
/// ImportInterrupted while the observables are computed (between frames, and inside a frame's
/// pair pass when the caller's thread holds an EvaluationWatch), before the output exists; a
/// stop during the write that follows lets it finish. Returns "sphere" or "euclidean".
std::string write_imported_states(const ImportedStates& states, const std::string& path,
                                  bool overwrite, const std::atomic<int>* stop = nullptr);

/// SIGINT, SIGTERM and SIGHUP for an import (the command's or mfattn.io.write's), installed for
/// its lifetime with a run's options, and the watch that lets them stop a frame's pair pass:
/// stop() is what write_imported_states reads.
class ImportSignals {
 public:
  ImportSignals();
  const std::atomic<int>* stop() const { return &StopSignals::received_flag(); }

 private:
  StopSignals signals_;
  EvaluationWatch watch_;
};

/// The usage text of `mfattn import --help`.
std::string import_usage();

/// `mfattn import STATES.npy|npz --out FILE.h5 [--times T0,T1,...] [--array NAME]
/// [--cluster-delta D] [--deflate] [--overwrite] [--quiet]`; returns an exit code.
int import_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace mfattn
