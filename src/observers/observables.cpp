#include "mfattn/observers/observables.hpp"

#include <Eigen/Dense>
#include <omp.h>

#include "core/cluster_forests.hpp"
#include "mfattn/backends/backend.hpp"

#include <algorithm>
#include <numbers>
#include <functional>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>

namespace mfattn {

bool has_conditional_spread(const Model& model) {
  return model.gauge != nullptr || model.prompts > 1;
}

namespace {
/// The attention statistics' series, in the layout's order (each with _mean, _min, _max).
constexpr const char* kAttentionStatistics[] = {"entropy", "largest_weight", "participation"};
}  // namespace

std::vector<std::pair<std::string, std::size_t>> observable_layout(
    const Model& model, const ObservableSettings& settings) {
  std::vector<std::pair<std::string, std::size_t>> layout{
      {"energy", 1},          {"mean_inner", 1},          {"min_inner", 1},
      {"max_speed", 1},       {"clustered_pair_fraction", 1}, {"n_clusters", 1},
      {"order_parameter", 1}, {"moment_eigenvalues", model.d}, {"effective_rank", 1},
      {"marginal_spread", 1}};
  if (has_conditional_spread(model)) layout.emplace_back("conditional_spread", 1);
  // States in R^d (docs/model.md section 2c): the others are taken on the directions N(x_i).
  if (!model.on_sphere()) {
    layout.emplace_back("mean_radius", 1);
    layout.emplace_back("max_radius", 1);
  }
  // Sinkhorn attention (section 2d): how far the frame's scaling got.
  if (model.normalization == Normalization::Sinkhorn) {
    layout.emplace_back("sinkhorn_column_error", 1);
    layout.emplace_back("sinkhorn_sweeps", 1);
  }
  if (settings.attention)
    for (const char* statistic : kAttentionStatistics)
      for (const char* of : {"_mean", "_min", "_max"})
        layout.emplace_back(std::string("attention_") + statistic + of,
                            model.matrices_of(0).heads.size());
  return layout;
}

std::vector<std::pair<std::string, std::size_t>> observable_layout(const Model& model) {
  return observable_layout(model, ObservableSettings{});
}

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// Large d: Gram blocks G = X_I X_J^T (64 rows at a time, j >= i) through Eigen's GEMM.
/// kStats: also count close pairs and unite cluster edges.
template <bool kStats>
PairStatistics pairs_by_blocks(const double* x, std::size_t d, const std::vector<std::size_t>& moving,
                               const ObservableSettings& settings) {
  using Rows = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const auto m = static_cast<Eigen::Index>(moving.size());
  Rows tokens(m, static_cast<Eigen::Index>(d));
  for (Eigen::Index a = 0; a < m; ++a)
    for (std::size_t c = 0; c < d; ++c) tokens(a, static_cast<Eigen::Index>(c)) = x[moving[a] * d + c];
  constexpr Eigen::Index kRows = 64;
  const Eigen::Index blocks = (m + kRows - 1) / kRows;
  const double close_above = 1.0 - settings.pair_delta, edge_above = 1.0 - settings.cluster_delta;
  ThreadForests forests(kStats ? moving.size() : 0, 0);
  double lowest = 1.0;
  std::int64_t close = 0;
#pragma omp parallel for reduction(min : lowest) reduction(+ : close) schedule(dynamic, 1)
  for (Eigen::Index b = 0; b < blocks; ++b) {
    const Eigen::Index first = b * kRows, rows = std::min(kRows, m - first);
    const Rows gram = tokens.middleRows(first, rows) * tokens.middleRows(first, m - first).transpose();
    for (Eigen::Index r = 0; r < rows; ++r) {
      double highest = -2.0;
      for (Eigen::Index c = r + 1; c < m - first; ++c) {
        const double inner = gram(r, c);
        lowest = std::min(lowest, inner);
        if constexpr (kStats) {
          close += inner > close_above;
          highest = std::max(highest, inner);
        }
      }
      if constexpr (kStats) {
        if (highest > edge_above) {
          auto& slot = forests.local();
          if (!slot.forest->whole())
            unite_row(*slot.forest, static_cast<std::uint32_t>(first + r), gram.row(r).data(),
                      static_cast<std::size_t>(first), static_cast<std::size_t>(r + 1),
                      static_cast<std::size_t>(m - first), edge_above, slot.scratch);
        }
      }
    }
  }
  PairStatistics stats;
  stats.min_inner = lowest;
  if constexpr (kStats) {
    stats.close_pairs = close;
    stats.clusters = forests.components();
  }
  return stats;
}

/// Whether every row of `moving` is a unit vector (to 1e-9): the circle's sorted pass needs it.
bool unit_rows(const double* x, std::size_t d, const std::vector<std::size_t>& moving) {
  for (std::size_t i : moving) {
    double norm2 = 0.0;
    for (std::size_t c = 0; c < d; ++c) norm2 += x[i * d + c] * x[i * d + c];
    if (!(std::fabs(norm2 - 1.0) <= 1e-9)) return false;
  }
  return true;
}

/// The pair pass over `moving` (indices of rows of x): min <x_i, x_j> and, with kStats, the
/// close-pair count and the cluster components. d <= 8 runs in the CPU kernel set this
/// process uses (cpu_pair_statistics), larger d through Eigen's GEMM; unit tokens on the
/// circle beyond kSortedCircleTokens by their sorted angles (circle_pair_statistics), on S^2
/// beyond kSphereTreeTokens by a k-d tree (sphere_pair_statistics).
template <bool kStats>
PairStatistics pair_pass(const double* x, std::size_t d, const std::vector<std::size_t>& moving,
                         const ObservableSettings& settings) {
  if (d == 2 && moving.size() > kSortedCircleTokens && unit_rows(x, d, moving))
    return circle_pair_statistics(x, moving, settings);
  if (d == 3 && moving.size() > kSphereTreeTokens && unit_rows(x, d, moving))
    return sphere_pair_statistics(x, moving, settings, kStats);
  if (d <= kLanePairStatisticsDimensions)
    return cpu_pair_statistics(x, d, moving, 1.0 - settings.pair_delta, 1.0 - settings.cluster_delta, kStats);
  const std::size_t m = moving.size();
  PairStatistics stats;
  stats.pairs = static_cast<std::int64_t>(m * (m > 0 ? m - 1 : 0) / 2);
  stats.clusters = m;
  if (m < 2) return stats;
  PairStatistics blocks = pairs_by_blocks<kStats>(x, d, moving, settings);
  blocks.pairs = stats.pairs;
  if constexpr (!kStats) blocks.clusters = m;
  return blocks;
}

}  // namespace

