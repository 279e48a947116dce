#pragma once
/// \file run_resources.hpp
/// What a run takes from the machine (run_resources.cpp): its threads, started up front, and
/// its memory, estimated and compared with what the machine (or its cgroup) allows.
#include <cstdint>
#include <string>

#include "mfattn/app/config.hpp"
#include "mfattn/app/run_choices.hpp"
#include "mfattn/backends/backend.hpp"

namespace mfattn {

/// Roughly the bytes a run needs at its peak (state, integrator stages, backend buffers,
/// one frame of observables, matrices, gauge) with the given choices; see the formula in
/// config.cpp.
double estimated_memory_bytes(const RunConfig& cfg, const RunChoices& choices);
/// The same for a validated configuration (its own choices).
inline double estimated_memory_bytes(const RunConfig& cfg) { return estimated_memory_bytes(cfg, cfg.choices); }

/// Physical memory, or the cgroup limit (/sys/fs/cgroup/memory.max) or the address-space
/// limit (ulimit -v) when that is lower;
/// MFATTN_MEMORY_LIMIT (bytes) overrides both (for tests).
double available_memory_bytes(std::string* source = nullptr);

/// The backend options of a validated configuration: its precision and `threads` threads.
inline BackendOptions backend_options(const RunConfig& cfg, int threads) {
  return BackendOptions{threads, cfg.choices.precision, cfg.choices.evaluation, cfg.evaluation_tol};
}

/// The thread count: --threads, else OMP_NUM_THREADS, else SLURM_CPUS_PER_TASK, else cores;
/// also made the default team size of every OpenMP region.
int resolve_threads(std::int64_t requested);
/// The most worker threads a run or a call may ask for (--threads, the module's threads=).
inline constexpr int kMaxThreads = 4096;

/// Starts the OpenMP team of `threads` threads before anything is written, so that a process
/// limit (ulimit -u, a container's pids limit) is met here: libgomp ends the process with
/// exit 1 when it cannot create a thread, leaving whatever the run had begun. Throws
/// UsageError naming --threads and how many threads could start.
void start_thread_team(int threads);

}  // namespace mfattn
