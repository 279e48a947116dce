// Tier 2 of the tests (docs/testing.md): one test body, "backend X agrees with the reference
// backend on every model option", instantiated for every backend of the registry
// (backend_names()) other than the reference itself. A backend this build or machine lacks
// (the CUDA stub, or no device) skips itself; a new backend is covered by registering it.
// Tier 1 (interfaces without a backend: options, registry, output layout) and tier 3 (exact
// facts: analytic reductions, invariants, convergence orders) are the other test files.
#include "mfattn/app/run_choices.hpp"
#include "test_support.hpp"

namespace mfattn {
namespace {

using testing::config;

std::vector<std::string> backends_under_test() {
  std::vector<std::string> names;
  for (const std::string& name : backend_names())
    if (name != "reference") names.push_back(name);
  return names;
}

// Every model option a backend must honour, each with the rest at its default: Q, K, V,
// gauges and value transport, masks, every auxiliary factor, prefix tokens with and without
// the per-prompt rule, presences and null tokens, rescaled time, replicas.
const std::vector<std::vector<std::string>> kModelOptions = {
    {},
    {"--q", "gaussian", "--k", "gaussian", "--v", "goe"},
    {"--v", "minus-qk", "--q", "goe"},
    {"--mask", "causal", "--time-scale", "rescaled"},
    {"--mask", "window", "--window", "3"},
    {"--aux-factor", "distance", "--aux-lambda", "0.3", "--mask", "window", "--window", "5"},
    {"--aux-factor", "gaussian", "--aux-sigma", "2", "--mask", "causal"},
    {"--aux-factor", "cosine", "--aux-omega", "0.7"},
    {"--aux-factor", "power", "--aux-power", "1.3", "--aux-power-scale", "0.4", "--prefix", "2",
     "--mask", "window", "--window", "6"},
    {"--aux-factor", "toeplitz", "--toeplitz-coefficients", "1,-0.5,0.25", "--toeplitz-frequencies",
     "0.3,1.1,2"},
    {"--aux-factor", "cauchy", "--aux-gamma", "1.8", "--mask", "causal", "--prefix", "2"},
    {"--geometry", "rope", "--values", "plain"},
    {"--geometry", "rope-mixed", "--k", "gaussian"},
    {"--prefix", "5", "--prefix-weight", "2.5"},
    {"--prefix", "4", "--mask", "per-prompt", "--prompts", "2"},
    {"--prefix", "3", "--mask", "window+per-prompt", "--window", "4", "--prompts", "2"},
    {"--prefix", "3", "--aux-factor", "distance", "--aux-lambda", "0.2", "--mask", "causal"},
    {"--prefix", "2", "--aux-factor", "toeplitz", "--toeplitz-coefficients", "0.8,0.3",
     "--toeplitz-frequencies", "0.5,1.5", "--prefix-weight", "1.5"},
    {"--amplitudes", "0.7", "--null-tokens", "3", "--tau", "0.5"},
    {"--init", "clustered", "--k", "goe", "--mask", "causal"},
    // The first token sees no source: it stays, under SA too (no 0/0).
    {"--mask", "causal-strict", "--aux-factor", "distance", "--aux-lambda", "0.05"},
    {"--mask", "causal-strict", "--prefix", "2", "--q", "gaussian"},
};

class BackendAgreesWithReference : public ::testing::TestWithParam<std::string> {};

TEST_P(BackendAgreesWithReference, OnEveryModelOption) {
  const std::string backend_name = GetParam();
  // Whether this build and machine have the backend at all, asked once: a backend that is
  // there must then take every model below (a refusal later is a failure, not a skip).
  {
    const RunConfig cfg = config({"--n", "4"});
    try {
      make_backend(backend_name, build_model(cfg), BackendOptions{1});
    } catch (const BackendUnavailable& error) {
      GTEST_SKIP() << error.what();
    }
  }
  int checked = 0;
  for (const std::string d : {"2", "3", "4", "5", "9", "33", "64"})
    for (const std::string n : {"1", "7", "64", "130"})
      for (const std::string kernel : {"usa", "sa"})
        for (std::size_t option = 0; option < kModelOptions.size(); ++option) {
          // Sign-changing factors are USA only (validate refuses them under SA).
          const std::vector<std::string>& extra = kModelOptions[option];
          const auto factor = std::find(extra.begin(), extra.end(), "--aux-factor");
          const bool sign_changing =
              factor != extra.end() && kAuxFactorOption.find(*std::next(factor))->value.changes_sign;
          if (sign_changing && kernel == "sa") continue;
          // Two prompts need two active tokens.
          if (n == "1" && std::find(extra.begin(), extra.end(), "--prompts") != extra.end()) continue;
          ++checked;
          std::vector<std::string> args = {"--n", n, "--d", d, "--kernel", kernel, "--beta", "2.5",
                                           "--seed", std::to_string(checked), "--replicas", "2"};
          args.insert(args.end(), extra.begin(), extra.end());
          const RunConfig cfg = config(args);
          const Model model = build_model(cfg);
          const State state = build_initial_state(cfg, model);
          const std::unique_ptr<Backend> backend = make_backend(backend_name, model, BackendOptions{2});
          auto reference = make_backend("reference", model, BackendOptions{1});
          std::vector<double> velocity(state.size()), expected(state.size());
          std::vector<double> sums(state.replicas * model.n), expected_sums(sums.size());
          backend->velocity(state.replicas, state.x.data(), velocity.data(), sums.data());
          reference->velocity(state.replicas, state.x.data(), expected.data(), expected_sums.data());
          double scale = 1.0;
          for (double v : expected) scale = std::max(scale, std::fabs(v));
          const std::string label = backend_name + " d " + d + " n " + n + " " + kernel + " option " +
                                    std::to_string(option);
          EXPECT_LE(testing::max_abs_difference(velocity, expected), 1e-13 * scale) << label;
          // Relative to the largest sum: a sign-changing factor's sums may cancel to near 0.
          double largest_sum = 0.0;
          for (double sum : expected_sums) largest_sum = std::max(largest_sum, std::fabs(sum));
          for (std::size_t i = 0; i < sums.size(); ++i)
            EXPECT_NEAR(sums[i], expected_sums[i], 1e-12 * largest_sum) << label << " sum " << i;
        }
  // The grid ran whole: per (d, n) every option under USA and SA, less SA for the three
  // sign-changing options, less the two per-prompt options (both kernels) at n = 1.
  EXPECT_EQ(checked, 7 * 4 * (2 * int(kModelOptions.size()) - 3) - 7 * 2 * 2);
}

INSTANTIATE_TEST_SUITE_P(EveryRegisteredBackend, BackendAgreesWithReference,
                         ::testing::ValuesIn(backends_under_test()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace mfattn
