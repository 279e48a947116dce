#pragma once
// The losses of a run's final state that its gradient takes (docs/model.md section 5b), each
// with its derivative beside it, over one replica's tokens (rows of d numbers):
//   tokens  L = sum_i |x_i - y_i|^2 over the moving tokens (y_i: token i's target),
//           dL/dx_i = 2 (x_i - y_i)
//   mmd     with k(a, b) = exp(gamma <a, b>), the moving tokens x (n of them, weight 1/n) and
//           the target points y (m of them, weight 1/m):
//           L = 1/n^2 sum_ij k(x_i, x_j) - 2/(n m) sum_ij k(x_i, y_j) + 1/m^2 sum_ij k(y_i, y_j)
//           dL/dx_i = 2 gamma / n^2 sum_j k(x_i, x_j) x_j - 2 gamma / (n m) sum_j k(x_i, y_j) y_j
//   w2      the squared Wasserstein-2 distance of the n moving tokens and n target points, each
//           of weight 1/n, exact by assignment: L = 1/n sum_i |x_i - y_sigma(i)|^2, sigma the
//           assignment of least cost (Hungarian, O(n^3)); dL/dx_i = 2/n (x_i - y_sigma(i)) (sigma
//           is locally constant: the gradient wherever the optimal assignment is unique)
//   energy  the energy distance of the empirical measures (Euclidean |a - b| in R^d):
//           L = 2/(n m) sum_ij |x_i - y_j| - 1/n^2 sum_ij |x_i - x_j| - 1/m^2 sum_ij |y_i - y_j|
//           dL/dx_i = 2/(n m) sum_j u(x_i - y_j) - 2/n^2 sum_j u(x_i - x_j), u(v) = v / |v|
//           (0 at v = 0: a subgradient where two points coincide)
//   sinkhorn the Sinkhorn divergence of cost c(a, b) = |a - b|^2 and blur epsilon:
//           S = OT(x, y) - 1/2 OT(x, x) - 1/2 OT(y, y), OT(a, b) = <alpha, f> + <beta, g> at the
//           fixed point of f_i = -eps log sum_j b_j exp((g_j - c_ij) / eps) and its mirror
//           (log-domain, the self terms symmetrised), so that
//           dS/dx_i = sum_j P_ij 2 (x_i - y_j) - sum_j Q_ij 2 (x_i - x_j),
//           P_ij = a_i b_j exp((f_i + g_j - c_ij) / eps) the plan of (x, y), Q that of (x, x)
//           (the envelope theorem: the potentials' own derivatives drop out at the fixed point,
//           reached to rounding: sinkhorn_potentials' tolerance)
// A token that does not move (p_i = 0) is a label: it is no point of the measure, and its
// cotangent is 0 (moves[i]: 1 where token i moves, else 0). Every sum is taken in index order.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

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

/// The moving rows of x packed (`rows`: their indices), with the cotangent zeroed: where
/// every distance of measures starts.
struct MovingPoints {
  std::vector<std::size_t> rows;
  std::vector<double> points;
  MovingPoints(std::size_t n, std::size_t d, const double* x, const char* moves,
               double* cotangent) {
    for (std::size_t i = 0; i < n; ++i)
      if (moves[i]) {
        rows.push_back(i);
        points.insert(points.end(), x + i * d, x + (i + 1) * d);
      }
    for (std::size_t e = 0; e < n * d; ++e) cotangent[e] = 0.0;
  }
  std::size_t count() const { return rows.size(); }
};

inline double squared_distance(const double* a, const double* b, std::size_t d) {
  double sum = 0.0;
  for (std::size_t c = 0; c < d; ++c) sum += (a[c] - b[c]) * (a[c] - b[c]);
  return sum;
}

/// The assignment of least total cost of an n x n cost matrix (row-major): column of each row.
/// The shortest augmenting path method with potentials (Hungarian, O(n^3)).
inline std::vector<std::size_t> least_cost_assignment(std::size_t n,
                                                      const std::vector<double>& cost) {
  const double infinity = std::numeric_limits<double>::infinity();
  // 1-based rows and columns; row_of[j] is the row assigned to column j (0: none).
  std::vector<double> u(n + 1, 0.0), v(n + 1, 0.0);
  std::vector<std::size_t> row_of(n + 1, 0), way(n + 1, 0);
  for (std::size_t i = 1; i <= n; ++i) {
    row_of[0] = i;
    std::size_t column = 0;
    std::vector<double> least(n + 1, infinity);
    std::vector<char> used(n + 1, 0);
    do {
      used[column] = 1;
      const std::size_t row = row_of[column];
      double delta = infinity;
      std::size_t next = 0;
      for (std::size_t j = 1; j <= n; ++j) {
        if (used[j]) continue;
        const double reduced = cost[(row - 1) * n + (j - 1)] - u[row] - v[j];
        if (reduced < least[j]) {
          least[j] = reduced;
          way[j] = column;
        }
        if (least[j] < delta) {
          delta = least[j];
          next = j;
        }
      }
      for (std::size_t j = 0; j <= n; ++j) {
        if (used[j]) {
          u[row_of[j]] += delta;
          v[j] -= delta;
        } else {
          least[j] -= delta;
        }
      }
      column = next;
    } while (row_of[column] != 0);
    do {
      const std::size_t previous = way[column];
      row_of[column] = row_of[previous];
      column = previous;
    } while (column != 0);
  }
  std::vector<std::size_t> column_of(n, 0);
  for (std::size_t j = 1; j <= n; ++j) column_of[row_of[j] - 1] = j - 1;
  return column_of;
}

