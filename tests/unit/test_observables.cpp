// Observables against a brute-force recomputation over the moving tokens.
#include "mfattn/observers/observables.hpp"

#include <omp.h>

#include "mfattn/core/rng.hpp"
#include "mfattn/io/series.hpp"

#include <Eigen/Dense>

#include <deque>
#include <numbers>
#include <numeric>
#include <random>

#include "test_support.hpp"

namespace mfattn {
namespace {

TEST(Observables, MinAndMeanInnerProductMatchBruteForce) {
  for (const std::string d : {"2", "3", "8", "9", "64"})
    for (const std::string n : {"1", "2", "9", "64", "65", "130", "600"}) {
      const auto cfg = testing::config({"--n", n, "--d", d, "--null-tokens", "5", "--amplitudes",
                                        "0.8", "--init", "clustered", "--seed", "3"});
      const Model model = build_model(cfg);
      const State state = build_initial_state(cfg, model);
      const double* x = state.replica(0);
      const std::size_t tokens = std::stoul(n), dim = std::stoul(d);
      double lowest = 1.0, total = 0.0;
      for (std::size_t i = 0; i < tokens; ++i)
        for (std::size_t j = 0; j < tokens; ++j) {
          if (i == j) continue;
          double inner = 0.0;
          for (std::size_t c = 0; c < dim; ++c) inner += x[i * dim + c] * x[j * dim + c];
          lowest = std::min(lowest, inner);
          total += inner;
        }
      const double mean = tokens > 1 ? total / double(tokens * (tokens - 1)) : 1.0;
      EXPECT_NEAR(min_inner_product(model, x), lowest, 1e-14) << "n " << n << " d " << d;
      EXPECT_NEAR(mean_inner_product(model, x), mean, 1e-12) << "n " << n << " d " << d;
    }
}

/// compute_observables at one state, through a fresh CPU backend.
std::vector<std::vector<double>> observe(const Model& model, const State& state,
                                         const ObservableSettings& settings = {}) {
  auto backend = make_backend("cpu", model, BackendOptions{1});
  Dynamics dynamics(model, *backend, state.replicas);
  return compute_observables(dynamics, state, settings);
}

/// Index of an observable in the layout (fails the test when absent).
std::size_t slot(const Model& model, const std::string& name) {
  const auto layout = observable_layout(model);
  for (std::size_t o = 0; o < layout.size(); ++o)
    if (layout[o].first == name) return o;
  ADD_FAILURE() << "no observable " << name;
  return 0;
}

/// The observables of section 6 recomputed from their definitions, one replica.
struct Expected {
  double min_inner = 1.0, pair_fraction = 1.0, order = 0.0, rank = 0.0, marginal = 0.0;
  double conditional = 0.0;
  std::size_t clusters = 0;
  std::vector<double> eigenvalues;
};

/// 1 - largest eigenvalue and the descending eigenvalues of (1/m) sum y y^T (plain loops).
std::vector<double> descending_moment_eigenvalues(const std::vector<std::vector<double>>& rows,
                                                  std::size_t d) {
  Eigen::MatrixXd moment = Eigen::MatrixXd::Zero(Eigen::Index(d), Eigen::Index(d));
  for (const auto& y : rows)
    for (std::size_t r = 0; r < d; ++r)
      for (std::size_t c = 0; c < d; ++c) moment(Eigen::Index(r), Eigen::Index(c)) += y[r] * y[c] / double(rows.size());
  const Eigen::VectorXd values = Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd>(moment).eigenvalues();
  std::vector<double> sorted(values.data(), values.data() + d);
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  return sorted;
}

Expected recompute(const Model& model, const double* x, const ObservableSettings& settings = {}) {
  const std::size_t d = model.d;
  std::vector<std::size_t> moving;
  for (std::size_t i = 0; i < model.n; ++i)
    if (model.presence[i] > 0.0) moving.push_back(i);
  const std::size_t m = moving.size();
  auto inner = [&](std::size_t a, std::size_t b) {
    double sum = 0.0;
    for (std::size_t c = 0; c < d; ++c) sum += x[moving[a] * d + c] * x[moving[b] * d + c];
    return sum;
  };
  Expected e;
  std::size_t close = 0;
  std::vector<std::vector<std::size_t>> neighbours(m);
  for (std::size_t a = 0; a < m; ++a)
    for (std::size_t b = a + 1; b < m; ++b) {
      const double s = inner(a, b);
      e.min_inner = std::min(e.min_inner, s);
      if (s > 1.0 - settings.pair_delta) ++close;
      if (s > 1.0 - settings.cluster_delta) {
        neighbours[a].push_back(b);
        neighbours[b].push_back(a);
      }
    }
  if (m > 1) e.pair_fraction = double(close) / (double(m) * double(m - 1) / 2.0);
  // Components by breadth-first search.
  std::vector<bool> seen(m, false);
  for (std::size_t start = 0; start < m; ++start) {
    if (seen[start]) continue;
    ++e.clusters;
    std::deque<std::size_t> queue{start};
    seen[start] = true;
    while (!queue.empty()) {
      const std::size_t a = queue.front();
      queue.pop_front();
      for (std::size_t b : neighbours[a])
        if (!seen[b]) {
          seen[b] = true;
          queue.push_back(b);
        }
    }
  }
  std::vector<double> mean(d, 0.0);
  std::vector<std::vector<double>> rows;
  for (std::size_t i : moving) {
    rows.emplace_back(x + i * d, x + (i + 1) * d);
    for (std::size_t c = 0; c < d; ++c) mean[c] += x[i * d + c] / double(m);
  }
  e.order = std::sqrt(std::inner_product(mean.begin(), mean.end(), mean.begin(), 0.0));
  e.eigenvalues = descending_moment_eigenvalues(rows, d);
  double total = 0.0, entropy = 0.0;
  for (double lambda : e.eigenvalues) total += std::max(lambda, 0.0);
  for (double lambda : e.eigenvalues) {
    const double q = std::max(lambda, 0.0) / total;
    if (q > 0.0) entropy -= q * std::log(q);
  }
  e.rank = std::exp(entropy);
  e.marginal = 1.0 - e.eigenvalues.front();
  // Conditional spread: per prompt, the spread of y = G(xi) x, weighted by the prompt's size.
  std::vector<std::vector<std::vector<double>>> by_prompt(std::max<std::size_t>(model.prompts, 1));
  for (std::size_t i : moving) {
    std::vector<double> y(x + i * d, x + (i + 1) * d);
    if (model.gauge) model.gauge->apply(i, x + i * d, y.data());
    const std::size_t g = model.prompt_id.empty() ? 0 : std::size_t(model.prompt_id[i]);
    by_prompt.at(g).push_back(y);
  }
  for (const auto& group : by_prompt)
    if (!group.empty())
      e.conditional += double(group.size()) / double(m) *
                       (1.0 - descending_moment_eigenvalues(group, d).front());
  return e;
}

/// Compares every observable of replica r with the recomputation.
void expect_matches(const Model& model, const std::vector<std::vector<double>>& values,
                    std::size_t r, const Expected& e, const std::string& where) {
  const std::size_t d = model.d;
  EXPECT_NEAR(values[slot(model, "min_inner")][r], e.min_inner, 1e-12) << where;
  EXPECT_EQ(values[slot(model, "clustered_pair_fraction")][r], e.pair_fraction) << where;
  EXPECT_EQ(values[slot(model, "n_clusters")][r], double(e.clusters)) << where;
  EXPECT_NEAR(values[slot(model, "order_parameter")][r], e.order, 1e-12) << where;
  for (std::size_t c = 0; c < d; ++c)
    EXPECT_NEAR(values[slot(model, "moment_eigenvalues")][r * d + c], e.eigenvalues[c], 1e-12)
        << where << " eigenvalue " << c;
  EXPECT_NEAR(values[slot(model, "effective_rank")][r], e.rank, 1e-12) << where;
  EXPECT_NEAR(values[slot(model, "marginal_spread")][r], e.marginal, 1e-12) << where;
  if (has_conditional_spread(model)) {
    EXPECT_NEAR(values[slot(model, "conditional_spread")][r], e.conditional, 1e-12) << where;
  }
}

TEST(Observables, LayoutNamesEveryObservableOfSectionSix) {
  const Model plain = build_model(testing::config({"--d", "4"}));
  const std::vector<std::pair<std::string, std::size_t>> expected{
      {"energy", 1},          {"mean_inner", 1},          {"min_inner", 1},
      {"max_speed", 1},       {"clustered_pair_fraction", 1}, {"n_clusters", 1},
      {"order_parameter", 1}, {"moment_eigenvalues", 4},  {"effective_rank", 1},
      {"marginal_spread", 1}};
  EXPECT_EQ(observable_layout(plain), expected);
  EXPECT_EQ(observable_layout(plain, ObservableSettings{0.5, 0.25}), expected);
  EXPECT_FALSE(has_conditional_spread(plain));
  // A gauge or more than one prompt makes the labels matter: conditional_spread is added.
  const Model rope = build_model(testing::config({"--d", "4", "--geometry", "rope"}));
  ASSERT_TRUE(has_conditional_spread(rope));
  EXPECT_EQ(observable_layout(rope).back(), (std::pair<std::string, std::size_t>{"conditional_spread", 1}));
  Model prompts = plain;
  prompts.prompts = 2;
  EXPECT_EQ(observable_layout(prompts).size(), expected.size() + 1);
}

// Every observable of every frame of short runs (small and large d, null tokens, several
// replicas, a gauge) against the recomputation from the stored positions.
TEST(Observables, EveryObservableMatchesRecomputationAlongRuns) {
  const std::vector<std::vector<std::string>> cases = {
      {"--n", "40", "--d", "3", "--init", "clustered", "--init-clusters", "3", "--init-spread", "0.02",
       "--null-tokens", "3", "--amplitudes", "0.8", "--replicas", "2", "--beta", "4", "--time-scale", "rescaled"},
      {"--n", "30", "--d", "2", "--init", "clustered", "--init-clusters", "2", "--init-spread", "0.01"},
      {"--n", "50", "--d", "9", "--init", "clustered", "--init-clusters", "4", "--init-spread", "0.005",
       "--null-tokens", "2"},
      {"--n", "32", "--d", "4", "--geometry", "rope", "--kernel", "sa"},
      {"--n", "600", "--d", "3", "--init", "clustered", "--init-clusters", "5", "--init-spread", "0.01",
       "--beta", "9", "--kernel", "sa"},
  };
  for (auto args : cases) {
    args.insert(args.end(), {"--horizon", "2", "--save-every", "0.5"});
    const auto t = testing::simulate(testing::config(args));
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    for (const State& frame : t.frames) {
      const auto values = observe(t.model, frame);
      for (std::size_t r = 0; r < frame.replicas; ++r)
        expect_matches(t.model, values, r, recompute(t.model, frame.replica(r)),
                       joined + "t = " + std::to_string(frame.time) + " replica " + std::to_string(r));
    }
  }
}

// Prompts without a gauge: the conditional spread is the size-weighted mean of the prompts'
// own spreads, 0 when each prompt sits at one point while the prompts differ.
TEST(Observables, ConditionalSpreadTakesEachPromptSeparately) {
  Model model = build_model(testing::config({"--n", "6", "--d", "3"}));
  model.prompts = 2;
  model.prompt_id = {0, 0, 0, 1, 1, 1};
  State state(1, 6, 3);
  for (std::size_t i = 0; i < 6; ++i) state.token(0, i)[i < 3 ? 0 : 1] = 1.0;
  auto values = observe(model, state);
  EXPECT_EQ(values[slot(model, "conditional_spread")][0], 0.0);
  EXPECT_NEAR(values[slot(model, "marginal_spread")][0], 0.5, 1e-15);
  // Move one token of prompt 1 to the z axis: that prompt's spread is 1/3, weighted 3/6.
  state.token(0, 5)[1] = 0.0;
  state.token(0, 5)[2] = 1.0;
  values = observe(model, state);
  EXPECT_NEAR(values[slot(model, "conditional_spread")][0], 1.0 / 6.0, 1e-15);
  expect_matches(model, values, 0, recompute(model, state.replica(0)), "prompts");
}

/// n = 3 * per_cluster + 2 active tokens (three tight clusters and one pair that is close for
/// delta but not for delta_c) plus one null token on the pair's midpoint, in dimension d.
State constructed_clusters(std::size_t per_cluster, std::size_t d, std::uint64_t seed) {
  const std::size_t n = 3 * per_cluster + 2;
  State state(1, n + 1, d);
  std::uint64_t bits = seed;
  auto noise = [&] {  // a small deterministic perturbation in [-1e-4, 1e-4]
    bits = bits * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double(bits >> 11) / 9007199254740992.0 - 0.5) * 2e-4;
  };
  auto put = [&](std::size_t i, std::vector<double> direction) {
    double norm2 = 0.0;
    for (double& v : direction) norm2 += v * v;
    for (std::size_t c = 0; c < d; ++c) state.token(0, i)[c] = direction[c] / std::sqrt(norm2);
  };
  const double centres[3][3] = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}};
  for (std::size_t k = 0; k < 3; ++k)
    for (std::size_t a = 0; a < per_cluster; ++a) {
      std::vector<double> direction(d);
      for (std::size_t c = 0; c < d; ++c) direction[c] = (c < 3 ? centres[k][c] : 0.0) + noise();
      put(k * per_cluster + a, direction);
    }
  // The pair: rotations of e = (-1, 1, 0) / sqrt(2) by +-theta/2 towards z, so that
  // <p, q> = cos(theta) = 1 - 3e-4 and the midpoint e is within 1e-4 of both.
  const double theta = std::acos(1.0 - 3e-4);
  const double e[3] = {-std::sqrt(0.5), std::sqrt(0.5), 0.0};
  std::vector<double> p(d, 0.0), q(d, 0.0), mid(d, 0.0);
  for (std::size_t c = 0; c < 3; ++c) {
    const double z = c == 2 ? 1.0 : 0.0;
    p[c] = std::cos(theta / 2) * e[c] + std::sin(theta / 2) * z;
    q[c] = std::cos(theta / 2) * e[c] - std::sin(theta / 2) * z;
    mid[c] = e[c];
  }
  put(n - 2, p);
  put(n - 1, q);
  put(n, mid);  // the null token
  return state;
}

