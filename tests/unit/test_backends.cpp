// The CPU backend against the reference backend (docs/model.md section 2 written pair by pair),
// determinism across thread counts, null-token inertness and overflow detection.
#include <fstream>

#include "test_support.hpp"
#include "mfattn/app/validate.hpp"

namespace mfattn {
namespace {

using testing::bitwise_equal;
using testing::config;
using testing::simulate;

struct Case {
  std::vector<std::string> args;
};

std::vector<double> evaluate(const Model& model, const State& state, const std::string& backend_name,
                             int threads, std::vector<double>* weight_sums = nullptr) {
  auto backend = make_backend(backend_name, model, BackendOptions{threads});
  std::vector<double> velocity(state.size());
  if (weight_sums) weight_sums->assign(state.replicas * model.n, 0.0);
  backend->velocity(state.replicas, state.x.data(), velocity.data(),
                    weight_sums ? weight_sums->data() : nullptr);
  return velocity;
}

// The registry is the one list of backends: --backend accepts exactly its names (an unknown
// one is refused naming them all), each name builds a backend of that name or says why this
// build has none, and describe() starts with the loop (the CPU backend adds its kernel set).
TEST(Backends, RegistryNamesEveryBackendOnceAndValidationFollowsIt) {
  const std::vector<std::string> names = backend_names();
  ASSERT_EQ(names, (std::vector<std::string>{"cpu", "reference", "cuda"}));
  const auto cfg = config({"--n", "8", "--d", "3", "--seed", "2"});
  const Model model = build_model(cfg);
  const State state = build_initial_state(cfg, model);
  for (const std::string& name : names) {
    EXPECT_NO_THROW(validate(config({"--backend", name})));
    try {
      auto backend = make_backend(name, model, BackendOptions{1});
      EXPECT_EQ(backend->name(), name);
      std::vector<double> velocity(state.size());
      backend->velocity(state.replicas, state.x.data(), velocity.data(), nullptr);
      EXPECT_EQ(backend->describe().rfind("loop ", 0), 0u) << backend->describe();
      EXPECT_FALSE(described_loop(*backend).empty()) << name;
    } catch (const BackendUnavailable& error) {
      EXPECT_EQ(name, "cuda") << error.what();
      EXPECT_NE(std::string(error.what()).find("accepted here: cpu, reference"), std::string::npos)
          << error.what();
    }
  }
  auto cpu = make_backend("cpu", model, BackendOptions{1});
  std::vector<double> velocity(state.size());
  cpu->velocity(state.replicas, state.x.data(), velocity.data(), nullptr);
  EXPECT_EQ(cpu->describe(), "loop small-systems cpu_kernels " + cpu_kernels_name());  // n = 8
  try {
    validate(config({"--backend", "gpu"}));
    ADD_FAILURE() << "--backend gpu accepted";
  } catch (const UsageError& error) {
    EXPECT_EQ(std::string(error.what()), "--backend gpu: accepted: cpu, reference, cuda");
  }
  try {
    make_backend("gpu", model, BackendOptions{1});
    ADD_FAILURE() << "make_backend(gpu) built a backend";
  } catch (const BackendUnavailable& error) {
    EXPECT_EQ(std::string(error.what()), "--backend gpu: unknown backend (accepted: cpu, reference, cuda)");
  }
}

// CpuBackend against the reference on every model option: test_backend_conformance.cpp, one
// body for every registered backend.

/// While it lives, the CPU backends made keep small systems on the tiled loops
/// (MFATTN_CPU_SMALL_SYSTEMS=off): the tests of those loops take small n too.
struct TiledLoopsOnly {
  TiledLoopsOnly() { ::setenv("MFATTN_CPU_SMALL_SYSTEMS", "off", 1); }
  ~TiledLoopsOnly() { ::unsetenv("MFATTN_CPU_SMALL_SYSTEMS"); }
  TiledLoopsOnly(const TiledLoopsOnly&) = delete;
  TiledLoopsOnly& operator=(const TiledLoopsOnly&) = delete;
};

std::string loop_of(const Model& model, const State& state, int threads) {
  auto backend = make_backend("cpu", model, BackendOptions{threads});
  std::vector<double> velocity(state.size());
  backend->velocity(state.replicas, state.x.data(), velocity.data(), nullptr);
  return described_loop(*backend);
}

// Q = K = I with a full mask takes the symmetric loop (one exp per unordered pair, two-sided
// sums). Against the reference backend across tile boundaries (n = 63, 64, 65, 130, 200: the
// diagonal triangle, partial tiles, several rounds), small and large d, gauges with
// transported and plain values, zero and non-unit presences, V, rescaled time, replicas.
TEST(CpuBackend, SymmetricLoopMatchesReferenceAcrossTilesAndOptions) {
  const TiledLoopsOnly tiled;
  const std::vector<std::vector<std::string>> variants = {
      {},
      {"--geometry", "rope", "--v", "goe"},
      {"--geometry", "rope", "--values", "plain", "--time-scale", "rescaled"},
      {"--tau", "0.5", "--null-tokens", "9"},
      {"--init", "clustered", "--init-clusters", "2", "--init-spread", "0.3"}};
  int checked = 0;
  for (const std::string d : {"2", "3", "4", "6", "20", "64"})
    for (const std::string n : {"1", "63", "64", "65", "130", "200"})
      for (const std::string kernel : {"usa", "sa"}) {
        auto args = testing::with({"--n", n, "--d", d, "--kernel", kernel, "--beta", "2",
                                   "--replicas", "2", "--seed", std::to_string(checked)},
                                  variants[checked % variants.size()]);
        if (checked % variants.size() == 3) {
          // Presences 0.49 / 0 / 0.77 / 0.67 / 0.07 in turn, then 9 null tokens.
          std::string amplitudes;
          for (int i = 0; i < std::stoi(n); ++i)
            amplitudes += std::string(i ? "," : "") + std::vector<std::string>{"0.7", "0", "1.3", "1", "0.2"}[i % 5];
          args = testing::with(args, {"--amplitudes", amplitudes});
        }
        const auto cfg = config(args);
        const Model model = build_model(cfg);
        const State state = build_initial_state(cfg, model);
        ASSERT_EQ(loop_of(model, state, 2), "symmetric") << "d " << d << " n " << n;
        std::vector<double> sums_fast, sums_ref;
        const auto fast = evaluate(model, state, "cpu", 2, &sums_fast);
        const auto ref = evaluate(model, state, "reference", 1, &sums_ref);
        double scale = 0.0;
        for (double v : ref) scale = std::max(scale, std::fabs(v));
        EXPECT_LE(testing::max_abs_difference(fast, ref), 1e-13 * std::max(scale, 1.0))
            << "d " << d << " n " << n << " " << kernel << " variant " << checked % variants.size();
        for (std::size_t i = 0; i < sums_ref.size(); ++i)
          EXPECT_NEAR(sums_fast[i], sums_ref[i], 1e-12 * sums_ref[i]) << "weight sum " << i;
        ++checked;
      }
  EXPECT_EQ(checked, 72);
}

// Sliding windows and the distance and Gaussian factors are symmetric in the positions
// (m_ij = m_ji, c_ij = c_ji): the symmetric loop takes them as one log-term per pair and
// skips the blocks whose tiles lie farther apart than the window. Against the reference
// backend with sorted (index, uniform), unsorted (random) and two-dimensional (grid)
// positions, windows that hide whole blocks, part of a block or nothing, small and large d.
TEST(CpuBackend, SymmetricLoopTakesWindowsAndSymmetricFactors) {
  const TiledLoopsOnly tiled;
  const std::vector<std::vector<std::string>> variants = {
      {"--mask", "window", "--window", "70"},
      {"--mask", "window", "--window", "9", "--aux-factor", "gaussian", "--aux-sigma", "4"},
      {"--aux-factor", "distance", "--aux-lambda", "0.3", "--geometry", "rope"},
      {"--positions", "random", "--pos-scale", "50", "--mask", "window", "--window", "6"},
      {"--geometry", "rope-axial", "--mask", "window", "--window", "5", "--aux-factor", "distance",
       "--tau", "0.5", "--null-tokens", "5"},  // with presences 1, 0, 0.4 in turn (below)
      {"--positions", "uniform", "--mask", "window", "--window", "0.5", "--aux-factor",
       "gaussian", "--aux-sigma", "0.2", "--time-scale", "rescaled"}};
  int checked = 0;
  for (const std::string d : {"2", "3", "4", "6", "64"})
    for (const std::string n : {"3", "65", "200", "300"})
      for (const std::string kernel : {"usa", "sa"}) {
        const auto& variant = variants[checked % variants.size()];
        auto args = testing::with({"--n", n, "--d", d, "--kernel", kernel, "--beta", "2",
                                   "--replicas", "2", "--seed", std::to_string(checked)},
                                  variant);
        if (variant[1] == "rope-axial") {
          std::string amplitudes;
          for (int i = 0; i < std::stoi(n); ++i)
            amplitudes += std::string(i ? "," : "") + std::vector<std::string>{"1", "0", "0.4"}[i % 3];
          args = testing::with(args, {"--amplitudes", amplitudes});
        }
        const auto cfg = config(args);
        const Model model = build_model(cfg);
        const State state = build_initial_state(cfg, model);
        ASSERT_EQ(loop_of(model, state, 2), "symmetric") << "d " << d << " n " << n;
        std::vector<double> sums_fast, sums_ref;
        const auto fast = evaluate(model, state, "cpu", 2, &sums_fast);
        const auto ref = evaluate(model, state, "reference", 1, &sums_ref);
        double scale = 0.0;
        for (double v : ref) scale = std::max(scale, std::fabs(v));
        EXPECT_LE(testing::max_abs_difference(fast, ref), 1e-13 * std::max(scale, 1.0))
            << "d " << d << " n " << n << " " << kernel << " variant " << checked % variants.size();
        for (std::size_t i = 0; i < sums_ref.size(); ++i)
          EXPECT_NEAR(sums_fast[i], sums_ref[i], 1e-12 * sums_ref[i])
              << "weight sum " << i << " variant " << checked % variants.size();
        ++checked;
      }
  EXPECT_EQ(checked, 40);
}

// Two edges of the window's block skipping. Index positions with window 65: tiles 0 (0-63)
// and 2 (128-191) are exactly 65 apart, so that block must run (the pair 63, 128 is visible
// at exactly the window) while tiles 0 and 3 are skipped. And five position coordinates (a
// Lie gauge with five generators): the mask, the factor and the tile boxes read all of them.
TEST(CpuBackend, SymmetricLoopKeepsPairsAtTheWindowEdgeAndReadsEveryPositionCoordinate) {
  const TiledLoopsOnly tiled;
  const auto dir = testing::scratch_dir("five_generators");
  const std::string generators = (dir / "generators.txt").string();
  {
    // Five skew-symmetric 4 x 4 generators, one block of 4 rows each.
    std::ofstream out(generators);
    for (int g = 0; g < 5; ++g)
      for (int r = 0; r < 4; ++r) {
        for (int c = 0; c < 4; ++c)
          out << (r == c ? 0.0
                         : (r < c ? 1 : -1) * 0.01 *
                               ((g + 1) * (std::min(r, c) + 2 * std::max(r, c) + 1) % 7 + 1))
              << " ";
        out << "\n";
      }
  }
  const std::vector<std::vector<std::string>> cases = {
      {"--n", "200", "--d", "3", "--mask", "window", "--window", "65"},
      {"--n", "300", "--d", "6", "--mask", "window", "--window", "65", "--aux-factor", "gaussian",
       "--aux-sigma", "30"},
      {"--n", "150", "--d", "4", "--geometry", "lie", "--generators", generators, "--positions",
       "random", "--pos-scale", "0.2", "--mask", "window", "--window", "20", "--aux-factor",
       "distance", "--aux-lambda", "0.05"}};
  for (const auto& base : cases)
    for (const std::string kernel : {"usa", "sa"}) {
      const auto cfg = config(testing::with(base, {"--kernel", kernel, "--beta", "2", "--seed", "5"}));
      const Model model = build_model(cfg);
      const State state = build_initial_state(cfg, model);
      ASSERT_EQ(loop_of(model, state, 2), "symmetric") << base[1];
      std::vector<double> sums_fast, sums_ref;
      const auto fast = evaluate(model, state, "cpu", 2, &sums_fast);
      const auto ref = evaluate(model, state, "reference", 1, &sums_ref);
      double scale = 0.0;
      for (double v : ref) scale = std::max(scale, std::fabs(v));
      EXPECT_LE(testing::max_abs_difference(fast, ref), 1e-13 * std::max(scale, 1.0))
          << "n " << base[1] << " " << kernel << " k " << model.position_dim;
      for (std::size_t i = 0; i < sums_ref.size(); ++i)
        EXPECT_NEAR(sums_fast[i], sums_ref[i], 1e-12 * sums_ref[i]) << "weight sum " << i;
    }
}

// A tile's odd-round row sums start in its block (I, I + 1). Positions from a file put tiles
// 0 and 3 side by side and tiles 1 and 2 far from every other: with window 10 the blocks
// (0, 1), (1, 2), (2, 3) are skipped and (0, 3) runs, so tile 0's odd sums must start from
// zero without their first block, in every evaluation (each step would otherwise add the
// previous one's sums). Whole trajectories against the reference backend, 1 and 2 threads.
TEST(CpuBackend, SymmetricLoopStartsOddRowSumsWhereTheirFirstBlockIsSkipped) {
  const TiledLoopsOnly tiled;
  const auto dir = testing::scratch_dir("skipped_first_odd_block");
  const std::string positions = (dir / "positions.txt").string();
  {
    std::ofstream out(positions);
    const double tile_origin[4] = {0.0, 100.0, 1000.0, 0.5};
    for (int i = 0; i < 256; ++i) out << tile_origin[i / 64] + 0.01 * (i % 64) << "\n";
  }
  for (const std::string kernel : {"usa", "sa"}) {
    const RunConfig cfg = config({"--n", "256", "--d", "3", "--kernel", kernel, "--beta", "2",
                                  "--positions", positions, "--mask", "window", "--window", "10",
                                  "--integrator", "euler", "--dt", "0.05", "--horizon", "0.5",
                                  "--save-every", "0.1", "--seed", "3"});
    const Model model = build_model(cfg);
    const State state = build_initial_state(cfg, model);
    ASSERT_EQ(loop_of(model, state, 2), "symmetric");
    const auto ref = simulate(cfg, 1, "reference");
    for (int threads : {1, 2}) {
      const auto fast = simulate(cfg, threads);
      ASSERT_EQ(fast.frames.size(), ref.frames.size());
      for (std::size_t k = 0; k < ref.frames.size(); ++k)
        EXPECT_LE(testing::max_abs_difference(fast.frames[k].x, ref.frames[k].x), 1e-12)
            << kernel << " threads " << threads << " frame " << k;
    }
  }
}

// The causal mask, the cosine factor (sign-changing), prefix tokens and Q != K make the
// logits one-sided: the one-sided loop runs. A shared offset too loose for the underflow edge (2 beta log2 e >=
// 1020) or a present receiver whose weight sum would vanish sends the evaluation back to the
// one-sided loop, whose per-receiver offsets (and exact maxima) keep every weight.
TEST(CpuBackend, SymmetricLoopAppliesOnlyWhereTheLogitsAreSymmetricAndFallsBack) {
  const TiledLoopsOnly tiled;
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--mask", "causal"},
           {"--aux-factor", "cosine"}, {"--q", "gaussian"}, {"--k", "goe"},
           {"--prefix", "3"}}) {
    const auto cfg = config(testing::with({"--n", "70", "--d", "3"}, args));
    const Model model = build_model(cfg);
    EXPECT_EQ(loop_of(model, build_initial_state(cfg, model), 1), "one-sided") << args[0];
  }
  // beta = 400: weights exp(-2 beta) would underflow under the shared offset.
  {
    const auto cfg = config({"--n", "90", "--d", "3", "--kernel", "sa", "--beta", "400",
                             "--init", "clustered", "--init-clusters", "3", "--init-spread", "0.02"});
    const Model model = build_model(cfg);
    const State state = build_initial_state(cfg, model);
    EXPECT_EQ(loop_of(model, state, 2), "one-sided");
    const auto fast = evaluate(model, state, "cpu", 2), ref = evaluate(model, state, "reference", 1);
    EXPECT_LE(testing::max_abs_difference(fast, ref), 1e-12);
  }
  // Presences of 1e-280 leave every S_i = sum_j p_j e_ij below 1e-250 under the shared offset.
  {
    const auto cfg = config({"--n", "5", "--d", "3", "--kernel", "sa", "--amplitudes", "1e-140",
                             "--tau", "1"});
    const Model model = build_model(cfg);
    ASSERT_GT(model.presence[1], 0.0);
    ASSERT_LT(model.presence[1] * 5, 1e-250);
    const State state = build_initial_state(cfg, model);
    EXPECT_EQ(loop_of(model, state, 1), "one-sided");
    const auto fast = evaluate(model, state, "cpu", 1), ref = evaluate(model, state, "reference", 1);
    EXPECT_LE(testing::max_abs_difference(fast, ref), 1e-12);
  }
}

