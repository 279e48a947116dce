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
// gauged_product and source_value are the per-token forms: the CPU backend calls them from its
// threads and packs the results into its panels at once. prepare_token_operands fills plain
// arrays with them, for the reference backend, the energy and the OAttention link.
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
namespace mfattn::kernels {
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
    matrix_product(RowMajorRows{m.data(), int(d)}, int(d), y, tmp);
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

/// Fills `out` for the state x (n rows of d) of a replica whose Q and K are `matrices`; its
/// arrays are reused between calls.
inline void prepare_token_operands(const Model& model, const AttentionMatrices& matrices,
                                   const double* x, TokenOperands& out) {
  const std::size_t d = model.d, sources = model.n + model.prefix_count();
  out.resize(sources, d);
  std::vector<double> tmp(d), gauged(d);
  auto store = [d](const double* from, double* to) { std::copy(from, from + d, to); };
  for (std::size_t j = 0; j < sources; ++j) {
    const double* y = source_content(model, x, j);
    store(gauged_product(model, matrices.q, matrices.q_identity, j, y, tmp.data(), gauged.data()),
          out.queries.data() + j * d);
    store(gauged_product(model, matrices.k, matrices.k_identity, j, y, tmp.data(), gauged.data()),
          out.keys.data() + j * d);
    store(source_value(model, j, y, gauged.data()), out.values.data() + j * d);
    out.presence[j] = source_presence(model, j);
    out.log_presence[j] = log_presence(out.presence[j]);
  }
}

/// The operands of one head of a layer (AttentionHead, docs/model.md section 2b) in the form
/// the pair loops take: the query and key (r numbers, the head gauge G^(r) applied) and the
/// value z_j, each zero-padded to operand_dim numbers, so that the loops of the one head run
/// unchanged on them (the padding adds exact zeros to every logit and sum):
///   z_j = G_j y_j (d numbers; transported values with a gauge)  |  A_h y_j (rv numbers)
/// and the map of a receiver's normalized sums back to R^d, once per receiver:
///   u^(h) = V_h G_i^T u_pre (transported)  |  O_h u_pre (O_h = I when the head has none).
/// The products (Q_h y, K_h y, A_h y) of a token are taken together from the stacked
/// matrices' transpose, each sum in b order from 0 with the components side by side (so that
/// they vectorize); the output map likewise from O_h^T.
class HeadOperands {
 public:
  const Model& model;
  const AttentionHead& head;
  bool transported;                 ///< the values carry the d-dimensional gauge
  std::size_t score_dim, value_dim, operand_dim;
  std::size_t product_count;        ///< r + r (+ rv for values in the head space)

  HeadOperands(const Model& m, const AttentionHead& h)
      : model(m), head(h), transported(m.gauge && m.values == ValueTransport::Transported),
        score_dim(std::size_t(h.query.rows())), value_dim(h.value_dim()),
        operand_dim(std::max(score_dim, transported ? m.d : value_dim)),
        product_count(2 * score_dim + (transported ? 0 : value_dim)) {
    const std::size_t d = m.d;
    stacked_stride_ = padded_columns(product_count);
    stacked_t_.assign(d * stacked_stride_, 0.0);
    for (std::size_t b = 0; b < d; ++b) {
      double* row = stacked_t_.data() + b * stacked_stride_;
      for (std::size_t a = 0; a < score_dim; ++a) {
        row[a] = h.query(Eigen::Index(a), Eigen::Index(b));
        row[score_dim + a] = h.key(Eigen::Index(a), Eigen::Index(b));
      }
      if (!transported)
        for (std::size_t a = 0; a < value_dim; ++a) row[2 * score_dim + a] = h.value(Eigen::Index(a), Eigen::Index(b));
    }
    const Matrix& back = transported ? h.full_value : h.output;
    output_stride_ = padded_columns(std::size_t(back.rows()));
    output_t_.assign(std::size_t(back.cols()) * output_stride_, 0.0);
    for (Eigen::Index a = 0; a < back.rows(); ++a)
      for (Eigen::Index b = 0; b < back.cols(); ++b) output_t_[std::size_t(b) * output_stride_ + std::size_t(a)] = back(a, b);
  }

  /// out[0, product_count) = (Q_h y, K_h y, A_h y) of contents y (d numbers).
  void products(const double* y, double* out) const {
    sum_columns(stacked_t_.data(), stacked_stride_, product_count, model.d, y, out);
  }
  /// The query or key (operand_dim numbers, zero-padded) from a token's products.
  void query(std::size_t token, const double* products, double* tmp, double* out) const {
    score_operand(token, products, tmp, out);
  }
  void key(std::size_t token, const double* products, double* tmp, double* out) const {
    score_operand(token, products + score_dim, tmp, out);
  }
  /// z_j (operand_dim numbers) of source `token` with contents y and its products.
  void value(std::size_t token, const double* y, const double* products, double* out) const {
    std::size_t filled = model.d;
    if (transported) {
      model.gauge->apply(token, y, out);
    } else {
      filled = value_dim;
      std::copy(products + 2 * score_dim, products + 2 * score_dim + value_dim, out);
    }
    std::fill(out + filled, out + operand_dim, 0.0);
  }
  /// u (d numbers) from a receiver's normalized sums u_pre (operand_dim numbers; overwritten).
  void output(std::size_t token, double* u_pre, double* u) const {
    const std::size_t d = model.d;
    if (transported) {
      model.gauge->apply_transpose(token, u_pre, u);
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
  /// out (operand_dim numbers) = G^(r)_token s for the r numbers s; tmp holds r.
  void score_operand(std::size_t token, const double* s, double* tmp, double* out) const {
    const std::size_t r = score_dim;
    if (model.head_gauge) {
      std::copy(s, s + r, tmp);
      model.head_gauge->apply(token, tmp, out);
    } else {
      std::copy(s, s + r, out);
    }
    std::fill(out + r, out + operand_dim, 0.0);
  }

  std::vector<double> stacked_t_;  ///< d rows of (Q_h^T | K_h^T | A_h^T), stacked_stride_ apart
  std::vector<double> output_t_;   ///< O_h^T (rv x d), V_h^T (transported), or empty (O_h = I)
  std::size_t stacked_stride_ = 0, output_stride_ = 0;
};

/// Every source's operands of one head (HeadOperands) as plain arrays: out.d = operand_dim.
inline void prepare_head_operands(const HeadOperands& head, const double* x, TokenOperands& out) {
  const Model& model = head.model;
  const std::size_t dim = head.operand_dim, sources = model.n + model.prefix_count();
  out.resize(sources, dim);
  std::vector<double> tmp(dim), products(head.product_count);
  for (std::size_t j = 0; j < sources; ++j) {
    const double* y = source_content(model, x, j);
    head.products(y, products.data());
    head.query(j, products.data(), tmp.data(), out.queries.data() + j * dim);
    head.key(j, products.data(), tmp.data(), out.keys.data() + j * dim);
    head.value(j, y, products.data(), out.values.data() + j * dim);
    out.presence[j] = source_presence(model, j);
    out.log_presence[j] = log_presence(out.presence[j]);
  }
}

/// f(x_i) of the layer's feed-forward term added to u (d numbers; hidden: its width).
inline void add_feed_forward(const FeedForward& mlp, const double* x, double* hidden, double* u) {
  if (mlp.empty()) return;
  add_feed_forward(mlp.w1.data(), mlp.b1.data(), mlp.w2.data(), mlp.b2.data(), int(mlp.width()),
                   int(mlp.w1.cols()), mlp.activation, x, hidden, u);
}

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::kernels
MFATTN_CPU_TARGET_END
