#pragma once
// Sinkhorn attention's scaling of one attention matrix, pair by pair (docs/model.md section
// 2d): the reference backend's plan, and the plan whose statistics the attention observables
// take (backend_common.cpp, attention_plan_summaries).
#include <cmath>
#include <cstddef>

#include "backends/model_sources.hpp"
#include "backends/reference/reference_derivatives.hpp"
#include "backends/sinkhorn_scaling.hpp"
#include "backends/token_operands.hpp"
#include "mfattn/core/model.hpp"

namespace mfattn::detail {

/// Sinkhorn attention's scaling of one matrix (a replica's, or a head's), literally: the
/// logits pair by pair and every log-sum-exp from its row's exact maximum.
class ReferenceSinkhorn {
 public:
  /// Scales the matrix of `operands` (every source's query, key and log-presence). threads > 1
  /// spreads each pass's rows or columns over a team of that many (each its own log-sum-exp:
  /// the same bits for any count); the reference backend takes one.
  ReferenceSinkhorn(const Model& model, const host::TokenOperands& operands, int threads = 1)
      : model_(model), operands_(operands), threads_(threads),
        scaling_(
            kernels::SinkhornTerms{std::size_t(model.sinkhorn.sweeps), model.sinkhorn.tolerance}) {
    host::SinkhornSlot& slot = scaling_.slots.emplace_back();
    slot.source_log_presence = operands.log_presence;
    for (std::size_t i = 0; i < model.n; ++i)
      slot.receiver_present.push_back(model.presence[i] > 0.0);
    scaling_.reset();
    scaling_.run(*this);
  }

  /// beta s_ij + log(m_ij c_ij): l_ij without log p_j (-inf for a hidden pair).
  double logit(std::size_t i, std::size_t j) const {
    const kernels::PairWeightTerms<double> terms = host::model_pair_weight_terms(model_, i, j);
    if (!kernels::visible(terms)) return -HUGE_VAL;
    double score = 0.0;
    for (std::size_t c = 0; c < operands_.d; ++c)
      score += operands_.query(i)[c] * operands_.key(j)[c];
    return model_.beta * score + terms.log_term;
  }
  /// P_ij = exp(f_i + l_ij + g_j), the plan's weight of the pair.
  double plan(std::size_t i, std::size_t j) const {
    const host::SinkhornSlot& slot = scaling_.slots.front();
    return std::exp(slot.row_scale[i] + logit(i, j) + slot.row_bias[j]);
  }
  const host::SinkhornSlot& slot() const { return scaling_.slots.front(); }
  /// SA's weight sum D_i of the unscaled weights (the energy's).
  double weight_sum(std::size_t i) const {
    return std::exp(scaling_.slots.front().first_row_lse[i] - model_.exponent_shift());
  }

  // The passes of host::SinkhornScaling.
  void rows(host::SinkhornScaling& scaling) {
    host::SinkhornSlot& slot = scaling.slots.front();
#pragma omp parallel for schedule(dynamic, 16) num_threads(threads_) if (threads_ > 1)
    for (std::size_t i = 0; i < model_.n; ++i)
      scaling.finish_row(slot, i, detail::exact_log_sum_exp(operands_.sources, [&](std::size_t j) {
                           return logit(i, j) + slot.row_bias[j];
                         }));
  }
  void columns(host::SinkhornScaling& scaling) {
    host::SinkhornSlot& slot = scaling.slots.front();
#pragma omp parallel for schedule(dynamic, 16) num_threads(threads_) if (threads_ > 1)
    for (std::size_t j = 0; j < operands_.sources; ++j)
      scaling.finish_column(slot, j, detail::exact_log_sum_exp(model_.n, [&](std::size_t i) {
                              return slot.row_scale[i] + logit(i, j);
                            }));
  }

 private:
  const Model& model_;
  const host::TokenOperands& operands_;
  int threads_;
  host::SinkhornScaling scaling_;
};

}  // namespace mfattn::detail
