// The distances of `mfattn realize` (include/mfattn/app/realize.hpp) against closed forms.
#include "mfattn/app/realize.hpp"
#include "mfattn/core/rng.hpp"
#include "test_support.hpp"

namespace mfattn {
namespace {

constexpr double kPi = 3.14159265358979323846;

// Between two point masses W1 on the circle is the shorter arc; with spread samples the
// same set is at distance 0, and a rotated copy at 0 after the optimal rotation, which it
// recovers.
TEST(Realize, CircleW1IsTheShorterArcAndSeesThroughRotations) {
  EXPECT_NEAR(circle_w1({0.5}, {1.5}), 1.0, 1e-12);
  EXPECT_NEAR(circle_w1({0.0}, {4.0}), 2 * kPi - 4.0, 1e-12);
  EXPECT_NEAR(circle_w1({-0.25}, {0.25}), 0.5, 1e-12);  // across 0
  std::vector<double> a, b;
  RandomStream stream(3);
  for (int k = 0; k < 200; ++k) a.push_back(2 * kPi * stream.uniform());
  EXPECT_NEAR(circle_w1(a, a), 0.0, 1e-12);
  for (double t : a) b.push_back(t + 1.3);
  // A sample within an arc of 0.1 rotated by 1.3: every mass moves the whole 1.3.
  std::vector<double> narrow, moved;
  for (double t : a) narrow.push_back(0.1 * t / (2 * kPi)), moved.push_back(0.1 * t / (2 * kPi) + 1.3);
  EXPECT_NEAR(circle_w1(narrow, moved), 1.3, 1e-9);
  double alpha = 0.0;
  EXPECT_LT(circle_w1_over_rotations(a, b, &alpha), 1e-9);
  EXPECT_NEAR(alpha, 2 * kPi - 1.3, 1e-6);
  // Half the mass moved by pi/2: W1 = pi/4 (uniform half-circle shifted against itself).
  EXPECT_NEAR(circle_w1({0.0, kPi}, {0.0, kPi + kPi / 2}), kPi / 4, 1e-12);
}

// The energy distance of two point masses at distance D is sqrt(2 D); of a sample with itself 0.
TEST(Realize, EnergyDistanceOfPointMassesAndOfASampleWithItself) {
  EXPECT_NEAR(energy_distance({0, 0, 1}, {0, 0, -1}, 3), std::sqrt(4.0), 1e-12);
  EXPECT_NEAR(energy_distance({1, 0}, {0, 1}, 2), std::sqrt(2 * std::sqrt(2.0)), 1e-12);
  std::vector<double> a;
  RandomStream stream(5);
  for (int k = 0; k < 300; ++k) a.push_back(stream.normal());
  EXPECT_NEAR(energy_distance(a, a, 3), 0.0, 1e-7);
}

}  // namespace
}  // namespace mfattn
