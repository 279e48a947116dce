#pragma once
// The pair pass of the per-frame observables (docs/model.md section 6) for d <= 8: the
// smallest inner product, the close pairs and the cluster components, lanes over partners.
// A kernels header so that each CPU kernel set compiles it for its instruction set
// (KernelSet::pair_statistics); the observers call it through cpu_pair_statistics().
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "backends/cpu/vector_math.hpp"
#include "core/cluster_forests.hpp"
#include "mfattn/backends/pair_statistics.hpp"
#include "mfattn/core/evaluation_watch.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::cpu {
inline namespace MFATTN_CPU_NAMESPACE {

/// The pair pass over `moving` (indices of rows of x), d <= kLanes, lanes over partners j:
/// min <x_i, x_j> and, with kStats, the pairs with <x_i, x_j> > close_above and the
/// components of the graph <x_i, x_j> > edge_above. Identical results on every thread count.
/// Up to this many tokens take bitset_pair_pass (its cluster graph, m^2 bits, fits L2).
inline constexpr std::size_t kBitsetPairTokens = 1024;

/// The pair pass of a system of m <= kBitsetPairTokens tokens: the partners j one at a time
/// (broadcast), lanes over eight tokens i; the pairs i < j first, the rest of each row only
/// where the lower triangle leaves more than one possible component (see `roots`). The cluster graph is a
/// bit set per token (row j: every i with <x_i, x_j> > edge_above, j itself included), one
/// byte per lane vector, and its components are grown from bit sets, each token taken once,
/// so the graph costs no union-find per edge. The minimum and the close pairs take the
/// pairs i < j only: the vectors before j's own whole, j's own under a lane mask. The
/// counts and the minimum are exact, and every inner product is the one the row pass forms
/// (a product commutes), so the results equal the row pass's. rows: d rows of `stride`
/// coordinates (zeros beyond m).
template <bool kStats, std::size_t kDim>
PairStatistics bitset_pair_pass(const std::vector<double>& rows, std::size_t m, std::size_t stride,
                                double close_above, double edge_above, std::size_t dim = kDim) {
  // kDim 2, 3, 4: a constant, the products unroll; kDim 8 takes any d <= 8 at run time.
  const std::size_t d = kDim == 8 ? dim : kDim;
  constexpr std::size_t kLanes = simd::kLanes;
  static_assert(kLanes == 8, "a lane vector's edges are one byte of a bit set");
  static_assert(kLanes == kLanePairStatisticsDimensions, "d <= kLanes takes the lane pass");
  static_assert(std::endian::native == std::endian::little, "byte v of a row is its bits 8v..8v+7");
  PairStatistics stats;
  stats.pairs = static_cast<std::int64_t>(m * (m - 1) / 2);
  const std::size_t vectors = stride / kLanes, words = (m + 63) / 64;
  thread_local std::vector<std::uint64_t> neighbours;  // every word is written below
  if constexpr (kStats) neighbours.resize(m * words);
  simd::Lanes lowest = simd::broadcast(1.0), close{}, lane_index{};
  for (std::size_t l = 0; l < kLanes; ++l) lane_index.set(l, double(l));
  const simd::Lanes edge_bound = simd::broadcast(edge_above), close_bound = simd::broadcast(close_above);
  const simd::Lanes positive_infinity = simd::broadcast(std::numeric_limits<double>::infinity());
  const simd::Lanes one = simd::broadcast(1.0);
  // Row j's bits, a byte per lane vector (bit l of byte v: token 8 v + l), stored as they
  // come: the words are little-endian, so byte v is bits 8 (v % 8) .. of word v / 8.
  auto product_of = [&](const double (&partner)[kDim], std::size_t v) {
    simd::Lanes inner = simd::load(rows.data() + v * kLanes) * partner[0];
    for (std::size_t c = 1; c < d; ++c) inner += simd::load(rows.data() + c * stride + v * kLanes) * partner[c];
    return inner;
  };
  auto partner_of = [&](std::size_t j, double (&partner)[kDim]) {
    for (std::size_t c = 0; c < d; ++c) partner[c] = rows[c * stride + j];
  };
  [[maybe_unused]] auto row_bytes = [&](std::size_t j) {
    return reinterpret_cast<unsigned char*>(neighbours.data() + j * words);
  };
  // Tokens without an edge to an earlier token (the roots of the lower triangle): the graph
  // has at most that many components, so one root (the collapsed state) means one
  // component, and the later partners' bits (half the products) are never needed.
  // Up to 64 tokens (one word a row) the rows are taken whole in one pass: the second
  // pass's own loop cost more than the products it saves.
  const bool deferred = words > 1;
  std::size_t roots = 0;
  for (std::size_t j = 0; j < m; ++j) {
    double partner[kDim];
    partner_of(j, partner);
    const std::size_t own = j / kLanes;
    [[maybe_unused]] unsigned char* row = nullptr;
    if constexpr (kStats) {
      row = row_bytes(j);
      // The words of j's own vector and the last one start at 0: the bytes beyond own are
      // written by the second pass (or never read), those beyond the last vector stay 0.
      neighbours[j * words + own / 8] = 0;
      neighbours[j * words + words - 1] = 0;
    }
    auto edges = [&](std::size_t v, const simd::Lanes& inner) {
      if constexpr (kStats) row[v] = static_cast<unsigned char>(simd::greater_bits(inner, edge_bound));
    };
    for (std::size_t v = 0; v < own; ++v) {  // every lane i < j
      const simd::Lanes inner = product_of(partner, v);
      lowest = simd::min(lowest, inner);
      if constexpr (kStats) close += simd::select_or_zero(inner > close_bound, one);
      edges(v, inner);
    }
    {  // j's own vector: lanes i < j only (padding lanes are beyond m > j)
      const simd::Lanes inner = product_of(partner, own);
      const simd::LaneMask pair = simd::broadcast(double(own * kLanes)) + lane_index < double(j);
      lowest = simd::min(lowest, simd::select(pair, inner, positive_infinity));
      if constexpr (kStats)
        close += simd::select_or_zero(pair, simd::select_or_zero(inner > close_bound, one));
      edges(own, inner);
    }
    if constexpr (kStats) {
      if (deferred) {
        const std::uint64_t* word = neighbours.data() + j * words;
        bool earlier = (word[j / 64] & ((std::uint64_t{1} << (j % 64)) - 1)) != 0;
        for (std::size_t w = 0; w < j / 64 && !earlier; ++w) earlier = word[w] != 0;
        roots += !earlier;
      } else {
        for (std::size_t v = own + 1; v < vectors; ++v) edges(v, product_of(partner, v));
      }
    }
  }
  if constexpr (kStats) {
    if (deferred && roots > 1) {
      // The rest of every row: the partners after j's own vector.
      for (std::size_t j = 0; j < m; ++j) {
        double partner[kDim];
        partner_of(j, partner);
        unsigned char* row = row_bytes(j);
        for (std::size_t v = j / kLanes + 1; v < vectors; ++v)
          row[v] = static_cast<unsigned char>(simd::greater_bits(product_of(partner, v), edge_bound));
      }
    }
  }
  stats.min_inner = 1.0;
  for (std::size_t l = 0; l < kLanes; ++l) stats.min_inner = std::min(stats.min_inner, lowest[l]);
  stats.clusters = m;
  if constexpr (kStats) {
    for (std::size_t l = 0; l < kLanes; ++l) stats.close_pairs += static_cast<std::int64_t>(close[l]);
    if (deferred && roots == 1) {
      stats.clusters = 1;
      return stats;
    }
    // Components: each grown from the lowest token not yet taken, through bit sets (bits
    // of padding tokens, beyond m, are never in `remaining`, so they are never taken).
    if (words == 1) {  // m <= 64: every set in a register
      std::uint64_t remaining = m == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << m) - 1;
      std::size_t components = 0;
      while (remaining) {
        std::uint64_t component = remaining & (~remaining + 1), frontier = component;
        while (frontier) {
          const int k = __builtin_ctzll(frontier);
          frontier &= frontier - 1;
          const std::uint64_t added = neighbours[static_cast<std::size_t>(k)] & remaining & ~component;
          component |= added;
          frontier |= added;
        }
        remaining &= ~component;
        ++components;
      }
      stats.clusters = components;
      return stats;
    }
    thread_local std::vector<std::uint64_t> remaining, component, frontier;
    remaining.assign(words, ~std::uint64_t{0});
    if (m % 64) remaining[words - 1] = (std::uint64_t{1} << (m % 64)) - 1;
    component.assign(words, 0);
    frontier.assign(words, 0);
    std::size_t components = 0, first_word = 0;
    while (true) {
      while (first_word < words && remaining[first_word] == 0) ++first_word;
      if (first_word == words) break;
      const std::uint64_t seed = remaining[first_word] & (~remaining[first_word] + 1);
      std::fill(component.begin(), component.end(), 0);
      component[first_word] = frontier[first_word] = seed;
      std::size_t frontier_word = first_word;  // frontier is empty below this word
      while (true) {
        while (frontier_word < words && frontier[frontier_word] == 0) ++frontier_word;
        if (frontier_word == words) break;
        const std::size_t k = frontier_word * 64 + static_cast<std::size_t>(__builtin_ctzll(frontier[frontier_word]));
        frontier[frontier_word] &= frontier[frontier_word] - 1;
        const std::uint64_t* next = neighbours.data() + k * words;
        for (std::size_t w = 0; w < words; ++w) {
          const std::uint64_t added = next[w] & remaining[w] & ~component[w];
          component[w] |= added;
          frontier[w] |= added;
          if (added && w < frontier_word) frontier_word = w;
        }
      }
      for (std::size_t w = 0; w < words; ++w) remaining[w] &= ~component[w];
      ++components;
    }
    stats.clusters = components;
  }
  return stats;
}

