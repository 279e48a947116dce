// The circle and zonal solvers of the mean-field equation (docs/meanfield.md) against exact
// facts: the linear growth rates of the uniform state, mass, positivity, the energy's and free
// energy's monotonicity, second-order convergence, and the two circle evaluations against each
// other.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numbers>
#include <vector>

#include "mfattn/core/gauge.hpp"
#include "mfattn/core/model.hpp"
#include "mfattn/meanfield/solvers.hpp"

namespace mfattn::meanfield {
namespace {

constexpr double kPi = std::numbers::pi;

Model circle_model(double beta, Normalization normalization, double kappa = 0.0) {
  Model model;
  model.n = 1;
  model.d = 2;
  model.beta = beta;
  model.normalization = normalization;
  model.presence = {1.0};
  model.positions = {0.0};
  model.prompt_id = {0};
  model.noise_kappa = kappa;
  return model;
}

/// M_xi label nodes at xi_c = 2 pi c / M_xi with rope of frequency 1 (d = 2).
Model rope_label_model(std::size_t labels, double beta, ValueTransport values) {
  Model model = circle_model(beta, Normalization::Usa);
  model.n = labels;
  model.presence.assign(labels, 1.0);
  model.prompt_id.assign(labels, 0);
  model.positions.clear();
  for (std::size_t c = 0; c < labels; ++c) model.positions.push_back(2.0 * kPi * double(c) / double(labels));
  GaugeSpec spec;
  spec.kind = GeometryKind::Rope;
  spec.d = 2;
  spec.frequencies = {1.0};
  model.gauge = make_gauge(spec, model.positions, labels);
  model.values = values;
  return model;
}

/// gamma = <rate(u + eps P), P> / (eps <P, P>) with the grid's weights: the linear rate of the
/// perturbation P of the uniform density u.
double measured_rate(DensitySolver& solver, const std::vector<double>& perturbation, double eps = 1e-7) {
  const DensityGrid& grid = solver.grid();
  double total_weight = 0.0;
  for (double w : grid.weights) total_weight += w;
  std::vector<double> density(grid.size());
  for (std::size_t i = 0; i < density.size(); ++i) density[i] = 1.0 / total_weight + eps * perturbation[i];
  std::vector<double> rate;
  solver.rate(density, rate);
  double numerator = 0.0, denominator = 0.0;
  for (std::size_t i = 0; i < density.size(); ++i) {
    numerator += grid.weights[i] * rate[i] * perturbation[i];
    denominator += grid.weights[i] * perturbation[i] * perturbation[i];
  }
  return numerator / (eps * denominator);
}

std::vector<double> circle_mode(const DensitySolver& solver, int k) {
  std::vector<double> mode;
  for (double theta : solver.grid().theta) mode.push_back(std::cos(k * theta));
  return mode;
}

TEST(MeanfieldCircle, GrowthRatesOfTheUniformStateAreTheBesselFormula) {
  for (Normalization normalization : {Normalization::Usa, Normalization::Sa})
    for (double kappa : {0.0, 10.0}) {
      const double beta = 2.0;
      Model model = circle_model(beta, normalization, kappa);
      CircleOptions options;
      options.angles = 4096;
      auto solver = make_circle_solver(model, options);
      for (int k = 1; k <= 8; ++k) {
        const double attraction = k * k * std::cyl_bessel_i(double(k), beta) / beta /
                                  (normalization == Normalization::Usa ? 1.0 : std::cyl_bessel_i(0.0, beta));
        const double expected = attraction - (kappa > 0.0 ? k * k / kappa : 0.0);
        const double measured = measured_rate(*solver, circle_mode(*solver, k));
        EXPECT_NEAR(measured, expected, 1e-4 * std::abs(expected))
            << "k " << k << (normalization == Normalization::Usa ? " usa" : " sa") << " kappa " << kappa;
      }
    }
}

/// The relative gap between the FFT and pair-loop evaluations of the rate, at M and 2M cells.
std::vector<double> evaluation_gaps(const Model& model, bool labelled) {
  std::vector<double> gaps;
  for (std::size_t angles : {64, 128}) {
    CircleOptions options;
    options.angles = angles;
    options.labelled = labelled;
    options.evaluation = CircleEvaluation::Fourier;
    auto fourier = make_circle_solver(model, options);
    options.evaluation = CircleEvaluation::Quadrature;
    auto quadrature = make_circle_solver(model, options);
    std::vector<double> density;
    for (std::size_t c = 0; c < model.n; ++c)
      for (double theta : fourier->grid().theta)
        density.push_back(std::exp(2.0 * std::cos(theta + 0.3 * c) + 0.5 * std::sin(3 * theta)));
    std::vector<double> a, b;
    fourier->rate(density, a);
    quadrature->rate(density, b);
    double gap = 0.0, scale = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      gap = std::max(gap, std::abs(a[i] - b[i]));
      scale = std::max(scale, std::abs(a[i]));
    }
    gaps.push_back(gap / scale);
  }
  return gaps;
}

TEST(MeanfieldCircle, QuadratureAndFourierEvaluationsAgreeToSecondOrder) {
  for (const auto& [model, labelled] : {std::pair{circle_model(3.0, Normalization::Sa), false},
                                        std::pair{rope_label_model(4, 1.5, ValueTransport::Transported), true},
                                        std::pair{rope_label_model(4, 1.5, ValueTransport::Plain), true}}) {
    const std::vector<double> gaps = evaluation_gaps(model, labelled);
    EXPECT_LT(gaps[0], 0.05);
    // Halving h divides the gap by about 4 (the faces' mean of centre velocities is second order).
    EXPECT_GT(gaps[0] / gaps[1], 3.0) << gaps[0] << " " << gaps[1];
    EXPECT_LT(gaps[0] / gaps[1], 5.0) << gaps[0] << " " << gaps[1];
  }
}

std::vector<double> smooth_start(const DensitySolver& solver) {
  std::vector<double> density;
  double mass = 0.0;
  for (std::size_t a = 0; a < solver.grid().theta.size(); ++a) {
    const double theta = solver.grid().theta[a];
    density.push_back(std::exp(1.5 * std::cos(theta) + 0.7 * std::cos(2 * theta + 1.0)));
    mass += solver.grid().weights[a] * density.back();
  }
  for (double& value : density) value /= mass;
  return density;
}

/// The circle solver of model on M = angles cells with the step tolerance (rtol, atol).
std::unique_ptr<DensitySolver> circle_solver(const Model& model, std::size_t angles, StepTolerance tolerance) {
  CircleOptions options;
  options.angles = angles;
  options.tolerance = tolerance;
  return make_circle_solver(model, options);
}

void expect_mass_positivity_and_monotone(DensitySolver& solver, double horizon, bool free_energy) {
  std::vector<double> density = smooth_start(solver);
  DensityObservables previous = solver.observe(density);
  double t = 0.0;
  int steps = 0;
  while (t < horizon) {
    t += solver.step(density, horizon - t);
    ++steps;
    const DensityObservables now = solver.observe(density);
    EXPECT_NEAR(now.mass, 1.0, 1e-12);
    EXPECT_GE(now.min_density, 0.0);
    const double before = free_energy ? previous.free_energy : previous.energy;
    const double after = free_energy ? now.free_energy : now.energy;
    ASSERT_GE(after, before - 1e-12 * std::abs(before)) << "step " << steps << " t " << t;
    previous = now;
  }
  EXPECT_GT(steps, 5);
}

TEST(MeanfieldCircle, MassPositivityAndTheEnergyOfTheGradientFlow) {
  auto solver = circle_solver(circle_model(4.0, Normalization::Usa), 128, {1e-5, 1e-8});
  expect_mass_positivity_and_monotone(*solver, 2.0, false);
  auto noisy_solver = circle_solver(circle_model(4.0, Normalization::Usa, 2.0), 128, {1e-5, 1e-8});
  expect_mass_positivity_and_monotone(*noisy_solver, 2.0, true);
}

TEST(MeanfieldCircle, SecondOrderInTheNumberOfCells) {
  Model model = circle_model(2.0, Normalization::Sa, 5.0);
  auto solve = [&](std::size_t angles) {
    auto solver = circle_solver(model, angles, {1e-9, 1e-12});
    std::vector<double> density = smooth_start(*solver);
    double t = 0.0;
    while (t < 0.5) t += solver->step(density, 0.5 - t);
    return density;
  };
  const std::vector<double> reference = solve(1024);
  std::vector<double> errors;
  for (std::size_t angles : {64, 128, 256}) {
    const std::vector<double> coarse = solve(angles);
    double error = 0.0;
    for (std::size_t a = 0; a < angles; ++a)
      error = std::max(error, std::abs(coarse[a] - reference[a * (1024 / angles)]));
    errors.push_back(error);
  }
  for (std::size_t i = 0; i + 1 < errors.size(); ++i) {
    const double order = std::log2(errors[i] / errors[i + 1]);
    EXPECT_GT(order, 1.8) << "errors " << errors[i] << " " << errors[i + 1];
    EXPECT_LT(order, 2.3);
  }
}

// The semi-Lagrangian step has no CFL bound: a fine grid takes steps of many cells. Through a
// clustering solve (beta = 1 from a two-bump start: speeds of order 1, peaks above 10) every
// step is longer than 5 h, in which a face at unit speed crosses five cells (an explicit step
// is at most h / (2 max |v|)); the mass stays 1 and the density >= 0.
TEST(MeanfieldCircle, TheStepCrossesManyCellsAndKeepsMassAndSign) {
  auto solver = circle_solver(circle_model(1.0, Normalization::Usa), 4096, {1e-4, 1e-7});
  std::vector<double> density = smooth_start(*solver);
  const double h = 2.0 * kPi / 4096.0;
  double t = 0.0, shortest = 1.0;
  int steps = 0;
  while (t < 4.0) {
    const double dt = solver->step(density, 4.0 - t);
    t += dt;
    if (t < 4.0) shortest = std::min(shortest, dt);
    ++steps;
  }
  const DensityObservables end = solver->observe(density);
  EXPECT_NEAR(end.mass, 1.0, 1e-12);
  EXPECT_GE(end.min_density, 0.0);
  EXPECT_GT(*std::max_element(density.begin(), density.end()), 10.0) << "the density should have formed clusters";
  EXPECT_GT(shortest, 5.0 * h) << steps << " steps";
  std::printf("[semi-Lagrangian] %d steps to t = 4 at M = 4096, shortest %.2e (h = %.2e)\n", steps, shortest, h);
}

// A slow mode of a 1e-6 perturbation (SA, k = 8, beta = 1: gamma = 5.0e-6) grows in a solve,
// frames of 0.025 as the command takes them, at the rate of the semi-discrete operator: the
// semi-Lagrangian step forms each face's flux from its shift, so a shift of 1e-12 cells keeps
// its digits (fluxes from the feet's positions near u = 4096 were off by 2.8e-4 of this rate).
TEST(MeanfieldCircle, ASlowModeGrowsAtTheRateOfTheOperator) {
  auto solver = circle_solver(circle_model(1.0, Normalization::Sa), 4096, {1e-11, 1e-17});
  const std::vector<double> mode = circle_mode(*solver, 8);
  const double operator_rate = measured_rate(*solver, mode, 1e-6);
  std::vector<double> density;
  for (double value : mode) density.push_back(1.0 / (2.0 * kPi) + 1e-6 * value);
  const double start = solver->observe(density).modes[7];
  double t = 0.0;
  for (int frame = 1; frame <= 20; ++frame) {
    solver->reset_step_control();
    while (t < 0.025 * frame - 1e-15) t += solver->step(density, 0.025 * frame - t);
  }
  const double evolved_rate = std::log(solver->observe(density).modes[7] / start) / t;
  EXPECT_NEAR(evolved_rate, operator_rate, 3e-5 * std::abs(operator_rate));
  std::printf("[slow mode] k = 8: rate %.6e from the operator, %.6e from the solve (relative %.1e)\n", operator_rate,
              evolved_rate, std::abs(evolved_rate / operator_rate - 1.0));
}

TEST(MeanfieldCircle, RopeWithTransportedValuesIsTheLabelFreeSolutionInTheGaugeCoordinate) {
  // rho_xi(theta) = g(theta + xi) at t = 0 stays so, g the label-free solution: in psi = theta
  // + omega xi the score and the transported value depend on psi' - psi only, and the
  // sources of every label add up to the label-free g. The shifts are whole cells here.
  const std::size_t labels = 16, angles = 64, shift = angles / labels;
  CircleOptions options;
  options.angles = angles;
  options.labelled = true;
  options.tolerance = {1e-7, 1e-10};
  auto labelled = make_circle_solver(rope_label_model(labels, 2.0, ValueTransport::Transported), options);
  options.labelled = false;
  auto free = make_circle_solver(circle_model(2.0, Normalization::Usa), options);
  std::vector<double> g = smooth_start(*free), rows(labels * angles);
  for (std::size_t c = 0; c < labels; ++c)
    for (std::size_t a = 0; a < angles; ++a) rows[c * angles + a] = g[(a + c * shift) % angles];
  double t = 0.0, t_free = 0.0;
  while (t < 1.0) t += labelled->step(rows, 1.0 - t);
  while (t_free < 1.0) t_free += free->step(g, 1.0 - t_free);
  double gap = 0.0, scale = 0.0;
  for (std::size_t c = 0; c < labels; ++c)
    for (std::size_t a = 0; a < angles; ++a) {
      gap = std::max(gap, std::abs(rows[c * angles + a] - g[(a + c * shift) % angles]));
      scale = std::max(scale, g[a]);
    }
  EXPECT_LT(gap, 1e-9 * scale);
  // The conditional densities moved (the test is not of a state at rest).
  std::vector<double> start(labels * angles);
  const std::vector<double> g0 = smooth_start(*free);
  for (std::size_t c = 0; c < labels; ++c)
    for (std::size_t a = 0; a < angles; ++a) start[c * angles + a] = g0[(a + c * shift) % angles];
  EXPECT_LT(labelled->observe(rows).conditional_variance, labelled->observe(start).conditional_variance - 0.05);
}

TEST(MeanfieldCircle, PlainValuesAverageTheScoreOverTheLabels) {
  // Rope with plain values, every row the same density: the score of a label pair is
  // beta cos(delta + xi_c' - xi_c) and the value does not turn, so summed over M_xi equally
  // spaced nodes the kernel is (I_0(beta) + 2 sum_p I_{p M_xi}(beta) cos(p M_xi delta)) sin(delta):
  // beta = 0's velocity times I_0(beta), up to I_16(2) ~ 1e-14.
  const std::size_t labels = 16, angles = 64;
  const double beta = 2.0;
  CircleOptions options;
  options.angles = angles;
  options.labelled = true;
  auto plain = make_circle_solver(rope_label_model(labels, beta, ValueTransport::Plain), options);
  options.labelled = false;
  auto flat = make_circle_solver(circle_model(0.0, Normalization::Usa), options);
  const std::vector<double> g = smooth_start(*flat);
  std::vector<double> rows, plain_rate, flat_rate;
  for (std::size_t c = 0; c < labels; ++c) rows.insert(rows.end(), g.begin(), g.end());
  plain->rate(rows, plain_rate);
  flat->rate(g, flat_rate);
  double gap = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    gap = std::max(gap, std::abs(plain_rate[i] - std::cyl_bessel_i(0.0, beta) * flat_rate[i % angles]));
    scale = std::max(scale, std::abs(plain_rate[i]));
  }
  EXPECT_GT(scale, 1e-3);
  EXPECT_LT(gap, 1e-12 * scale);
}

