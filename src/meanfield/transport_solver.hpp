#pragma once
// The time stepping shared by the finite-volume solvers (circle and zonal;
// docs/meanfield.md, "Time steps"). A step of size dt is Strang's splitting: half a step of
// the heat semigroup (the subclass's, exact: it keeps the mass and maps non-negative values
// to non-negative values), a Heun step of the transport (finite_volume.hpp; both Euler stages
// within the positivity bound, so the step keeps the density >= 0), half a step of heat. The
// step size is controlled by the embedded first-order estimate, the difference of the Heun and
// Euler results: max_a |dt/2 (k2 - k1)_a| <= atol + rtol max_a rho_a (--rtol, --atol), and
// kept within 0.8 of the positivity bound.
#include <cstddef>
#include <limits>
#include <vector>

#include "meanfield/finite_volume.hpp"
#include "mfattn/meanfield/solvers.hpp"

namespace mfattn::meanfield {

class TransportSolver : public DensitySolver {
 public:
  /// rows lines of the same cells, each row's values contiguous.
  TransportSolver(CellLine line, std::size_t rows, double noise_kappa, StepTolerance tolerance);

  double step(std::vector<double>& density, double max_step) final;
  void reset_step_control() final { next_step_ = std::numeric_limits<double>::infinity(); }
  void rate(const std::vector<double>& density, std::vector<double>& out) final;

 protected:
  /// v[r cells + a]: the velocity at face a + 1/2 of row r.
  virtual void face_velocity(const std::vector<double>& density, std::vector<double>& v) = 0;
  /// density <- exp(t Delta_h / kappa) density (only called with noise).
  virtual void heat(std::vector<double>& density, double t) = 0;
  /// out += Delta_h density / kappa (only called with noise).
  virtual void add_diffusion(const std::vector<double>& density, std::vector<double>& out) const = 0;

  const CellLine& line() const { return line_; }
  std::size_t rows() const { return rows_; }
  double noise_kappa() const { return kappa_; }

 private:
  void transport(const std::vector<double>& density, const std::vector<double>& v, std::vector<double>& out) const;
  double positive_step(const std::vector<double>& v) const;

  CellLine line_;
  std::size_t rows_;
  double kappa_;
  StepTolerance tolerance_;
  double next_step_ = std::numeric_limits<double>::infinity();
  std::vector<double> start_, stage_, k1_, k2_, v0_, v1_;
};

}  // namespace mfattn::meanfield
