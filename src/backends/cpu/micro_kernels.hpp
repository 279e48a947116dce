#pragma once
// Operands and register-blocked micro-kernels shared by the CPU backend's pair loops: the
// one-sided loop of cpu_backend.cpp (every receiver walks every source) and the symmetric
// loop of symmetric_pairs.cpp (one exponential serves the pairs (i, j) and (j, i)).
#include <algorithm>
#include <cstddef>
#include <limits>
#include <new>
#include <vector>

#include "backends/cpu/lane_pair_terms.hpp"
#include "backends/cpu/vector_math.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::cpu {
inline namespace MFATTN_CPU_NAMESPACE {

using simd::Lanes;
using simd::kLanes;

inline constexpr std::size_t kTile = LanePairTerms::kTile;  // sources are padded to whole tiles
// Lanes over sources up to here; from d = 5 the micro-kernels are faster (measured).
inline constexpr std::size_t kSmallDimension = 4;
// Receivers sharing each source load. The small-d loop keeps d + 1 lane sums per receiver in
// registers, so 4 fit; the large-d micro-kernels keep 6 x 4 lane vectors of sums (24 of the
// 32 vector registers), which amortises each key / value load over 6 receivers.
inline constexpr std::size_t kSmallBlock = 4;
inline constexpr std::size_t kLargeBlock = 6;
inline constexpr std::size_t kMaxBlock = std::max(kSmallBlock, kLargeBlock);
// Keys are stored in panels of 32 sources: d rows of 32 numbers, contiguous, so the logit
// micro-kernel reads one 256-byte line group per component (no strided rows, no packing).
inline constexpr std::size_t kKeyPanel = 4 * kLanes;
static_assert(kTile % kKeyPanel == 0);
inline constexpr double kNegInf = -std::numeric_limits<double>::infinity();
inline constexpr double kPairsPerExtraThread = 1 << 18;  // below this, one thread does the work
// The symmetric loop's threshold (best of 8-12 interleaved runs): with 4-lane registers
// n = 256 (AVX2 kernels, 2 threads: 52.4 against 66.0 us on one; n = 128: 24.5 against
// 20.3 us); with 8-lane registers n = 363, above 2^17 pairs (AVX-512, n = 256: 41.0 against
// 40.5 us; n = 320: 60.8 against 64.2 us; n = 384: 78.0 against 87.2 us).
inline constexpr double kSymmetricPairsPerExtraThread =
    simd::kRegisterLanes == simd::kLanes ? 1 << 17 : 1 << 16;
inline constexpr double kLooseBound = 1e-250;  // S_i below this: take the exact max
// The pair loops take their weights as 2^(l log2 e): see simd::exp2_nonpositive.
inline constexpr double kLog2e = 1.4426950408889634074;

inline std::size_t round_up(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

/// Allocates on cache-line boundaries: sums that threads write side by side (tiles of 64
/// numbers) then never share a line, which would cost a transfer between cores per store.
template <class T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlignment{64};
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(std::size_t count) {
    return static_cast<T*>(::operator new(count * sizeof(T), kAlignment));
  }
  void deallocate(T* pointer, std::size_t) { ::operator delete(pointer, kAlignment); }
  friend bool operator==(const CacheLineAllocator&, const CacheLineAllocator&) { return true; }
};
using AlignedDoubles = std::vector<double, CacheLineAllocator<double>>;

/// Two rows of d numbers of scratch (a receiver's finish, a token's transforms): on the stack
/// up to d = 128, else on the heap.
struct Scratch {
  double stack[2 * 128];
  std::vector<double> heap;
  double* rows(std::size_t d) {
    if (d <= 128) return stack;
    heap.resize(2 * d);
    return heap.data();
  }
};

/// Per-replica prepared operands (see cpu_backend.cpp's file comment).
struct Prepared {
  std::size_t d = 0, padded_sources = 0, padded_dim = 0;
  std::size_t first_moving = 0;     // sources before this are prefix tokens and their padding
  // Sources in [bias_free_begin, bias_free_end) need no bias (all p_j = 1, no padding).
  std::size_t bias_free_begin = 0, bias_free_end = 0;
  bool logits_above_underflow = false;  // 2 max_i B_i log2(e) < 1020: unbiased logits stay > -1022
  // Row strides of the lane-major and row-major operands, a line longer than the data so
  // that rows never share cache sets (power-of-two strides thrash the L1).
  std::size_t source_stride = 0, row_stride = 0;
  // On cache lines: the kernels' loads then never split a line, whatever else the heap holds
  // (with malloc's 16 bytes, the same binary ran d = 64 up to 10 % slower on AVX2 after an
  // unrelated object had grown by 300 bytes).
  AlignedDoubles queries;      // n x d, receiver-major
  AlignedDoubles offsets;      // B_i per receiver
  AlignedDoubles key_panels;   // per panel of kKeyPanel sources: d rows of kKeyPanel
  AlignedDoubles values_t;     // d rows of source_stride (small d)
  AlignedDoubles values_rows;  // padded_sources rows of row_stride (large d)
  AlignedDoubles bias;         // padded_sources
  AlignedDoubles bias_log2;    // bias * log2(e), for the base-2 logits

  /// Where k_j[c] lies in key_panels.
  std::size_t key_index(std::size_t c, std::size_t j) const {
    return (j / kKeyPanel) * d * kKeyPanel + c * kKeyPanel + j % kKeyPanel;
  }
  /// The keys k_j[c] of the kLanes sources from j (a multiple of kLanes).
  const double* key_lanes(std::size_t c, std::size_t j) const {
    return key_panels.data() + key_index(c, j);
  }
};

// The large-d micro-kernels keep their sums as native registers and take them in groups
// that fit the register file (AVX-512: the whole block in one group; AVX2, SSE2 and NEON,
// with 4 or 2 doubles per register, in several): kAccumulators sums at a time (12 of AVX2's 16 registers, 24 of NEON's 32),
// kAccumulatorColumns registers of components or sources per receiver times as many
// receivers as then fit. Every sum is still its own FMA chain over the same terms in the
// same order: the grouping changes which sums share a pass over the operands, nothing else.
inline constexpr std::size_t kAccumulators = simd::kVectorRegisters * 3 / 4;
inline constexpr std::size_t kAccumulatorColumns = 4;
inline constexpr std::size_t kAccumulatorRows = kAccumulators / kAccumulatorColumns;

/// The logit sums -offset_r + sum_c q_r[c] k_j[c] of receivers [kFirst, kFirst + kGroup) for
/// the kKeyPanel sources at j, kAccumulatorColumns registers of sources at a time, into
/// logits (as panel_logits; the bias and log-terms are added by the caller).
template <std::size_t kReceivers, std::size_t kFirst>
[[gnu::always_inline]] inline void panel_logit_groups(const Prepared& p, const double* const* q,
                                                      const double* neg_offset, std::size_t j,
                                                      Lanes (*logits)[4]) {
  if constexpr (kFirst < kReceivers) {
    constexpr std::size_t kGroup = std::min(kAccumulatorRows, kReceivers - kFirst);
    constexpr std::size_t kPanelRegisters = kKeyPanel / simd::kRegisterLanes;
    constexpr std::size_t kColumns = std::min(kAccumulatorColumns, kPanelRegisters);
    static_assert(kPanelRegisters % kColumns == 0);
    for (std::size_t m0 = 0; m0 < kPanelRegisters; m0 += kColumns) {
      simd::Register s[kGroup][kColumns];
#pragma GCC unroll 8
      for (std::size_t r = 0; r < kGroup; ++r)
#pragma GCC unroll 8
        for (std::size_t m = 0; m < kColumns; ++m)
          s[r][m] = simd::splat<simd::Register>(neg_offset[kFirst + r]);
      const double* keys = p.key_lanes(0, j) + m0 * simd::kRegisterLanes;
      for (std::size_t c = 0; c < p.d; ++c, keys += kKeyPanel) {
        simd::Register k[kColumns];
#pragma GCC unroll 8
        for (std::size_t m = 0; m < kColumns; ++m) {
          k[m] = simd::load_register(keys + m * simd::kRegisterLanes);
          simd::keep_in_registers(k[m]);
        }
#pragma GCC unroll 8
        for (std::size_t r = 0; r < kGroup; ++r) {
          const simd::Register qc = simd::splat<simd::Register>(q[kFirst + r][c]);
#pragma GCC unroll 8
          for (std::size_t m = 0; m < kColumns; ++m) s[r][m] += qc * k[m];
        }
      }
#pragma GCC unroll 8
      for (std::size_t r = 0; r < kGroup; ++r)
#pragma GCC unroll 8
        for (std::size_t m = 0; m < kColumns; ++m) {
          const std::size_t flat = m0 + m;  // register `flat` of the panel's 4 lane vectors
          logits[kFirst + r][flat / simd::kRegistersPerLanes]
              .part[flat % simd::kRegistersPerLanes] = s[r][m];
        }
    }
    panel_logit_groups<kReceivers, kFirst + kGroup>(p, q, neg_offset, j, logits);
  }
}

/// Micro-kernel of the logits: l_ij - offset_i for kReceivers receivers and the kKeyPanel
/// sources of the key panel at j, lanes over sources, in the units of q: natural (bias =
/// p.bias, log_scale = 1) or base 2 (q, offsets scaled by log2 e, bias = p.bias_log2,
/// log_scale = log2 e). The kReceivers x 4 lane sums stay in registers while the d
/// components stream through: per component 4 key loads and kReceivers broadcasts feed
/// 4 kReceivers FMAs. Each logit is one FMA chain over c in order, started at -offset, then
/// the bias (bias_row = nullptr: none) and the log-terms are added. Never inlined: inlined
/// next to the exponential that follows, GCC spilled the 24 sums to the stack every component.
template <std::size_t kReceivers, class Terms>
[[gnu::noinline]] void panel_logits(const Terms& terms, const Prepared& p, const double* const* q,
                         const double* neg_offset, const typename Terms::Receiver* receiver_terms,
                         const double* bias_row, double log_scale, std::size_t j,
                         Lanes (*logits)[4]) {
  // The sums as native registers in groups that fit (on AVX-512: all kReceivers x 4 lane
  // vectors in one group).
  panel_logit_groups<kReceivers, 0>(p, q, neg_offset, j, logits);
  // Then the bias and the log-terms.
#pragma GCC unroll 4
  for (std::size_t h = 0; h < 4; ++h) {
    const std::size_t jh = j + h * kLanes;
    const Lanes bias = bias_row ? simd::load(bias_row + jh) : Lanes{};
#pragma GCC unroll 8
    for (std::size_t r = 0; r < kReceivers; ++r) {
      if (bias_row) logits[r][h] += bias;
      if constexpr (Terms::kHasLogTerm)
        logits[r][h] += terms.log_term(receiver_terms[r], jh) * log_scale;
    }
  }
}

/// add_weighted_values with the sums as native registers: receivers [kFirst, kReceivers) in
/// groups of kAccumulatorRows, kRegisters registers of components from cb in passes of
/// kAccumulatorColumns (see kAccumulators).
template <std::size_t kReceivers, std::size_t kFirst, std::size_t kRegisters>
[[gnu::always_inline]] inline void add_weighted_register_groups(
    const double* values, std::size_t value_stride, double* acc, std::size_t acc_stride,
    const double* weights, std::size_t weight_stride, std::size_t weight_step, std::size_t count,
    std::size_t cb) {
  if constexpr (kFirst < kReceivers) {
    constexpr std::size_t kGroup = std::min(kAccumulatorRows, kReceivers - kFirst);
    constexpr std::size_t kColumns = std::min(kAccumulatorColumns, kRegisters);
    static_assert(kRegisters % kColumns == 0);
    constexpr std::size_t kWidth = simd::kRegisterLanes;
    for (std::size_t m0 = 0; m0 < kRegisters; m0 += kColumns) {
      const std::size_t column = cb + m0 * kWidth;
      double* rows = acc + kFirst * acc_stride + column;
      simd::Register a[kGroup][kColumns];
#pragma GCC unroll 8
      for (std::size_t r = 0; r < kGroup; ++r)
#pragma GCC unroll 8
        for (std::size_t m = 0; m < kColumns; ++m)
          a[r][m] = simd::load_register(rows + r * acc_stride + m * kWidth);
      const double* row = values + column;
      const double* w_rows = weights + kFirst * weight_stride;
      for (std::size_t t = 0; t < count; ++t, row += value_stride, w_rows += weight_step) {
        simd::Register z[kColumns];
#pragma GCC unroll 8
        for (std::size_t m = 0; m < kColumns; ++m) z[m] = simd::load_register(row + m * kWidth);
#pragma GCC unroll 8
        for (std::size_t r = 0; r < kGroup; ++r) {
          const simd::Register w = simd::splat<simd::Register>(w_rows[r * weight_stride]);
#pragma GCC unroll 8
          for (std::size_t m = 0; m < kColumns; ++m) a[r][m] += w * z[m];
        }
      }
#pragma GCC unroll 8
      for (std::size_t r = 0; r < kGroup; ++r)
#pragma GCC unroll 8
        for (std::size_t m = 0; m < kColumns; ++m)
          simd::store(rows + r * acc_stride + m * kWidth, a[r][m]);
    }
    add_weighted_register_groups<kReceivers, kFirst + kGroup, kRegisters>(
        values, value_stride, acc, acc_stride, weights, weight_stride, weight_step, count, cb);
  }
}

/// Micro-kernel of A_r += sum_t w_rt z_t for kReceivers rows of sums (acc, acc_stride apart)
/// and kVectors lane vectors of components from cb, over count sources whose rows start at
/// values (value_stride apart); w_rt = weights[r * weight_stride + t * weight_step] (step 1:
/// rows of weights; weight_stride 1: the same block read transposed). The sums stay in
/// registers across the sources (loaded from and stored back to acc, so each A_r[c] is one
/// FMA chain over all sources in order, whatever the tiling); per source kVectors value loads
/// and kReceivers weight broadcasts feed kVectors kReceivers FMAs.
template <std::size_t kReceivers, std::size_t kVectors>
inline void add_weighted_values(const double* values, std::size_t value_stride, double* acc,
                                std::size_t acc_stride, const double* weights,
                                std::size_t weight_stride, std::size_t weight_step,
                                std::size_t count, std::size_t cb) {
  // The sums as native registers in groups that fit (on AVX-512: all kReceivers x kVectors).
  add_weighted_register_groups<kReceivers, 0, kVectors * simd::kRegistersPerLanes>(
      values, value_stride, acc, acc_stride, weights, weight_stride, weight_step, count, cb);
}

/// A_r += W Z over all padded_dim components (blocks of 4 lane vectors, then one of 2, then
/// one: the padded dimension is a multiple of one lane vector, so d = 5..8 takes one vector
/// per source instead of two).
template <std::size_t kReceivers>
inline void add_weighted_rows(const double* values, std::size_t value_stride, double* acc,
                              std::size_t acc_stride, const double* weights,
                              std::size_t weight_stride, std::size_t weight_step,
                              std::size_t count, std::size_t padded_dim) {
  std::size_t cb = 0;
  for (; cb + 4 * kLanes <= padded_dim; cb += 4 * kLanes)
    add_weighted_values<kReceivers, 4>(values, value_stride, acc, acc_stride, weights,
                                       weight_stride, weight_step, count, cb);
  if (cb + 2 * kLanes <= padded_dim) {
    add_weighted_values<kReceivers, 2>(values, value_stride, acc, acc_stride, weights,
                                       weight_stride, weight_step, count, cb);
    cb += 2 * kLanes;
  }
  if (cb < padded_dim)
    add_weighted_values<kReceivers, 1>(values, value_stride, acc, acc_stride, weights,
                                       weight_stride, weight_step, count, cb);
}

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
