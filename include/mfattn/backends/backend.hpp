#pragma once
/// \file backend.hpp
/// Backends evaluate the attention velocity of docs/model.md section 2 for every replica:
///   v_i = p_i * P_{x_i}(u_i),  u_i as in model.hpp,
/// and the weight sums D_i = sum_j w_ij (true scale, used for the energy
///   E = 1 / (2 beta M^2) * sum_i p_i D_i).
/// Backends are chosen by name at run time (make_backend); each one computes every
/// receiver's sums in a fixed order, so results do not depend on the thread count.
#include "mfattn/backends/backend_errors.hpp"
#include "mfattn/backends/derivatives.hpp"
#include "mfattn/core/capabilities.hpp"
#include "mfattn/core/model.hpp"
#include "mfattn/backends/pair_statistics.hpp"

#include <cstdint>

#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace mfattn {


/// What one evaluation writes. Every pointer but velocity may be null.
struct FieldOutputs {
  double* velocity = nullptr;     ///< replicas * n * d: v_i = p_i P_{x_i}(u_i)
  double* weight_sums = nullptr;  ///< replicas * n: D_i = sum_j w_ij
  /// replicas * n * d: p_i u_i, the attention output before the tangent projection (the
  /// step of euler-unprojected takes it; 0 for a token that sees no weighted source).
  double* attention_output = nullptr;
};

/// The fixed-step integrators a backend's resident stepper may run.
enum class FixedStepKind { Euler, Heun, Rk4, EulerUnprojected, LieEuler, EulerMaruyama };

/// A fixed-step integrator as a backend's resident stepper takes it
/// (Integrator::fixed_step_method): its kind, with euler-maruyama's noise.
struct FixedStepMethod {
  FixedStepKind kind = FixedStepKind::Rk4;
  double noise_kappa = 0.0;  ///< euler-maruyama: dx += sqrt(2 h / kappa) P_x dW
  std::uint64_t seed = 0;    ///< euler-maruyama: the noise streams' seed
};

/// What ResidentStepper::advance did.
struct ResidentOutcome {
  std::int64_t steps_done = 0;  ///< steps every replica completed
  /// A step after steps_done failed: its state (a stage state or the step's result) was not
  /// finite, or (numerical_error not empty) a weight overflowed, as that message says.
  bool non_finite_state = false;
  std::string numerical_error;
  bool failed() const { return non_finite_state || !numerical_error.empty(); }
};

/// A backend's own integrator loop for a fixed-step method: the state stays where the backend
/// computes (a GPU) for many steps, and only the positions come back (the CUDA backend's
/// resident kernel, docs/cuda.md). Each step is the method's step of integrator.hpp. A stepper
/// reads its backend's arrays: it must not outlive the backend that made it.
class ResidentStepper {
 public:
  virtual ~ResidentStepper() = default;
  /// Advances x (replicas x n x d, in place) by `steps` steps of size h; the first is step
  /// number steps_before + 1 (euler-maruyama keys its noise by the steps before each step).
  /// The model's current matrices are read at every call (a new layer's take effect). After a
  /// failure x is not meaningful.
  virtual ResidentOutcome advance(double* x, std::int64_t steps_before, std::int64_t steps, double h) = 0;
};

