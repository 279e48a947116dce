#pragma once
// 2^t for t <= 0, the exponential of every pair loop that sums in base 2: t = n + r with
// n = rint(t) and r in [-1/2, 1/2], 2^r by a degree-11 Chebyshev fit (mpmath.chebyfit;
// approximation error 3.2e-18 relative), 2^n from the exponent bits, and 0 below 2^-1022.
// The CPU kernels take the coefficients in SIMD lanes (vector_math.hpp, exp2_nonpositive);
// exp2_nonpositive_scalar is the same formula for one number, on the host or a CUDA device
// (the CUDA backend's fp64 pair loop: about 16 fp64 operations, against some 40 for the
// CUDA library's exp with its range reduction for every argument).
#include <cstdint>
#include <cstring>

#include "kernels/compile_target.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::kernels {
inline namespace MFATTN_CPU_NAMESPACE {

/// The Chebyshev coefficients of 2^r on [-1/2, 1/2], highest degree first (index 0 .. 11).
MFATTN_HOST_DEVICE constexpr double exp2_coefficient(int k) {
  constexpr double kCoefficients[] = {4.4558179083360645e-10, 7.074194297288521e-09,
                                      1.0178057087733941e-07, 1.3215432535912375e-06,
                                      1.5252733841556773e-05, 0.00015403530463724353,
                                      0.001333355814640647,   0.009618129107587256,
                                      0.055504108664821625,   0.24022650695910158,
                                      0.6931471805599453,     1.0};
  return kCoefficients[k];
}
inline constexpr int kExp2Coefficients = 12;
/// 1.5 * 2^52 + 1023: adding it rounds t to an integer n and leaves n + 1023 in the low
/// mantissa bits (bits 0-10 for n in [-1022, 0]).
inline constexpr double kExp2Shifter = 6755399441055744.0 + 1023.0;
/// Below this 2^t is taken as 0 (2^-1022 is the smallest normal double).
inline constexpr double kExp2Underflow = -1022.0;

/// 2^t for t <= 0 (t slightly above 0 by rounding is fine: n = 0), as the CPU lanes take it.
MFATTN_HOST_DEVICE inline double exp2_nonpositive_scalar(double t) {
  const double shifted = t + kExp2Shifter;
  const double r = t - (shifted - kExp2Shifter);
  double p = exp2_coefficient(0);
#if defined(__CUDA_ARCH__)
#pragma unroll
  for (int c = 1; c < kExp2Coefficients; ++c) p = fma(p, r, exp2_coefficient(c));
  const std::uint64_t bits = std::uint64_t(__double_as_longlong(shifted)) << 52;
  const double two_to_n = __longlong_as_double(static_cast<long long>(bits));
#else
  for (int c = 1; c < kExp2Coefficients; ++c) p = __builtin_fma(p, r, exp2_coefficient(c));
  std::uint64_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  bits <<= 52;
  double two_to_n;
  std::memcpy(&two_to_n, &bits, sizeof two_to_n);
#endif
  return t < kExp2Underflow ? 0.0 : p * two_to_n;
}

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::kernels
MFATTN_CPU_TARGET_END
