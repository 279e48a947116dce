#include "mfattn/core/model.hpp"

namespace mfattn {

double Model::mass() const {
  double total = 0.0;
  for (double p : presence) total += p;
  return total + double(prefix_count()) * prefix_weight;
}

bool Model::every_token_present() const {
  for (double p : presence)
    if (p != 1.0) return false;
  return true;
}

bool Model::query_key_identity() const {
  for (const AttentionMatrices& set : matrices)
    if (!set.q_identity || !set.k_identity || set.is_layer()) return false;
  return true;
}

bool Model::is_gradient_flow() const {
  // Section 4: Q = K = V = I, transported values, a symmetric mask and a symmetric factor.
  // Causal masks are not symmetric; noise makes the dynamics stochastic.
  bool value_identity = true;
  for (const AttentionMatrices& set : matrices) value_identity = value_identity && set.v_identity;
  // Sinkhorn's column scaling and the placements other than post change the field.
  if (normalization == Normalization::Sinkhorn || placement != Placement::Post) return false;
  return query_key_identity() && value_identity && values == ValueTransport::Transported &&
         pair_terms.mask != MaskKind::Causal && noise_kappa == 0.0 && beta > 0.0;
}

double presence_from_amplitude(double amplitude, double tau) {
  const double a2 = amplitude * amplitude;
  return a2 / (tau + a2);
}

}  // namespace mfattn