// Three tight clusters, a pair at 1 - <x, y> = 3e-4 and a null token that would bridge the
// pair if null tokens counted: clusters and close pairs are known exactly, in the lanes path
// (d = 3), the Gram-block path (d = 9) and the threaded path (m > 512).
TEST(Observables, ConstructedClustersAreCountedExactly) {
  for (const std::size_t d : {3u, 9u})
    for (const std::size_t per_cluster : {5u, 7u, 200u}) {
      const std::size_t n = 3 * per_cluster + 2;
      const Model model = build_model(testing::config(
          {"--n", std::to_string(n), "--d", std::to_string(d), "--null-tokens", "1"}));
      ASSERT_EQ(model.n, n + 1);
      const State state = constructed_clusters(per_cluster, d, 7 + d);
      const std::string where = "d " + std::to_string(d) + " per cluster " + std::to_string(per_cluster);
      const double pairs = double(n) * double(n - 1) / 2.0;
      const double close = 3.0 * double(per_cluster * (per_cluster - 1) / 2) + 1.0;
      auto values = observe(model, state);
      EXPECT_EQ(values[slot(model, "n_clusters")][0], 5.0) << where;
      EXPECT_EQ(values[slot(model, "clustered_pair_fraction")][0], close / pairs) << where;
      EXPECT_NEAR(values[slot(model, "min_inner")][0], -std::sqrt(0.5), 1e-3) << where;
      expect_matches(model, values, 0, recompute(model, state.replica(0)), where);
      // delta_c = 1e-3 joins the pair; delta = 1e-9 keeps only some pairs within the clusters.
      const ObservableSettings loose{1e-9, 1e-3};
      values = observe(model, state, loose);
      EXPECT_EQ(values[slot(model, "n_clusters")][0], 4.0) << where;
      expect_matches(model, values, 0, recompute(model, state.replica(0), loose), where + " loose");
      // Clusters only from the moving tokens: with the null token counted the pair would merge.
      std::vector<std::size_t> all(n + 1);
      std::iota(all.begin(), all.end(), 0);
      EXPECT_EQ(pair_statistics(state.x.data(), d, all).clusters, 4u) << where;
      all.pop_back();
      const PairStatistics stats = pair_statistics(state.x.data(), d, all);
      EXPECT_EQ(stats.clusters, 5u) << where;
      EXPECT_EQ(double(stats.close_pairs), close) << where;
      EXPECT_EQ(double(stats.pairs), pairs) << where;
    }
}

