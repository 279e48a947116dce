#pragma once
// The CPU backend's derivative passes of SA and USA (detail::PairPasses; the formulas of
// docs/model.md section 2e), in lanes: sources as lanes, blocks of receivers in lockstep, the
// weights recomputed tile by tile from the same base-2 exponential as the forward loops
// (simd::exp2_nonpositive) and never stored, so memory stays O(n). Per head:
//   forward   S_i and A_i from the offset o_i = the Cauchy-Schwarz bound of the logits (their
//             exact maximum where the bound is loose), one pass per receiver block;
//   VJP       one pass per tile of sources against every receiver: the tile's source sums
//             (sum_i l_bar_ij q_i, sum_i P_ij u_bar_i, sum_i l_bar_ij) its own, each
//             receiver's share (h_i = sum_j l_bar_ij k_j, the factor's numbers) added to the
//             row of the tile's group; every sum in one fixed order, so 1 and 2 threads give
//             the same bits;
//   JVP       one pass per receiver block.
// The masks and factors are the kernels' (LanePairTerms), read a tile of sources at a time
// into rows; the factor's numbers' derivatives are their term_derivatives beside them.
// Sinkhorn attention keeps the reference's unrolled passes (reference_derivatives.cpp).
#include <memory>

#include "backends/cpu/lane_pair_terms.hpp"
#include "backends/reference/reference_derivatives.hpp"
#include "mfattn/core/model.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::cpu {
inline namespace MFATTN_CPU_NAMESPACE {

/// The passes over the model's lane terms `pair_terms` (which outlive the result), on
/// `threads` threads.
std::unique_ptr<detail::PairPasses> make_lane_pair_passes(const LanePairTerms& pair_terms,
                                                          int threads);

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
