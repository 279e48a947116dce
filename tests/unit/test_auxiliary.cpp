// Auxiliary variables (docs/model.md sections 2-4): gauges, factors, plain values; the exact facts
// of seed 003 and agreement with the pair-by-pair reference backend.
#include <Eigen/Dense>
#include <fstream>

#include "mfattn/core/gauge.hpp"
#include "mfattn/observers/observables.hpp"
#include "test_support.hpp"

namespace mfattn {
namespace {

using testing::config;
using testing::simulate;
using testing::with;


// Every geometry, factor and value choice agrees with the reference backend, for single
// evaluations and along short trajectories.
TEST(Auxiliary, EveryChoiceAgreesWithTheReferenceBackend) {
  const std::vector<std::vector<std::string>> cases = {
      {"--geometry", "rope", "--d", "4"},
      {"--geometry", "rope", "--d", "3", "--values", "plain"},
      {"--geometry", "rope", "--d", "6", "--rope-freqs", "1,0.5,0.25", "--kernel", "sa"},
      {"--geometry", "rope-axial", "--d", "4"},
      {"--geometry", "rope-mixed", "--d", "6", "--kernel", "sa"},
      {"--geometry", "rope-conjugated", "--d", "5"},
      {"--geometry", "lie", "--d", "4", "--positions", "random", "--pos-scale", "0.05"},
      {"--geometry", "rope", "--d", "12", "--q", "gaussian", "--k", "gaussian"},
      {"--aux-factor", "distance", "--aux-lambda", "0.3"},
      {"--aux-factor", "gaussian", "--aux-sigma", "4", "--kernel", "sa", "--mask", "causal"},
      {"--aux-factor", "cosine", "--aux-omega", "0.7", "--positions", "uniform"},
      {"--aux-factor", "distance", "--positions", "grid", "--d", "9", "--mask", "window", "--window", "3"},
      {"--geometry", "rope", "--aux-factor", "cosine", "--amplitudes", "0.9", "--null-tokens", "4"},
      {"--aux-factor", "toeplitz", "--toeplitz-coefficients", "0.6,-0.3,0.2", "--toeplitz-frequencies",
       "0.2,0.9,2.5", "--positions", "uniform"},
      {"--geometry", "rope", "--aux-factor", "toeplitz", "--toeplitz-coefficients", "1,0.5",
       "--toeplitz-frequencies", "0.1,0.35", "--null-tokens", "3", "--mask", "causal"},
      {"--aux-factor", "power", "--aux-power", "1.5"},
      {"--aux-factor", "power", "--aux-power", "0.7", "--aux-power-scale", "3", "--kernel", "sa", "--mask", "causal", "--positions", "random"},
      {"--aux-factor", "power", "--positions", "grid", "--d", "5", "--mask", "window", "--window", "3",
       "--null-tokens", "2"},
      {"--aux-factor", "cauchy", "--aux-gamma", "2.5"},
      {"--aux-factor", "cauchy", "--aux-gamma", "0.4", "--kernel", "sa", "--mask", "causal", "--positions", "random"},
  };
  for (const auto& extra : cases) {
    const auto args = with({"--n", "37", "--beta", "1.5", "--seed", "6", "--horizon", "0.5",
                            "--dt", "0.01", "--save-every", "0.5"},
                           extra);
    const auto cfg = config(args);
    std::string label;
    for (const auto& a : extra) label += a + " ";
    testing::expect_cpu_matches_reference(cfg, label);
  }
}

// With commuting generators and transported values, y_i = G(xi_i) x_i follows plain USA/SA:
// the integrators commute with the fixed rotations, so the match is to rounding.
TEST(Auxiliary, GaugedTokensFollowPlainDynamicsInTheRotatedFrame) {
  const auto dir = testing::scratch_dir("gauge_frame");
  for (const std::string geometry : {"rope", "rope-axial", "rope-conjugated"})
    for (const std::string kernel : {"usa", "sa"}) {
      const auto gauged_cfg = config({"--n", "24", "--d", "4", "--geometry", geometry, "--kernel",
                                      kernel, "--horizon", "3", "--dt", "0.01", "--save-every", "3"});
      const auto gauged = simulate(gauged_cfg);
      const auto& gauge = dynamic_cast<const PositionalGauge&>(*gauged.model.gauge);
      auto rotate = [&](const State& s) {
        std::vector<double> y(s.x.size());
        for (std::size_t i = 0; i < s.n; ++i) gauge.apply(i, s.token(0, i), y.data() + i * s.d);
        return y;
      };
      const auto y0 = rotate(gauged.frames.front());
      const std::string start = (dir / (geometry + kernel + ".txt")).string();
      {
        std::ofstream rows(start);
        rows.precision(17);
        for (std::size_t i = 0; i < 24; ++i)
          rows << y0[i * 4] << ' ' << y0[i * 4 + 1] << ' ' << y0[i * 4 + 2] << ' ' << y0[i * 4 + 3] << '\n';
      }
      const auto plain = simulate(config({"--n", "24", "--d", "4", "--kernel", kernel, "--init",
                                          "file", "--init-file", start, "--normalize-init",
                                          "--horizon", "3", "--dt", "0.01", "--save-every", "3"}));
      EXPECT_LT(testing::max_abs_difference(rotate(gauged.frames.back()), plain.frames.back().x), 1e-12)
          << geometry << " " << kernel;
      EXPECT_GT(testing::max_abs_difference(plain.frames.front().x, plain.frames.back().x), 1e-2);
    }
}

double coordinate_spread(const State& s, std::size_t c) {
  double lo = 1e300, hi = -1e300;
  for (std::size_t i = 0; i < s.n; ++i) {
    lo = std::min(lo, s.token(0, i)[c]);
    hi = std::max(hi, s.token(0, i)[c]);
  }
  return hi - lo;
}

// RoPE in d = 3 rotates the x-y plane: y collapses, so x ends on a latitude circle.
TEST(Auxiliary, RopeInThreeDimensionsEndsOnALatitudeCircle) {
  for (const std::string kernel : {"usa", "sa"}) {
    const auto t = simulate(config({"--n", "64", "--d", "3", "--geometry", "rope", "--kernel",
                                    kernel, "--horizon", "20", "--save-every", "20"}));
    const State& end = t.frames.back();
    EXPECT_LT(coordinate_spread(end, 2), 1e-6) << kernel;
    EXPECT_LT(min_inner_product(t.model, end.x.data()), 0.5) << kernel;
  }
}

// Cosine Toeplitz with uniform positions keeps a spread maximiser near a great circle; the
// distance bias with lambda times the position range about 1 collapses.
TEST(Auxiliary, CosineKeepsAGreatCircleAndDistanceBiasCollapses) {
  const auto cosine = simulate(config({"--n", "64", "--d", "3", "--aux-factor", "cosine",
                                       "--positions", "uniform", "--horizon", "20", "--save-every", "20"}));
  const State& end = cosine.frames.back();
  Eigen::Matrix3d moment = Eigen::Matrix3d::Zero();
  for (std::size_t i = 0; i < end.n; ++i) {
    const Eigen::Map<const Eigen::Vector3d> x(end.token(0, i));
    moment += x * x.transpose() / double(end.n);
  }
  const Eigen::Vector3d eigenvalues = Eigen::SelfAdjointEigenSolver<Eigen::Matrix3d>(moment).eigenvalues();
  EXPECT_LT(eigenvalues[0], 1e-3);                 // flat: the points lie in a plane through 0
  EXPECT_GT(eigenvalues[1], 0.4);                  // and spread around a circle in it
  EXPECT_LT(min_inner_product(cosine.model, end.x.data()), -0.9);

  const auto distance = simulate(config({"--n", "64", "--d", "3", "--aux-factor", "distance",
                                         "--aux-lambda", "1", "--pos-scale", "0.015625",
                                         "--horizon", "20", "--save-every", "20"}));
  EXPECT_GT(min_inner_product(distance.model, distance.frames.back().x.data()), 0.999);
}

// Energy ascends along every gradient-flow auxiliary kernel.
TEST(Auxiliary, EnergyAscendsForEveryGradientFlowKernel) {
  const std::vector<std::vector<std::string>> kernels = {
      {"--geometry", "rope"}, {"--geometry", "rope-conjugated", "--d", "4"},
      {"--aux-factor", "distance", "--aux-lambda", "0.1"}, {"--aux-factor", "gaussian", "--aux-sigma", "8"},
      {"--aux-factor", "cosine", "--positions", "uniform"}, {"--geometry", "rope", "--kernel", "sa"},
      {"--aux-factor", "toeplitz", "--toeplitz-coefficients", "1,-0.4,0.3", "--toeplitz-frequencies",
       "0.15,0.6,1.7", "--positions", "uniform"},
      {"--aux-factor", "power", "--aux-power", "0.8", "--aux-power-scale", "0.3"},
      {"--aux-factor", "power", "--aux-power", "2", "--kernel", "sa"},
      {"--aux-factor", "cauchy", "--aux-gamma", "3"}, {"--aux-factor", "cauchy", "--aux-gamma", "1.5", "--kernel", "sa"}};
  for (const auto& extra : kernels) {
    const auto t = simulate(config(with({"--n", "40", "--horizon", "8", "--save-every", "0.1"}, extra)));
    ASSERT_TRUE(t.model.is_gradient_flow());
    auto backend = make_backend("cpu", t.model, BackendOptions{1});
    std::vector<double> v(t.model.n * t.model.d), sums(t.model.n);
    double previous = -1e300, first = 0.0;
    for (const auto& frame : t.frames) {
      backend->velocity(1, frame.x.data(), v.data(), sums.data());
      const double energy = energy_from_weight_sums(t.model, frame.x.data(), sums.data());
      if (previous == -1e300) first = energy;
      EXPECT_GE(energy, previous - 1e-13 * std::fabs(previous)) << extra[1] << " t " << frame.time;
      previous = energy;
    }
    EXPECT_GT(previous, first) << extra[1];
  }
  // Plain values are no gradient flow, and the output says so.
  EXPECT_FALSE(build_model(config({"--geometry", "rope", "--values", "plain"})).is_gradient_flow());
}

// exp(A) by scaling and squaring with a Taylor series, written here (no Eigen module, no
// mfattn code), for the dense reference below.
Eigen::MatrixXd exponential(const Eigen::MatrixXd& a) {
  int squarings = 0;
  double norm = a.cwiseAbs().rowwise().sum().maxCoeff();
  while (norm > 0.25) {
    norm /= 2;
    ++squarings;
  }
  const Eigen::MatrixXd scaled = a / std::pow(2.0, squarings);
  Eigen::MatrixXd sum = Eigen::MatrixXd::Identity(a.rows(), a.cols()), term = sum;
  for (int k = 1; k <= 24; ++k) {
    term = term * scaled / double(k);
    sum += term;
  }
  for (int s = 0; s < squarings; ++s) sum = sum * sum;
  return sum;
}

// Every geometry against a dense implementation written here from the stored generators and
// positions (what a reader of the file has): G_i = exp(sum_a xi_ia Omega_a), y = G x,
// u_i = G_i^T sum_j w_ij y_j / (n or sum_j w_ij), w_ij = exp(beta <y_i, y_j>), the same RK4
// steps (stages unnormalised, projection after the step). Agreement to 1e-9 at t = 0.5.
TEST(Auxiliary, EveryGeometryAgreesWithADenseImplementationWrittenHere) {
  const std::vector<std::vector<std::string>> cases = {
      {"--geometry", "rope", "--d", "4"},
      {"--geometry", "rope", "--d", "5", "--pos-scale", "0.7"},
      {"--geometry", "rope-axial", "--d", "4"},
      {"--geometry", "rope-mixed", "--d", "6"},
      {"--geometry", "rope-conjugated", "--d", "5"},
      {"--geometry", "lie", "--d", "4", "--positions", "random", "--pos-scale", "0.05"},
  };
  for (const std::string kernel : {"usa", "sa"})
    for (const auto& extra : cases) {
      const auto t = simulate(config(with({"--n", "20", "--beta", "1.5", "--kernel", kernel, "--seed",
                                           "2", "--horizon", "0.5", "--dt", "0.01",
                                           "--save-every", "0.5"},
                                          extra)));
      const auto& generators = dynamic_cast<const PositionalGauge&>(*t.model.gauge).generators();
      const std::size_t n = t.model.n, d = t.model.d, k = t.model.position_dim;
      std::vector<Eigen::MatrixXd> g(n);
      for (std::size_t i = 0; i < n; ++i) {
        Eigen::MatrixXd exponent = Eigen::MatrixXd::Zero(d, d);
        for (std::size_t a = 0; a < k; ++a)
          exponent += t.model.positions[i * k + a] *
                      Eigen::Map<const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
                          generators[a].data(), d, d);
        g[i] = exponential(exponent);
      }
      auto field = [&](const Eigen::MatrixXd& x) {  // rows are tokens
        Eigen::MatrixXd y(n, d), v(n, d);
        for (std::size_t i = 0; i < n; ++i) y.row(i) = (g[i] * x.row(i).transpose()).transpose();
        const Eigen::MatrixXd w = (1.5 * y * y.transpose()).array().exp().matrix();
        const Eigen::MatrixXd z = w * y;
        for (std::size_t i = 0; i < n; ++i) {
          const double norm = kernel == "usa" ? double(n) : w.row(i).sum();
          const Eigen::VectorXd u = g[i].transpose() * z.row(i).transpose() / norm;
          const Eigen::VectorXd xi = x.row(i).transpose();
          v.row(i) = (u - xi.dot(u) * xi).transpose();
        }
        return v;
      };
      Eigen::MatrixXd x(n, d);
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t c = 0; c < d; ++c) x(i, c) = t.frames.front().token(0, i)[c];
      const double h = 0.01;
      for (int step = 0; step < 50; ++step) {
        const Eigen::MatrixXd k1 = field(x), k2 = field(x + 0.5 * h * k1), k3 = field(x + 0.5 * h * k2),
                              k4 = field(x + h * k3);
        x += h * (k1 / 6 + k2 / 3 + k3 / 3 + k4 / 6);
        x.rowwise().normalize();
      }
      double worst = 0.0, moved = 0.0;
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t c = 0; c < d; ++c) {
          worst = std::max(worst, std::fabs(x(i, c) - t.frames.back().token(0, i)[c]));
          moved = std::max(moved, std::fabs(x(i, c) - t.frames.front().token(0, i)[c]));
        }
      EXPECT_LT(worst, 1e-9) << kernel << " " << extra[1] << " d " << d;
      EXPECT_GT(moved, 1e-3) << kernel << " " << extra[1];
    }
}

