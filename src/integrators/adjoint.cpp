// The discrete adjoint of whole runs (adjoint.hpp): the run taken by integrate() itself, its
// accepted steps recorded and the first state of every segment of steps kept, then each
// segment taken again from its stored state and walked back step by step
// (Integrator::step_vjp). An adaptive method's steps are not known before they are taken: its
// segments start at one step and double (every other stored state dropped) whenever more than
// the checkpoints are stored.
#include "mfattn/integrators/adjoint.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/run_losses.hpp"
#include "mfattn/backends/backend_errors.hpp"

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

FinalLoss linear_loss(std::vector<double> c) {
  return [c = std::move(c)](const std::vector<double>& x, std::vector<double>& cotangent) {
    cotangent = c;
    double loss = 0.0;
    for (std::size_t e = 0; e < c.size(); ++e) loss += c[e] * x[e];
    return loss;
  };
}

FinalLoss final_loss(const RunLoss& loss, const Dynamics& dynamics) {
  const Model& model = dynamics.model();
  const std::size_t n = model.n, d = model.d, replicas = dynamics.replicas(),
                    size = dynamics.size();
  const std::string name(kRunLossOption.name_of(loss.kind));
  if (loss.kind == RunLossKind::Sinkhorn && !(loss.epsilon > 0 && std::isfinite(loss.epsilon)))
    throw std::invalid_argument("loss_epsilon: " + std::to_string(loss.epsilon) +
                                " (the sinkhorn loss's blur: > 0)");
  if (loss.kind == RunLossKind::Tokens && loss.target.size() != size)
    throw std::invalid_argument(
        "target: " + std::to_string(loss.target.size()) +
        " numbers; the tokens loss takes one target per token, the state's " +
        std::to_string(size));
  if (loss.kind != RunLossKind::Tokens && (loss.target.empty() || loss.target.size() % d != 0))
    throw std::invalid_argument("target: " + std::to_string(loss.target.size()) + " numbers; the " +
                                name + " loss takes rows of d = " + std::to_string(d) + " numbers");
  // The target rows of replica r: its own set where there is one a replica, else the one set.
  const std::size_t rows = loss.target.size() / d;
  const bool per_replica = loss.target_sets > 0;
  if (per_replica && loss.target_sets != replicas)
    throw std::invalid_argument("target: " + std::to_string(loss.target_sets) +
                                " sets of points; the run has " + std::to_string(replicas) +
                                " replicas (give one set for all, or one a replica)");
  std::vector<char> moves(n);
  for (std::size_t i = 0; i < n; ++i) moves[i] = dynamics.moves(i) ? 1 : 0;
  const auto moving_count = std::size_t(std::count(moves.begin(), moves.end(), 1));
  if (loss.kind == RunLossKind::W2 && rows / (per_replica ? replicas : 1) != moving_count)
    throw std::invalid_argument("target: " + std::to_string(rows / (per_replica ? replicas : 1)) +
                                " points; the w2 loss takes as many as the moving tokens (" +
                                std::to_string(moving_count) + ")");
  return [=](const std::vector<double>& x, std::vector<double>& cotangent) {
    cotangent.assign(size, 0.0);
    const char* moving = moves.data();
    double total = 0.0;
    for (std::size_t r = 0; r < replicas; ++r) {
      const double* xr = x.data() + r * n * d;
      double* bar = cotangent.data() + r * n * d;
      if (loss.kind == RunLossKind::Tokens) {
        total += kernels::tokens_loss(n, d, xr, loss.target.data() + r * n * d, moving, bar);
        continue;
      }
      const std::size_t m = per_replica ? rows / replicas : rows;
      const double* points = loss.target.data() + (per_replica ? r * m * d : 0);
      if (loss.kind == RunLossKind::Mmd) {
        total += kernels::mmd_loss(n, d, xr, m, points, moving, loss.gamma, bar);
      } else if (loss.kind == RunLossKind::W2) {
        total += kernels::w2_loss(n, d, xr, m, points, moving, bar);
      } else if (loss.kind == RunLossKind::Energy) {
        total += kernels::energy_loss(n, d, xr, m, points, moving, bar);
      } else {
        try {
          total += kernels::sinkhorn_loss(n, d, xr, m, points, moving, loss.epsilon, bar);
        } catch (const std::runtime_error& error) {
          throw NumericalError(error.what());
        }
      }
    }
    return total;
  };
}

namespace {

/// The steps integrate() takes with a fixed step dt from `time` through every target.
std::size_t fixed_step_count(double time, double dt, const std::vector<double>& targets) {
  std::size_t steps = 0;
  for (double target : targets)
    while (time < target) {
      const FixedStep step = fixed_step_toward(time, target, dt);
      time = step.lands ? target : time + step.h;
      ++steps;
    }
  return steps;
}

}  // namespace

