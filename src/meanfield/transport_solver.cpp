#include "meanfield/transport_solver.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace mfattn::meanfield {

double StepTolerance::relative_change() const { return std::sqrt(std::sqrt(rtol)); }

TransportSolver::TransportSolver(CellLine line, std::size_t rows, double noise_kappa, StepTolerance tolerance)
    : line_(std::move(line)), rows_(rows), kappa_(noise_kappa), tolerance_(tolerance) {
  if (line_.periodic)
    for (std::size_t a = 0; a < line_.cells; ++a)
      if (line_.cell_measure[a] != line_.cell_measure[0] || line_.face_measure[a] != 1.0)
        throw std::invalid_argument("a periodic line needs equal cells and unit faces");
}

namespace {

constexpr int kMaxAttempts = 200;
constexpr double kInfinity = std::numeric_limits<double>::infinity();

[[noreturn]] void no_step_found(double dt) {
  throw std::runtime_error("meanfield: the step size control found no step (last dt " + std::to_string(dt) + ")");
}

// The shrink factor after a rejected step whose error is ratio times the tolerance.
double shrink(double ratio) { return std::isfinite(ratio) ? std::max(0.2, 0.9 / std::sqrt(ratio)) : 0.2; }

// v at u (cell units) on a periodic line whose face a + 1/2 (u = a + 1) carries v[a]: the
// cubic through the four nearest faces (the velocity is a smooth convolution: fourth order).
double velocity_at(const double* v, std::size_t m, double u) {
  const double g = u - 1.0, first = std::floor(g), t = g - first;
  const auto cells = static_cast<long long>(m);
  long long i = static_cast<long long>(first) % cells;
  if (i < 0) i += cells;
  const auto at = [&](long long k) { return v[static_cast<std::size_t>((i + k + cells) % cells)]; };
  const double before = -t * (t - 1.0) * (t - 2.0) / 6.0, here = (t + 1.0) * (t - 1.0) * (t - 2.0) / 2.0,
               next = -(t + 1.0) * t * (t - 2.0) / 2.0, after = (t + 1.0) * t * (t - 1.0) / 6.0;
  return before * at(-1) + here * at(0) + next * at(1) + after * at(2);
}

}  // namespace

double TransportSolver::step(std::vector<double>& density, double max_step) {
  double dt = std::min(max_step, next_step_);
  bool start_velocity_known = false;
  for (int attempt = 0;; ++attempt) {
    if (attempt > kMaxAttempts) no_step_found(dt);
    start_ = density;
    // Without noise the start of the transport does not depend on dt: its velocity is kept.
    if (kappa_ > 0.0) heat(start_, 0.5 * dt);
    if (!start_velocity_known || kappa_ > 0.0) {
      face_velocity(start_, v0_);
      // The scheme's bound on dt from v0, once per v0 (a rejected step keeps v0 without noise).
      start_bound_ = line_.periodic ? remap_step_bound(v0_) : 0.8 * positive_step(v0_);
    }
    start_velocity_known = true;
    const Attempt tried = line_.periodic ? remap_attempt(dt) : finite_volume_attempt(dt);
    if (tried.result == nullptr) {
      dt = tried.retry;
      continue;
    }
    density = *tried.result;
    if (kappa_ > 0.0) heat(density, 0.5 * dt);
    // The error estimate is O(dt^2), the velocity's change O(dt).
    next_step_ = dt * std::min({5.0, 0.9 / std::sqrt(std::max(tried.ratio, 1e-12)),
                                0.9 / std::max(tried.change_ratio, 1e-12)});
    return dt;
  }
}

TransportSolver::Attempt TransportSolver::remap_attempt(double dt) {
  // Keep the flow map close to its linearisation over a step, dt max|v'| <= 1/4 (Heun's rule
  // then follows it; the error estimate below sees the velocity's change in time, not the
  // flow's curvature), and every foot within half a turn of its face (pi / max|v|). Neither
  // depends on the cell width.
  if (dt > start_bound_) return {nullptr, 0.0, start_bound_};
  if (!departures(dt, v0_, v0_)) return {nullptr, 0.0, 0.5 * dt};
  remap(start_, stage_);
  predicted_shift_.swap(shift_);
  face_velocity(stage_, v1_);
  if (!departures(dt, v1_, v0_)) return {nullptr, 0.0, 0.5 * dt};
  remap(start_, k1_);
  // The error of the step is the error of the characteristics: the feet move like particles
  // (radians, the particles' atol + rtol |x| with |x| = 1).
  double foot_error = 0.0;
  for (std::size_t i = 0; i < shift_.size(); ++i) foot_error = std::max(foot_error, std::abs(shift_[i] - predicted_shift_[i]));
  const double ratio = foot_error * line_.cell_measure[0] / (tolerance_.atol + tolerance_.rtol);
  const double change_ratio = velocity_change_ratio();
  if (!(ratio <= 1.0) || !(change_ratio <= 1.0)) return refused(dt, ratio, change_ratio);
  return {&k1_, ratio, dt, change_ratio};
}