// The pair pass's components (bit sets up to 1024 tokens, with its shortcut for a lower
// triangle with one root) against a union-find over every pair, on states made to meet each
// path: one tight cluster, a chain whose links are shuffled (a token's only neighbours may
// come after it), a chain plus a far token, and loose random clusters.
TEST(Observables, PairPassComponentsMatchAUnionFindOverEveryPair) {
  const ObservableSettings settings{1e-3, 1e-3};
  const double edge_above = 1.0 - settings.cluster_delta, close_above = 1.0 - settings.pair_delta;
  RandomStream rng(2024, 1);
  for (const std::size_t m : {3u, 33u, 64u, 65u, 130u, 257u, 1024u})
    for (int kind = 0; kind < 4; ++kind) {
      const std::size_t d = 3;
      std::vector<double> x(m * d);
      std::vector<std::size_t> order(m);
      std::iota(order.begin(), order.end(), 0);
      for (std::size_t a = m; a > 1; --a)
        std::swap(order[a - 1], order[static_cast<std::size_t>(rng.next_u64() % a)]);
      for (std::size_t a = 0; a < m; ++a) {
        double angle = 0.0, lift = 0.0;
        if (kind == 0) angle = 1e-3 * rng.uniform();                       // one cluster
        if (kind == 1 || kind == 2) angle = 0.03 * double(order[a]);      // links 0.03 apart
        if (kind == 2 && a == m / 2) lift = 1.0;                          // one token far off
        if (kind == 3) angle = 0.5 * double(order[a] % 5) + 0.01 * rng.uniform();
        const double c = std::cos(lift);
        x[a * d] = c * std::cos(angle);
        x[a * d + 1] = c * std::sin(angle);
        x[a * d + 2] = std::sin(lift);
      }
      // Brute force: every pair, a union-find with path halving.
      std::vector<std::size_t> parent(m);
      std::iota(parent.begin(), parent.end(), 0);
      auto find = [&](std::size_t a) {
        while (parent[a] != a) a = parent[a] = parent[parent[a]];
        return a;
      };
      std::size_t components = m;
      std::int64_t close = 0;
      for (std::size_t i = 0; i < m; ++i)
        for (std::size_t j = i + 1; j < m; ++j) {
          double inner = 0.0;
          for (std::size_t k = 0; k < d; ++k) inner += x[i * d + k] * x[j * d + k];
          close += inner > close_above;
          if (inner > edge_above && find(i) != find(j)) {
            parent[find(i)] = find(j);
            --components;
          }
        }
      std::vector<std::size_t> tokens(m);
      std::iota(tokens.begin(), tokens.end(), 0);
      const PairStatistics stats = pair_statistics(x.data(), d, tokens, settings);
      const std::string where = "m " + std::to_string(m) + " kind " + std::to_string(kind);
      EXPECT_EQ(stats.clusters, components) << where;
      EXPECT_EQ(stats.close_pairs, close) << where;
      // The chain's links hold (cos 0.03 > 1 - 1e-3), its next-but-one pairs do not; the
      // lifted token takes its link out (two or three pieces).
      if (kind <= 1) {
        EXPECT_EQ(components, 1u) << where;
      } else if (kind == 2) {
        EXPECT_GE(components, 2u) << where;
        EXPECT_LE(components, 3u) << where;
      }
    }
}

