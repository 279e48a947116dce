// Exponential and FMA rooflines of one core: mfattn's own vectorised exponential against
// external vectorised exps built for the same instruction set, and the FMA peak.
//
// A standalone program (no mfattn library): it includes src/backends/cpu/vector_math.hpp,
// which, with no MFATTN_CPU_TARGET_* macro defined, takes the ISA of the compiler flags
// (-march=x86-64-v3: AVX2+FMA; -march=native on an AVX-512 machine: AVX-512), so every
// method below runs the instruction set this file was compiled for.
//
//   mfattn   simd::exp2_nonpositive<4, false> on four Lanes in lockstep, exactly as
//            kernel_set.cpp's exp_rate (the `--roofline` exp rate), t in [-36, 0];
//   eigen    Eigen 3.4 `ArrayXd::exp()` (Map of the array; Eigen's own vectorised loop);
//   eigen_pexp_x4  Eigen::internal::pexp on four packets in lockstep (info);
//   sleef    SLEEF 3.5 Sleef_expd{8,4,2}_u10{avx512f,avx2,sse2} (1-ulp), one register a call;
//   libmvec  glibc's vector exp _ZGV{e,d,b}N{8,4,2}v_exp (4-ulp), one register a call;
//   fma      independent FMA chains on registers of the ISA's width: the FMA peak.
// The peers compute exp(x), x in [-25, 0]; every method works over an L1-resident array of
// 2048 doubles (16 KiB in, 16 KiB out), each rate is timed for >= --seconds (0.3 s), the
// methods are interleaved for --rounds (3) rounds and the best round of each is kept. One
// thread; pin it with taskset. Prints one JSON object.
//
// Build (bench/run_bench.sh does, for -march=x86-64-v3 and -march=native):
//   g++ -O3 -march=x86-64-v3 -std=c++20 -Wno-psabi -DEXP_PEERS_MARCH='"x86-64-v3"' -I src
//     -I /usr/include/eigen3 bench/exp_peers.cpp -o build/bench-exp-peers-v3 -lsleef -lmvec -lm
// Options: --seconds S (per measurement, 0.3), --rounds R (3). Exits 0 even when a method fails
// the accuracy check (accuracy_ok false in the JSON), so that the caller reports it.
#include <immintrin.h>
#include <sleef.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/vector_math.hpp"

#ifndef EXP_PEERS_MARCH
#define EXP_PEERS_MARCH "unknown"
#endif

// glibc libmvec's vector exp (x86_64 vector ABI names), one register per call.
extern "C" {
#if defined(__AVX512F__)
__m512d _ZGVeN8v_exp(__m512d);
#elif defined(__AVX2__)
__m256d _ZGVdN4v_exp(__m256d);
#else
__m128d _ZGVbN2v_exp(__m128d);
#endif
}

