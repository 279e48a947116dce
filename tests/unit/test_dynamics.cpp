// Exact facts of docs/model.md sections 4-5: analytic reductions, invariants, convergence orders.
#include <cmath>
#include <numbers>

#include "mfattn/observers/observables.hpp"
#include "test_support.hpp"

namespace mfattn {
namespace {

using testing::config;
using testing::simulate;

double norm_error(const State& s) {
  double worst = 0.0;
  for (std::size_t r = 0; r < s.replicas; ++r)
    for (std::size_t i = 0; i < s.n; ++i) {
      double norm2 = 0.0;
      for (std::size_t c = 0; c < s.d; ++c) norm2 += s.token(r, i)[c] * s.token(r, i)[c];
      worst = std::max(worst, std::fabs(std::sqrt(norm2) - 1.0));
    }
  return worst;
}

class EveryIntegrator : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryIntegrator, EveryStepKeepsUnitNorm) {
  std::vector<std::string> args = {"--n", "40", "--d", "5", "--beta", "2", "--horizon", "3",
                                   "--dt", "0.05", "--save-every", "0.05", "--integrator", GetParam(),
                                   "--replicas", "2", "--seed", "3"};
  if (GetParam() == "euler-maruyama") args.insert(args.end(), {"--noise-kappa", "5"});
  if (GetParam() == "stochastic-heun")
    args.insert(args.end(), {"--noise-kappa", "5", "--common-noise", "0.5"});
  for (const std::string kernel : {"usa", "sa"}) {
    auto a = args;
    a.insert(a.end(), {"--kernel", kernel});
    const auto t = simulate(config(a));
    ASSERT_EQ(t.frames.size(), 61u);
    for (const auto& frame : t.frames) EXPECT_LE(norm_error(frame), 4e-16) << "t = " << frame.time;
  }
}

INSTANTIATE_TEST_SUITE_P(Integrators, EveryIntegrator,
                         ::testing::Values("euler", "euler-unprojected", "heun", "rk4", "lie-euler",
                                           "lie-rk4", "dopri5", "euler-maruyama",
                                           "stochastic-heun"));

// d = 2, x = (cos theta, sin theta): USA reduces to
//   dtheta_i/dt = -(1/n) sum_j exp(beta cos(theta_i - theta_j)) sin(theta_i - theta_j).
TEST(Reductions, TwoDimensionalUsaFollowsAngleOde) {
  const std::size_t n = 9;
  const double beta = 1.5, horizon = 2.0, h = 1e-3;
  auto cfg = config({"--n", "9", "--d", "2", "--beta", "1.5", "--horizon", "2", "--dt", "0.001",
                     "--save-every", "2", "--integrator", "rk4", "--seed", "11"});
  const auto t = simulate(cfg);
  std::vector<double> theta(n);
  for (std::size_t i = 0; i < n; ++i)
    theta[i] = std::atan2(t.frames.front().token(0, i)[1], t.frames.front().token(0, i)[0]);
  auto field = [&](const std::vector<double>& th) {
    std::vector<double> out(n, 0.0);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j)
        out[i] -= std::exp(beta * std::cos(th[i] - th[j])) * std::sin(th[i] - th[j]) / double(n);
    return out;
  };
  const auto steps = static_cast<int>(std::lround(horizon / h));
  for (int s = 0; s < steps; ++s) {  // classical RK4 on the angles, independent of mfattn
    auto k1 = field(theta);
    std::vector<double> tmp(n);
    for (std::size_t i = 0; i < n; ++i) tmp[i] = theta[i] + 0.5 * h * k1[i];
    auto k2 = field(tmp);
    for (std::size_t i = 0; i < n; ++i) tmp[i] = theta[i] + 0.5 * h * k2[i];
    auto k3 = field(tmp);
    for (std::size_t i = 0; i < n; ++i) tmp[i] = theta[i] + h * k3[i];
    auto k4 = field(tmp);
    for (std::size_t i = 0; i < n; ++i) theta[i] += h * (k1[i] + 2 * k2[i] + 2 * k3[i] + k4[i]) / 6;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const double* x = t.frames.back().token(0, i);
    EXPECT_NEAR(x[0], std::cos(theta[i]), 1e-11);
    EXPECT_NEAR(x[1], std::sin(theta[i]), 1e-11);
  }
}

