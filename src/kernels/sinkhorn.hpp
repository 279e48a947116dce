#pragma once
// Sinkhorn attention's scaling (docs/model.md section 2d), the formulas every backend's
// passes read, for the host and a device. For one attention matrix (a replica's, or one head's
// of a layer) with log-weights l_ij = s_ij + log p_j + log(m_ij c_ij) (today's weights, before
// any normalisation), receivers i (moving tokens with p_i > 0) and sources j (moving and prefix
// tokens), the plan is
//   P_ij = exp(f_i + l_ij + g_j),   f_i = log a_i,  g_j = log b_j,
// scaled so that every row sums to 1 and column j to its target share
//   c_j = R p_j / M_J     (R receivers; M_J = sum of p_j over the sources J some receiver sees;
//                          c_j = 0 for a source no receiver sees)
// (uniform presences and no prefix tokens: c_j = 1, a doubly stochastic matrix). Starting from
// g = 0 a sweep scales the columns, then the rows, in log space:
//   column  g_j = log c_j - C_j,   C_j = LSE_i (f_i + l_ij)
//   row     f_i = -L_i,            L_i = LSE_j (l_ij + g_j)
// so the rows always sum to 1 and zero sweeps are SA. Before each sweep the column pass
// measures the current plan's largest column error
//   e = max_j |exp(C_j + g_j) - c_j|
// and the scaling stops once e <= tol (tol > 0) or after max_sweeps sweeps.
#include <cmath>
#include <cstddef>

#include "kernels/compile_target.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::kernels {
inline namespace MFATTN_CPU_NAMESPACE {

/// The options of the scaling: --sinkhorn-iterations and --sinkhorn-tol.
struct SinkhornTerms {
  std::size_t max_sweeps = 100;  ///< K: at most this many sweeps (0: SA)
  double tolerance = 1e-12;      ///< stop once the largest column error is at most this (0: never)
};

/// log c_j = log(R p_j / M_J) of a source that some receiver sees (column_lse finite); -inf
/// for one that none sees or that weighs nothing.
MFATTN_HOST_DEVICE inline double log_column_target(double column_lse, double presence, double receivers,
                                                   double visible_mass) {
  if (column_lse == -__builtin_huge_val() || !(presence > 0.0)) return -__builtin_huge_val();
  return std::log(receivers * presence / visible_mass);
}

/// g_j = log c_j - C_j (-inf for a source with no target: it stays out of every row).
MFATTN_HOST_DEVICE inline double column_scale(double log_target, double column_lse) {
  if (log_target == -__builtin_huge_val()) return -__builtin_huge_val();
  return log_target - column_lse;
}

/// f_i = -L_i (-inf for a receiver that sees no source: its row is empty and it stays still).
MFATTN_HOST_DEVICE inline double row_scale(double row_lse) {
  if (row_lse == -__builtin_huge_val()) return -__builtin_huge_val();
  return -row_lse;
}

/// |column sum - c_j| of source j in the current plan: exp(C_j + g_j) against c_j = exp(log c_j).
MFATTN_HOST_DEVICE inline double column_error(double column_lse, double g, double log_target) {
  const double sum = column_lse == -__builtin_huge_val() || g == -__builtin_huge_val() ? 0.0 : std::exp(column_lse + g);
  const double target = log_target == -__builtin_huge_val() ? 0.0 : std::exp(log_target);
  return std::fabs(sum - target);
}

/// Whether another sweep runs after `sweeps` sweeps whose plan has column error `error`.
MFATTN_HOST_DEVICE inline bool sinkhorn_continues(const SinkhornTerms& terms, std::size_t sweeps, double error) {
  if (sweeps >= terms.max_sweeps) return false;
  return !(terms.tolerance > 0.0 && error <= terms.tolerance);
}

/// One log-sum-exp from a row's maximum m and its shifted sum S = sum exp(l - m): m + log S
/// (-inf for an empty row).
MFATTN_HOST_DEVICE inline double log_sum_exp(double largest, double shifted_sum) {
  if (largest == -__builtin_huge_val()) return largest;
  return largest + std::log(shifted_sum);
}

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::kernels
MFATTN_CPU_TARGET_END
