#pragma once
// Fixed-width SIMD lanes (GCC vector extensions) and a vectorised exp for the pair loop.
// The lane count is fixed at 8 on every ISA (AVX-512 uses one register, AVX2 two, SSE2
// four), so the order of every sum is the same whatever the build targets.
#include <cmath>
#include <cstdint>
#include <cstring>
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
inline Lanes broadcast(double x) { return Lanes{} + x; }

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

/// exp(x) for x <= 0, to about 1 ulp (2 ulp at worst); exactly 0 for x < -708 (and for
/// -inf), where the true value is below 3.3e-308 and, next to a largest weight near 1,
/// irrelevant. NaN stays NaN.
///   x = n ln2 + r, |r| <= ln2 / 2 (Cody-Waite split of ln2, n * ln2_hi exact),
///   exp(r) by its Taylor polynomial of degree 12 (truncation < 1.2e-16 relative),
///   2^n by writing n + 1023 into the exponent bits.
/// Lanes below -708 compute garbage that the final select discards, so no clamp is needed.
inline Lanes exp_nonpositive(Lanes x) {
  constexpr double kLog2e = 1.4426950408889634074;
  constexpr double kLn2Hi = 6.93147180369123816490e-01;
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  // 1.5 * 2^52 + 1023: adding it rounds x log2(e) to an integer n and leaves n + 1023 in the
  // low mantissa bits (bits 0-10 for n in [-1022, 0]; bit 51 is shifted out below).
  constexpr double kShifter = 6755399441055744.0 + 1023.0;
  constexpr double kUnderflow = -708.0;
  const Lanes shifted = x * kLog2e + kShifter;
  const Lanes n = shifted - kShifter;
  Lanes r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  Lanes p = broadcast(1.0 / 479001600.0);
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  LaneInts bits;
  std::memcpy(&bits, &shifted, sizeof(bits));
  bits <<= 52;
  Lanes two_to_n;
  std::memcpy(&two_to_n, &bits, sizeof(two_to_n));
  const Lanes result = p * two_to_n;
  return x < kUnderflow ? Lanes{} : result;
}

}  // namespace mfattn::simd
