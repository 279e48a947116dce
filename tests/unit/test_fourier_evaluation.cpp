// --evaluation fourier (kernels/circle_series.hpp, backends/fourier/circle_fourier.cpp): the
// scaled Bessel coefficients against the standard library's I_k, their truncation bound, the
// series against the cpu backend's direct sum at n = 2 x 10^4 on random systems of the circle
// (random Q, K, V, RoPE gauges, prefix tokens, null tokens, SA and USA, a repulsive beta,
// rescaled time), the same bits for every thread count, a whole run, and the refusals.
#include <cmath>
#include <functional>
#include <numbers>

#include "test_support.hpp"
#include "kernels/circle_series.hpp"

namespace mfattn {
namespace {

using testing::bitwise_equal;
using testing::config;
using testing::evaluate_velocity;

TEST(FourierEvaluation, ScaledBesselSeriesIsTheLibrarysAndMeetsItsTail) {
  for (double x : {0.3, 1.0, 4.0, 17.5, 80.0}) {
    const double tol = 1e-13;
    const std::vector<double> series = kernels::scaled_bessel_series(x, tol);
    double sum = series[0];
    for (std::size_t k = 0; k < series.size(); ++k) {
      const double exact = std::cyl_bessel_i(double(k), x) * std::exp(-x);
      // Against 1, their sum (what the weights' accuracy is relative to), and relatively.
      EXPECT_NEAR(series[k], exact, 1e-15 + 1e-12 * exact) << "x " << x << " k " << k;
      if (k > 0) sum += 2.0 * series[k];
    }
    // The dropped tail 2 sum_{k > K} Is_k = 1 - kept is within tol / 2 (and the next term counts).
    EXPECT_LE(1.0 - sum, 0.5 * tol + 1e-15) << x;
    const double next = std::cyl_bessel_i(double(series.size()), x) * std::exp(-x);
    EXPECT_LE(2.0 * next, 0.5 * tol) << x;
  }
  EXPECT_EQ(kernels::scaled_bessel_series(0.0, 1e-13), std::vector<double>{1.0});
}

// The series against the direct sum, velocities and weight sums, relative to their largest
// values: 1e-10 at the default tolerance (measured: about 1e-13).
void expect_series_matches_direct(std::vector<std::string> args, const std::string& label,
                                  const std::function<void(Model&)>& change = {}) {
  RunConfig cfg = config(args);
  Model model = build_model(cfg);
  if (change) change(model);
  const State state = build_initial_state(cfg, model);
  std::vector<double> direct_sums, series_sums;
  const std::vector<double> direct = evaluate_velocity(model, state, "cpu", 2, &direct_sums);
  auto series_backend = make_backend("cpu", model,
                                     BackendOptions{2, Precision::Double, PairEvaluation::Fourier});
  std::vector<double> series(state.size());
  series_sums.assign(state.replicas * model.n, 0.0);
  series_backend->velocity(state.replicas, state.x.data(), series.data(), series_sums.data());
  EXPECT_EQ(described_loop(*series_backend), "fourier") << label;
  double largest = 0.0, largest_sum = 0.0;
  for (double v : direct) largest = std::max(largest, std::fabs(v));
  for (double s : direct_sums) largest_sum = std::max(largest_sum, std::fabs(s));
  EXPECT_GT(largest, 0.0) << label;
  EXPECT_LT(testing::max_abs_difference(direct, series), 1e-10 * largest) << label;
  EXPECT_LT(testing::max_abs_difference(direct_sums, series_sums), 1e-10 * largest_sum) << label;
  // The same bits for one thread and two.
  auto one = make_backend("cpu", model,
                          BackendOptions{1, Precision::Double, PairEvaluation::Fourier});
  std::vector<double> alone(state.size());
  one->velocity(state.replicas, state.x.data(), alone.data(), nullptr);
  EXPECT_TRUE(bitwise_equal(alone.data(), series.data(), series.size())) << label;
}

// A change of a built model: positions in tied groups of `group` tokens (0, 0, 0, 1, 1, 1, ...).
std::function<void(Model&)> tied_positions(std::size_t group) {
  return [group](Model& model) {
    for (std::size_t i = 0; i < model.n; ++i)
      model.positions[i * model.position_dim] = double(i / group);
  };
}

// The circle's cases at n tokens: random Q, K, V, RoPE gauges, prefix tokens, null tokens, SA and
// USA, a repulsive beta, per-replica matrix sets.
void expect_circle_cases_match_direct(const std::string& n) {
  const std::vector<std::string> base = {"--n", n, "--d", "2", "--beta", "4"};
  expect_series_matches_direct(testing::with(base, {"--seed", "1"}), "usa, identity");
  expect_series_matches_direct(testing::with(base, {"--kernel", "sa", "--q", "gaussian", "--k",
                                                    "gaussian", "--v", "gaussian", "--seed", "2"}),
                               "sa, random Q, K, V");
  expect_series_matches_direct(
      testing::with(base, {"--kernel", "usa", "--q", "goe", "--k", "gaussian", "--v", "goe",
                           "--time-scale", "rescaled", "--seed", "3"}),
      "usa rescaled, random");
  expect_series_matches_direct(testing::with(base, {"--kernel", "sa", "--geometry", "rope", "--v",
                                                    "gaussian", "--prefix", "4", "--seed", "4"}),
                               "sa, rope, prefix");
  expect_series_matches_direct(
      testing::with(base, {"--kernel", "sa", "--geometry", "rope", "--values", "plain",
                           "--null-tokens", "7", "--seed", "5"}),
      "sa, rope plain values, null tokens");
  expect_series_matches_direct(
      {"--n", n, "--d", "2", "--beta", "-3", "--kernel", "sa", "--replicas", "2", "--q", "gaussian",
       "--k", "gaussian", "--matrices", "per-replica", "--seed", "6"},
      "sa, repulsive, per-replica sets");
  // Causal masks, by prefix sums in position order: RoPE with prefix tokens (always seen),
  // random positions with null tokens, and positions in tied groups of three.
  expect_series_matches_direct(
      testing::with(base, {"--kernel", "sa", "--geometry", "rope", "--v", "gaussian", "--prefix",
                           "4", "--mask", "causal", "--seed", "7"}),
      "sa, rope, prefix, causal");
  expect_series_matches_direct(
      testing::with(
          base, {"--kernel", "usa", "--q", "gaussian", "--k", "gaussian", "--mask", "causal-strict",
                 "--positions", "random", "--null-tokens", "5", "--seed", "8"}),
      "usa, random Q, K, causal-strict, random positions");
  for (const char* mask : {"causal", "causal-strict"})
    expect_series_matches_direct(
        testing::with(base, {"--kernel", "sa", "--mask", mask, "--q", "gaussian", "--seed", "9"}),
        std::string("sa, tied positions, ") + mask, tied_positions(3));
}

// 2 x 10^4 tokens; the sanitizer build skips it and runs the same cases at a few hundred tokens
// (the same code paths, one source block).
TEST(FourierEvaluation, MatchesTheDirectSumOnRandomSystemsOfTheCircle) {
  expect_circle_cases_match_direct("20000");
}

TEST(FourierEvaluation, MatchesTheDirectSumOnSmallSystemsOfTheCircle) {
  expect_circle_cases_match_direct("300");
}

TEST(FourierEvaluation, SphericalHarmonicsMeetTheAdditionTheoremAndTheBesselSeriesItsTail) {
  const double x[3] = {0.48, -0.6, 0.64}, y[3] = {-0.36, 0.0, 0.933};
  const double ny = std::sqrt(y[0] * y[0] + y[1] * y[1] + y[2] * y[2]);
  const double u[3] = {y[0] / ny, y[1] / ny, y[2] / ny};
  const int L = 30;
  std::vector<double> hx((L + 1) * (L + 1)), hy(hx.size()), scratch(2 * (L + 1));
  kernels::real_spherical_harmonics(x, L, hx.data(), scratch.data());
  kernels::real_spherical_harmonics(u, L, hy.data(), scratch.data());
  const double t = x[0] * u[0] + x[1] * u[1] + x[2] * u[2];
  for (int l = 0; l <= L; ++l) {
    double sum = 0.0;
    for (int m = -l; m <= l; ++m)
      sum += hx[std::size_t(l * l + l + m)] * hy[std::size_t(l * l + l + m)];
    EXPECT_NEAR(sum, double(2 * l + 1) / (4.0 * std::numbers::pi) * std::legendre(unsigned(l), t),
                1e-13)
        << l;
  }
  // A pole: the harmonics of e_3 are those of m = 0 alone.
  const double pole[3] = {0.0, 0.0, 1.0};
  kernels::real_spherical_harmonics(pole, L, hx.data(), scratch.data());
  for (int l = 0; l <= L; ++l)
    for (int m = -l; m <= l; ++m)
      if (m != 0) {
        EXPECT_EQ(hx[std::size_t(l * l + l + m)], 0.0);
      }
  for (double kappa : {0.5, 4.0, 30.0}) {
    const std::vector<double> series = kernels::scaled_spherical_bessel_series(kappa, 1e-13);
    double total = 0.0;
    for (std::size_t l = 0; l < series.size(); ++l) {
      const double exact = std::sqrt(std::numbers::pi / (2 * kappa)) *
                           std::cyl_bessel_i(double(l) + 0.5, kappa) * std::exp(-kappa);
      EXPECT_NEAR(series[l], exact, 1e-15 + 1e-12 * exact) << kappa << " " << l;
      total += double(2 * l + 1) * series[l];
    }
    // exp(kappa t) at t = 1: sum (2l + 1) i_l = e^kappa, so the scaled sum is 1 less the tail.
    EXPECT_NEAR(total, 1.0, 1e-13) << kappa;
  }
}

// The sphere's zonal cases at n tokens: USA, SA with a random V and prefix tokens, null tokens,
// rescaled time, a repulsive beta.
void expect_sphere_cases_match_direct(const std::string& n) {
  const std::vector<std::string> base = {"--n", n, "--d", "3", "--beta", "4"};
  expect_series_matches_direct(testing::with(base, {"--seed", "1"}), "S^2 usa");
  expect_series_matches_direct(
      testing::with(base, {"--kernel", "sa", "--v", "gaussian", "--prefix", "4", "--seed", "2"}),
      "S^2 sa, random V, prefix");
  expect_series_matches_direct(testing::with(base, {"--kernel", "sa", "--null-tokens", "9",
                                                    "--time-scale", "rescaled", "--seed", "3"}),
                               "S^2 sa rescaled, null tokens");
  expect_series_matches_direct(
      {"--n", n, "--d", "3", "--beta", "-3", "--kernel", "sa", "--seed", "4"}, "S^2 repulsive");
  expect_series_matches_direct(testing::with(base, {"--kernel", "sa", "--v", "gaussian", "--prefix",
                                                    "3", "--mask", "causal", "--seed", "5"}),
                               "S^2 sa, prefix, causal");
  expect_series_matches_direct(testing::with(base, {"--kernel", "usa", "--mask", "causal-strict",
                                                    "--positions", "random", "--seed", "6"}),
                               "S^2 usa, causal-strict, random positions");
  expect_series_matches_direct(
      testing::with(base, {"--kernel", "sa", "--mask", "causal-strict", "--seed", "7"}),
      "S^2 sa, tied positions, causal-strict", tied_positions(4));
}

TEST(FourierEvaluation, MatchesTheDirectSumOnZonalSystemsOfTheSphere) {
  expect_sphere_cases_match_direct("20000");
}

TEST(FourierEvaluation, MatchesTheDirectSumOnSmallZonalSystemsOfTheSphere) {
  expect_sphere_cases_match_direct("300");
}

TEST(FourierEvaluation, AWholeRunFollowsTheDirectOne) {
  const std::vector<std::string> args = {"--n",          "1000", "--d",       "2", "--beta", "4",
                                         "--kernel",     "sa",   "--horizon", "1", "--dt",   "0.05",
                                         "--save-every", "0.5",  "--seed",    "7"};
  const testing::Trajectory direct = testing::simulate(config(args));
  const testing::Trajectory series = testing::simulate(
      config(testing::with(args, {"--evaluation", "fourier"})));
  ASSERT_EQ(direct.frames.size(), series.frames.size());
  // rk4's stages leave the circle, where the series reads directions (docs/model.md section
  // 2f): the two runs differ by the method's own error, about 1e-10 here.
  EXPECT_LT(testing::max_abs_difference(direct.frames.back().x, series.frames.back().x), 1e-9);
  // euler evaluates on the circle only: the runs differ by the series' own 1e-13 an evaluation.
  const std::vector<std::string> euler = testing::with(args, {"--integrator", "euler"});
  const testing::Trajectory direct_euler = testing::simulate(config(euler));
  const testing::Trajectory series_euler = testing::simulate(
      config(testing::with(euler, {"--evaluation", "fourier"})));
  EXPECT_LT(testing::max_abs_difference(direct_euler.frames.back().x, series_euler.frames.back().x),
            1e-12);
}

// The stages of heun and rk4 leave the sphere by O(h^2); there the series' kernel reads the
// tokens' directions (a smooth field that is the pair loop's on the sphere), so each method
// keeps its order: the error against h = 0.0125 falls as h^2 and h^4 on the circle (random
// Q, K) and on S^2 (a random V).
// Off the sphere the series' kernel reads each token's direction: tokens scaled by factors
// c_i in [0.9, 1.1] give the same weight sums (to rounding), causal masks and prefix tokens
// included, where the pair loop's (which reads the vectors) move by some percent.
TEST(FourierEvaluation, TheKernelReadsDirectionsOffTheSphere) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--d", "2", "--q", "gaussian", "--k", "gaussian", "--prefix", "3"},
           {"--d", "2", "--geometry", "rope", "--mask", "causal"},
           {"--d", "3", "--v", "gaussian"},
           {"--d", "3", "--mask", "causal-strict"}}) {
    const RunConfig cfg = config(
        testing::with(args, {"--n", "400", "--beta", "4", "--kernel", "sa", "--seed", "2"}));
    const Model model = build_model(cfg);
    const State state = build_initial_state(cfg, model);
    std::vector<double> scaled = state.x;
    for (std::size_t i = 0; i < model.n; ++i)
      for (std::size_t c = 0; c < model.d; ++c)
        scaled[i * model.d + c] *= 1.0 + 0.1 * std::sin(double(3 * i + 1));
    auto sums = [&](PairEvaluation evaluation, const std::vector<double>& x) {
      auto backend = make_backend("cpu", model, BackendOptions{1, Precision::Double, evaluation});
      std::vector<double> velocity(x.size()), weight_sums(model.n);
      backend->velocity(1, x.data(), velocity.data(), weight_sums.data());
      return weight_sums;
    };
    const std::vector<double> on = sums(PairEvaluation::Fourier, state.x);
    const std::vector<double> off = sums(PairEvaluation::Fourier, scaled);
    const std::vector<double> direct_on = sums(PairEvaluation::Direct, state.x);
    const std::vector<double> direct_off = sums(PairEvaluation::Direct, scaled);
    double largest = 0.0;
    for (double value : on) largest = std::max(largest, std::fabs(value));
    EXPECT_LT(testing::max_abs_difference(on, off), 1e-12 * largest) << args[1];
    EXPECT_GT(testing::max_abs_difference(direct_on, direct_off), 1e-2 * largest) << args[1];
  }
}