RunGradient run_gradient(Integrator& integrator, Dynamics& dynamics, const State& start, double dt,
                         const std::vector<double>& targets, const FinalLoss& loss,
                         std::size_t checkpoints, const RunLayers& layers,
                         const std::vector<double>& loss_times) {
  dynamics.require_derivatives();
  for (double time : loss_times)
    if (time != start.time && !std::binary_search(targets.begin(), targets.end(), time))
      throw std::invalid_argument("run_gradient: a loss time is not a time the run lands on");
  RunGradient result;
  // The stored states' spacing: from the step count where it is known before the run, else
  // one step, doubled as the stored states exceed the checkpoints.
  std::size_t budget = 1, segment = 1;
  if (integrator.adaptive()) {
    budget = checkpoints > 0 ? checkpoints
                             : std::max<std::size_t>(1, kDefaultCheckpointNumbers / start.size());
  } else {
    const CheckpointPlan plan = plan_checkpoints(fixed_step_count(start.time, dt, targets),
                                                 checkpoints, start.size());
    budget = std::max<std::size_t>(plan.stored, 1);
    segment = std::max<std::size_t>(plan.segment, 1);
  }
  // The layer whose matrices the model holds (layers.count: none installed yet).
  const bool layered = layers.count > 1;
  std::size_t installed = layers.count;
  auto use_layer = [&](std::size_t layer) {
    if (!layered || layer == installed) return;
    layers.install(layer);
    installed = layer;
  };
  if (layered) use_layer(layers.at(start.time));
  struct TakenStep {
    double h, time_after;
    std::size_t layer;  ///< the layer in force through the step
  };
  std::vector<TakenStep> steps;
  std::vector<State> stored = {start};  // stored[j]: the state after j segments
  auto thin = [&] {  // every other stored state dropped: segments of twice the steps
    for (std::size_t j = 1; 2 * j < stored.size(); ++j) stored[j] = std::move(stored[2 * j]);
    stored.resize((stored.size() + 1) / 2);
    segment *= 2;
  };
  // The loss's cotangents, each with the number of steps taken before its state.
  struct LossTerm {
    std::size_t after_steps;
    std::vector<double> cotangent;
  };
  std::vector<LossTerm> terms;
  auto take_loss = [&](const std::vector<double>& x) {
    LossTerm term{steps.size(), {}};
    result.loss += loss(x, term.cotangent);
    if (std::any_of(term.cotangent.begin(), term.cotangent.end(),
                    [](double e) { return e != 0.0; }))
      terms.push_back(std::move(term));
  };
  State state = start;
  double h = dt;
  integrate(
      integrator, dynamics, state, h, dt, targets,
      [&](const State& at) {
        if (layered) use_layer(layers.at(at.time));
        if (std::binary_search(loss_times.begin(), loss_times.end(), at.time)) take_loss(at.x);
      },
      {},
      [&](double taken, const State& after) {
        steps.push_back({taken, after.time, installed});
        if (steps.size() % segment != 0) return;
        stored.push_back(after);
        // (One more than the budget may be x(T), which is not kept.)
        if (stored.size() > budget + 1) thin();
      });
  if (loss_times.empty()) take_loss(state.x);
  if (stored.size() > 1 && (stored.size() - 1) * segment >= steps.size())
    stored.pop_back();  // x(T)
  if (stored.size() > budget) thin();
  result.plan.steps = steps.size();
  for (const TakenStep& step : steps) result.step_sizes.push_back(step.h);
  result.plan.segment = steps.empty() ? 0 : segment;
  result.plan.stored = steps.empty() ? 0 : stored.size();
  result.final_state = state.x;
  result.numbers = zero_numbers(dynamics.model());
  // Each layer's matrices' gradient: result.numbers.sets holds the one of layer `summing`,
  // the others wait in layer_sets.
  std::vector<std::vector<LayerNumbers>> layer_sets(layered ? layers.count : 0,
                                                    result.numbers.sets);
  std::size_t summing = 0;
  auto sum_into = [&](std::size_t layer) {
    if (!layered || layer == summing) return;
    layer_sets[summing].swap(result.numbers.sets);
    result.numbers.sets.swap(layer_sets[layer]);
    summing = layer;
  };
  std::vector<double>& bar = result.x0;
  bar.assign(start.size(), 0.0);
  // The loss terms taken after `count` steps, added to x_bar(t_count).
  bool carried = false;  // a term was added: x_bar is no longer zero
  auto add_terms = [&](std::size_t count) {
    while (!terms.empty() && terms.back().after_steps == count) {
      carried = true;
      for (std::size_t e = 0; e < bar.size(); ++e) bar[e] += terms.back().cotangent[e];
      terms.pop_back();
    }
  };
  // A zero cotangent has a zero gradient: the forward pass alone (mfattn.torch.flow's).
  if (!terms.empty()) {
    // Backward, segment by segment from the last: its states again, then its steps' adjoints.
    add_terms(steps.size());
    std::vector<double> previous(start.size());
    std::vector<std::vector<double>> states;
    for (std::size_t first_of = result.plan.stored; first_of-- > 0;) {
      const std::size_t first = first_of * segment, last = std::min(steps.size(), first + segment);
      // Segments after the last loss term's state carry a zero cotangent: skipped.
      if (!carried && terms.back().after_steps < first) continue;
      states.assign(1, stored[first_of].x);
      state = stored[first_of];
      for (std::size_t k = first; k + 1 < last; ++k) {
        // The step as it was taken (an adaptive method accepts it again: the same error).
        use_layer(steps[k].layer);
        if (!integrator.step(dynamics, state, steps[k].h).accepted)
          throw std::logic_error("run_gradient: a step taken again was rejected");
        state.time = steps[k].time_after;
        states.push_back(state.x);
        ++result.recomputed_steps;
      }
      for (std::size_t k = last; k-- > first;) {
        use_layer(steps[k].layer);
        sum_into(steps[k].layer);
        integrator.step_vjp(dynamics, states[k - first].data(), steps[k].h,
                            start.step + std::int64_t(k), bar.data(), previous.data(),
                            result.numbers);
        bar.swap(previous);
        add_terms(k);
      }
    }
    add_terms(0);
  }
  if (layered) {
    sum_into(0);
    layer_sets[0] = result.numbers.sets;
    result.layer_sets = std::move(layer_sets);
  }
  return result;
}

}  // namespace mfattn
