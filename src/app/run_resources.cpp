// What a run may take of the machine, decided before anything is written: its thread count
// and OpenMP team (--threads), and the memory it needs against the memory available.
#include "mfattn/app/config.hpp"
#include "mfattn/app/run_resources.hpp"

#include <omp.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cfloat>
#include <charconv>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>

#include "app/option_rules.hpp"

namespace mfattn {

int resolve_threads(std::int64_t requested) {
  int threads = omp_get_num_procs();
  if (requested > 0) {
    threads = static_cast<int>(requested);
  } else {
    for (const char* name : {"SLURM_CPUS_PER_TASK", "OMP_NUM_THREADS"})
      if (const char* value = std::getenv(name); value && std::atoi(value) > 0)
        threads = std::atoi(value);  // OMP_NUM_THREADS, read last, wins over Slurm's count
  }
  // Every OpenMP region of the process (backend, observables) uses this team size, so that
  // --threads 1 really means one busy core.
  omp_set_num_threads(threads);
  return threads;
}

void start_thread_team(int threads) {
  // The threads are kept alive together, as the team will be: the process limit counts
  // live threads. Joined again, they free their slots for libgomp's, started right after.
  std::vector<std::thread> started;
  std::mutex mutex;
  std::condition_variable released;
  bool release = false;
  std::string failure;
  try {
    for (int t = 1; t < threads; ++t)
      started.emplace_back([&] {
        std::unique_lock lock(mutex);
        released.wait(lock, [&] { return release; });
      });
  } catch (const std::system_error& e) {
    failure = e.code().message();
  }
  {
    const std::lock_guard lock(mutex);
    release = true;
  }
  released.notify_all();
  for (std::thread& thread : started) thread.join();
  if (!failure.empty())
    throw UsageError("--threads " + std::to_string(threads) + ": only " +
                     std::to_string(started.size() + 1) + " threads could be started (" + failure +
                     ": a limit on processes, such as ulimit -u, counts threads); take a smaller --threads");
  // libgomp keeps the threads of its first team for every later region of that size, so no
  // thread is created once the output file exists.
#pragma omp parallel num_threads(threads)
  {
  }
}

double estimated_memory_bytes(const RunConfig& c, const RunChoices& choices) {
  // In doubles, with N = n + null tokens (moving), S = N + prompts * prefix (sources),
  // R replicas, D = d:
  //   16 R N D     state, up to 10 integrator stage buffers (rk4, dopri5, lie-rk4), the
  //                backend's queries and output, one frame's velocity and gathered rows
  //   4 R S (D+1)  backend key and value panels per replica, biases
  //   (8 + G) D^2  Q, K, V, their products, observables' second moment; G file generators
  //   S D^2        dense gauge matrices (lie, rope-conjugated)
  //   8 S          positions, presences, ids, prompt ids
  //   3 L M D^2    the Q, K, V the file records: L layers (--regen-period) of M sets (1, or
  //                R with --matrices per-replica)
  //   a whole layer (model.md section 2b), H heads of r: R N D the sum over the heads,
  //                2 L M H (2 r + D) D its weights (held and recorded; a file's values take
  //                r <= D rows), 3 L M W D the feed-forward term's
  // plus threads * N * 24 bytes (cluster forests) and (N / 64)^2 bytes of window-mask tiles.
  const double N = double(c.n) + double(c.null_tokens);
  const double S = N + double(c.prefix) * double(c.prompts);
  const double R = double(c.replicas), D = double(c.d);
  double doubles = 16.0 * R * N * D + 4.0 * R * S * (D + 1.0) + 8.0 * D * D + 8.0 * S;
  const double period = c.regen_period > 0 ? c.regen_period : c.layer_time;
  const double layers = period > 0 ? std::ceil(c.horizon / period) : 1.0;
  const double sets = choices.matrices == MatrixSharing::PerReplica ? R : 1.0;
  doubles += 3.0 * layers * sets * D * D;
  const double heads = double(c.layer.heads), r = c.layer.head_dim ? double(c.layer.head_dim) : D;
  if (heads > 1 || r < D || c.layer.mlp_width > 0 || !c.weights.empty())
    doubles += R * N * D + 2.0 * layers * sets * (heads * (2.0 * r + D) * D + 1.5 * double(c.layer.mlp_width) * D);
  if (holds_dense_matrices(choices.geometry)) doubles += S * D * D;
  double bytes = 8.0 * doubles;
  bytes += double(std::max<std::int64_t>(c.threads, 1)) * N * 24.0;
  if (choices.mask.kind == MaskKind::Window)
    bytes += (N / 64.0 + 1.0) * (N / 64.0 + 1.0);
  return bytes;
}

double available_memory_bytes(std::string* source) {
  double available = std::numeric_limits<double>::infinity();
  std::string from = "unknown";
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) {
    available = double(pages) * double(page);
    from = "physical memory";
  }
  if (std::ifstream limit_file{"/sys/fs/cgroup/memory.max"}) {
    std::string word;
    limit_file >> word;
    double limit = 0.0;
    const auto result = std::from_chars(word.data(), word.data() + word.size(), limit);
    if (result.ec == std::errc() && limit > 0 && limit < available) {
      available = limit;
      from = "cgroup memory.max";
    }
  }
  if (rlimit limit{}; ::getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
                      double(limit.rlim_cur) < available) {
    available = double(limit.rlim_cur);
    from = "the address-space limit, ulimit -v";
  }
  if (const char* text = std::getenv("MFATTN_MEMORY_LIMIT")) {
    double limit = 0.0;
    const std::string word(text);
    const auto result = std::from_chars(word.data(), word.data() + word.size(), limit);
    if (result.ec == std::errc() && limit > 0) {
      available = limit;
      from = "MFATTN_MEMORY_LIMIT";
    }
  }
  if (source) *source = from;
  return available;
}

}  // namespace mfattn
