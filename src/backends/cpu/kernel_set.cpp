// One target's table of CPU kernels (cpu_kernels.hpp), compiled once per target.
#include <omp.h>

#include <chrono>
#include <vector>

#include "backends/cpu/cpu_kernels.hpp"
#include "backends/cpu/lane_pair_statistics.hpp"
#include "backends/cpu/vector_math.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::cpu {
inline namespace MFATTN_CPU_NAMESPACE {

std::unique_ptr<Backend> make_backend(const Model& model, int threads);  // cpu_backend.cpp

namespace {

/// The exp roofline: the pair loop's own exponential (simd::exp2_nonpositive, four vectors in
/// lockstep and without the underflow select, exactly as the symmetric loop takes them) over
/// an L1-resident array on every thread: the rate no loop that takes one exp per pair can
/// beat (the symmetric loop takes one per unordered pair).
double exp_rate(int threads, double min_seconds) {
  double total_rate = 0.0;
#pragma omp parallel num_threads(threads) reduction(+ : total_rate)
  {
    std::vector<double> in(2048), out(2048);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = -double(i % 97) * 0.37;
    std::size_t done = 0;
    const auto start = std::chrono::steady_clock::now();
    double elapsed = 0.0;
    while (elapsed < min_seconds) {
      for (int rep = 0; rep < 100; ++rep) {
        simd::exp2_nonpositive_array(in.data(), out.data(), in.size());  // inputs in [-36, 0]
        in[rep % in.size()] -= out[(rep * 7) % out.size()] * 1e-300;  // keep the loop alive
      }
      done += 100 * in.size();
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    total_rate += double(done) / elapsed;
  }
  return total_rate;
}

bool supported() {
#if defined(MFATTN_CPU_TARGET_AVX512)
  return __builtin_cpu_supports("x86-64-v4");
#elif defined(MFATTN_CPU_TARGET_AVX2)
  return __builtin_cpu_supports("x86-64-v3");
#else
  return true;  // the build's own flags: whatever runs the rest of the program runs these
#endif
}

PairStatistics pair_statistics(const double* x, std::size_t d, const std::vector<std::size_t>& tokens,
                               double close_above, double edge_above, bool with_stats) {
  return with_stats ? lane_pair_pass<true>(x, d, tokens, close_above, edge_above)
                    : lane_pair_pass<false>(x, d, tokens, close_above, edge_above);
}

}  // namespace

extern const KernelSet kernel_set{simd::kInstructionSet, simd::kRegisterLanes, supported,
                                  make_backend, exp_rate, pair_statistics};

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