// Appending null tokens keeps every bit when they fill whole extra tiles and the evaluation
// moves from one thread (200 tokens) to two (400 tokens: the rounds of the symmetric loop
// split between the threads). The last tile of the 200 (tile 3) has no odd-round block in
// the row role; with the null tokens it gains (3, 4), which must add exact zeros only.
TEST(NullTokens, SymmetricLoopKeepsEveryBitAcrossTilesAndThreadCounts) {
  const TiledLoopsOnly tiled;
  const std::vector<std::vector<std::string>> terms = {
      {}, {"--mask", "window", "--window", "90", "--aux-factor", "gaussian", "--aux-sigma", "40"}};
  for (const std::string dim : {"3", "20"})
    for (const std::string kernel : {"usa", "sa"})
      for (const auto& extra : terms) {
      // With the window the null tokens' own tiles (positions 200 to 399) are partly skipped.
      const std::vector<std::string> base = testing::with(
          {"--n", "200", "--d", dim, "--kernel", kernel, "--integrator", "heun", "--dt", "0.05",
           "--horizon", "0.2", "--save-every", "0.1", "--eps-den", "1e-12", "--seed", "11"},
          extra);
      const auto plain = simulate(config(base), 2);
      const auto padded = simulate(config(testing::with(base, {"--null-tokens", "200"})), 2);
      ASSERT_EQ(loop_of(padded.model, padded.frames[0], 2), "symmetric");
      const std::size_t d = plain.model.d;
      for (std::size_t k = 0; k < plain.frames.size(); ++k)
        EXPECT_TRUE(bitwise_equal(plain.frames[k].x.data(), padded.frames[k].x.data(), 200 * d))
            << kernel << " d " << dim << " frame " << k << " terms " << extra.size();
      }
}

