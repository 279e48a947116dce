// Prompts and frozen prefix tokens (docs/model.md sections 1-4): prefix tokens are sources that
// never move, seen by every receiver unless the per-prompt mask hides another prompt's prefix.
#include <cmath>
#include <fstream>
#include <numeric>

#include "mfattn/observers/observables.hpp"
#include "test_support.hpp"

namespace mfattn {
namespace {

using testing::config;
using testing::simulate;
using testing::with;
using testing::read_doubles;


// Connected components of the graph <x_i, x_j> > 1 - delta (a plain BFS, written here).
std::size_t count_clusters(const State& s, double delta = 1e-4) {
  std::vector<int> label(s.n, -1);
  int clusters = 0;
  for (std::size_t seed = 0; seed < s.n; ++seed) {
    if (label[seed] >= 0) continue;
    std::vector<std::size_t> queue{seed};
    label[seed] = clusters;
    while (!queue.empty()) {
      const std::size_t i = queue.back();
      queue.pop_back();
      for (std::size_t j = 0; j < s.n; ++j) {
        if (label[j] >= 0) continue;
        double inner = 0.0;
        for (std::size_t c = 0; c < s.d; ++c) inner += s.token(0, i)[c] * s.token(0, j)[c];
        if (inner > 1.0 - delta) {
          label[j] = clusters;
          queue.push_back(j);
        }
      }
    }
    ++clusters;
  }
  return static_cast<std::size_t>(clusters);
}

// Every mask, factor, gauge and weight combination with prefix tokens agrees with the
// pair-by-pair reference backend along short trajectories (small-d lanes and large-d blocks).
TEST(Prefix, EveryCombinationAgreesWithTheReferenceBackend) {
  const std::vector<std::vector<std::string>> cases = {
      {"--prefix", "5", "--prompts", "3", "--mask", "per-prompt", "--prefix-init", "clustered"},
      {"--prefix", "3", "--prompts", "2", "--mask", "per-prompt", "--d", "9", "--kernel", "sa",
       "--prefix-weight", "2.5"},
      {"--prefix", "4", "--prompts", "2", "--mask", "causal+per-prompt", "--geometry", "rope",
       "--d", "4", "--prefix-weight", "0.3"},
      {"--prefix", "70", "--geometry", "rope", "--d", "6", "--values", "plain", "--kernel", "sa"},
      {"--prefix", "2", "--prompts", "4", "--mask", "window+per-prompt", "--window", "6",
       "--aux-factor", "distance", "--aux-lambda", "0.2", "--d", "12", "--q", "gaussian", "--k",
       "gaussian"},
      {"--prefix", "3", "--prompts", "3", "--mask", "per-prompt", "--aux-factor", "cosine",
       "--positions", "uniform", "--amplitudes", "0.8", "--null-tokens", "5"},
      {"--prefix", "6", "--aux-factor", "gaussian", "--aux-sigma", "3", "--mask", "causal",
       "--geometry", "rope-mixed", "--d", "6", "--prefix-weight", "4"},
  };
  for (const auto& extra : cases) {
    const auto cfg = config(with({"--n", "37", "--beta", "1.5", "--seed", "8", "--horizon", "0.5",
                                  "--dt", "0.01", "--save-every", "0.5"},
                                 extra));
    std::string label;
    for (const auto& a : extra) label += a + " ";
    const auto fast = testing::expect_cpu_matches_reference(cfg, label);
    // One evaluation with weight sums, to 1e-12 relative.
    auto cpu = make_backend("cpu", fast.model, BackendOptions{1}), ref = make_backend("reference", fast.model, BackendOptions{1});
    const std::size_t n = fast.model.n, d = fast.model.d;
    std::vector<double> v_cpu(n * d), v_ref(n * d), s_cpu(n), s_ref(n);
    cpu->velocity(1, fast.frames.front().x.data(), v_cpu.data(), s_cpu.data());
    ref->velocity(1, fast.frames.front().x.data(), v_ref.data(), s_ref.data());
    EXPECT_LT(testing::max_abs_difference(v_cpu, v_ref), 1e-12) << label;
    for (std::size_t i = 0; i < n; ++i)
      EXPECT_NEAR(s_cpu[i], s_ref[i], 1e-12 * std::fabs(s_ref[i])) << label << " receiver " << i;
  }
}

// d = 2, fixed sources at angles phi_p: with m_ip the (per-prompt) visibility,
//   dtheta_i/dt = -(1/M) [ sum_j e^{beta cos(theta_i - theta_j)} sin(theta_i - theta_j)
//                          + w sum_p m_ip e^{beta cos(theta_i - phi_p)} sin(theta_i - phi_p) ],
//   M = n + w P, integrated here by classical RK4 on the angles.
TEST(Prefix, TwoDimensionalAnglesFollowTheOdeWithFixedSources) {
  const auto dir = testing::scratch_dir("prefix_angles");
  const std::vector<double> phi = {0.3, 2.0, -1.1, 2.9};
  const std::string prefix_file = (dir / "prefix.txt").string();
  {
    std::ofstream rows(prefix_file);
    rows.precision(17);
    for (double a : phi) rows << std::cos(a) << ' ' << std::sin(a) << '\n';
  }
  const std::size_t n = 5;
  const double beta = 1.2, weight = 1.5, horizon = 2.0, h = 1e-3;
  for (const bool per_prompt : {false, true}) {
    auto args = std::vector<std::string>{
        "--n", "5", "--d", "2", "--beta", "1.2", "--horizon", "2", "--dt", "0.001",
        "--save-every", "2", "--seed", "3", "--prefix", "2", "--prompts", "2", "--prefix-init",
        prefix_file, "--normalize-init", "--prefix-weight", "1.5"};
    if (per_prompt) args.insert(args.end(), {"--mask", "per-prompt"});
    const auto t = simulate(config(args));
    const std::vector<int> active_prompt = {0, 0, 0, 1, 1}, prefix_prompt = {0, 0, 1, 1};
    std::vector<double> theta(n);
    for (std::size_t i = 0; i < n; ++i)
      theta[i] = std::atan2(t.frames.front().token(0, i)[1], t.frames.front().token(0, i)[0]);
    const double mass = double(n) + weight * double(phi.size());
    auto field = [&](const std::vector<double>& th) {
      std::vector<double> out(n, 0.0);
      for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t j = 0; j < n; ++j)
          out[i] -= std::exp(beta * std::cos(th[i] - th[j])) * std::sin(th[i] - th[j]) / mass;
        for (std::size_t p = 0; p < phi.size(); ++p) {
          if (per_prompt && active_prompt[i] != prefix_prompt[p]) continue;
          out[i] -= weight * std::exp(beta * std::cos(th[i] - phi[p])) * std::sin(th[i] - phi[p]) / mass;
        }
      }
      return out;
    };
    for (int s = 0; s < std::lround(horizon / h); ++s) {
      const auto k1 = field(theta);
      std::vector<double> tmp(n);
      for (std::size_t i = 0; i < n; ++i) tmp[i] = theta[i] + 0.5 * h * k1[i];
      const auto k2 = field(tmp);
      for (std::size_t i = 0; i < n; ++i) tmp[i] = theta[i] + 0.5 * h * k2[i];
      const auto k3 = field(tmp);
      for (std::size_t i = 0; i < n; ++i) tmp[i] = theta[i] + h * k3[i];
      const auto k4 = field(tmp);
      for (std::size_t i = 0; i < n; ++i) theta[i] += h * (k1[i] + 2 * k2[i] + 2 * k3[i] + k4[i]) / 6;
    }
    double moved = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      const double* x = t.frames.back().token(0, i);
      EXPECT_NEAR(x[0], std::cos(theta[i]), 1e-11) << "per-prompt " << per_prompt;
      EXPECT_NEAR(x[1], std::sin(theta[i]), 1e-11) << "per-prompt " << per_prompt;
      moved = std::max(moved, std::fabs(x[0] - t.frames.front().token(0, i)[0]));
    }
    EXPECT_GT(moved, 0.05);
  }
}