double TransportSolver::velocity_change_ratio() {
  double change = 0.0, largest = 0.0;
  for (std::size_t i = 0; i < v0_.size(); ++i) {
    change = std::max(change, std::abs(v1_[i] - v0_[i]));
    largest = std::max(largest, std::abs(v0_[i]));
  }
  // A field that does not change (a zero velocity: V = 0, pure diffusion) bounds no step.
  if (change == 0.0) return 0.0;
  return change / (tolerance_.relative_change() * largest + kVelocityRounding * velocity_scale());
}

double TransportSolver::velocity_scale() {
  if (velocity_scale_ < 0.0) {
    const std::size_t m = line_.cells;
    const auto widest = static_cast<std::size_t>(
        std::max_element(line_.cell_measure.begin(), line_.cell_measure.end()) - line_.cell_measure.begin());
    std::vector<double> point(rows_ * m, 0.0), v;
    for (std::size_t r = 0; r < rows_; ++r) point[r * m + widest] = 1.0 / line_.cell_measure[widest];
    face_velocity(point, v);
    velocity_scale_ = 0.0;
    for (double value : v) velocity_scale_ = std::max(velocity_scale_, std::abs(value));
  }
  return velocity_scale_;
}

TransportSolver::Attempt TransportSolver::refused(double dt, double ratio, double change_ratio) {
  // shrink() for the O(dt^2) error estimate; the velocity's change is O(dt).
  const double by_change = std::isfinite(change_ratio) ? std::max(0.2, 0.9 / change_ratio) : 0.2;
  return {nullptr, ratio, dt * std::min(ratio > 1.0 || !std::isfinite(ratio) ? shrink(ratio) : 1.0,
                                        change_ratio > 1.0 || !std::isfinite(change_ratio) ? by_change : 1.0),
          change_ratio};
}

TransportSolver::Attempt TransportSolver::finite_volume_attempt(double dt) {
  if (dt > start_bound_) return {nullptr, 0.0, start_bound_};
  transport(start_, v0_, k1_);
  stage_.resize(start_.size());
  for (std::size_t i = 0; i < start_.size(); ++i) stage_[i] = start_[i] + dt * k1_[i];
  face_velocity(stage_, v1_);
  if (dt > positive_step(v1_)) return {nullptr, 0.0, 0.5 * dt};
  transport(stage_, v1_, k2_);
  // The Heun result in k2_; the Euler stage is stage_.
  for (std::size_t i = 0; i < start_.size(); ++i) k2_[i] = start_[i] + 0.5 * dt * (k1_[i] + k2_[i]);
  double error = 0.0, largest = 0.0;
  for (std::size_t i = 0; i < start_.size(); ++i) {
    error = std::max(error, std::abs(k2_[i] - stage_[i]));
    largest = std::max(largest, std::abs(start_[i]));
  }
  const double ratio = error / (tolerance_.atol + tolerance_.rtol * largest);
  const double change_ratio = velocity_change_ratio();
  if (!(ratio <= 1.0) || !(change_ratio <= 1.0)) return refused(dt, ratio, change_ratio);
  return {&k2_, ratio, dt, change_ratio};
}

double TransportSolver::remap_step_bound(const std::vector<double>& v) const {
  const std::size_t m = line_.cells;
  const double h = line_.cell_measure[0];
  double steepest = 0.0, fastest = 0.0;
  for (std::size_t r = 0; r < rows_; ++r) {
    const double* row = v.data() + r * m;
    for (std::size_t a = 0; a < m; ++a) {
      steepest = std::max(steepest, std::abs(row[a] - row[a > 0 ? a - 1 : m - 1]) / h);
      fastest = std::max(fastest, std::abs(row[a]));
    }
  }
  const double half_turn = 0.5 * double(m) * h;
  return std::min(steepest > 0.0 ? 0.25 / steepest : kInfinity, fastest > 0.0 ? half_turn / fastest : kInfinity);
}

bool TransportSolver::departures(double dt, const std::vector<double>& v_end, const std::vector<double>& v_start) {
  const std::size_t m = line_.cells;
  const double reach = dt / line_.cell_measure[0];
  shift_.resize(rows_ * m);
  for (std::size_t r = 0; r < rows_; ++r) {
    const double *end = v_end.data() + r * m, *start = v_start.data() + r * m;
    double* shift = shift_.data() + r * m;
    for (std::size_t a = 0; a < m; ++a) {
      const double first_guess = double(a + 1) - reach * end[a];
      shift[a] = 0.5 * reach * (end[a] + velocity_at(start, m, first_guess));
    }
    // The feet a + 1 - shift[a] in order: 1 + shift[a - 1] - shift[a] > 0 (the first face's
    // left neighbour is the last face, one period back).
    if (!(1.0 + shift[m - 1] - shift[0] > 0.0)) return false;
    for (std::size_t a = 1; a < m; ++a)
      if (!(1.0 + shift[a - 1] - shift[a] > 0.0)) return false;
  }
  return true;
}

void TransportSolver::remap(const std::vector<double>& density, std::vector<double>& out) const {
  out.resize(density.size());
  const std::size_t m = line_.cells;
  for (std::size_t r = 0; r < rows_; ++r) remap_periodic(line_, density.data() + r * m, shift_.data() + r * m, out.data() + r * m);
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
