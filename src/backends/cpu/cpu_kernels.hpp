#pragma once
// The CPU kernels of one instruction set, as one table of entry points. A build has one set
// per target it compiled (kernels/compile_target.hpp); cpu_dispatch.cpp picks the set once per process:
// the best one the CPU runs, or the one named by the environment variable MFATTN_CPU_KERNELS.
#include <memory>
#include <string>
#include <vector>

#include "mfattn/backends/backend.hpp"
#include "mfattn/core/model.hpp"
#include "mfattn/backends/pair_statistics.hpp"

namespace mfattn::cpu {

struct KernelSet {
  /// "avx512" (x86-64-v4), "avx2" (x86-64-v3: AVX2 + FMA), "sse2", "sse4.2", "avx", "neon"
  /// or "generic": the instruction set the kernels were compiled for.
  const char* name;
  /// Doubles per vector register (8, 4 or 2); every set computes in 8 lanes (vector_math.hpp).
  std::size_t register_lanes;
  /// Whether this process may run the set (the CPU and the OS support its instructions).
  bool (*supported)();
  /// The CPU backend (cpu_backend.cpp) built from this set's kernels.
  std::unique_ptr<Backend> (*make_backend)(const Model& model, int threads);
  /// Exponentials per second of the pair loops' own exp (vector_math.hpp), `threads` threads
  /// each on an L1-resident array, for at least min_seconds.
  double (*exp_rate)(int threads, double min_seconds);
  /// The observables' pair pass for d <= 8 (backends/cpu/lane_pair_statistics.hpp), with_stats as its
  /// kStats: cpu_pair_statistics() of backend.hpp.
  PairStatistics (*pair_statistics)(const double* x, std::size_t d, const std::vector<std::size_t>& tokens,
                                    double close_above, double edge_above, bool with_stats);
};

/// The set this process uses (chosen on first call). Throws BackendUnavailable when
/// MFATTN_CPU_KERNELS names a set that was not compiled or that this CPU cannot run.
const KernelSet& kernels();

/// Every set compiled into this build, best first.
const std::vector<const KernelSet*>& compiled_kernel_sets();

/// One line for --version and the bench: "avx2 (4 doubles per register; compiled: avx512
/// avx2 sse2; chosen: best the CPU runs)".
std::string describe_kernels();

// Each target's translation units define, in the target's namespace (kernels/compile_target.hpp),
//   std::unique_ptr<Backend> make_backend(const Model&, int)   (cpu_backend.cpp)
//   extern const KernelSet kernel_set                          (kernel_set.cpp)

}  // namespace mfattn::cpu
