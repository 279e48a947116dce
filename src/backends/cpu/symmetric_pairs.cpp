// The symmetric pair loop of the CPU backend: see symmetric_pairs.hpp.
#include "backends/cpu/symmetric_pairs.hpp"

#include "mfattn/core/evaluation_watch.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <thread>
#include <type_traits>

#include "backends/backend_common.hpp"
#include "mfattn/backends/backend.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::cpu {
inline namespace MFATTN_CPU_NAMESPACE {
namespace {

// 64 = 10 x 6 + 4: the large-d micro-kernels take a tile's receivers 6 at a time, then 4.
static_assert(kTile % kLargeBlock == kSmallBlock && kTile % kLanes == 0 && kTile % kKeyPanel == 0);

// Full mask, no auxiliary factor: what the logit micro-kernel needs to know of the terms.
using PlainTerms = Terms<kernels::FullMask, kernels::NoFactor>;

// d <= 4: row receivers and lane vectors of sources per step (their exps run in lockstep).
// Four rows by two vectors: eight exps in lockstep give the out-of-order core enough
// independent chains to cover the polynomial's latency, and the column sums are loaded and
// stored once per four row receivers (2 x 2 was 4-5 % slower on one thread at n = 256 to
// 4096; 2 x 4 as fast, but its 32-wide diagonal strips take more pairs twice). The rows
// of a step are taken in order and the chunks per step unchanged, so every sum keeps its
// order: the same bits as 2 x 2.
constexpr std::size_t kSymmetricChunks = 2;
// Where a register holds fewer than the 8 lanes, the block is walked once per register of
// the lanes (lanes 0-3, then 4-7 on AVX2): each lane's sums take the same terms in the same
// order either way (a lane never meets another lane's sources), but the kernel then needs a
// register per lane vector instead of two or four (NEON; walked as 2 x 4-lane halves in
// lockstep, GCC spilled half the loop's operands on AVX2). Eight exps in lockstep were
// measured best on AVX-512.
constexpr bool kSymmetricByRegister = simd::kRegistersPerLanes > 1;
constexpr std::size_t kSymmetricRows = 4;
// With 16 registers (AVX2, SSE2) a block is taken in two passes instead: the weights of a
// strip of kWidth rows into an L1 buffer (the exp alone: 4 rows x 2 registers in lockstep,
// the keys loaded once for 4 rows), then the row role (per row, its lane sums in registers)
// and the column role (per lane vector of columns, its sums in registers) from that buffer.
// Fused in one pass, the sums and the exp's temporaries did not fit 16 registers (2 rows x
// 2 lane vectors a step, 33 spills a step). One AVX2 core, n = 2048, best of 10 interleaved:
// 3.07 ms per evaluation against 3.60 ms fused (2 rows x 4 registers: 3.22 ms; every
// coefficient read from memory: 3.11 ms); again later: 3.95 against 4.81 ms. Each sum takes
// the same terms in the same order as in the fused kernel, so the bits are the same.
constexpr bool kSymmetricTwoPass = kSymmetricByRegister && simd::kVectorRegisters < 32;

}  // namespace

bool symmetric_pairs_apply(const Model& model) {
  // The terms declare their symmetry (kernels/pair_terms.hpp); the loop takes log-terms only.
  return model.query_key_identity() &&
         kernels::symmetric_log_terms(model.pair_terms) &&
         model.prefix_count() == 0 && model.beta > 0.0;
}

SymmetricPairs::SymmetricPairs(const Model& model, const LanePairTerms& terms)
    : model_(model), mass_(model.mass()), padded_(round_up(std::max<std::size_t>(model.n, 1), kTile)),
      tiles_(padded_ / kTile), stride_(padded_ + kLanes), all_present_(model.every_token_present()) {
  if (model.pair_terms.mask == MaskKind::Full && model.pair_terms.factor == AuxFactor::None) return;
  terms.dispatch([&](const auto& pair_terms, const auto&) {
    // Only log-terms are taken (symmetric_pairs_apply admits no multiplying factor).
    if constexpr (std::decay_t<decltype(pair_terms)>::kHasFactor)
      throw std::logic_error("symmetric pair loop: a multiplying auxiliary factor is not taken");
    block_log_terms_ = [pair_terms, n = model.n](std::size_t row_tile, std::size_t column_tile,
                                                 double* out) {
      for (std::size_t a = 0; a < kTile; ++a) {
        // Padding receivers (presence 0) take token 0's position: any finite or -inf term
        // will do, it is multiplied by their zero presence.
        const std::size_t i = row_tile * kTile + a;
        const ReceiverPosition receiver = pair_terms.receiver(i < n ? i : 0);
        for (std::size_t b = 0; b < kTile; b += kLanes)
          simd::store(out + a * kTile + b,
                      pair_terms.log_term(receiver, column_tile * kTile + b) * kLog2e);
      }
    };
  });
  if (model.pair_terms.mask != MaskKind::Window) return;
  // Per tile, the box of its tokens' positions. If the boxes of two tiles are farther apart
  // than the window, so is every pair, and all their weights are exact zeros. The pairs'
  // distances are computed with the same kind of operations (differences, squares, sum in
  // coordinate order) but the compiler may fuse a multiply and an add in one and not in the
  // other, so the boxes' gap must exceed the window by a margin (2^-40 relative, far above
  // the few roundings either sum takes) before a block is skipped.
  const std::size_t dim = model.position_dim;
  const std::vector<double>& positions = terms.receiver_positions();
  std::vector<double> low(tiles_ * dim, 0.0), high(tiles_ * dim, 0.0);
  for (std::size_t t = 0; t < tiles_; ++t)
    for (std::size_t a = 0; a < dim; ++a) {
      double lo = std::numeric_limits<double>::infinity(), hi = -lo;
      for (std::size_t i = t * kTile; i < std::min((t + 1) * kTile, model.n); ++i) {
        lo = std::min(lo, positions[i * dim + a]);
        hi = std::max(hi, positions[i * dim + a]);
      }
      low[t * dim + a] = lo;
      high[t * dim + a] = hi;
    }
  const double window_squared = kernels::WindowMask::from(model.pair_terms).window_squared;
  skipped_.assign(tiles_ * tiles_, 0);
  for (std::size_t row = 0; row < tiles_; ++row)
    for (std::size_t column = row; column < tiles_; ++column) {
      double gap2 = 0.0;
      for (std::size_t a = 0; a < dim; ++a) {
        const double above = low[column * dim + a] - high[row * dim + a];
        const double below = low[row * dim + a] - high[column * dim + a];
        const double gap = above > 0.0 ? above : below > 0.0 ? below : 0.0;
        gap2 += gap * gap;
      }
      skipped_[row * tiles_ + column] = gap2 > window_squared * (1.0 + 0x1p-40);
    }
}

void SymmetricPairs::layout(const Prepared& p, Replica& s) const {
  const std::size_t n = model_.n, d = model_.d;
  const std::size_t sums = d <= kSmallDimension ? d * stride_ : padded_ * p.row_stride;
  if (s.sums[0].acc.size() == sums) return;
  s.queries.assign(padded_ * d, 0.0);
  s.presence.assign(padded_, 0.0);
  std::copy(model_.presence.begin(), model_.presence.begin() + n, s.presence.begin());
  // With every p_j = 1 the prepared values are already p_j z_j (same layout and strides).
  if (!all_present_) s.weighted_values.assign(sums, 0.0);
  for (Replica::Sums& parity : s.sums) {
    parity.acc.assign(sums, 0.0);
    parity.weight_sum.assign(padded_, 0.0);
    if (d <= kSmallDimension) parity.row_lanes.assign(padded_ * (d + 1) * kLanes, 0.0);
  }
}

/// Tile t of a replica for this evaluation: sums cleared, queries scaled to base 2, values
/// weighted by presence; returns the largest offset B_i of its present receivers.
double SymmetricPairs::build_tile(const Prepared& p, Replica& s, std::size_t t) const {
  const std::size_t n = model_.n, d = model_.d;
  const std::size_t begin = t * kTile, end = begin + kTile, filled = std::min(end, n);
  for (Replica::Sums& parity : s.sums) {
    std::fill(parity.weight_sum.begin() + begin, parity.weight_sum.begin() + end, 0.0);
    if (d <= kSmallDimension)
      for (std::size_t c = 0; c < d; ++c)
        std::fill(parity.acc.begin() + c * stride_ + begin, parity.acc.begin() + c * stride_ + end, 0.0);
    else
      std::fill(parity.acc.begin() + begin * p.row_stride, parity.acc.begin() + end * p.row_stride, 0.0);
  }
  for (std::size_t i = begin * d; i < filled * d; ++i) s.queries[i] = p.queries[i] * kLog2e;
  if (d <= kSmallDimension) {
    for (std::size_t c = 0; c < d; ++c) {
      if (!all_present_)
        for (std::size_t j = begin; j < filled; ++j)
          s.weighted_values[c * stride_ + j] = s.presence[j] * p.values_t[c * p.source_stride + j];
    }
  } else {
    if (!all_present_)
      for (std::size_t j = begin; j < filled; ++j)
        for (std::size_t c = 0; c < d; ++c)
          s.weighted_values[j * p.row_stride + c] = s.presence[j] * p.values_rows[j * p.row_stride + c];
  }
  // The common offset: the largest B_i of a present receiver (B_i already holds the largest
  // key of a present source), so null tokens change no offset.
  double offset = 0.0;
  for (std::size_t i = begin; i < filled; ++i)
    if (model_.receiver_speed(i) > 0.0) offset = std::max(offset, p.offsets[i]);
  return offset;
}

/// d <= 4: lanes over the column tile's sources; kRows row receivers x kChunks lane vectors
/// of sources per step, their kRows kChunks exps in lockstep (independent chains for the
/// FMA pipes). The row sums continue each receiver's lane sums across blocks (reduced when it
/// is finished); the column sums are loaded, take one term per row receiver in order, and are
/// stored back. A diagonal block (kDiagonal) is taken as a triangle of kWidth-wide strips:
/// the strip of the row receivers themselves in the row role only (both orders of each pair
/// there), every later strip in both roles, earlier strips not at all (their pairs came with
/// the earlier rows).
template <std::size_t kDim, bool kDiagonal, bool kAllPresent, bool kLogTerms>
void SymmetricPairs::small_block(const Prepared& p, Replica& s, std::size_t row_tile,
                                 std::size_t column_tile, const double* log_terms) const {
  constexpr std::size_t kRows = kSymmetricRows, kChunks = kSymmetricChunks;
  constexpr std::size_t kWidth = kChunks * kLanes, kExps = kRows * kChunks;
  static_assert(kTile % kWidth == 0 && kWidth % kRows == 0 && kKeyPanel % kWidth == 0);
  // The block is walked once per part of the lanes (see kSymmetricByRegister): V is one
  // register, and `part` the offset of its lanes in every lane vector of the layout.
  using V = std::conditional_t<kSymmetricByRegister, simd::Register, Lanes>;
  constexpr std::size_t kParts = kSymmetricByRegister ? simd::kRegistersPerLanes : 1;
  const std::size_t a_begin = row_tile * kTile, b_begin = column_tile * kTile;
  // The last tile's padding (tokens n .. padded - 1, presence 0 and value 0) adds exact +0s
  // to every sum that is read, so whole strips of it are skipped: the same bits, and at
  // n = 32 (one tile, half padding) a quarter of the pairs. Rows end on a whole kWidth strip
  // so that the diagonal's strips stay whole; columns on a whole kWidth chunk.
  const std::size_t n = model_.n;
  const std::size_t a_end = a_begin + std::min(kTile, round_up(n - a_begin, kWidth));
  const std::size_t b_end = b_begin + std::min(kTile, round_up(n - b_begin, kWidth));
  const std::size_t stride = stride_;
  const V neg_offset = simd::splat<V>(s.neg_offset_log2);
  Replica::Sums& sums = s.sums[(row_tile + column_tile) % 2];
  double* acc = sums.acc.data();
  double* weight_sum = sums.weight_sum.data();
  double* row_lanes = sums.row_lanes.data();
  // A tile's first block in the row role of each parity starts its lane sums from zero: the
  // diagonal one (round 2 I) for the even sums, (I, I + 1) for the odd ones (run_block clears
  // them where a window skips that block; the last tile's, which no block writes, keep the
  // zeros of layout), so the row lanes are never cleared in a separate pass.
  const bool fresh_rows = kDiagonal || column_tile == row_tile + 1;
  const double* values = s.values;
  const double* presence = s.presence.data();
  const double* queries = s.queries.data();
  if constexpr (kSymmetricTwoPass) {
    using R = simd::Register;
    constexpr std::size_t kRL = simd::kRegisterLanes, kPerLanes = simd::kRegistersPerLanes;
    constexpr std::size_t kStrip = kWidth;  // rows per pass; the diagonal's strips
    constexpr std::size_t kExpRows = 4, kExpRegisters = 8 / kExpRows;  // 8 exps in lockstep
    constexpr std::size_t kExpWidth = kExpRegisters * kRL;
    static_assert(kStrip % kExpRows == 0 && kTile % kExpWidth == 0 && kKeyPanel % kExpWidth == 0);
    alignas(64) double strip_weights[kStrip * kTile];
    const R neg_offset_r = simd::splat<R>(s.neg_offset_log2);
    for (std::size_t s0 = a_begin; s0 < a_end; s0 += kStrip) {
      // The diagonal block: the strip's own columns in the row role only, later strips in
      // both roles, earlier strips not at all (as in the fused kernel below).
      const std::size_t row_first = kDiagonal ? b_begin + (s0 - a_begin) : b_begin;
      const std::size_t column_first = kDiagonal ? row_first + kStrip : b_begin;
      for (std::size_t a = s0; a < s0 + kStrip; a += kExpRows) {
        for (std::size_t j = row_first; j < b_end; j += kExpWidth) {
          const double* key_lanes = p.key_lanes(0, j);
          R logits[kExpRows * kExpRegisters], weights[kExpRows * kExpRegisters];
          for (std::size_t g = 0; g < kExpRegisters; ++g) {
            R keys[kDim];
            for (std::size_t c = 0; c < kDim; ++c)
              keys[c] = simd::load_register(key_lanes + c * kKeyPanel + g * kRL);
            for (std::size_t r = 0; r < kExpRows; ++r) {
              const double* row_q = queries + (a + r) * kDim;
              R& logit = logits[r * kExpRegisters + g];
              logit = row_q[0] * keys[0] + neg_offset_r;
              for (std::size_t c = 1; c < kDim; ++c) logit += row_q[c] * keys[c];
              if constexpr (kLogTerms)
                logit += simd::load_register(log_terms + (a + r - a_begin) * kTile + (j - b_begin) + g * kRL);
            }
          }
          simd::exp2_nonpositive<kExpRows * kExpRegisters, kLogTerms>(logits, weights);
          for (std::size_t r = 0; r < kExpRows; ++r)
            for (std::size_t g = 0; g < kExpRegisters; ++g)
              simd::store(strip_weights + (a + r - s0) * kTile + (j - b_begin) + g * kRL,
                          weights[r * kExpRegisters + g]);
        }
      }
      // The row role: receiver a's lane sums over the columns in order.
      for (std::size_t a = s0; a < s0 + kStrip; ++a) {
        double* lanes = row_lanes + a * (kDim + 1) * kLanes;
        R row_sum[kPerLanes], row_acc[kDim][kPerLanes];
        for (std::size_t q = 0; q < kPerLanes; ++q) {
          row_sum[q] = fresh_rows ? R{} : simd::load_register(lanes + q * kRL);
          for (std::size_t c = 0; c < kDim; ++c)
            row_acc[c][q] = fresh_rows ? R{} : simd::load_register(lanes + (c + 1) * kLanes + q * kRL);
        }
        const double* w_row = strip_weights + (a - s0) * kTile - b_begin;
        for (std::size_t j = row_first; j < b_end; j += kLanes)
          for (std::size_t q = 0; q < kPerLanes; ++q) {
            const std::size_t jq = j + q * kRL;
            const R w = simd::load_register(w_row + jq);
            if constexpr (kAllPresent)
              row_sum[q] += w;
            else
              row_sum[q] += w * simd::load_register(presence + jq);
            for (std::size_t c = 0; c < kDim; ++c)
              row_acc[c][q] += w * simd::load_register(values + c * stride + jq);
          }
        for (std::size_t q = 0; q < kPerLanes; ++q) {
          simd::store(lanes + q * kRL, row_sum[q]);
          for (std::size_t c = 0; c < kDim; ++c) simd::store(lanes + (c + 1) * kLanes + q * kRL, row_acc[c][q]);
        }
      }
      // The column role: each lane vector of columns takes the strip's rows in order.
      for (std::size_t j = column_first; j < b_end; j += kLanes) {
        R column_sum[kPerLanes], column_acc[kDim][kPerLanes];
        for (std::size_t q = 0; q < kPerLanes; ++q) {
          column_sum[q] = simd::load_register(weight_sum + j + q * kRL);
          for (std::size_t c = 0; c < kDim; ++c)
            column_acc[c][q] = simd::load_register(acc + c * stride + j + q * kRL);
        }
        for (std::size_t a = s0; a < s0 + kStrip; ++a) {
          const double* w_row = strip_weights + (a - s0) * kTile + (j - b_begin);
          double row_z[kDim];
          for (std::size_t c = 0; c < kDim; ++c) row_z[c] = values[c * stride + a];
          const double row_presence = presence[a];
          for (std::size_t q = 0; q < kPerLanes; ++q) {
            const R w = simd::load_register(w_row + q * kRL);
            if constexpr (kAllPresent)
              column_sum[q] += w;
            else
              column_sum[q] += w * row_presence;
            for (std::size_t c = 0; c < kDim; ++c) column_acc[c][q] += w * row_z[c];
          }
        }
        for (std::size_t q = 0; q < kPerLanes; ++q) {
          simd::store(weight_sum + j + q * kRL, column_sum[q]);
          for (std::size_t c = 0; c < kDim; ++c) simd::store(acc + c * stride + j + q * kRL, column_acc[c][q]);
        }
      }
    }
  } else {
    // The fused kernel.
    for (std::size_t part = 0; part < kParts * simd::kRegisterLanes; part += simd::kRegisterLanes)
    for (std::size_t a0 = a_begin; a0 < a_end; a0 += kRows) {
      double q[kRows * kDim], row_presence[kRows], row_values[kRows * kDim];
      V row_sum[kRows], row_acc[kRows][kDim];
      for (std::size_t r = 0; r < kRows; ++r) {
        const double* lanes = row_lanes + (a0 + r) * (kDim + 1) * kLanes + part;
        row_sum[r] = fresh_rows ? V{} : simd::load_as<V>(lanes);
        for (std::size_t c = 0; c < kDim; ++c)
          row_acc[r][c] = fresh_rows ? V{} : simd::load_as<V>(lanes + (c + 1) * kLanes);
        row_presence[r] = presence[a0 + r];
        for (std::size_t c = 0; c < kDim; ++c) {
          q[r * kDim + c] = queries[(a0 + r) * kDim + c];
          row_values[r * kDim + c] = values[c * stride + a0 + r];
        }
      }
      auto step = [&]<bool kColumn>(std::size_t j) __attribute__((always_inline)) {
        const double* key_lanes = p.key_lanes(0, j) + part;
        // The row receivers' queries and values are read from memory by the multiply-adds (an
        // embedded broadcast) in every step: hoisted out of the loop, their 24 broadcasts
        // crowded the registers and GCC spilled the row sums instead (7-12 % slower). The
        // empty asm hides that the two arrays do not change between steps.
        const double* row_q = q;
        const double* row_z = row_values;
        asm("" : "+r"(row_q), "+r"(row_z));
        V logits[kExps], weights[kExps];
        for (std::size_t h = 0; h < kChunks; ++h) {
          V keys[kDim];
          for (std::size_t c = 0; c < kDim; ++c)
            keys[c] = simd::load_as<V>(key_lanes + c * kKeyPanel + h * kLanes);
          for (std::size_t r = 0; r < kRows; ++r) {
            V& logit = logits[r * kChunks + h];
            logit = row_q[r * kDim] * keys[0] + neg_offset;
            for (std::size_t c = 1; c < kDim; ++c) logit += row_q[r * kDim + c] * keys[c];
            if constexpr (kLogTerms)
              logit += simd::load_as<V>(log_terms + (a0 + r - a_begin) * kTile + (j - b_begin) +
                                        h * kLanes + part);
          }
        }
        // Without log-terms every logit is >= -2 B log2(e) > -1020 (offset_usable): no select
        // for underflow. A log-term can hide a pair (-inf) or take it below -1022: exactly 0.
        simd::exp2_nonpositive<kExps, kLogTerms, true>(logits, weights);
        for (std::size_t h = 0; h < kChunks; ++h) {
          const std::size_t jh = j + h * kLanes + part;
          const V column_presence = simd::load_as<V>(presence + jh);
          V column_values[kDim];
          for (std::size_t c = 0; c < kDim; ++c) column_values[c] = simd::load_as<V>(values + c * stride + jh);
          for (std::size_t r = 0; r < kRows; ++r) {
            const V w = weights[r * kChunks + h];
            // With every p = 1 in both tiles the weight sums take plain adds (the same bits as
            // w * 1 + S), which leave the multiply-add pipes to the exponential.
            if constexpr (kAllPresent)
              row_sum[r] += w;
            else
              row_sum[r] += w * column_presence;
            for (std::size_t c = 0; c < kDim; ++c) row_acc[r][c] += w * column_values[c];
          }
          if constexpr (kColumn) {
            V column_sum = simd::load_as<V>(weight_sum + jh), column_acc[kDim];
            for (std::size_t c = 0; c < kDim; ++c) column_acc[c] = simd::load_as<V>(acc + c * stride + jh);
            for (std::size_t r = 0; r < kRows; ++r) {
              const V w = weights[r * kChunks + h];
              if constexpr (kAllPresent)
                column_sum += w;
              else
                column_sum += w * row_presence[r];
              for (std::size_t c = 0; c < kDim; ++c) column_acc[c] += w * row_z[r * kDim + c];
            }
            simd::store(weight_sum + jh, column_sum);
            for (std::size_t c = 0; c < kDim; ++c) simd::store(acc + c * stride + jh, column_acc[c]);
          }
        }
      };
      std::size_t j = b_begin;
      if constexpr (kDiagonal) {
        j = b_begin + (a0 - a_begin) / kWidth * kWidth;  // the row receivers' own strip
        step.template operator()<false>(j);
        j += kWidth;
      }
      for (; j < b_end; j += kWidth) step.template operator()<true>(j);
      for (std::size_t r = 0; r < kRows; ++r) {
        double* lanes = row_lanes + (a0 + r) * (kDim + 1) * kLanes + part;
        simd::store(lanes, row_sum[r]);
        for (std::size_t c = 0; c < kDim; ++c) simd::store(lanes + (c + 1) * kLanes, row_acc[r][c]);
      }
    }
  }
}

namespace {

/// The weights e_ab of kReceivers row receivers from a0 against the kTile sources of the
/// column tile, into rows of kTile numbers (logit micro-kernel, then the exp in lockstep).
/// log_terms (or null): laid out like rows, added to the logits before the exp.
template <std::size_t kReceivers>
void exp_rows(const Prepared& p, const double* queries, double neg_offset_log2, std::size_t a0,
              std::size_t b_begin, const double* log_terms, double* rows) {
  const PlainTerms no_terms{};
  const ReceiverPosition no_receivers[kReceivers] = {};
  const double* q[kReceivers];
  double neg_offset[kReceivers];
  for (std::size_t r = 0; r < kReceivers; ++r) {
    q[r] = queries + (a0 + r) * p.d;
    neg_offset[r] = neg_offset_log2;
  }
  for (std::size_t j = b_begin; j < b_begin + kTile; j += kKeyPanel) {
    Lanes logits[kReceivers][4];
    panel_logits<kReceivers>(no_terms, p, q, neg_offset, no_receivers, nullptr, kLog2e, j, logits);
    for (std::size_t r = 0; r < kReceivers; ++r) {
      Lanes weights[4];
      if (log_terms) {
        for (std::size_t h = 0; h < 4; ++h)
          logits[r][h] += simd::load(log_terms + r * kTile + (j - b_begin) + h * kLanes);
        simd::exp2_nonpositive<4, true>(logits[r], weights);
      } else {
        simd::exp2_nonpositive<4, false>(logits[r], weights);
      }
      for (std::size_t h = 0; h < 4; ++h)
        simd::store(rows + r * kTile + (j - b_begin) + h * kLanes, weights[h]);
    }
  }
}

}  // namespace

/// d > 4: the block's weights W (kTile x kTile, L1-resident) from the logit micro-kernel,
/// then A_I += W (p z)_J and A_J += W^T (p z)_I with the GEMM-like micro-kernel (the second
/// reads W transposed through its strides). Each A_i[c] stays one FMA chain over its
/// sources in ascending order across all blocks.
template <bool kColumn>
void SymmetricPairs::large_block(const Prepared& p, Replica& s, std::size_t row_tile,
                                 std::size_t column_tile, const double* log_terms) const {
  alignas(64) double weights[kTile * kTile];
  const std::size_t a_begin = row_tile * kTile, b_begin = column_tile * kTile;
  const std::size_t rs = p.row_stride, dp = p.padded_dim;
  auto terms_of = [&](std::size_t a) { return log_terms ? log_terms + a * kTile : nullptr; };
  std::size_t a = 0;
  for (; a + kLargeBlock <= kTile; a += kLargeBlock)
    exp_rows<kLargeBlock>(p, s.queries.data(), s.neg_offset_log2, a_begin + a, b_begin,
                          terms_of(a), weights + a * kTile);
  exp_rows<kSmallBlock>(p, s.queries.data(), s.neg_offset_log2, a_begin + a, b_begin,
                        terms_of(a), weights + a * kTile);
  const double* presence = s.presence.data();
  Replica::Sums& sums = s.sums[(row_tile + column_tile) % 2];
  double* weight_sum = sums.weight_sum.data();
  for (std::size_t r = 0; r < kTile; ++r) {
    Lanes sum{};
    for (std::size_t b = 0; b < kTile; b += kLanes)
      sum += simd::load(weights + r * kTile + b) * simd::load(presence + b_begin + b);
    weight_sum[a_begin + r] += simd::horizontal_sum(sum);
  }
  if constexpr (kColumn)
    for (std::size_t b = 0; b < kTile; b += kLanes) {
      Lanes sum = simd::load(weight_sum + b_begin + b);
      for (std::size_t r = 0; r < kTile; ++r)
        sum += simd::load(weights + r * kTile + b) * presence[a_begin + r];
      simd::store(weight_sum + b_begin + b, sum);
    }
  // Receivers of one tile, kLargeBlock rows at a time and kSmallBlock for the rest:
  // A_{first + t} += sum_u w(t, u) (p z)_{source_begin + u}, w(t, u) = w[t * stride + u * step].
  auto add = [&](std::size_t first, std::size_t source_begin, std::size_t stride,
                 std::size_t step) {
    const double* sources = s.values + source_begin * rs;
    std::size_t t = 0;
    for (; t + kLargeBlock <= kTile; t += kLargeBlock)
      add_weighted_rows<kLargeBlock>(sources, rs, sums.acc.data() + (first + t) * rs, rs,
                                     weights + t * stride, stride, step, kTile, dp);
    add_weighted_rows<kSmallBlock>(sources, rs, sums.acc.data() + (first + t) * rs, rs,
                                   weights + t * stride, stride, step, kTile, dp);
  };
  add(a_begin, b_begin, kTile, 1);
  if constexpr (kColumn) add(b_begin, a_begin, 1, kTile);
}

void SymmetricPairs::run_block(const Prepared& p, Replica& s, std::size_t row_tile,
                               std::size_t column_tile) const {
  if (!skipped_.empty() && skipped_[row_tile * tiles_ + column_tile]) {
    // The tile's odd row lanes start in block (I, I + 1) (see small_block).
    if (column_tile == row_tile + 1 && p.d <= kSmallDimension) {
      double* lanes = s.sums[1].row_lanes.data() + row_tile * kTile * (p.d + 1) * kLanes;
      std::fill(lanes, lanes + kTile * (p.d + 1) * kLanes, 0.0);
    }
    return;
  }
  alignas(64) double log_terms[kTile * kTile];
  const bool with_terms = static_cast<bool>(block_log_terms_);
  if (with_terms) block_log_terms_(row_tile, column_tile, log_terms);
  const bool column = row_tile != column_tile;
  // Plain adds for the weight sums only where every token of both tiles is present: the
  // padding of the last tile must still be multiplied by its zero presence.
  const bool all_present = all_present_ && (std::max(row_tile, column_tile) + 1) * kTile <= model_.n;
  auto small = [&]<std::size_t kDim>() {
    // With log-terms the weight sums always multiply by the presence: plain adds there were
    // within the noise (a few %), not worth six more instantiations of the kernel.
    if (with_terms) {
      if (column)
        small_block<kDim, false, false, true>(p, s, row_tile, column_tile, log_terms);
      else
        small_block<kDim, true, false, true>(p, s, row_tile, column_tile, log_terms);
    } else if (all_present) {
      if (column)
        small_block<kDim, false, true, false>(p, s, row_tile, column_tile, nullptr);
      else
        small_block<kDim, true, true, false>(p, s, row_tile, column_tile, nullptr);
    } else if (column) {
      small_block<kDim, false, false, false>(p, s, row_tile, column_tile, nullptr);
    } else {
      small_block<kDim, true, false, false>(p, s, row_tile, column_tile, nullptr);
    }
  };
  const double* terms = with_terms ? log_terms : nullptr;
  switch (p.d) {
    case 2: return small.template operator()<2>();
    case 3: return small.template operator()<3>();
    case 4: return small.template operator()<4>();
    default:
      if (column)
        large_block<true>(p, s, row_tile, column_tile, terms);
      else
        large_block<false>(p, s, row_tile, column_tile, terms);
  }
}

void SymmetricPairs::evaluate(const std::vector<Prepared>& prepared, std::size_t replicas,
                              const double* x, const FieldOutputs& out, bool& fall_back,
                              std::string& failure) {
  const std::size_t n = model_.n, d = model_.d;
#pragma omp single
  {
    replicas_.resize(replicas);
    if (progress_size_ < 2 * replicas * tiles_) {
      progress_ = std::make_unique<std::atomic<std::size_t>[]>(2 * replicas * tiles_);
      progress_size_ = 2 * replicas * tiles_;
    }
    // Tile t is in every round from t (block (0, t)) to t + T - 1: its first round of
    // parity q is t or t + 1.
    for (std::size_t r = 0; r < replicas; ++r)
      for (std::size_t t = 0; t < tiles_; ++t)
        for (std::size_t parity = 0; parity < 2; ++parity)
          progress_[(r * tiles_ + t) * 2 + parity].store(t + (t + parity) % 2,
                                                         std::memory_order_relaxed);
    if (!claimed_) claimed_ = std::make_unique<std::atomic<std::size_t>[]>(2 * tiles_);
    for (std::size_t round = 0; round < 2 * tiles_; ++round)
      claimed_[round].store(0, std::memory_order_relaxed);
    for (std::size_t r = 0; r < replicas; ++r) {
      layout(prepared[r], replicas_[r]);
      replicas_[r].offset = 0.0;
    }
  }
  std::vector<double> offsets(replicas, 0.0);
#pragma omp for schedule(static) nowait
  for (std::size_t unit = 0; unit < replicas * tiles_; ++unit) {
    const std::size_t r = unit / tiles_;
    offsets[r] = std::max(offsets[r], build_tile(prepared[r], replicas_[r], unit % tiles_));
  }
#pragma omp critical(mfattn_symmetric_offset)
  for (std::size_t r = 0; r < replicas; ++r)
    replicas_[r].offset = std::max(replicas_[r].offset, offsets[r]);
#pragma omp barrier
#pragma omp single
  for (std::size_t r = 0; r < replicas; ++r) {
    Replica& s = replicas_[r];
    s.neg_offset_log2 = -s.offset * kLog2e;
    s.scale = detail::receiver_scale(model_, s.offset);
    s.offset_usable = 2.0 * s.offset * kLog2e < 1020.0;
    const Prepared& p = prepared[r];
    s.values = all_present_ ? (model_.d <= kSmallDimension ? p.values_t.data() : p.values_rows.data())
                            : s.weighted_values.data();
  }
  bool usable = true;
  for (const Replica& s : replicas_) usable = usable && s.offset_usable;
  if (!usable) {
#pragma omp single
    fall_back = true;
    return;
  }
  // Rounds r = I + J: the blocks (k, r - k), k <= r - k, of every replica. A tile is in one
  // block of every round from its first to its last, and a block writes the sums of its
  // round's parity, so it may start as soon as the blocks of its two tiles in round r - 2
  // are done: progress_[tile, parity] is the next round of that parity the tile may take,
  // and threads wait on those two counters instead of a barrier per round (2 T - 1
  // barriers, each waiting for the slowest block). A thread that has finished its share of
  // round r - 1 goes on with round r while round r - 1 still runs. Each thread takes a
  // contiguous range of each round's blocks, so it keeps its row tiles and mostly meets
  // column tiles it wrote itself (r + 1 - k was the column tile of block k - 1): the written
  // sums rarely move between cores (taking the blocks in turn moved them every round, which
  // cost more than the blocks).
  const std::size_t team = omp_get_num_threads(), me = omp_get_thread_num();
  // A stop (evaluation_watch.hpp) ends every thread's rounds: no thread waits for a block that
  // a stopped thread will not run, and the pass throws before the sums are read.
  // The evaluation's pass (its team runs under EvaluationPass::Scope, cpu_backend.cpp).
  const EvaluationPass* pass = EvaluationPass::current();
  auto wait_for = [pass](const std::atomic<std::size_t>& counter, std::size_t round) {
    for (unsigned spins = 0; counter.load(std::memory_order_acquire) < round; ++spins)
      if (spins > 4096) {
        if (EvaluationPass::stopping(pass)) return;
        std::this_thread::yield();  // a busy machine: give the core away
      }
  };
  auto run = [&](std::size_t round, std::size_t first, std::size_t blocks, std::size_t unit) {
    const std::size_t r = unit / blocks, k = first + unit % blocks, j = round - k;
    std::atomic<std::size_t>& row_ready = progress_[(r * tiles_ + k) * 2 + round % 2];
    std::atomic<std::size_t>& column_ready = progress_[(r * tiles_ + j) * 2 + round % 2];
    wait_for(row_ready, round);
    wait_for(column_ready, round);
    if (EvaluationPass::stopping(pass)) return;
    run_block(prepared[r], replicas_[r], k, j);
    EvaluationPass::done(pass, double(kTile * kTile) * (j == k ? 1.0 : 2.0));
    row_ready.store(round + 2, std::memory_order_release);
    // A diagonal block's two counters are one: a second store could undo the next block's
    // (which may start, and end, between the two stores: a window's skipped block takes
    // nanoseconds), and that tile would wait forever.
    if (j != k) column_ready.store(round + 2, std::memory_order_release);
  };
  for (std::size_t round = 0; round + 1 < 2 * tiles_ && !EvaluationPass::stopping(pass); ++round) {
    const std::size_t first = round >= tiles_ ? round - (tiles_ - 1) : 0, last = round / 2;
    const std::size_t blocks = last + 1 - first, units = replicas * blocks;
    if (team == 2) {
      // Two threads take a round's blocks from its two ends (thread 0 upwards, thread 1
      // downwards) until they meet, so a slower core simply takes fewer blocks; one shared
      // count of claimed blocks keeps the two ends apart.
      std::atomic<std::size_t>& claimed = claimed_[round];
      for (std::size_t taken = 0; claimed.fetch_add(1, std::memory_order_relaxed) < units; ++taken)
        run(round, first, blocks, me == 0 ? taken : units - 1 - taken);
      continue;
    }
    const std::size_t begin = units * me / team, end = units * (me + 1) / team;
    for (std::size_t step = begin; step < end; ++step)
      // Odd threads walk their range downwards: the block next to a neighbour's range, the
      // one that may wait on that neighbour's round r - 2, then comes last (more slack).
      run(round, first, blocks, me % 2 ? begin + end - 1 - step : step);
  }
#pragma omp barrier
  Scratch scratch, both_parities;
  double* work = scratch.rows(d);
  double* gathered = both_parities.rows(d);
#pragma omp for schedule(static)
  for (std::size_t unit = 0; unit < replicas * n; ++unit) {
    const std::size_t r = unit / n, i = unit % n;
    const Replica& s = replicas_[r];
    const Replica::Sums& even = s.sums[0];
    const Replica::Sums& odd = s.sums[1];
    double weight_sum;
    if (d <= kSmallDimension) {
      // Per parity the column part (one term per source in order), then the row part's
      // lanes; then even + odd.
      const double* even_lanes = even.row_lanes.data() + i * (d + 1) * kLanes;
      const double* odd_lanes = odd.row_lanes.data() + i * (d + 1) * kLanes;
      weight_sum = (even.weight_sum[i] + simd::horizontal_sum(simd::load(even_lanes))) +
                   (odd.weight_sum[i] + simd::horizontal_sum(simd::load(odd_lanes)));
      for (std::size_t c = 0; c < d; ++c)
        gathered[c] =
            (even.acc[c * stride_ + i] + simd::horizontal_sum(simd::load(even_lanes + (c + 1) * kLanes))) +
            (odd.acc[c * stride_ + i] + simd::horizontal_sum(simd::load(odd_lanes + (c + 1) * kLanes)));
    } else {
      const std::size_t row = i * prepared[r].row_stride;
      weight_sum = even.weight_sum[i] + odd.weight_sum[i];
      for (std::size_t c = 0; c < d; ++c) gathered[c] = even.acc[row + c] + odd.acc[row + c];
    }
    const double* acc = gathered;
    if (model_.receiver_speed(i) > 0.0 && !(weight_sum >= kLooseBound)) {
#pragma omp atomic write
      fall_back = true;
      continue;
    }
    try {
      const std::size_t row = (r * n + i) * d;
      const double sum = detail::finish_receiver(
          model_, model_.matrices_of(r), mass_, i, x + row, s.offset, s.scale, weight_sum, acc,
          {out.velocity + row, out.attention_output ? out.attention_output + row : nullptr,
           out.weight_sums != nullptr},
          work);
      if (out.weight_sums) out.weight_sums[r * n + i] = sum;
    } catch (const NumericalError& error) {
#pragma omp critical(mfattn_cpu_failure)
      if (failure.empty()) failure = error.what();
    }
  }
}

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