// With K = -I and every token in one tight cluster, the Cauchy-Schwarz offset B_i = beta
// exceeds every logit -beta <x_i, x_j> by about 2 beta = 1800, so the single pass sees only
// zeros and the exact-maximum pass must recover the velocity. The expected SA velocity is
// computed here with an explicit maximum (the reference backend would underflow too).
TEST(CpuBackend, LooseBoundFallsBackToExactMaximum) {
  const TiledLoopsOnly tiled;
  const auto dir = testing::scratch_dir("loose");
  const std::string minus_identity = (dir / "minus_identity.txt").string();
  std::ofstream(minus_identity) << "-1 0 0\n0 -1 0\n0 0 -1\n";
  const auto cfg = config({"--n", "40", "--d", "3", "--kernel", "sa", "--beta", "900", "--k",
                           minus_identity, "--init", "clustered", "--init-clusters", "1",
                           "--init-spread", "0.05"});
  const Model model = build_model(cfg);
  const State state = build_initial_state(cfg, model);
  const auto fast = evaluate(model, state, "cpu", 2);
  const std::size_t n = model.n, d = model.d;
  double largest = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double* xi = state.token(0, i);
    std::vector<double> logits(n), u(d, 0.0);
    for (std::size_t j = 0; j < n; ++j) {
      double inner = 0.0;
      for (std::size_t c = 0; c < d; ++c) inner += xi[c] * state.token(0, j)[c];
      logits[j] = -900.0 * inner;
    }
    const double top = *std::max_element(logits.begin(), logits.end());
    ASSERT_LT(top, 900.0 - 709.0) << "the offset must be loose for this test to mean anything";
    double total = 0.0;
    for (std::size_t j = 0; j < n; ++j) {
      const double w = std::exp(logits[j] - top);
      total += w;
      for (std::size_t c = 0; c < d; ++c) u[c] += w * state.token(0, j)[c];
    }
    double radial = 0.0;
    for (std::size_t c = 0; c < d; ++c) radial += (u[c] / total) * xi[c];
    for (std::size_t c = 0; c < d; ++c) {
      const double expected = u[c] / total - radial * xi[c];
      EXPECT_NEAR(fast[i * d + c], expected, 1e-10) << "token " << i;
      largest = std::max(largest, std::fabs(expected));
    }
  }
  EXPECT_GT(largest, 1e-3);
}

