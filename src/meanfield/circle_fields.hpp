#pragma once
// The velocity field of the circle solver (docs/meanfield.md, "The circle"): for the
// densities rho_c (one row of M cell values per label node xi_c, masses
// m_ca = rho_ca h / M_xi, h = 2 pi / M) it gives d theta / dt at every cell face
// theta_a + h / 2 and the weight sums D_ca = sum_{c' b} w(x_ca, x_c'b) m_c'b at the centres.
//
// Two evaluations of the same sums:
//  - FourierField, when every pair's kernel depends on theta_b - theta_a only (Q, K, V and
//    the gauge's rotations commute): per label pair a circular correlation, by FFTW.
//  - QuadratureField, any Q, K, V: the grid points are the sources of a Model whose presences
//    are their masses, summed by the CPU backend's pair loop; faces take the mean of the
//    two centres' velocities.
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "mfattn/core/model.hpp"
#include "mfattn/meanfield/solvers.hpp"

namespace mfattn::meanfield {

class CircleField {
 public:
  virtual ~CircleField() = default;
  /// v[c M + a]: d theta / dt at face a + 1/2 of row c.
  virtual void face_velocity(const std::vector<double>& density, std::vector<double>& v) = 0;
  /// D[c M + a] = sum over the grid of w(x_ca, y) m(y), true scale (exp(-beta) in rescaled time).
  virtual void weight_sums(const std::vector<double>& density, std::vector<double>& sums) = 0;
  virtual std::string name() const = 0;
};

std::unique_ptr<CircleField> make_fourier_field(const Model& label_model, std::size_t angles);
std::unique_ptr<CircleField> make_quadrature_field(const Model& label_model, std::size_t angles, int threads);

}  // namespace mfattn::meanfield
