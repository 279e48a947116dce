// Gradients through whole runs (docs/model.md section 5b) in process, where the sanitizer
// build runs them: gradient_of_run against central differences of whole runs (the same steps
// taken by run_gradient's own forward pass), checkpoints against every state stored to the
// bit, and the refusals (the PyTorch comparison is tests/python/test_run_gradient.py).
#include "test_support.hpp"

#include <algorithm>
#include <functional>
#include <random>

#include "kernels/run_losses.hpp"
#include "mfattn/integrators/adjoint.hpp"

namespace mfattn {
namespace {

using testing::config;
using testing::dot;

const std::vector<std::string> kLayerRun = {
    "--n",           "7",        "--d",          "4",        "--kernel",     "sa",
    "--heads",       "2",        "--head-dim",   "2",        "--mlp",        "3",
    "--q",           "gaussian", "--k",          "gaussian", "--v",          "gaussian",
    "--geometry",    "rope",     "--prefix",     "1",        "--horizon",    "0.35",
    "--dt",          "0.05",     "--save-every", "0.05",     "--integrator", "rk4",
    "--null-tokens", "1",
};

TEST(RunGradient, IsTheCentralDifferenceOfWholeRuns) {
  const RunConfig cfg = config(kLayerRun);
  const Model model = build_model(cfg);
  const State start = build_initial_state(cfg, model);
  std::mt19937_64 random(11);
  std::normal_distribution<double> normal;
  std::vector<double> c(start.size()), t(start.size());
  for (double& e : c) e = normal(random);
  for (double& e : t) e = normal(random);
  const std::size_t d = model.d;
  for (std::size_t row = 0; row < start.size() / d; ++row) {  // tangent to the sphere
    double radial = 0.0;
    for (std::size_t k = 0; k < d; ++k) radial += t[row * d + k] * start.x[row * d + k];
    for (std::size_t k = 0; k < d; ++k) t[row * d + k] -= radial * start.x[row * d + k];
  }
  const auto linear = [&](const Dynamics&) { return linear_loss(c); };
  const RunGradient gradient = gradient_of_run(cfg, linear, 0);
  EXPECT_EQ(gradient.plan.steps, 7u);
  // The loss of the run from N(x0 + s t): run_gradient's forward pass with a zero cotangent.
  auto backend = make_backend(cfg.backend, model, BackendOptions{1});
  Dynamics field(model, *backend, start.replicas);
  auto integrator = make_integrator(IntegratorSettings{});
  auto loss = [&](double s) {
    State moved = start;
    for (std::size_t row = 0; row < start.size() / d; ++row) {
      double norm2 = 0.0;
      for (std::size_t k = 0; k < d; ++k) {
        moved.x[row * d + k] = start.x[row * d + k] + s * t[row * d + k];
        norm2 += moved.x[row * d + k] * moved.x[row * d + k];
      }
      for (std::size_t k = 0; k < d; ++k) moved.x[row * d + k] /= std::sqrt(norm2);
    }
    return run_gradient(*integrator, field, moved, cfg.dt, output_times(cfg), linear_loss(c), 0)
        .loss;
  };
  const double h = 1e-5, along = (loss(h) - loss(-h)) / (2 * h);
  EXPECT_NEAR(dot(gradient.x0, t), along, 1e-6 * std::abs(along));
}

// A Runge-Kutta adjoint's stages (Dynamics::stage_velocity, stage_vjp): each stage's VJP
// from its kept tape is the plain VJP at its state to the bit, whatever was taken between,
// and the stage velocity is the field to rounding; a stage VJP at another state takes its
// own forward pass.
TEST(RunGradient, StageTapesGiveThePlainVjp) {
  for (const char* placement : {"post", "pre"}) {
    SCOPED_TRACE(placement);
    std::vector<std::string> args = kLayerRun;
    args.insert(args.end(), {"--normalization", placement, "--backend", "cpu"});
    const RunConfig cfg = config(args);
    const Model model = build_model(cfg);
    const State start = build_initial_state(cfg, model);
    auto backend = make_backend(cfg.backend, model, BackendOptions{2});
    Dynamics field(model, *backend, start.replicas);
    std::mt19937_64 random(17);
    std::normal_distribution<double> normal;
    constexpr std::size_t kStages = 4;
    const std::size_t size = start.size();
    std::vector<std::vector<double>> states(kStages, start.x), cotangents(kStages);
    for (std::size_t s = 0; s < kStages; ++s) {
      for (double& e : states[s]) e += 0.1 * double(s) * normal(random);
      cotangents[s].resize(size);
      for (double& e : cotangents[s]) e = normal(random);
      std::vector<double> kept(size), plain(size);
      field.stage_velocity(s, states[s].data(), kept.data());
      field.velocity(states[s].data(), plain.data());
      for (std::size_t e = 0; e < size; ++e) EXPECT_NEAR(kept[e], plain[e], 1e-12);
    }
    for (std::size_t s = kStages; s-- > 0;) {
      FieldNumbers from_tape = zero_numbers(model), plain = zero_numbers(model);
      std::vector<double> tape_bar(size), plain_bar(size);
      field.stage_vjp(s, states[s].data(), cotangents[s].data(), tape_bar.data(), from_tape);
      field.vjp(states[s].data(), cotangents[s].data(), plain_bar.data(), plain);
      EXPECT_EQ(tape_bar, plain_bar);
      EXPECT_EQ(from_tape.beta, plain.beta);
      EXPECT_EQ(from_tape.sets[0].heads[0].query, plain.sets[0].heads[0].query);
      EXPECT_EQ(from_tape.sets[0].w1, plain.sets[0].w1);
    }
    // Slot 0's tape is used up and its state changed: the stage VJP takes a forward pass.
    FieldNumbers again = zero_numbers(model), plain = zero_numbers(model);
    std::vector<double> again_bar(size), plain_bar(size);
    field.stage_vjp(0, states[1].data(), cotangents[0].data(), again_bar.data(), again);
    field.vjp(states[1].data(), cotangents[0].data(), plain_bar.data(), plain);
    EXPECT_EQ(again_bar, plain_bar);
  }
}

/// The loss <c, x(T)> for a cotangent c of the run's state drawn from N(0, 1) with `seed`.
std::function<FinalLoss(const Dynamics&)> random_linear_loss(const RunConfig& cfg, unsigned seed) {
  std::vector<double> c(build_initial_state(cfg, build_model(cfg)).size());
  std::mt19937_64 random(seed);
  std::normal_distribution<double> normal;
  for (double& e : c) e = normal(random);
  return [c](const Dynamics&) { return linear_loss(c); };
}

TEST(RunGradient, CheckpointsChangeNoBit) {
  const RunConfig cfg = config(kLayerRun);
  const auto linear = random_linear_loss(cfg, 12);
  const RunGradient every = gradient_of_run(cfg, linear, 7);
  EXPECT_EQ(every.recomputed_steps, 0);
  for (std::size_t stored : {1, 2, 3}) {
    SCOPED_TRACE(stored);
    const RunGradient some = gradient_of_run(cfg, linear, stored);
    EXPECT_GT(some.recomputed_steps, 0);
    EXPECT_EQ(some.x0, every.x0);
    EXPECT_EQ(some.final_state, every.final_state);
    EXPECT_EQ(some.numbers.beta, every.numbers.beta);
    EXPECT_EQ(some.numbers.prefix, every.numbers.prefix);
    EXPECT_EQ(some.numbers.presence, every.numbers.presence);
    for (std::size_t h = 0; h < every.numbers.sets[0].heads.size(); ++h) {
      EXPECT_EQ(some.numbers.sets[0].heads[h].query, every.numbers.sets[0].heads[h].query);
      EXPECT_EQ(some.numbers.sets[0].heads[h].value, every.numbers.sets[0].heads[h].value);
    }
    EXPECT_EQ(some.numbers.sets[0].w1, every.numbers.sets[0].w1);
  }
}

// dopri5's steps are not known before the run: its stored states thin out (every other one
// dropped, segments doubled) as they exceed the checkpoints; still the same bits.
TEST(RunGradient, AdaptiveStepsThinTheirCheckpointsAndChangeNoBit) {
  const RunConfig cfg = config(
      {"--n",    "6",        "--d",          "3",        "--kernel",     "sa",
       "--beta", "3",        "--q",          "gaussian", "--k",          "gaussian",
       "--v",    "gaussian", "--integrator", "dopri5",   "--rtol",       "1e-6",
       "--atol", "1e-8",     "--horizon",    "1",        "--save-every", "1"});
  const auto linear = random_linear_loss(cfg, 13);
  const RunGradient every = gradient_of_run(cfg, linear, 1000);
  ASSERT_GT(every.plan.steps, 4u);
  EXPECT_EQ(every.recomputed_steps, 0);
  for (std::size_t stored : {1, 2, 3}) {
    SCOPED_TRACE(stored);
    const RunGradient some = gradient_of_run(cfg, linear, stored);
    EXPECT_LE(some.plan.stored, stored);
    EXPECT_EQ(some.step_sizes, every.step_sizes);
    EXPECT_EQ(some.x0, every.x0);
    EXPECT_EQ(some.numbers.sets[0].heads[0].value, every.numbers.sets[0].heads[0].value);
    EXPECT_EQ(some.numbers.beta, every.numbers.beta);
  }
}

// euler-maruyama's noise drawn again for each step taken again and walked back, and layers
// of --regen-period installed for each: still the same bits from one stored state.
TEST(RunGradient, ReplayedNoiseAndLayersChangeNoBitWithCheckpoints) {
  const RunConfig cfg = config({"--n",
                                "6",
                                "--d",
                                "3",
                                "--kernel",
                                "sa",
                                "--q",
                                "gaussian",
                                "--k",
                                "gaussian",
                                "--v",
                                "gaussian",
                                "--integrator",
                                "euler-maruyama",
                                "--noise-kappa",
                                "20",
                                "--regen-period",
                                "0.1",
                                "--horizon",
                                "0.3",
                                "--dt",
                                "0.05",
                                "--save-every",
                                "0.1"});
  const auto linear = random_linear_loss(cfg, 14);
  const RunGradient every = gradient_of_run(cfg, linear, 6);
  ASSERT_EQ(every.plan.steps, 6u);
  ASSERT_EQ(every.layer_sets.size(), 4u);  // the layers whose starts the run reaches, t = 0.3 too
  EXPECT_NE(every.layer_sets[0][0].heads[0].value, every.layer_sets[1][0].heads[0].value);
  const RunGradient one = gradient_of_run(cfg, linear, 1);
  EXPECT_EQ(one.recomputed_steps, 15);  // one state held: step k taken again k times
  EXPECT_EQ(one.x0, every.x0);
  for (std::size_t layer = 0; layer < 4; ++layer)
    EXPECT_EQ(one.layer_sets[layer][0].heads[0].value, every.layer_sets[layer][0].heads[0].value);
}

// The Hungarian assignment against every permutation, and each distance of measures'
// gradient against central differences of its value (a null token's cotangent 0).
TEST(RunLosses, AssignmentIsTheLeastCostOneAndGradientsAreTheirDifferences) {
  std::mt19937_64 random(21);
  std::normal_distribution<double> normal;
  for (int trial = 0; trial < 3; ++trial) {
    const std::size_t n = 6;
    std::vector<double> cost(n * n);
    for (double& e : cost) e = normal(random);
    const std::vector<std::size_t> assigned = kernels::least_cost_assignment(n, cost);
    std::vector<std::size_t> permutation = {0, 1, 2, 3, 4, 5};
    double least = 1e300, found = 0.0;
    do {
      double total = 0.0;
      for (std::size_t i = 0; i < n; ++i) total += cost[i * n + permutation[i]];
      least = std::min(least, total);
    } while (std::next_permutation(permutation.begin(), permutation.end()));
    for (std::size_t i = 0; i < n; ++i) found += cost[i * n + assigned[i]];
    EXPECT_NEAR(found, least, 1e-12);
  }
  const std::size_t n = 5, d = 3, m = 4;
  std::vector<double> x(n * d), y(m * d), same(4 * d);
  for (double& e : x) e = normal(random);
  for (double& e : y) e = normal(random);
  for (double& e : same) e = normal(random);
  const char moves[] = {1, 1, 0, 1, 1};  // token 2 is a label
  using Loss = std::function<double(const double*, double*)>;
  const std::vector<std::pair<const char*, Loss>> losses = {
      {"w2", [&](const double* at,
                 double* bar) { return kernels::w2_loss(n, d, at, 4, same.data(), moves, bar); }},
      {"energy",
       [&](const double* at, double* bar) {
         return kernels::energy_loss(n, d, at, m, y.data(), moves, bar);
       }},
      {"sinkhorn",
       [&](const double* at, double* bar) {
         return kernels::sinkhorn_loss(n, d, at, m, y.data(), moves, 0.7, bar);
       }},
  };
  for (const auto& entry : losses) {
    SCOPED_TRACE(entry.first);
    const Loss& loss = entry.second;  // (a lambda may not capture a structured binding in clang 14)
    std::vector<double> bar(n * d), unused(n * d), t(n * d), moved(n * d);
    loss(x.data(), bar.data());
    for (std::size_t c = 0; c < d; ++c) EXPECT_EQ(bar[2 * d + c], 0.0);
    for (double& e : t) e = normal(random);
    auto at = [&](double s) {
      for (std::size_t e = 0; e < n * d; ++e) moved[e] = x[e] + s * t[e];
      return loss(moved.data(), unused.data());
    };
    const double h = 1e-6, along = (at(h) - at(-h)) / (2 * h);
    EXPECT_NEAR(dot(bar, t), along, 1e-7 * std::max(1.0, std::abs(along)));
  }
}

TEST(RunGradient, RefusesWhatItDoesNotDifferentiate) {
  const RunConfig lie = config({"--n", "5", "--d", "3", "--integrator", "lie-euler"});
  std::vector<double> c(15, 0.0);
  EXPECT_THROW(gradient_of_run(
                   lie, [&](const Dynamics&) { return linear_loss(c); }, 0),
               UsageError);
  const RunConfig wrong = config({"--n", "5", "--d", "3"});
  RunLoss tokens{RunLossKind::Tokens, std::vector<double>(12, 0.0)};
  EXPECT_THROW(gradient_of_run(
                   wrong, [&](const Dynamics& field) { return final_loss(tokens, field); }, 0),
               UsageError);
  EXPECT_EQ(plan_checkpoints(10, 0, 30).stored, 10u);
  EXPECT_EQ(plan_checkpoints(10, 3, 30).stored, 3u);
  EXPECT_EQ(plan_checkpoints(10, 30, 30).stored, 10u);
  // The default: as many states as fit in the budget.
  EXPECT_EQ(plan_checkpoints(100, 0, kDefaultCheckpointNumbers / 7).stored, 7u);
  EXPECT_EQ(plan_checkpoints(100, 0, kDefaultCheckpointNumbers * 2).stored, 1u);
}

/// The least number of steps taken again to walk back `length` steps from their first state
/// with `states` states held (it among them), by the dynamic programme over every split m:
/// m steps taken to store the state after them, then the last length - m steps with one
/// state fewer and the first m with as many.
std::size_t least_recomputation(std::size_t length, std::size_t states,
                                std::vector<std::vector<std::size_t>>& memo) {
  if (length <= 1) return 0;
  if (states == 1) return length * (length - 1) / 2;
  std::size_t& best = memo[length][states];
  if (best != 0) return best;
  best = std::size_t(-1);
  for (std::size_t m = 1; m < length; ++m)
    best = std::min(best, m + least_recomputation(m, states, memo) +
                              least_recomputation(length - m, states - 1, memo));
  return best;
}

/// The steps binomial_split's schedule takes again for the same walk.
std::size_t schedule_recomputation(std::size_t length, std::size_t states) {
  if (length <= 1) return 0;
  if (states == 1) return length * (length - 1) / 2;
  const std::size_t m = binomial_split(length, states);
  return m + schedule_recomputation(m, states) + schedule_recomputation(length - m, states - 1);
}

TEST(RunGradient, TheBinomialScheduleTakesTheLeastStepsAgain) {
  constexpr std::size_t kLength = 160, kStates = 8;
  std::vector<std::vector<std::size_t>> memo(kLength + 1, std::vector<std::size_t>(kStates + 1));
  for (std::size_t states = 1; states <= kStates; ++states)
    for (std::size_t length = 1; length <= kLength; ++length) {
      SCOPED_TRACE(std::to_string(length) + " steps, " + std::to_string(states) + " states");
      const std::size_t split = binomial_split(length, states);
      if (length > 1 && states > 1) {
        EXPECT_GE(split, 1u);
        EXPECT_LT(split, length);
      }
      EXPECT_EQ(schedule_recomputation(length, states), least_recomputation(length, states, memo));
    }
}

// The run's own count of steps taken again is the schedule's, less the steps of the forward
// pass, and every checkpoint count gives the same bits; one state alone takes each step again
// from x(0).
TEST(RunGradient, RecomputesWhatTheBinomialScheduleSays) {
  const RunConfig cfg = config({"--n", "5", "--d", "3", "--kernel", "sa", "--q", "gaussian",
                                "--horizon", "1.3", "--dt", "0.1", "--save-every", "0.1"});
  const auto linear = random_linear_loss(cfg, 5);
  const RunGradient every = gradient_of_run(cfg, linear, 0);
  ASSERT_EQ(every.plan.steps, 13u);
  EXPECT_EQ(every.plan.stored, 13u);
  EXPECT_EQ(every.recomputed_steps, 0);
  for (std::size_t states : {1, 2, 3, 5, 12}) {
    SCOPED_TRACE(states);
    const RunGradient some = gradient_of_run(cfg, linear, states);
    EXPECT_EQ(some.plan.stored, states);
    // The forward pass itself takes the steps to the schedule's first stored states: to the
    // split of [0, 13) with `states`, then of what follows with one state fewer, ...
    std::size_t forward = 0;
    for (std::size_t held = states; 13 - forward > 1 && held > 1; --held)
      forward += binomial_split(13 - forward, held);
    EXPECT_EQ(std::size_t(some.recomputed_steps), schedule_recomputation(13, states) - forward);
    EXPECT_EQ(some.x0, every.x0);
    EXPECT_EQ(some.numbers.beta, every.numbers.beta);
  }
}

}  // namespace
}  // namespace mfattn