TEST(Observables, CollapsedAndIsotropicStatesHaveTheirLimits) {
  const Model model = build_model(testing::config({"--n", "5", "--d", "3"}));
  State collapsed(1, 5, 3);
  for (std::size_t i = 0; i < 5; ++i) collapsed.token(0, i)[2] = 1.0;
  auto values = observe(model, collapsed);
  EXPECT_EQ(values[slot(model, "n_clusters")][0], 1.0);
  EXPECT_EQ(values[slot(model, "clustered_pair_fraction")][0], 1.0);
  EXPECT_EQ(values[slot(model, "order_parameter")][0], 1.0);
  EXPECT_EQ(values[slot(model, "effective_rank")][0], 1.0);
  EXPECT_NEAR(values[slot(model, "marginal_spread")][0], 0.0, 1e-15);
  // Six points +-e_k (n = 6): isotropic second moment, rank d, spread 2/3, mean 0.
  const Model six = build_model(testing::config({"--n", "6", "--d", "3"}));
  State octahedron(1, 6, 3);
  for (std::size_t i = 0; i < 6; ++i) octahedron.token(0, i)[i % 3] = i < 3 ? 1.0 : -1.0;
  values = observe(six, octahedron);
  EXPECT_EQ(values[slot(six, "n_clusters")][0], 6.0);
  EXPECT_EQ(values[slot(six, "clustered_pair_fraction")][0], 0.0);
  EXPECT_EQ(values[slot(six, "order_parameter")][0], 0.0);
  EXPECT_NEAR(values[slot(six, "effective_rank")][0], 3.0, 1e-14);
  EXPECT_NEAR(values[slot(six, "marginal_spread")][0], 2.0 / 3.0, 1e-15);
}