TEST(FourierEvaluation, EveryMethodKeepsItsOrderThroughStagesOffTheSphere) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> geometries = {
      {{"--d", "2", "--q", "gaussian", "--k", "gaussian"}, "circle"},
      {{"--d", "3", "--v", "gaussian"}, "S^2"}};
  const std::vector<std::pair<std::string, double>> methods = {{"heun", 2.0}, {"rk4", 4.0}};
  for (const auto& geometry : geometries)
    for (const auto& method : methods) {
      auto final_state = [&](const char* dt) {
        const std::vector<std::string> args = testing::with(
            geometry.first, {"--n", "300", "--beta", "4", "--kernel", "sa", "--seed", "5",
                             "--integrator", method.first, "--horizon", "1.6", "--dt", dt,
                             "--save-every", "1.6", "--evaluation", "fourier"});
        return testing::simulate(config(args)).frames.back().x;
      };
      const std::vector<double> reference = final_state("0.0125");
      const double coarse = testing::max_abs_difference(final_state("0.1"), reference);
      const double fine = testing::max_abs_difference(final_state("0.05"), reference);
      // Measured: 2.05 and 2.04 for heun, 4.01 and 4.06 for rk4.
      EXPECT_NEAR(std::log2(coarse / fine), method.second, 0.25)
          << geometry.second << " " << method.first;
    }
}