/// The w2 loss of the moving rows of x against the m = (moving rows) target rows.
inline double w2_loss(std::size_t n, std::size_t d, const double* x, std::size_t m,
                      const double* target, const char* moves, double* cotangent) {
  const MovingPoints moving(n, d, x, moves, cotangent);
  const std::vector<std::size_t>& rows = moving.rows;
  const std::vector<double>& points = moving.points;
  const std::size_t count = moving.count();
  if (count != m)
    throw std::invalid_argument("target: " + std::to_string(m) +
                                " points; the w2 loss takes as many as the moving "
                                "tokens (" +
                                std::to_string(count) + ")");
  if (count == 0) return 0.0;
  std::vector<double> cost(count * count);
  for (std::size_t i = 0; i < count; ++i)
    for (std::size_t j = 0; j < count; ++j)
      cost[i * count + j] = squared_distance(&points[i * d], target + j * d, d);
  const std::vector<std::size_t> assigned = least_cost_assignment(count, cost);
  double loss = 0.0;
  const double weight = 1.0 / double(count);
  for (std::size_t i = 0; i < count; ++i) {
    loss += weight * cost[i * count + assigned[i]];
    for (std::size_t c = 0; c < d; ++c)
      cotangent[rows[i] * d + c] = 2.0 * weight * (points[i * d + c] - target[assigned[i] * d + c]);
  }
  return loss;
}

/// sum_j |a_i - b_j| over the m rows b, and its gradient in a_i added (times `scale`) to bar.
inline double distance_sum(const double* a, std::size_t m, const double* b, std::size_t d,
                           double scale, double* bar) {
  double sum = 0.0;
  for (std::size_t j = 0; j < m; ++j) {
    const double distance = std::sqrt(squared_distance(a, b + j * d, d));
    sum += distance;
    if (distance > 0.0)
      for (std::size_t c = 0; c < d; ++c) bar[c] += scale * (a[c] - b[j * d + c]) / distance;
  }
  return sum;
}

/// The energy loss of the moving rows of x against the m rows of target.
inline double energy_loss(std::size_t n, std::size_t d, const double* x, std::size_t m,
                          const double* target, const char* moves, double* cotangent) {
  const MovingPoints tokens(n, d, x, moves, cotangent);
  if (tokens.count() == 0 || m == 0) return 0.0;
  const double cross = 2.0 / (double(tokens.count()) * double(m)),
               self = 1.0 / (double(tokens.count()) * double(tokens.count()));
  double loss = 0.0;
  for (std::size_t i = 0; i < tokens.count(); ++i) {
    const double* at = &tokens.points[i * d];
    double* bar = cotangent + tokens.rows[i] * d;
    loss += cross * distance_sum(at, m, target, d, cross, bar);
    loss -= self * distance_sum(at, tokens.count(), tokens.points.data(), d, -2.0 * self, bar);
  }
  std::vector<double> unused(d);
  for (std::size_t i = 0; i < m; ++i)
    loss -= distance_sum(target + i * d, m, target, d, 0.0, unused.data()) /
            (double(m) * double(m));
  return loss;
}

/// log sum_j exp(values_j), stable.
inline double log_sum_exp(const std::vector<double>& values) {
  double top = -std::numeric_limits<double>::infinity();
  for (double v : values) top = std::max(top, v);
  if (!std::isfinite(top)) return top;
  double sum = 0.0;
  for (double v : values) sum += std::exp(v - top);
  return top + std::log(sum);
}

/// The Sinkhorn iterations' iteration cap and stopping rule: the potentials' largest change,
/// over max(1, their largest magnitude), at most kSinkhornLossTolerance.
inline constexpr int kSinkhornLossIterations = 100000;
inline constexpr double kSinkhornLossTolerance = 1e-14;

