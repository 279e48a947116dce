#pragma once
/// \file attention_statistics.hpp
/// Statistics of one receiver's normalised attention plan (docs/model.md, "Attention
/// statistics"), streamed over its sources in O(1) memory. With log-weights l_j (SA's
/// beta <Q x_i, K x_j> plus the log-terms; any real numbers) and P_j = exp(l_j) / Z,
/// Z = sum_j exp(l_j):
///   entropy        H = -sum_j P_j log P_j = log Z - sum_j P_j l_j
///   largest weight max_j P_j = exp(max_j l_j) / Z
///   participation  1 / sum_j P_j^2 = Z^2 / sum_j exp(2 l_j)
///   output         sum_j P_j v_j (a vector of `dim` numbers, v_j the source's value)
/// Every sum is kept relative to the running largest log-weight m (exp(l_j - m) <= 1), so
/// no exponential overflows whatever the l_j; the centred sum A = sum_j exp(l_j - m)(l_j - m)
/// gives H = log Z' - A / Z' (Z' = Z exp(-m)) without the cancellation of log Z - <l>.
/// Two accumulators of disjoint sources merge into the one of their union (merge): the same
/// numbers to rounding, whatever the order of the sources. Up to kMaxTop of the largest
/// log-weights are kept (the k largest weights).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <limits>

namespace mfattn::kernels {

struct PlanStatistics {
  static constexpr std::size_t kMaxTop = 16;
  static constexpr std::size_t kMaxDim = 64;
  std::size_t dim = 0;        ///< the values' dimension (0: no output)
  std::size_t top_count = 0;  ///< how many of the largest log-weights to keep, <= kMaxTop
  std::size_t sources = 0;
  double largest = -std::numeric_limits<double>::infinity();  ///< m = max_j l_j
  double sum = 0.0;                                           ///< Z' = sum_j exp(l_j - m)
  double centred = 0.0;                                       ///< A = sum_j exp(l_j - m) (l_j - m)
  double square_sum = 0.0;                                    ///< sum_j exp(2 (l_j - m))
  std::array<double, kMaxDim> output{};                       ///< sum_j exp(l_j - m) v_j
  std::array<double, kMaxTop> top{};  ///< the top_count largest l_j, decreasing
  std::size_t top_filled = 0;

  PlanStatistics(std::size_t values_dim, std::size_t top_kept)
      : dim(std::min(values_dim, kMaxDim)), top_count(std::min(top_kept, kMaxTop)) {}

  /// Every sum scaled from the reference m to m_new >= m.
  void rescale(double new_largest) {
    if (sources == 0) {
      largest = new_largest;
      return;
    }
    const double shift = largest - new_largest, factor = std::exp(shift);
    centred = factor * (centred + shift * sum);
    sum *= factor;
    square_sum *= factor * factor;
    for (std::size_t c = 0; c < dim; ++c) output[c] *= factor;
    largest = new_largest;
  }

  void keep_top(double l) {
    if (top_count == 0) return;
    if (top_filled == top_count && l <= top[top_count - 1]) return;
    std::size_t at = top_filled < top_count ? top_filled++ : top_count - 1;
    for (; at > 0 && top[at - 1] < l; --at) top[at] = top[at - 1];
    top[at] = l;
  }

  /// Adds the source of log-weight l and value v (dim numbers; null where dim is 0).
  void add(double l, const double* v) {
    if (l == -std::numeric_limits<double>::infinity()) return;  // a weight of 0: no source
    if (l > largest) rescale(l);
    const double w = std::exp(l - largest);
    sum += w;
    centred += w * (l - largest);
    square_sum += w * w;
    for (std::size_t c = 0; c < dim; ++c) output[c] += w * v[c];
    keep_top(l);
    ++sources;
  }

  /// The accumulator of both sets of sources (`other` disjoint from this one's).
  void merge(PlanStatistics other) {
    if (other.sources == 0) return;
    if (sources == 0) {
      *this = other;
      return;
    }
    const double reference = std::max(largest, other.largest);
    rescale(reference);
    other.rescale(reference);
    sum += other.sum;
    centred += other.centred;
    square_sum += other.square_sum;
    for (std::size_t c = 0; c < dim; ++c) output[c] += other.output[c];
    for (std::size_t k = 0; k < other.top_filled; ++k) keep_top(other.top[k]);
    sources += other.sources;
  }

  double entropy() const { return std::log(sum) - centred / sum; }
  double largest_weight() const { return 1.0 / sum; }
  double participation() const { return sum * sum / square_sum; }
  /// The k-th largest weight (k from 0; 0 past the sources).
  double top_weight(std::size_t k) const {
    return k < top_filled ? std::exp(top[k] - largest) / sum : 0.0;
  }
  /// Component c of the output sum_j P_j v_j.
  double output_component(std::size_t c) const { return output[c] / sum; }
};

}  // namespace mfattn::kernels