// The prefix tokens of the output are the file's rows to the last bit, with their labels; the
// moving tokens carry their prompt ids.
TEST(Prefix, TokensStayBitIdenticalAndAreWrittenToParticlesPrefix) {
  const auto dir = testing::scratch_dir("prefix_output");
  const std::string prefix_file = (dir / "prefix.txt").string(), out = (dir / "run.h5").string();
  std::ofstream(prefix_file) << "1 0 0\n0 0.6 0.8\n0 0 -1\n-0.8 0 0.6\n";
  const auto result = testing::run_mfattn(
      "run --n 10 --d 3 --prefix 2 --prompts 2 --prefix-init " + prefix_file +
      " --mask per-prompt --prefix-weight 3 --horizon 4 --quiet --threads 1 --out " + out);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const std::vector<double> expected = {1, 0, 0, 0, 0.6, 0.8, 0, 0, -1, -0.8, 0, 0.6};
  const auto written = read_doubles(out, "/particles/prefix/position");
  ASSERT_EQ(written.size(), expected.size());
  EXPECT_TRUE(testing::bitwise_equal(written.data(), expected.data(), expected.size()));
  EXPECT_EQ(read_doubles(out, "/particles/prefix/prompt_id"), (std::vector<double>{0, 0, 1, 1}));
  EXPECT_EQ(read_doubles(out, "/particles/prefix/presence"), (std::vector<double>{3, 3, 3, 3}));
  EXPECT_EQ(read_doubles(out, "/particles/prefix/aux_position"), (std::vector<double>{-2, -1, -2, -1}));
  EXPECT_EQ(read_doubles(out, "/particles/prefix/id"), (std::vector<double>{10, 11, 12, 13}));
  EXPECT_EQ(read_doubles(out, "/particles/tokens/prompt_id"),
            (std::vector<double>{0, 0, 0, 0, 0, 1, 1, 1, 1, 1}));
  // The moving tokens do move, towards the fixed sources.
  const auto positions = read_doubles(out, "/particles/tokens/position/value");
  EXPECT_GT(std::fabs(positions.front() - positions[positions.size() - 30]), 1e-3);
}