// Transported RoPE in d = 3: y = G(xi) x collapses, x keeps a latitude circle.
TEST(Observables, RopeConditionalSpreadVanishesWhileMarginalSpreadStays) {
  const auto t = testing::simulate(testing::config(
      {"--n", "64", "--d", "3", "--geometry", "rope", "--horizon", "20", "--save-every", "10"}));
  const auto values = observe(t.model, t.frames.back());
  EXPECT_LT(values[slot(t.model, "conditional_spread")][0], 1e-6);
  EXPECT_GT(values[slot(t.model, "marginal_spread")][0], 0.05);
  EXPECT_GT(values[slot(t.model, "n_clusters")][0], 1.0);
  // At t = 0 (uniform contents) neither spread is small.
  const auto start = observe(t.model, t.frames.front());
  EXPECT_GT(start[slot(t.model, "conditional_spread")][0], 0.3);
}

// One and two threads give the same bytes (threaded pair pass for m > 512, both paths).
TEST(Observables, OneAndTwoThreadsGiveIdenticalBytes) {
  const int saved = omp_get_max_threads();
  for (const std::size_t d : {3u, 9u}) {
    const std::size_t per_cluster = 300, n = 3 * per_cluster + 2;
    const Model model = build_model(testing::config(
        {"--n", std::to_string(n), "--d", std::to_string(d), "--null-tokens", "1"}));
    State state = constructed_clusters(per_cluster, d, 11);
    // A second replica of uniform contents: many singletons, few edges.
    const auto cfg = testing::config({"--n", std::to_string(n), "--d", std::to_string(d),
                                      "--null-tokens", "1", "--replicas", "2", "--seed", "5"});
    State both = build_initial_state(cfg, build_model(cfg));
    std::copy(state.x.begin(), state.x.end(), both.x.begin());
    omp_set_num_threads(1);
    const auto one = observe(model, both);
    omp_set_num_threads(2);
    const auto two = observe(model, both);
    omp_set_num_threads(saved);
    ASSERT_EQ(one.size(), two.size());
    for (std::size_t o = 0; o < one.size(); ++o) {
      ASSERT_EQ(one[o].size(), two[o].size());
      EXPECT_TRUE(testing::bitwise_equal(one[o].data(), two[o].data(), one[o].size()))
          << observable_layout(model)[o].first << " d " << d;
    }
    EXPECT_EQ(one[slot(model, "n_clusters")][0], 5.0);
  }
}

