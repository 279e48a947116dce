#pragma once
// The per-token operands of docs/model.md section 2, read from a Model with the kernels'
// per-token formulas (kernels/token_formulas.hpp), once for every backend (kept out of
// src/kernels/, whose headers all compile for a device, because a Model does not):
//   query  G_i Q x_i,   key  k_j = G_j K y_j,
//   value  z_j = G_j y_j (transported values) | y_j (plain),   log-presence  log p_j
// for the sources j (the n moving tokens, then the P prefix tokens, whose contents y_p are
// fixed). The gauge is applied once per token, never per pair. beta multiplies the scores
// where each consumer has always applied it (the CPU backend scales its queries once, the
// scalar consumers take beta * <q, k>), so that no consumer's bits move.
//
// HeadOperands is every head's form (the one head of --q, --k, --v included): the CPU backend
// calls it from its threads and packs the results into its panels at once;
// prepare_head_operands fills plain arrays with it, for the reference backend, the energy and
// the OAttention link. gauged_product and source_value are the one head's per-token forms the
// CUDA backend's host side takes.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/model_sources.hpp"
#include "kernels/token_formulas.hpp"
#include "mfattn/core/model.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::host {
inline namespace MFATTN_CPU_NAMESPACE {

/// G_token M y (M skipped when identity). Returns where the result is: y itself when there is
/// nothing to apply (no copy per token), tmp = M y without a gauge, else out. tmp and out
/// hold d numbers each and alias neither y nor each other.
inline const double* gauged_product(const Model& model, const Matrix& m, bool identity,
                                    std::size_t token, const double* y, double* tmp,
                                    double* out) {
  const std::size_t d = model.d;
  const double* in = y;
  if (!identity) {
    kernels::matrix_product(kernels::RowMajorRows{m.data(), int(d)}, int(d), y, tmp);
    in = tmp;
  }
  if (!model.gauge) return in;
  model.gauge->apply(token, in, out);
  return out;
}

/// The value z_j of source `token` with contents y: G_j y transported, y plain. Returns y
/// itself or out (d numbers).
inline const double* source_value(const Model& model, std::size_t token, const double* y,
                                  double* out) {
  if (!model.gauge || model.values != ValueTransport::Transported) return y;
  model.gauge->apply(token, y, out);
  return out;
}

/// Every source's operands as plain row-major arrays (sources = n moving tokens, then the P
/// prefix tokens; queries for every source too, since the energy takes prefix receivers).
struct TokenOperands {
  std::size_t sources = 0, d = 0;
  std::vector<double> queries;       ///< sources x d: G_j Q y_j (beta not applied)
  std::vector<double> keys;          ///< sources x d: G_j K y_j
  std::vector<double> values;        ///< sources x d: z_j
  std::vector<double> presence;      ///< p_j (prefix tokens: the prefix weight)
  std::vector<double> log_presence;  ///< log p_j
  const double* query(std::size_t j) const { return queries.data() + j * d; }
  const double* key(std::size_t j) const { return keys.data() + j * d; }
  const double* value(std::size_t j) const { return values.data() + j * d; }
  /// Room for `count` sources of `dim` numbers each (the arrays are reused between calls).
  void resize(std::size_t count, std::size_t dim) {
    sources = count;
    d = dim;
    queries.resize(count * dim);
    keys.resize(count * dim);
    values.resize(count * dim);
    presence.resize(count);
    log_presence.resize(count);
  }
};

/// The operands of one head (AttentionHead, docs/model.md sections 2 and 2b) in the form the
/// pair loops take: the query and key (r numbers, the score gauge applied: the gauge for r = d,
/// Model::head_gauge for r < d) and the value z_j, each zero-padded to operand_dim numbers, so
/// that the loops run unchanged on every head (the padding adds exact zeros to every logit and
/// sum):
///   z_j = G_j y_j (d numbers; transported values with a gauge)  |  A_h y_j (rv numbers; y_j
///         itself where A_h = I)
/// and the map of a receiver's normalized sums back to R^d, once per receiver:
///   u^(h) = V_h G_i^T u_pre (transported)  |  O_h u_pre (O_h = I when the head has none).
/// The products of a token (Q_h y, K_h y, A_h y, those that are not the identity) are sums in
/// b order from 0. A head whose values are the contents (A_h = I: the head of --q, --k, --v)
/// takes its Q_h y and K_h y row by row (kernels::matrix_product, as every backend of that head
/// always has, to the bit); any other takes its products together from the stacked matrices'
/// transpose, the components side by side (so that they vectorize); the output map likewise
/// from O_h^T.
class HeadOperands {
 public:
  const Model& model;
  const AttentionHead& head;
  bool transported;                 ///< the values carry the d-dimensional gauge
  std::size_t score_dim, value_dim, operand_dim;
  std::size_t product_count;        ///< numbers products() writes (the non-identity products)

  HeadOperands(const Model& m, const AttentionHead& h)
      : model(m), head(h), transported(m.gauge && m.values == ValueTransport::Transported),
        score_dim(h.score_dim()), value_dim(h.value_dim()),
        operand_dim(std::max(score_dim, transported ? m.d : value_dim)),
        score_gauge_(score_dim == m.d ? m.gauge.get() : m.head_gauge.get()) {
    const std::size_t d = m.d;
    query_at_ = 0;
    key_at_ = query_at_ + (h.query_identity ? 0 : score_dim);
    value_at_ = key_at_ + (h.key_identity ? 0 : score_dim);
    product_count = value_at_ + (transported || h.value_identity ? 0 : value_dim);
    if (h.value_identity) product_count = key_at_ + (h.key_identity ? 0 : score_dim);
    row_products_ = h.value_identity;
    if (row_products_) {
      build_output_map();
      return;
    }
    stacked_stride_ = padded_columns(product_count);
    stacked_t_.assign(d * stacked_stride_, 0.0);
    for (std::size_t b = 0; b < d; ++b) {
      double* row = stacked_t_.data() + b * stacked_stride_;
      for (std::size_t a = 0; a < score_dim; ++a) {
        if (!h.query_identity) row[query_at_ + a] = h.query(Eigen::Index(a), Eigen::Index(b));
        if (!h.key_identity) row[key_at_ + a] = h.key(Eigen::Index(a), Eigen::Index(b));
      }
      if (product_count > value_at_)
        for (std::size_t a = 0; a < value_dim; ++a) row[value_at_ + a] = h.value(Eigen::Index(a), Eigen::Index(b));
    }
    build_output_map();
  }

  /// out[0, product_count) = the head's non-identity products (Q_h y, K_h y, A_h y) of
  /// contents y (d numbers).
  void products(const double* y, double* out) const {
    if (product_count == 0) return;
    if (!row_products_) return sum_columns(stacked_t_.data(), stacked_stride_, product_count, model.d, y, out);
    const int d = int(model.d);
    if (!head.query_identity) kernels::matrix_product(kernels::RowMajorRows{head.query.data(), d}, d, y, out + query_at_);
    if (!head.key_identity) kernels::matrix_product(kernels::RowMajorRows{head.key.data(), d}, d, y, out + key_at_);
  }
  /// The query or key (operand_dim numbers, zero-padded) of a token with contents y and its
  /// products.
  void query(std::size_t token, const double* y, const double* products, double* tmp, double* out) const {
    score_operand(token, head.query_identity ? y : products + query_at_, tmp, out);
  }
  void key(std::size_t token, const double* y, const double* products, double* tmp, double* out) const {
    score_operand(token, head.key_identity ? y : products + key_at_, tmp, out);
  }
  /// z_j (operand_dim numbers) of source `token` with contents y and its products.
  void value(std::size_t token, const double* y, const double* products, double* out) const {
    std::size_t filled = model.d;
    if (transported) {
      model.gauge->apply(token, y, out);
    } else if (head.value_identity) {
      std::copy(y, y + model.d, out);
    } else {
      filled = value_dim;
      std::copy(products + value_at_, products + value_at_ + value_dim, out);
    }
    std::fill(out + filled, out + operand_dim, 0.0);
  }
  /// u (d numbers) from a receiver's normalized sums u_pre (operand_dim numbers; overwritten).
  void output(std::size_t token, double* u_pre, double* u) const {
    const std::size_t d = model.d;
    if (transported) {
      model.gauge->apply_transpose(token, u_pre, u);
      if (output_t_.empty()) return;
      std::copy(u, u + d, u_pre);
      sum_columns(output_t_.data(), output_stride_, d, d, u_pre, u);
    } else if (output_t_.empty()) {
      std::copy(u_pre, u_pre + d, u);
    } else {
      sum_columns(output_t_.data(), output_stride_, d, value_dim, u_pre, u);
    }
  }

 private:
  /// Columns summed side by side: one vector register of the kernel set this file is built for.
#if defined(MFATTN_CPU_ISA_AVX512)
  static constexpr std::size_t kChunk = 8;
#elif defined(MFATTN_CPU_ISA_AVX2) || defined(MFATTN_CPU_ISA_AVX)
  static constexpr std::size_t kChunk = 4;
#else
  static constexpr std::size_t kChunk = 2;
#endif
  /// Rows padded to kChunk columns, or to 4 kChunk above kChunk: a pass then keeps four
  /// independent sums in flight (one would wait on each multiply-add's latency).
  static std::size_t padded_columns(std::size_t columns) {
    const std::size_t unit = columns <= kChunk ? kChunk : 4 * kChunk;
    return (columns + unit - 1) / unit * unit;
  }

  /// out[a] = sum_b m_t[b][a] y[b] for a < columns, b < rows, each sum in b order from 0; m_t
  /// has rows of `stride` numbers (columns padded with zeros: padded_columns). The
  /// sums of a chunk of columns stay in registers (kWidth numbers each pass).
  static void sum_columns(const double* m_t, std::size_t stride, std::size_t columns, std::size_t rows,
                          const double* y, double* out) {
    std::size_t a = 0;
    for (; a + 4 * kChunk <= stride; a += 4 * kChunk) sum_chunk<4 * kChunk>(m_t + a, stride, columns - a, rows, y, out + a);
    for (; a < stride; a += kChunk) sum_chunk<kChunk>(m_t + a, stride, columns - a, rows, y, out + a);
  }
  template <std::size_t kWidth>
  static void sum_chunk(const double* m_t, std::size_t stride, std::size_t left, std::size_t rows,
                        const double* y, double* out) {
    // kChunk doubles as one vector of the compiler's (GCC and clang lower it to the target's
    // registers): each row adds row[a] y[b] to every column's sum at once.
    using Vector = double __attribute__((vector_size(kChunk * sizeof(double))));
    constexpr std::size_t kVectors = kWidth / kChunk;
    Vector sums[kVectors] = {};
    for (std::size_t b = 0; b < rows; ++b) {
      const double* row = m_t + b * stride;
      const Vector yb = Vector{} + y[b];
      for (std::size_t v = 0; v < kVectors; ++v) {
        Vector part;
        std::memcpy(&part, row + v * kChunk, sizeof part);
        sums[v] += part * yb;
      }
    }
    if (left >= kWidth) {
      std::memcpy(out, sums, sizeof sums);
      return;
    }
    double values[kWidth];
    std::memcpy(values, sums, sizeof values);
    for (std::size_t a = 0; a < left; ++a) out[a] = values[a];
  }
  /// The output map: V_h (transported; none where V_h = I) or O_h (plain; none where empty).
  void build_output_map() {
    const bool none = transported ? head.full_value_identity : head.output.size() == 0;
    if (none) return;
    const Matrix& back = transported ? head.full_value : head.output;
    output_stride_ = padded_columns(std::size_t(back.rows()));
    output_t_.assign(std::size_t(back.cols()) * output_stride_, 0.0);
    for (Eigen::Index a = 0; a < back.rows(); ++a)
      for (Eigen::Index b = 0; b < back.cols(); ++b)
        output_t_[std::size_t(b) * output_stride_ + std::size_t(a)] = back(a, b);
  }

  /// out (operand_dim numbers) = G^(r)_token s for the r numbers s; tmp holds r.
  void score_operand(std::size_t token, const double* s, double* tmp, double* out) const {
    const std::size_t r = score_dim;
    if (score_gauge_) {
      std::copy(s, s + r, tmp);
      score_gauge_->apply(token, tmp, out);
    } else {
      std::copy(s, s + r, out);
    }
    std::fill(out + r, out + operand_dim, 0.0);
  }

  const Gauge* score_gauge_;       ///< G (r = d), G^(r) (r < d), or null
  bool row_products_ = false;      ///< products row by row (A_h = I), else stacked
  std::size_t query_at_ = 0, key_at_ = 0, value_at_ = 0;  ///< where each product starts
  std::vector<double> stacked_t_;  ///< d rows of the non-identity (Q_h^T | K_h^T | A_h^T)
  std::vector<double> output_t_;   ///< O_h^T (rv x d), V_h^T (transported), or empty (none)
  std::size_t stacked_stride_ = 0, output_stride_ = 0;
};

/// Every source's operands of one head (HeadOperands) into arrays of n + P rows: queries,
/// keys and values operand_dim numbers a row, presence and log_presence one.
inline void fill_head_operands(const HeadOperands& head, const double* x, double* queries,
                               double* keys, double* values, double* presence,
                               double* log_presence) {
  const Model& model = head.model;
  const std::size_t dim = head.operand_dim, sources = model.n + model.prefix_count();
  std::vector<double> tmp(dim), products(std::max<std::size_t>(head.product_count, 1));
  for (std::size_t j = 0; j < sources; ++j) {
    const double* y = source_content(model, x, j);
    head.products(y, products.data());
    head.query(j, y, products.data(), tmp.data(), queries + j * dim);
    head.key(j, y, products.data(), tmp.data(), keys + j * dim);
    head.value(j, y, products.data(), values + j * dim);
    presence[j] = source_presence(model, j);
    log_presence[j] = kernels::log_presence(presence[j]);
  }
}

/// Every source's operands of one head (HeadOperands) as plain arrays: out.d = operand_dim.
inline void prepare_head_operands(const HeadOperands& head, const double* x, TokenOperands& out) {
  out.resize(head.model.n + head.model.prefix_count(), head.operand_dim);
  fill_head_operands(head, x, out.queries.data(), out.keys.data(), out.values.data(),
                     out.presence.data(), out.log_presence.data());
}

/// f(x_i) of the layer's feed-forward term added to u (d numbers; hidden: its width).
inline void add_feed_forward(const FeedForward& mlp, const double* x, double* hidden, double* u) {
  if (mlp.empty()) return;
  kernels::add_feed_forward(mlp.w1.data(), mlp.b1.data(), mlp.w2.data(), mlp.b2.data(), int(mlp.width()),
                   int(mlp.w1.cols()), mlp.activation, x, hidden, u);
}

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::host
MFATTN_CPU_TARGET_END
