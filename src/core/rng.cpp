// Portable counter-based random numbers. Compiled with -ffp-contract=off: every floating-point
// result below is a sequence of correctly rounded IEEE operations, hence bit-identical on every
// compiler and ISA. Do not call libm transcendentals or std::*_distribution here.
#include "mfattn/rng.hpp"

#include <cmath>
#include <limits>

namespace mfattn {

namespace {
constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ULL;  // Weyl increment of SplitMix64
}  // namespace

std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

RandomStream::RandomStream(std::uint64_t seed, std::uint64_t key1, std::uint64_t key2,
                           std::uint64_t key3) {
  // Chained absorption: each key is pre-mixed with its own odd constant, so that permuted keys
  // ((1,2) vs (2,1)) and zero keys give unrelated stream keys.
  std::uint64_t h = mix64(seed + 0xD1B54A32D192ED03ULL);
  h = mix64(h ^ mix64(key1 + 0x8CB92BA72F3D8DD7ULL));
  h = mix64(h ^ mix64(key2 + 0xABC98388FB8FAC03ULL));
  h = mix64(h ^ mix64(key3 + 0xF1357AEA2E62A9C5ULL));
  key_ = h;
}

// SplitMix64 with state key_ + counter * golden: output k depends only on (key, k).
std::uint64_t RandomStream::next_u64() { return mix64(key_ + (++counter_) * kGolden); }

double RandomStream::uniform() {
  return static_cast<double>(next_u64() >> 11) * 0x1.0p-53;  // exact: 53-bit integer * 2^-53
}

double RandomStream::uniform_symmetric() {
  // 2u - 1 is exact (multiples of 2^-52 in [-1, 1)); only -1 itself must be rejected.
  for (;;) {
    const double v = 2.0 * uniform() - 1.0;
    if (v != -1.0) return v;
  }
}

double RandomStream::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u, v, s;
  do {
    u = uniform_symmetric();
    v = uniform_symmetric();
    s = u * u + v * v;
  } while (s >= 1.0 || s == 0.0);
  const double f = std::sqrt(-2.0 * portable_log(s) / s);
  spare_ = v * f;
  has_spare_ = true;
  return u * f;
}

double portable_log(double x) {
  if (std::isnan(x) || x < 0.0) return std::numeric_limits<double>::quiet_NaN();
  if (x == 0.0) return -std::numeric_limits<double>::infinity();
  if (std::isinf(x)) return x;

  // x = 2^e m with m in [sqrt(1/2), sqrt(2)); frexp is exact (subnormals included).
  int e = 0;
  double m = std::frexp(x, &e);
  if (m < 0.70710678118654752440) {
    m *= 2.0;
    --e;
  }
  // log m = 2 atanh(s), s = f / (2 + f), f = m - 1 (exact by Sterbenz), |s| <= 0.1716.
  // Written as fdlibm does, log(1+f) = f - hfsq + s (hfsq + R) with hfsq = f^2/2 and
  // R = 2 s^2/3 + 2 s^4/5 + ..., so the dominant term f carries no rounding error and the
  // result stays within about one ulp. Taylor terms up to s^24; the next, 2 s^26/27, is
  // below 2^-68 of log m.
  const double f = m - 1.0;
  const double s = f / (2.0 + f);
  const double z = s * s;
  double r = 2.0 / 25.0;
  for (int k = 11; k >= 1; --k) r = 2.0 / (2 * k + 1) + z * r;  // Horner in z
  r *= z;  // R = sum_{k>=1} 2 z^k / (2k+1)
  const double hfsq = 0.5 * f * f;
  constexpr double ln2_hi = 6.93147180369123816490e-01;  // 32 significant bits: e*ln2_hi exact
  constexpr double ln2_lo = 1.90821492927058770002e-10;
  const double de = static_cast<double>(e);
  return de * ln2_hi - ((hfsq - (s * (hfsq + r) + de * ln2_lo)) - f);
}

}  // namespace mfattn