// Ensembles of small systems (at most 48 tokens that weigh, d <= 4, no gauge, full mask, no
// factor, no prefix) take the small-system loop: against the reference backend on every
// size from one token to the threshold, both kernels, both time scales, presences and null
// tokens, random Q, K, V per replica; identical bytes on one and two threads.
TEST(CpuBackend, SmallSystemLoopMatchesReferenceAndKeepsItsBits) {
  const std::vector<std::vector<std::string>> variants = {
      {},
      {"--k", "goe-unit", "--v", "wishart", "--matrices", "per-replica"},
      {"--q", "gaussian", "--k", "gaussian-product", "--v", "minus-form", "--time-scale", "rescaled"},
      {"--amplitudes", "0.7", "--tau", "0.5", "--null-tokens", "5"},
  };
  int checked = 0;
  for (const std::string d : {"2", "3", "4"})
    for (const std::string n : {"1", "7", "8", "9", "32", "45", "48"})
      for (const std::string kernel : {"usa", "sa"}) {
        const auto cfg = config(testing::with({"--n", n, "--d", d, "--kernel", kernel, "--beta", "2.5",
                                               "--replicas", "3", "--seed", std::to_string(checked)},
                                              variants[checked % variants.size()]));
        ++checked;
        const Model model = build_model(cfg);
        const State state = build_initial_state(cfg, model);
        ASSERT_EQ(loop_of(model, state, 2), "small-systems") << "d " << d << " n " << n;
        std::vector<double> sums_fast, sums_ref;
        const auto fast = evaluate(model, state, "cpu", 2, &sums_fast);
        const auto one = evaluate(model, state, "cpu", 1);
        const auto ref = evaluate(model, state, "reference", 1, &sums_ref);
        double scale = 0.0;
        for (double v : ref) scale = std::max(scale, std::fabs(v));
        EXPECT_LE(testing::max_abs_difference(fast, ref), 1e-13 * std::max(scale, 1.0)) << "d " << d << " n " << n;
        for (std::size_t i = 0; i < sums_ref.size(); ++i)
          EXPECT_NEAR(sums_fast[i], sums_ref[i], 1e-12 * sums_ref[i]) << "weight sum " << i;
        EXPECT_TRUE(bitwise_equal(one.data(), fast.data(), one.size())) << "threads, d " << d << " n " << n;
      }
  // Random Q and K at beta = 1e5: the Cauchy-Schwarz offset is loose by far more than the
  // 830 (base 2) the sums survive, so the vectors are summed again from each lane's exact
  // maximum. Against SA written here from the formula with each row's exact maximum (the
  // reference backend's literal exp(beta s_ij) overflows at this beta): u_i = sum_j
  // softmax_j(beta <Q x_i, K x_j>) x_j, v_i = u_i - <x_i, u_i> x_i (V = I). The logits are
  // ~1e5, so their rounding (1e-11 relative in a weight) sets the tolerance; without the
  // second pass the sums are 0 and the velocities not finite.
  for (const std::string d_text : {"2", "3", "4"}) {
    const auto cfg = config({"--n", "21", "--d", d_text, "--kernel", "sa", "--beta", "1e5", "--q", "gaussian",
                             "--k", "gaussian", "--replicas", "2", "--seed", "11"});
    const Model model = build_model(cfg);
    const State state = build_initial_state(cfg, model);
    ASSERT_EQ(loop_of(model, state, 2), "small-systems");
    const auto fast = evaluate(model, state, "cpu", 2);
    const std::size_t n = model.n, d = model.d;
    double largest = 0.0;
    for (std::size_t r = 0; r < state.replicas; ++r) {
      const AttentionHead& head = model.matrices_of(r).heads.front();
      const double* x = state.x.data() + r * n * d;
      auto product = [&](const Matrix& m, std::size_t i, std::size_t a) {
        double sum = 0.0;
        for (std::size_t c = 0; c < d; ++c) sum += m(Eigen::Index(a), Eigen::Index(c)) * x[i * d + c];
        return sum;
      };
      for (std::size_t i = 0; i < n; ++i) {
        std::vector<double> logit(n);
        for (std::size_t j = 0; j < n; ++j) {
          logit[j] = 0.0;
          for (std::size_t a = 0; a < d; ++a) logit[j] += product(head.query, i, a) * product(head.key, j, a);
          logit[j] *= model.beta;
        }
        const double top = *std::max_element(logit.begin(), logit.end());
        std::vector<double> u(d, 0.0);
        double total = 0.0;
        for (std::size_t j = 0; j < n; ++j) {
          const double w = std::exp(logit[j] - top);
          total += w;
          for (std::size_t c = 0; c < d; ++c) u[c] += w * x[j * d + c];
        }
        double radial = 0.0;
        for (std::size_t c = 0; c < d; ++c) radial += u[c] / total * x[i * d + c];
        for (std::size_t c = 0; c < d; ++c) {
          const double expected = u[c] / total - radial * x[i * d + c];
          EXPECT_NEAR(fast[(r * n + i) * d + c], expected, 1e-8) << "loose offsets, d " << d << " token " << i;
          largest = std::max(largest, std::fabs(expected));
        }
      }
    }
    EXPECT_GT(largest, 1e-2) << "d " << d;
  }
  // 49 tokens that weigh go to the tiled loops, however many null tokens follow them; 40
  // stay small with 30 null tokens appended.
  auto loop_for = [](const std::vector<std::string>& args) {
    const auto cfg = config(args);
    const Model model = build_model(cfg);
    return loop_of(model, build_initial_state(cfg, model), 1);
  };
  EXPECT_EQ(loop_for({"--n", "49", "--d", "3"}), "symmetric");
  EXPECT_EQ(loop_for({"--n", "40", "--d", "3", "--null-tokens", "30"}), "small-systems");
  EXPECT_EQ(loop_for({"--n", "40", "--d", "5"}), "symmetric");
  EXPECT_EQ(loop_for({"--n", "40", "--d", "3", "--geometry", "rope"}), "symmetric");
  EXPECT_EQ(loop_for({"--n", "40", "--d", "3", "--mask", "causal"}), "one-sided");
}