/// How far the last evaluation's Sinkhorn scalings got (docs/model.md section 2d), per
/// replica, the largest over a layer's heads: the plan's largest column error
/// max_j |sum_i P_ij - c_j| and the sweeps taken. Empty for the other kernels.
struct ScalingReport {
  std::vector<double> column_error, sweeps;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  /// x: replicas * n * d contents; the outputs as FieldOutputs says. Throws NumericalError
  /// when a USA weight overflows in natural time.
  virtual void evaluate(std::size_t replicas, const double* x, const FieldOutputs& out) = 0;
  /// evaluate() for the velocity and (when not null) the weight sums.
  void velocity(std::size_t replicas, const double* x, double* velocity_out, double* weight_sums_out) {
    evaluate(replicas, x, FieldOutputs{velocity_out, weight_sums_out});
  }
  /// What the last evaluation ran, as "key value" pairs that `mfattn bench` appends to its
  /// line: always "loop L" first (the CPU backend: "symmetric", one exp per unordered pair,
  /// or "one-sided"; others their name), then what else the backend wants to report (the
  /// CPU backend: "cpu_kernels avx512").
  virtual std::string describe() const { return "loop " + name(); }
  /// The derivatives of the layer's output a_i = p_i F_i(y) (FieldOutputs::attention_output:
  /// section 2's u_i or section 2b's layer, times p_i, before any projection) at the states y
  /// the layer reads (docs/model.md section 2e; the placements' own derivatives are
  /// field_derivatives.hpp's). output_vjp: given the cotangent of a (replicas * n * d), writes
  /// y's (y_cotangent, replicas * n * d) and adds the numbers' gradient to `gradient` (summed
  /// over replicas for a shared set; zero_numbers' shapes). output_jvp: a's tangent along y's
  /// tangent and the numbers' (tangent null: none). A backend whose entry declares no
  /// derivatives (BackendName::differentiates) throws BackendUnavailable.
  /// The layer output a at the states y (FieldOutputs::attention_output, to rounding), keeping
  /// what the next output_vjp or output_jvp at the same y reads, so that it takes no forward
  /// pass of its own (Dynamics::vjp and jvp call it first; y must stay unchanged until then).
  virtual void derivative_forward(std::size_t replicas, const double* y, double* output) {
    (void)replicas, (void)y, (void)output;
    throw BackendUnavailable("--backend " + name() + ": has no derivatives");
  }
  virtual void output_vjp(std::size_t replicas, const double* y, const double* output_cotangent,
                          double* y_cotangent, FieldNumbers& gradient) {
    (void)replicas, (void)y, (void)output_cotangent, (void)y_cotangent, (void)gradient;
    throw BackendUnavailable("--backend " + name() + ": has no derivatives");
  }
  virtual void output_jvp(std::size_t replicas, const double* y, const double* y_tangent,
                          const FieldNumbers* tangent, double* output_tangent) {
    (void)replicas, (void)y, (void)y_tangent, (void)tangent, (void)output_tangent;
    throw BackendUnavailable("--backend " + name() + ": has no derivatives");
  }
  /// The model's matrices were replaced (a new layer in time): whatever the backend keeps of
  /// the last ones (a derivative tape, which refers to their heads) is dropped.
  virtual void matrices_changed() {}
  /// The last evaluation's Sinkhorn scalings (empty where the backend has none).
  virtual ScalingReport last_scaling() const { return {}; }
  /// The device the backend computes on, as /parameters records it ("" for the host's CPU).
  virtual std::string device_name() const { return ""; }
  /// This backend's resident stepper for the method and replica count, or null where it has
  /// none for them (integrate() then calls Integrator::step, one evaluation per stage).
  virtual std::unique_ptr<ResidentStepper> resident_stepper(const FixedStepMethod& method,
                                                            std::size_t replicas) {
    (void)method;
    (void)replicas;
    return nullptr;
  }
};

/// The loop word of Backend::describe() ("symmetric", "one-sided", "reference", ...).
std::string described_loop(const Backend& backend);

/// The arithmetic of the pair loops (--precision): fp64 throughout, or fp32 pair operands and
/// exponentials with fp64 sums, state and integrator (the CUDA backend only).
enum class Precision { Double, Float };

/// How a backend is asked to run. threads = 0 means the OpenMP default.
/// How a backend's pair sums are taken (--evaluation): its pair loop, the circle's Fourier
/// series or S^2's harmonic series (kernels/circle_series.hpp; the models
/// fourier_evaluation_refusal accepts), or the series where it applies and pays
/// (n >= fourier_from_tokens), else the loop.
enum class PairEvaluation { Direct, Fourier, Automatic };

struct BackendOptions {
  int threads = 0;
  Precision precision = Precision::Double;
  PairEvaluation evaluation = PairEvaluation::Direct;
  double evaluation_tol = 1e-13;  ///< the series' truncation (kernels/circle_series.hpp)
};

/// Why the series cannot evaluate `model` (one line naming --evaluation fourier; "" when it
/// can): d = 2 or 3; the kinds kSeriesEvaluation declares (SA or USA, the post placement, the
/// one head of Q, K, V, no factor, count denominators); the full or a causal mask, no window
/// or per-prompt rule; on S^2 zonal kernels and no gauge; on the circle with a gauge Q and K
/// both conformal or both anti-conformal.
std::string fourier_evaluation_refusal(const Model& model);
/// From this many tokens `--evaluation auto` takes the series for `model` at tolerance tol, by
/// cost: the pair loop's work grows as n^2 whatever beta, the series' as n times its length
/// (P + 1 frequencies on the circle, (L + 1)^2 harmonics on S^2), which grows with beta and
/// the tolerance. So the crossovers measured at beta = 4, Q = K = I and the default tolerance
/// (1024 on the circle, 8192 on S^2: docs/performance.md) are scaled by the series' length
/// for the model against its length there (never below them). The model must be one the
/// series takes.
std::size_t fourier_from_tokens(const Model& model, double tol);
/// The series as a backend, for a model fourier_evaluation_refusal accepts (make_backend
/// checks).
std::unique_ptr<Backend> make_fourier_backend(const Model& model, const BackendOptions& options);

