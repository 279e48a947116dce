#include "meanfield/transport_solver.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace mfattn::meanfield {

TransportSolver::TransportSolver(CellLine line, std::size_t rows, double noise_kappa, StepTolerance tolerance)
    : line_(std::move(line)), rows_(rows), kappa_(noise_kappa), tolerance_(tolerance) {}

double TransportSolver::step(std::vector<double>& density, double max_step) {
  double dt = std::min(max_step, next_step_);
  bool start_velocity_known = false;
  for (int attempt = 0;; ++attempt) {
    if (attempt > 200)
      throw std::runtime_error("meanfield: the step size control found no step (last dt " + std::to_string(dt) + ")");
    start_ = density;
    // Without noise the start of the transport does not depend on dt: its velocity is kept.
    if (kappa_ > 0.0) heat(start_, 0.5 * dt);
    if (!start_velocity_known || kappa_ > 0.0) face_velocity(start_, v0_);
    start_velocity_known = true;
    const double bound = positive_step(v0_);
    if (dt > 0.8 * bound) {
      dt = 0.8 * bound;
      continue;
    }
    transport(start_, v0_, k1_);
    stage_.resize(start_.size());
    for (std::size_t i = 0; i < start_.size(); ++i) stage_[i] = start_[i] + dt * k1_[i];
    face_velocity(stage_, v1_);
    if (dt > positive_step(v1_)) {
      dt *= 0.5;
      continue;
    }
    transport(stage_, v1_, k2_);
    double error = 0.0, largest = 0.0;
    for (std::size_t i = 0; i < start_.size(); ++i) {
      error = std::max(error, std::abs(0.5 * dt * (k2_[i] - k1_[i])));
      largest = std::max(largest, std::abs(start_[i]));
    }
    const double ratio = error / (tolerance_.atol + tolerance_.rtol * largest);
    if (!(ratio <= 1.0)) {
      dt *= std::isfinite(ratio) ? std::max(0.2, 0.9 / std::sqrt(ratio)) : 0.2;
      continue;
    }
    for (std::size_t i = 0; i < start_.size(); ++i) density[i] = start_[i] + 0.5 * dt * (k1_[i] + k2_[i]);
    if (kappa_ > 0.0) heat(density, 0.5 * dt);
    next_step_ = dt * std::min(5.0, 0.9 / std::sqrt(std::max(ratio, 1e-12)));
    return dt;
  }
}

void TransportSolver::rate(const std::vector<double>& density, std::vector<double>& out) {
  face_velocity(density, v0_);
  transport(density, v0_, out);
  if (kappa_ > 0.0) add_diffusion(density, out);
}

void TransportSolver::transport(const std::vector<double>& density, const std::vector<double>& v,
                                std::vector<double>& out) const {
  out.resize(density.size());
  const std::size_t m = line_.cells;
  for (std::size_t r = 0; r < rows_; ++r) transport_rate(line_, density.data() + r * m, v.data() + r * m, out.data() + r * m);
}

double TransportSolver::positive_step(const std::vector<double>& v) const {
  double bound = std::numeric_limits<double>::infinity();
  for (std::size_t r = 0; r < rows_; ++r)
    bound = std::min(bound, positive_transport_step(line_, v.data() + r * line_.cells));
  return bound;
}

}  // namespace mfattn::meanfield