// The Toeplitz factor c(dxi) = sum_k a_k cos(omega_k dxi): its one-term series with a_1 = 1 is
// the cosine factor, bit for bit; and USA is linear in the weights, so its velocity is the
// sum of the cosine velocities scaled by a_k (to rounding), on the reference and the CPU.
TEST(Auxiliary, ToeplitzSeriesIsTheCosineFactorTermByTerm) {
  const std::vector<std::string> base = {"--n", "70", "--d", "3", "--beta", "1.5", "--seed", "4",
                                         "--positions", "uniform", "--horizon", "0.5", "--dt", "0.05",
                                         "--save-every", "0.5"};
  const auto cosine = simulate(config(with(base, {"--aux-factor", "cosine", "--aux-omega", "0.45"})));
  const auto one_term = simulate(config(with(base, {"--aux-factor", "toeplitz", "--toeplitz-coefficients",
                                                    "1", "--toeplitz-frequencies", "0.45"})));
  ASSERT_EQ(cosine.frames.size(), one_term.frames.size());
  for (std::size_t f = 0; f < cosine.frames.size(); ++f)
    EXPECT_TRUE(testing::bitwise_equal(cosine.frames[f].x.data(), one_term.frames[f].x.data(),
                                       cosine.frames[f].x.size()))
        << "frame " << f;

  const std::vector<double> a = {0.7, -0.4, 0.25}, omega = {0.2, 0.9, 2.5};
  const auto series_cfg = config(with(base, {"--aux-factor", "toeplitz", "--toeplitz-coefficients",
                                             "0.7,-0.4,0.25", "--toeplitz-frequencies", "0.2,0.9,2.5"}));
  const Model series = build_model(series_cfg);
  const State state = build_initial_state(series_cfg, series);
  for (const std::string backend_name : {"reference", "cpu"}) {
    std::vector<double> expected(state.size(), 0.0), velocity(state.size());
    for (std::size_t k = 0; k < a.size(); ++k) {
      Model term = series;
      term.pair_terms.factor = AuxFactor::Cosine;
      term.pair_terms.omega = omega[k];
      make_backend(backend_name, term, BackendOptions{1})->velocity(1, state.x.data(), velocity.data(), nullptr);
      for (std::size_t e = 0; e < expected.size(); ++e) expected[e] += a[k] * velocity[e];
    }
    make_backend(backend_name, series, BackendOptions{1})->velocity(1, state.x.data(), velocity.data(), nullptr);
    EXPECT_LE(testing::max_abs_difference(velocity, expected), 1e-14) << backend_name;
  }
}

