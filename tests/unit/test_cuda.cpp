// The CUDA backend (docs/cuda.md) in two tiers:
//   - CudaEmulation: the whole backend with its device loops run on the host in the device's
//     order (backends/cuda/host_sums.cpp): operands, offsets, the fp32 tiles, the exact pass
//     and the finish, against the reference backend, in fp64 and fp32. Runs everywhere.
//   - CudaDevice: the same checks on the CUDA device, plus what only a device can show
//     (bitwise reruns, agreement with the emulation). Each skips itself, naming the reason,
//     where this build has no CUDA backend or this machine no device.
// The registry's conformance test (test_backend_conformance.cpp) covers --backend cuda on
// every model option too, in both precisions.
#include <fstream>

#include "backends/cuda/cuda_backend.hpp"
#include "backends/cuda/sums_engine.hpp"
#include "backends/model_sources.hpp"
#include "backends/token_operands.hpp"
#include "mfattn/integrators/integrator.hpp"
#include "mfattn/app/run_choices.hpp"
#include "test_support.hpp"

namespace mfattn {
namespace {

using testing::bitwise_equal;
using testing::config;

/// Where the backend's sums run.
enum class Engine { Emulation, Device };

std::unique_ptr<Backend> cuda_backend(Engine engine, const Model& model, Precision precision, int threads) {
  const BackendOptions options{threads, precision};
  return engine == Engine::Emulation ? cuda::make_emulated_cuda_backend(model, options)
                                     : make_cuda_backend(model, options);
}

/// Skips the test unless the engine is there (the emulation always is).
#define SKIP_UNLESS_ENGINE(engine)                                                     \
  do {                                                                                 \
    if ((engine) == Engine::Device) {                                                  \
      try {                                                                            \
        cuda_backend(Engine::Device, build_model(config({"--n", "4"})), Precision::Double, 1); \
      } catch (const BackendUnavailable& error) {                                      \
        GTEST_SKIP() << error.what();                                                  \
      }                                                                                \
    }                                                                                  \
  } while (0)

std::vector<double> velocity_of(Backend& backend, const State& state, std::size_t n,
                                std::vector<double>* sums = nullptr) {
  std::vector<double> velocity(state.size());
  if (sums) sums->assign(state.replicas * n, 0.0);
  backend.velocity(state.replicas, state.x.data(), velocity.data(), sums ? sums->data() : nullptr);
  return velocity;
}

/// The scale of the accuracy rule, per receiver: p_i sum_j |w_ij| |v_ij| / N_i with
/// N_i = M (USA) or eps_den + sum_j w_ij (SA), taken pair by pair as the reference backend
/// takes the velocity.
std::vector<double> absolute_scales(const Model& model, const State& state) {
  const std::size_t n = model.n, d = model.d, sources = n + model.prefix_count();
  std::vector<double> scales(state.replicas * n, 0.0), value(d), product(d);
  host::TokenOperands operands;
  for (std::size_t r = 0; r < state.replicas; ++r) {
    const AttentionHead& head = model.matrices_of(r).heads.front();
    host::prepare_head_operands(host::HeadOperands(model, head), state.x.data() + r * n * d, operands);
    for (std::size_t i = 0; i < n; ++i) {
      double absolute = 0.0, denominator = 0.0;
      for (std::size_t j = 0; j < sources; ++j) {
        const kernels::PairWeightTerms<double> terms = host::model_pair_weight_terms(model, i, j);
        if (!kernels::visible(terms)) continue;
        double score = 0.0;
        for (std::size_t c = 0; c < d; ++c) score += operands.query(i)[c] * operands.key(j)[c];
        const double weight = operands.presence[j] * kernels::weight_factor(terms) *
                              std::exp(model.beta * score - model.exponent_shift());
        const double* z = operands.value(j);
        if (model.values == ValueTransport::Transported && model.gauge)
          model.gauge->apply_transpose(i, z, value.data());
        else
          std::copy(z, z + d, value.data());
        double norm2 = 0.0;
        for (std::size_t a = 0; a < d; ++a) {
          double sum = value[a];
          if (!head.full_value_identity) {
            sum = 0.0;
            for (std::size_t b = 0; b < d; ++b) sum += head.full_value(a, b) * value[b];
          }
          norm2 += sum * sum;
        }
        absolute += std::fabs(weight) * std::sqrt(norm2);
        denominator += weight;
      }
      const double normaliser =
          model.normalization == Normalization::Usa ? model.mass() : model.eps_den + denominator;
      scales[r * n + i] = normaliser > 0.0 ? model.presence[i] * absolute / normaliser : 0.0;
    }
  }
  return scales;
}

// Every model option of the conformance test, fp64 and fp32, against the reference backend:
// each receiver within 1e-13 (fp64) or 2e-6 (fp32) of p_i sum_j |w_ij| |v_ij| / N_i, the
// weight sums within the same share of the largest.
void expect_agreement(Engine engine, Precision precision) {
  const std::vector<std::vector<std::string>> options = {
      {},
      {"--q", "gaussian", "--k", "gaussian", "--v", "goe"},
      {"--mask", "causal", "--time-scale", "rescaled"},
      {"--aux-factor", "distance", "--aux-lambda", "0.3", "--mask", "window", "--window", "5"},
      {"--aux-factor", "toeplitz", "--toeplitz-coefficients", "1,-0.5,0.25",
       "--toeplitz-frequencies", "0.3,1.1,2"},
      {"--geometry", "rope", "--values", "plain"},
      {"--geometry", "rope-mixed", "--k", "gaussian"},
      {"--prefix", "3", "--mask", "window+per-prompt", "--window", "4", "--prompts", "2",
       "--prefix-weight", "2.5"},
      {"--amplitudes", "0.7", "--null-tokens", "3", "--tau", "0.5"},
  };
  const double tolerance = precision == Precision::Float ? 2e-6 : 1e-13;
  int checked = 0;
  // n crosses a source tile (256 sources for d <= 4, 128 to d = 16, 32 above) and the
  // 128-receiver blocks of the device.
  for (const std::string d : {"2", "3", "4", "7", "33", "64"})
    for (const std::string n : {"5", "70", std::stoi(d) <= 4 ? "260" : "140"})
      for (const std::string kernel : {"usa", "sa"})
        for (const auto& extra : options) {
          if (kernel == "sa" && std::find(extra.begin(), extra.end(), "toeplitz") != extra.end()) continue;
          const RunConfig cfg = config(testing::with(
              {"--n", n, "--d", d, "--kernel", kernel, "--beta", "2.5", "--replicas", "2", "--seed",
               std::to_string(++checked)},
              extra));
          const Model model = build_model(cfg);
          const State state = build_initial_state(cfg, model);
          const auto backend = cuda_backend(engine, model, precision, 2);
          const auto reference = make_backend("reference", model, BackendOptions{1});
          std::vector<double> sums, expected_sums;
          const auto velocity = velocity_of(*backend, state, model.n, &sums);
          const auto expected = velocity_of(*reference, state, model.n, &expected_sums);
          const auto scales = absolute_scales(model, state);
          double largest_sum = 0.0;
          for (double sum : expected_sums) largest_sum = std::max(largest_sum, std::fabs(sum));
          const std::string label = "d " + d + " n " + n + " " + kernel + " case " + std::to_string(checked);
          for (std::size_t row = 0; row < scales.size(); ++row) {
            double error2 = 0.0;
            for (std::size_t c = 0; c < model.d; ++c) {
              const double e = velocity[row * model.d + c] - expected[row * model.d + c];
              error2 += e * e;
            }
            EXPECT_LE(std::sqrt(error2), tolerance * scales[row] + 1e-300) << label << " receiver " << row;
            EXPECT_NEAR(sums[row], expected_sums[row], 10 * tolerance * largest_sum) << label << " sum " << row;
          }
        }
  EXPECT_EQ(checked, 6 * 3 * (2 * 9 - 1));
}

TEST(CudaEmulation, AgreesWithReferenceOnEveryModelOptionInFp64) {
  expect_agreement(Engine::Emulation, Precision::Double);
}
TEST(CudaEmulation, AgreesWithReferenceOnEveryModelOptionInFp32) {
  expect_agreement(Engine::Emulation, Precision::Float);
}
TEST(CudaDevice, AgreesWithReferenceOnEveryModelOptionInFp64) {
  SKIP_UNLESS_ENGINE(Engine::Device);
  expect_agreement(Engine::Device, Precision::Double);
}
TEST(CudaDevice, AgreesWithReferenceOnEveryModelOptionInFp32) {
  SKIP_UNLESS_ENGINE(Engine::Device);
  expect_agreement(Engine::Device, Precision::Float);
}

// Null tokens appended to the moving ones (with prefix tokens after them, whose fp32 tiles
// must not shift) change no bit of any other token's velocity; null receivers do not move;
// one and two host threads give the same bytes; so does a second evaluation.
void expect_null_and_rerun_bits(Engine engine, Precision precision) {
  for (const std::string d : {"3", "20"})
    for (const std::string kernel : {"usa", "sa"})
      for (const std::vector<std::string>& extra :
           {std::vector<std::string>{}, {"--prefix", "4", "--prefix-weight", "1.5"},
            {"--mask", "causal", "--aux-factor", "gaussian", "--aux-sigma", "30"}}) {
        const std::vector<std::string> base = testing::with(
            {"--n", "300", "--d", d, "--kernel", kernel, "--eps-den", "1e-12", "--amplitudes", "1",
             "--tau", "0.3", "--seed", "5", "--replicas", "2"},
            extra);
        const RunConfig plain_cfg = config(base);
        const RunConfig padded_cfg = config(testing::with(base, {"--null-tokens", "270"}));
        const Model plain = build_model(plain_cfg), padded = build_model(padded_cfg);
        const State plain_state = build_initial_state(plain_cfg, plain);
        State padded_state = build_initial_state(padded_cfg, padded);
        // The same moving tokens in both (the padded state's own draws for them may differ).
        for (std::size_t r = 0; r < 2; ++r)
          std::copy_n(plain_state.token(r, 0), 300 * plain.d, padded_state.x.data() + r * padded.n * padded.d);
        const auto a = velocity_of(*cuda_backend(engine, plain, precision, 1), plain_state, plain.n);
        const auto twice = cuda_backend(engine, plain, precision, 2);
        const auto b = velocity_of(*twice, plain_state, plain.n);
        const auto b_again = velocity_of(*twice, plain_state, plain.n);
        const auto c = velocity_of(*cuda_backend(engine, padded, precision, 2), padded_state, padded.n);
        const std::string label = "d " + d + " " + kernel + " extra " + std::to_string(extra.size());
        EXPECT_TRUE(bitwise_equal(a.data(), b.data(), a.size())) << "threads: " << label;
        EXPECT_TRUE(bitwise_equal(b.data(), b_again.data(), b.size())) << "rerun: " << label;
        for (std::size_t r = 0; r < 2; ++r) {
          EXPECT_TRUE(bitwise_equal(a.data() + r * 300 * plain.d, c.data() + r * padded.n * padded.d,
                                    300 * plain.d))
              << "null sources: " << label;
          for (std::size_t k = 300 * padded.d; k < padded.n * padded.d; ++k)
            EXPECT_EQ(c[r * padded.n * padded.d + k], 0.0) << "a null receiver moved: " << label;
        }
      }
}

TEST(CudaEmulation, NullSourcesThreadsAndRerunsKeepEveryBit) {
  for (Precision precision : {Precision::Double, Precision::Float})
    expect_null_and_rerun_bits(Engine::Emulation, precision);
}
TEST(CudaDevice, NullSourcesAndRerunsKeepEveryBit) {
  SKIP_UNLESS_ENGINE(Engine::Device);
  for (Precision precision : {Precision::Double, Precision::Float})
    expect_null_and_rerun_bits(Engine::Device, precision);
}

/// The exact pass's receivers of the backend's last evaluation, from describe().
long exact_receivers(const Backend& backend) {
  const std::string text = backend.describe(), key = " exact_receivers ";
  const std::size_t at = text.find(key);
  return at == std::string::npos ? -1 : std::stol(text.substr(at + key.size()));
}

// With K = -I and one tight cluster, the Cauchy-Schwarz offset exceeds every logit by about
// 2 beta: at beta = 80 (160 > the ~42 that fp32's 2^-60 bound allows, but not fp64's 575)
// only the fp32 sums come out loose; at beta = 900 both do. Every receiver must then take the
// exact pass and agree with the CPU backend (exact there too).
void expect_exact_pass(Engine engine) {
  const auto dir = testing::scratch_dir("cuda_loose");
  const std::string minus_identity = (dir / "minus_identity.txt").string();
  std::ofstream(minus_identity) << "-1 0 0\n0 -1 0\n0 0 -1\n";
  for (const std::string beta : {"80", "900"})
    for (Precision precision : {Precision::Double, Precision::Float}) {
      const auto cfg = config({"--n", "40", "--d", "3", "--kernel", "sa", "--beta", beta, "--k",
                               minus_identity, "--init", "clustered", "--init-clusters", "1",
                               "--init-spread", "0.05"});
      const Model model = build_model(cfg);
      const State state = build_initial_state(cfg, model);
      const auto backend = cuda_backend(engine, model, precision, 2);
      const auto velocity = velocity_of(*backend, state, model.n);
      const auto expected = velocity_of(*make_backend("cpu", model, BackendOptions{2}), state, model.n);
      const bool loose = precision == Precision::Float || beta == "900";
      EXPECT_EQ(exact_receivers(*backend), loose ? 40 : 0) << "beta " << beta;
      double largest = 0.0;
      for (double v : expected) largest = std::max(largest, std::fabs(v));
      EXPECT_GT(largest, 1e-3);
      EXPECT_LE(testing::max_abs_difference(velocity, expected),
                (precision == Precision::Float ? 2e-6 : 1e-12))
          << "beta " << beta;
    }
}

TEST(CudaEmulation, LooseOffsetsTakeTheExactPassInBothPrecisions) { expect_exact_pass(Engine::Emulation); }
TEST(CudaDevice, LooseOffsetsTakeTheExactPassInBothPrecisions) {
  SKIP_UNLESS_ENGINE(Engine::Device);
  expect_exact_pass(Engine::Device);
}

// The device's sums against the host's emulation of them, same formulas and order: fp64 to
// rounding (the exponential and the FMAs are the same; only the compilers' contractions of
// the remaining adds may differ), fp32 within the exponential unit's error.
TEST(CudaDevice, AgreesWithItsHostEmulation) {
  SKIP_UNLESS_ENGINE(Engine::Device);
  for (Precision precision : {Precision::Double, Precision::Float})
    for (const std::string d : {"3", "16", "64"}) {
      const RunConfig cfg = config({"--n", "1000", "--d", d, "--kernel", "sa", "--beta", "4",
                                    "--q", "gaussian", "--k", "gaussian", "--mask", "window",
                                    "--window", "400", "--replicas", "3"});
      const Model model = build_model(cfg);
      const State state = build_initial_state(cfg, model);
      const auto device = velocity_of(*cuda_backend(Engine::Device, model, precision, 2), state, model.n);
      const auto host = velocity_of(*cuda_backend(Engine::Emulation, model, precision, 2), state, model.n);
      EXPECT_LE(testing::max_abs_difference(device, host), precision == Precision::Float ? 1e-6 : 1e-14)
          << "d " << d;
    }
}

// A 20-time-unit SA trajectory at n = 256 with rk4 on the device in fp64 stays within 1e-10
// of the CPU backend's (the same steps, the sums in another order), and both collapse alike.
TEST(CudaDevice, TwentyTimeUnitsAtN256StayWithin1e10OfTheCpu) {
  SKIP_UNLESS_ENGINE(Engine::Device);
  const RunConfig cfg = config({"--n", "256", "--d", "3", "--kernel", "sa", "--beta", "1",
                                "--integrator", "rk4", "--dt", "0.05", "--horizon", "20",
                                "--save-every", "5", "--seed", "3"});
  const auto device = testing::simulate(cfg, 2, "cuda");
  const auto cpu = testing::simulate(cfg, 2, "cpu");
  ASSERT_EQ(device.frames.size(), cpu.frames.size());
  for (std::size_t k = 0; k < cpu.frames.size(); ++k)
    EXPECT_LE(testing::max_abs_difference(device.frames[k].x, cpu.frames[k].x), 1e-10) << "frame " << k;
  EXPECT_GT(testing::max_abs_difference(cpu.frames.front().x, cpu.frames.back().x), 1e-2);
}

// ---- the resident kernel (resident_steps.hpp): many fixed steps per launch ----

/// A run of cfg on `backend` (integrate() takes its resident stepper where it has one); the
/// frames' states. resident: whether integrate() found a resident stepper.
std::vector<State> simulate_on(Backend& backend, const RunConfig& cfg, const Model& model, bool* resident = nullptr) {
  State state = build_initial_state(cfg, model);
  auto integrator = make_integrator(integrator_settings(cfg));
  Dynamics dynamics(model, backend, state.replicas);
  if (resident) *resident = dynamics.resident_stepper(*integrator) != nullptr;
  double h = cfg.dt;
  std::vector<State> frames;
  integrate(*integrator, dynamics, state, h, cfg.dt, output_times(cfg), [&](const State& s) { frames.push_back(s); });
  return frames;
}

const std::vector<std::vector<std::string>>& resident_cases() {
  static const std::vector<std::vector<std::string>> cases = {
      {},
      {"--kernel", "sa", "--q", "gaussian", "--k", "gaussian", "--v", "goe", "--matrices", "per-replica"},
      {"--geometry", "rope", "--mask", "causal", "--time-scale", "rescaled", "--beta", "3"},
      {"--geometry", "rope-mixed", "--d", "4", "--values", "plain", "--aux-factor", "distance", "--aux-lambda", "0.3"},
      {"--prefix", "3", "--mask", "window+per-prompt", "--window", "4", "--prompts", "2", "--prefix-weight",
       "2.5", "--kernel", "sa", "--eps-den", "0.5"},
      {"--amplitudes", "0.7", "--null-tokens", "3", "--tau", "0.5", "--d", "6", "--aux-factor", "toeplitz",
       "--toeplitz-coefficients", "1,-0.5", "--toeplitz-frequencies", "0.3,1.1"},
      {"--d", "2", "--kernel", "sa", "--geometry", "rope", "--init", "clustered", "--init-clusters", "2"},
  };
  return cases;
}

// Every method the resident kernel runs, on every case above, against the CPU backend's
// integrators: the same steps, the sums in another order (fp64 within 1e-12 after 12 steps;
// fp32 within 1e-5), and the tokens move.
void expect_resident_agreement(Precision precision) {
  int checked = 0;
  for (const std::string method : {"euler", "heun", "rk4", "euler-unprojected", "lie-euler", "euler-maruyama"})
    for (const auto& extra : resident_cases()) {
      std::vector<std::string> args = {"--n", "37", "--replicas", "3", "--integrator", method, "--dt", "0.05",
                                       "--horizon", "0.6", "--save-every", "0.3", "--seed",
                                       std::to_string(++checked)};
      if (method == "euler-maruyama") args = testing::with(args, {"--noise-kappa", "20"});
      const RunConfig cfg = config(testing::with(args, extra));
      const Model model = build_model(cfg);
      auto cuda = cuda_backend(Engine::Emulation, model, precision, 2);
      auto cpu = make_backend("cpu", model, BackendOptions{2});
      bool resident = false;
      const auto frames = simulate_on(*cuda, cfg, model, &resident);
      const auto expected = simulate_on(*cpu, cfg, model);
      const std::string label = method + " case " + std::to_string(checked);
      ASSERT_TRUE(resident) << label;
      ASSERT_EQ(frames.size(), expected.size()) << label;
      for (std::size_t k = 0; k < frames.size(); ++k) {
        EXPECT_EQ(frames[k].step, expected[k].step) << label;
        EXPECT_EQ(frames[k].time, expected[k].time) << label;
        EXPECT_LE(testing::max_abs_difference(frames[k].x, expected[k].x),
                  precision == Precision::Float ? 1e-5 : 1e-12)
            << label << " frame " << k;
      }
      EXPECT_GT(testing::max_abs_difference(expected.front().x, expected.back().x), 1e-3) << label;
    }
  EXPECT_EQ(checked, 6 * 7);
}

TEST(CudaEmulation, ResidentStepsAgreeWithTheCpuIntegratorsInFp64) { expect_resident_agreement(Precision::Double); }
TEST(CudaEmulation, ResidentStepsAgreeWithTheCpuIntegratorsInFp32) { expect_resident_agreement(Precision::Float); }

/// `steps` resident steps of size h from the initial state of cfg, in chunks of `chunk`.
std::vector<double> resident_steps(Backend& backend, const RunConfig& cfg, const Model& model, int steps,
                                   int chunk, State* initial = nullptr) {
  State state = initial ? *initial : build_initial_state(cfg, model);
  // The method as the integrator hands it to a backend (the integrator table's entry).
  const std::optional<FixedStepMethod> fixed =
      make_integrator(IntegratorSettings{.name = cfg.integrator, .noise_kappa = cfg.noise_kappa,
                                         .seed = static_cast<std::uint64_t>(cfg.seed)})
          ->fixed_step_method();
  EXPECT_TRUE(fixed.has_value()) << cfg.integrator;
  if (!fixed) return {};
  const FixedStepMethod method = *fixed;
  auto stepper = backend.resident_stepper(method, state.replicas);
  EXPECT_TRUE(stepper != nullptr);
  if (!stepper) return {};
  for (int done = 0; done < steps; done += chunk) {
    const ResidentOutcome outcome = stepper->advance(state.x.data(), done, std::min(chunk, steps - done), cfg.dt);
    EXPECT_FALSE(outcome.failed()) << outcome.numerical_error;
  }
  return state.x;
}

// Null tokens appended to the moving ones change no bit of the others' trajectories and never
// move; the chunking of steps into launches and a rerun change no bit.
TEST(CudaEmulation, ResidentNullTokensAndChunksKeepEveryBit) {
  for (Precision precision : {Precision::Double, Precision::Float})
    for (const std::string method : {"rk4", "euler-maruyama"})
      for (const std::vector<std::string>& extra :
           {std::vector<std::string>{}, {"--prefix", "4", "--prefix-weight", "1.5", "--kernel", "sa"}}) {
        const std::vector<std::string> base = testing::with(
            {"--n", "40", "--d", "3", "--integrator", method, "--dt", "0.1", "--amplitudes", "1", "--tau",
             "0.3", "--seed", "5", "--replicas", "2"},
            testing::with(extra, method == "euler-maruyama" ? std::vector<std::string>{"--noise-kappa", "30"}
                                                            : std::vector<std::string>{}));
        const RunConfig plain_cfg = config(base);
        const RunConfig padded_cfg = config(testing::with(base, {"--null-tokens", "30"}));
        const Model plain = build_model(plain_cfg), padded = build_model(padded_cfg);
        State plain_state = build_initial_state(plain_cfg, plain);
        State padded_state = build_initial_state(padded_cfg, padded);
        for (std::size_t r = 0; r < 2; ++r)
          std::copy_n(plain_state.token(r, 0), 40 * 3, padded_state.x.data() + r * padded.n * 3);
        auto backend = cuda_backend(Engine::Emulation, plain, precision, 2);
        const auto whole = resident_steps(*backend, plain_cfg, plain, 9, 9, &plain_state);
        const auto pieces = resident_steps(*backend, plain_cfg, plain, 9, 2, &plain_state);
        const auto again = resident_steps(*backend, plain_cfg, plain, 9, 9, &plain_state);
        auto padded_backend = cuda_backend(Engine::Emulation, padded, precision, 2);
        const auto with_nulls = resident_steps(*padded_backend, padded_cfg, padded, 9, 4, &padded_state);
        const std::string label = method + (precision == Precision::Float ? " fp32" : " fp64") +
                                  (extra.empty() ? "" : " prefix");
        ASSERT_EQ(whole.size(), plain_state.x.size()) << label;
        EXPECT_TRUE(bitwise_equal(whole.data(), pieces.data(), whole.size())) << "chunks: " << label;
        EXPECT_TRUE(bitwise_equal(whole.data(), again.data(), whole.size())) << "rerun: " << label;
        EXPECT_GT(testing::max_abs_difference(whole, plain_state.x), 1e-3) << label;
        for (std::size_t r = 0; r < 2; ++r) {
          EXPECT_TRUE(bitwise_equal(whole.data() + r * 40 * 3, with_nulls.data() + r * padded.n * 3, 40 * 3))
              << "null tokens: " << label;
          EXPECT_TRUE(bitwise_equal(padded_state.x.data() + (r * padded.n + 40) * 3,
                                    with_nulls.data() + (r * padded.n + 40) * 3, 30 * 3))
              << "a null token moved: " << label;
        }
      }
}

// The exact pass inside the resident kernel: K = -I and one tight cluster leave every fp32
// offset loose at beta = 80 (and both precisions' at beta = 900); a step still agrees with the
// CPU backend's.
TEST(CudaEmulation, ResidentKernelTakesTheExactPassWhereOffsetsAreLoose) {
  const auto dir = testing::scratch_dir("cuda_resident_loose");
  const std::string minus_identity = (dir / "minus_identity.txt").string();
  std::ofstream(minus_identity) << "-1 0 0\n0 -1 0\n0 0 -1\n";
  for (const std::string beta : {"80", "900"})
    for (Precision precision : {Precision::Double, Precision::Float}) {
      const auto cfg = config({"--n", "40", "--d", "3", "--kernel", "sa", "--beta", beta, "--k", minus_identity,
                               "--init", "clustered", "--init-clusters", "1", "--init-spread", "0.05",
                               "--integrator", "euler", "--dt", "0.01"});
      const Model model = build_model(cfg);
      State state = build_initial_state(cfg, model);
      auto backend = cuda_backend(Engine::Emulation, model, precision, 2);
      const auto resident = resident_steps(*backend, cfg, model, 1, 1, &state);
      const auto cpu = make_backend("cpu", model, BackendOptions{2});
      std::vector<double> velocity(state.size());
      cpu->velocity(1, state.x.data(), velocity.data(), nullptr);
      double largest = 0.0, error = 0.0;
      for (std::size_t i = 0; i < 40; ++i) {
        double stepped[3], norm2 = 0.0;
        for (int c = 0; c < 3; ++c) {
          stepped[c] = state.x[i * 3 + c] + 0.01 * velocity[i * 3 + c];
          norm2 += stepped[c] * stepped[c];
        }
        for (int c = 0; c < 3; ++c) {
          error = std::max(error, std::fabs(resident[i * 3 + c] - stepped[c] / std::sqrt(norm2)));
          largest = std::max(largest, std::fabs(velocity[i * 3 + c]));
        }
      }
      EXPECT_GT(largest, 1e-3) << "beta " << beta;
      EXPECT_LE(error, 0.01 * (precision == Precision::Float ? 2e-6 : 1e-12) + 1e-15) << "beta " << beta;
    }
}

// A failure inside a chunk ends the run at its step, with the CPU path's message: a USA weight
// that overflows in natural time, and a state that is not finite.
TEST(CudaEmulation, ResidentFailuresEndTheRunAtTheirStep) {
  // K = 2 I: scores up to 2 beta = 800 > 709.78 while beta itself is accepted.
  const auto dir = testing::scratch_dir("cuda_resident_overflow");
  const std::string twice_identity = (dir / "twice_identity.txt").string();
  std::ofstream(twice_identity) << "2 0 0\n0 2 0\n0 0 2\n";
  const RunConfig cfg = config({"--n", "20", "--d", "3", "--kernel", "usa", "--beta", "400", "--k", twice_identity,
                                "--init", "clustered", "--init-clusters", "1", "--init-spread", "0.01",
                                "--integrator", "rk4", "--dt", "0.01", "--horizon", "1"});
  const Model model = build_model(cfg);
  for (const std::string name : {"cpu", "cuda"}) {
    auto backend = name == "cpu" ? make_backend("cpu", model, BackendOptions{2}) : cuda_backend(Engine::Emulation, model, Precision::Double, 2);
    try {
      simulate_on(*backend, cfg, model);
      FAIL() << name << ": no failure";
    } catch (const NumericalError& error) {
      const std::string what = error.what();
      EXPECT_NE(what.find("USA weights overflow double"), std::string::npos) << name << ": " << what;
      EXPECT_NE(what.find("--time-scale rescaled"), std::string::npos) << name << ": " << what;
      EXPECT_NE(what.find("(at step 1, t = 0.01)"), std::string::npos) << name << ": " << what;
    }
  }
  // A NaN in the state: the first step fails, naming it.
  State state = build_initial_state(cfg, model);
  state.x[4] = std::nan("");
  const Model heun_model = build_model(config({"--n", "20", "--integrator", "heun"}));  // outlives the backend
  auto backend = cuda_backend(Engine::Emulation, heun_model, Precision::Double, 1);
  const auto stepper = backend->resident_stepper({FixedStepKind::Heun}, 1);
  ASSERT_TRUE(stepper != nullptr);
  const ResidentOutcome outcome = stepper->advance(state.x.data(), 0, 5, 0.1);
  EXPECT_EQ(outcome.steps_done, 0);
  EXPECT_TRUE(outcome.non_finite_state);
}

// What the resident kernel leaves to the per-evaluation loop: adaptive and Lie-group rk4 steps,
// d above 8, more than 1024 sources.
TEST(CudaEmulation, ResidentKernelTakesOnlyWhatItRuns) {
  auto stepper_for = [](const std::vector<std::string>& args, const std::string& method) {
    const Model model = build_model(config(args));
    auto backend = cuda_backend(Engine::Emulation, model, Precision::Double, 1);
    // dopri5 and lie-rk4 hand no fixed-step method to a backend at all.
    const std::optional<FixedStepMethod> fixed = make_integrator({.name = method})->fixed_step_method();
    return fixed && backend->resident_stepper(*fixed, 2) != nullptr;
  };
  EXPECT_TRUE(stepper_for({"--n", "1000", "--d", "8", "--prefix", "24"}, "rk4"));
  EXPECT_FALSE(stepper_for({"--n", "1000", "--d", "8", "--prefix", "25"}, "rk4"));
  EXPECT_FALSE(stepper_for({"--n", "10", "--d", "9"}, "rk4"));
  EXPECT_FALSE(stepper_for({"--n", "10"}, "dopri5"));
  EXPECT_FALSE(stepper_for({"--n", "10"}, "lie-rk4"));
}

// The device's resident kernel against its host emulation (fp64 to rounding, fp32 within the
// exponential unit's error) and bitwise against itself in chunks; euler-maruyama's noise on
// the device is the CPU's stream, so its trajectory stays within rounding of the CPU's.
TEST(CudaDevice, ResidentKernelAgreesWithItsEmulation) {
  SKIP_UNLESS_ENGINE(Engine::Device);
  for (Precision precision : {Precision::Double, Precision::Float})
    for (const std::string method : {"rk4", "euler-maruyama", "lie-euler"}) {
      std::vector<std::string> args = {"--n", "300", "--d", "3", "--kernel", "sa", "--beta", "2", "--q",
                                       "gaussian", "--geometry", "rope", "--replicas", "5", "--integrator",
                                       method, "--dt", "0.05"};
      if (method == "euler-maruyama") args = testing::with(args, {"--noise-kappa", "50"});
      const RunConfig cfg = config(args);
      const Model model = build_model(cfg);
      const auto device = cuda_backend(Engine::Device, model, precision, 2);
      const auto emulated = cuda_backend(Engine::Emulation, model, precision, 2);
      const auto a = resident_steps(*device, cfg, model, 20, 20);
      const auto b = resident_steps(*device, cfg, model, 20, 3);
      const auto c = resident_steps(*emulated, cfg, model, 20, 20);
      EXPECT_TRUE(bitwise_equal(a.data(), b.data(), a.size())) << method;
      EXPECT_LE(testing::max_abs_difference(a, c), precision == Precision::Float ? 1e-5 : 1e-12) << method;
    }
}
TEST(CudaDevice, ResidentStepsAgreeWithTheCpuIntegrators) {
  SKIP_UNLESS_ENGINE(Engine::Device);
  for (const std::string method : {"euler", "heun", "rk4", "euler-unprojected", "lie-euler", "euler-maruyama"})
    for (const auto& extra : resident_cases()) {
      std::vector<std::string> args = {"--n", "37", "--replicas", "3", "--integrator", method, "--dt", "0.05",
                                       "--horizon", "0.6", "--save-every", "0.3"};
      if (method == "euler-maruyama") args = testing::with(args, {"--noise-kappa", "20"});
      const RunConfig cfg = config(testing::with(args, extra));
      const Model model = build_model(cfg);
      auto device = cuda_backend(Engine::Device, model, Precision::Double, 2);
      auto cpu = make_backend("cpu", model, BackendOptions{2});
      bool resident = false;
      const auto frames = simulate_on(*device, cfg, model, &resident);
      const auto expected = simulate_on(*cpu, cfg, model);
      ASSERT_TRUE(resident) << method;
      EXPECT_LE(testing::max_abs_difference(frames.back().x, expected.back().x), 1e-12) << method;
    }
}

// What the CUDA pair loop cannot take is refused up front, naming the option.
TEST(CudaEmulation, RefusesWhatTheDeviceLoopCannotTakeNamingTheOption) {
  try {
    cuda_backend(Engine::Emulation, build_model(config({"--n", "4", "--d", "65"})), Precision::Double, 1);
    FAIL() << "d = 65 was taken";
  } catch (const BackendUnavailable& error) {
    EXPECT_NE(std::string(error.what()).find("--d 65"), std::string::npos) << error.what();
  }
  EXPECT_NE(testing::usage_message({"--n", "4", "--precision", "float", "--out", "x.h5"})
                .find("--precision float: needs --backend cuda"),
            std::string::npos);
  EXPECT_NE(testing::usage_message({"--n", "4", "--precision", "half", "--out", "x.h5"})
                .find("accepted: double, float"),
            std::string::npos);
}

// The bench's ceiling from the SM count and clock against the H200 figures of docs/cuda.md
// (132 SMs at 1.98 GHz): fp32 d = 3 about 3.7e12 pairs/s (the exponential unit's 4.2e12 above
// it), fp64 d = 3 about 6.7e11, fp32 d = 64 about 2.5e11, fp64 d = 64 about 1.1e11.
TEST(CudaEmulation, PairRateCeilingFollowsTheDeviceArithmetic) {
  cuda::DeviceProperties h200;
  h200.multiprocessors = 132;
  h200.clock_hz = 1.98e9;
  EXPECT_NEAR(cuda::pair_rate_ceiling(h200, true, 3), 3.72e12, 0.01e12);
  EXPECT_NEAR(cuda::pair_rate_ceiling(h200, false, 3), 6.69e11, 0.01e11);
  EXPECT_NEAR(cuda::pair_rate_ceiling(h200, true, 64), 2.55e11, 0.01e11);
  EXPECT_NEAR(cuda::pair_rate_ceiling(h200, false, 64), 1.14e11, 0.01e11);
  EXPECT_DOUBLE_EQ(cuda::pair_rate_ceiling(h200, true, 1), 132 * 1.98e9 * 16);  // exp-bound
}

}  // namespace
}  // namespace mfattn