// Null tokens (presence 0, appended; eps_den given, since auto sets it with them) leave every
// other token's trajectory bit for bit, with the series as with the pair loops: they are
// skipped in the moments, and the blocks of sources before them are the same. 5000 tokens: two
// blocks, so the blocks' order is in play.
TEST(FourierEvaluation, NullTokensLeaveTheTrajectoriesBitIdentical) {
  for (const char* d : {"2", "3"})
    for (const char* mask : {"full", "causal"}) {
      const std::vector<std::string> base = {
          "--n",          "5000", "--d",          d,         "--beta",    "4",   "--kernel", "sa",
          "--mask",       mask,   "--eps-den",    "1e-12",   "--horizon", "0.2", "--dt",     "0.1",
          "--save-every", "0.2",  "--evaluation", "fourier", "--seed",    "3"};
      const testing::Trajectory plain = testing::simulate(config(base), 2);
      const testing::Trajectory padded = testing::simulate(
          config(testing::with(base, {"--null-tokens", "3000"})), 2);
      const std::size_t active = 5000 * plain.model.d;
      EXPECT_TRUE(
          bitwise_equal(plain.frames.back().x.data(), padded.frames.back().x.data(), active))
          << "d " << d << " " << mask;
      EXPECT_GT(testing::max_abs_difference(plain.frames.front().x, plain.frames.back().x), 1e-4);
    }
}