/// One backend of the registry: its name (the value of --backend), a line for --help, and
/// what the options' rules must know of it: what it takes of a model (capabilities.hpp; the
/// options' validation and make_backend refuse the rest, with generated messages).
struct BackendName {
  const char* name;
  const char* summary;
  bool takes_float = false;      ///< --precision float is accepted
  bool uses_cpu_kernels = false; ///< runs the CPU kernel sets (the file records which one)
  Capabilities takes{};
  bool evaluates_densities = false;  ///< the mean-field solver's quadrature may run on it
  /// It has derivatives (Backend::output_vjp, output_jvp), of the models `differentiates`
  /// takes (docs/model.md section 2e).
  bool has_derivatives = false;
  Capabilities differentiates{};
  /// --evaluation fourier (or auto) may replace its pair loop by the series (the circle's or
  /// S^2's), which runs on the host.
  bool takes_series = false;
  /// The entry is a way of taking the pair sums (--evaluation), not a --backend: its messages
  /// name --evaluation (kSeriesEvaluation).
  bool is_evaluation = false;
};



/// What the CUDA backend's loops and resident kernel take: SA and USA, the post placement,
/// the one head of Q, K, V (docs/cuda.md); the resident kernel scales every receiver by its
/// presence.
inline constexpr Normalization kCudaKernels[] = {Normalization::Usa, Normalization::Sa};
inline constexpr Placement kCudaPlacements[] = {Placement::Post};

/// Every backend, in the order --help lists them: the one place their names live (the option
/// parser reads them from here without linking any backend). Its factory is at the same index
/// of backend_common.cpp's table (a static_assert there keeps the two the same length). A
/// backend that this build lacks (cuda without the toolkit) is still listed; its factory
/// throws BackendUnavailable saying why.
inline constexpr BackendName kBackendNames[] = {
    {"cpu",
     "tiled, vectorised pair loops on OpenMP threads",
     false,
     true,
     {},
     true,
     true,
     {.receivers_at_unit_speed = false, .receiver_scales = false},
     true},
    {"reference",
     "plain loops in the order of the formulas (the test oracle)",
     false,
     false,
     {},
     false,
     true,
     {.receivers_at_unit_speed = false, .receiver_scales = false}},
    {"cuda",
     "NVIDIA GPUs (builds with the CUDA toolkit only)",
     true,
     false,
     {.kernels = kCudaKernels,
      .placements = kCudaPlacements,
      .whole_layers = false,
      .receivers_at_unit_speed = false,
      .receiver_scales = false}},
};

/// The entry of --evaluation fourier's series (backends/fourier/circle_fourier.cpp). It is no
/// --backend: it replaces the pair loop of the entries that say takes_series, and find_evaluator
/// gives it for the backends it makes (name() "fourier"). It declares what it takes of a
/// model's kinds (fourier_evaluation_refusal adds the geometry the series needs: d = 2, or
/// d = 3 with zonal kernels; the full or a causal mask; with a gauge, conformal Q and K) and
/// that it has no derivatives (a gradient takes --evaluation direct).
inline constexpr Normalization kSeriesKernels[] = {Normalization::Usa, Normalization::Sa};
inline constexpr Placement kSeriesPlacements[] = {Placement::Post};
inline constexpr AuxFactor kSeriesFactors[] = {AuxFactor::None};
inline constexpr BackendName kSeriesEvaluation = {
    .name = "fourier",
    .summary = "the circle's Fourier series, S^2's harmonic series (zonal kernels), on the host",
    .takes = {.kernels = kSeriesKernels,
              .placements = kSeriesPlacements,
              .factors = kSeriesFactors,
              .whole_layers = false,
              .receivers_at_unit_speed = false,
              .receiver_scales = false},
    .is_evaluation = true};

/// The refusal of the derivatives of `kinds` by the backend `entry`: "" where it takes them,
/// else one line naming the option and value ("--backend cuda: has no derivatives (they run
/// on --backend cpu, reference)", "differentiating on --backend cpu takes no receivers at unit
/// speed ...").
inline std::string derivative_refusal(const BackendName& entry, const ModelKinds& kinds);

/// The registry's entry of that name, or nullptr.
inline const BackendName* find_backend(std::string_view name) {
  for (const BackendName& entry : kBackendNames)
    if (entry.name == name) return &entry;
  return nullptr;
}

/// The entry of the backend whose Backend::name() is `name`: a --backend's, or the series'
/// (kSeriesEvaluation); nullptr for none.
inline const BackendName* find_evaluator(std::string_view name) {
  if (name == kSeriesEvaluation.name) return &kSeriesEvaluation;
  return find_backend(name);
}