// The same through the binary: every stored observable has the same bytes with 1 and 2 threads.
TEST(Observables, StoredObservablesAreIdenticalForOneAndTwoThreads) {
  const auto dir = testing::scratch_dir("observables_threads");
  std::vector<std::vector<std::vector<double>>> runs;
  for (const std::string threads : {"1", "2"}) {
    const std::string path = (dir / ("t" + threads + ".h5")).string();
    const auto run = testing::run_mfattn(
        "run --n 600 --d 3 --init clustered --init-clusters 6 --init-spread 0.01 --beta 4 --kernel sa "
        "--horizon 1 --save-every 0.5 --quiet --threads " + threads + " --out " + path);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const SeriesFile file(path);
    std::vector<std::vector<double>> values;
    for (const auto& name : file.observable_names()) values.push_back(file.observable(name, 0));
    EXPECT_EQ(values.size(), 10u);
    runs.push_back(values);
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  for (std::size_t o = 0; o < runs[0].size(); ++o) {
    ASSERT_EQ(runs[0][o].size(), runs[1][o].size());
    EXPECT_TRUE(testing::bitwise_equal(runs[0][o].data(), runs[1][o].data(), runs[0][o].size())) << o;
  }
}

}  // namespace
}  // namespace mfattn

namespace mfattn {
namespace {

// The attention statistics at beta = 0 under a causal mask: receiver i sees its i + 1
// predecessors alike (entropy log(i + 1), participation i + 1, largest weight 1 / (i + 1));
// a null token receives nothing and weighs nothing; two heads, two replicas.
TEST(Observables, AttentionStatisticsAtBetaZeroCountTheVisibleSources) {
  const RunConfig cfg = testing::config(
      {"--n",           "7",  "--d",        "4",        "--beta",        "0",
       "--kernel",      "sa", "--mask",     "causal",   "--heads",       "2",
       "--head-dim",    "2",  "--q",        "gaussian", "--k",           "gaussian",
       "--null-tokens", "1",  "--replicas", "2",        "--observables", "default+attention"});
  const Model model = build_model(cfg);
  const State state = build_initial_state(cfg, model);
  ObservableSettings settings;
  settings.attention = true;
  const auto layout = observable_layout(model, settings);
  const auto values = observe(model, state, settings);
  std::size_t first = 0;
  while (layout[first].first != "attention_entropy_mean") ++first;
  ASSERT_EQ(layout[first].second, 2u);  // one component a head
  double mean_log = 0.0, mean_count = 0.0;
  for (int k = 1; k <= 7; ++k) {
    mean_log += std::log(double(k)) / 7.0;
    mean_count += double(k) / 7.0;
  }
  for (std::size_t r = 0; r < 2; ++r)
    for (std::size_t h = 0; h < 2; ++h) {
      const std::size_t at = r * 2 + h;
      EXPECT_NEAR(values[first][at], mean_log, 1e-14);           // entropy mean
      EXPECT_NEAR(values[first + 1][at], 0.0, 1e-15);            // entropy min
      EXPECT_NEAR(values[first + 2][at], std::log(7.0), 1e-14);  // entropy max
      EXPECT_NEAR(values[first + 4][at], 1.0 / 7.0, 1e-15);      // largest weight min
      EXPECT_NEAR(values[first + 5][at], 1.0, 1e-15);            // largest weight max
      EXPECT_NEAR(values[first + 6][at], mean_count, 1e-13);     // participation mean
    }
}

}  // namespace
}  // namespace mfattn

