// The kernels layer's formulas (src/kernels/pair_terms.hpp) against numbers written here from
// docs/model.md section 2, pair by pair: every backend evaluates these definitions, so the
// reference backend cannot catch an error in them; this test can. The lane form (the CPU's
// SourceLanes) is held to the scalar form on the same pairs, lane by lane and bit for bit.
#include <cmath>
#include <limits>

#include "backends/cpu/lane_pair_terms.hpp"
#include "backends/model_sources.hpp"
#include "mfattn/core/model_choices.hpp"
#include "test_support.hpp"

namespace mfattn {
namespace {

using kernels::PairTermParameters;
using kernels::ScalarPair;

/// The pair's visibility and factor, as the scalar readers take them (pair_weight_terms).
bool visible_pair(const PairTermParameters& p, const ScalarPair& pair, bool prefix_pair) {
  return kernels::visible(kernels::pair_weight_terms(p, pair, prefix_pair));
}
double factor_of(const PairTermParameters& p, const ScalarPair& pair) {
  return kernels::weight_factor(kernels::pair_weight_terms(p, pair, false));
}

ScalarPair pair_of(const double* receiver, const double* source, std::size_t dim,
                   double receiver_prompt = 0, double source_prompt = 0) {
  return ScalarPair{receiver, source, dim, receiver_prompt, source_prompt};
}

TEST(Kernels, MasksHideExactlyThePairsTheirDefinitionHides) {
  const double at_2[] = {2.0}, at_3[] = {3.0}, at_2_again[] = {2.0};
  PairTermParameters causal;
  causal.mask = MaskKind::Causal;
  EXPECT_TRUE(visible_pair(causal, pair_of(at_3, at_2, 1), false));   // xi_j = 2 <= 3
  EXPECT_FALSE(visible_pair(causal, pair_of(at_2, at_3, 1), false));  // xi_j = 3 > 2
  EXPECT_TRUE(visible_pair(causal, pair_of(at_2, at_2_again, 1), false));

  // Window 5 in k = 2: |(0,0) - (3,4)| = 5 is kept (<=), (3, 4.0000001) is not.
  const double origin[] = {0.0, 0.0}, edge[] = {3.0, 4.0}, beyond[] = {3.0, 4.0000001};
  PairTermParameters window;
  window.mask = MaskKind::Window;
  window.window = 5.0;
  EXPECT_TRUE(visible_pair(window, pair_of(origin, edge, 2), false));
  EXPECT_FALSE(visible_pair(window, pair_of(origin, beyond, 2), false));

  // The per-prompt rule hides another prompt's source, only where the caller applies it.
  PairTermParameters per_prompt;
  per_prompt.per_prompt = true;
  EXPECT_FALSE(visible_pair(per_prompt, pair_of(at_2, at_3, 1, 0, 1), true));
  EXPECT_TRUE(visible_pair(per_prompt, pair_of(at_2, at_3, 1, 1, 1), true));
  EXPECT_TRUE(visible_pair(per_prompt, pair_of(at_2, at_3, 1, 0, 1), false));
  per_prompt.mask = MaskKind::Causal;  // and the mask still applies within a prompt
  EXPECT_FALSE(visible_pair(per_prompt, pair_of(at_2, at_3, 1, 1, 1), true));
}

TEST(Kernels, FactorsTakeTheValuesOfTheirFormulas) {
  const double a[] = {1.0, -2.0}, b[] = {4.0, 2.0};  // |a - b| = 5, first difference -3
  PairTermParameters p;
  EXPECT_EQ(factor_of(p, pair_of(a, b, 2)), 1.0);
  p.factor = AuxFactor::Distance;
  p.lambda = 0.3;
  EXPECT_NEAR(factor_of(p, pair_of(a, b, 2)), std::exp(-1.5), 1e-15);
  p.factor = AuxFactor::Gaussian;
  p.sigma = 2.0;
  EXPECT_NEAR(factor_of(p, pair_of(a, b, 2)), std::exp(-25.0 / 8.0), 1e-15);

  // Toeplitz: c(delta) = sum_k a_k cos(omega_k delta) at delta = xi_i - xi_j = 0.3 (even, so
  // the sign of delta does not matter), and the cosine factor is its one-term case.
  const double xi_i[] = {1.0}, xi_j[] = {0.7};
  p.factor = AuxFactor::Toeplitz;
  p.toeplitz.terms = 3;
  const double coefficient[] = {0.5, -1.25, 2.0}, frequency[] = {1.0, 4.0, 10.0};
  double expected = 0.0;
  for (int k = 0; k < 3; ++k) {
    p.toeplitz.coefficient[k] = coefficient[k];
    p.toeplitz.frequency[k] = frequency[k];
    expected += coefficient[k] * std::cos(frequency[k] * 0.3);
  }
  EXPECT_NEAR(factor_of(p, pair_of(xi_i, xi_j, 1)), expected, 1e-14);
  EXPECT_NEAR(factor_of(p, pair_of(xi_j, xi_i, 1)), expected, 1e-14);
  p.toeplitz.terms = 0;
  EXPECT_EQ(factor_of(p, pair_of(xi_i, xi_j, 1)), 0.0);  // an empty series is 0

  PairTermParameters cosine;
  cosine.factor = AuxFactor::Cosine;
  cosine.omega = 0.8;
  EXPECT_EQ(factor_of(cosine, pair_of(xi_i, xi_j, 1)), std::cos(0.8 * (0.7 - 1.0)));

  // Power (KERPLE): c = (1 + |xi_i - xi_j|)^(-r), |a - b| = 5: 6^(-r); r = 0 is c = 1 exactly.
  PairTermParameters power;
  power.factor = AuxFactor::Power;
  power.power = 0.5;
  EXPECT_NEAR(factor_of(power, pair_of(a, b, 2)), 1.0 / std::sqrt(6.0), 1e-15);
  EXPECT_NEAR(factor_of(power, pair_of(b, a, 2)), 1.0 / std::sqrt(6.0), 1e-15);
  power.power = 2.0;
  EXPECT_NEAR(factor_of(power, pair_of(xi_i, xi_j, 1)), 1.0 / (1.3 * 1.3), 1e-15);
  EXPECT_EQ(factor_of(power, pair_of(xi_i, xi_i, 1)), 1.0);  // delta = 0
  power.power = 0.0;
  EXPECT_EQ(factor_of(power, pair_of(a, b, 2)), 1.0);
  // KERPLE's logarithmic kernel with its distance scale: (1 + s |dxi|)^(-r).
  power.power = 1.5;
  power.power_scale = 2.5;
  EXPECT_NEAR(factor_of(power, pair_of(xi_i, xi_j, 1)), std::pow(1.0 + 2.5 * 0.3, -1.5), 1e-15);
  EXPECT_NEAR(factor_of(power, pair_of(a, b, 2)), std::pow(1.0 + 2.5 * 5.0, -1.5), 1e-15);

  // Cauchy: c = 1 / (1 + |dxi|^2 / gamma^2); gamma = 2: 1 / (1 + 0.09 / 4) and 1 / (1 + 25 / 4).
  PairTermParameters cauchy;
  cauchy.factor = AuxFactor::Cauchy;
  cauchy.gamma = 2.0;
  EXPECT_NEAR(factor_of(cauchy, pair_of(xi_i, xi_j, 1)), 1.0 / (1.0 + 0.09 / 4.0), 1e-15);
  EXPECT_NEAR(factor_of(cauchy, pair_of(a, b, 2)), 1.0 / (1.0 + 25.0 / 4.0), 1e-15);
  EXPECT_NEAR(factor_of(cauchy, pair_of(b, a, 2)), 1.0 / (1.0 + 25.0 / 4.0), 1e-15);
  EXPECT_EQ(factor_of(cauchy, pair_of(xi_i, xi_i, 1)), 1.0);  // delta = 0
}

TEST(Kernels, SymmetryOfTheTermsDecidesTheSymmetricLoop) {
  PairTermParameters p;
  EXPECT_TRUE(kernels::symmetric_log_terms(p));
  p.mask = MaskKind::Window;
  p.factor = AuxFactor::Gaussian;
  EXPECT_TRUE(kernels::symmetric_log_terms(p));
  p.mask = MaskKind::Causal;  // not symmetric
  EXPECT_FALSE(kernels::symmetric_log_terms(p));
  p.mask = MaskKind::Window;
  p.factor = AuxFactor::Power;  // even and a log-term
  EXPECT_TRUE(kernels::symmetric_log_terms(p));
  p.factor = AuxFactor::Cauchy;
  EXPECT_TRUE(kernels::symmetric_log_terms(p));
  p.mask = MaskKind::Full;
  p.factor = AuxFactor::Toeplitz;  // symmetric, but it multiplies the weight
  EXPECT_FALSE(kernels::symmetric_log_terms(p));
}

// The CPU loops read the same formulas through lanes: eight sources at once give, lane by
// lane, the scalar log-term and factor of each pair, bit for bit.
TEST(Kernels, LaneFormEqualsTheScalarFormLaneByLane) {
  using simd::kLanes;
  cpu::SourcePositions sources;
  sources.dim = 2;
  sources.padded_sources = kLanes;
  sources.rows.resize(2 * kLanes);
  sources.prompts.resize(kLanes);
  for (std::size_t j = 0; j < kLanes; ++j) {
    sources.rows[j] = 0.37 * double(j) - 1.1;
    sources.rows[kLanes + j] = std::sin(double(j));
    sources.prompts[j] = double(j % 2);
  }
  const double receiver_xi[] = {0.4, -0.2};
  const cpu::ReceiverPosition receiver{receiver_xi, 1.0};
  for (const MaskKind mask : {MaskKind::Full, MaskKind::Causal, MaskKind::Window})
    for (const auto& choice : kAuxFactorChoices) {  // every factor --aux-factor takes
      const AuxFactor factor = choice.value.factor;
      PairTermParameters p;
      p.mask = mask;
      p.window = 1.1;
      p.factor = factor;
      p.lambda = 0.7;
      p.sigma = 1.3;
      p.omega = 2.1;
      p.power = 0.8;
      p.power_scale = 1.7;
      p.gamma = 0.6;
      p.toeplitz.terms = 2;
      p.toeplitz.coefficient[1] = -0.5;
      p.toeplitz.frequency[1] = 3.0;
      p.per_prompt = true;
      kernels::visit_pair_terms(p, [&](const auto& terms, const auto& prefix_terms) {
        auto check = [&](const auto& formula, const char* which) {
          const simd::Lanes log_lanes = formula.log_term(cpu::SourceLanes{sources, receiver, 0});
          const simd::Lanes factor_lanes = formula.factor(cpu::SourceLanes{sources, receiver, 0});
          for (std::size_t j = 0; j < kLanes; ++j) {
            const double source_xi[] = {sources.rows[j], sources.rows[kLanes + j]};
            const ScalarPair pair{receiver_xi, source_xi, 2, receiver.prompt, sources.prompts[j]};
            const double log_term = formula.log_term(pair), multiplier = formula.factor(pair);
            const double lane_log = log_lanes[j], lane_factor = factor_lanes[j];
            EXPECT_TRUE(testing::bitwise_equal(&log_term, &lane_log, 1))
                << which << " mask " << int(mask) << " factor " << int(factor) << " lane " << j;
            EXPECT_TRUE(testing::bitwise_equal(&multiplier, &lane_factor, 1))
                << which << " mask " << int(mask) << " factor " << int(factor) << " lane " << j;
          }
        };
        check(terms, "moving");
        check(prefix_terms, "prefix");
      });
    }
}

}  // namespace
}  // namespace mfattn
