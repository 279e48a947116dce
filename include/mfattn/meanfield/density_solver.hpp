#pragma once
/// \file density_solver.hpp
/// The mean-field equation of docs/meanfield.md: the token distribution mu on S^{d-1} (times
/// the label set A with a fixed label marginal) moves by
///   d/dt mu + div_S( mu X[mu] ) = (1/kappa) Laplace_S mu
/// where X[mu] is the particle velocity of docs/model.md section 2 with the sums over sources
/// replaced by integrals against mu (USA: M = 1; SA: the ratio of two integrals), and kappa
/// is the particles' --noise-kappa (no diffusion when it is 0).
///
/// A DensitySolver owns one grid and advances densities on it; the command `mfattn
/// meanfield` (src/app/commands/meanfield.cpp) chooses the solver, keeps the time and writes
/// the frames. Densities are values on the grid's points, row-major in DensityGrid::shape;
/// sum_a weights_a value_a = 1 for a probability measure (per label node with labels).
#include <array>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

namespace mfattn::meanfield {

/// Which grid a solver works on, as /fields/density records it (docs/output.md).
enum class GridKind {
  Circle,  ///< d = 2: M angles theta_a = 2 pi a / M, values w.r.t. d theta; with labels
           ///< one row per label node (shape {M_xi, M}), each row a conditional density
  Sphere,  ///< d = 3: values w.r.t. the surface measure on {n_theta, n_phi} (theta the polar
           ///< angle from e_3); with labels one such block per label node ({M_xi, n_theta, n_phi})
  Zonal,   ///< any d: densities of <x, e_1> only, values w.r.t. the normalized surface
           ///< measure (uniform = 1) on n_theta polar angles from e_1
};

/// The points of a density and their quadrature weights.
struct DensityGrid {
  GridKind kind = GridKind::Circle;
  std::vector<std::size_t> shape;  ///< of one frame's values
  std::vector<double> theta;       ///< circle angles, or polar angles (sphere: from e_3; zonal: from e_1)
  std::vector<double> phi;         ///< sphere: azimuths
  std::vector<double> labels;      ///< with labels: the label nodes xi_c
  /// Same shape as the values: sum_a weights_a value_a = 1 for a probability density (with
  /// labels: for each label node's row).
  std::vector<double> weights;
  std::size_t size() const {
    std::size_t total = 1;
    for (std::size_t extent : shape) total *= extent;
    return total;
  }
};

/// P_k(t), the Gegenbauer polynomial of S^{d-1} normalised by P_k(1) = 1 (d = 2: cos(k theta),
/// d = 3: Legendre): (k + d - 3) P_k = (2k + d - 4) t P_{k-1} - (k - 1) P_{k-2}, P_0 = 1, P_1 = t.
/// values[k] = P_k(t) for k = 0..values.size() - 1.
inline void gegenbauer_polynomials(std::size_t d, double t, double* values, std::size_t count) {
  const double dimension = double(d);
  for (std::size_t k = 0; k < count; ++k)
    values[k] = k == 0 ? 1.0
                : k == 1 ? t
                         : ((2.0 * double(k) + dimension - 4.0) * t * values[k - 1] - (double(k) - 1.0) * values[k - 2]) /
                               (double(k) + dimension - 3.0);
}

/// The number of mode amplitudes every frame records.
inline constexpr std::size_t kRecordedModes = 16;

/// What /observables records per frame (docs/output.md).
struct DensityObservables {
  double mass = 0;           ///< sum_a weights_a value_a (the mean over label nodes with labels)
  double energy = 0;         ///< E = 1/(2 beta) int int w(x, y) dmu dmu (model.md section 4, M = 1); NaN at beta = 0
  double free_energy = 0;    ///< E - (1/kappa) int rho log rho (E without noise)
  double min_density = 0;    ///< smallest value on the grid
  double order_parameter = 0;  ///< |int x dmu|
  /// A_k, k = 1..16: circle |int e^{i k theta} dmu| (with labels: of the marginal in theta);
  /// sphere and zonal the degree-k part's norm, normalized so that a Dirac has A_k = 1
  /// (zonal: |int P_k(<x, e_1>) dmu| with the Gegenbauer polynomial P_k(1) = 1).
  std::array<double, kRecordedModes> modes{};
  /// With labels: the mean over label nodes of 1 - |int x dmu_xi| of the conditional densities
  /// (the circular variance on the circle, its analogue on S^2), and 1 - |int x dmu| of the
  /// marginal.
  double conditional_variance = std::numeric_limits<double>::quiet_NaN();
  double marginal_variance = std::numeric_limits<double>::quiet_NaN();
};

class DensitySolver {
 public:
  virtual ~DensitySolver() = default;
  virtual const DensityGrid& grid() const = 0;
  /// A short description of the scheme for /parameters and progress lines.
  virtual std::string scheme() const = 0;
  /// Advances density (grid().size() values) by one step of at most max_step (> 0) and
  /// returns the step taken: the solver's own stable step, or max_step when that is smaller.
  /// The step depends only on the density, max_step and the steps since the last
  /// reset_step_control(), so a solve resumed from a saved frame repeats the same steps.
  virtual double step(std::vector<double>& density, double max_step) = 0;
  /// Forgets what earlier steps taught the step-size control: the command calls it at every
  /// frame, so that the steps after a frame depend on that frame's density alone and a
  /// resumed solve repeats them exactly.
  virtual void reset_step_control() {}
  /// The right-hand side d density / dt at the density (drift and diffusion), for tests of
  /// the linear growth rates.
  virtual void rate(const std::vector<double>& density, std::vector<double>& out) = 0;
  virtual DensityObservables observe(const std::vector<double>& density) = 0;
};

}  // namespace mfattn::meanfield