// Equiangular start: all inner products stay equal to rho(t) with
//   USA: rho' = (2/n) e^{beta rho} (1 - rho)((n - 1) rho + 1)
//   SA:  rho' = 2 e^{beta rho} (1 - rho)((n - 1) rho + 1) / (e^beta + (n - 1) e^{beta rho}).
void check_equiangular(const std::string& kernel, double beta, double rho0) {
  const int n = 6;
  const double horizon = 1.5, h = 1e-3;
  std::ostringstream beta_text, rho_text;
  beta_text << beta;
  rho_text << rho0;
  auto cfg = config({"--n", "6", "--d", "8", "--beta", beta_text.str(), "--kernel", kernel,
                     "--init", "equiangular", "--init-rho", rho_text.str(), "--horizon", "1.5",
                     "--dt", "0.001", "--save-every", "1.5"});
  const auto t = simulate(cfg);
  auto rate = [&](double rho) {
    const double common = 2.0 * std::exp(beta * rho) * (1 - rho) * ((n - 1) * rho + 1);
    return kernel == "usa" ? common / n : common / (std::exp(beta) + (n - 1) * std::exp(beta * rho));
  };
  double rho = rho0;
  for (int s = 0; s < std::lround(horizon / h); ++s) {
    const double k1 = rate(rho), k2 = rate(rho + 0.5 * h * k1), k3 = rate(rho + 0.5 * h * k2),
                 k4 = rate(rho + h * k3);
    rho += h * (k1 + 2 * k2 + 2 * k3 + k4) / 6;
  }
  const State& end = t.frames.back();
  ASSERT_GT(rho - rho0, 0.05);  // the test must see real motion
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) {
      double inner = 0.0;
      for (std::size_t c = 0; c < end.d; ++c) inner += end.token(0, i)[c] * end.token(0, j)[c];
      EXPECT_NEAR(inner, rho, 1e-11) << kernel << " pair " << i << "," << j;
    }
}

TEST(Reductions, EquiangularUsaFollowsRhoOde) {
  check_equiangular("usa", 1.0, 0.1);
  check_equiangular("usa", 4.0, -0.15);
}

TEST(Reductions, EquiangularSaFollowsRhoOde) {
  check_equiangular("sa", 1.0, 0.1);
  check_equiangular("sa", 4.0, 0.3);
}

// With Q = K = V = I and the full mask, USA is the gradient ascent of E and SA a gradient
// ascent in a weighted metric: E never decreases along the (accurately integrated) flow.
void check_energy_nondecreasing(const std::string& kernel) {
  for (const std::string beta : {"0.5", "1", "4"}) {
    auto cfg = config({"--n", "48", "--d", "3", "--beta", beta, "--kernel", kernel, "--horizon",
                       "15", "--dt", "0.01", "--save-every", "0.05", "--seed", "5"});
    const auto t = simulate(cfg);
    std::vector<double> weight_sums(t.model.n), velocity(t.model.n * t.model.d);
    auto backend = make_backend("cpu", t.model, BackendOptions{1});
    double previous = -1.0, first = -1.0;
    for (const auto& frame : t.frames) {
      backend->velocity(1, frame.x.data(), velocity.data(), weight_sums.data());
      const double energy = energy_from_weight_sums(t.model, frame.x.data(), weight_sums.data());
      EXPECT_GE(energy, previous * (1 - 1e-14)) << kernel << " beta " << beta << " t " << frame.time;
      if (first < 0) first = energy;
      previous = energy;
    }
    EXPECT_GT(previous, 1.05 * first) << "the flow must climb visibly for the test to mean much";
  }
}

TEST(Energy, UsaEnergyIsNondecreasing) { check_energy_nondecreasing("usa"); }
TEST(Energy, SaEnergyIsNondecreasing) { check_energy_nondecreasing("sa"); }

/// Error at T = 1 of a fixed-step method against a fine rk4 solution, for several steps.
double final_error(const std::string& integrator, double dt) {
  std::ostringstream step;
  step << dt;
  const std::vector<std::string> base = {"--n", "8", "--d", "3", "--beta", "1", "--horizon", "1",
                                         "--save-every", "1", "--seed", "2"};
  auto with = [&](const std::string& name, const std::string& h) {
    auto a = base;
    a.insert(a.end(), {"--integrator", name, "--dt", h});
    return simulate(config(a)).frames.back().x;
  };
  static const std::vector<double> exact = with("rk4", "0.0009765625");
  return testing::max_abs_difference(with(integrator, step.str()), exact);
}