std::string usage_message(std::vector<std::string> args) {
  args.insert(args.end(), {"--out", "unused.h5"});
  return testing::usage_message(args);
}

TEST(Auxiliary, SoftmaxWithSignChangingFactorIsRefused) {
  EXPECT_THROW(config({"--kernel", "sa", "--aux-factor", "cosine"}), UsageError);
  EXPECT_EQ(usage_message({"--kernel", "sa", "--aux-factor", "toeplitz"}),
            "--aux-factor toeplitz: the toeplitz factor changes sign, so the SA denominator can vanish: "
            "use --kernel usa");
  EXPECT_EQ(usage_message({"--aux-factor", "toeplitz", "--toeplitz-coefficients", "1,2", "--toeplitz-frequencies", "1"}),
            "--toeplitz-frequencies 1: needs as many numbers as --toeplitz-coefficients (2), got 1");
  EXPECT_EQ(usage_message({"--aux-factor", "toeplitz", "--toeplitz-coefficients",
                           "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1", "--toeplitz-frequencies", "1"}),
            "--toeplitz-coefficients 1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1: needs 1 to 16 finite numbers, comma "
            "separated");
  EXPECT_THROW(build_model(config({"--aux-factor", "toeplitz", "--positions", "grid"})), UsageError);
  EXPECT_THROW(build_model(config({"--geometry", "rope", "--d", "6", "--rope-freqs", "1,2"})), UsageError);
}

}  // namespace
}  // namespace mfattn