TEST(CpuBackend, OneAndTwoThreadsGiveIdenticalBytes) {
  for (const std::string d : {"3", "4", "7", "40", "64"}) {
    const auto cfg = config({"--n", "301", "--d", d, "--kernel", "sa", "--replicas", "3"});
    const Model model = build_model(cfg);
    const State state = build_initial_state(cfg, model);
    const auto one = evaluate(model, state, "cpu", 1);
    const auto two = evaluate(model, state, "cpu", 2);
    EXPECT_TRUE(bitwise_equal(one.data(), two.data(), one.size())) << "d = " << d;
  }
  // Whole trajectories, adaptive stepping included.
  const auto cfg = config({"--n", "97", "--d", "4", "--integrator", "dopri5", "--horizon", "5"});
  const auto a = simulate(cfg, 1), b = simulate(cfg, 2);
  ASSERT_EQ(a.frames.size(), b.frames.size());
  for (std::size_t k = 0; k < a.frames.size(); ++k)
    EXPECT_TRUE(bitwise_equal(a.frames[k].x.data(), b.frames[k].x.data(), a.frames[k].size()));
}

// Appending null tokens (amplitude 0) with the same eps_den changes no bit of any other
// trajectory, and the null tokens themselves never move.
TEST(NullTokens, InsertionLeavesTrajectoriesBitIdentical) {
  for (const std::string integrator : {"euler", "heun", "rk4", "lie-euler", "lie-rk4", "dopri5"})
    for (const std::string kernel : {"usa", "sa"})
      for (const std::string dim : {"3", "20"}) {
        const std::vector<std::string> base = {"--n", "37", "--d", dim, "--kernel", kernel,
                                               "--integrator", integrator, "--eps-den", "1e-12",
                                               "--horizon", "2", "--save-every", "0.5",
                                               "--amplitudes", "1", "--tau", "0.3", "--seed", "4"};
        auto with_nulls = base;
        with_nulls.insert(with_nulls.end(), {"--null-tokens", "30"});
        const auto plain = simulate(config(base)), padded = simulate(config(with_nulls));
        ASSERT_EQ(plain.frames.size(), padded.frames.size());
        const std::size_t d = plain.model.d, active = 37;
        for (std::size_t k = 0; k < plain.frames.size(); ++k) {
          EXPECT_TRUE(bitwise_equal(plain.frames[k].x.data(), padded.frames[k].x.data(), active * d))
              << integrator << " " << kernel << " d " << dim << " frame " << k;
          EXPECT_TRUE(bitwise_equal(padded.frames[0].x.data() + active * d,
                                    padded.frames[k].x.data() + active * d, 30 * d))
              << "null tokens moved: " << integrator << " frame " << k;
        }
        EXPECT_GT(testing::max_abs_difference(plain.frames.front().x, plain.frames.back().x), 1e-3);
      }
}