PairStatistics circle_pair_statistics(const double* x, const std::vector<std::size_t>& moving,
                                      const ObservableSettings& settings) {
  const std::size_t m = moving.size();
  PairStatistics stats;
  stats.pairs = static_cast<std::int64_t>(m * (m > 0 ? m - 1 : 0) / 2);
  stats.clusters = m;
  if (m < 2) return stats;
  // The tokens in angle order; every predicate below is the pass's own, on inner products.
  std::vector<std::pair<double, std::size_t>> by_angle(m);
  for (std::size_t a = 0; a < m; ++a) {
    const double* u = x + moving[a] * 2;
    by_angle[a] = {std::atan2(u[1], u[0]), moving[a]};
  }
  std::sort(by_angle.begin(), by_angle.end());
  auto inner = [&](std::size_t a, std::size_t b) {
    const double* u = x + by_angle[a % m].second * 2;
    const double* v = x + by_angle[b % m].second * 2;
    return u[0] * v[0] + u[1] * v[1];
  };
  const double close_above = 1.0 - settings.pair_delta, edge_above = 1.0 - settings.cluster_delta;
  // Clusters: two tokens joined by an edge have every token between them (on the shorter arc)
  // joined to its neighbour, so the components are the arcs between the consecutive pairs that
  // are not edges.
  std::size_t breaks = 0;
  for (std::size_t a = 0; a < m; ++a) breaks += inner(a, a + 1) > edge_above ? 0 : 1;
  stats.clusters = breaks == 0 ? 1 : breaks;
  // Close pairs: for each token those ahead of it in angle order by less than half a turn
  // (the angle unwrapped past the end of the order), within the threshold: each pair once.
  // A pointer that only moves forward counts them.
  auto less_than_half_a_turn = [&](std::size_t a, std::size_t b) {
    const double offset = by_angle[b % m].first - by_angle[a].first +
                          (b >= m ? 2.0 * std::numbers::pi : 0.0);
    return offset < std::numbers::pi;
  };
  std::int64_t close = 0;
  std::size_t ahead = 1;
  double lowest = 1.0;
  for (std::size_t a = 0; a < m; ++a) {
    if (ahead < a + 1) ahead = a + 1;
    while (ahead < a + m && less_than_half_a_turn(a, ahead) && inner(a, ahead) > close_above)
      ++ahead;
    close += static_cast<std::int64_t>(ahead - a - 1);
    // The most nearly opposite token: about half a turn ahead; its neighbours in angle order
    // are the candidates (binary search on the angles, the inner products decide).
    const double opposite = by_angle[a].first + std::numbers::pi;
    const auto at = std::lower_bound(
        by_angle.begin(), by_angle.end(),
        std::pair<double, std::size_t>{
            opposite > std::numbers::pi ? opposite - 2 * std::numbers::pi : opposite, 0});
    const std::size_t centre = std::size_t(at - by_angle.begin());
    for (std::size_t offset = 0; offset < 4; ++offset) {
      const std::size_t b = (centre + m + offset - 2) % m;
      if (b != a) lowest = std::min(lowest, inner(a, b));
    }
  }
  stats.close_pairs = close;
  stats.min_inner = lowest;
  return stats;
}