// K prompts, each with its own cluster of prefix tokens behind the per-prompt mask, end in at
// least K clusters; with the full mask every token sees every prefix and the same start
// collapses to one.
TEST(Prefix, PerPromptPrefixGivesAtLeastAsManyClustersAsPrompts) {
  for (const std::string prompts : {"3", "4"}) {
    const std::vector<std::string> base = {"--n", "48", "--d", "3", "--prefix", "4", "--prompts",
                                           prompts, "--prefix-init", "clustered",
                                           "--prefix-spread", "0.02", "--prefix-weight", "4",
                                           "--horizon", "30", "--save-every", "30"};
    const auto split = simulate(config(with(base, {"--mask", "per-prompt"})));
    EXPECT_GE(count_clusters(split.frames.back()), std::stoul(prompts)) << prompts << " prompts";
    const auto shared = simulate(config(base));
    EXPECT_EQ(count_clusters(shared.frames.back()), 1u) << prompts << " prompts, full mask";
  }
}

// The energy sums over moving and prefix tokens alike (docs/model.md section 4); with the
// symmetric per-prompt mask the flow is still a gradient ascent, so E never decreases.
TEST(Prefix, EnergyCountsPrefixRowsAndAscends) {
  for (const std::string kernel : {"usa", "sa"}) {
    const auto t = simulate(config({"--n", "30", "--d", "3", "--kernel", kernel, "--prefix", "3",
                                    "--prompts", "2", "--mask", "per-prompt", "--prefix-weight",
                                    "2", "--geometry", "rope", "--horizon", "10",
                                    "--save-every", "0.1"}));
    ASSERT_TRUE(t.model.is_gradient_flow());
    const Model& m = t.model;
    auto backend = make_backend("cpu", m, BackendOptions{1});
    std::vector<double> v(m.n * m.d), sums(m.n);
    // E written out pair by pair from the model's definition, for the first frame.
    const std::size_t sources = m.n + m.prefix_count();
    auto content = [&](const State& s, std::size_t j) {
      return j < m.n ? s.token(0, j) : m.prefix.data() + (j - m.n) * m.d;
    };
    auto prompt = [&](std::size_t j) { return j < m.n ? m.prompt_id[j] : m.prefix_prompt_id[j - m.n]; };
    auto presence = [&](std::size_t j) { return j < m.n ? m.presence[j] : m.prefix_weight; };
    {
      const State& s = t.frames.front();
      double total = 0.0;
      std::vector<double> gi(m.d), gj(m.d);
      for (std::size_t i = 0; i < sources; ++i)
        for (std::size_t j = 0; j < sources; ++j) {
          if ((i >= m.n || j >= m.n) && prompt(i) != prompt(j)) continue;
          m.gauge->apply(i, content(s, i), gi.data());
          m.gauge->apply(j, content(s, j), gj.data());
          const double score = m.beta * std::inner_product(gi.begin(), gi.end(), gj.begin(), 0.0);
          total += presence(i) * presence(j) * std::exp(score);
        }
      const double expected = total / (2.0 * m.beta * m.mass() * m.mass());
      backend->velocity(1, s.x.data(), v.data(), sums.data());
      EXPECT_NEAR(energy_from_weight_sums(m, s.x.data(), sums.data()), expected, 1e-13 * expected);
    }
    double previous = -1e300, first = 0.0;
    for (const auto& frame : t.frames) {
      backend->velocity(1, frame.x.data(), v.data(), sums.data());
      const double energy = energy_from_weight_sums(m, frame.x.data(), sums.data());
      if (previous == -1e300) first = energy;
      EXPECT_GE(energy, previous - 1e-13 * std::fabs(previous)) << kernel << " t " << frame.time;
      previous = energy;
    }
    EXPECT_GT(previous, first * 1.01) << kernel;
  }
}

