// The reference code's experiments (docs/reference.md): the euler-unprojected step, matrices
// drawn per replica and per layer, and the laws of the matrix presets.
#include <cmath>

#include "mfattn/backends/backend.hpp"
#include "mfattn/integrators/integrator.hpp"
#include "mfattn/core/rng.hpp"
#include "test_support.hpp"

namespace mfattn {
namespace {

using testing::bitwise_equal;
using testing::config;

/// The SA attention output u_i = V sum_j w_ij x_j / sum_j w_ij, w_ij = exp(beta <Q x_i, K x_j>),
/// written by hand in the order of docs/model.md section 2 (no gauge, every p_j = 1).
std::vector<double> hand_attention_output(const Model& model, const AttentionMatrices& m,
                                          const double* x) {
  const std::size_t n = model.n, d = model.d;
  auto apply = [d](const Matrix& a, const double* in, double* out) {
    for (std::size_t r = 0; r < d; ++r) {
      double sum = 0.0;
      for (std::size_t c = 0; c < d; ++c) sum += a(r, c) * in[c];
      out[r] = sum;
    }
  };
  std::vector<double> queries(n * d), keys(n * d), out(n * d), numerator(d), value(d);
  for (std::size_t j = 0; j < n; ++j) {
    apply(m.heads.front().query, x + j * d, queries.data() + j * d);
    apply(m.heads.front().key, x + j * d, keys.data() + j * d);
  }
  for (std::size_t i = 0; i < n; ++i) {
    std::fill(numerator.begin(), numerator.end(), 0.0);
    double denominator = 0.0;
    for (std::size_t j = 0; j < n; ++j) {
      double score = 0.0;
      for (std::size_t c = 0; c < d; ++c) score += queries[i * d + c] * keys[j * d + c];
      const double weight = 1.0 * 1.0 * std::exp(model.beta * score - 0.0);
      apply(m.heads.front().full_value, x + j * d, value.data());
      for (std::size_t c = 0; c < d; ++c) numerator[c] += weight * value[c];
      denominator += weight;
    }
    for (std::size_t c = 0; c < d; ++c) out[i * d + c] = numerator[c] / (0.0 + denominator);
  }
  return out;
}

const std::vector<std::string> kRandomSa = {"--n", "12", "--d", "3", "--beta", "1.5", "--kernel", "sa",
                                            "--k", "goe-unit", "--v", "wishart", "--replicas", "3",
                                            "--matrices", "per-replica", "--seed", "4"};

TEST(ReferenceStep, EulerUnprojectedIsNormalizeOfXPlusHuBitwise) {
  const RunConfig cfg = config(testing::with(kRandomSa, {"--integrator", "euler-unprojected"}));
  const Model model = build_model(cfg);
  State state = build_initial_state(cfg, model);
  const double h = 0.1;
  // The step by hand: x <- (x + h u) / |x + h u| per token, u from the formula above.
  std::vector<double> expected = state.x;
  for (std::size_t r = 0; r < state.replicas; ++r) {
    const std::vector<double> u = hand_attention_output(model, model.matrices_of(r), state.replica(r));
    for (std::size_t i = 0; i < model.n; ++i) {
      double* y = expected.data() + (r * model.n + i) * model.d;
      double norm2 = 0.0;
      for (std::size_t c = 0; c < model.d; ++c) {
        y[c] = y[c] + h * u[i * model.d + c];
        norm2 += y[c] * y[c];
      }
      const double norm = std::sqrt(norm2);
      for (std::size_t c = 0; c < model.d; ++c) y[c] /= norm;
    }
  }
  auto backend = make_backend("reference", model, BackendOptions{1});
  Dynamics dynamics(model, *backend, state.replicas);
  auto integrator = make_integrator({"euler-unprojected"});
  integrator->step(dynamics, state, h);
  EXPECT_TRUE(bitwise_equal(state.x.data(), expected.data(), expected.size()));
  EXPECT_EQ(state.step, 1);
  EXPECT_EQ(state.time, h);
}

TEST(ReferenceStep, AttentionOutputProjectsToTheVelocityOnEveryBackend) {
  const RunConfig cfg = config(kRandomSa);
  const Model model = build_model(cfg);
  const State state = build_initial_state(cfg, model);
  const std::size_t size = state.size();
  for (const std::string name : {"cpu", "reference"}) {
    auto backend = make_backend(name, model, BackendOptions{2});
    std::vector<double> velocity(size), output(size), plain_velocity(size);
    backend->evaluate(state.replicas, state.x.data(), FieldOutputs{velocity.data(), nullptr, output.data()});
    backend->velocity(state.replicas, state.x.data(), plain_velocity.data(), nullptr);
    // Asking for the output changes no bit of the velocity.
    EXPECT_TRUE(bitwise_equal(velocity.data(), plain_velocity.data(), size)) << name;
    for (std::size_t r = 0; r < state.replicas; ++r) {
      const std::vector<double> u = hand_attention_output(model, model.matrices_of(r), state.replica(r));
      for (std::size_t i = 0; i < model.n; ++i) {
        const double* x = state.token(r, i);
        const double* got = output.data() + (r * model.n + i) * model.d;
        double radial = 0.0;
        for (std::size_t c = 0; c < model.d; ++c) radial += x[c] * got[c];
        for (std::size_t c = 0; c < model.d; ++c) {
          EXPECT_NEAR(got[c], u[i * model.d + c], 1e-14) << name;
          EXPECT_NEAR(got[c] - radial * x[c], velocity[(r * model.n + i) * model.d + c], 1e-15) << name;
        }
      }
    }
  }
}

TEST(ReferenceStep, NullTokensKeepTheirBitsUnderTheUnprojectedStep) {
  const RunConfig cfg = config({"--n", "10", "--null-tokens", "3", "--d", "3", "--integrator",
                                "euler-unprojected", "--horizon", "1", "--dt", "0.1", "--seed", "2"});
  const auto t = testing::simulate(cfg);
  for (std::size_t i = 10; i < 13; ++i)
    EXPECT_TRUE(bitwise_equal(t.frames.back().token(0, i), t.frames.front().token(0, i), 3));
}

bool same_matrix(const Matrix& a, const Matrix& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() && bitwise_equal(a.data(), b.data(), a.size());
}

TEST(PerReplicaMatrices, DifferBetweenReplicasAndReproduceFromTheSeed) {
  const RunConfig cfg = config(kRandomSa);
  const auto sets = layer_matrices(cfg, 0);
  ASSERT_EQ(sets.size(), 3u);
  EXPECT_FALSE(same_matrix(sets[0].heads.front().key, sets[1].heads.front().key));
  EXPECT_FALSE(same_matrix(sets[1].heads.front().full_value, sets[2].heads.front().full_value));
  EXPECT_TRUE(sets[0].heads.front().query_identity);
  const auto again = layer_matrices(cfg, 0);
  for (std::size_t r = 0; r < 3; ++r) {
    EXPECT_TRUE(same_matrix(sets[r].heads.front().key, again[r].heads.front().key));
    EXPECT_TRUE(same_matrix(sets[r].heads.front().full_value, again[r].heads.front().full_value));
  }
  // A replica's draw does not depend on how many replicas there are.
  auto more = kRandomSa;
  more[std::find(more.begin(), more.end(), "--replicas") - more.begin() + 1] = "7";
  EXPECT_TRUE(same_matrix(layer_matrices(config(more), 0)[2].heads.front().key, sets[2].heads.front().key));
  // Another seed, other matrices; another layer, other matrices.
  auto other = kRandomSa;
  other.back() = "5";
  EXPECT_FALSE(same_matrix(layer_matrices(config(other), 0)[0].heads.front().key, sets[0].heads.front().key));
  EXPECT_FALSE(same_matrix(layer_matrices(cfg, 1)[0].heads.front().key, sets[0].heads.front().key));
}

TEST(PerReplicaMatrices, SharedLayerZeroIsTheDrawOfEarlierVersions) {
  // Runs without --matrices and --regen-period keep their bits: K from stream
  // (seed, Matrices, 1) with entries N(0, 1/d), as before these options existed.
  const RunConfig cfg = config({"--d", "3", "--k", "gaussian", "--seed", "9"});
  RandomStream stream(9, static_cast<std::uint64_t>(StreamTag::Matrices), 1);
  Matrix expected(3, 3);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 3; ++c) expected(r, c) = stream.normal() / std::sqrt(3.0);
  const auto sets = layer_matrices(cfg, 0);
  ASSERT_EQ(sets.size(), 1u);
  EXPECT_TRUE(same_matrix(sets[0].heads.front().key, expected));
}

/// Mean and variance of entry (r, c) of one matrix of `which` (q, k or v) over many seeds.
struct EntryLaw {
  int row, col;
  double mean, variance;
};

void expect_law(const std::vector<std::string>& options, char which, const std::vector<EntryLaw>& laws) {
  constexpr int kDraws = 4000;
  RunConfig cfg = config(testing::with({"--d", "4"}, options));
  for (const EntryLaw& law : laws) {
    double sum = 0.0, sum2 = 0.0;
    for (int seed = 0; seed < kDraws; ++seed) {
      cfg.seed = seed;
      const AttentionMatrices m = layer_matrices(cfg, 0)[0];
      const AttentionHead& head = m.heads.front();
      const Matrix& a = which == 'q' ? head.query : which == 'k' ? head.key : head.full_value;
      sum += a(law.row, law.col);
      sum2 += a(law.row, law.col) * a(law.row, law.col);
    }
    const double mean = sum / kDraws, variance = sum2 / kDraws - mean * mean;
    // Five standard errors (the fourth moment of these laws is at most ~15 variance^2).
    const double mean_error = 5.0 * std::sqrt(law.variance / kDraws);
    const double variance_error = 5.0 * std::sqrt(15.0 / kDraws) * law.variance;
    const std::string label = "--" + std::string(1, which) + " entry (" + std::to_string(law.row) +
                              ", " + std::to_string(law.col) + ") of " + options.back();
    EXPECT_NEAR(mean, law.mean, mean_error) << label;
    EXPECT_NEAR(variance, law.variance, variance_error) << label;
  }
}

TEST(MatrixPresets, EntriesFollowTheirDocumentedLaws) {
  const double d = 4.0;
  expect_law({"--k", "gaussian"}, 'k', {{0, 0, 0, 1 / d}, {1, 2, 0, 1 / d}});
  expect_law({"--k", "goe"}, 'k', {{0, 0, 0, 2 / d}, {1, 2, 0, 1 / d}});
  expect_law({"--k", "gaussian-product"}, 'k', {{0, 0, 0, 1.0}, {1, 2, 0, 1.0}});
  expect_law({"--k", "wigner-unit"}, 'k', {{0, 0, 0, 1.0}, {1, 2, 0, 1.0}});
  expect_law({"--k", "goe-unit"}, 'k', {{0, 0, 0, 2.0}, {1, 2, 0, 1.0}});
  expect_law({"--q", "goe-unit"}, 'q', {{3, 3, 0, 2.0}, {0, 3, 0, 1.0}});
  // G G^T / sqrt(d): diagonal a chi-square with d degrees over sqrt(d) (mean sqrt(d),
  // variance 2), off the diagonal mean 0, variance 1.
  expect_law({"--v", "wishart"}, 'v', {{0, 0, std::sqrt(d), 2.0}, {1, 2, 0, 1.0}});
  // +-K^T Q / c with Q = I: c = sqrt(d + 1) for goe-unit, sqrt(d) for the others.
  expect_law({"--k", "goe-unit", "--v", "plus-form"}, 'v', {{0, 0, 0, 2.0 / (d + 1)}, {1, 2, 0, 1.0 / (d + 1)}});
  expect_law({"--k", "gaussian-product", "--v", "minus-form"}, 'v', {{0, 0, 0, 1.0 / d}, {1, 2, 0, 1.0 / d}});
}

TEST(MatrixPresets, PlusFormIsTheTransposedFormOverItsScale) {
  const RunConfig cfg = config({"--d", "3", "--q", "gaussian", "--k", "gaussian-product", "--v",
                                "minus-form", "--seed", "1"});
  const AttentionHead m = layer_matrices(cfg, 0)[0].heads.front();
  const Matrix expected = -(m.key.transpose() * m.query) / std::sqrt(3.0);
  EXPECT_LT((m.full_value - expected).cwiseAbs().maxCoeff(), 1e-15);
  EXPECT_FALSE(m.full_value_identity);
}

TEST(Layers, StartEveryPeriodUpToTheHorizon) {
  const RunConfig cfg = config({"--k", "gaussian", "--regen-period", "0.75", "--horizon", "2.25"});
  // A layer at the horizon: the final frame is recorded with its matrices.
  EXPECT_EQ(layer_start_times(cfg), (std::vector<double>{0.0, 0.75, 1.5, 2.25}));
  EXPECT_EQ(layer_at(cfg, 0.0), 0u);
  EXPECT_EQ(layer_at(cfg, 0.7499), 0u);
  EXPECT_EQ(layer_at(cfg, 0.75), 1u);
  EXPECT_EQ(layer_at(cfg, 2.2499), 2u);
  EXPECT_EQ(layer_at(cfg, 2.25), 3u);
  const RunConfig between = config({"--k", "gaussian", "--regen-period", "0.75", "--horizon", "2"});
  EXPECT_EQ(layer_start_times(between), (std::vector<double>{0.0, 0.75, 1.5}));
  const RunConfig plain = config({"--horizon", "3"});
  EXPECT_EQ(layer_start_times(plain), (std::vector<double>{0.0}));
  EXPECT_EQ(layer_at(plain, 2.9), 0u);
}

TEST(Layers, OptionsThatDrawNothingAreRefused) {
  EXPECT_NE(testing::usage_message({"--matrices", "per-replica", "--out", "x.h5"})
                .find("--matrices per-replica: per-replica draws only change random presets"),
            std::string::npos);
  EXPECT_NE(testing::usage_message({"--regen-period", "1", "--out", "x.h5"}).find("--regen-period 1:"),
            std::string::npos);
  EXPECT_NE(testing::usage_message({"--k", "gaussian", "--regen-period", "-1", "--out", "x.h5"})
                .find("must be >= 0"),
            std::string::npos);
  EXPECT_NE(testing::usage_message({"--matrices", "each", "--out", "x.h5"}).find("--matrices each:"),
            std::string::npos);
  EXPECT_NE(testing::usage_message({"--q", "wishart", "--out", "x.h5"}).find("--q wishart:"),
            std::string::npos);
}

}  // namespace
}  // namespace mfattn