namespace {

std::vector<std::size_t> moving_tokens(const Model& model) {
  std::vector<std::size_t> moving;
  for (std::size_t i = 0; i < model.n; ++i)
    if (model.presence[i] > 0.0) moving.push_back(i);
  return moving;
}

/// 1 - largest eigenvalue of (1/m) sum y y^T over m rows (NaN for m = 0).
double spread_of(const double* rows, std::size_t m, std::size_t d) {
  return 1.0 - second_moment_eigenvalues(rows, m, d).front();
}

/// sum_g m_g (1 - lambda_1(C_g)) / m with C_g the second moment of y_i = G(xi_i) x_i over the
/// moving tokens of prompt g.
double conditional_spread(const Model& model, const double* x, const std::vector<std::size_t>& moving) {
  const std::size_t d = model.d, m = moving.size();
  if (m == 0) return kNaN;
  auto prompt_of = [&](std::size_t i) -> std::size_t {
    return model.prompt_id.empty() ? 0 : static_cast<std::size_t>(std::max(0, model.prompt_id[i]));
  };
  std::size_t groups = std::max<std::size_t>(1, model.prompts);
  for (std::size_t i : moving) groups = std::max(groups, prompt_of(i) + 1);
  std::vector<std::vector<double>> rows(groups);
  std::vector<double> y(d);
  for (std::size_t i : moving) {
    const double* xi = x + i * d;
    if (model.gauge) model.gauge->apply(i, xi, y.data());
    else std::copy(xi, xi + d, y.begin());
    rows[prompt_of(i)].insert(rows[prompt_of(i)].end(), y.begin(), y.end());
  }
  double weighted = 0.0;
  for (const auto& group : rows) {
    const std::size_t count = group.size() / d;
    if (count > 0) weighted += double(count) * spread_of(group.data(), count, d);
  }
  return weighted / double(m);
}

}  // namespace

PairStatistics pair_statistics(const double* x, std::size_t d, const std::vector<std::size_t>& tokens,
                               const ObservableSettings& settings) {
  return pair_pass<true>(x, d, tokens, settings);
}

namespace {

/// The eigenvalues of C = (1/m) sum_a y_a y_a^T, descending, by Eigen's self-adjoint solver;
/// kDim = d (fixed: no allocation, the same algorithm) or Eigen::Dynamic.
template <int kDim>
std::vector<double> moment_eigenvalues(const double* rows, std::size_t m, std::size_t d) {
  using Moment = Eigen::Matrix<double, kDim, kDim>;
  const auto size = static_cast<Eigen::Index>(d);
  // Summed token by token in a fixed order (the upper triangle, mirrored).
  Moment moment = Moment::Zero(size, size);
  for (std::size_t a = 0; a < m; ++a) {
    const double* y = rows + a * d;
    for (std::size_t r = 0; r < d; ++r)
      for (std::size_t c = r; c < d; ++c)
        moment(static_cast<Eigen::Index>(r), static_cast<Eigen::Index>(c)) += y[r] * y[c];
  }
  for (std::size_t r = 0; r < d; ++r)
    for (std::size_t c = r; c < d; ++c) {
      const auto ri = static_cast<Eigen::Index>(r), ci = static_cast<Eigen::Index>(c);
      moment(ri, ci) /= double(m);
      moment(ci, ri) = moment(ri, ci);
    }
  const Eigen::SelfAdjointEigenSolver<Moment> solver(moment, Eigen::EigenvaluesOnly);
  std::vector<double> eigenvalues(solver.eigenvalues().data(), solver.eigenvalues().data() + d);
  std::reverse(eigenvalues.begin(), eigenvalues.end());  // Eigen gives them ascending
  return eigenvalues;
}

/// The same eigenvalues from the m x m Gram matrix (1/m) Y Y^T when there are fewer rows than
/// dimensions (m < d): C = (1/m) Y^T Y has the Gram matrix's eigenvalues and d - m zeros.
/// O(m^2 d + m^3) instead of O(m d^2 + d^3): a run at d = 2048 with a few tokens spent seconds
/// per frame in the d x d solver.
std::vector<double> gram_eigenvalues(const double* rows, std::size_t m, std::size_t d) {
  const auto size = static_cast<Eigen::Index>(m);
  Eigen::MatrixXd gram(size, size);
  for (std::size_t a = 0; a < m; ++a)
    for (std::size_t b = a; b < m; ++b) {
      double inner = 0.0;
      for (std::size_t c = 0; c < d; ++c) inner += rows[a * d + c] * rows[b * d + c];
      const auto ai = static_cast<Eigen::Index>(a), bi = static_cast<Eigen::Index>(b);
      gram(ai, bi) = gram(bi, ai) = inner / double(m);
    }
  const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> solver(gram, Eigen::EigenvaluesOnly);
  std::vector<double> eigenvalues(d, 0.0);
  for (std::size_t a = 0; a < m; ++a) eigenvalues[a] = solver.eigenvalues()[static_cast<Eigen::Index>(a)];
  // Descending, the d - m zeros among them (a rounding-level eigenvalue of the Gram matrix may
  // be slightly negative and then goes after them).
  std::sort(eigenvalues.begin(), eigenvalues.end(), std::greater<>());
  return eigenvalues;
}

}  // namespace

