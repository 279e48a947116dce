#pragma once
// The time stepping shared by the finite-volume solvers (circle and zonal;
// docs/meanfield.md, "Time steps"). A step of size dt is Strang's splitting: half a step of
// the heat semigroup (the subclass's, exact: it keeps the mass and maps non-negative values
// to non-negative values), a step of the transport, half a step of heat.
//  - Periodic lines (the circle): flux-form semi-Lagrangian (remap_periodic). Both stages
//    follow the characteristics back by Heun's rule (cubic interpolation between faces): the
//    predictor in the start velocity v0 frozen, the corrector with the predictor's velocity v1
//    at the arrival and v0 at the foot. Their difference is the first-order error of freezing
//    the velocity in time, which stays smooth when the density sharpens into clusters. The
//    step also keeps dt max|v'| <= 1/4 (the flow map near its linearisation, which Heun's
//    rule follows) and the feet within half a turn. No CFL or positivity bound: the step only
//    has to keep the departure points in order (it is halved when they cross).
//  - Walled lines (zonal): a Heun step of the finite-volume rate (finite_volume.hpp), both
//    Euler stages within the positivity bound (0.8 of it).
// The step size is controlled by the embedded first-order estimate, the difference of the
// corrector and the predictor (--rtol, --atol): on periodic lines the difference of their
// departure points, max_a |foot_a - foot*_a| <= atol + rtol (radians: the error the particles'
// dopri5 allows a position of norm 1); on walled lines the difference of the densities,
// max_a |rho_a - rho*_a| <= atol + rtol max_a rho_a. Both are absolute, and a small
// perturbation of the uniform state moves neither: the step also keeps the velocity's change
// between the two stages within StepTolerance::relative_change() of its largest value (plus
// kVelocityRounding of the grid's velocity scale), which bounds gamma dt for a mode growing at
// gamma whatever its amplitude.
#include <cstddef>
#include <limits>
#include <vector>

#include "meanfield/finite_volume.hpp"
#include "mfattn/meanfield/solvers.hpp"

namespace mfattn::meanfield {

class TransportSolver : public DensitySolver {
 public:
  /// rows lines of the same cells, each row's values contiguous.
  /// A periodic line must have equal cells and unit faces (the remap's cell units).
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
  /// One try at a step of dt from start_ (whose velocity is v0_): the result and its error
  /// ratio when accepted, else result null and the step to try next.
  struct Attempt {
    const std::vector<double>* result;
    double ratio;
    double retry;
    double change_ratio = 0.0;  ///< the velocity's change over its bound (velocity_change_ratio)
  };
  /// max_a |v1_a - v0_a| over its bound, relative_change max_a |v0_a| + kVelocityRounding
  /// velocity_scale(): <= 1 for a step to be accepted (linear in dt).
  double velocity_change_ratio();
  /// The speed a unit mass in the widest cell of every row induces (max |v|), made once: the
  /// scale of the velocity's rounding.
  double velocity_scale();
  /// The attempt refused with both ratios, and the step to try next.
  static Attempt refused(double dt, double ratio, double change_ratio);
  Attempt remap_attempt(double dt);
  /// The longest remap step the velocity v allows: dt max|v'| <= 1/4, feet within half a turn.
  double remap_step_bound(const std::vector<double>& v) const;
  Attempt finite_volume_attempt(double dt);
  /// How far back (cells) every row's faces depart over dt, into shift_, by Heun's rule back
  /// in time: v_end at the arrival, v_start at the first guess of the foot. False when the
  /// feet are out of order somewhere (the step is too long).
  bool departures(double dt, const std::vector<double>& v_end, const std::vector<double>& v_start);
  void remap(const std::vector<double>& density, std::vector<double>& out) const;
  void transport(const std::vector<double>& density, const std::vector<double>& v, std::vector<double>& out) const;
  double positive_step(const std::vector<double>& v) const;

  CellLine line_;
  std::size_t rows_;
  double kappa_;
  StepTolerance tolerance_;
  double next_step_ = std::numeric_limits<double>::infinity();
  std::vector<double> start_, stage_, k1_, k2_, v0_, v1_, shift_, predicted_shift_;
  /// The longest step v0_ allows: remap_step_bound on periodic lines, 0.8 of the positivity
  /// bound on walled ones.
  double start_bound_ = std::numeric_limits<double>::infinity();
  double velocity_scale_ = -1.0;  ///< < 0: not made yet
};

}  // namespace mfattn::meanfield
