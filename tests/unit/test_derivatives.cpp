// The field's derivatives (docs/model.md section 2e) in process, where the sanitizer build runs
// them: the JVP against central differences of the velocity along tangents of the sphere, and
// the VJP against the JVP by the adjoint identity, for the numbers too, on models that take
// every kind of term (the full oracle comparison, against PyTorch, is
// tests/python/test_derivatives.py).
#include "test_support.hpp"

#include <random>

#include "mfattn/backends/derivatives.hpp"
#include "mfattn/integrators/dynamics.hpp"

namespace mfattn {
namespace {

using testing::config;
using testing::dot;
double norm(const std::vector<double>& a) { return std::sqrt(dot(a, a)); }

/// Every number of `numbers` in one order, for the adjoint identity over them.
std::vector<double*> flat(FieldNumbers& numbers) {
  std::vector<double*> out;
  auto add = [&](double* data, Eigen::Index size) {
    for (Eigen::Index e = 0; e < size; ++e) out.push_back(data + e);
  };
  for (LayerNumbers& set : numbers.sets) {
    for (HeadNumbers& head : set.heads)
      for (Matrix* m : {&head.query, &head.key, &head.value, &head.output}) add(m->data(), m->size());
    add(set.w1.data(), set.w1.size());
    add(set.b1.data(), set.b1.size());
    add(set.w2.data(), set.w2.size());
    add(set.b2.data(), set.b2.size());
  }
  out.push_back(&numbers.beta);
  add(numbers.prefix.data(), Eigen::Index(numbers.prefix.size()));
  add(numbers.presence.data(), Eigen::Index(numbers.presence.size()));
  add(numbers.factor.data(), Eigen::Index(numbers.factor.size()));
  return out;
}

void expect_derivatives_hold(const std::vector<std::string>& args, const std::string& backend_name) {
  SCOPED_TRACE(backend_name);
  const RunConfig cfg = config(args);
  const Model model = build_model(cfg);
  const State state = build_initial_state(cfg, model);
  auto backend = make_backend(backend_name, model, BackendOptions{1});
  Dynamics field(model, *backend, state.replicas);
  const std::size_t size = state.x.size(), d = model.d;
  std::mt19937_64 random(3);
  std::normal_distribution<double> normal;
  std::vector<double> t(size), w(size);
  for (double& e : t) e = normal(random);
  for (double& e : w) e = normal(random);
  for (std::size_t row = 0; row < size / d; ++row) {  // tangent to the sphere
    double radial = 0.0;
    for (std::size_t c = 0; c < d; ++c) radial += t[row * d + c] * state.x[row * d + c];
    for (std::size_t c = 0; c < d; ++c) t[row * d + c] -= radial * state.x[row * d + c];
  }
  std::vector<double> jt(size), jtw(size);
  field.jvp(state.x.data(), t.data(), nullptr, jt.data());
  FieldNumbers gradient = zero_numbers(model);
  field.vjp(state.x.data(), w.data(), jtw.data(), gradient);
  EXPECT_LE(std::abs(dot(w, jt) - dot(jtw, t)), 1e-13 * norm(w) * norm(jt));
  // Central differences along x(h) = N(x + h t).
  const double h = 1e-5;
  auto moved = [&](double s) {
    std::vector<double> y(size), v(size);
    for (std::size_t row = 0; row < size / d; ++row) {
      double norm2 = 0.0;
      for (std::size_t c = 0; c < d; ++c) {
        y[row * d + c] = state.x[row * d + c] + s * t[row * d + c];
        norm2 += y[row * d + c] * y[row * d + c];
      }
      for (std::size_t c = 0; c < d; ++c) y[row * d + c] /= std::sqrt(norm2);
    }
    field.velocity(y.data(), v.data());
    return v;
  };
  const std::vector<double> plus = moved(h), minus = moved(-h);
  std::vector<double> error(size);
  for (std::size_t e = 0; e < size; ++e) error[e] = (plus[e] - minus[e]) / (2 * h) - jt[e];
  EXPECT_LE(norm(error), 1e-7 * norm(jt));
  // The numbers: <w, J_theta tau> = <J_theta^T w, tau> for a random tau.
  FieldNumbers tangent = zero_numbers(model);
  for (double* e : flat(tangent)) *e = normal(random);
  for (std::size_t i = 0; i < model.n; ++i)
    if (!(model.presence[i] > 0.0)) tangent.presence[i] = 0.0;
  std::vector<double> zero(size, 0.0), jtau(size);
  field.jvp(state.x.data(), zero.data(), &tangent, jtau.data());
  double along = 0.0;
  const std::vector<double*> g = flat(gradient), tau = flat(tangent);
  for (std::size_t e = 0; e < g.size(); ++e) along += *g[e] * *tau[e];
  EXPECT_LE(std::abs(dot(w, jtau) - along), 1e-12 * norm(w) * norm(jtau));
}

TEST(Derivatives, ALayerWithRopePrefixFactorAndNullTokensHoldsItsIdentities) {
  const std::vector<std::string> args = {"--n", "9", "--d", "4", "--kernel", "sa", "--heads", "2", "--head-dim", "2",
                                         "--mlp", "3", "--mlp-activation", "gelu", "--q", "gaussian", "--k", "gaussian",
                                         "--v", "gaussian", "--geometry", "rope", "--prefix", "2", "--aux-factor",
                                         "distance", "--aux-lambda", "0.3", "--null-tokens", "2", "--replicas", "2"};
  for (const char* backend : {"reference", "cpu"}) expect_derivatives_hold(args, backend);
}

TEST(Derivatives, SinkhornAndUsaWithAMultiplierHoldTheirIdentities) {
  expect_derivatives_hold({"--n", "8", "--d", "3", "--kernel", "sinkhorn", "--sinkhorn-iterations", "4", "--sinkhorn-tol",
                           "0", "--q", "gaussian", "--k", "gaussian", "--v", "gaussian", "--amplitudes",
                           "1,2,0.5,1.5,1,3,0.7,1.2"},
                          "reference");
  expect_derivatives_hold({"--n", "8", "--d", "3", "--kernel", "usa", "--aux-factor", "toeplitz",
                           "--toeplitz-coefficients", "1,0.4", "--toeplitz-frequencies", "0.3,0.8", "--q", "gaussian",
                           "--k", "gaussian", "--v", "plus-qk", "--values", "plain", "--time-scale", "rescaled",
                           "--normalization", "ngpt"},
                          "reference");
}

// A backend keeps a used tape's arrays for the next forward pass (the VJP's and JVP's too):
// derivatives taken after others at another state are a fresh backend's, to the bit, on both
// backends and on 1 and 2 threads (in the sanitizer build too).
TEST(Derivatives, ABackendThatTookDerivativesElsewhereGivesAFreshOnesBits) {
  const RunConfig cfg = config(
      {"--n",          "40",       "--d",           "4",        "--kernel",     "sa",
       "--heads",      "2",        "--head-dim",    "2",        "--mlp",        "3",
       "--q",          "gaussian", "--k",           "gaussian", "--v",          "gaussian",
       "--geometry",   "rope",     "--prefix",      "2",        "--aux-factor", "distance",
       "--aux-lambda", "0.3",      "--null-tokens", "2",        "--replicas",   "2"});
  const Model model = build_model(cfg);
  const State state = build_initial_state(cfg, model);
  const std::size_t size = state.x.size();
  std::mt19937_64 random(7);
  std::normal_distribution<double> normal;
  std::vector<double> elsewhere(size), w(size), t(size);
  for (double& e : elsewhere) e = normal(random);
  for (double& e : w) e = normal(random);
  for (double& e : t) e = normal(random);
  auto derivatives = [&](Dynamics& field) {
    std::vector<double> out(size), jvp(size);
    FieldNumbers gradient = zero_numbers(model);
    field.vjp(state.x.data(), w.data(), out.data(), gradient);
    field.jvp(state.x.data(), t.data(), nullptr, jvp.data());
    for (double* e : flat(gradient)) out.push_back(*e);
    out.insert(out.end(), jvp.begin(), jvp.end());
    return out;
  };
  for (const char* name : {"reference", "cpu"})
    for (int threads : {1, 2}) {
      SCOPED_TRACE(std::string(name) + ", " + std::to_string(threads) + " threads");
      auto used = make_backend(name, model, BackendOptions{threads});
      Dynamics field(model, *used, state.replicas);
      std::vector<double> scratch(size);
      FieldNumbers ignored = zero_numbers(model);
      field.vjp(elsewhere.data(), w.data(), scratch.data(), ignored);
      field.jvp(elsewhere.data(), t.data(), nullptr, scratch.data());
      auto fresh_backend = make_backend(name, model, BackendOptions{threads});
      Dynamics fresh(model, *fresh_backend, state.replicas);
      EXPECT_EQ(derivatives(field), derivatives(fresh));
    }
}

/// One backend's VJP (x's cotangent, then every number's) and JVP (along x's and the numbers'
/// tangents) at the model's initial state, for fixed random w, t and tau.
std::vector<double> derivatives_of(const RunConfig& cfg, const std::string& backend_name,
                                   int threads) {
  const Model model = build_model(cfg);
  const State state = build_initial_state(cfg, model);
  auto backend = make_backend(backend_name, model, BackendOptions{threads});
  Dynamics field(model, *backend, state.replicas);
  const std::size_t size = state.x.size();
  std::mt19937_64 random(5);
  std::normal_distribution<double> normal;
  std::vector<double> w(size), t(size), x_bar(size), jvp(size);
  for (double& e : w) e = normal(random);
  for (double& e : t) e = normal(random);
  FieldNumbers gradient = zero_numbers(model), tangent = zero_numbers(model);
  for (double* e : flat(tangent)) *e = normal(random);
  for (std::size_t i = 0; i < model.n; ++i)
    if (!(model.presence[i] > 0.0)) tangent.presence[i] = 0.0;
  field.vjp(state.x.data(), w.data(), x_bar.data(), gradient);
  field.jvp(state.x.data(), t.data(), &tangent, jvp.data());
  std::vector<double> out = x_bar;
  for (double* e : flat(gradient)) out.push_back(*e);
  out.insert(out.end(), jvp.begin(), jvp.end());
  return out;
}

// The CPU backend's lanes (backends/cpu/derivative_lanes.cpp) against the reference's pair-by-pair
// passes, for operand sizes the lanes take as compile-time constants (2, 3, 4, 8) and as wide
// rows (5, 6: the GEMM path), with masks, log-term and multiplier factors, prefix tokens,
// presences, null tokens, eps_den and the rescaled time; and the same bits on 1 and 2 threads
// (n = 600 takes a team; n = 260 with 4 heads runs the heads side by side). Every kernel set
// runs this (tests/run.sh's reruns).
TEST(Derivatives, TheCpuLanesAgreeWithThePairByPairPassesAndKeepTheirBitsOnTwoThreads) {
  std::string presences = "1";  // 30 presences from 0.5 to 3
  for (int i = 1; i < 30; ++i) {
    presences += ',';
    presences += std::to_string(0.5 + 0.0862 * i);
  }
  const std::vector<std::vector<std::string>> cases = {
      {"--n", "600", "--d", "3", "--kernel", "sa", "--q", "gaussian", "--k", "gaussian", "--v",
       "gaussian", "--beta", "3"},
      {"--n",      "30",  "--d",          "2",        "--kernel",      "usa",        "--q",
       "gaussian", "--k", "gaussian",     "--v",      "gaussian",      "--geometry", "rope",
       "--prefix", "3",   "--time-scale", "rescaled", "--null-tokens", "2"},
      {"--n", "30", "--d", "4", "--kernel", "sa", "--q", "gaussian", "--k", "gaussian", "--v",
       "gaussian", "--mask", "causal", "--eps-den", "0.05", "--amplitudes", presences},
      {"--n", "30",       "--d",          "8",        "--kernel",
       "sa",  "--q",      "gaussian",     "--k",      "gaussian",
       "--v", "gaussian", "--aux-factor", "power",    "--aux-power",
       "0.7", "--mask",   "window",       "--window", "9"},
      {"--n",           "30",       "--d",          "6",        "--kernel",    "sa",
       "--heads",       "2",        "--head-dim",   "3",        "--values",    "plain",
       "--q",           "gaussian", "--k",          "gaussian", "--v",         "gaussian",
       "--prefix",      "2",        "--aux-factor", "gaussian", "--aux-sigma", "2",
       "--null-tokens", "3"},
      {"--n",          "30",     "--d",         "5",   "--kernel",     "usa",     "--beta",
       "0.5",          "--q",    "gaussian",    "--k", "gaussian",     "--v",     "gaussian",
       "--aux-factor", "cosine", "--aux-omega", "0.4", "--time-scale", "rescaled"},
      // n^2 H above 2^18: two threads take the heads side by side.
      {"--n", "260", "--d", "8", "--kernel", "sa", "--heads", "4", "--head-dim", "2", "--mlp", "3",
       "--q", "gaussian", "--k", "gaussian", "--v", "gaussian"},
  };
  for (const std::vector<std::string>& args : cases) {
    SCOPED_TRACE(args[1] + " tokens, d = " + args[3] + ", " + args[5]);
    const RunConfig cfg = config(args);
    const std::vector<double> reference = derivatives_of(cfg, "reference", 1);
    const std::vector<double> lanes = derivatives_of(cfg, "cpu", 1);
    std::vector<double> error(lanes.size());
    for (std::size_t e = 0; e < lanes.size(); ++e) error[e] = lanes[e] - reference[e];
    EXPECT_LE(norm(error), 1e-12 * norm(reference));
    EXPECT_EQ(derivatives_of(cfg, "cpu", 2), lanes);
  }
}

}  // namespace
}  // namespace mfattn
