#include "mfattn/core/model.hpp"

#include <map>
#include <mutex>

namespace mfattn {

double Model::mass() const {
  double total = 0.0;
  for (double p : presence) total += p;
  return total + double(prefix_count()) * prefix_weight;
}

bool Model::one_head_of_contents() const {
  for (std::size_t r = 0; r < matrix_set_count(); ++r) {
    const AttentionMatrices& set = matrices_of(r);
    if (!set.single_head() || !set.heads.front().value_identity || set.heads.front().score_dim() != d) return false;
  }
  return true;
}

bool Model::every_token_present() const {
  for (double p : presence)
    if (p != 1.0) return false;
  return true;
}

bool Model::query_key_identity() const {
  for (const AttentionMatrices& set : matrices)
    if (!set.single_head() || !set.heads.front().query_identity || !set.heads.front().key_identity) return false;
  return true;
}

bool Model::is_gradient_flow() const {
  // Section 4: Q = K = V = I, transported values, a symmetric mask and a symmetric factor.
  // Causal masks are not symmetric; noise makes the dynamics stochastic.
  bool value_identity = true;
  for (const AttentionMatrices& set : matrices)
    value_identity = value_identity && set.single_head() && set.heads.front().full_value_identity;
  // Sinkhorn's column scaling and the placements other than post change the field.
  if (normalization == Normalization::Sinkhorn || placement != Placement::Post) return false;
  return query_key_identity() && value_identity && values == ValueTransport::Transported &&
         !is_causal(pair_terms.mask) && noise_kappa == 0.0 && common_noise == 0.0 && beta != 0.0;
}

AttentionHead square_head(Matrix q, bool q_identity, Matrix k, bool k_identity, Matrix v, bool v_identity) {
  AttentionHead head;
  const Eigen::Index d = q.cols();
  head.query = std::move(q);
  head.key = std::move(k);
  head.query_identity = q_identity;
  head.key_identity = k_identity;
  head.value = Matrix::Identity(d, d);
  head.value_identity = true;
  head.full_value = v;
  head.full_value_identity = v_identity;
  // O_h = V (the values summed as they are, V applied once per receiver); none for V = I.
  if (!v_identity) head.output = std::move(v);
  return head;
}

const AttentionMatrices& identity_attention_of_dimension(std::size_t d) {
  // std::map keeps each set where it is while others are added.
  static std::mutex mutex;
  static std::map<std::size_t, AttentionMatrices> sets;
  const std::lock_guard<std::mutex> lock(mutex);
  auto found = sets.find(d);
  if (found == sets.end()) found = sets.emplace(d, identity_attention(d)).first;
  return found->second;
}

AttentionMatrices identity_attention(std::size_t d) {
  const auto n = Eigen::Index(d);
  AttentionMatrices set;
  set.heads.push_back(square_head(Matrix::Identity(n, n), true, Matrix::Identity(n, n), true, Matrix::Identity(n, n), true));
  return set;
}

double presence_from_amplitude(double amplitude, double tau) {
  const double a2 = amplitude * amplitude;
  return a2 / (tau + a2);
}

}  // namespace mfattn
