#pragma once
// The receiver's finish of docs/model.md section 2, written once for the host and a CUDA
// device: from one receiver's shifted sums
//   S = sum_j exp(l_ij - m),   A = sum_j exp(l_ij - m) z_j        (m = log_max, the offset)
// to its velocity
//   USA: u_pre = exp(m - shift) A / M          SA: u_pre = A / (S + eps_den / exp(m - shift))
//   u = V G_i^T u_pre (transported values) | V u_pre (plain),   v_i = p_i (u - <x_i, u> x_i)
// and its weight sum D_i = exp(m - shift) S. Where exp(m - shift) overflows although the
// result need not, the products are taken in log space. A USA output that overflows double is
// reported (FinishOutcome::overflow) for the caller to raise.
//
// The gauge's transpose is the caller's (the CPU backends apply Model::gauge, the CUDA
// resident kernel a dense G_i), passed as transpose_gauge(in, out) -> bool (false: nothing
// applied). detail::finish_receiver (backends/backend_common.cpp) and the CUDA backend's
// resident kernel (backends/cuda/resident_steps.hpp) both call finish_sums.
#include <cmath>

#include "kernels/compile_target.hpp"
#include "kernels/token_formulas.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::kernels {
inline namespace MFATTN_CPU_NAMESPACE {

/// The Cauchy-Schwarz offset of a receiver whose query has squared norm query_norm2:
///   B_i = |q_i| max_j |k_j| + bias_bound  >=  max_j l_ij,   l_ij = <q_i, k_j> + b_j + log m_ij c_ij
/// (bias_bound = max(0, max_j b_j): a prefix weight above 1 is the only positive bias), so that
/// every shifted term exp(l_ij - B_i) is at most 1; attained for Q = K = I. In the units of the
/// logit (natural, or base 2 where queries and biases carry log2(e)). Real: double, float
/// promoted to double, or a CPU lane type (its sqrt found beside it).
template <class Real>
MFATTN_HOST_DEVICE inline Real cauchy_schwarz_offset(const Real& query_norm2, double largest_key, double bias_bound) {
  using std::sqrt;
  return sqrt(query_norm2) * largest_key + bias_bound;
}

// The steps of the finish, each written once and templated on the number type: double (the
// scalar finish below, a CUDA thread) or a CPU lane type (the small-system loop finishes eight
// receivers at once with the same lines, cpu_backend.cpp).

/// u_pre from the shifted sums where the scale and the result are finite:
///   USA: u_pre = (scale / M) A          SA: u_pre = A / (S + eps_den / scale)
template <class Real>
MFATTN_HOST_DEVICE inline void normalized_sums(bool usa, double mass, double eps_den, const Real& scale,
                                               const Real& weight_sum_shifted, const Real* acc, int d,
                                               Real* u_pre) {
  if (usa) {
    const Real factor = scale / mass;
    for (int c = 0; c < d; ++c) u_pre[c] = factor * acc[c];
  } else {
    // eps_den is compared with the true weight sum: eps + scale * S = scale * (eps/scale + S).
    const Real denominator = eps_den > 0.0 ? weight_sum_shifted + eps_den / scale : weight_sum_shifted;
    for (int c = 0; c < d; ++c) u_pre[c] = acc[c] / denominator;
  }
}

/// v_i = p_i (u - <x_i, u> x_i), the tangent projection P_{x_i} of the attention output, and
/// p_i u where attention_output is given (not null).
template <class Real>
MFATTN_HOST_DEVICE inline void tangent_velocity(const Real& p_i, int d, const Real* x_i, const Real* u,
                                                Real* velocity, Real* attention_output) {
  Real radial{};
  for (int c = 0; c < d; ++c) radial += x_i[c] * u[c];
  for (int c = 0; c < d; ++c) velocity[c] = p_i * (u[c] - radial * x_i[c]);
  if (attention_output)
    for (int c = 0; c < d; ++c) attention_output[c] = p_i * u[c];
}

/// The model's numbers that the finish reads.
struct FinishTerms {
  bool usa = true;              ///< USA (else SA)
  double exponent_shift = 0.0;  ///< beta in rescaled time, 0 in natural time
  double eps_den = 0.0;         ///< SA's denominator epsilon
  double mass = 1.0;            ///< M = sum_j p_j (USA's normaliser)
};

/// What finish_sums reports besides the velocity.
struct FinishOutcome {
  double weight_sum = 0.0;  ///< D_i = exp(m - shift) S
  bool overflow = false;    ///< a USA output overflowed double (the velocity is then not written)
  double log_scale = 0.0;   ///< m - shift, for the overflow's message
};

/// Whether a finish needs the scale exp(m - shift): USA's output, eps_den's share and D_i;
/// SA without eps_den needs it for D_i only.
MFATTN_HOST_DEVICE inline bool finish_needs_scale(const FinishTerms& terms, bool weight_sum_wanted) {
  return weight_sum_wanted || terms.usa || terms.eps_den > 0.0;
}

/// The first steps of the finish: D_i into outcome.weight_sum and, where the receiver moves,
/// u_pre (d numbers: the weighted average of the z_j, or USA's weighted sum over M). Returns
/// false where it does not: no visible source (log_max = -inf), p_i = 0, or a USA output that
/// overflows double (outcome.overflow; u_pre is then not finite). scale: as in finish_sums.
MFATTN_HOST_DEVICE inline bool normalized_receiver_sums(const FinishTerms& terms, double p_i, int d,
                                                        double log_max, double scale,
                                                        double weight_sum_shifted, const double* acc,
                                                        double* u_pre, FinishOutcome& outcome) {
  // No source with weight is visible: the receiver does not move.
  if (log_max == -__builtin_huge_val()) return false;
  // True weights are exp(log_max - shift) times the shifted ones; the sums are combined in
  // log space where the plain product would overflow although the result does not.
  const double log_scale = log_max - terms.exponent_shift;
  outcome.log_scale = log_scale;
  outcome.weight_sum = std::isfinite(scale) ? scale * weight_sum_shifted
                                            : std::exp(log_scale + std::log(weight_sum_shifted));
  // A null receiver does not move, whatever its sums.
  if (p_i == 0.0) return false;
  if (terms.usa && !std::isfinite(scale / terms.mass)) {
    for (int c = 0; c < d; ++c)
      u_pre[c] = std::copysign(std::exp(log_scale + std::log(std::fabs(acc[c]) / terms.mass)), acc[c]);
  } else {
    normalized_sums(terms.usa, terms.mass, terms.eps_den, scale, weight_sum_shifted, acc, d, u_pre);
  }
  if (terms.usa) {
    bool finite = true;
    for (int c = 0; c < d; ++c) finite = finite && std::isfinite(u_pre[c]);
    outcome.overflow = !finite;
    return finite;
  }
  return true;
}

/// The finish of one receiver (see the file comment). log_max = -inf: no visible source, the
/// receiver stays. scale: exp(log_max - shift) (any value where finish_needs_scale is false).
/// v: V row-major (d x d), null for the identity. velocity and attention_output (p_i u, may be
/// null) take d numbers; scratch 2 d.
template <class TransposeGauge>
MFATTN_HOST_DEVICE inline FinishOutcome finish_sums(const FinishTerms& terms, double p_i, int d,
                                                    const double* x_i, double log_max, double scale,
                                                    double weight_sum_shifted, const double* acc,
                                                    const double* v, double* velocity,
                                                    double* attention_output, double* scratch,
                                                    TransposeGauge&& transpose_gauge) {
  FinishOutcome outcome;
  double* u_pre = scratch;
  double* u = scratch + d;
  if (!normalized_receiver_sums(terms, p_i, d, log_max, scale, weight_sum_shifted, acc, u_pre, outcome)) {
    if (outcome.overflow) return outcome;
    for (int c = 0; c < d; ++c) velocity[c] = 0.0;
    if (attention_output)
      for (int c = 0; c < d; ++c) attention_output[c] = 0.0;
    return outcome;
  }
  // u = V G_i^T u_pre (transported values) or V u_pre (plain values).
  const double* rotated = u_pre;
  if (transpose_gauge(static_cast<const double*>(u_pre), u))
    for (int c = 0; c < d; ++c) u_pre[c] = u[c];
  if (v) {
    matrix_product(RowMajorRows{v, d}, d, rotated, u);
    rotated = u;
  }
  tangent_velocity(p_i, d, x_i, rotated, velocity, attention_output);
  return outcome;
}

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::kernels
MFATTN_CPU_TARGET_END
