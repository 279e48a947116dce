#pragma once
// Pieces every backend shares: the receiver-side finish of docs/model.md section 2 (the pair
// terms and the token operands are in src/kernels/).
#include "kernels/receiver_finish.hpp"
#include "mfattn/backends/backend.hpp"

#include <algorithm>
#include <cstddef>
#include <string>

namespace mfattn::detail {

/// Where one receiver's results go: velocity (d numbers) always, attention_output (d
/// numbers, p_i u_i before the projection) when not null.
struct ReceiverOutput {
  double* velocity;
  double* attention_output = nullptr;
  /// false: the caller does not read D_i, so SA without eps_den skips the exp of its scale
  /// (the returned number is then not D_i).
  bool weight_sum_wanted = true;
};

/// Turns the shifted sums of one receiver into its velocity.
///   log_max: running maximum m of the log-weights (-inf: no visible source)
///   weight_sum_shifted = sum_j exp(l_ij - m),  acc = sum_j exp(l_ij - m) z_j  (z-space)
/// Writes v_i = p_i P_{x_i}(u_i), u_i = V G_i^T (acc / normaliser) with V the full value map
/// of the set's one head (a set of one head whose values are the contents, A_h = I:
/// single_head()), and returns D_i = exp(m - shift) * weight_sum_shifted.
/// mass: model.mass(), computed once per evaluation by the caller. scratch: 2 * d doubles.
double finish_receiver(const Model& model, const AttentionMatrices& matrices, double mass,
                       std::size_t token, const double* x_i, double log_max,
                       double weight_sum_shifted, const double* acc, ReceiverOutput out,
                       double* scratch);

/// The same with scale = receiver_scale(model, log_max) = exp(log_max - shift) given, for
/// callers whose receivers share one log_max.
double finish_receiver(const Model& model, const AttentionMatrices& matrices, double mass,
                       std::size_t token, const double* x_i, double log_max, double scale,
                       double weight_sum_shifted, const double* acc, ReceiverOutput out,
                       double* scratch);
double receiver_scale(const Model& model, double log_max);

/// The model's numbers that kernels::finish_sums reads (mass: model.mass()).
kernels::FinishTerms finish_terms(const Model& model, double mass);

/// The message of a USA output that overflows double at exponent log_scale = m - shift.
std::string usa_overflow_message(const Model& model, double log_scale);

}  // namespace mfattn::detail