TEST(NullTokens, NullReceiverHasExactlyZeroVelocity) {
  const auto cfg = config({"--n", "5", "--amplitudes", "1,0,2,0,1", "--kernel", "sa"});
  const Model model = build_model(cfg);
  const State state = build_initial_state(cfg, model);
  const auto v = evaluate(model, state, "cpu", 1);
  for (std::size_t i : {1u, 3u})
    for (std::size_t c = 0; c < model.d; ++c) EXPECT_EQ(v[i * model.d + c], 0.0);
}

// Model::receivers_at_unit_speed (the mean-field quadrature's grid points): every receiver
// moves with P_x u_i, presence 0 included, while the presences still weigh the sources. In
// each of the CPU loops (small systems, symmetric, one-sided) against the reference backend,
// and against the particle velocity divided by the presence where that is positive.
TEST(CpuBackend, ReceiversAtUnitSpeedSampleTheFieldWhateverTheirPresence) {
  for (const std::vector<std::string>& variant :
       std::vector<std::vector<std::string>>{{"--n", "20"}, {"--n", "150"}, {"--n", "150", "--q", "gaussian"}}) {
    const auto cfg = config(testing::with(variant, {"--d", "2", "--beta", "1.5", "--kernel", "usa"}));
    Model model = build_model(cfg);
    const State state = build_initial_state(cfg, model);
    for (std::size_t i = 0; i < model.n; ++i) model.presence[i] = i % 4 == 1 ? 0.0 : 0.01 * double(1 + i % 7);
    const auto particles = evaluate(model, state, "cpu", 2);
    model.receivers_at_unit_speed = true;
    const auto probes = evaluate(model, state, "cpu", 2);
    const auto reference = evaluate(model, state, "reference", 1);
    double scale = 0.0;
    for (double v : reference) scale = std::max(scale, std::fabs(v));
    EXPECT_LE(testing::max_abs_difference(probes, reference), 1e-13 * scale) << variant[1];
    for (std::size_t i = 0; i < model.n; ++i)
      for (std::size_t c = 0; c < model.d; ++c) {
        const double v = probes[i * model.d + c];
        if (model.presence[i] > 0.0) {
          EXPECT_NEAR(v, particles[i * model.d + c] / model.presence[i], 1e-12 * scale);
        } else if (c == 0) {
          EXPECT_GT(std::fabs(v) + std::fabs(probes[i * model.d + 1]), 0.0) << "receiver " << i;
        }
      }
  }
}

