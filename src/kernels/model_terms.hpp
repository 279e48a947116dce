#pragma once
// The host side of the kernels layer: a Model's pair terms as kernels::PairTermParameters, and
// the labels of its sources. Sources are numbered 0..n-1 (the tokens that move) then
// n..n+P-1 (the frozen prefix tokens), for positions, prompts, presences and the gauge alike.
#include <algorithm>
#include <cstddef>

#include "kernels/pair_terms.hpp"
#include "mfattn/model.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::kernels {
inline namespace MFATTN_CPU_NAMESPACE {

/// The model's mask, factor and per-prompt rule as plain numbers.
inline PairTermParameters pair_term_parameters(const Model& model) {
  PairTermParameters parameters;
  parameters.mask = model.mask;
  parameters.window_squared = model.window * model.window;
  parameters.factor = model.aux_factor;
  parameters.lambda = model.aux_lambda;
  parameters.inverse_two_sigma2 = 0.5 / (model.aux_sigma * model.aux_sigma);
  if (model.aux_factor == AuxFactor::Cosine) {
    parameters.toeplitz.terms = 1;
    parameters.toeplitz.coefficient[0] = 1.0;
    parameters.toeplitz.frequency[0] = model.aux_omega;
  } else if (model.aux_factor == AuxFactor::Toeplitz) {
    // build_model refuses unequal lists and more than kMaxTerms terms (run.cpp); a Model
    // built otherwise is read no further than its shorter list and the arrays.
    const std::size_t terms = std::min({model.toeplitz_coefficients.size(),
                                        model.toeplitz_frequencies.size(), ToeplitzSeries::kMaxTerms});
    parameters.toeplitz.terms = terms;
    for (std::size_t k = 0; k < terms; ++k) {
      parameters.toeplitz.coefficient[k] = model.toeplitz_coefficients[k];
      parameters.toeplitz.frequency[k] = model.toeplitz_frequencies[k];
    }
  }
  parameters.per_prompt = model.per_prompt_mask;
  return parameters;
}

inline const double* source_position(const Model& model, std::size_t source) {
  return source < model.n ? model.positions.data() + source * model.position_dim
                          : model.prefix_positions.data() + (source - model.n) * model.position_dim;
}
inline int source_prompt(const Model& model, std::size_t source) {
  if (source >= model.n) return model.prefix_prompt_id[source - model.n];
  return model.prompt_id.empty() ? 0 : model.prompt_id[source];
}
inline double source_presence(const Model& model, std::size_t source) {
  return source < model.n ? model.presence[source] : model.prefix_weight;
}
/// x_j of a moving token (from the state x), y_p of a prefix token.
inline const double* source_content(const Model& model, const double* x, std::size_t source) {
  return source < model.n ? x + source * model.d : model.prefix.data() + (source - model.n) * model.d;
}

/// The pair (receiver, source), both numbered as sources, for the scalar formulas.
inline ScalarPair scalar_pair(const Model& model, std::size_t receiver, std::size_t source) {
  return ScalarPair{source_position(model, receiver), source_position(model, source),
                    model.position_dim, double(source_prompt(model, receiver)),
                    double(source_prompt(model, source))};
}

/// The per-prompt rule concerns the pairs that include a prefix token.
inline bool prompt_rule_applies(const Model& model, std::size_t receiver, std::size_t source) {
  return model.per_prompt_mask && (receiver >= model.n || source >= model.n);
}

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::kernels
MFATTN_CPU_TARGET_END