// SA's ratio for a receiver that sees only a few far sources at large |beta| (the first ones
// under a causal mask; an outlier at beta = 60): the truncated series cannot resolve its weight
// sum, so its sources are summed directly. Every receiver's velocity is then right to 1e-7 of
// itself (of 1e-6 of the largest where smaller), not only relative to the largest.
TEST(FourierEvaluation, ReceiversTheSeriesCannotResolveAreSummedDirectly) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--d", "2", "--beta", "30", "--mask", "causal-strict"},
           {"--d", "2", "--beta", "30", "--mask", "causal", "--q", "gaussian", "--k", "gaussian"},
           {"--d", "3", "--beta", "30", "--mask", "causal-strict"},
           {"--d", "3", "--beta", "-20", "--mask", "causal"},
           {"--d", "2", "--beta", "60"},
           {"--d", "3", "--beta", "60"}}) {
    const RunConfig cfg = config(
        testing::with(args, {"--n", "2000", "--kernel", "sa", "--seed", "3"}));
    const Model model = build_model(cfg);
    const State state = build_initial_state(cfg, model);
    const std::vector<double> direct = evaluate_velocity(model, state, "cpu", 2);
    auto series_backend = make_backend(
        "cpu", model, BackendOptions{2, Precision::Double, PairEvaluation::Fourier});
    std::vector<double> series(state.size());
    series_backend->velocity(1, state.x.data(), series.data(), nullptr);
    const std::size_t d = model.d;
    double largest = 0.0;
    std::vector<double> norms(model.n), errors(model.n);
    for (std::size_t i = 0; i < model.n; ++i) {
      double norm2 = 0.0, error2 = 0.0;
      for (std::size_t c = 0; c < d; ++c) {
        norm2 += direct[i * d + c] * direct[i * d + c];
        error2 += (direct[i * d + c] - series[i * d + c]) * (direct[i * d + c] - series[i * d + c]);
      }
      norms[i] = std::sqrt(norm2);
      errors[i] = std::sqrt(error2);
      largest = std::max(largest, norms[i]);
    }
    for (std::size_t i = 0; i < model.n; ++i)
      ASSERT_LE(errors[i], 1e-7 * std::max(norms[i], 1e-6 * largest))
          << args[1] << " " << args[3] << " token " << i;
  }
}

