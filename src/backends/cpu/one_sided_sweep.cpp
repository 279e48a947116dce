// The one-sided loop's instantiations (one_sided_loop.hpp) for one auxiliary factor:
// MFATTN_ONE_SIDED_FACTOR_INDEX is its index in kernels::AuxFactorTypes (CMakeLists.txt reads
// that list and compiles this file once per factor, so that the copies build side by side).
// Without it, for every factor of the list (a build that lists the file once, such as
// tests/aarch64/run.sh).
#include <tuple>
#include <utility>

#include "backends/cpu/one_sided_loop.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::cpu {
inline namespace MFATTN_CPU_NAMESPACE {
namespace one_sided {

template <class Factor>
void sweep_panel_with(const LanePairTerms& pair_terms, const Factor& factor, const Prepared& p,
                      BlockSums* panel, std::size_t blocks, std::size_t tile) {
  pair_terms.dispatch_with(factor, [&](const auto& terms, const auto& prefix_terms) {
    sweep_panel(terms, prefix_terms, p, panel, blocks, tile);
  });
}

#if defined(MFATTN_ONE_SIDED_FACTOR_INDEX)
using OneFactor = kernels::FactorAt<MFATTN_ONE_SIDED_FACTOR_INDEX>;
template void sweep_panel_with<OneFactor>(const LanePairTerms&, const OneFactor&, const Prepared&, BlockSums*,
                                          std::size_t, std::size_t);
#else
/// The addresses of every factor's sweep_panel_with: an emitted function that refers to each
/// instantiation makes this translation unit emit them all.
template <std::size_t... I>
const void* every_factor_panel(std::index_sequence<I...>) {
  static const std::tuple panels{&sweep_panel_with<kernels::FactorAt<I>>...};
  return &panels;
}
template const void* every_factor_panel(std::make_index_sequence<kernels::AuxFactorTypes::kCount>);
#endif

}  // namespace one_sided
}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
