// A whole layer (docs/model.md section 2b): several heads of r < d, values in the head space
// or transported, a feed-forward term. The CPU backend against the reference on the layer's
// options; exact facts: H identical heads are one head with V times H, null tokens change no
// bit, the thread count changes no bit, USA with V_h = Q_h^T Q_h ascends the heads' energy;
// the CUDA backend refuses a layer naming the options.
#include "test_support.hpp"

#include "backends/backend_common.hpp"

#include "mfattn/core/rng.hpp"

namespace mfattn {
namespace {

using testing::config;
using testing::max_abs_difference;

std::vector<double> evaluate(const Model& model, const State& state, const std::string& backend_name,
                             int threads, std::vector<double>* weight_sums = nullptr) {
  return testing::evaluate_velocity(model, state, backend_name, threads, weight_sums);
}

/// An r x c matrix of N(0, 1 / c) entries.
Matrix gaussian(RandomStream& stream, std::size_t r, std::size_t c) {
  Matrix m(r, c);
  for (Eigen::Index a = 0; a < m.rows(); ++a)
    for (Eigen::Index b = 0; b < m.cols(); ++b) m(a, b) = stream.normal() / std::sqrt(double(c));
  return m;
}

/// A head of r x d query and key, value in r dimensions and its d x r output.
AttentionHead low_rank_head(RandomStream& stream, std::size_t d, std::size_t r) {
  AttentionHead head;
  head.query = gaussian(stream, r, d);
  head.key = gaussian(stream, r, d);
  head.value = gaussian(stream, r, d);
  head.output = gaussian(stream, d, r);
  head.full_value = head.output * head.value;
  return head;
}

const std::vector<std::vector<std::string>> kLayerOptions = {
    {"--heads", "3", "--head-dim", "2", "--q", "gaussian", "--k", "gaussian", "--v", "gaussian"},
    {"--heads", "2", "--mlp", "7", "--mlp-activation", "gelu", "--q", "goe", "--v", "minus-qk"},
    {"--mlp", "5", "--mlp-activation", "tanh", "--geometry", "rope"},
    {"--heads", "4", "--head-dim", "2", "--geometry", "rope", "--q", "gaussian", "--k", "gaussian"},
    {"--heads", "2", "--head-dim", "2", "--geometry", "rope", "--values", "plain", "--prefix", "3",
     "--mask", "causal", "--q", "gaussian"},
    {"--heads", "3", "--head-dim", "3", "--mlp", "4", "--aux-factor", "distance", "--aux-lambda", "0.4",
     "--prefix", "2", "--prompts", "2", "--mask", "per-prompt", "--k", "gaussian"},
    {"--heads", "2", "--q", "gaussian", "--k", "gaussian", "--matrices", "per-replica", "--amplitudes", "0.8",
     "--null-tokens", "2", "--time-scale", "rescaled"},
};

// Every backend's loops read the heads' operands and finish from the kernels layer
// (token_operands.hpp's HeadOperands, receiver_finish.hpp): the CPU loops, tiled and on two
// threads, agree with the reference pair by pair, velocities and weight sums.
TEST(Layer, CpuAgreesWithReferenceOnTheLayersOptions) {
  int checked = 0;
  for (const std::string d : {"4", "6", "9"})
    for (const std::string n : {"1", "13", "70"})
      for (const std::string kernel : {"usa", "sa"})
        for (const auto& extra : kLayerOptions) {
          if (n == "1" && std::find(extra.begin(), extra.end(), "--prompts") != extra.end()) continue;
          const RunConfig cfg = config(testing::with({"--n", n, "--d", d, "--kernel", kernel, "--beta", "1.5",
                                                      "--seed", std::to_string(++checked), "--replicas", "2"},
                                                     extra));
          ASSERT_FALSE(build_model(cfg).one_head_of_contents());  // a whole layer
          testing::expect_cpu_field_matches_reference(cfg, "d " + d + " n " + n + " " + kernel + " case " +
                                                          std::to_string(checked));
        }
  EXPECT_GT(checked, 100);
}

// H identical heads are one head whose V is multiplied by H: the heads' sums add in the
// output, for USA and SA, plain values in the head space and transported values.
TEST(Layer, IdenticalHeadsAreOneHeadWithHTimesTheValue) {
  const std::size_t d = 8, r = 4, heads = 5;
  for (const std::string kernel : {"usa", "sa"})
    for (const std::string values : {"plain", "transported"}) {
      const RunConfig cfg = config({"--n", "40", "--d", "8", "--kernel", kernel, "--values", values,
                                    "--geometry", "rope", "--heads", "1", "--head-dim", "4", "--beta", "2"});
      Model many = build_model(cfg);
      RandomStream stream(11, 3);
      const AttentionHead head = low_rank_head(stream, d, r);
      many.matrices.front().heads.assign(heads, head);
      Model one = many;
      AttentionHead scaled = head;
      scaled.output *= double(heads);
      scaled.full_value = scaled.output * scaled.value;
      one.matrices.front().heads.assign(1, scaled);
      const State state = build_initial_state(cfg, many);
      for (const std::string backend : {"cpu", "reference"}) {
        const auto v_many = evaluate(many, state, backend, 1), v_one = evaluate(one, state, backend, 1);
        double scale = 0.0;
        for (double v : v_one) scale = std::max(scale, std::fabs(v));
        EXPECT_LE(max_abs_difference(v_many, v_one), 1e-14 * std::max(1.0, scale))
            << backend << " " << kernel << " " << values;
      }
    }
}

// Null tokens appended change no bit of the others' velocities, and 1 or 2 threads give the
// same bits, with heads, a gauge, prefix tokens and a feed-forward term.
TEST(Layer, NullTokensAndThreadCountsChangeNoBit) {
  testing::expect_null_tokens_and_threads_change_no_bit(
      {"--heads", "3", "--head-dim", "2", "--mlp", "5", "--geometry", "rope", "--q", "gaussian", "--k", "gaussian",
       "--v", "gaussian", "--prefix", "2", "--kernel", "sa", "--seed", "4",
       "--eps-den", "1e-12"});  // auto gives 0 without null tokens
}

// USA with V_h = Q_h^T Q_h (K_h = Q_h) for every head is the gradient ascent of the sum of the
// heads' energies E = sum_h (1 / 2 beta M^2) sum_ij e^{beta <Q_h x_i, Q_h x_j>}: it never
// decreases along an rk4 trajectory.
TEST(Layer, UsaWithSymmetricHeadsAscendsTheHeadsEnergy) {
  const std::size_t d = 6, r = 3;
  const RunConfig cfg = config({"--n", "32", "--d", "6", "--kernel", "usa", "--heads", "1", "--head-dim", "3",
                                "--beta", "1.5", "--seed", "9"});
  Model model = build_model(cfg);
  RandomStream stream(5, 7);
  model.matrices.front().heads.clear();
  for (int h = 0; h < 3; ++h) {
    AttentionHead head;
    head.query = gaussian(stream, r, d);
    head.key = head.query;
    head.value = head.query.transpose() * head.query;
    head.full_value = head.value;
    model.matrices.front().heads.push_back(head);
  }
  State state = build_initial_state(cfg, model);
  auto backend = make_backend("cpu", model, BackendOptions{1});
  std::vector<double> velocity(state.size()), sums(model.n), previous_x;
  double previous = -1.0, first = 0.0;
  for (int step = 0; step <= 400; ++step) {
    backend->velocity(1, state.x.data(), velocity.data(), sums.data());
    const double energy = energy_from_weight_sums(model, state.x.data(), sums.data());
    if (step == 0) first = energy;
    EXPECT_GE(energy, previous - 1e-13 * std::fabs(previous)) << "step " << step;
    previous = energy;
    // An explicit Euler step on the sphere, small enough to ascend (|v| stays below 3).
    for (std::size_t i = 0; i < model.n; ++i) {
      double norm = 0.0;
      for (std::size_t c = 0; c < d; ++c) {
        state.x[i * d + c] += 0.002 * velocity[i * d + c];
        norm += state.x[i * d + c] * state.x[i * d + c];
      }
      for (std::size_t c = 0; c < d; ++c) state.x[i * d + c] /= std::sqrt(norm);
    }
  }
  EXPECT_GT(previous, first * 1.05);  // it did ascend
}

// A layer that the CUDA backend does not take is refused before anything runs, naming the
// options (exit 2 through BackendUnavailable), never run elsewhere in silence.
TEST(Layer, CudaRefusesALayerNamingTheOptions) {
  const Model model = build_model(config({"--n", "8", "--heads", "2"}));
  try {
    make_backend("cuda", model, BackendOptions{1});
    ADD_FAILURE() << "cuda took a layer";
  } catch (const BackendUnavailable& error) {
    const std::string message = error.what();
    EXPECT_TRUE(message.find("--heads") != std::string::npos || message.find("cuda") != std::string::npos) << message;
  }
}

// Bad layer options: one line naming the option, the value and what is accepted.
TEST(Layer, BadOptionsAreRefusedNamingThem) {
  using testing::usage_message;
  EXPECT_EQ(usage_message({"--heads", "0", "--out", "x.h5"}), "--heads 0: must be an integer in [1, 64]");
  EXPECT_EQ(usage_message({"--heads", "65", "--out", "x.h5"}), "--heads 65: must be an integer in [1, 64]");
  EXPECT_EQ(usage_message({"--head-dim", "4", "--d", "3", "--out", "x.h5"}),
            "--head-dim 4: must be an integer in [0, 3] (d = 3)");
  EXPECT_EQ(usage_message({"--mlp-activation", "swish", "--mlp", "3", "--out", "x.h5"}),
            "--mlp-activation swish: accepted: relu, gelu, tanh");
  EXPECT_EQ(usage_message({"--layer-time", "1", "--out", "x.h5"}),
            "--layer-time 1: needs a --weights file with a leading layer axis");
  EXPECT_EQ(usage_message({"--head-dim", "1", "--d", "4", "--geometry", "rope", "--out", "x.h5"}),
            "--head-dim 1: a --geometry needs heads of r >= 2");
}

}  // namespace
}  // namespace mfattn
