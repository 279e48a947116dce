#pragma once
// The one-sided pair loop of the CPU backend (cpu_backend.cpp has the method): a panel of
// receiver blocks walks every source tile by tile and keeps, per receiver i,
//   S_i = sum_j exp(l_ij - B_i),   A_i = sum_j exp(l_ij - B_i) z_j,
// l_ij = <q_i, k_j> + b_j + log(m_ij c_ij), each sum in one fixed order (sources in order,
// fixed lanes, fixed horizontal reductions).
//
// The kernels are instantiated once per pair-term type (mask x auxiliary factor x per-prompt
// mask: LanePairTerms::dispatch), which made the one-sided loop the slowest file of the build by
// far. one_sided_sweep.cpp instantiates them for one auxiliary factor per translation unit
// (CMake compiles it once per factor), so the copies build side by side.
#include <algorithm>
#include <cstddef>
#include <vector>

#include "backends/cpu/micro_kernels.hpp"
#include "backends/cpu/lane_pair_terms.hpp"
#include "backends/cpu/vector_math.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::cpu {
inline namespace MFATTN_CPU_NAMESPACE {
namespace one_sided {

/// Running sums of one block of receivers over the sources seen so far:
/// S_i as lanes, and A_i as lanes over sources (small d) or as rows (large d).
struct BlockSums {
  std::size_t size = 0;   // receivers per block: kSmallBlock or kLargeBlock
  std::size_t receivers[kMaxBlock];
  std::size_t count = 0;  // receivers of the block that exist (the rest repeat the last)
  double offset[kMaxBlock];
  Lanes weight_lanes[kMaxBlock];
  Lanes acc_lanes[kMaxBlock][kSmallDimension];
  double* acc = nullptr;  // size rows of acc_stride numbers
  std::size_t acc_stride = 0;
  double weight_sum[kMaxBlock];

  void reset() {
    for (std::size_t r = 0; r < size; ++r) {
      weight_lanes[r] = Lanes{};
      for (auto& lanes : acc_lanes[r]) lanes = Lanes{};
    }
    std::fill(acc, acc + size * acc_stride, 0.0);
  }
};

/// Receivers of a panel share every source tile while it is in cache: kPanelBlocks blocks
/// of receivers walk the sources tile by tile.
inline constexpr std::size_t kPanelBlocks = 16;
// (2d + 1) * 4 KiB of keys, values and bias: in L1 (48 KiB) for d <= 4 while each group of
// receivers of the panel walks the tile.
inline constexpr std::size_t kSmallSourceTile = 512;
// 2 * 256 * d * 8 bytes of keys and values (256 KiB at d = 64) stay in L2 for the panel; the
// weights of one block for a tile (6 x 256 x 8 bytes = 12 KiB) stay in L1.
inline constexpr std::size_t kLargeSourceTile = 256;
static_assert(kLargeSourceTile % kKeyPanel == 0 && kLargeSourceTile % kTile == 0);

/// Horizontal sums of the lanes, in a fixed order.
inline void finalize(const Prepared& p, BlockSums& block) {
  for (std::size_t r = 0; r < block.size; ++r) {
    block.weight_sum[r] = simd::horizontal_sum(block.weight_lanes[r]);
    if (p.d <= kSmallDimension)
      for (std::size_t c = 0; c < p.d; ++c)
        block.acc[r * block.acc_stride + c] = simd::horizontal_sum(block.acc_lanes[r][c]);
  }
}

/// Lanes over sources: for small d the sums A_i stay in registers as lane vectors.
/// The exp dominates here, so the loop is trimmed around it: the logits are base 2 (see
/// cpu_backend.cpp's file comment), and the block's receivers take their exps in lockstep,
/// so that the out-of-order core always finds independent FMAs along the polynomial's long
/// dependency chain (exps issued one after the other left the FMA pipes idle about a fifth of
/// the time).
template <int kDim, class Terms>
void accumulate_small(const Terms& terms, const Prepared& p, BlockSums& block,
                      std::size_t begin, std::size_t end) {
  constexpr std::size_t kBlock = kSmallBlock;  // all in lockstep
  const std::size_t d = kDim > 0 ? std::size_t(kDim) : p.d;
  constexpr std::size_t kMaxDim = kDim > 0 ? std::size_t(kDim) : kSmallDimension;
  const std::size_t ns = p.source_stride;
  double q[kBlock][kMaxDim] = {};
  Lanes acc[kBlock][kMaxDim] = {};
  Lanes sums[kBlock];
  double neg_offset[kBlock];
  typename Terms::Receiver receiver_terms[kBlock];
  for (std::size_t r = 0; r < kBlock; ++r) {
    const std::size_t i = block.receivers[r];
    for (std::size_t c = 0; c < d; ++c) {
      q[r][c] = p.queries[i * d + c] * kLog2e;
      acc[r][c] = block.acc_lanes[r][c];
    }
    sums[r] = block.weight_lanes[r];
    neg_offset[r] = -block.offset[r] * kLog2e;
    receiver_terms[r] = terms.receiver(i);
  }
  auto chunk = [&]<bool kBias, bool kMayUnderflow>(std::size_t j) {
    const double* key_lanes = p.key_lanes(0, j);
    Lanes keys[kMaxDim] = {};
    for (std::size_t c = 0; c < d; ++c) keys[c] = simd::load(key_lanes + c * kKeyPanel);
    Lanes logits[kBlock], weights[kBlock];
    for (std::size_t r = 0; r < kBlock; ++r) {
      logits[r] = q[r][0] * keys[0] + neg_offset[r];
      for (std::size_t c = 1; c < d; ++c) logits[r] += q[r][c] * keys[c];
      if constexpr (kBias) logits[r] += simd::load(p.bias_log2.data() + j);
      if constexpr (Terms::kHasLogTerm)
        logits[r] += terms.log_term(receiver_terms[r], j) * kLog2e;
    }
    simd::exp2_nonpositive<kBlock, kMayUnderflow>(logits, weights);
    if constexpr (Terms::kHasFactor)
      for (std::size_t r = 0; r < kBlock; ++r) weights[r] *= terms.factor(receiver_terms[r], j);
    for (std::size_t c = 0; c < d; ++c) {
      const Lanes values = simd::load(p.values_t.data() + c * ns + j);
      for (std::size_t r = 0; r < kBlock; ++r) acc[r][c] += weights[r] * values;
    }
    for (std::size_t r = 0; r < kBlock; ++r) sums[r] += weights[r];
  };
  // Sources before bias_free_end all have p_j = 1 (bias 0); the rest, padding included,
  // add their bias. Adding a zero bias changes no bit, so both paths agree.
  // Without bias and log-terms every logit is >= -2 B_i log2(e); when that cannot reach the
  // underflow edge, the exponential's select is left out (same bits, fewer operations).
  const std::size_t free_begin = std::clamp(p.bias_free_begin, begin, end);
  const std::size_t free_end = std::clamp(p.bias_free_end, free_begin, end);
  for (std::size_t j = begin; j < free_begin; j += kLanes) chunk.template operator()<true, true>(j);
  if (p.logits_above_underflow && !Terms::kHasLogTerm)
    for (std::size_t j = free_begin; j < free_end; j += kLanes)
      chunk.template operator()<false, false>(j);
  else
    for (std::size_t j = free_begin; j < free_end; j += kLanes)
      chunk.template operator()<false, true>(j);
  for (std::size_t j = free_end; j < end; j += kLanes) chunk.template operator()<true, true>(j);
  for (std::size_t r = 0; r < kBlock; ++r) {
    block.weight_lanes[r] = sums[r];
    for (std::size_t c = 0; c < d; ++c) block.acc_lanes[r][c] = acc[r][c];
  }
}

/// Lanes over components: for large d the weights of a tile are computed panel by panel
/// into an L1-resident buffer, then A_i += W Z runs as a register-blocked product.
template <class Terms>
void accumulate_large(const Terms& terms, const Prepared& p, BlockSums& block,
                      std::size_t begin, std::size_t end) {
  const std::size_t d = p.d, dp = p.padded_dim;
  // The block's queries and offsets times log2(e), for base-2 logits.
  thread_local std::vector<double> scaled_queries;
  scaled_queries.resize(kLargeBlock * d);
  const double* q[kLargeBlock];
  double neg_offset[kLargeBlock];
  typename Terms::Receiver receiver_terms[kLargeBlock];
  for (std::size_t r = 0; r < kLargeBlock; ++r) {
    const double* query = p.queries.data() + block.receivers[r] * d;
    for (std::size_t c = 0; c < d; ++c) scaled_queries[r * d + c] = query[c] * kLog2e;
    q[r] = scaled_queries.data() + r * d;
    neg_offset[r] = -block.offset[r] * kLog2e;
    receiver_terms[r] = terms.receiver(block.receivers[r]);
  }
  alignas(64) double weights[kLargeBlock][kLargeSourceTile];
  Lanes sums[kLargeBlock];
  for (std::size_t r = 0; r < kLargeBlock; ++r) sums[r] = block.weight_lanes[r];
  for (std::size_t j = begin; j < end; j += kKeyPanel) {
    Lanes logits[kLargeBlock][4];
    panel_logits<kLargeBlock>(terms, p, q, neg_offset, receiver_terms, p.bias_log2.data(),
                              kLog2e, j, logits);
    for (std::size_t r = 0; r < kLargeBlock; ++r) {
      Lanes weight[4];
      simd::exp2_nonpositive(logits[r], weight);
      for (std::size_t h = 0; h < 4; ++h) {
        if constexpr (Terms::kHasFactor)
          weight[h] *= terms.factor(receiver_terms[r], j + h * kLanes);
        sums[r] += weight[h];
        simd::store(weights[r] + (j - begin) + h * kLanes, weight[h]);
      }
    }
  }
  for (std::size_t r = 0; r < kLargeBlock; ++r) block.weight_lanes[r] = sums[r];
  add_weighted_rows<kLargeBlock>(p.values_rows.data() + begin * p.row_stride, p.row_stride,
                                 block.acc, block.acc_stride, weights[0], kLargeSourceTile, 1,
                                 end - begin, dp);
}

/// Adds sources [begin, end) to the block's sums. The prefix region with the per-prompt
/// mask (a short range) takes the generic small-d loop, which halves what it adds to the
/// build.
template <class Terms>
void accumulate(const Terms& terms, const Prepared& p, BlockSums& block, std::size_t begin,
                std::size_t end) {
  if constexpr (Terms::kPromptMasked) {
    if (p.d <= kSmallDimension) return accumulate_small<0>(terms, p, block, begin, end);
    return accumulate_large(terms, p, block, begin, end);
  }
  switch (p.d) {
    case 2: return accumulate_small<2>(terms, p, block, begin, end);
    case 3: return accumulate_small<3>(terms, p, block, begin, end);
    case 4: return accumulate_small<4>(terms, p, block, begin, end);
    default:
      if (p.d <= kSmallDimension) return accumulate_small<0>(terms, p, block, begin, end);
      return accumulate_large(terms, p, block, begin, end);
  }
}

/// exact_i = max(exact_i, max_{j in [begin, end)} l_ij) for each receiver of the block
/// (start from -inf: it stays -inf when no source is visible).
template <std::size_t kReceivers, class Terms>
void max_block(const Terms& terms, const Prepared& p, const std::size_t* receivers,
               std::size_t begin, std::size_t end, double* exact) {
  const double* q[kReceivers];
  const double zero[kReceivers] = {};
  typename Terms::Receiver receiver_terms[kReceivers];
  Lanes best[kReceivers];
  for (std::size_t r = 0; r < kReceivers; ++r) {
    q[r] = p.queries.data() + receivers[r] * p.d;
    receiver_terms[r] = terms.receiver(receivers[r]);
    best[r] = simd::broadcast(exact[r]);
  }
  for (std::size_t j = begin; j < end; j += kKeyPanel) {
    Lanes logits[kReceivers][4];
    panel_logits<kReceivers>(terms, p, q, zero, receiver_terms, p.bias.data(), 1.0, j, logits);
    for (std::size_t r = 0; r < kReceivers; ++r)
      best[r] = simd::max(best[r], simd::max(simd::max(logits[r][0], logits[r][1]),
                                             simd::max(logits[r][2], logits[r][3])));
  }
  for (std::size_t r = 0; r < kReceivers; ++r) exact[r] = simd::horizontal_max(best[r]);
}

/// The panel's sums over every source: the prefix region (prefix_terms) first, then the
/// moving sources (terms), tile by tile; then each block's horizontal sums, and a block whose
/// bound B_i was loose for some receiver (S_i < kLooseBound) summed again with that
/// receiver's exact maximum.
template <class Terms, class PrefixTerms>
void sweep_panel(const Terms& terms, const PrefixTerms& prefix_terms, const Prepared& p,
                 BlockSums* panel, std::size_t blocks, std::size_t tile) {
  // The prefix region (often empty) first, then the moving sources, tile by tile.
  auto sweep = [&](auto&& add_tile) {
    for (std::size_t begin = 0; begin < p.first_moving; begin += tile)
      add_tile(prefix_terms, begin, std::min(p.first_moving, begin + tile));
    for (std::size_t begin = p.first_moving; begin < p.padded_sources; begin += tile)
      add_tile(terms, begin, std::min(p.padded_sources, begin + tile));
  };
  sweep([&](const auto& region_terms, std::size_t begin, std::size_t end) {
    for (std::size_t b = 0; b < blocks; ++b) accumulate(region_terms, p, panel[b], begin, end);
  });
  for (std::size_t b = 0; b < blocks; ++b) {
    BlockSums& block = panel[b];
    finalize(p, block);
    bool loose = false;
    for (std::size_t r = 0; r < block.count; ++r)
      loose = loose || !(block.weight_sum[r] >= kLooseBound);
    if (!loose) continue;
    // The bound was loose for some receiver: take its exact maximum and sum again. The
    // other receivers keep their offsets, hence the same bits as in the first pass.
    double exact[kMaxBlock];
    for (double& e : exact) e = kNegInf;
    sweep([&](const auto& region_terms, std::size_t begin, std::size_t end) {
      if (block.size == kSmallBlock)
        max_block<kSmallBlock>(region_terms, p, block.receivers, begin, end, exact);
      else
        max_block<kLargeBlock>(region_terms, p, block.receivers, begin, end, exact);
    });
    for (std::size_t r = 0; r < block.size; ++r)
      if (!(block.weight_sum[r] >= kLooseBound)) block.offset[r] = exact[r];
    block.reset();
    sweep([&](const auto& region_terms, std::size_t begin, std::size_t end) {
      accumulate(region_terms, p, block, begin, end);
    });
    finalize(p, block);
  }
}

/// sweep_panel with the model's mask (and per-prompt mask) and the auxiliary factor `factor`
/// (LanePairTerms::dispatch_with): defined in one_sided_sweep.cpp, one factor per translation
/// unit.
template <class Factor>
void sweep_panel_with(const LanePairTerms& pair_terms, const Factor& factor, const Prepared& p,
                      BlockSums* panel, std::size_t blocks, std::size_t tile);

}  // namespace one_sided
}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
