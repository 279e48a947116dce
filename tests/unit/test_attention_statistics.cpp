// The streamed statistics of one plan (src/kernels/attention_statistics.hpp): against the
// formulas over all sources at once, equal weights exactly, log-weights far beyond exp's
// range, and two halves merged as one stream.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/attention_statistics.hpp"

namespace mfattn {
namespace {

using kernels::PlanStatistics;

struct Sources {
  std::vector<double> logits, values;  // values: 3 numbers a source
};

Sources random_sources(std::size_t n, double scale, unsigned seed) {
  std::mt19937_64 random(seed);
  std::normal_distribution<double> normal;
  Sources s;
  for (std::size_t j = 0; j < n; ++j) {
    s.logits.push_back(scale * normal(random));
    for (int c = 0; c < 3; ++c) s.values.push_back(normal(random));
  }
  return s;
}

PlanStatistics streamed(const Sources& s, std::size_t first, std::size_t last) {
  PlanStatistics plan(3, 5);
  for (std::size_t j = first; j < last; ++j) plan.add(s.logits[j], s.values.data() + 3 * j);
  return plan;
}

void expect_formulas(const PlanStatistics& plan, const Sources& s) {
  const double m = *std::max_element(s.logits.begin(), s.logits.end());
  std::vector<double> p;
  for (double l : s.logits) p.push_back(std::exp(l - m));
  const double z = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& e : p) e /= z;
  double entropy = 0.0, squares = 0.0, output[3] = {0, 0, 0};
  for (std::size_t j = 0; j < p.size(); ++j) {
    if (p[j] > 0) entropy -= p[j] * std::log(p[j]);
    squares += p[j] * p[j];
    for (int c = 0; c < 3; ++c) output[c] += p[j] * s.values[3 * j + c];
  }
  EXPECT_NEAR(plan.entropy(), entropy, 1e-12 * std::max(1.0, entropy));
  EXPECT_NEAR(plan.participation(), 1.0 / squares, 1e-12 / squares);
  EXPECT_NEAR(plan.largest_weight(), *std::max_element(p.begin(), p.end()), 1e-14);
  for (int c = 0; c < 3; ++c) EXPECT_NEAR(plan.output_component(c), output[c], 1e-13);
  std::vector<double> sorted = p;
  std::sort(sorted.rbegin(), sorted.rend());
  for (std::size_t k = 0; k < 5; ++k) EXPECT_NEAR(plan.top_weight(k), sorted[k], 1e-14);
}

TEST(AttentionStatistics, StreamedAreTheFormulas) {
  for (double scale : {0.5, 5.0, 2000.0}) {  // 2000: exp(l) overflows double unshifted
    SCOPED_TRACE(scale);
    const Sources s = random_sources(200, scale, 3);
    expect_formulas(streamed(s, 0, s.logits.size()), s);
  }
}

TEST(AttentionStatistics, EqualWeightsAreExact) {
  Sources s;
  for (int j = 0; j < 64; ++j) {
    s.logits.push_back(-7.25);
    s.values.insert(s.values.end(), {1.0, 2.0, 3.0});
  }
  const PlanStatistics plan = streamed(s, 0, 64);
  EXPECT_EQ(plan.participation(), 64.0);
  EXPECT_EQ(plan.largest_weight(), 1.0 / 64.0);
  EXPECT_DOUBLE_EQ(plan.entropy(), std::log(64.0));
  EXPECT_EQ(plan.output_component(2), 3.0);
  EXPECT_EQ(plan.top_weight(4), 1.0 / 64.0);
}

TEST(AttentionStatistics, TwoHalvesMergedAreOneStream) {
  const Sources s = random_sources(301, 30.0, 5);
  for (std::size_t cut : {0, 1, 150, 300, 301}) {
    SCOPED_TRACE(cut);
    PlanStatistics left = streamed(s, 0, cut);
    left.merge(streamed(s, cut, 301));
    EXPECT_EQ(left.sources, 301u);
    expect_formulas(left, s);
  }
}

}  // namespace
}  // namespace mfattn