namespace mfattn {
namespace {

// The circle's sorted pair pass against the all-pairs pass it replaces beyond
// kSortedCircleTokens: the same cluster count and close pairs, min_inner to rounding, on
// clustered states (clusters that straddle the angle -pi = pi, coincident tokens, a collapsed
// state) and a uniform one.
TEST(Observables, TheCirclesSortedPassIsTheAllPairsPass) {
  std::mt19937_64 engine(3);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(-std::numbers::pi, std::numbers::pi);
  ObservableSettings settings;
  settings.pair_delta = 1e-3;
  settings.cluster_delta = 1e-4;
  for (const std::vector<double>& centres : std::vector<std::vector<double>>{
           {}, {std::numbers::pi - 1e-3, 0.5, -2.0}, {0.1}, {3.0, 3.1, -3.1, 1.0, 1.0 + 0.02}}) {
    const std::size_t m = 6000;
    std::vector<double> x(2 * m);
    std::vector<std::size_t> tokens(m);
    for (std::size_t a = 0; a < m; ++a) {
      const double angle = centres.empty() ? uniform(engine)
                                           : centres[a % centres.size()] +
                                                 (a % 7 == 0 ? 0.0 : 3e-3 * normal(engine));
      x[2 * a] = std::cos(angle);
      x[2 * a + 1] = std::sin(angle);
      tokens[a] = a;
    }
    const PairStatistics sorted = circle_pair_statistics(x.data(), tokens, settings);
    const PairStatistics all = pair_statistics(x.data(), 2, tokens,
                                               settings);  // m below the switch
    EXPECT_EQ(sorted.clusters, all.clusters) << centres.size();
    EXPECT_EQ(sorted.close_pairs, all.close_pairs) << centres.size();
    EXPECT_EQ(sorted.pairs, all.pairs);
    EXPECT_NEAR(sorted.min_inner, all.min_inner, 1e-15) << centres.size();
    // The cases say something: the clustered states have few clusters, every state close pairs.
    if (!centres.empty()) {
      EXPECT_LT(all.clusters, m / 10) << centres.size();
    }
    EXPECT_GT(all.close_pairs, 0) << centres.size();
  }
}

}  // namespace
}  // namespace mfattn

