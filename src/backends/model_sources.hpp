#pragma once
// The kernels' pair terms read from a Model, on the host: the labels of its sources and the
// pair function of kernels/pair_terms.hpp on them (the pair terms are Model::pair_terms, the
// kernels' PairTermParameters). Kept out of src/kernels/, whose headers all compile for a
// device, because a Model (Eigen) does not; in namespace host: the kernels' host side. Sources are numbered 0..n-1 (the tokens that move) then
// n..n+P-1 (the frozen prefix tokens), for positions, prompts, presences and the gauge alike.
#include <cstddef>

#include "kernels/pair_terms.hpp"
#include "mfattn/core/model.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::host {
inline namespace MFATTN_CPU_NAMESPACE {

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
inline kernels::ScalarPair scalar_pair(const Model& model, std::size_t receiver, std::size_t source) {
  return kernels::ScalarPair{source_position(model, receiver), source_position(model, source),
                    model.position_dim, double(source_prompt(model, receiver)),
                    double(source_prompt(model, source))};
}

/// The log-term and multiplier of the pair (receiver, source), both numbered as sources
/// (pair_weight_terms, with the per-prompt rule where the pair has a prefix token).
inline kernels::PairWeightTerms<double> model_pair_weight_terms(const Model& model, std::size_t receiver,
                                                       std::size_t source) {
  return kernels::pair_weight_terms(model.pair_terms, scalar_pair(model, receiver, source),
                           kernels::pair_has_prefix_token(receiver, source, model.n));
}

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::host
MFATTN_CPU_TARGET_END
