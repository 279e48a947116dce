// Observables against a brute-force recomputation over the moving tokens.
#include "mfattn/observables.hpp"
#include "test_support.hpp"

namespace mfattn {
namespace {

TEST(Observables, MinAndMeanInnerProductMatchBruteForce) {
  for (const std::string d : {"2", "3", "8", "9", "64"})
    for (const std::string n : {"1", "2", "9", "130", "600"}) {
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

}  // namespace
}  // namespace mfattn
