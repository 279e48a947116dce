// The pair loop's exponential: accuracy against libm, exact zeros, NaN propagation.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "backends/cpu/vector_math.hpp"
#include "mfattn/core/rng.hpp"

namespace mfattn {
namespace {

double ulp_error(double value, double reference) {
  const double ulp = std::nextafter(reference, std::numeric_limits<double>::infinity()) - reference;
  return std::fabs(value - reference) / ulp;
}

TEST(VectorMath, Exp2IsWithinTwoUlpOverItsRange) {
  RandomStream stream(1, 99);
  double worst = 0.0;
  for (int block = 0; block < 50000; ++block) {
    simd::Lanes t[4], e[4];
    for (auto& v : t)
      for (std::size_t l = 0; l < simd::kLanes; ++l) {
        // Half the draws near 0 (the weights that matter), half over the whole range.
        const double u = stream.uniform();
        v.set(l, block % 2 ? -u * 1021.0 : -u * 4.0);
      }
    simd::exp2_nonpositive(t, e);
    for (std::size_t k = 0; k < 4; ++k)
      for (std::size_t l = 0; l < simd::kLanes; ++l)
        worst = std::max(worst, ulp_error(e[k][l], std::exp2(t[k][l])));
  }
  EXPECT_LE(worst, 2.0);
}

TEST(VectorMath, Exp2GivesExactZerosOneAndNaN) {
  const double inf = std::numeric_limits<double>::infinity();
  const double inputs[simd::kLanes] = {-inf, -1023.5, -5000.0, 0.0, -0.0, std::nan(""), -1.0, -1021.0};
  simd::Lanes t[1] = {simd::load(inputs)};
  simd::Lanes e[1];
  simd::exp2_nonpositive(t, e);
  EXPECT_EQ(e[0][0], 0.0);  // a hidden source adds an exact zero
  EXPECT_EQ(e[0][1], 0.0);
  EXPECT_EQ(e[0][2], 0.0);
  EXPECT_EQ(e[0][3], 1.0);
  EXPECT_EQ(e[0][4], 1.0);
  EXPECT_TRUE(std::isnan(e[0][5]));
  EXPECT_EQ(e[0][6], 0.5);
  EXPECT_EQ(e[0][7], std::ldexp(1.0, -1021));
}

TEST(VectorMath, HorizontalReductionsUseAFixedOrder) {
  const double values[simd::kLanes] = {1e16, 1.0, -1e16, 1.0, 3.0, -2.0, 0.5, 0.25};
  const simd::Lanes v = simd::load(values);
  EXPECT_EQ(simd::horizontal_sum(v), ((1e16 + 1.0) + (-1e16 + 1.0)) + ((3.0 - 2.0) + (0.5 + 0.25)));
  EXPECT_EQ(simd::horizontal_max(v), 1e16);
}

}  // namespace
}  // namespace mfattn