namespace mfattn {
namespace {

// The sphere's tree pass against the all-pairs pass it replaces beyond kSphereTreeTokens: the
// same cluster count and close pairs, min_inner to rounding, on a uniform state, clusters of
// every spread about the two thresholds' chords (so that node pairs straddle them), coincident
// tokens, a collapsed state, two antipodal clusters and clusters on a great circle.
TEST(Observables, TheSpheresTreePassIsTheAllPairsPass) {
  std::mt19937_64 engine(5);
  std::normal_distribution<double> normal(0.0, 1.0);
  ObservableSettings settings;
  settings.pair_delta = 1e-3;
  settings.cluster_delta = 1e-4;
  auto unit = [](std::array<double, 3> v) {
    const double norm = std::sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
    return std::array<double, 3>{v[0] / norm, v[1] / norm, v[2] / norm};
  };
  struct Case {
    const char* name;
    std::vector<std::array<double, 3>> centres;
    double spread;  // of each token about its centre (a seventh sit on the centre itself)
  };
  const std::vector<Case> cases = {
      {"uniform", {}, 0.0},
      {"clusters about the edge chord", {{1, 0, 0}, {0, 1, 0}, {0.3, -0.2, 0.9}}, 6e-3},
      {"clusters about the close chord", {{0, 0, 1}, {0.6, 0.8, 0}}, 2e-2},
      {"collapsed", {{0.2, 0.3, -0.9}}, 1e-7},
      {"antipodal", {{0, 0, 1}, {0, 0, -1}}, 1e-3},
      {"a great circle", {{1, 0, 0}, {0, 1, 0}, {-1, 0, 0}, {0, -1, 0}, {0.7, 0.7, 0}}, 3e-2},
      {"rows off unit by 1e-9", {{0, 1, 0}, {0.5, 0.5, 0.5}}, 8e-3},
  };
  for (const Case& c : cases) {
    const std::size_t m = 5000;
    std::vector<double> x(3 * m);
    std::vector<std::size_t> tokens(m);
    for (std::size_t a = 0; a < m; ++a) {
      std::array<double, 3> v{normal(engine), normal(engine), normal(engine)};
      if (!c.centres.empty()) {
        const std::array<double, 3> centre = unit(c.centres[a % c.centres.size()]);
        const double s = a % 7 == 0 ? 0.0 : c.spread;
        v = {centre[0] + s * v[0], centre[1] + s * v[1], centre[2] + s * v[2]};
      }
      v = unit(v);
      // Rows as unit as unit_rows accepts them: the tree's chord margin must cover them.
      if (std::string(c.name) == "rows off unit by 1e-9") {
        const double stretch = 1.0 + 4e-10 * normal(engine);
        for (double& component : v) component *= stretch;
      }
      std::copy(v.begin(), v.end(), x.begin() + std::ptrdiff_t(3 * a));
      tokens[a] = a;
    }
    const PairStatistics tree = sphere_pair_statistics(x.data(), tokens, settings);
    const PairStatistics all = pair_statistics(x.data(), 3, tokens,
                                               settings);  // m below the switch
    EXPECT_EQ(tree.clusters, all.clusters) << c.name;
    EXPECT_EQ(tree.close_pairs, all.close_pairs) << c.name;
    EXPECT_EQ(tree.pairs, all.pairs);
    EXPECT_NEAR(tree.min_inner, all.min_inner, 4e-15) << c.name;
    EXPECT_EQ(sphere_pair_statistics(x.data(), tokens, settings, false).min_inner, tree.min_inner);
    // The tree is built and its passes run as tasks: the same results, and the same work, on
    // one thread and on three.
    const int saved = omp_get_max_threads();
    for (const int threads : {1, 3}) {
      omp_set_num_threads(threads);
      std::int64_t work = 0, work_here = 0;
      const PairStatistics here = sphere_pair_statistics(x.data(), tokens, settings, true,
                                                         &work_here);
      omp_set_num_threads(saved);
      sphere_pair_statistics(x.data(), tokens, settings, true, &work);
      EXPECT_EQ(here.clusters, tree.clusters) << c.name << " threads " << threads;
      EXPECT_EQ(here.close_pairs, tree.close_pairs) << c.name << " threads " << threads;
      EXPECT_EQ(here.min_inner, tree.min_inner) << c.name << " threads " << threads;
      EXPECT_EQ(work_here, work) << c.name << " threads " << threads;
    }
    // The cases say something: clustered states have few clusters, and some pairs are close.
    if (!c.centres.empty() && c.spread < 1e-2) {
      EXPECT_LT(all.clusters, m / 10) << c.name;
    }
    EXPECT_GT(all.close_pairs, 0) << c.name;
  }
}

// The tree's work stays near-linear where a naive bound would fail: a collapsed state (every
// pair within 1e-7: the least inner product is 1 - 1e-14, below any fixed margin) and a
// bipodal one (two antipodal clusters), at 5 x 10^4 tokens (1.25 x 10^9 pairs).
TEST(Observables, TheSpheresTreePassStaysNearLinearOnCollapsedAndBipodalStates) {
  std::mt19937_64 engine(9);
  std::normal_distribution<double> normal(0.0, 1.0);
  const std::size_t m = 50000;
  for (const bool bipodal : {false, true}) {
    std::vector<double> x(3 * m);
    std::vector<std::size_t> tokens(m);
    for (std::size_t a = 0; a < m; ++a) {
      const double side = bipodal && a % 2 ? -1.0 : 1.0;
      double v[3] = {0.3 * side + 1e-7 * normal(engine), -0.4 * side + 1e-7 * normal(engine),
                     std::sqrt(0.75) * side + 1e-7 * normal(engine)};
      const double norm = std::sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
      for (std::size_t c = 0; c < 3; ++c) x[3 * a + c] = v[c] / norm;
      tokens[a] = a;
    }
    std::int64_t work = 0;
    const PairStatistics stats = sphere_pair_statistics(x.data(), tokens, ObservableSettings{},
                                                        true, &work);
    EXPECT_EQ(stats.clusters, bipodal ? 2u : 1u);
    EXPECT_LT(work, std::int64_t(100 * m)) << (bipodal ? "bipodal" : "collapsed");
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);  // the tree built and passed on one thread: the same
    std::int64_t work_alone = 0;
    const PairStatistics alone = sphere_pair_statistics(x.data(), tokens, ObservableSettings{},
                                                        true, &work_alone);
    omp_set_num_threads(saved);
    EXPECT_EQ(alone.min_inner, stats.min_inner);
    EXPECT_EQ(alone.clusters, stats.clusters);
    EXPECT_EQ(alone.close_pairs, stats.close_pairs);
    EXPECT_EQ(work_alone, work);
    // The least inner product against its own pairs: the two sweeps' guess cannot be beaten
    // by more than rounding, and a sample of pairs agrees.
    for (std::size_t a = 0; a + 1 < m; a += 997) {
      const double* u = x.data() + 3 * a;
      const double* v = x.data() + 3 * (a + 1);
      EXPECT_GE(u[0] * v[0] + u[1] * v[1] + u[2] * v[2], stats.min_inner - 4e-15);
    }
  }
}

}  // namespace
}  // namespace mfattn