double measured_order(const std::string& integrator, double coarse) {
  const double e1 = final_error(integrator, coarse), e2 = final_error(integrator, coarse / 2);
  return std::log2(e1 / e2);
}

TEST(Convergence, FixedStepMethodsHaveTheirOrder) {
  EXPECT_NEAR(measured_order("euler", 1.0 / 64), 1.0, 0.1);
  // Its clock h / (1 + h <x, u>) tends to h: first order towards the same ODE.
  EXPECT_NEAR(measured_order("euler-unprojected", 1.0 / 64), 1.0, 0.1);
  EXPECT_NEAR(measured_order("heun", 1.0 / 32), 2.0, 0.15);
  EXPECT_NEAR(measured_order("rk4", 1.0 / 8), 4.0, 0.25);
  EXPECT_NEAR(measured_order("lie-euler", 1.0 / 64), 1.0, 0.1);
  EXPECT_NEAR(measured_order("lie-rk4", 1.0 / 8), 4.0, 0.25);
}

TEST(Convergence, Dopri5MeetsItsTolerance) {
  const std::vector<std::string> base = {"--n", "8", "--d", "3", "--beta", "1", "--horizon", "1",
                                         "--save-every", "1", "--seed", "2"};
  auto a = base;
  a.insert(a.end(), {"--integrator", "rk4", "--dt", "0.0009765625"});
  const auto exact = simulate(config(a)).frames.back().x;
  for (const std::string rtol : {"1e-5", "1e-7", "1e-9"}) {
    auto b = base;
    b.insert(b.end(), {"--integrator", "dopri5", "--dt", "0.1", "--rtol", rtol, "--atol", rtol});
    const auto t = simulate(config(b));
    const double error = testing::max_abs_difference(t.frames.back().x, exact);
    EXPECT_LT(error, 10 * std::stod(rtol)) << "rtol " << rtol;
    EXPECT_GT(t.stats.steps, 1);
  }
}

TEST(Convergence, Dopri5LandsExactlyOnOutputTimes) {
  const auto t = simulate(config({"--n", "16", "--integrator", "dopri5", "--horizon", "7",
                                  "--save-times", "0.3,1.7,2,6.99", "--dt", "0.5"}));
  const std::vector<double> expected = {0.0, 0.3, 1.7, 2.0, 6.99, 7.0};
  ASSERT_EQ(t.frames.size(), expected.size());
  for (std::size_t k = 0; k < expected.size(); ++k) EXPECT_EQ(t.frames[k].time, expected[k]);
}

TEST(Frames, SaveLogGivesLogSpacedTimesAndSaveEveryIncludesTheHorizon) {
  const auto logged = simulate(config({"--n", "8", "--integrator", "dopri5", "--horizon", "1000",
                                       "--dt", "0.01", "--save-log", "6", "--time-scale", "rescaled"}));
  const std::vector<double> expected = {0.0, 0.01, 0.1, 1.0, 10.0, 100.0, 1000.0};
  ASSERT_EQ(logged.frames.size(), expected.size());
  for (std::size_t k = 0; k < expected.size(); ++k)
    EXPECT_NEAR(logged.frames[k].time, expected[k], 1e-12 * expected[k]) << k;
  EXPECT_EQ(logged.frames.back().time, 1000.0);
  const auto every = simulate(config({"--n", "8", "--horizon", "1", "--save-every", "0.3"}));
  const std::vector<double> times = {0.0, 0.3, 0.6, 0.9, 1.0};
  ASSERT_EQ(every.frames.size(), times.size());
  for (std::size_t k = 0; k < times.size(); ++k) EXPECT_NEAR(every.frames[k].time, times[k], 1e-15);
}

/// The mean of <x_0(T), x_0(0)> over replicas, and its standard error.
std::pair<double, double> mean_self_overlap(const testing::Trajectory& t) {
  const State &start = t.frames.front(), &end = t.frames.back();
  double sum = 0.0, sum2 = 0.0;
  for (std::size_t r = 0; r < start.replicas; ++r) {
    double inner = 0.0;
    for (std::size_t c = 0; c < start.d; ++c) inner += start.token(r, 0)[c] * end.token(r, 0)[c];
    sum += inner;
    sum2 += inner * inner;
  }
  const double count = double(start.replicas), mean = sum / count;
  return {mean, std::sqrt((sum2 / count - mean * mean) / count)};
}