std::vector<double> second_moment_eigenvalues(const double* rows, std::size_t m, std::size_t d) {
  if (m == 0) return std::vector<double>(d, kNaN);
  if (d == 2) {
    // [[a, b], [b, c]] in closed form: (a + c) / 2 -+ hypot((a - c) / 2, b), to an absolute
    // error of a few ulp of the trace, as the iterative solver's (and no allocation per call:
    // the reference code's ensembles are thousands of d = 2 systems per frame).
    double a = 0.0, b = 0.0, c = 0.0;
    for (std::size_t t = 0; t < m; ++t) {
      const double* y = rows + t * 2;
      a += y[0] * y[0];
      b += y[0] * y[1];
      c += y[1] * y[1];
    }
    a /= double(m);
    b /= double(m);
    c /= double(m);
    const double mean = 0.5 * (a + c), radius = std::hypot(0.5 * (a - c), b);
    return {mean + radius, mean - radius};
  }
  if (d == 3) return moment_eigenvalues<3>(rows, m, d);
  if (d == 4) return moment_eigenvalues<4>(rows, m, d);
  if (m < d) return gram_eigenvalues(rows, m, d);
  return moment_eigenvalues<Eigen::Dynamic>(rows, m, d);
}

double effective_rank(const std::vector<double>& eigenvalues) {
  double total = 0.0;
  for (double lambda : eigenvalues) {
    if (std::isnan(lambda)) return kNaN;
    total += std::max(lambda, 0.0);
  }
  if (!(total > 0.0)) return kNaN;
  double entropy = 0.0;
  for (double lambda : eigenvalues) {
    const double q = std::max(lambda, 0.0) / total;
    if (q > 0.0) entropy -= q * std::log(q);
  }
  return std::exp(entropy);
}

double min_inner_product(const Model& model, const double* x) {
  return pair_pass<false>(x, model.d, moving_tokens(model), ObservableSettings{}).min_inner;
}

double mean_inner_product(const Model& model, const double* x) {
  const std::size_t n = model.n, d = model.d;
  // No allocation per replica and frame for the usual d (thousands of small systems).
  double small[16] = {};
  std::vector<double> large(d > 16 ? d : 0, 0.0);
  double* total = d > 16 ? large.data() : small;
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
  for (std::size_t c = 0; c < d; ++c) square += total[c] * total[c];
  return (square - self) / (double(m) * double(m - 1));
}

std::vector<std::vector<double>> compute_observables(Dynamics& dynamics, const State& state,
                                                     std::vector<double>* velocity_out) {
  return compute_observables(dynamics, state, ObservableSettings{}, velocity_out);
}

