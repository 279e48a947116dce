#pragma once
/// \file adjoint.hpp
/// Gradients through whole runs (docs/model.md section 5b): the discrete adjoint of the steps
/// as run (discretise, then differentiate: the exact gradient of the computed trajectory, to
/// rounding), from stored states (checkpoints) and the steps between them taken again.
/// For the loss L = <c, x(T)> of the final state:
///   x_bar(T) = c,   x_bar(t_k) = step_vjp(x(t_k), h_k; x_bar(t_k+1)),   theta_bar += each step's
/// from the last step back to the first; x_bar(0) = dL/dx(0) and theta_bar = dL/dtheta.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mfattn/backends/derivatives.hpp"
#include "mfattn/core/choice_table.hpp"
#include "mfattn/core/state.hpp"
#include "mfattn/integrators/dynamics.hpp"
#include "mfattn/integrators/integrator.hpp"

namespace mfattn {

/// Where run_gradient keeps states: at most `stored` of them at once (R n d numbers each;
/// the state being stepped and a step's stages come on top), by the binomial schedule
/// (binomial_split).
struct CheckpointPlan {
  std::size_t steps = 0, stored = 0;
};

/// The plan for `steps` steps with at most `checkpoints` stored states (0: the default, as
/// many as fit in kDefaultCheckpointNumbers numbers, states of `state_numbers` numbers each).
inline constexpr std::size_t kDefaultCheckpointNumbers = std::size_t{1} << 25;  // 256 MiB
CheckpointPlan plan_checkpoints(std::size_t steps, std::size_t checkpoints,
                                std::size_t state_numbers);

/// The binomial (revolve) schedule (Griewank 1992; Griewank and Walther 2000): `length` steps
/// walked back from their first state with `states` states held at most (that one among
/// them). The first `binomial_split(length, states)` steps are taken again to store the state
/// m after them, the last length - m steps walked back with states - 1, then the first m with
/// states. With t the least number with C(states + t, t) >= length (each step is then taken at
/// most t times), m = max(length - C(states + t - 1, t), C(states + t - 2, t - 2)) clamped to
/// [1, length - 1]: the split of least total recomputation (checked against the dynamic
/// programme in the tests). With one state (states = 1) every step is reached from the first
/// again: length (length - 1) / 2 steps taken again.
std::size_t binomial_split(std::size_t length, std::size_t states);

/// A loss of the final state: its value at x(T), its gradient written into `cotangent` (x's
/// size).
using FinalLoss =
    std::function<double(const std::vector<double>& x, std::vector<double>& cotangent)>;

/// L = <c, x(T)> (c: the caller's cotangent).
FinalLoss linear_loss(std::vector<double> c);

/// The losses of kernels/run_losses.hpp over every replica of `dynamics`' model, summed:
/// "tokens" (target: the state's shape), or a distance of measures, "mmd", "w2" (as many
/// points as moving tokens), "energy", "sinkhorn" (target: m rows of d numbers for every
/// replica, or target_sets = R sets of m rows, one a replica); gamma mmd's, epsilon
/// sinkhorn's. Throws std::invalid_argument naming what does not fit (w2's count when the
/// loss is taken); the sinkhorn loss NumericalError where its iterations do not converge.
enum class RunLossKind { Tokens, Mmd, W2, Energy, Sinkhorn };
inline constexpr Choice<RunLossKind> kRunLossChoices[] = {
    {"tokens", RunLossKind::Tokens}, {"mmd", RunLossKind::Mmd},           {"w2", RunLossKind::W2},
    {"energy", RunLossKind::Energy}, {"sinkhorn", RunLossKind::Sinkhorn},
};
inline constexpr ChoiceOption<RunLossKind> kRunLossOption{"loss", kRunLossChoices};
struct RunLoss {
  RunLossKind kind = RunLossKind::Tokens;
  std::vector<double> target;
  double gamma = 1.0;
  std::size_t target_sets = 0;  ///< a distance of measures: 0, one set for every replica; else R
  double epsilon = 0.1;         ///< sinkhorn's blur (its cost |a - b|^2)
};
FinalLoss final_loss(const RunLoss& loss, const Dynamics& dynamics);

/// Layers in time (--layer-time, --regen-period): layer l's matrices act from its start on.
/// run_gradient lands on every start (the caller puts them among the targets), installs the
/// layer in force there, and keeps each layer's matrices' gradient apart.
struct RunLayers {
  std::size_t count = 1;                           ///< 1: one layer for the whole run
  std::function<std::size_t(double time)> at;      ///< the layer in force from `time` on
  std::function<void(std::size_t layer)> install;  ///< its matrices into the model and field
};

struct RunGradient {
  double loss = 0.0;                ///< L(x(T)), or the sum of L(x(t)) over the loss times
  std::vector<double> final_state;  ///< x(T)
  std::vector<double> x0;           ///< dL/dx(0), x's shape
  /// dL/dtheta (zero_numbers' shapes); with layers, `sets` holds layer 0's matrices' gradient
  /// and layer_sets every layer's (layer_sets[0] == sets).
  FieldNumbers numbers;
  std::vector<std::vector<LayerNumbers>> layer_sets;
  CheckpointPlan plan;
  std::int64_t recomputed_steps = 0;  ///< steps taken again from the stored states
  std::vector<double> step_sizes;     ///< every accepted step's h, in order (dopri5's, frozen)
};

/// The run from `start` by integrate() (step dt, or dopri5's first step), landing on every
/// time of `targets` (increasing, the last the horizon), and the gradient of loss(x(T)) (or
/// of sum_t loss(x(t)) over `loss_times`, each one of the targets or the start's time)
/// through its accepted steps (an adaptive method's step sizes held as taken), with the
/// matrices of `layers` in force where they are.
/// Checkpoints change no bit of it. A non-finite state throws NumericalError; an integrator
/// whose table entry does not differentiate, logic_error.
RunGradient run_gradient(Integrator& integrator, Dynamics& dynamics, const State& start, double dt,
                         const std::vector<double>& targets, const FinalLoss& loss,
                         std::size_t checkpoints, const RunLayers& layers = {},
                         const std::vector<double>& loss_times = {});

}  // namespace mfattn