namespace {

#if defined(__AVX512F__)
typedef __m512d Vec;
constexpr int kWidth = 8;
constexpr const char* kIsa = "avx512";
constexpr const char* kSleefName = "Sleef_expd8_u10avx512f";
constexpr const char* kMvecName = "_ZGVeN8v_exp";
inline Vec vload(const double* p) { return _mm512_loadu_pd(p); }
inline void vstore(double* p, Vec v) { _mm512_storeu_pd(p, v); }
inline Vec sleef_exp(Vec v) { return Sleef_expd8_u10avx512f(v); }
inline Vec mvec_exp(Vec v) { return _ZGVeN8v_exp(v); }
#elif defined(__AVX2__)
typedef __m256d Vec;
constexpr int kWidth = 4;
constexpr const char* kIsa = "avx2";
constexpr const char* kSleefName = "Sleef_expd4_u10avx2";
constexpr const char* kMvecName = "_ZGVdN4v_exp";
inline Vec vload(const double* p) { return _mm256_loadu_pd(p); }
inline void vstore(double* p, Vec v) { _mm256_storeu_pd(p, v); }
inline Vec sleef_exp(Vec v) { return Sleef_expd4_u10avx2(v); }
inline Vec mvec_exp(Vec v) { return _ZGVdN4v_exp(v); }
#else
typedef __m128d Vec;
constexpr int kWidth = 2;
constexpr const char* kIsa = "sse2";
constexpr const char* kSleefName = "Sleef_expd2_u10sse2";
constexpr const char* kMvecName = "_ZGVbN2v_exp";
inline Vec vload(const double* p) { return _mm_loadu_pd(p); }
inline void vstore(double* p, Vec v) { _mm_storeu_pd(p, v); }
inline Vec sleef_exp(Vec v) { return Sleef_expd2_u10sse2(v); }
inline Vec mvec_exp(Vec v) { return _ZGVbN2v_exp(v); }
#endif

#ifdef EIGEN_VECTORIZE_AVX2
constexpr const char* kEigenAvx2 = "true";
#else
constexpr const char* kEigenAvx2 = "false";
#endif
#ifdef EIGEN_VECTORIZE_FMA
constexpr const char* kEigenFma = "true";
#else
constexpr const char* kEigenFma = "false";
#endif
#ifdef EIGEN_VECTORIZE_AVX512
constexpr const char* kEigenAvx512 = "true";
#else
constexpr const char* kEigenAvx512 = "false";
#endif

constexpr std::size_t kN = 2048;
constexpr int kPasses = 100;  // passes over the array between clock reads

using Clock = std::chrono::steady_clock;

struct Arrays {
  alignas(64) double t[kN];    // mfattn's 2^t inputs, [-36, 0] (kernel_set.cpp's exp_rate)
  alignas(64) double x[kN];    // the peers' exp(x) inputs, [-25, 0]
  alignas(64) double out[kN];
};

// One pass of each method over `in` into `out`.
void pass_mfattn(const double* in, double* out) {
  mfattn::simd::exp2_nonpositive_array(in, out, kN);  // inputs in [-36, 0]
}

void pass_eigen(const double* in, double* out) {
  Eigen::Map<Eigen::ArrayXd>(out, kN) = Eigen::Map<const Eigen::ArrayXd>(in, kN).exp();
}

void pass_eigen_pexp_x4(const double* in, double* out) {
  using namespace Eigen::internal;
  typedef packet_traits<double>::type P;
  constexpr std::size_t w = packet_traits<double>::size;
  for (std::size_t i = 0; i < kN; i += 4 * w) {
    P a = ploadu<P>(in + i), b = ploadu<P>(in + i + w), c = ploadu<P>(in + i + 2 * w),
      d = ploadu<P>(in + i + 3 * w);
    a = pexp(a);
    b = pexp(b);
    c = pexp(c);
    d = pexp(d);
    pstoreu(out + i, a);
    pstoreu(out + i + w, b);
    pstoreu(out + i + 2 * w, c);
    pstoreu(out + i + 3 * w, d);
  }
}

void pass_sleef(const double* in, double* out) {
  for (std::size_t i = 0; i < kN; i += kWidth) vstore(out + i, sleef_exp(vload(in + i)));
}

void pass_mvec(const double* in, double* out) {
  for (std::size_t i = 0; i < kN; i += kWidth) vstore(out + i, mvec_exp(vload(in + i)));
}

/// Exps per second of `pass` over `in` for at least `seconds`.
template <class Pass>
double exp_rate(Pass pass, double* in, double* out, double seconds) {
  pass(in, out);  // warm-up
  std::size_t done = 0;
  const auto start = Clock::now();
  double elapsed = 0.0;
  while (elapsed < seconds) {
    for (int rep = 0; rep < kPasses; ++rep) {
      pass(in, out);
      in[rep % kN] -= out[(rep * 7) % kN] * 1e-300;  // keep the loop alive (as exp_rate)
    }
    done += kPasses * kN;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  return double(done) / elapsed;
}

// FMA peak: kChains independent chains a = a * m + c on registers of the ISA's width.
#if defined(__AVX512F__)
constexpr int kChains = 16;  // 32 zmm registers
#else
constexpr int kChains = 12;  // 16 ymm/xmm registers: 12 chains + m + c
#endif
typedef double FmaVec __attribute__((vector_size(kWidth * sizeof(double))));

double fma_gflops(double seconds) {
  FmaVec acc[kChains];
  for (int k = 0; k < kChains; ++k) acc[k] = FmaVec{} + (1.0 + 0.01 * k);
  FmaVec m = FmaVec{} + 0.9999999, c = FmaVec{} + 1e-7;  // fixed point 1: stays normal
  constexpr long kInner = 10000;
  long iters = 0;
  const auto start = Clock::now();
  double elapsed = 0.0;
  while (elapsed < seconds) {
    asm volatile("" : "+x"(m), "+x"(c));
    for (long i = 0; i < kInner; ++i) {
      // One FMA each (GCC contracts a * m + c by default in C++); on SSE2, a mul and an add.
      for (int k = 0; k < kChains; ++k) acc[k] = acc[k] * m + c;
    }
    iters += kInner;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  double sink = 0.0;
  for (int k = 0; k < kChains; ++k)
    for (int l = 0; l < kWidth; ++l) sink += acc[k][l];
  if (sink == 12345.678) std::puts("");  // keep the chains alive
  return double(iters) * kChains * kWidth * 2.0 / elapsed / 1e9;
}

/// Largest |f(x) / ref(x) - 1| over the array (ref in long double).
template <class Pass, class Ref>
double max_rel_error(Pass pass, const double* in, Ref ref) {
  std::vector<double> out(kN);
  pass(in, out.data());
  double worst = 0.0;
  for (std::size_t i = 0; i < kN; ++i) {
    const long double r = ref((long double)in[i]);
    const double e = double(std::fabs((long double)out[i] / r - 1.0L));
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 0.3;
  int rounds = 3;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--seconds") && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--seconds S (0.3)] [--rounds R (3)]\n", argv[0]);
      return 2;
    }
  }
  static Arrays a;
  for (std::size_t i = 0; i < kN; ++i) {
    a.t[i] = -double(i % 97) * 0.37;          // [-35.5, 0], as kernel_set.cpp's exp_rate
    a.x[i] = -double(i % 97) * (25.0 / 96.0);  // [-25, 0]
  }

  // Accuracy first (on pristine inputs): a broken peer must not pass as a fast one.
  auto exp2l_ref = [](long double v) { return std::exp2(v); };
  auto expl_ref = [](long double v) { return std::exp(v); };
  const double err_mfattn = max_rel_error(pass_mfattn, a.t, exp2l_ref);
  const double err_eigen = max_rel_error(pass_eigen, a.x, expl_ref);
  const double err_pexp = max_rel_error(pass_eigen_pexp_x4, a.x, expl_ref);
  const double err_sleef = max_rel_error(pass_sleef, a.x, expl_ref);
  const double err_mvec = max_rel_error(pass_mvec, a.x, expl_ref);
  // std::exp's own error against the long-double reference, for scale.
  double err_std = 0.0;
  for (std::size_t i = 0; i < kN; ++i)
    err_std = std::max(err_std, double(std::fabs((long double)std::exp(a.x[i]) / std::exp((long double)a.x[i]) - 1.0L)));

  const char* names[] = {"mfattn", "eigen", "eigen_pexp_x4", "sleef", "libmvec", "fma"};
  constexpr int kMethods = 6;
  std::vector<std::vector<double>> all(kMethods);
  for (int r = 0; r < rounds; ++r) {
    all[0].push_back(exp_rate(pass_mfattn, a.t, a.out, seconds));
    all[1].push_back(exp_rate(pass_eigen, a.x, a.out, seconds));
    all[2].push_back(exp_rate(pass_eigen_pexp_x4, a.x, a.out, seconds));
    all[3].push_back(exp_rate(pass_sleef, a.x, a.out, seconds));
    all[4].push_back(exp_rate(pass_mvec, a.x, a.out, seconds));
    all[5].push_back(fma_gflops(seconds));
  }
  double best[kMethods];
  for (int m = 0; m < kMethods; ++m) best[m] = *std::max_element(all[m].begin(), all[m].end());

  const double tol = 1e-14;  // all of these claim a few ulp (2.2e-16 each)
  std::printf("{\"march\": \"%s\", \"isa\": \"%s\", \"mfattn_isa\": \"%s\", \"mfattn_register_lanes\": %zu, "
              "\"eigen_simd\": \"%s\", \"eigen_avx2\": %s, \"eigen_fma\": %s, \"eigen_avx512\": %s, \"eigen_packet_doubles\": %d, \"sleef_function\": \"%s\", "
              "\"libmvec_function\": \"%s\", \"vector_doubles\": %d, \"fma_chains\": %d, "
              "\"seconds_per_measurement\": %g, \"rounds\": %d, \"array_doubles\": %zu,\n",
              EXP_PEERS_MARCH, kIsa, mfattn::simd::kInstructionSet, mfattn::simd::kRegisterLanes,
              Eigen::SimdInstructionSetsInUse(), kEigenAvx2, kEigenFma, kEigenAvx512,
              int(Eigen::internal::packet_traits<double>::size),
              kSleefName, kMvecName, kWidth, kChains, seconds, rounds, kN);
  std::printf(" \"exps_per_second\": {\"mfattn\": %.6e, \"eigen\": %.6e, \"eigen_pexp_x4\": %.6e, "
              "\"sleef\": %.6e, \"libmvec\": %.6e},\n",
              best[0], best[1], best[2], best[3], best[4]);
  std::printf(" \"fma_peak_gflops\": %.3f,\n", best[5]);
  std::printf(" \"all\": {");
  for (int m = 0; m < kMethods; ++m) {
    std::printf("%s\"%s\": [", m ? ", " : "", names[m]);
    for (std::size_t k = 0; k < all[m].size(); ++k) std::printf("%s%.6e", k ? ", " : "", all[m][k]);
    std::printf("]");
  }
  std::printf("},\n");
  std::printf(" \"max_rel_error\": {\"mfattn\": %.3e, \"eigen\": %.3e, \"eigen_pexp_x4\": %.3e, "
              "\"sleef\": %.3e, \"libmvec\": %.3e, \"std_exp\": %.3e},\n",
              err_mfattn, err_eigen, err_pexp, err_sleef, err_mvec, err_std);
  const bool ok = err_mfattn < tol && err_eigen < tol && err_pexp < tol && err_sleef < tol && err_mvec < tol;
  std::printf(" \"accuracy_ok\": %s, \"accuracy_tolerance\": %g}\n", ok ? "true" : "false", tol);
  if (!ok) std::fprintf(stderr, "exp_peers: a method is off by more than %g relative (see max_rel_error)\n", tol);
  return 0;  // the caller reads accuracy_ok; a broken peer is reported, not hidden by a failed run
}