TEST(MeanfieldCircle, TheUniformStateLosesStabilityAtTheCriticalNoise) {
  // kappa_c = beta / I_1(beta) (USA) and beta I_0 / I_1 (SA): the first mode decays below it
  // and grows above it.
  const double beta = 2.0;
  for (Normalization normalization : {Normalization::Usa, Normalization::Sa}) {
    const double critical = beta * (normalization == Normalization::Sa ? std::cyl_bessel_i(0.0, beta) : 1.0) /
                            std::cyl_bessel_i(1.0, beta);
    for (double factor : {0.9, 1.1}) {
      CircleOptions options;
      options.angles = 128;
      options.tolerance = {1e-6, 1e-9};
      auto solver = make_circle_solver(circle_model(beta, normalization, factor * critical), options);
      std::vector<double> density;
      for (double theta : solver->grid().theta) density.push_back((1.0 + 0.01 * std::cos(theta)) / (2.0 * kPi));
      const double start = solver->observe(density).order_parameter;
      double t = 0.0;
      while (t < 10.0) t += solver->step(density, 10.0 - t);
      const double end = solver->observe(density).order_parameter;
      if (factor < 1.0)
        EXPECT_LT(end, 0.8 * start) << "kappa " << factor << " kappa_c";
      else
        EXPECT_GT(end, 1.2 * start) << "kappa " << factor << " kappa_c";
    }
  }
}

