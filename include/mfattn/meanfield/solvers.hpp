#pragma once
/// \file solvers.hpp
/// The solvers of the mean-field equation (density_solver.hpp, docs/meanfield.md):
///   circle  d = 2, any Q, K, V, labels (circle_solver.cpp): finite volumes, FFTW or the CPU pair loop
///   sphere  d = 3, rotation-invariant kernels (sphere_solver.cpp): spherical harmonics (libsharp)
///   zonal   any d, rotation-invariant kernels, densities of <x, e_1> (zonal_solver.cpp)
#include <cstddef>
#include <memory>
#include <stdexcept>

#include "mfattn/meanfield/density_solver.hpp"

namespace mfattn {
struct Model;
}

namespace mfattn::meanfield {

/// The step-size control of the solvers (--rtol, --atol; docs/meanfield.md, "Time steps").
///  - Finite volumes: the embedded error estimate of a step stays below atol + rtol, in
///    radians on the circle (the departure points of the semi-Lagrangian step), atol + rtol
///    max rho in values on zonal grids.
///  - Every solver: the field changes over a step by at most relative_change() of itself (the
///    velocity's largest value on the finite-volume grids, the drift's norm relative to the
///    density's deviation from its mean on S^2). A perturbation eps of the uniform state
///    moves the feet and values by O(eps) only, which the absolute estimates above never
///    see; this keeps gamma dt <= rtol^(1/4) for a mode growing at gamma, so that a growth
///    rate measured at the default rtol 1e-6 is within about 1.4e-4 (second-order steps: the
///    relative error of a rate is about (gamma dt)^2 / 7).
struct StepTolerance {
  double rtol = 1e-8;
  double atol = 1e-10;
  double relative_change() const;
};

/// Velocity changes below this fraction of the grid's velocity scale (the speed a unit mass
/// in one cell induces) are rounding: the uniform state's velocity is of order 1e-16 of it,
/// and its change over a step is no growth to follow.
inline constexpr double kVelocityRounding = 1e-12;

/// How the circle solver evaluates the velocity: by FFT when the kernel commutes with
/// rotations (Automatic chooses that when it does), else by the CPU pair loop.
enum class CircleEvaluation { Automatic, Fourier, Quadrature };

struct CircleOptions {
  std::size_t angles = 256;  ///< M
  bool labelled = false;     ///< record label nodes (shape {M_xi, M}) even for one node
  CircleEvaluation evaluation = CircleEvaluation::Automatic;
  StepTolerance tolerance;
  int threads = 0;           ///< the pair loop's threads (0: the OpenMP default)
};

/// Whether every label pair's kernel is a function of theta_b - theta_a: the score's matrix
/// Q^T G_c^T G_c' K and the value's V G_c^T G_c' (transported) or V (plain) are multiples of
/// rotations (then the circle solver can evaluate by FFT). label_model: d = 2, one token per
/// label node.
bool circle_kernels_commute(const Model& label_model);

/// d = 2: label_model is the run's Model with one token per label node (positions, gauge,
/// mask and factor of the nodes; presences ignored); M_xi = label_model.n.
std::unique_ptr<DensitySolver> make_circle_solver(const Model& label_model, const CircleOptions& options);

/// A rotation-invariant interaction on S^{d-1}: Q^T K = a I and V = b I, so that
///   w(x, y) = exp(beta a <x, y> - shift),   v(x, y) = b y,
///   USA: X[mu](x) = P_x int w(x, y) b y dmu(y)
///   SA:  X[mu](x) = P_x int w(x, y) b y dmu(y) / (eps_den + int w(x, y) dmu(y))
/// shift = beta in rescaled time, 0 in natural time (docs/model.md section 2).
struct IsotropicInteraction {
  std::size_t d = 3;
  double beta = 1.0;
  double score_scale = 1.0;  ///< a
  double value_scale = 1.0;  ///< b
  bool usa = true;
  double exponent_shift = 0.0;
  double eps_den = 0.0;
  double noise_kappa = 0.0;  ///< 0: no diffusion
};

/// d = 3 on the Gauss-Legendre grid of maximal degree L (libsharp): pseudo-spectral, the
/// interaction diagonal in the degree by the Funk-Hecke theorem.
/// With label_model (one token per label node: positions, gauge, values, mask and factor;
/// presences ignored) one density per node, shape {M_xi, n_theta, n_phi}: the gauge must rotate
/// about e_3 at every node (rope with one rotating block), so that pair kernels stay diagonal
/// in the degree and the order m:
///   X_c(x) = P_x sum_c' A_cc' int w(x, R_cc' y) b (R_cc' y or y) dmu_c'(y),  R_cc' = G_c^T G_c'
/// (transported or plain values; SA divides by eps_den + the same sum of w), A_cc' the pair's
/// mask and factor over M_xi.
std::unique_ptr<DensitySolver> make_sphere_solver(const IsotropicInteraction& interaction, std::size_t max_degree,
                                                  const StepTolerance& tolerance = {},
                                                  const Model* label_model = nullptr);

/// make_sphere_solver's refusal of a label node whose gauge is not a rotation about e_3.
struct UnsupportedLabelGauge : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// Densities of <x, e_1> on S^{d-1} on n_theta polar cells (finite volumes).
std::unique_ptr<DensitySolver> make_zonal_solver(const IsotropicInteraction& interaction, std::size_t polar_cells,
                                                 const StepTolerance& tolerance);

}  // namespace mfattn::meanfield