template <bool kStats>
PairStatistics lane_pair_pass(const double* x, std::size_t d, const std::vector<std::size_t>& moving,
                              double close_above, double edge_above) {
  const std::size_t m = moving.size();
  PairStatistics stats;
  stats.pairs = static_cast<std::int64_t>(m * (m > 0 ? m - 1 : 0) / 2);
  stats.clusters = m;
  if (m < 2) return stats;
  // Lanes over tokens: the moving tokens' coordinates as d rows of `stride` numbers.
  constexpr std::size_t kLanes = simd::kLanes;
  const std::size_t stride = (m + kLanes - 1) / kLanes * kLanes;
  // The calling thread's buffer (no allocation per replica and frame), by a reference that
  // the parallel row pass below captures: a thread_local named there would be each worker's own.
  thread_local std::vector<double> calling_thread_rows;
  std::vector<double>& rows = calling_thread_rows;
  rows.assign(d * stride, 0.0);
  for (std::size_t a = 0; a < m; ++a)
    for (std::size_t c = 0; c < d; ++c) rows[c * stride + a] = x[moving[a] * d + c];
  if (m <= kBitsetPairTokens) {
    // The usual dimensions as constants, the others at run time (fewer copies to compile).
    switch (d) {
      case 2: return bitset_pair_pass<kStats, 2>(rows, m, stride, close_above, edge_above);
      case 3: return bitset_pair_pass<kStats, 3>(rows, m, stride, close_above, edge_above);
      case 4: return bitset_pair_pass<kStats, 4>(rows, m, stride, close_above, edge_above);
      default: return bitset_pair_pass<kStats, 8>(rows, m, stride, close_above, edge_above, d);
    }
  }
  ThreadForests forests(kStats ? m : 0, simd::kLanes);
  const auto count = static_cast<std::ptrdiff_t>(m);
  double lowest = 1.0;
  std::int64_t close = 0;
  // Row i's pairs (i, j > i); lowest and close are the calling thread's.
  auto row_pass = [&](std::size_t i, double& lowest, std::int64_t& close) {
    // Partners j > i: a scalar head up to the next lane boundary, whole lanes, a scalar tail.
    const std::size_t head_end = std::min(m, (i + 1 + kLanes - 1) / kLanes * kLanes);
    const std::size_t body_end = head_end + (m - head_end) / kLanes * kLanes;
    // With kStats: close pairs are counted in lanes, and the row's largest inner product
    // decides whether it has a cluster edge at all; only such rows are gathered into row[j]
    // (the scalar head and tail as they go, the lanes in a second pass) for the union-find.
    double* row = nullptr;
    bool edges = false;
    if constexpr (kStats) {
      auto& slot = forests.local();
      edges = !slot.forest->whole();
      row = slot.row.data();
    }
    double highest = -2.0;
    auto scalar = [&](std::size_t j) {
      double inner = 0.0;
      for (std::size_t c = 0; c < d; ++c) inner += rows[c * stride + i] * rows[c * stride + j];
      lowest = std::min(lowest, inner);
      if constexpr (kStats) {
        close += inner > close_above;
        highest = std::max(highest, inner);
        row[j] = inner;
      }
    };
    for (std::size_t j = i + 1; j < head_end; ++j) scalar(j);
    simd::Lanes best = simd::broadcast(lowest);
    [[maybe_unused]] simd::Lanes top = simd::broadcast(highest);
    [[maybe_unused]] const simd::Lanes close_bound = simd::broadcast(close_above);
    [[maybe_unused]] simd::Lanes close_lanes{};  // counts (exact as doubles up to 2^53)
    for (std::size_t j = head_end; j < body_end; j += kLanes) {
      simd::Lanes inner = simd::broadcast(rows[i]) * simd::load(rows.data() + j);
      for (std::size_t c = 1; c < d; ++c)
        inner += simd::broadcast(rows[c * stride + i]) * simd::load(rows.data() + c * stride + j);
      best = simd::min(inner, best);
      if constexpr (kStats) {
        close_lanes += simd::select_or_zero(inner > close_bound, simd::broadcast(1.0));
        top = simd::max(inner, top);
      }
    }
    for (std::size_t l = 0; l < kLanes; ++l) lowest = std::min(lowest, best[l]);
    if constexpr (kStats) {
      for (std::size_t l = 0; l < kLanes; ++l) {
        close += static_cast<std::int64_t>(close_lanes[l]);
        highest = std::max(highest, top[l]);
      }
    }
    for (std::size_t j = body_end; j < m; ++j) scalar(j);
    if constexpr (kStats) {
      if (edges && highest > edge_above) {
        // Only rows with an edge keep their inner products: the lanes again, stored.
        for (std::size_t j = head_end; j < body_end; j += kLanes) {
          simd::Lanes inner = simd::broadcast(rows[i]) * simd::load(rows.data() + j);
          for (std::size_t c = 1; c < d; ++c)
            inner += simd::broadcast(rows[c * stride + i]) * simd::load(rows.data() + c * stride + j);
          simd::store(row + j, inner);
        }
        auto& slot = forests.local();
        unite_row(*slot.forest, static_cast<std::uint32_t>(i), row, 0, i + 1, m,
                  edge_above, slot.scratch);
      }
    }
  };
  // A minimum and an integer count do not depend on the order they are taken in, and the
  // forests are merged after the loop, so threads cannot change any result. Small systems
  // (thousands of replicas of n = 32 per frame) run without a parallel region: opening
  // one, even of one thread, cost more than their pairs.
  if (m > 512) {
    // The caller's pass (cpu_pair_statistics), handed to the workers: a stop skips the rows
    // left, and the pass throws after the loop.
    const EvaluationPass* pass = EvaluationPass::current();
#pragma omp parallel for reduction(min : lowest) reduction(+ : close) schedule(dynamic, 16)
    for (std::ptrdiff_t a = 0; a < count; ++a) {
      if (EvaluationPass::stopping(pass)) continue;
      row_pass(static_cast<std::size_t>(a), lowest, close);
      EvaluationPass::done(pass, double(m - 1 - std::size_t(a)));
    }
  } else {
    for (std::size_t i = 0; i < m; ++i) row_pass(i, lowest, close);
  }
  stats.min_inner = lowest;
  if constexpr (kStats) {
    stats.close_pairs = close;
    stats.clusters = forests.components();
  }
  return stats;
}

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