/// The dual potentials (f on the n points a, g on the m points b, uniform weights) of entropic
/// OT with cost |a - b|^2 and blur eps, by log-domain Sinkhorn; `symmetric` (a = b): the
/// averaged iteration f <- (f + T(f)) / 2, whose fixed point is the symmetric one. Returns
/// OT = <alpha, f> + <beta, g>. Throws std::runtime_error when it does not converge.
inline double sinkhorn_potentials(std::size_t n, const double* a, std::size_t m, const double* b,
                                  std::size_t d, double eps, bool symmetric, std::vector<double>& f,
                                  std::vector<double>& g) {
  std::vector<double> cost(n * m);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < m; ++j) cost[i * m + j] = squared_distance(a + i * d, b + j * d, d);
  const double log_a = -std::log(double(n)), log_b = -std::log(double(m));
  f.assign(n, 0.0);
  g.assign(m, 0.0);
  std::vector<double> terms(std::max(n, m));
  auto update_f =
      [&](std::vector<double>& out) {  // f_i = -eps log sum_j b_j exp((g_j - c_ij) / eps)
        out.resize(n);
        terms.resize(m);
        for (std::size_t i = 0; i < n; ++i) {
          for (std::size_t j = 0; j < m; ++j) terms[j] = log_b + (g[j] - cost[i * m + j]) / eps;
          out[i] = -eps * log_sum_exp(terms);
        }
      };
  auto update_g = [&](std::vector<double>& out) {
    out.resize(m);
    terms.resize(n);
    for (std::size_t j = 0; j < m; ++j) {
      for (std::size_t i = 0; i < n; ++i) terms[i] = log_a + (f[i] - cost[i * m + j]) / eps;
      out[j] = -eps * log_sum_exp(terms);
    }
  };
  std::vector<double> next;
  for (int iteration = 0; iteration < kSinkhornLossIterations; ++iteration) {
    double change = 0.0, size = 1.0;
    update_f(next);
    if (symmetric)
      for (std::size_t i = 0; i < n; ++i) next[i] = 0.5 * (f[i] + next[i]);
    for (std::size_t i = 0; i < n; ++i) {
      change = std::max(change, std::fabs(next[i] - f[i]));
      size = std::max(size, std::fabs(next[i]));
    }
    f.swap(next);
    if (symmetric) {
      g = f;
    } else {
      update_g(next);
      for (std::size_t j = 0; j < m; ++j) {
        change = std::max(change, std::fabs(next[j] - g[j]));
        size = std::max(size, std::fabs(next[j]));
      }
      g.swap(next);
    }
    if (change <= kSinkhornLossTolerance * size) {
      double total = 0.0;
      for (double e : f) total += e / double(n);
      for (double e : g) total += e / double(m);
      return total;
    }
  }
  throw std::runtime_error("the sinkhorn loss's iterations did not converge in " +
                           std::to_string(kSinkhornLossIterations) +
                           " (take a larger loss epsilon)");
}

/// The sinkhorn loss of the moving rows of x against the m rows of target, blur eps.
inline double sinkhorn_loss(std::size_t n, std::size_t d, const double* x, std::size_t m,
                            const double* target, const char* moves, double eps,
                            double* cotangent) {
  const MovingPoints moving(n, d, x, moves, cotangent);
  const std::vector<std::size_t>& rows = moving.rows;
  const std::vector<double>& points = moving.points;
  const std::size_t count = moving.count();
  if (count == 0 || m == 0) return 0.0;
  std::vector<double> f, g, p, q, s, t;
  const double cross = sinkhorn_potentials(count, points.data(), m, target, d, eps, false, f, g);
  const double own = sinkhorn_potentials(count, points.data(), count, points.data(), d, eps, true,
                                         p, q);
  const double theirs = sinkhorn_potentials(m, target, m, target, d, eps, true, s, t);
  const double log_a = -std::log(double(count)), log_b = -std::log(double(m));
  for (std::size_t i = 0; i < count; ++i) {
    double* bar = cotangent + rows[i] * d;
    const double* xi = &points[i * d];
    for (std::size_t j = 0; j < m; ++j) {
      const double plan = std::exp(log_a + log_b +
                                   (f[i] + g[j] - squared_distance(xi, target + j * d, d)) / eps);
      for (std::size_t c = 0; c < d; ++c) bar[c] += plan * 2.0 * (xi[c] - target[j * d + c]);
    }
    for (std::size_t j = 0; j < count; ++j) {
      const double plan = std::exp(2.0 * log_a +
                                   (p[i] + p[j] - squared_distance(xi, &points[j * d], d)) / eps);
      for (std::size_t c = 0; c < d; ++c) bar[c] -= plan * 2.0 * (xi[c] - points[j * d + c]);
    }
  }
  return cross - 0.5 * own - 0.5 * theirs;
}

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::kernels
MFATTN_CPU_TARGET_END