std::vector<std::vector<double>> compute_observables(Dynamics& dynamics, const State& state,
                                                     const ObservableSettings& settings,
                                                     std::vector<double>* velocity_out) {
  const Model& model = dynamics.model();
  const std::size_t R = state.replicas, n = model.n, d = model.d;
  std::vector<double> velocity(state.size()), weight_sums(R * n);
  dynamics.velocity(state.x.data(), velocity.data(), weight_sums.data());
  const auto layout = observable_layout(model, settings);
  std::vector<std::vector<double>> values;
  for (const auto& [name, components] : layout) values.emplace_back(R * components);
  const bool conditional = has_conditional_spread(model);
  const std::vector<std::size_t> moving = moving_tokens(model);
  const std::size_t m = moving.size();
  std::vector<double> gathered(m * d), mean(d), directions;
  auto position_of = [&](const std::string& name) {
    return std::size_t(std::find_if(layout.begin(), layout.end(), [&](const auto& entry) { return entry.first == name; }) -
                       layout.begin());
  };
  const std::size_t radius_values = position_of("mean_radius");
  for (std::size_t r = 0; r < R; ++r) {
    const double* x = state.replica(r);
    const double* read = x;  // the states the layer reads: the directions for pre and peri
    if (!model.on_sphere()) {
      // The directions N(x_i) of states in R^d, and their radii over the moving tokens.
      directions.assign(x, x + n * d);
      double radius_sum = 0.0, largest = 0.0;
      for (std::size_t i : moving) {
        double norm2 = 0.0;
        for (std::size_t c = 0; c < d; ++c) norm2 += x[i * d + c] * x[i * d + c];
        radius_sum += std::sqrt(norm2);
        largest = std::max(largest, norm2);
      }
      take_directions(n, d, directions.data());
      values[radius_values][r] = m > 0 ? radius_sum / double(m) : kNaN;
      values[radius_values + 1][r] = std::sqrt(largest);
      if (placement_reads_directions(model.placement)) read = directions.data();
      x = directions.data();
    }
    // The energy and the attention plans are those of the states the layer read.
    values[0][r] = energy_from_weight_sums(model, read, weight_sums.data() + r * n, r);
    if (settings.attention) {
      const std::size_t first = position_of("attention_entropy_mean"), heads = layout[first].second;
      const std::vector<PlanSummary> summaries = attention_plan_summaries(model, read, r);
      for (std::size_t h = 0; h < heads; ++h) {
        const double* statistics[] = {summaries[h].entropy, summaries[h].largest_weight,
                                      summaries[h].participation};
        for (std::size_t k = 0; k < std::size(statistics); ++k)
          for (std::size_t of = 0; of < 3; ++of)
            values[first + 3 * k + of][r * heads + h] = statistics[k][of];
      }
    }
    values[1][r] = mean_inner_product(model, x);
    const PairStatistics pairs = pair_statistics(x, d, moving, settings);
    values[2][r] = pairs.min_inner;
    // One root for the largest squared speed: sqrt is correctly rounded, hence monotone, so
    // this is the largest of the speeds' roots.
    double fastest2 = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      double speed2 = 0.0;
      for (std::size_t c = 0; c < d; ++c) speed2 += std::pow(velocity[(r * n + i) * d + c], 2);
      fastest2 = std::max(fastest2, speed2);
    }
    values[3][r] = std::sqrt(fastest2);
    values[4][r] = pairs.pairs > 0 ? double(pairs.close_pairs) / double(pairs.pairs) : 1.0;
    values[5][r] = double(pairs.clusters);
    for (std::size_t a = 0; a < m; ++a)
      std::copy(x + moving[a] * d, x + (moving[a] + 1) * d, gathered.begin() + static_cast<std::ptrdiff_t>(a * d));
    std::fill(mean.begin(), mean.end(), 0.0);
    for (std::size_t a = 0; a < m; ++a)
      for (std::size_t c = 0; c < d; ++c) mean[c] += gathered[a * d + c];
    double norm2 = 0.0;
    for (double component : mean) norm2 += component * component;
    values[6][r] = m > 0 ? std::sqrt(norm2) / double(m) : kNaN;
    const std::vector<double> eigenvalues = second_moment_eigenvalues(gathered.data(), m, d);
    std::copy(eigenvalues.begin(), eigenvalues.end(), values[7].begin() + static_cast<std::ptrdiff_t>(r * d));
    values[8][r] = effective_rank(eigenvalues);
    values[9][r] = 1.0 - eigenvalues.front();
    if (conditional) values[10][r] = conditional_spread(model, x, moving);
  }
  if (model.normalization == Normalization::Sinkhorn) {
    const ScalingReport report = dynamics.last_scaling();
    const std::size_t error_values = position_of("sinkhorn_column_error");
    for (std::size_t r = 0; r < R; ++r) {
      values[error_values][r] = r < report.column_error.size() ? report.column_error[r] : kNaN;
      values[error_values + 1][r] = r < report.sweeps.size() ? report.sweeps[r] : kNaN;
    }
  }
  if (velocity_out) velocity_out->swap(velocity);
  return values;
}

}  // namespace mfattn
