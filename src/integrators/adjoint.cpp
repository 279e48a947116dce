// The discrete adjoint of whole runs (adjoint.hpp): the run taken by integrate() itself, its
// accepted steps recorded and some of its states kept, then the steps walked back one by one
// (Integrator::step_vjp) from the last, each from its state, taken again from the nearest
// stored one by the binomial schedule (binomial_split). An adaptive method's steps are not
// known before they are taken: it keeps the first state of every segment of steps (one step
// at first, doubled with every other stored state dropped whenever more than the checkpoints
// are stored), and each segment is walked back by the binomial schedule with the states left.
#include "mfattn/integrators/adjoint.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "kernels/run_losses.hpp"
#include "mfattn/backends/backend_errors.hpp"

namespace mfattn {

CheckpointPlan plan_checkpoints(std::size_t steps, std::size_t checkpoints,
                                std::size_t state_numbers) {
  CheckpointPlan plan;
  plan.steps = steps;
  if (steps == 0) return plan;
  const std::size_t fit = kDefaultCheckpointNumbers / std::max<std::size_t>(state_numbers, 1);
  plan.stored = std::clamp<std::size_t>(checkpoints > 0 ? checkpoints : fit, 1, steps);
  return plan;
}

namespace {

/// C(n, k), saturating at `cap` (every number the schedule compares is at most a step count).
std::size_t binomial_coefficient(std::size_t n, std::size_t k, std::size_t cap) {
  if (k > n) return 0;
  k = std::min(k, n - k);
  std::size_t value = 1;
  for (std::size_t i = 1; i <= k; ++i) {
    // C(n - k + i, i), exact at every i; a product past 2^64 is past the cap (value < cap,
    // i <= k, and k is small wherever the cap is large).
    if (value > std::numeric_limits<std::size_t>::max() / (n - k + i)) return cap;
    value = value * (n - k + i) / i;
    if (value >= cap) return cap;
  }
  return value;
}

}  // namespace

std::size_t binomial_split(std::size_t length, std::size_t states) {
  if (length < 2 || states < 2) return std::max<std::size_t>(length, 1) - 1;
  const std::size_t cap = length + 1;
  std::size_t t = 0;
  while (binomial_coefficient(states + t, t, cap) < length) ++t;
  std::size_t split = 1;
  const std::size_t right = binomial_coefficient(states + t - 1, t, cap);
  if (length > right) split = std::max(split, length - right);
  if (t >= 2) split = std::max(split, binomial_coefficient(states + t - 2, t - 2, cap));
  return std::min(split, length - 1);
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
  // The states held at most (`budget`). A fixed-step run's count is known before it: the
  // forward pass stores the binomial schedule's first states (the splits of its last
  // stretch), store_at. An adaptive method's steps are not: it stores the first state of
  // every `segment` steps, one step at first, doubled (every other state dropped) as the
  // stored states exceed the budget.
  std::size_t budget = 1, segment = 1;
  std::vector<std::size_t> store_at;  // fixed steps: the step counts after which to store
  if (integrator.adaptive()) {
    budget = checkpoints > 0 ? checkpoints
                             : std::max<std::size_t>(1, kDefaultCheckpointNumbers / start.size());
  } else {
    const std::size_t count = fixed_step_count(start.time, dt, targets);
    budget = std::max<std::size_t>(plan_checkpoints(count, checkpoints, start.size()).stored, 1);
    for (std::size_t at = 0, states = budget; count - at > 1 && states > 1; --states) {
      at += binomial_split(count - at, states);
      store_at.push_back(at);
    }
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
  // stored[j]: the state after stored_after[j] steps.
  std::vector<State> stored = {start};
  std::vector<std::size_t> stored_after = {0};
  auto thin = [&] {  // every other stored state dropped: segments of twice the steps
    for (std::size_t j = 1; 2 * j < stored.size(); ++j) {
      stored[j] = std::move(stored[2 * j]);
      stored_after[j] = stored_after[2 * j];
    }
    stored.resize((stored.size() + 1) / 2);
    stored_after.resize(stored.size());
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
        const bool store = integrator.adaptive()
                               ? steps.size() % segment == 0
                               : std::binary_search(store_at.begin(), store_at.end(), steps.size());
        if (!store) return;
        stored.push_back(after);
        stored_after.push_back(steps.size());
        // (One more than the budget may be x(T), which is not kept.)
        if (integrator.adaptive() && stored.size() > budget + 1) thin();
      });
  if (loss_times.empty()) take_loss(state.x);
  if (stored.size() > 1 && stored_after.back() >= steps.size()) {  // x(T)
    stored.pop_back();
    stored_after.pop_back();
  }
  if (integrator.adaptive() && stored.size() > budget) thin();
  result.plan.steps = steps.size();
  for (const TakenStep& step : steps) result.step_sizes.push_back(step.h);
  result.plan.stored = steps.empty() ? 0 : std::min(budget, steps.size());
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
  auto add_terms = [&](std::size_t count) {
    while (!terms.empty() && terms.back().after_steps == count) {
      for (std::size_t e = 0; e < bar.size(); ++e) bar[e] += terms.back().cotangent[e];
      terms.pop_back();
    }
  };
  // Steps k from `from` to `to` taken again (each as it was taken: an adaptive method accepts
  // it again, with the same error).
  auto advance = [&](State& at, std::size_t from, std::size_t to) {
    for (std::size_t k = from; k < to; ++k) {
      use_layer(steps[k].layer);
      if (!integrator.step(dynamics, at, steps[k].h).accepted)
        throw std::logic_error("run_gradient: a step taken again was rejected");
      at.time = steps[k].time_after;
      ++result.recomputed_steps;
    }
  };
  std::vector<double> previous(start.size());
  auto walk_back = [&](const State& at, std::size_t k) {  // x_bar(t_k) from x_bar(t_k+1)
    use_layer(steps[k].layer);
    sum_into(steps[k].layer);
    integrator.step_vjp(dynamics, at.x.data(), steps[k].h, start.step + std::int64_t(k), bar.data(),
                        previous.data(), result.numbers);
    bar.swap(previous);
    add_terms(k);
  };
  // Steps first..last-1 walked back from the state after `first` with `states` states held
  // (it among them), by the binomial schedule.
  std::function<void(const State&, std::size_t, std::size_t, std::size_t)> reverse =
      [&](const State& first_state, std::size_t first, std::size_t last, std::size_t states) {
        if (states <= 1) {
          for (std::size_t k = last; k-- > first;) {
            State at = first_state;
            advance(at, first, k);
            walk_back(at, k);
          }
          return;
        }
        while (last - first > 1) {
          const std::size_t middle = first + binomial_split(last - first, states);
          State at = first_state;
          advance(at, first, middle);
          reverse(at, middle, last, states - 1);
          last = middle;
        }
        walk_back(first_state, first);
      };
  // A zero cotangent has a zero gradient: the forward pass alone (mfattn.torch.flow's).
  if (!terms.empty()) {
    // The steps after the last loss term's state carry a zero cotangent: not walked back.
    std::size_t last = terms.back().after_steps;
    add_terms(last);
    // Stored state j (the first of its stretch) with budget - j states: j + 1 are held.
    for (; !stored.empty(); stored.pop_back()) {
      const std::size_t j = stored.size() - 1, first = stored_after[j];
      if (first >= last) continue;
      reverse(stored[j], first, last, budget - j);
      last = first;
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