inline std::string derivative_refusal(const BackendName& entry, const ModelKinds& kinds) {
  if (!entry.has_derivatives) {
    std::string with;
    for (const BackendName& other : kBackendNames)
      if (other.has_derivatives) with += (with.empty() ? "" : ", ") + std::string(other.name);
    if (entry.is_evaluation)
      return "--evaluation " + std::string(entry.name) +
             ": has no derivatives (they take --evaluation direct, on --backend " + with + ")";
    return "--backend " + std::string(entry.name) + ": has no derivatives (they run on --backend " + with + ")";
  }
  return capability_refusal("differentiating on --backend " + std::string(entry.name), entry.differentiates, kinds);
}

/// The registry's names joined by separator, leaving out `except` (for messages and help).
inline std::string backend_names_text(const std::string& separator, const std::string& except = "") {
  std::string text;
  for (const BackendName& entry : kBackendNames)
    if (entry.name != except) text += (text.empty() ? "" : separator) + std::string(entry.name);
  return text;
}

/// The registry's names, in its order.
inline std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const BackendName& entry : kBackendNames) names.emplace_back(entry.name);
  return names;
}

/// The backend of that name from the registry (BackendUnavailable for an unknown name).
std::unique_ptr<Backend> make_backend(const std::string& name, const Model& model,
                                      const BackendOptions& options);

/// Backend factories (one per backend folder), as the registry calls them.
std::unique_ptr<Backend> make_cpu_backend(const Model& model, const BackendOptions& options);
std::unique_ptr<Backend> make_reference_backend(const Model& model, const BackendOptions& options);
std::unique_ptr<Backend> make_cuda_backend(const Model& model, const BackendOptions& options);

/// The instruction set of the CPU kernels this process uses: "avx512" (x86-64-v4), "avx2"
/// (x86-64-v3), "sse2", "neon", ... A portable build carries several and takes the best the
/// CPU runs, or the one named by the environment variable MFATTN_CPU_KERNELS. Throws
/// BackendUnavailable when that variable names a set the build lacks or the CPU cannot run.
std::string cpu_kernels_name();
/// cpu_kernels_name() with its register width, the sets compiled in and how it was chosen.
std::string cpu_kernels_description();
/// The sets this build carries that this CPU runs, best first, separated by spaces.
std::string cpu_kernels_runnable();
/// Exponentials per second of the CPU pair loops' own exp (the chosen set's), `threads`
/// threads each on an L1-resident array, for at least min_seconds: `mfattn bench --roofline`.
double cpu_exp_rate(int threads, double min_seconds);

/// The observables' pair pass (d <= 8 only) in the CPU kernel set this process uses: min
/// <x_i, x_j> over the pairs of `tokens` (rows of x), and with with_stats the pairs above
/// close_above and the components of the graph of the pairs above edge_above.
PairStatistics cpu_pair_statistics(const double* x, std::size_t d, const std::vector<std::size_t>& tokens,
                                   double close_above, double edge_above, bool with_stats);

/// The energy E = 1 / (2 beta M^2) sum_{i,j} p_i p_j m_ij c_ij exp(s_ij) of one replica, from
/// the weight sums D_i of its n moving tokens (x: their contents) plus the rows of the prefix
/// tokens, taken pair by pair (NaN for beta = 0, where E is undefined).
/// replica: whose matrices (Model::matrices_of) the prefix rows take.
double energy_from_weight_sums(const Model& model, const double* x, const double* weight_sums,
                               std::size_t replica = 0);

/// The attention statistics of one head over one replica's receivers (docs/model.md section 6,
/// "Attention statistics"): for every moving receiver i (p_i > 0) that sees a source, the
/// plan P_ij = w_ij / sum_j w_ij over the sources (moving and prefix tokens; SA's weights, USA's
/// divided by their sum), its entropy -sum_j P_ij log P_ij, largest weight max_j P_ij and
/// participation 1 / sum_j P_ij^2; each as its mean, min and max over those receivers (NaN
/// where none sees a source). Taken pair by pair from log-weights, so no weight overflows.
struct PlanSummary {
  double entropy[3], largest_weight[3], participation[3];  ///< mean, min, max
};
/// One summary a head of replica `replica`'s layer, at the states `read` the layer reads (the
/// directions N(x) for pre and peri). The model's factor must not change sign (validate()
/// refuses --observables attention with one).
std::vector<PlanSummary> attention_plan_summaries(const Model& model, const double* read,
                                                  std::size_t replica = 0);

/// The normalised plan itself of head `head` of replica `replica`'s layer at the states `read`
/// the layer reads (mfattn.Model.attention): plan[i * (n + P) + j] = P_ij, the plan whose
/// statistics attention_plan_summaries takes, over the sources in the model's order (moving
/// tokens, then prefix tokens); rows of zeros for null receivers and receivers that see no
/// source, zeros where a pair is hidden. n (n + P) numbers.
void attention_plan(const Model& model, const double* read, std::size_t replica, std::size_t head,
                    double* plan);

}  // namespace mfattn
