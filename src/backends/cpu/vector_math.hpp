#pragma once
// Builds without AVX-512 pass these 64-byte vectors differently; they never cross a library
// boundary (everything here is inline), so GCC's ABI note does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
// Fixed-width SIMD lanes (GCC vector extensions) and a vectorised exp for the pair loop.
// The lane count is fixed at 8 on every ISA (AVX-512 uses one register, AVX2 two, SSE2
// four), so the order of every sum is the same whatever the build targets.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>

namespace mfattn::simd {

inline constexpr std::size_t kLanes = 8;
typedef double Lanes __attribute__((vector_size(kLanes * sizeof(double))));
typedef std::int64_t LaneInts __attribute__((vector_size(kLanes * sizeof(std::int64_t))));

inline Lanes load(const double* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store(double* p, Lanes v) { std::memcpy(p, &v, sizeof(v)); }
// A plain splat (Lanes{} + x would cost a scalar add per call: GCC may not drop + 0.0).
inline Lanes broadcast(double x) { return Lanes{x, x, x, x, x, x, x, x}; }

/// A no-op that makes the compiler hold the values in registers: GCC otherwise folds each
/// use of a loaded vector into its FMA as a memory operand, so a micro-kernel that reuses a
/// load for several receivers turns load-bound (one load per FMA instead of one per row).
template <class... Vectors>
inline void keep_in_registers([[maybe_unused]] Vectors&... values) {
#if defined(__GNUC__) && defined(__AVX512F__)
  ([&] { asm("" : "+v"(values)); }(), ...);
#endif
}

inline Lanes max(Lanes a, Lanes b) { return a > b ? a : b; }

/// Largest lane, in a fixed pairwise order.
inline double horizontal_max(Lanes v) {
  double m01 = v[0] > v[1] ? v[0] : v[1], m23 = v[2] > v[3] ? v[2] : v[3];
  double m45 = v[4] > v[5] ? v[4] : v[5], m67 = v[6] > v[7] ? v[6] : v[7];
  double a = m01 > m23 ? m01 : m23, b = m45 > m67 ? m45 : m67;
  return a > b ? a : b;
}

/// Sum of the lanes, in a fixed pairwise order.
inline double horizontal_sum(Lanes v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

/// 2^t for t <= 0, to about 1 ulp (2 ulp at worst); exactly 0 for t < -1022 (and for -inf),
/// NaN stays NaN. exp(x) = 2^(x log2 e): callers fold log2(e) into their operands once.
/// the reduction t = n + r, n = round(t), |r| <= 1/2, is exact (r = t - n is
/// exact by Sterbenz), so it costs two adds and a subtraction instead of three FMAs, and
/// only the input's own rounding matters. kCount vectors are taken in lockstep, so that the
/// out-of-order core finds independent FMAs next to each other along the polynomial's long
/// dependency chain. Always inlined: GCC otherwise calls it out of line from some pair
/// loops, which costs more than the call saves.
/// kMayUnderflow = false: the caller guarantees t >= -1022 (or NaN), and the select that
/// makes smaller inputs exactly 0 is skipped; the results are the same bits.
/// kEveryVectorLoads = true: every multiply-add reads its coefficient from memory (see below).
template <std::size_t kCount, bool kMayUnderflow = true, bool kEveryVectorLoads = false>
[[gnu::always_inline]] inline void exp2_nonpositive(const Lanes (&t)[kCount],
                                                    Lanes (&out)[kCount]) {
  // 1.5 * 2^52 + 1023: adding it rounds t to an integer n and leaves n + 1023 in the low
  // mantissa bits (bits 0-10 for n in [-1022, 0]; bit 51 is shifted out below).
  constexpr double kShifter = 6755399441055744.0 + 1023.0;
  constexpr double kUnderflow = -1022.0;
  // Chebyshev fit of 2^r on [-1/2, 1/2], degree 11 (mpmath.chebyfit; approximation error
  // 3.2e-18 relative, one FMA less than a degree-12 Taylor polynomial), highest first.
  constexpr double kPoly[] = {4.4558179083360645e-10, 7.074194297288521e-09,
                              1.0178057087733941e-07, 1.3215432535912375e-06,
                              1.5252733841556773e-05, 0.00015403530463724353,
                              0.001333355814640647,   0.009618129107587256,
                              0.055504108664821625,   0.24022650695910158,
                              0.6931471805599453,     1.0};
  // The coefficients are read from memory by each multiply-add (an embedded broadcast): held
  // in registers, the 12 of them crowded out the pair loops' sums, which GCC then spilled
  // (measured: 5 % faster for the symmetric loop, 25 % for the one-sided one at d = 3). The
  // empty asm hides that the pointer is constant, so GCC cannot hoist the broadcasts out of
  // the loops. Within one call GCC still broadcasts each coefficient once for the kCount
  // vectors; kEveryVectorLoads repeats the asm per vector so that none is held in a register
  // (4 % faster for the symmetric loop's eight vectors; slower for the one-sided loop and the
  // exp alone, which keep the default).
  static constexpr double kPolyStored[] = {kPoly[0], kPoly[1], kPoly[2], kPoly[3],
                                           kPoly[4], kPoly[5], kPoly[6], kPoly[7],
                                           kPoly[8], kPoly[9], kPoly[10], kPoly[11]};
  const double* coefficients = kPolyStored;
  asm("" : "+r"(coefficients));
  Lanes shifted[kCount], r[kCount], p[kCount];
  for (std::size_t k = 0; k < kCount; ++k) {
    shifted[k] = t[k] + kShifter;
    r[k] = t[k] - (shifted[k] - kShifter);
    p[k] = broadcast(coefficients[0]);
  }
  for (std::size_t c = 1; c < std::size(kPoly); ++c)
    for (std::size_t k = 0; k < kCount; ++k) {
      const double* coefficient = coefficients + c;
      if constexpr (kEveryVectorLoads) asm("" : "+r"(coefficient));
      p[k] = p[k] * r[k] + *coefficient;
    }
  for (std::size_t k = 0; k < kCount; ++k) {
    LaneInts bits;
    std::memcpy(&bits, &shifted[k], sizeof(bits));
    bits <<= 52;
    Lanes two_to_n;
    std::memcpy(&two_to_n, &bits, sizeof(two_to_n));
    if constexpr (kMayUnderflow)
      out[k] = t[k] < kUnderflow ? Lanes{} : p[k] * two_to_n;
    else
      out[k] = p[k] * two_to_n;
  }
}

}  // namespace mfattn::simd
