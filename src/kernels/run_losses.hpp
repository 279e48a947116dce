#pragma once
// The losses of a run's final state that its gradient takes (docs/model.md section 5b), each
// with its derivative beside it, over one replica's tokens (rows of d numbers):
//   tokens  L = sum_i |x_i - y_i|^2 over the moving tokens (y_i: token i's target),
//           dL/dx_i = 2 (x_i - y_i)
//   mmd     with k(a, b) = exp(gamma <a, b>), the moving tokens x (n of them, weight 1/n) and
//           the target points y (m of them, weight 1/m):
//           L = 1/n^2 sum_ij k(x_i, x_j) - 2/(n m) sum_ij k(x_i, y_j) + 1/m^2 sum_ij k(y_i, y_j)
//           dL/dx_i = 2 gamma / n^2 sum_j k(x_i, x_j) x_j - 2 gamma / (n m) sum_j k(x_i, y_j) y_j
// A token that does not move (p_i = 0) is a label: it is no point of the measure, and its
// cotangent is 0 (moves[i]: 1 where token i moves, else 0). Every sum is taken in index order.
#include <cmath>
#include <cstddef>

#include "kernels/compile_target.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::kernels {
inline namespace MFATTN_CPU_NAMESPACE {

inline double row_dot(const double* a, const double* b, std::size_t d) {
  double sum = 0.0;
  for (std::size_t c = 0; c < d; ++c) sum += a[c] * b[c];
  return sum;
}

/// The tokens loss of n rows x against the rows target; writes dL/dx into cotangent.
inline double tokens_loss(std::size_t n, std::size_t d, const double* x, const double* target,
                          const char* moves, double* cotangent) {
  double loss = 0.0;
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t c = 0; c < d; ++c) {
      const double difference = moves[i] ? x[i * d + c] - target[i * d + c] : 0.0;
      loss += difference * difference;
      cotangent[i * d + c] = 2.0 * difference;
    }
  return loss;
}

/// The mmd loss of the moving rows of x against the m rows of target; writes dL/dx.
inline double mmd_loss(std::size_t n, std::size_t d, const double* x, std::size_t m,
                       const double* target, const char* moves, double gamma, double* cotangent) {
  std::size_t count = 0;
  for (std::size_t i = 0; i < n; ++i) count += moves[i] ? 1 : 0;
  for (std::size_t e = 0; e < n * d; ++e) cotangent[e] = 0.0;
  if (count == 0 || m == 0) return 0.0;
  const double self = 1.0 / (double(count) * double(count)),
               cross = 1.0 / (double(count) * double(m)), targets = 1.0 / (double(m) * double(m));
  double loss = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!moves[i]) continue;
    double* bar = cotangent + i * d;
    for (std::size_t j = 0; j < n; ++j) {
      if (!moves[j]) continue;
      const double k = std::exp(gamma * row_dot(x + i * d, x + j * d, d));
      loss += self * k;
      for (std::size_t c = 0; c < d; ++c) bar[c] += 2.0 * gamma * self * k * x[j * d + c];
    }
    for (std::size_t j = 0; j < m; ++j) {
      const double k = std::exp(gamma * row_dot(x + i * d, target + j * d, d));
      loss -= 2.0 * cross * k;
      for (std::size_t c = 0; c < d; ++c) bar[c] -= 2.0 * gamma * cross * k * target[j * d + c];
    }
  }
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < m; ++j)
      loss += targets * std::exp(gamma * row_dot(target + i * d, target + j * d, d));
  return loss;
}

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::kernels
MFATTN_CPU_TARGET_END
