#include "mfattn/observables.hpp"

#include <Eigen/Dense>

#include "backends/cpu/vector_math.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace mfattn {

std::vector<std::pair<std::string, std::size_t>> observable_layout(const Model&) {
  return {{"energy", 1}, {"mean_inner", 1}, {"min_inner", 1}, {"max_speed", 1}};
}

namespace {

/// Large d: Gram blocks G = X_I X_J^T (64 rows at a time, j >= i) through Eigen's GEMM.
double min_inner_by_blocks(const double* x, std::size_t d, const std::vector<std::size_t>& moving) {
  using Rows = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const auto m = static_cast<Eigen::Index>(moving.size());
  Rows tokens(m, static_cast<Eigen::Index>(d));
  for (Eigen::Index a = 0; a < m; ++a)
    for (std::size_t c = 0; c < d; ++c) tokens(a, static_cast<Eigen::Index>(c)) = x[moving[a] * d + c];
  constexpr Eigen::Index kRows = 64;
  const Eigen::Index blocks = (m + kRows - 1) / kRows;
  double lowest = 1.0;
#pragma omp parallel for reduction(min : lowest) schedule(dynamic, 1)
  for (Eigen::Index b = 0; b < blocks; ++b) {
    const Eigen::Index first = b * kRows, rows = std::min(kRows, m - first);
    const Rows gram = tokens.middleRows(first, rows) * tokens.middleRows(first, m - first).transpose();
    for (Eigen::Index r = 0; r < rows; ++r)
      for (Eigen::Index c = r + 1; c < m - first; ++c) lowest = std::min(lowest, gram(r, c));
  }
  return lowest;
}

}  // namespace

double min_inner_product(const Model& model, const double* x) {
  const std::size_t n = model.n, d = model.d;
  std::vector<std::size_t> moving;
  for (std::size_t i = 0; i < n; ++i)
    if (model.presence[i] > 0.0) moving.push_back(i);
  const std::size_t m = moving.size();
  if (m < 2) return 1.0;
  if (d > simd::kLanes) return min_inner_by_blocks(x, d, moving);
  // Lanes over tokens: the moving tokens' coordinates as d rows of `stride` numbers.
  constexpr std::size_t kLanes = simd::kLanes;
  const std::size_t stride = (m + kLanes - 1) / kLanes * kLanes;
  std::vector<double> rows(d * stride, 0.0);
  for (std::size_t a = 0; a < m; ++a)
    for (std::size_t c = 0; c < d; ++c) rows[c * stride + a] = x[moving[a] * d + c];
  const auto count = static_cast<std::ptrdiff_t>(m);
  double lowest = 1.0;
  // A minimum does not depend on the order it is taken in, so threads cannot change it.
#pragma omp parallel for reduction(min : lowest) schedule(dynamic, 16) if (m > 512)
  for (std::ptrdiff_t a = 0; a < count; ++a) {
    const auto i = static_cast<std::size_t>(a);
    // Partners j > i: a scalar head up to the next lane boundary, whole lanes, a scalar tail.
    const std::size_t head_end = std::min(m, (i + 1 + kLanes - 1) / kLanes * kLanes);
    const std::size_t body_end = head_end + (m - head_end) / kLanes * kLanes;
    auto scalar = [&](std::size_t j) {
      double inner = 0.0;
      for (std::size_t c = 0; c < d; ++c) inner += rows[c * stride + i] * rows[c * stride + j];
      lowest = std::min(lowest, inner);
    };
    for (std::size_t j = i + 1; j < head_end; ++j) scalar(j);
    simd::Lanes best = simd::broadcast(lowest);
    for (std::size_t j = head_end; j < body_end; j += kLanes) {
      simd::Lanes inner = simd::broadcast(rows[i]) * simd::load(rows.data() + j);
      for (std::size_t c = 1; c < d; ++c)
        inner += simd::broadcast(rows[c * stride + i]) * simd::load(rows.data() + c * stride + j);
      best = inner < best ? inner : best;
    }
    for (std::size_t l = 0; l < kLanes; ++l) lowest = std::min(lowest, best[l]);
    for (std::size_t j = body_end; j < m; ++j) scalar(j);
  }
  return lowest;
}

double mean_inner_product(const Model& model, const double* x) {
  const std::size_t n = model.n, d = model.d;
  std::vector<double> total(d, 0.0);
  std::size_t m = 0;
  double self = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!(model.presence[i] > 0.0)) continue;
    ++m;
    for (std::size_t c = 0; c < d; ++c) {
      total[c] += x[i * d + c];
      self += x[i * d + c] * x[i * d + c];
    }
  }
  if (m < 2) return 1.0;
  double square = 0.0;
  for (double t : total) square += t * t;
  return (square - self) / (double(m) * double(m - 1));
}

std::vector<std::vector<double>> compute_observables(Dynamics& dynamics, const State& state,
                                                     std::vector<double>* velocity_out) {
  const Model& model = dynamics.model();
  const std::size_t R = state.replicas, n = model.n, d = model.d;
  std::vector<double> velocity(state.size()), weight_sums(R * n);
  dynamics.velocity(state.x.data(), velocity.data(), weight_sums.data());
  std::vector<std::vector<double>> values(4, std::vector<double>(R));
  for (std::size_t r = 0; r < R; ++r) {
    const double* x = state.replica(r);
    values[0][r] = energy_from_weight_sums(model, x, weight_sums.data() + r * n);
    values[1][r] = mean_inner_product(model, x);
    values[2][r] = min_inner_product(model, x);
    double fastest = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      double speed2 = 0.0;
      for (std::size_t c = 0; c < d; ++c) speed2 += std::pow(velocity[(r * n + i) * d + c], 2);
      fastest = std::max(fastest, std::sqrt(speed2));
    }
    values[3][r] = fastest;
  }
  if (velocity_out) velocity_out->swap(velocity);
  return values;
}

}  // namespace mfattn
