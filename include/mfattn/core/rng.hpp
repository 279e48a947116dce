#pragma once
/// \file rng.hpp
/// Portable, counter-based random numbers: the same (seed, stream, counter) gives the same
/// bits with any compiler, standard library or thread count. Only integer arithmetic and
/// IEEE-754 +,-,*,/,sqrt are used (compiled with -ffp-contract=off), never libm or
/// std::*_distribution, whose results differ between implementations.
#include <cstdint>

namespace mfattn {

/// SplitMix64 finaliser: a bijective 64-bit mix.
std::uint64_t mix64(std::uint64_t z);

/// A stream of numbers keyed by (seed, key1, key2, key3): e.g. (seed, replica, token, step).
/// Streams with different keys are statistically independent; no state is shared, so the
/// draws of one token never depend on how many other tokens exist.
class RandomStream {
 public:
  RandomStream(std::uint64_t seed, std::uint64_t key1 = 0, std::uint64_t key2 = 0,
               std::uint64_t key3 = 0);
  std::uint64_t next_u64();
  /// Uniform in [0, 1) with 53 random bits.
  double uniform();
  /// Uniform in (-1, 1).
  double uniform_symmetric();
  /// Standard normal, Marsaglia polar method with portable_log.
  double normal();

 private:
  std::uint64_t key_;
  std::uint64_t counter_ = 0;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

/// Natural logarithm for x > 0 from IEEE basic operations only (bit-reproducible, < 1 ulp
/// typical): x = 2^e m, m in [sqrt(1/2), sqrt(2)), log m = 2 atanh((m-1)/(m+1)) by its series.
double portable_log(double x);

/// Stream tags, so that streams for different purposes never collide.
enum class StreamTag : std::uint64_t {
  InitialState = 1,
  Matrices = 2,
  Noise = 3,
  Amplitudes = 4,
  Positions = 5,
  Generators = 6,
  Prefix = 7,
  Keys = 8,         ///< mfattn keys: its queries and keys
  CommonNoise = 9,  ///< the increments shared by a replica's tokens (--common-noise)
};

}  // namespace mfattn
