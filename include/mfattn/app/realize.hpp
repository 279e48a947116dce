#pragma once
/// \file realize.hpp
/// `mfattn realize`: the exact-realization experiments of docs/realization.md. With
/// transported values, y_i = G(xi_i) x_i follows plain USA and collapses to a point u, so
/// x_i -> G(xi_i)^T u: the final marginal is the push-forward of the position law by
/// xi -> G(xi)^T u. Choosing the positions from a target law realizes that law:
///   rope          d = 3, G(xi) rotates (x_0, x_1) by xi: x_i's angle -> a + psi_i when
///                 xi_i = -psi_i, psi_i drawn from the target law on the circle (a: u's angle)
///   rope-mixed    d = 4, block b rotates by theta_b(xi) = W(b, :) xi: xi_i = W^{-1}(-psi_i),
///                 psi_i drawn from a target law on the torus
///   prefix-gauge  any d >= 2, gauges O_i = exp(sum_{a<b} A_i(a, b) E_ab) (the "lie" geometry
///                 with the basis E_ab of so(d)), A_i the plane rotation taking the target draw
///                 z_i to the pin u* = e_{d-1}; one frozen prefix token at u* (in y-space) of
///                 weight n pins u = u*, so x_i -> O_i^T u* = z_i (--no-pin: no prefix, u is
///                 where y collapses, and x_i -> O_i^T u)
/// Distances between the realized marginal and an independent sample of the target of the
/// same size, beside the same distance between two independent target samples (the noise
/// floor):
///   circle   W1(mu, nu) = min over rotations alpha of min_c int |F_mu(t) - F_nu(t - alpha) - c| dt
///   torus    the energy distance of the samples embedded as (cos, sin, cos, sin), after each
///            angle is rotated by its marginal's circle-W1 optimal rotation
///   sphere   the energy distance sqrt(2 E|X - Y| - E|X - X'| - E|Y - Y'|) (Euclidean norm in
///            R^d, V-statistics)
#include <cstddef>
#include <iosfwd>
#include <string>
#include <vector>

namespace mfattn {

/// W1 on the circle of two equally weighted angle samples (radians, any range), without
/// rotation: min_c int_0^{2 pi} |F_a(t) - F_b(t) - c| dt (the weighted median of F_a - F_b).
double circle_w1(const std::vector<double>& a, const std::vector<double>& b);

/// min over rotations alpha of circle_w1(a, b + alpha): a grid of 2048 rotations refined by a
/// golden-section search around the best; best_rotation receives alpha.
double circle_w1_over_rotations(const std::vector<double>& a, const std::vector<double>& b,
                                double* best_rotation = nullptr);

/// The energy distance of two samples of points in R^dim (rows), V-statistics, Euclidean norm.
double energy_distance(const std::vector<double>& a, const std::vector<double>& b, std::size_t dim);

/// The usage text of `mfattn realize`.
std::string realize_usage();

/// `mfattn realize ARGS`: runs the experiment, writes the file and prints the distance
/// (text, or with --json one object with metric, distance, noise_floor, ...). Returns an
/// ExitCode (2 for bad input, before anything is written).
int realize_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace mfattn
