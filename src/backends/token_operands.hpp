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
};

/// Fills `out` for the state x (n rows of d) of a replica whose Q and K are `matrices`; its
/// arrays are reused between calls.
inline void prepare_token_operands(const Model& model, const AttentionMatrices& matrices,
                                   const double* x, TokenOperands& out) {
  const std::size_t d = model.d, sources = model.n + model.prefix_count();
  out.sources = sources;
  out.d = d;
  out.queries.resize(sources * d);
  out.keys.resize(sources * d);
  out.values.resize(sources * d);
  out.presence.resize(sources);
  out.log_presence.resize(sources);
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

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::kernels
MFATTN_CPU_TARGET_END
