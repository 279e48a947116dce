#pragma once
// Pieces every backend shares: the receiver-side finish of docs/model.md section 2 and the mask.
#include "mfattn/backend.hpp"

#include <cmath>
#include <limits>
#include <string>

namespace mfattn::detail {

/// Visibility m_ij for 1-D positions (k = 1); k > 1 compares the first coordinate for
/// causal masks and the Euclidean distance for windows.
inline bool visible(const Model& model, const double* xi_receiver, const double* xi_source) {
  switch (model.mask) {
    case MaskKind::Full:
      return true;
    case MaskKind::Causal:
      return xi_source[0] <= xi_receiver[0];
    case MaskKind::Window: {
      double dist2 = 0.0;
      for (std::size_t a = 0; a < model.position_dim; ++a) {
        const double diff = xi_source[a] - xi_receiver[a];
        dist2 += diff * diff;
      }
      return dist2 <= model.window * model.window;
    }
  }
  return true;
}

/// Sources are numbered 0..n-1 (tokens that move) then n..n+P-1 (prefix tokens).
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
inline const double* source_content(const Model& model, const double* x, std::size_t source) {
  return source < model.n ? x + source * model.d : model.prefix.data() + (source - model.n) * model.d;
}

/// The per-prompt part of m_ij: a pair with a prefix token is visible only within a prompt.
inline bool prompt_visible(const Model& model, std::size_t receiver, std::size_t source) {
  if (!model.per_prompt_mask || (receiver < model.n && source < model.n)) return true;
  return source_prompt(model, receiver) == source_prompt(model, source);
}

/// The auxiliary factor c_ij = c(xi_i - xi_j) of model.hpp, one pair at a time.
inline double aux_factor_value(const Model& model, const double* xi_receiver,
                               const double* xi_source) {
  double dist2 = 0.0;
  for (std::size_t a = 0; a < model.position_dim; ++a) {
    const double diff = xi_receiver[a] - xi_source[a];
    dist2 += diff * diff;
  }
  switch (model.aux_factor) {
    case AuxFactor::None:
      return 1.0;
    case AuxFactor::Distance:
      return std::exp(-model.aux_lambda * std::sqrt(dist2));
    case AuxFactor::Gaussian:
      return std::exp(-dist2 / (2.0 * model.aux_sigma * model.aux_sigma));
    case AuxFactor::Cosine:
      return std::cos(model.aux_omega * (xi_receiver[0] - xi_source[0]));
  }
  return 1.0;
}

/// Turns the shifted sums of one receiver into its velocity.
///   log_max: running maximum m of the log-weights (-inf: no visible source)
///   weight_sum_shifted = sum_j exp(l_ij - m),  acc = sum_j exp(l_ij - m) z_j  (z-space)
/// Writes v_i = p_i P_{x_i}(u_i) and returns D_i = exp(m - shift) * weight_sum_shifted.
/// mass: model.mass(), computed once per evaluation by the caller. scratch: 2 * d doubles.
double finish_receiver(const Model& model, double mass, std::size_t token, const double* x_i,
                       double log_max,
                       double weight_sum_shifted, const double* acc, double* velocity,
                       double* scratch);

/// The same with scale = receiver_scale(model, log_max) = exp(log_max - shift) given, for
/// callers whose receivers share one log_max.
double finish_receiver(const Model& model, double mass, std::size_t token, const double* x_i,
                       double log_max, double scale, double weight_sum_shifted,
                       const double* acc, double* velocity, double* scratch);
double receiver_scale(const Model& model, double log_max);

}  // namespace mfattn::detail
