#pragma once
// The CPU backend's derivative passes of SA and USA (detail::PairPasses; the formulas of
// docs/model.md section 2e), in lanes: sources as lanes, blocks of receivers in lockstep, the
// weights recomputed tile by tile from the same base-2 exponential as the forward loops
// (simd::exp2_nonpositive) and never stored, so memory stays O(n). Per head:
//   forward   o_i = max_j l_ij (one pass without exponentials), then S_i and A_i;
//   VJP       a receiver pass, h_i = sum_j l_bar_ij k_j and sum_j l_bar_ij (and the factor's
//             numbers), and a source pass, sum_i l_bar_ij q_i, sum_i P_ij u_bar_i and
//             sum_i l_bar_ij: each sum owned by one receiver block or one source tile, taken
//             in one fixed order, so 1 and 2 threads give the same bits;
//   JVP       one receiver pass.
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
std::unique_ptr<detail::PairPasses> make_lane_pair_passes(const LanePairTerms& pair_terms, int threads);

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
