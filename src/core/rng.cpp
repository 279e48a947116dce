// Portable counter-based random numbers: the formulas are core/counter_random.hpp's, shared
// with the CUDA resident kernel. Compiled with -ffp-contract=off (CMakeLists.txt): every
// floating-point result below is a sequence of correctly rounded IEEE operations, hence
// bit-identical on every compiler and ISA. Do not call libm transcendentals or
// std::*_distribution here.
#include "mfattn/core/rng.hpp"

#include "core/counter_random.hpp"

namespace mfattn {

std::uint64_t mix64(std::uint64_t z) { return random::mix64(z); }

RandomStream::RandomStream(std::uint64_t seed, std::uint64_t key1, std::uint64_t key2,
                           std::uint64_t key3)
    : key_(random::stream_key(seed, key1, key2, key3)) {}

namespace {
/// The stream's position as core/counter_random.hpp keeps it, and back.
template <class Draw>
auto draw(std::uint64_t key, std::uint64_t& counter, bool& has_spare, double& spare, Draw&& how) {
  random::CounterStream stream{key, counter, has_spare, spare};
  const auto value = how(stream);
  counter = stream.counter;
  has_spare = stream.has_spare;
  spare = stream.spare;
  return value;
}
}  // namespace

std::uint64_t RandomStream::next_u64() {
  return draw(key_, counter_, has_spare_, spare_, [](random::CounterStream& s) { return s.next_u64(); });
}
double RandomStream::uniform() {
  return draw(key_, counter_, has_spare_, spare_, [](random::CounterStream& s) { return s.uniform(); });
}
double RandomStream::uniform_symmetric() {
  return draw(key_, counter_, has_spare_, spare_,
              [](random::CounterStream& s) { return s.uniform_symmetric(); });
}
double RandomStream::normal() {
  return draw(key_, counter_, has_spare_, spare_, [](random::CounterStream& s) { return s.normal(); });
}

double portable_log(double x) { return random::portable_log(x); }

}  // namespace mfattn
