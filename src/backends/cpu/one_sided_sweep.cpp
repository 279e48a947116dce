// The one-sided loop's instantiations (one_sided_loop.hpp) for one auxiliary factor:
// MFATTN_ONE_SIDED_FACTOR names its type (NoFactor, DistanceFactor, GaussianFactor or
// ToeplitzFactor, which also serves the cosine factor; CMake compiles this file once for each). Without it, for all four (a build
// that lists the file once, such as tests/aarch64/run.sh).
#include "backends/cpu/one_sided_loop.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::cpu {
inline namespace MFATTN_CPU_NAMESPACE {
namespace one_sided {

template <class Factor>
void sweep_panel_with(const PairTerms& pair_terms, const Factor& factor, const Prepared& p,
                      BlockSums* panel, std::size_t blocks, std::size_t tile) {
  pair_terms.dispatch_with(factor, [&](const auto& terms, const auto& prefix_terms) {
    sweep_panel(terms, prefix_terms, p, panel, blocks, tile);
  });
}

#define MFATTN_ONE_SIDED_INSTANTIATE(Factor)                                                  \
  template void sweep_panel_with<Factor>(const PairTerms&, const Factor&, const Prepared&,     \
                                         BlockSums*, std::size_t, std::size_t);
#if defined(MFATTN_ONE_SIDED_FACTOR)
MFATTN_ONE_SIDED_INSTANTIATE(MFATTN_ONE_SIDED_FACTOR)
#else
MFATTN_ONE_SIDED_INSTANTIATE(NoFactor)
MFATTN_ONE_SIDED_INSTANTIATE(DistanceFactor)
MFATTN_ONE_SIDED_INSTANTIATE(GaussianFactor)
MFATTN_ONE_SIDED_INSTANTIATE(ToeplitzFactor)
#endif
#undef MFATTN_ONE_SIDED_INSTANTIATE

}  // namespace one_sided
}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
