// SA's and USA's derivative passes in lanes (derivative_lanes.hpp). Every pass walks the
// sources of LanePairTerms' order (the prefix tokens, padded to a tile, then the moving
// tokens) kLanes at a time, with the logit in base 2 as the forward loops take it:
//   t_ij = log2(e) (beta <q_i, k_j> + log m_ij c_ij + log p_j) - o_i,   w_ij = c_ij 2^(t_ij)
// (c_ij: a sign-changing factor's multiplier, else 1), o_i the largest of receiver i's
// visible logits, so no exponential overflows where the field does not. The derivative
// passes read P_ij = w_ij / N_i with the normaliser N_i of the forward pass.
#include "backends/cpu/derivative_lanes.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <memory>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "backends/cpu/micro_kernels.hpp"
#include "backends/cpu/vector_math.hpp"
#include "backends/token_operands.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::cpu {
inline namespace MFATTN_CPU_NAMESPACE {
namespace {

using detail::HeadPairs;
using detail::PairCotangents;
using detail::PairTangents;

constexpr std::size_t kRowTile = LanePairTerms::kTile;  // sources per row of pair terms
constexpr std::size_t kBlock = 4;                       // receivers whose exponentials interleave
constexpr std::size_t kNoOperand = std::size_t(-1);
// Sources per tile of the VJP's pass (vjp_tile): its sums (2 od + 1 lane rows per kLanes
// sources; 14 KiB at od = 3) stay in L1 while every receiver passes.
constexpr std::size_t kSourceTile = 2 * kRowTile;
// A wide head's VJP adds its value sums (vjp_tile) for this many receivers at a time.
constexpr std::size_t kWideReceivers = 4 * kBlock;
// The VJP's source tiles in this many groups, each with its own row of every receiver's sums
// (vjp_tile): fixed, so that the bits do not depend on the thread count, and enough for the
// threads of a workstation.
constexpr std::size_t kTileGroups = 16;

/// kBlock rows of od numbers (double or Lanes): fixed arrays where od is a compile-time
/// kDim (so that the compiler keeps them in registers), a vector otherwise.
template <class T, int kDim>
struct BlockRows {
  T rows[kBlock][kDim] = {};
  explicit BlockRows(std::size_t) {}
  T* operator[](std::size_t r) { return rows[r]; }
  const T* operator[](std::size_t r) const { return rows[r]; }
};
template <class T>
struct BlockRows<T, 0> {
  std::vector<T> rows;
  std::size_t dim;
  explicit BlockRows(std::size_t od) : rows(kBlock * od, T{}), dim(od) {}
  T* operator[](std::size_t r) { return rows.data() + r * dim; }
  const T* operator[](std::size_t r) const { return rows.data() + r * dim; }
};

/// The head's source rows as lanes (`padded` sources in tiles of kSourceTile), in LanePairTerms'
/// source order.
struct LaneSources {
  std::size_t n = 0, od = 0, prefix = 0, first_moving = 0, padded = 0;

  /// The operand row (HeadPairs' order: moving tokens, then prefix tokens) of lane source s,
  /// kNoOperand for padding.
  std::size_t operand(std::size_t s) const {
    if (s < first_moving) return s < prefix ? n + s : kNoOperand;
    return s - first_moving < n ? s - first_moving : kNoOperand;
  }
  /// rows (sources x od, HeadPairs' order) as `padded` rows of `stride` numbers (padding: 0).
  void gather(const double* rows, std::size_t stride, AlignedDoubles& out) const {
    out.assign(padded * stride, 0.0);
    for (std::size_t s = 0; s < padded; ++s) {
      const std::size_t j = operand(s);
      if (j != kNoOperand) std::copy_n(rows + j * od, od, out.data() + s * stride);
    }
  }
  /// The first `count` components of rows (sources x od, HeadPairs' order) as `count` lane
  /// rows in tiles of kSourceTile sources (padding: 0): component c of source s at
  /// lanes_of(out, s, count)[c * kSourceTile]. A pass then reads its rows kSourceTile numbers
  /// apart, where rows `padded` apart (8 KiB at n = 1024) all fell in the same L1 set and
  /// evicted each other past its ways (n = 1024, od = 64, 8 heads: the VJP's tiles took 37 ms,
  /// 26 ms so).
  void spread(const double* rows, std::size_t count, AlignedDoubles& out) const {
    out.assign(round_up(padded, kSourceTile) * count, 0.0);
    for (std::size_t s = 0; s < padded; ++s) {
      const std::size_t j = operand(s);
      if (j == kNoOperand) continue;
      double* lanes = out.data() + (s / kSourceTile * count * kSourceTile + s % kSourceTile);
      for (std::size_t c = 0; c < count; ++c) lanes[c * kSourceTile] = rows[j * od + c];
    }
  }
};

/// The lanes of source `at` (a multiple of kLanes) in rows of `count` components that
/// LaneSources::spread laid out: component c's kLanes numbers at [c * kSourceTile].
inline const double* lanes_of(const AlignedDoubles& rows, std::size_t at, std::size_t count) {
  return rows.data() + (at / kSourceTile * count * kSourceTile + at % kSourceTile);
}

/// What every pass of one head reads: the model's numbers, the sources as lanes, and the
/// pair terms.
struct HeadLanes {
  const HeadPairs& pairs;
  const LanePairTerms& pair_terms;
  LaneSources layout;
  // Lane rows in tiles (LaneSources::spread; lanes_of finds a source's).
  AlignedDoubles keys;    // od rows (a wide head: its r score rows)
  AlignedDoubles values;  // od rows
  // A wide head (od not a compile-time size of the passes) takes its value sums as small
  // GEMMs (micro_kernels.hpp's add_weighted_rows) over rows of value_stride numbers.
  bool wide = false;
  std::size_t value_stride = 0;
  AlignedDoubles value_rows;  // padded rows of value_stride
  AlignedDoubles bias;        // log2(e) log p_j; -inf for null sources and padding
  bool terms = false;         // the model has a mask or a factor
  std::size_t numbers = 0;    // the factor's numbers
  bool multiplies = false;    // the factor multiplies the weight (a sign-changing one: kMultiply)
  double beta = 0.0, beta_log2e = 0.0;
  // max_j |k_j| and max_j log2(e) log p_j over the sources that weigh (forward_block's bound).
  double largest_key_norm = 0.0, largest_bias = kNegInf;
  // S_i of the forward pass (the passes' units): the VJP's sum_j l_bar_ij reads it.
  std::vector<double> weight_sum;

  HeadLanes(const HeadPairs& head, const LanePairTerms& lane_terms)
      : pairs(head), pair_terms(lane_terms), terms(head.model.pair_terms.any()),
        numbers(factor_numbers_count(head.model.pair_terms)), beta(head.model.beta),
        beta_log2e(head.model.beta * kLog2e) {
    lane_terms.visit_factor([&](auto factor) { multiplies = decltype(factor)::kMultiply; });
    take();
  }
  /// The lanes of the head's operands as they are now (again after a forward pass at other
  /// states: into the arrays of the last).
  void take() {
    const HeadPairs& head = pairs;
    const Model& model = head.model;
    largest_key_norm = 0.0;
    largest_bias = kNegInf;
    layout.n = model.n;
    layout.od = head.operand_dim;
    layout.prefix = model.prefix_count();
    layout.first_moving = LanePairTerms::prefix_region(model);
    layout.padded = LanePairTerms::padded_sources(model);
    wide = !(layout.od == 2 || layout.od == 3 || layout.od == 4 || layout.od == 8);
    layout.spread(head.keys, wide ? head.score_dim : layout.od, keys);
    layout.spread(head.values, layout.od, values);
    value_stride = round_up(layout.od, kLanes);
    if (wide) layout.gather(head.values, value_stride, value_rows);
    bias.assign(layout.padded, kNegInf);
    for (std::size_t s = 0; s < layout.padded; ++s) {
      const std::size_t j = layout.operand(s);
      if (j == kNoOperand || !(head.presence[j] > 0.0)) continue;
      bias[s] = head.log_presence[j] * kLog2e;
      largest_bias = std::max(largest_bias, bias[s]);
      double norm2 = 0.0;
      for (std::size_t c = 0; c < layout.od; ++c)
        norm2 += head.keys[j * layout.od + c] * head.keys[j * layout.od + c];
      largest_key_norm = std::max(largest_key_norm, std::sqrt(norm2));
    }
  }
  std::size_t od() const { return layout.od; }
  std::size_t padded() const { return layout.padded; }
};

/// The pair terms of a block of receivers against one tile of kRowTile sources, as rows:
/// the log-term times log2(e) (-inf where the mask hides the pair), the multiplier, the sum
/// of the factor's numbers' derivatives along a tangent (term_dot), and each derivative.
struct TermRows {
  std::size_t numbers = 0;
  AlignedDoubles data;
  /// Rows for a factor of `count` numbers; none where the pass has no terms.
  TermRows(bool terms, std::size_t count)
      : numbers(count), data(terms ? kBlock * (3 + count) * kRowTile : 0) {}
  double* row(std::size_t r, std::size_t kind) {
    return data.data() + (r * (3 + numbers) + kind) * kRowTile;
  }
  double* log_term(std::size_t r) { return row(r, 0); }
  double* multiplier(std::size_t r) { return row(r, 1); }
  double* term_dot(std::size_t r) { return row(r, 2); }
  double* derivative(std::size_t r, std::size_t k) { return row(r, 3 + k); }

  /// The rows of receivers[0..kBlock) against sources [begin, begin + kRowTile), with the
  /// derivatives when `derivatives`, and term_dot along factor_tangent when it is not null.
  void fill(const HeadLanes& head, const std::size_t* receivers, std::size_t begin,
            bool derivatives, const double* factor_tangent) {
    head.pair_terms.dispatch([&](const auto& terms, const auto& prefix_terms) {
      auto fill_with = [&](const auto& region_terms) {
        using Terms = std::remove_cvref_t<decltype(region_terms)>;
        for (std::size_t r = 0; r < kBlock; ++r) {
          const typename Terms::Receiver receiver = region_terms.receiver(receivers[r]);
          for (std::size_t k = 0; k < kRowTile; k += kLanes) {
            const std::size_t j = begin + k;
            Lanes log_term{}, multiplier = simd::broadcast(1.0);
            if constexpr (Terms::kHasLogTerm)
              log_term = region_terms.log_term(receiver, j) * kLog2e;
            if constexpr (Terms::kHasFactor) multiplier = region_terms.factor(receiver, j);
            simd::store(this->log_term(r) + k, log_term);
            simd::store(this->multiplier(r) + k, multiplier);
            if (!derivatives && !factor_tangent) continue;
            Lanes each[kernels::kMaxFactorNumbers];
            region_terms.term_derivatives(receiver, j, each);
            Lanes along{};
            for (std::size_t number = 0; number < numbers; ++number) {
              if (derivatives) simd::store(derivative(r, number) + k, each[number]);
              if (factor_tangent) along += factor_tangent[number] * each[number];
            }
            simd::store(this->term_dot(r) + k, along);
          }
        }
      };
      if (begin < head.layout.first_moving) fill_with(prefix_terms);
      else fill_with(terms);
    });
  }
};

/// A block of receivers: kBlock tokens from `first` (the last repeated past n), count real.
struct ReceiverBlock {
  std::size_t token[kBlock];
  std::size_t count;
  ReceiverBlock(std::size_t first, std::size_t n) : count(std::min(kBlock, n - first)) {
    for (std::size_t r = 0; r < kBlock; ++r) token[r] = first + std::min(r, count - 1);
  }
};

/// The block's base-2 logits t_ij against the kLanes sources from `at` (k: their place in the
/// term rows), before the offsets: the bias, then the scores in component order, then the
/// log-term (scaled_query: the queries times beta log2(e)); the keys' score rows are left in
/// `keys`. The block's receivers side by side: each key lane row loaded once, and kBlock FMA
/// chains, where one receiver after the other waited on each FMA's latency.
template <int kDim, bool kTerms>
[[gnu::always_inline]] inline void block_logits(const HeadLanes& head,
                                                const BlockRows<double, kDim>& scaled_query,
                                                TermRows& rows, std::size_t at, std::size_t k,
                                                Lanes* keys, Lanes (&t)[kBlock]) {
  // The queries and keys are 0 past r: a compile-time od takes every component (no branch).
  const std::size_t scores = kDim > 0 ? std::size_t(kDim) : head.pairs.score_dim;
  const double* key_lanes = lanes_of(head.keys, at, scores);
  const Lanes bias = simd::load(head.bias.data() + at);
  for (std::size_t r = 0; r < kBlock; ++r) t[r] = bias;
  for (std::size_t c = 0; c < scores; ++c) {
    keys[c] = simd::load(key_lanes + c * kSourceTile);
    for (std::size_t r = 0; r < kBlock; ++r) t[r] += scaled_query[r][c] * keys[c];
  }
  if constexpr (kTerms)
    for (std::size_t r = 0; r < kBlock; ++r) t[r] += simd::load(rows.log_term(r) + k);
}

/// The block's 2^(t_ij - o_i) at the kLanes sources from `at` (block_logits).
template <int kDim, bool kTerms>
[[gnu::always_inline]] inline void block_exponentials(const HeadLanes& head,
                                                      const BlockRows<double, kDim>& scaled_query,
                                                      TermRows& rows, std::size_t at, std::size_t k,
                                                      const double* offset, Lanes* keys,
                                                      Lanes (&out)[kBlock]) {
  Lanes t[kBlock];
  block_logits<kDim, kTerms>(head, scaled_query, rows, at, k, keys, t);
  for (std::size_t r = 0; r < kBlock; ++r) t[r] -= offset[r];
  simd::exp2_nonpositive<kBlock>(t, out);
}

/// body(kDim, kTerms) as types: od as a compile-time constant where it is small (the loops
/// then keep their rows in registers; 0: any od), and whether the model has pair terms.
template <class Body>
void with_form(std::size_t od, bool terms, Body&& body) {
  auto with_terms = [&](auto dim) {
    if (terms) return body(dim, std::true_type{});
    return body(dim, std::false_type{});
  };
  switch (od) {
    case 2: return with_terms(std::integral_constant<int, 2>{});
    case 3: return with_terms(std::integral_constant<int, 3>{});
    case 4: return with_terms(std::integral_constant<int, 4>{});
    case 8: return with_terms(std::integral_constant<int, 8>{});
    default: return with_terms(std::integral_constant<int, 0>{});
  }
}

/// The forward pass of one block: o_i, then S_i and A_i, into pairs' offset, normaliser
/// and u_pre.
template <int kDim, bool kTerms>
void forward_block(HeadLanes& head, std::size_t first, HeadPairs& pairs) {
  const Model& model = pairs.model;
  const std::size_t od = kDim > 0 ? std::size_t(kDim) : head.od(), padded = head.padded();
  const std::size_t stride = head.value_stride;
  const ReceiverBlock block(first, model.n);
  BlockRows<double, kDim> query(od);
  for (std::size_t r = 0; r < kBlock; ++r)
    for (std::size_t c = 0; c < od; ++c)
      query[r][c] = pairs.queries[block.token[r] * od + c] * head.beta_log2e;
  TermRows rows(kTerms, head.numbers);
  BlockRows<Lanes, kDim> keys_rows(od), values_rows(od);
  Lanes* keys = keys_rows[0];
  Lanes* values = values_rows[0];
  // The offsets: first the Cauchy-Schwarz bound of every logit (no pass over the sources),
  //   o_i = |beta| log2(e) |q_i| max_j |k_j| + max_j log2(e) log p_j
  // (the log-terms are <= 0); where it is loose enough that S_i < kLooseBound, that
  // receiver's exact maximum (a pass without exponentials) and the block's sums again (the
  // others keep their offsets, hence their bits, whichever receivers share their block).
  double offset[kBlock];
  for (std::size_t r = 0; r < kBlock; ++r) {
    double norm2 = 0.0;
    for (std::size_t c = 0; c < od; ++c) norm2 += query[r][c] * query[r][c];
    offset[r] = std::sqrt(norm2) * head.largest_key_norm + head.largest_bias;
    if (!std::isfinite(offset[r])) offset[r] = 0.0;  // no source weighs: every weight is 0
  }
  auto exact_offsets = [&](const bool* loose) {
    Lanes best[kBlock];
    for (Lanes& b : best) b = simd::broadcast(kNegInf);
    for (std::size_t begin = 0; begin < padded; begin += kRowTile) {
      if (kTerms) rows.fill(head, block.token, begin, false, nullptr);
      for (std::size_t k = 0; k < kRowTile; k += kLanes) {
        Lanes t[kBlock];
        block_logits<kDim, kTerms>(head, query, rows, begin + k, k, keys, t);
        for (std::size_t r = 0; r < kBlock; ++r) best[r] = simd::max(best[r], t[r]);
      }
    }
    for (std::size_t r = 0; r < kBlock; ++r) {
      if (!loose[r]) continue;
      offset[r] = simd::horizontal_max(best[r]);
      if (!(offset[r] > kNegInf)) offset[r] = 0.0;  // no visible source: every weight is 0
    }
  };
  Lanes sums[kBlock];
  BlockRows<Lanes, kDim> acc(kDim > 0 ? od : 0);
  // Wide: each tile's weights, then A_r += W Z as a GEMM into rows of `stride` sums.
  alignas(64) double tile_weights[kBlock][kRowTile];
  AlignedDoubles wide_sums(kDim > 0 ? 0 : kBlock * stride);
  auto sum_pass = [&] {
    for (std::size_t r = 0; r < kBlock; ++r) {
      sums[r] = Lanes{};
      if constexpr (kDim > 0)
        for (std::size_t c = 0; c < od; ++c) acc[r][c] = Lanes{};
    }
    std::fill(wide_sums.begin(), wide_sums.end(), 0.0);
    for (std::size_t begin = 0; begin < padded; begin += kRowTile) {
      if (kTerms) rows.fill(head, block.token, begin, false, nullptr);
      for (std::size_t k = 0; k < kRowTile; k += kLanes) {
        const std::size_t at = begin + k;
        if constexpr (kDim > 0) {
          const double* value_lanes = lanes_of(head.values, at, od);
          for (std::size_t c = 0; c < od; ++c)
            values[c] = simd::load(value_lanes + c * kSourceTile);
        }
        Lanes weight[kBlock];
        block_exponentials<kDim, kTerms>(head, query, rows, at, k, offset, keys, weight);
        for (std::size_t r = 0; r < kBlock; ++r) {
          if constexpr (kTerms) weight[r] *= simd::load(rows.multiplier(r) + k);
          sums[r] += weight[r];
          if constexpr (kDim > 0)
            for (std::size_t c = 0; c < od; ++c) acc[r][c] += weight[r] * values[c];
          else simd::store(tile_weights[r] + k, weight[r]);
        }
      }
      if constexpr (kDim == 0)
        add_weighted_rows<kBlock>(head.value_rows.data() + begin * stride, stride, wide_sums.data(),
                                  stride, tile_weights[0], kRowTile, 1, kRowTile, stride);
    }
  };
  sum_pass();
  bool loose[kBlock], any_loose = false;
  for (std::size_t r = 0; r < kBlock; ++r) {
    loose[r] = !(simd::horizontal_sum(sums[r]) >= kLooseBound);
    any_loose = any_loose || loose[r];
  }
  if (any_loose) {
    exact_offsets(loose);
    sum_pass();
  }
  const bool usa = model.normalization == Normalization::Usa;
  const double shift_log2 = model.exponent_shift() * kLog2e;
  for (std::size_t r = 0; r < block.count; ++r) {
    const std::size_t i = block.token[r];
    pairs.offset[i] = offset[r];
    // The weights are 2^(shift log2 e - o_i) times the field's: N_i = M or eps_den in those units.
    const double scale = std::exp2(shift_log2 - offset[r]);
    const double sum = simd::horizontal_sum(sums[r]);
    head.weight_sum[i] = sum;
    const double normaliser = usa ? model.mass() * scale
                                  : (model.eps_den > 0.0 ? model.eps_den * scale : 0.0) + sum;
    pairs.normaliser[i] = normaliser;
    for (std::size_t c = 0; c < od; ++c) {
      const double numerator = kDim > 0 ? simd::horizontal_sum(acc[r][c])
                                        : wide_sums[r * stride + c];
      pairs.u_pre[i * od + c] = normaliser == 0.0 ? 0.0 : numerator / normaliser;
    }
  }
}

/// What the VJP passes read per receiver: P_ij = c_ij 2^(t_ij) / N_i and l_bar_ij = P_ij
/// (<u_bar_i, z_j> - delta_i).
struct ReceiverCotangents {
  std::vector<double> inverse_normaliser;  // 1 / N_i; 0 where u_i = 0 (its u_bar is then 0 too)
  std::vector<double> delta;               // SA: <u_bar_i, u_pre_i>; USA: 0
  const double* u_bar = nullptr;           // n x od (PairPasses::vjp's), 0 where u_i = 0
};

/// The VJP's pass over one tile of sources [begin, end) (at most kSourceTile) against every
/// receiver, in receiver order. Its sources' sums are the tile's own: sum_i l_bar_ij q_i,
/// sum_i P_ij u_bar_i and sum_i l_bar_ij, into lane rows (key_sums, value_sums: od rows of
/// kSourceTile; logit_sums). Its share of each receiver's sums, h_i = sum_j l_bar_ij k_j (the r
/// score components) and the factor's numbers' sum_j term_bar_ij dc_ij, is added to that
/// receiver's row of `partial` (r + numbers numbers per receiver).
template <int kDim, bool kTerms>
void vjp_tile(const HeadLanes& head, const ReceiverCotangents& cot,
              std::size_t begin, std::size_t end, double* key_sums, double* value_sums,
              double* logit_sums, double* partial) {
  const HeadPairs& pairs = head.pairs;
  const std::size_t od = kDim > 0 ? std::size_t(kDim) : head.od();
  const std::size_t n = pairs.model.n, numbers = head.numbers;
  const std::size_t score_dim = pairs.score_dim, row = score_dim + numbers;
  // The queries and keys are 0 past r: a known od takes every component (no branch).
  const std::size_t score_loop = kDim > 0 ? od : score_dim;
  constexpr std::size_t kChunks = kSourceTile / kLanes, kRowChunks = kRowTile / kLanes;
  const std::size_t chunks = (end - begin) / kLanes;  // the last tile may be shorter
  TermRows rows(kTerms, numbers);
  // The tile's sums, chunk by chunk (od + od + 1 lane rows each), in L1; a wide head's value
  // sums as kSourceTile rows of `stride`, to which every kWideReceivers receivers' P_ij and
  // u_bar_i (kept in wide_plan, wide_u_bar) are added as one GEMM.
  const std::size_t stride = head.value_stride;
  std::vector<Lanes> key_acc(kChunks * score_loop, Lanes{}),
      value_acc(kDim > 0 ? kChunks * od : 0, Lanes{});
  AlignedDoubles wide_sums(kDim > 0 ? 0 : kSourceTile * stride, 0.0);
  AlignedDoubles wide_plan(kDim > 0 ? 0 : kWideReceivers * kSourceTile),
      wide_u_bar(kDim > 0 ? 0 : kWideReceivers * stride);
  std::size_t wide_count = 0;
  auto add_wide = [&] {
    for (std::size_t j = 0; j < kSourceTile; j += kBlock)
      add_weighted_rows<kBlock>(wide_u_bar.data(), stride, wide_sums.data() + j * stride, stride,
                                wide_plan.data() + j, 1, kSourceTile, wide_count, stride);
    wide_count = 0;
  };
  Lanes logit_acc[kChunks] = {};
  std::vector<Lanes> factor_acc(kBlock * numbers);
  BlockRows<double, kDim> query(od), scaled_query(od), u_bar(od);
  BlockRows<Lanes, kDim> keys_rows(od), receiver_acc(od);
  Lanes* keys = keys_rows[0];
  for (std::size_t first = 0; first < n; first += kBlock) {
    const ReceiverBlock block(first, n);
    double offset[kBlock], inverse[kBlock], delta[kBlock];
    for (std::size_t r = 0; r < kBlock; ++r) {
      const std::size_t i = block.token[r];
      // Past n, a repeated receiver adds nothing: its u_bar and 1 / N are taken as 0.
      const bool real = r < block.count;
      for (std::size_t c = 0; c < score_loop; ++c) {
        query[r][c] = pairs.queries[i * od + c];
        scaled_query[r][c] = query[r][c] * head.beta_log2e;
        receiver_acc[r][c] = Lanes{};
      }
      for (std::size_t c = 0; c < od; ++c) u_bar[r][c] = real ? cot.u_bar[i * od + c] : 0.0;
      offset[r] = pairs.offset[i];
      inverse[r] = real ? cot.inverse_normaliser[i] : 0.0;
      delta[r] = cot.delta[i];
    }
    std::fill(factor_acc.begin(), factor_acc.end(), Lanes{});
    for (std::size_t chunk = 0; chunk < chunks; ++chunk) {
      const std::size_t at = begin + chunk * kLanes, k = chunk % kRowChunks * kLanes;
      if (kTerms && k == 0) rows.fill(head, block.token, at, numbers > 0, nullptr);
      Lanes weight[kBlock];
      block_exponentials<kDim, kTerms>(head, scaled_query, rows, at, k, offset, keys, weight);
      // <u_bar_i, z_j>, each value lane row loaded once for the block.
      // (Where a lane vector is one register, two chains per receiver over the components'
      // halves, so that the FMAs do not wait on each other's latency where od is large; where
      // it is two, one chain is as many registers, and two spilled 16 of them.)
      constexpr std::size_t kChains = simd::kRegistersPerLanes == 1 ? 2 : 1;
      Lanes along[kBlock] = {}, along_odd[kBlock] = {};
      const double* value_lanes = lanes_of(head.values, at, od);
      std::size_t c = 0;
      for (; kChains == 2 && c + 2 <= od; c += 2) {
        const Lanes value = simd::load(value_lanes + c * kSourceTile);
        const Lanes next = simd::load(value_lanes + (c + 1) * kSourceTile);
        for (std::size_t r = 0; r < kBlock; ++r) {
          along[r] += u_bar[r][c] * value;
          along_odd[r] += u_bar[r][c + 1] * next;
        }
      }
      for (; c < od; ++c) {
        const Lanes value = simd::load(value_lanes + c * kSourceTile);
        for (std::size_t r = 0; r < kBlock; ++r) along[r] += u_bar[r][c] * value;
      }
      if constexpr (kChains == 2)
        for (std::size_t r = 0; r < kBlock; ++r) along[r] += along_odd[r];
      Lanes plan[kBlock], logit_bar[kBlock];
      for (std::size_t r = 0; r < kBlock; ++r) {
        const Lanes scaled = weight[r] * inverse[r];  // 2^t / N_i
        plan[r] = kTerms ? scaled * simd::load(rows.multiplier(r) + k) : scaled;
        const Lanes rate = along[r] - delta[r];
        logit_bar[r] = plan[r] * rate;
        for (std::size_t c = 0; c < score_loop; ++c) receiver_acc[r][c] += logit_bar[r] * keys[c];
        if (!kTerms || numbers == 0) continue;
        // A log-term's cotangent is l_bar; a multiplier's p_j 2^t w_bar = 2^t rate / N_i.
        const Lanes term_bar = head.multiplies ? scaled * rate : logit_bar[r];
        for (std::size_t number = 0; number < numbers; ++number)
          factor_acc[r * numbers + number] += term_bar * simd::load(rows.derivative(r, number) + k);
      }
      // The sources' sums take the block's receivers in order, one load and store per sum.
      Lanes* key_sum = key_acc.data() + chunk * score_loop;
      for (std::size_t c = 0; c < score_loop; ++c) {
        Lanes sum = key_sum[c];
        for (std::size_t r = 0; r < kBlock; ++r) sum += logit_bar[r] * query[r][c];
        key_sum[c] = sum;
      }
      if constexpr (kDim > 0) {
        Lanes* value_sum = value_acc.data() + chunk * od;
        for (std::size_t c = 0; c < od; ++c) {
          Lanes sum = value_sum[c];
          for (std::size_t r = 0; r < kBlock; ++r) sum += plan[r] * u_bar[r][c];
          value_sum[c] = sum;
        }
      } else {
        for (std::size_t r = 0; r < kBlock; ++r)
          simd::store(wide_plan.data() + (wide_count + r) * kSourceTile + chunk * kLanes, plan[r]);
      }
      Lanes logit_sum = logit_acc[chunk];
      for (std::size_t r = 0; r < kBlock; ++r) logit_sum += logit_bar[r];
      logit_acc[chunk] = logit_sum;
    }
    if constexpr (kDim == 0) {
      for (std::size_t r = 0; r < kBlock; ++r)
        std::copy_n(u_bar[r], od, wide_u_bar.data() + (wide_count + r) * stride);
      wide_count += kBlock;
      if (wide_count == kWideReceivers) add_wide();
    }
    for (std::size_t r = 0; r < block.count; ++r) {
      double* to = partial + block.token[r] * row;
      for (std::size_t c = 0; c < score_dim; ++c) to[c] += simd::horizontal_sum(receiver_acc[r][c]);
      for (std::size_t number = 0; number < numbers; ++number)
        to[score_dim + number] += simd::horizontal_sum(factor_acc[r * numbers + number]);
    }
  }
  if constexpr (kDim == 0) {
    if (wide_count > 0) add_wide();
    for (std::size_t j = 0; j < kSourceTile; ++j)
      for (std::size_t c = 0; c < od; ++c)
        value_sums[c * kSourceTile + j] = wide_sums[j * stride + c];
  }
  for (std::size_t chunk = 0; chunk < chunks; ++chunk) {
    for (std::size_t c = 0; c < od; ++c) {
      // The keys' sums past r are 0.
      const Lanes key_sum = c < score_loop ? key_acc[chunk * score_loop + c] : Lanes{};
      simd::store(key_sums + c * kSourceTile + chunk * kLanes, key_sum);
      if constexpr (kDim > 0)
        simd::store(value_sums + c * kSourceTile + chunk * kLanes, value_acc[chunk * od + c]);
    }
    simd::store(logit_sums + chunk * kLanes, logit_acc[chunk]);
  }
}

/// The JVP's receiver pass of one block: numerator_dot_i and sum_dot_i (PairTangents).
template <int kDim, bool kTerms>
void jvp_block(const HeadLanes& head, const PairTangents& in, const AlignedDoubles& key_dot,
               const AlignedDoubles& value_dot, const AlignedDoubles& bias_dot, std::size_t first,
               double* numerator_dot, double* sum_dot) {
  const HeadPairs& pairs = head.pairs;
  const Model& model = pairs.model;
  const std::size_t od = kDim > 0 ? std::size_t(kDim) : head.od(), padded = head.padded();
  const std::size_t scores = kDim > 0 ? od : pairs.score_dim, stride = head.value_stride;
  const ReceiverBlock block(first, model.n);
  // l_dot_ij = sum_c (beta q_dot + beta_dot q)_c k_jc + sum_c beta q_c k_dot_jc + b_dot_j
  //            - beta_dot [rescaled] + the log-term's tangent.
  BlockRows<double, kDim> query(od), along_keys(od), along_key_dots(od);
  double offset[kBlock];
  const double constant = model.time_scale == TimeScale::Rescaled ? -in.beta : 0.0;
  for (std::size_t r = 0; r < kBlock; ++r) {
    const std::size_t i = block.token[r];
    for (std::size_t c = 0; c < od; ++c) {
      const double q = pairs.queries[i * od + c];
      query[r][c] = q * head.beta_log2e;
      along_keys[r][c] = head.beta * in.query[i * od + c] + in.beta * q;
      along_key_dots[r][c] = head.beta * q;
    }
    offset[r] = pairs.offset[i];
  }
  TermRows rows(kTerms, head.numbers);
  const bool factor_tangent = in.factor != nullptr && head.numbers > 0;
  BlockRows<Lanes, kDim> keys_rows(od), values_rows(od), acc(kDim > 0 ? od : 0);
  Lanes* keys = keys_rows[0];
  Lanes* values = values_rows[0];
  Lanes* key_dots = keys_rows[1];
  Lanes* value_dots = values_rows[1];
  Lanes sums[kBlock] = {};
  // Wide: each tile's w and w_dot, then two GEMMs into rows of `stride` sums (value_dot holds
  // rows of `stride` then).
  alignas(64) double tile_weights[kBlock][kRowTile], tile_weight_dots[kBlock][kRowTile];
  AlignedDoubles wide_sums(kDim > 0 ? 0 : kBlock * stride, 0.0);
  for (std::size_t begin = 0; begin < padded; begin += kRowTile) {
    if (kTerms) rows.fill(head, block.token, begin, false, factor_tangent ? in.factor : nullptr);
    for (std::size_t k = 0; k < kRowTile; k += kLanes) {
      const std::size_t at = begin + k;
      const double* key_dot_lanes = lanes_of(key_dot, at, scores);
      for (std::size_t c = 0; c < scores; ++c)
        key_dots[c] = simd::load(key_dot_lanes + c * kSourceTile);
      if constexpr (kDim > 0) {
        const double *value_lanes = lanes_of(head.values, at, od),
                     *value_dot_lanes = lanes_of(value_dot, at, od);
        for (std::size_t c = 0; c < od; ++c) {
          values[c] = simd::load(value_lanes + c * kSourceTile);
          value_dots[c] = simd::load(value_dot_lanes + c * kSourceTile);
        }
      }
      Lanes exponential[kBlock];
      block_exponentials<kDim, kTerms>(head, query, rows, at, k, offset, keys, exponential);
      const Lanes presence_dot = simd::load(bias_dot.data() + at);
      for (std::size_t r = 0; r < kBlock; ++r) {
        const Lanes weight = kTerms ? exponential[r] * simd::load(rows.multiplier(r) + k)
                                    : exponential[r];
        Lanes logit_dot = presence_dot + constant;
        for (std::size_t c = 0; c < scores; ++c)
          logit_dot += along_keys[r][c] * keys[c] + along_key_dots[r][c] * key_dots[c];
        Lanes weight_dot;
        if (factor_tangent && head.multiplies) {
          weight_dot = weight * logit_dot + exponential[r] * simd::load(rows.term_dot(r) + k);
        } else {
          if (factor_tangent) logit_dot += simd::load(rows.term_dot(r) + k);
          weight_dot = weight * logit_dot;
        }
        // A pair with zero weight adds nothing (its logit's tangent may be -inf - -inf).
        weight_dot = simd::select_or_zero(weight != 0.0, weight_dot);
        if constexpr (kDim > 0) {
          for (std::size_t c = 0; c < od; ++c)
            acc[r][c] += weight_dot * values[c] + weight * value_dots[c];
        } else {
          simd::store(tile_weights[r] + k, weight);
          simd::store(tile_weight_dots[r] + k, weight_dot);
        }
        sums[r] += weight_dot;
      }
    }
    if constexpr (kDim == 0) {
      add_weighted_rows<kBlock>(head.value_rows.data() + begin * stride, stride, wide_sums.data(),
                                stride, tile_weight_dots[0], kRowTile, 1, kRowTile, stride);
      add_weighted_rows<kBlock>(value_dot.data() + begin * stride, stride, wide_sums.data(), stride,
                                tile_weights[0], kRowTile, 1, kRowTile, stride);
    }
  }
  for (std::size_t r = 0; r < block.count; ++r) {
    const std::size_t i = block.token[r];
    for (std::size_t c = 0; c < od; ++c)
      numerator_dot[i * od + c] = kDim > 0 ? simd::horizontal_sum(acc[r][c])
                                           : wide_sums[r * stride + c];
    sum_dot[i] = simd::horizontal_sum(sums[r]);
  }
}

/// C's rows [i, i + kRows) and columns [begin, end) of a DenseProduct (end - begin a multiple
/// of kChunks kLanes): kRows x kChunks lane sums in registers, each load of B serving kRows
/// rows. Every element's sum runs over k in order, then is added to C.
template <std::size_t kRows, std::size_t kChunks, bool kTransposed>
void product_block(const detail::DenseProduct& q, std::size_t i, std::size_t begin,
                   std::size_t end) {
  for (std::size_t column = begin; column < end; column += kChunks * kLanes) {
    Lanes sum[kRows][kChunks] = {};
    for (std::size_t k = 0; k < q.k; ++k) {
      Lanes b[kChunks];
      for (std::size_t chunk = 0; chunk < kChunks; ++chunk)
        b[chunk] = simd::load(q.b + k * q.ldb + column + chunk * kLanes);
      for (std::size_t row = 0; row < kRows; ++row) {
        const double a = kTransposed ? q.a[k * q.lda + i + row] : q.a[(i + row) * q.lda + k];
        for (std::size_t chunk = 0; chunk < kChunks; ++chunk) sum[row][chunk] += a * b[chunk];
      }
    }
    for (std::size_t row = 0; row < kRows; ++row)
      for (std::size_t chunk = 0; chunk < kChunks; ++chunk) {
        double* c = q.c + (i + row) * q.ldc + column + chunk * kLanes;
        simd::store(c, simd::load(c) + sum[row][chunk]);
      }
  }
}

/// C's rows [i, i + kRows) of a DenseProduct: two chunks of kLanes columns at a time where
/// there are 32 vector registers, then one, then the last columns one by one (each element's
/// sum over k in order).
template <std::size_t kRows, bool kTransposed>
void product_rows(const detail::DenseProduct& q, std::size_t i) {
  constexpr std::size_t kChunks = simd::kVectorRegisters >= 32 ? 2 : 1;
  const std::size_t wide = q.p / (kChunks * kLanes) * (kChunks * kLanes),
                    lanes = q.p / kLanes * kLanes;
  product_block<kRows, kChunks, kTransposed>(q, i, 0, wide);
  if constexpr (kChunks > 1) product_block<kRows, 1, kTransposed>(q, i, wide, lanes);
  for (std::size_t column = lanes; column < q.p; ++column)
    for (std::size_t row = 0; row < kRows; ++row) {
      double sum = 0.0;
      for (std::size_t k = 0; k < q.k; ++k)
        sum += (kTransposed ? q.a[k * q.lda + i + row] : q.a[(i + row) * q.lda + k]) *
               q.b[k * q.ldb + column];
      q.c[(i + row) * q.ldc + column] += sum;
    }
}

/// C += op(A) B (detail::DenseProduct) on the calling thread: blocks of rows (8 where there
/// are 32 vector registers, else 4), then a row at a time. An element's bits depend on
/// neither its block nor the thread.
template <bool kTransposed>
void dense_product(const detail::DenseProduct& q) {
  constexpr std::size_t kRows = simd::kVectorRegisters >= 32 ? 8 : 4;
  std::size_t i = 0;
  for (; i + kRows <= q.m; i += kRows) product_rows<kRows, kTransposed>(q, i);
  for (; i < q.m; ++i) product_rows<1, kTransposed>(q, i);
}

/// The passes' arrays, kept from call to call on each thread (their pages are then not mapped
/// afresh each time: at n = 1024, d = 64, H = 8 that was most of a VJP's time); one per thread,
/// since a layer's heads may run side by side.
struct Workspace {
  ReceiverCotangents cotangents;
  std::vector<double> partial, key_sums, value_sums, logit_sums, receiver_terms;
  AlignedDoubles key_dot, value_dot, bias_dot;
  static Workspace& of_this_thread() {
    thread_local Workspace work;
    return work;
  }
};

class LanePairPasses final : public detail::PairPasses {
 public:
  LanePairPasses(const LanePairTerms& pair_terms, int threads)
      : pair_terms_(pair_terms), threads_(threads) {}
  int threads() const override { return threads_; }
  void fill_operands(const Model& model, const AttentionHead& head, const double* y,
                     double* queries, double* keys, double* values, double* presence,
                     double* log_presence) const override {
    host::fill_head_operands(host::HeadOperands(model, head), y, queries, keys, values, presence,
                             log_presence);
  }
  void add_product(const detail::DenseProduct& product) const override {
    if (product.transpose_a) dense_product<true>(product);
    else dense_product<false>(product);
  }

  void forward(HeadPairs& pairs) const override {
    // The lanes' copies of the operands serve the derivative passes that follow (a head's
    // forward pass taken again refills the last's).
    if (pairs.state) static_cast<HeadLanes*>(pairs.state.get())->take();
    else pairs.state = std::make_shared<HeadLanes>(pairs, pair_terms_);
    HeadLanes& head = *static_cast<HeadLanes*>(pairs.state.get());
    head.weight_sum.assign(pairs.model.n, 0.0);
    const std::size_t n = pairs.model.n;
    pairs.offset.assign(n, 0.0);
    pairs.normaliser.assign(n, 0.0);
    pairs.u_pre.assign(n * pairs.operand_dim, 0.0);
    with_form(head.od(), head.terms, [&](auto dim, auto terms) {
      each_block(n, [&](std::size_t first) {
        forward_block<decltype(dim)::value, decltype(terms)::value>(head, first, pairs);
      });
    });
  }

  void vjp(const HeadPairs& pairs, const double* u_bar, PairCotangents& out) const override {
    const HeadLanes& head = lanes_of(pairs);
    const Model& model = pairs.model;
    Workspace& work = Workspace::of_this_thread();
    const std::size_t n = model.n, od = head.od(), numbers = head.numbers;
    const bool sa = model.normalization == Normalization::Sa;
    ReceiverCotangents& cot = work.cotangents;
    cot.inverse_normaliser.assign(n, 0.0);
    cot.delta.assign(n, 0.0);
    cot.u_bar = u_bar;
    for (std::size_t i = 0; i < n; ++i) {
      if (pairs.normaliser[i] == 0.0) continue;
      cot.inverse_normaliser[i] = 1.0 / pairs.normaliser[i];
      double delta = 0.0;
      for (std::size_t c = 0; c < od; ++c) delta += u_bar[i * od + c] * pairs.u_pre[i * od + c];
      if (sa) cot.delta[i] = delta;
    }
    // Each source tile is taken by one thread with every receiver; its receivers' shares go to
    // the rows of its group (tiles t with t mod kTileGroups = g), which are then added in group
    // order: the same bits whatever the thread count, in O(kTileGroups n) memory.
    const std::size_t padded = head.padded(), tiles = (padded + kSourceTile - 1) / kSourceTile;
    const std::size_t score_dim = pairs.score_dim;
    const std::size_t row = score_dim + numbers;
    std::vector<double>& partial = work.partial;
    std::vector<double>& key_sums = work.key_sums;
    std::vector<double>& value_sums = work.value_sums;
    std::vector<double>& logit_sums = work.logit_sums;
    const std::size_t groups = std::min(kTileGroups, tiles);
    partial.resize(groups * n * row);
    key_sums.resize(tiles * kSourceTile * od);
    value_sums.resize(tiles * kSourceTile * od);
    logit_sums.resize(padded);
    with_form(od, head.terms, [&](auto dim, auto terms) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(team(n))
      for (std::size_t group = 0; group < groups; ++group) {
        // (Each group's rows zeroed by the thread that takes it.)
        std::fill_n(partial.data() + group * n * row, n * row, 0.0);
        for (std::size_t tile = group; tile < tiles; tile += kTileGroups) {
          const std::size_t begin = tile * kSourceTile, end = std::min(padded, begin + kSourceTile);
          vjp_tile<decltype(dim)::value, decltype(terms)::value>(
              head, cot, begin, end, key_sums.data() + begin * od,
              value_sums.data() + begin * od, logit_sums.data() + begin,
              partial.data() + group * n * row);
        }
      }
    });
    // Each receiver's row of sums in group order (receivers side by side: each row is its own),
    // then beta's and the factor's sums in receiver order, then each source's.
    const bool rescaled = model.time_scale == TimeScale::Rescaled;
    // Per receiver: its beta term (the score, then the rescaled time's sum_j l_bar_ij) and
    // the factor's numbers' sums.
    const std::size_t terms_row = 2 + numbers;
    std::vector<double>& receiver_terms = work.receiver_terms;
    receiver_terms.assign(n * terms_row, 0.0);
#pragma omp parallel num_threads(team(n))
    {
      std::vector<double> sums(row);
#pragma omp for schedule(static)
      for (std::size_t i = 0; i < n; ++i) {
        std::fill(sums.begin(), sums.end(), 0.0);
        for (std::size_t group = 0; group < groups; ++group)
          for (std::size_t k = 0; k < row; ++k) sums[k] += partial[(group * n + i) * row + k];
        double* terms = receiver_terms.data() + i * terms_row;
        for (std::size_t c = 0; c < score_dim; ++c) {
          out.query[i * od + c] += model.beta * sums[c];
          terms[0] += pairs.queries[i * od + c] * sums[c];
        }
        // sum_j l_bar_ij = <u_bar_i, u_pre_i> - delta_i S_i / N_i (sum_j P_ij = S_i / N_i,
        // sum_j P_ij z_j = u_pre_i): 0 for SA without eps_den.
        if (rescaled && pairs.normaliser[i] != 0.0) {
          double along = 0.0;
          for (std::size_t c = 0; c < od; ++c)
            along += cot.u_bar[i * od + c] * pairs.u_pre[i * od + c];
          terms[1] = along - cot.delta[i] * head.weight_sum[i] * cot.inverse_normaliser[i];
        }
        for (std::size_t number = 0; number < numbers; ++number)
          terms[2 + number] = sums[score_dim + number];
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      const double* terms = receiver_terms.data() + i * terms_row;
      if (rescaled && pairs.normaliser[i] != 0.0) out.beta -= terms[1];
      out.beta += terms[0];
      for (std::size_t number = 0; number < numbers; ++number) out.factor[number] += terms[2 + number];
    }
#pragma omp parallel for schedule(static) num_threads(team(n))
    for (std::size_t s = 0; s < padded; ++s) {
      const std::size_t j = head.layout.operand(s);
      if (j == kNoOperand) continue;
      const std::size_t tile = s / kSourceTile * kSourceTile, lane = s % kSourceTile;
      for (std::size_t c = 0; c < od; ++c) {
        out.key[j * od + c] += model.beta * key_sums[tile * od + c * kSourceTile + lane];
        out.value[j * od + c] += value_sums[tile * od + c * kSourceTile + lane];
      }
      out.source_logit[j] += logit_sums[s];
    }
  }

  void jvp(const HeadPairs& pairs, const PairTangents& in, double* numerator_dot,
           double* sum_dot) const override {
    const HeadLanes& head = lanes_of(pairs);
    Workspace& work = Workspace::of_this_thread();
    AlignedDoubles& key_dot = work.key_dot;
    AlignedDoubles& value_dot = work.value_dot;
    AlignedDoubles& bias_dot = work.bias_dot;
    head.layout.spread(in.key, head.wide ? pairs.score_dim : head.od(), key_dot);
    if (head.wide) head.layout.gather(in.value, head.value_stride, value_dot);
    else head.layout.spread(in.value, head.od(), value_dot);
    bias_dot.assign(head.padded(), 0.0);
    for (std::size_t s = 0; s < head.padded(); ++s) {
      const std::size_t j = head.layout.operand(s);
      if (j != kNoOperand) bias_dot[s] = in.log_presence[j];
    }
    with_form(head.od(), head.terms, [&](auto dim, auto terms) {
      each_block(pairs.model.n, [&](std::size_t first) {
        jvp_block<decltype(dim)::value, decltype(terms)::value>(
            head, in, key_dot, value_dot, bias_dot, first, numerator_dot, sum_dot);
      });
    });
  }

 private:
  /// The lanes forward() kept for this head.
  static const HeadLanes& lanes_of(const HeadPairs& pairs) {
    if (!pairs.state)
      throw std::logic_error("derivative lanes: a pass before the head's forward pass");
    return *static_cast<const HeadLanes*>(pairs.state.get());
  }

  /// body(first) for every block of kBlock receivers, spread over the threads (each block's
  /// sums are its own, whichever thread takes it).
  template <class Body>
  void each_block(std::size_t n, Body&& body) const {
    const std::size_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(dynamic, 1) num_threads(team(n))
    for (std::size_t b = 0; b < blocks; ++b) body(b * kBlock);
  }
  int team(std::size_t count) const {
    return double(count) * double(count) < kPairsPerExtraThread ? 1 : threads_;
  }

  const LanePairTerms& pair_terms_;
  int threads_;
};

}  // namespace

std::unique_ptr<detail::PairPasses> make_lane_pair_passes(const LanePairTerms& pair_terms,
                                                          int threads) {
  return std::make_unique<LanePairPasses>(pair_terms, threads);
}

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
