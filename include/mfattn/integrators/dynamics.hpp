#pragma once
/// \file dynamics.hpp
/// The vector field the integrators step (docs/model.md sections 2 and 5):
///   f(x)_i = p_i P_{x_i} u_i(x)                     placement post (the backend's field)
///   f(x)_i = placement_velocity(x_i, p_i F_i(N(x)))   pre, peri, ngpt (kernels/token_formulas.hpp)
/// of every replica, evaluated by a backend, the last evaluation remembered so that a frame's
/// observables and the next step's first stage share one evaluation (the same bits).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mfattn/backends/backend.hpp"
#include "mfattn/core/model.hpp"

namespace mfattn {

class Integrator;

/// A stage state that is not finite (the step diverged); integrate() names step and time.
struct NonFiniteState : NumericalError {
  using NumericalError::NumericalError;
};

/// The vector field f(x) = (p_i P_{x_i} u_i)_i of every replica, evaluated by a backend.
class Dynamics {
 public:
  Dynamics(const Model& model, Backend& backend, std::size_t replicas);
  /// v = f(x) and, if asked, the weight sums D_i. Repeating the last x costs a copy.
  void velocity(const double* x, double* v, double* weight_sums = nullptr);
  /// The attention outputs p_i u_i before the tangent projection (euler-unprojected): the
  /// remembered outputs (R n d numbers), valid until the next evaluation.
  const double* attention_output(const double* x);
  /// The derivatives of f at x (docs/model.md section 2e): the VJP writes x's cotangent
  /// (x_cotangent, size() numbers) of the cotangent of f, and adds the numbers' gradient to
  /// `gradient` (zero_numbers' shapes); the JVP writes f's tangent (v_tangent) along x_tangent
  /// and the numbers' tangent (null: none). The placement's share is kernels::
  /// placement_velocity_vjp/jvp, the layer's the backend's (Backend::output_vjp/jvp). Throws
  /// BackendUnavailable with derivative_refusal's line where the backend's derivatives do not
  /// take the model.
  void vjp(const double* x, const double* cotangent, double* x_cotangent, FieldNumbers& gradient);
  /// The VJP of attention_output (the layer's output a = p_i F_i at the states the layer reads,
  /// before the placement): x's cotangent of a's cotangent output_cotangent, the numbers'
  /// gradient added to `gradient` (euler-unprojected's adjoint).
  void attention_output_vjp(const double* x, const double* output_cotangent, double* x_cotangent,
                            FieldNumbers& gradient);
  /// A Runge-Kutta step's adjoint (Integrator::step_vjp) takes its stages' velocities and
  /// then their VJPs, from the last stage back. stage_velocity(slot, x, v) writes v = f(x)
  /// by the derivatives' forward pass (the VJP's own, to rounding the field's) and keeps its
  /// tape in `slot` (< kStageSlots), so that stage_vjp(slot, x, ...) at the same x (compared
  /// number by number) takes no forward pass of its own; at another x it takes one. Each
  /// slot holds O(n) numbers for each head (a tape, section 2e) until the matrices change.
  static constexpr std::size_t kStageSlots = 8;
  void stage_velocity(std::size_t slot, const double* x, double* v);
  void stage_vjp(std::size_t slot, const double* x, const double* cotangent, double* x_cotangent,
                 FieldNumbers& gradient);
  /// Throws BackendUnavailable with derivative_refusal's line where the backend's derivatives
  /// do not take the model (what vjp and jvp would throw), before any work is done.
  void require_derivatives() const;
  void jvp(const double* x, const double* x_tangent, const FieldNumbers* tangent, double* v_tangent);
  /// The model's matrices were replaced (a new layer of --regen-period): the remembered
  /// evaluation no longer holds.
  void matrices_changed() {
    cached_ = false;
    for (DerivativePoint& point : points_) point.x.clear();
    backend_.matrices_changed();
  }
  const Model& model() const { return model_; }
  /// The Sinkhorn scalings of the last evaluation (Backend::last_scaling): of the state last
  /// evaluated, which a cached evaluation is too.
  ScalingReport last_scaling() const { return backend_.last_scaling(); }
  std::size_t replicas() const { return replicas_; }
  std::size_t size() const { return replicas_ * model_.n * model_.d; }
  /// Whether token i (of any replica) moves at all: p_i > 0.
  bool moves(std::size_t token) const { return model_.presence[token] > 0.0; }
  std::int64_t evaluations() const { return evaluations_; }
  /// The backend's resident stepper for this integrator (made at the first call), or null
  /// where the integrator is adaptive or the backend has none (Backend::resident_stepper).
  ResidentStepper* resident_stepper(const Integrator& integrator);

 private:
  const Model& model_;
  Backend& backend_;
  std::size_t replicas_;
  void evaluate(const double* x, bool with_attention_output, bool with_weight_sums);
  /// The field of a placement other than post (docs/model.md section 2c).
  void evaluate_placement(const double* x, bool with_weight_sums);
  /// A state at which the derivatives' forward pass was taken: x, the states the layer reads
  /// (N(x) for pre and peri, else x; the backend's tape is taken at their address) and its
  /// output p_i F_i on them. points_[0] serves vjp, jvp and attention_output_vjp, points_[1 +
  /// slot] the stages (x empty: none taken).
  struct DerivativePoint {
    std::vector<double> x, read, output;
  };
  /// The forward pass at x into `point`; refuses a model the backend's derivatives do not
  /// take.
  void derivative_forward(const double* x, DerivativePoint& point);
  DerivativePoint& stage_point(std::size_t slot);
  /// The VJP at point.x (after derivative_forward there).
  void vjp_at(const DerivativePoint& point, const double* cotangent, double* x_cotangent,
              FieldNumbers& gradient);
  /// After derivative_forward: x's cotangent (written) of the output's cotangent, through
  /// the layer and, for pre and peri, the directions N(x) it reads.
  void output_to_state_vjp(const DerivativePoint& point, const double* output_cotangent,
                           double* x_cotangent, FieldNumbers& gradient);
  std::int64_t evaluations_ = 0;
  bool cached_ = false, cached_attention_output_ = false, cached_weight_sums_ = false;
  bool wants_attention_output_ = false;
  std::vector<double> cached_x_, cached_v_, cached_sums_, cached_output_;  ///< the last evaluation
  std::vector<double> directions_, layer_velocity_;  ///< a placement's read states, the backend's own field
  /// The derivatives' arrays (the states the layer reads, its output, their cotangents or
  /// tangents), kept from call to call.
  std::vector<DerivativePoint> points_ = std::vector<DerivativePoint>(1 + kStageSlots);
  std::vector<double> output_adjoint_, read_adjoint_;
  std::string resident_for_;  ///< the integrator resident_ was asked for ("" before)
  std::unique_ptr<ResidentStepper> resident_;
};

}  // namespace mfattn
