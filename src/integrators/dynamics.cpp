// Dynamics (dynamics.hpp): the field of every replica from a backend, the last evaluation
// remembered.
#include "mfattn/integrators/dynamics.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>

#include "kernels/token_formulas.hpp"
#include "mfattn/integrators/integrator.hpp"

namespace mfattn {

Dynamics::Dynamics(const Model& model, Backend& backend, std::size_t replicas)
    : model_(model), backend_(backend), replicas_(replicas) {}

void Dynamics::evaluate(const double* x, bool with_attention_output, bool with_weight_sums) {
  const std::size_t count = size();
  // The last evaluation is remembered: a frame's observables and the next step's first stage
  // (or dopri5's first-same-as-last stage) ask for the same state, and get the same bits.
  // Weight sums are taken only when asked (the energy at frames): a frame asks first, so
  // the next step still finds the state (dopri5's last stage before a frame is taken again
  // with its sums: the same bits).
  if (cached_ && (cached_attention_output_ || !with_attention_output) &&
      (cached_weight_sums_ || !with_weight_sums) && std::equal(x, x + count, cached_x_.begin()))
    return;
  ++evaluations_;
  // A non-finite stage state means the step already diverged; say so rather than let the
  // backend report a misleading overflow (integrate() adds the step and time).
  for (std::size_t e = 0; e < count; ++e)
    if (!std::isfinite(x[e])) throw NonFiniteState("non-finite state");
  cached_ = false;
  // Once a step has asked for the attention output, every evaluation keeps it, so that a
  // frame's evaluation serves the next step.
  wants_attention_output_ = wants_attention_output_ || with_attention_output;
  cached_v_.resize(count);
  cached_sums_.resize(replicas_ * model_.n);
  if (model_.placement == Placement::Post) {
    cached_output_.resize(wants_attention_output_ ? count : 0);
    backend_.evaluate(replicas_, x,
                      FieldOutputs{cached_v_.data(), with_weight_sums ? cached_sums_.data() : nullptr,
                                   wants_attention_output_ ? cached_output_.data() : nullptr});
  } else {
    evaluate_placement(x, with_weight_sums);
  }
  cached_x_.assign(x, x + count);
  cached_attention_output_ = wants_attention_output_;
  cached_weight_sums_ = with_weight_sums;
  cached_ = true;
}

void Dynamics::evaluate_placement(const double* x, bool with_weight_sums) {
  // The layer's output p_i F_i on the states it reads (the directions N(x_j) for pre and
  // peri), then each token's field from the one formula (kernels::placement_velocity).
  const std::size_t n = model_.n, d = model_.d, count = size();
  const double* read = x;
  if (placement_reads_directions(model_.placement)) {
    directions_.assign(x, x + count);
    take_directions(replicas_ * n, d, directions_.data());
    read = directions_.data();
  }
  cached_output_.resize(count);
  layer_velocity_.resize(count);
  backend_.evaluate(replicas_, read,
                    FieldOutputs{layer_velocity_.data(), with_weight_sums ? cached_sums_.data() : nullptr,
                                 cached_output_.data()});
  for (std::size_t t = 0; t < replicas_ * n; ++t)
    kernels::placement_velocity(model_.placement, model_.ngpt_alpha, model_.receiver_speed(t % n), int(d),
                                x + t * d, cached_output_.data() + t * d, cached_v_.data() + t * d);
}

void Dynamics::require_derivatives() const {
  const BackendName* entry = find_evaluator(backend_.name());
  const std::string refusal = entry ? derivative_refusal(*entry, ModelKinds::of(model_)) : "";
  if (!refusal.empty()) throw BackendUnavailable(refusal);
}

void Dynamics::derivative_forward(const double* x, DerivativePoint& point) {
  require_derivatives();
  point.x.assign(x, x + size());
  point.read = point.x;
  if (placement_reads_directions(model_.placement))
    take_directions(replicas_ * model_.n, model_.d, point.read.data());
  point.output.resize(size());
  backend_.derivative_forward(replicas_, point.read.data(), point.output.data());
}

Dynamics::DerivativePoint& Dynamics::stage_point(std::size_t slot) {
  if (slot >= kStageSlots)
    throw std::logic_error("Dynamics: stage slot " + std::to_string(slot) + " of " +
                           std::to_string(kStageSlots));
  return points_[1 + slot];
}

void Dynamics::stage_velocity(std::size_t slot, const double* x, double* v) {
  const std::size_t n = model_.n, d = model_.d, count = size();
  for (std::size_t e = 0; e < count; ++e)
    if (!std::isfinite(x[e])) throw NonFiniteState("non-finite state");
  DerivativePoint& point = stage_point(slot);
  ++evaluations_;
  derivative_forward(x, point);
  for (std::size_t t = 0; t < replicas_ * n; ++t)
    kernels::placement_velocity(model_.placement, model_.ngpt_alpha, model_.receiver_speed(t % n),
                                int(d), x + t * d, point.output.data() + t * d, v + t * d);
}

void Dynamics::stage_vjp(std::size_t slot, const double* x, const double* cotangent,
                         double* x_cotangent, FieldNumbers& gradient) {
  DerivativePoint& point = stage_point(slot);
  if (point.x.size() != size() || !std::equal(x, x + size(), point.x.begin()))
    derivative_forward(x, point);
  vjp_at(point, cotangent, x_cotangent, gradient);
}

void Dynamics::vjp(const double* x, const double* cotangent, double* x_cotangent, FieldNumbers& gradient) {
  derivative_forward(x, points_[0]);
  vjp_at(points_[0], cotangent, x_cotangent, gradient);
}

void Dynamics::vjp_at(const DerivativePoint& point, const double* cotangent, double* x_cotangent,
                      FieldNumbers& gradient) {
  const std::size_t n = model_.n, d = model_.d, count = size();
  const double* x = point.x.data();
  std::vector<double>& output_bar = output_adjoint_;
  std::vector<double>& read_bar = read_adjoint_;
  output_bar.assign(count, 0.0);
  read_bar.resize(count);
  std::vector<double> scratch(d);
  std::fill(x_cotangent, x_cotangent + count, 0.0);
  for (std::size_t t = 0; t < replicas_ * n; ++t) {
    const double p = model_.receiver_speed(t % n);
    const double p_bar = kernels::placement_velocity_vjp(
        model_.placement, model_.ngpt_alpha, p, int(d), x + t * d, point.output.data() + t * d,
        cotangent + t * d, x_cotangent + t * d, output_bar.data() + t * d, scratch.data());
    if (p > 0.0) gradient.presence[t % n] += p_bar;
  }
  output_to_state_vjp(point, output_bar.data(), read_bar.data(), gradient);
  for (std::size_t e = 0; e < count; ++e) x_cotangent[e] += read_bar[e];
}

void Dynamics::attention_output_vjp(const double* x, const double* output_cotangent,
                                    double* x_cotangent, FieldNumbers& gradient) {
  derivative_forward(x, points_[0]);
  output_to_state_vjp(points_[0], output_cotangent, x_cotangent, gradient);
}

void Dynamics::output_to_state_vjp(const DerivativePoint& point, const double* output_cotangent,
                                   double* x_cotangent, FieldNumbers& gradient) {
  const std::size_t n = model_.n, d = model_.d;
  backend_.output_vjp(replicas_, point.read.data(), output_cotangent, x_cotangent, gradient);
  if (placement_reads_directions(model_.placement))
    for (std::size_t t = 0; t < replicas_ * n; ++t)
      kernels::direction_derivative(point.x.data() + t * d, int(d), x_cotangent + t * d);
}

void Dynamics::jvp(const double* x, const double* x_tangent, const FieldNumbers* tangent, double* v_tangent) {
  const std::size_t n = model_.n, d = model_.d, count = size();
  derivative_forward(x, points_[0]);
  const std::vector<double>& read = points_[0].read;
  const std::vector<double>& output = points_[0].output;
  std::vector<double>& output_dot = output_adjoint_;
  std::vector<double>& read_dot = read_adjoint_;
  output_dot.resize(count);
  read_dot.assign(x_tangent, x_tangent + count);
  if (placement_reads_directions(model_.placement))
    for (std::size_t t = 0; t < replicas_ * n; ++t) kernels::direction_derivative(x + t * d, int(d), read_dot.data() + t * d);
  backend_.output_jvp(replicas_, read.data(), read_dot.data(), tangent, output_dot.data());
  for (std::size_t t = 0; t < replicas_ * n; ++t) {
    const double p = model_.receiver_speed(t % n);
    const double p_dot = tangent && p > 0.0 ? tangent->presence[t % n] : 0.0;
    kernels::placement_velocity_jvp(model_.placement, model_.ngpt_alpha, p, p_dot, int(d), x + t * d,
                                    output.data() + t * d, x_tangent + t * d, output_dot.data() + t * d,
                                    v_tangent + t * d);
  }
}

void Dynamics::velocity(const double* x, double* v, double* weight_sums) {
  evaluate(x, false, weight_sums != nullptr);
  std::copy(cached_v_.begin(), cached_v_.end(), v);
  if (weight_sums) std::copy(cached_sums_.begin(), cached_sums_.end(), weight_sums);
}

ResidentStepper* Dynamics::resident_stepper(const Integrator& integrator) {
  if (resident_for_ != integrator.name()) {
    resident_for_ = integrator.name();
    const std::optional<FixedStepMethod> method = integrator.fixed_step_method();
    resident_ = method ? backend_.resident_stepper(*method, replicas_) : nullptr;
  }
  return resident_.get();
}

const double* Dynamics::attention_output(const double* x) {
  evaluate(x, true, false);
  return cached_output_.data();
}

}  // namespace mfattn
