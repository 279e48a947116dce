// The discrete adjoint of whole runs (adjoint.hpp): the steps planned as integrate() takes
// them, every `segment`-th state kept on the way forward, then each segment taken again from
// its stored state and walked back step by step (Integrator::step_vjp).
#include "mfattn/integrators/adjoint.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace mfattn {

CheckpointPlan plan_checkpoints(std::size_t steps, std::size_t checkpoints,
                                std::size_t state_numbers) {
  CheckpointPlan plan;
  plan.steps = steps;
  if (steps == 0) return plan;
  std::size_t stored = checkpoints;
  if (stored == 0) {
    const std::size_t fit = kDefaultCheckpointNumbers / std::max<std::size_t>(state_numbers, 1);
    stored = steps + 1 <= fit ? steps : std::size_t(std::ceil(std::sqrt(double(steps))));
  }
  stored = std::clamp<std::size_t>(stored, 1, steps);
  plan.segment = (steps + stored - 1) / stored;
  plan.stored = (steps + plan.segment - 1) / plan.segment;
  return plan;
}

namespace {

void check_finite(const State& state) {
  for (double value : state.x)
    if (!std::isfinite(value)) {
      std::ostringstream message;
      message << "non-finite state at step " << state.step << ", t = " << state.time
              << " (the velocity overflowed or the step diverged)";
      throw NumericalError(message.str());
    }
}

}  // namespace

RunGradient run_gradient(Integrator& integrator, Dynamics& dynamics, const State& start, double dt,
                         const std::vector<double>& targets, const std::vector<double>& cotangent,
                         std::size_t checkpoints) {
  if (integrator.adaptive())
    throw std::logic_error("run_gradient: " + integrator.name() + " is adaptive");
  dynamics.require_derivatives();
  // The steps, as integrate() takes them (fixed_step_toward), before any is taken: each with
  // the time it ends at where it lands.
  struct PlannedStep {
    FixedStep step;
    double target;
  };
  std::vector<PlannedStep> steps;
  double time = start.time;
  for (double target : targets)
    while (time < target) {
      const FixedStep step = fixed_step_toward(time, target, dt);
      steps.push_back({step, target});
      time = step.lands ? target : time + step.h;
    }
  RunGradient result;
  result.plan = plan_checkpoints(steps.size(), checkpoints, start.size());
  const std::size_t segment = std::max<std::size_t>(result.plan.segment, 1);
  // Forward: the first state of every segment kept.
  std::vector<State> stored;
  State state = start;
  auto take = [&](std::size_t k) {
    integrator.step(dynamics, state, steps[k].step.h);
    if (steps[k].step.lands) state.time = steps[k].target;  // where integrate() lands
    check_finite(state);
  };
  for (std::size_t k = 0; k < steps.size(); ++k) {
    if (k % segment == 0) stored.push_back(state);
    take(k);
  }
  result.final_state = state.x;
  for (std::size_t e = 0; e < cotangent.size(); ++e) result.loss += cotangent[e] * state.x[e];
  result.numbers = zero_numbers(dynamics.model());
  // A zero cotangent has a zero gradient: the forward pass alone (mfattn.torch.flow's).
  if (std::all_of(cotangent.begin(), cotangent.end(), [](double e) { return e == 0.0; })) {
    result.x0.assign(start.size(), 0.0);
    return result;
  }
  // Backward, segment by segment from the last: its states again, then its steps' adjoints.
  std::vector<double> bar = cotangent, previous(start.size());
  std::vector<std::vector<double>> states;
  for (std::size_t first_of = stored.size(); first_of-- > 0;) {
    const std::size_t first = first_of * segment, last = std::min(steps.size(), first + segment);
    states.assign(1, stored[first_of].x);
    state = stored[first_of];
    for (std::size_t k = first; k + 1 < last; ++k) {
      take(k);
      states.push_back(state.x);
      ++result.recomputed_steps;
    }
    for (std::size_t k = last; k-- > first;) {
      integrator.step_vjp(dynamics, states[k - first].data(), steps[k].step.h, bar.data(),
                          previous.data(), result.numbers);
      bar.swap(previous);
    }
  }
  result.x0 = bar;
  return result;
}

}  // namespace mfattn