// Null tokens appended after the moving ones change no bit with prefix tokens either.
TEST(Prefix, NullTokensLeaveEveryBitUnchanged) {
  for (const std::string dim : {"3", "16"}) {
    const std::vector<std::string> base = {"--n", "29", "--d", dim, "--prefix", "6", "--prompts",
                                           "3", "--mask", "per-prompt", "--prefix-weight", "1.7",
                                           "--amplitudes", "1", "--tau", "0.3", "--eps-den", "1e-12",
                                           "--kernel", "sa", "--geometry", "rope", "--horizon", "1",
                                           "--save-every", "0.5"};
    const auto plain = simulate(config(base)), padded = simulate(config(with(base, {"--null-tokens", "19"})));
    const std::size_t d = plain.model.d;
    for (std::size_t k = 0; k < plain.frames.size(); ++k)
      EXPECT_TRUE(testing::bitwise_equal(plain.frames[k].x.data(), padded.frames[k].x.data(), 29 * d))
          << "d " << dim << " frame " << k;
  }
}

TEST(Prefix, BadPrefixOptionsAreRefusedBeforeAnyOutput) {
  const auto dir = testing::scratch_dir("prefix_errors");
  const std::string out = (dir / "out.h5").string();
  std::ofstream(dir / "two_rows.txt") << "1 0 0\n0 1 0\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--prompts 0", "--prompts 0: must be an integer >= 1"},
      {"--prompts 11", "--prompts 11: must be <= n = 10"},
      {"--prefix -1", "--prefix -1: must be an integer >= 0"},
      {"--prefix 2 --prefix-weight 0", "--prefix-weight 0: must be > 0"},
      {"--prefix 2 --prefix-init nowhere.txt", "--prefix-init nowhere.txt: accepted: random, clustered"},
      {"--mask per-prompt", "--mask per-prompt: per-prompt needs prefix tokens"},
      {"--prefix 2 --mask causal+window", "--mask causal+window: accepted:"},
      {"--prefix 2 --prompts 2 --prefix-init " + (dir / "two_rows.txt").string(),
       "needs prompts * prefix = 4 rows of d numbers, found 2"},
  };
  for (const auto& [arguments, message] : cases) {
    const auto result = testing::run_mfattn("run --n 10 --d 3 --quiet --out " + out + " " + arguments);
    EXPECT_EQ(result.exit_code, 2) << arguments << ": " << result.output;
    EXPECT_NE(result.output.find(message), std::string::npos) << arguments << ": " << result.output;
    EXPECT_FALSE(std::filesystem::exists(out)) << arguments;
  }
}

}  // namespace
}  // namespace mfattn