TEST(FourierEvaluation, RefusesWhatTheSeriesCannotTake) {
  auto refusal = [](std::vector<std::string> args) {
    const Model model = build_model(config(args));
    try {
      make_backend("cpu", model, BackendOptions{1, Precision::Double, PairEvaluation::Fourier});
    } catch (const BackendUnavailable& error) {
      return std::string(error.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(refusal({"--n", "8", "--d", "4"}).find("takes d = 2 (the circle) or d = 3"),
            std::string::npos);
  EXPECT_NE(
      refusal({"--n", "8", "--d", "3", "--q", "gaussian", "--seed", "1"}).find("zonal kernels"),
      std::string::npos);
  EXPECT_NE(refusal({"--n", "8", "--d", "3", "--geometry", "rope"}).find("no gauge"),
            std::string::npos);
  EXPECT_EQ(refusal({"--n", "8", "--d", "3", "--v", "gaussian", "--seed", "1"}), "(accepted)");
  EXPECT_EQ(
      refusal({"--n", "8", "--d", "2", "--mask", "window"}),
      "--evaluation fourier: takes --mask full, causal or causal-strict (a window or per-prompt rule breaks "
      "the series)");
  EXPECT_EQ(refusal({"--n", "8", "--d", "2", "--mask", "causal"}), "(accepted)");
  // The kinds are the registry entry's (kSeriesEvaluation), in capability_refusal's words.
  EXPECT_EQ(refusal({"--n", "8", "--d", "2", "--kernel", "sinkhorn"}),
            "--kernel sinkhorn: --evaluation fourier takes --kernel usa, sa");
  EXPECT_EQ(refusal({"--n", "8", "--d", "2", "--heads", "2"}),
            capability_refusal(
                "--evaluation fourier", kSeriesEvaluation.takes,
                ModelKinds::of(build_model(config({"--n", "8", "--d", "2", "--heads", "2"})))));
  EXPECT_NE(refusal({"--n", "8", "--d", "2", "--heads", "2"}), "(accepted)");
  EXPECT_NE(
      refusal({"--n", "8", "--d", "2", "--geometry", "rope", "--q", "gaussian", "--seed", "1"})
          .find("with a gauge, Q and K must both commute"),
      std::string::npos);
  EXPECT_EQ(refusal({"--n", "8", "--d", "2", "--geometry", "rope"}), "(accepted)");
  // auto keeps the direct loop where the series does not apply or n is small.
  const Model small = build_model(config({"--n", "8", "--d", "2"}));
  EXPECT_NE(described_loop(*make_backend(
                "cpu", small, BackendOptions{1, Precision::Double, PairEvaluation::Automatic})),
            "fourier");
  const Model masked = build_model(config({"--n", "4096", "--d", "2", "--mask", "window"}));
  EXPECT_NE(described_loop(*make_backend(
                "cpu", masked, BackendOptions{1, Precision::Double, PairEvaluation::Automatic})),
            "fourier");
  const Model large = build_model(config({"--n", "4096", "--d", "2"}));
  EXPECT_EQ(described_loop(*make_backend(
                "cpu", large, BackendOptions{1, Precision::Double, PairEvaluation::Automatic})),
            "fourier");
  // auto by cost: the measured crossovers at beta = 4, scaled by the series' length; at
  // beta = 100 the circle needs four times the frequencies (78 against 20 with Q = K = I), so
  // 2048 tokens stay direct.
  EXPECT_EQ(fourier_from_tokens(large, 1e-13), 1024u);
  EXPECT_EQ(fourier_from_tokens(build_model(config({"--n", "8", "--d", "3"})), 1e-13), 8192u);
  const Model hot = build_model(config({"--n", "2048", "--d", "2", "--beta", "100"}));
  EXPECT_EQ(
      fourier_from_tokens(hot, 1e-13),
      std::size_t(std::ceil(1024.0 * double(kernels::scaled_bessel_series(100.0, 1e-13).size()) /
                            double(kernels::scaled_bessel_series(4.0, 1e-13).size()))));
  EXPECT_GT(fourier_from_tokens(hot, 1e-13), 3u * 1024u);
  const Model hot_sphere = build_model(config({"--n", "8", "--d", "3", "--beta", "30"}));
  EXPECT_GT(fourier_from_tokens(hot_sphere, 1e-13), fourier_from_tokens(hot_sphere, 1e-6));
  EXPECT_GT(fourier_from_tokens(hot_sphere, 1e-6), 8192u);
  EXPECT_NE(described_loop(*make_backend(
                "cpu", hot, BackendOptions{1, Precision::Double, PairEvaluation::Automatic})),
            "fourier");
  // A causal mask on the circle adds each receiver's share of its segment: with Q = K = I at
  // beta = 4 (K = 19, L = 0: T = 39 terms, segments of 6) 20 + (39 / 6 + 6) / 3 against 20.
  EXPECT_EQ(
      fourier_from_tokens(
          build_model(config({"--n", "8", "--d", "2", "--beta", "4", "--mask", "causal"})), 1e-13),
      std::size_t(std::ceil(1024.0 * (20.0 + (39.0 / 6.0 + 6.0) / 3.0) / 20.0)));
  const Model random_causal = build_model(
      config({"--n", "8", "--d", "2", "--beta", "4", "--q", "gaussian", "--k", "gaussian", "--mask",
              "causal"}));
  // With random Q and K both ways: n* = 3565 (2151 unmasked), the crossover measured about 2000
  // (direct 0.0018 s against the series' 0.0015 at 2048, 0.0066 against 0.0031 at 4096).
  const std::size_t random_unmasked = fourier_from_tokens(
      build_model(
          config({"--n", "8", "--d", "2", "--beta", "4", "--q", "gaussian", "--k", "gaussian"})),
      1e-13);
  EXPECT_GT(fourier_from_tokens(random_causal, 1e-13), random_unmasked * 3 / 2);
  EXPECT_LT(fourier_from_tokens(random_causal, 1e-13), 4096u);
  // A coarser tolerance, a shorter series: never below the measured crossover.
  EXPECT_EQ(fourier_from_tokens(large, 1e-3), 1024u);
  EXPECT_NE(testing::usage_message({"--n", "8", "--d", "2", "--evaluation", "fourier", "--backend",
                                    "reference", "--out", "x.h5"})
                .find("--evaluation fourier: the series runs on the host"),
            std::string::npos);
  // The series has no derivatives, as its registry entry says: refused before any work.
  {
    const Model model = build_model(config({"--n", "8", "--d", "2"}));
    auto backend = make_backend("cpu", model,
                                BackendOptions{1, Precision::Double, PairEvaluation::Fourier});
    const Dynamics dynamics(model, *backend, 1);
    try {
      dynamics.require_derivatives();
      ADD_FAILURE() << "the series took derivatives";
    } catch (const BackendUnavailable& error) {
      EXPECT_EQ(std::string(error.what()),
                "--evaluation fourier: has no derivatives (they take --evaluation direct, on "
                "--backend cpu, reference)");
    }
  }
  EXPECT_NE(
      testing::usage_message({"--n", "8", "--d", "2", "--evaluation-tol", "1", "--out", "x.h5"})
          .find("--evaluation-tol 1: must lie in [1e-16, 1e-3]"),
      std::string::npos);
}

}  // namespace
}  // namespace mfattn