TEST(Overflow, UsaInNaturalTimeIsDetected) {
  // The option parser refuses this beta up front; the backend's own check is what the rest
  // of this test shows (a model built by a program, or with matrices that push the logits up).
  EXPECT_THROW(config({"--n", "16", "--beta", "1000", "--kernel", "usa"}), UsageError);
  auto natural = config({"--n", "16", "--beta", "1", "--kernel", "usa"});
  natural.beta = 1000;
  const Model model = build_model(natural);
  const State state = build_initial_state(natural, model);
  auto backend = make_backend("cpu", model, BackendOptions{1});
  std::vector<double> velocity(state.size());
  try {
    backend->velocity(1, state.x.data(), velocity.data(), nullptr);
    FAIL() << "overflow not detected";
  } catch (const NumericalError& e) {
    EXPECT_NE(std::string(e.what()).find("--time-scale rescaled"), std::string::npos) << e.what();
  }
  // Rescaled time is finite for the same beta, and SA is finite in either scale.
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--n", "16", "--beta", "1000", "--time-scale", "rescaled"},
           {"--n", "16", "--beta", "1000", "--kernel", "sa"}}) {
    const auto cfg = config(args);
    const Model m = build_model(cfg);
    const auto v = evaluate(m, build_initial_state(cfg, m), "cpu", 1);
    for (double value : v) EXPECT_TRUE(std::isfinite(value));
  }
}

}  // namespace
}  // namespace mfattn