// Brownian motion on S^{d-1} with generator (1/kappa) Laplacian: E<x(t), x(0)> =
// exp(-(d - 1) t / kappa). One token per replica has no drift (its only source is itself).
// The common noise sigma P_x(dB x) moves one token alone as Brownian motion with generator
// (sigma^2 / 2) Laplacian, whichever its law: sigma = sqrt(2 / kappa) decorrelates at the same
// rate. That fixes the scaling of dB's entries (docs/model.md, "Common noise").
TEST(Noise, BrownianMotionDecorrelatesAtRateDMinusOneOverKappa) {
  const std::vector<std::vector<std::string>> noises = {
      {"--integrator", "euler-maruyama", "--noise-kappa", "4"},
      {"--integrator", "stochastic-heun", "--noise-kappa", "4"},
      {"--integrator", "stochastic-heun", "--common-noise", "0.7071067811865476"},
      {"--integrator", "stochastic-heun", "--common-noise", "0.7071067811865476",
       "--common-noise-kind", "rotation"},
  };
  for (const std::string d : {"3", "4"}) {
    for (const auto& noise : noises) {
      auto args = std::vector<std::string>{
          "--n",  "1",     "--d",       d,   "--beta",       "0", "--replicas", "4000",
          "--dt", "0.002", "--horizon", "1", "--save-every", "1", "--seed",     "9"};
      args.insert(args.end(), noise.begin(), noise.end());
      const auto [mean, standard_error] = mean_self_overlap(simulate(config(args)));
      const double expected = std::exp(-(std::stod(d) - 1) * 1.0 / 4.0);
      EXPECT_NEAR(mean, expected, 4 * standard_error + 2e-3)
          << "d = " << d << " " << noise[1] << " " << noise[2];
    }
  }
}

// Two tokens a distance 1e-7 apart under the symmetric common noise alone (V = 0) separate as
// exp(lambda t) with the top Lyapunov exponent lambda = -2 sigma^2 of the linearised flow,
// for every d (docs/model.md derives it: u = artanh <x, y> obeys du = 2 sigma^2 tanh(u) dt +
// 2 sigma dW). The rotation moves both tokens by one rotation: lambda = 0. Monte Carlo over
// 2000 replicas to t = 1, within 3 standard errors (0.036; the scheme's weak bias at dt = 0.002
// is about 0.03 at d = 4, and grows with d and dt).
TEST(Noise, CommonNoiseSynchronisesTwoTokensAtTheLyapunovRate) {
  const double sigma = 0.8, horizon = 1.0;
  for (const auto& [d, kind] : std::vector<std::pair<std::string, std::string>>{
           {"2", "symmetric"}, {"3", "symmetric"}, {"4", "symmetric"}, {"3", "rotation"}}) {
    {
      const auto t = simulate(config({"--n",
                                      "2",
                                      "--d",
                                      d,
                                      "--v",
                                      "zero",
                                      "--replicas",
                                      "2000",
                                      "--init",
                                      "clustered",
                                      "--init-clusters",
                                      "1",
                                      "--init-spread",
                                      "1e-7",
                                      "--integrator",
                                      "stochastic-heun",
                                      "--common-noise",
                                      "0.8",
                                      "--common-noise-kind",
                                      kind,
                                      "--dt",
                                      "0.002",
                                      "--horizon",
                                      "1",
                                      "--save-every",
                                      "1",
                                      "--seed",
                                      "4"}));
      const State &start = t.frames.front(), &end = t.frames.back();
      auto distance = [](const State& s, std::size_t r) {
        double sum = 0.0;
        for (std::size_t c = 0; c < s.d; ++c)
          sum += std::pow(s.token(r, 0)[c] - s.token(r, 1)[c], 2);
        return std::sqrt(sum);
      };
      double sum = 0.0, sum2 = 0.0;
      for (std::size_t r = 0; r < start.replicas; ++r) {
        const double rate = std::log(distance(end, r) / distance(start, r)) / horizon;
        sum += rate;
        sum2 += rate * rate;
      }
      const double count = double(start.replicas), mean = sum / count;
      const double standard_error = std::sqrt((sum2 / count - mean * mean) / count);
      if (kind == "symmetric") {
        EXPECT_NEAR(mean, -2 * sigma * sigma, 3 * standard_error) << "d = " << d;
        EXPECT_GT(standard_error, 0.01);  // the rate is random: the test measures its mean
      } else {
        EXPECT_LT(std::abs(mean), 1e-3) << "d = " << d;
      }
    }
  }
}

}  // namespace
}  // namespace mfattn