double gegenbauer_rate(std::size_t d, int l, double beta) {
  // c_l(beta) = Gamma(d/2) (2/beta)^(d/2 - 1) I_{l + d/2 - 1}(beta)
  const double half = double(d) / 2.0;
  return std::exp(std::lgamma(half) + (half - 1.0) * std::log(2.0 / beta)) * std::cyl_bessel_i(l + half - 1.0, beta);
}

/// The worst relative error of the growth rates of P_1..P_4 on a zonal grid (noise kappa = 20).
double zonal_rate_error(std::size_t d, double beta, std::size_t cells) {
  IsotropicInteraction interaction;
  interaction.d = d;
  interaction.beta = beta;
  interaction.noise_kappa = 20.0;
  auto solver = make_zonal_solver(interaction, cells, StepTolerance{});
  double worst = 0.0;
  for (int l = 1; l <= 4; ++l) {
    // P_l(cos theta), the Gegenbauer polynomial with P_l(1) = 1.
    std::vector<double> mode;
    for (double theta : solver->grid().theta) {
      const double t = std::cos(theta);
      double previous = 1.0, current = t;
      for (int k = 2; k <= l; ++k) {
        const double next = ((2.0 * k + d - 4.0) * t * current - (k - 1.0) * previous) / (k + d - 3.0);
        previous = current;
        current = next;
      }
      mode.push_back(current);
    }
    const double eigenvalue = l * (l + double(d) - 2.0);
    const double expected = eigenvalue * (gegenbauer_rate(d, l, beta) / beta - 1.0 / 20.0);
    worst = std::max(worst, std::abs(measured_rate(*solver, mode) / expected - 1.0));
  }
  return worst;
}

TEST(MeanfieldZonal, GrowthRatesAreTheGegenbauerFormula) {
  for (std::size_t d : {std::size_t{2}, std::size_t{3}, std::size_t{8}}) {
    const double error = zonal_rate_error(d, 2.0, 1024);
    std::printf("[zonal d=%zu, 1024 cells] worst relative rate error %.2e\n", d, error);
    EXPECT_LT(error, 1e-4) << "d " << d;
  }
  // d = 128: the measure's width in theta is about 1/sqrt(d), so the cells must be finer for
  // the same error; the refinement shows the second order (docs/meanfield.md has the table
  // down to 1e-4).
  const double coarse = zonal_rate_error(128, 30.0, 256), fine = zonal_rate_error(128, 30.0, 512);
  std::printf("[zonal d=128] worst relative rate error %.2e (256 cells), %.2e (512 cells)\n", coarse, fine);
  EXPECT_LT(fine, 3e-3);
  EXPECT_GT(std::log2(coarse / fine), 1.8);
  EXPECT_LT(std::log2(coarse / fine), 2.3);
}

}  // namespace
}  // namespace mfattn::meanfield
