#pragma once
// The portable counter-based random numbers of include/mfattn/core/rng.hpp, written once for the
// host (RandomStream, src/core/rng.cpp) and a CUDA device (the resident kernel's noise,
// src/backends/cuda/resident_steps.hpp):
//   key      = mix(mix(mix(mix(seed + c0) ^ mix(k1 + c1)) ^ mix(k2 + c2)) ^ mix(k3 + c3))
//   draw k   = mix64(key + k * golden)                      (SplitMix64 at counter k >= 1)
//   uniform  = (draw >> 11) 2^-53,   symmetric = 2 uniform - 1 (never -1)
//   normal   = Marsaglia's polar method with portable_log
// Every floating-point operation is one correctly rounded IEEE operation: on the host the
// including file is compiled with -ffp-contract=off (rng.cpp), on a device each is spelled
// with the _rn intrinsics, which nvcc never fuses. So the same (seed, keys, counter) gives the
// same bits on every compiler, ISA and GPU.
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define MFATTN_RANDOM_HOST_DEVICE __host__ __device__
#else
#define MFATTN_RANDOM_HOST_DEVICE
#endif

namespace mfattn::random {

// One rounding each, never fused (see the file comment).
MFATTN_RANDOM_HOST_DEVICE inline double add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
MFATTN_RANDOM_HOST_DEVICE inline double sub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
MFATTN_RANDOM_HOST_DEVICE inline double mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
MFATTN_RANDOM_HOST_DEVICE inline double quotient(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
MFATTN_RANDOM_HOST_DEVICE inline double root(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

inline constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ULL;  // Weyl increment of SplitMix64

/// SplitMix64 finaliser: a bijective 64-bit mix.
MFATTN_RANDOM_HOST_DEVICE constexpr std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// The stream key of (seed, key1, key2, key3): chained absorption, each key pre-mixed with its
/// own odd constant, so that permuted keys ((1,2) vs (2,1)) and zero keys give unrelated keys.
MFATTN_RANDOM_HOST_DEVICE constexpr std::uint64_t stream_key(std::uint64_t seed, std::uint64_t key1,
                                                             std::uint64_t key2, std::uint64_t key3) {
  std::uint64_t h = mix64(seed + 0xD1B54A32D192ED03ULL);
  h = mix64(h ^ mix64(key1 + 0x8CB92BA72F3D8DD7ULL));
  h = mix64(h ^ mix64(key2 + 0xABC98388FB8FAC03ULL));
  h = mix64(h ^ mix64(key3 + 0xF1357AEA2E62A9C5ULL));
  return h;
}

/// Natural logarithm for x > 0 from IEEE basic operations only: x = 2^e m, m in
/// [sqrt(1/2), sqrt(2)), log m = 2 atanh(s), s = f / (2 + f), f = m - 1, written as fdlibm does
/// (log(1+f) = f - hfsq + s (hfsq + R), R = 2 s^2/3 + 2 s^4/5 + ...), Taylor terms to s^24.
MFATTN_RANDOM_HOST_DEVICE inline double portable_log(double x) {
  if (x != x || x < 0.0) return __builtin_nan("");
  if (x == 0.0) return -__builtin_huge_val();
  if (x == __builtin_huge_val()) return x;
  int e = 0;
  double m = frexp(x, &e);  // exact, subnormals included
  if (m < 0.70710678118654752440) {
    m = mul(m, 2.0);
    --e;
  }
  const double f = sub(m, 1.0);  // exact by Sterbenz
  const double s = quotient(f, add(2.0, f));
  const double z = mul(s, s);
  double r = 2.0 / 25.0;
  for (int k = 11; k >= 1; --k) r = add(quotient(2.0, double(2 * k + 1)), mul(z, r));  // Horner in z
  r = mul(r, z);  // R = sum_{k>=1} 2 z^k / (2k+1)
  const double hfsq = mul(mul(0.5, f), f);
  constexpr double ln2_hi = 6.93147180369123816490e-01;  // 32 significant bits: e*ln2_hi exact
  constexpr double ln2_lo = 1.90821492927058770002e-10;
  const double de = static_cast<double>(e);
  return sub(mul(de, ln2_hi), sub(sub(hfsq, add(mul(s, add(hfsq, r)), mul(de, ln2_lo))), f));
}

/// A stream's position: its key, the draws taken and the polar method's spare normal.
struct CounterStream {
  std::uint64_t key = 0;
  std::uint64_t counter = 0;
  bool has_spare = false;
  double spare = 0.0;

  /// Output k depends only on (key, k).
  MFATTN_RANDOM_HOST_DEVICE std::uint64_t next_u64() { return mix64(key + (++counter) * kGolden); }
  /// Uniform in [0, 1) with 53 random bits (exact: a 53-bit integer times 2^-53).
  MFATTN_RANDOM_HOST_DEVICE double uniform() { return mul(static_cast<double>(next_u64() >> 11), 0x1.0p-53); }
  /// Uniform in (-1, 1): 2u - 1 is exact (multiples of 2^-52); only -1 itself is rejected.
  MFATTN_RANDOM_HOST_DEVICE double uniform_symmetric() {
    for (;;) {
      const double v = sub(mul(2.0, uniform()), 1.0);
      if (v != -1.0) return v;
    }
  }
  /// Standard normal, Marsaglia's polar method.
  MFATTN_RANDOM_HOST_DEVICE double normal() {
    if (has_spare) {
      has_spare = false;
      return spare;
    }
    double u, v, s;
    do {
      u = uniform_symmetric();
      v = uniform_symmetric();
      s = add(mul(u, u), mul(v, v));
    } while (s >= 1.0 || s == 0.0);
    const double f = root(quotient(mul(-2.0, portable_log(s)), s));
    spare = mul(v, f);
    has_spare = true;
    return mul(u, f);
  }
};

}  // namespace mfattn::random
