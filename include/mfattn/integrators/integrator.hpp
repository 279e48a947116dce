#pragma once
/// \file integrator.hpp
/// Time stepping on (S^{d-1})^n (docs/model.md section 5). Every step ends on the sphere:
/// |x_i| = 1 to rounding. Tokens with p_i = 0 never move, bit for bit.
///   euler            x <- normalize(x + h f(x))                                  order 1
///   euler-unprojected x <- normalize(x + h p u(x)), u the attention output before the
///                    tangent projection: the step of the field's reference code. It is
///                    projected euler with the per-token step h / (1 + h <x, p u>), so
///                    its clock depends on <x, u> (slower where tokens agree)          1
///   heun, rk4        explicit Runge-Kutta on the embedded field, normalised       2, 4
///   lie-euler        x <- cos(h|w|) x + sin(h|w|) w/|w|, w = f(x)                 1
///   lie-rk4          commutator-free Lie group method CF4 (Celledoni, Marthinsen,
///                    Owren 2003) with F(y) = f(y) y^T - y f(y)^T in so(d)          4
///   dopri5           Dormand-Prince 5(4), max-norm error control, projected       5
///   euler-maruyama   x <- normalize(x + h f(x) + sqrt(2h/kappa) P_x xi), xi ~ N(0, I)
///   stochastic-heun  Stratonovich Heun with the noise g of the step (independent and common):
///                    y = normalize(x + h f(x) + g(x)),
///                    x <- normalize(x + h (f(x) + f(y)) / 2 + (g(x) + g(y)) / 2)   weak 1
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mfattn/backends/backend.hpp"
#include "mfattn/core/state.hpp"
#include "mfattn/integrators/dynamics.hpp"

namespace mfattn {

struct StepOutcome {
  bool accepted = true;
  double h_next = 0.0;  ///< the step to try next (adaptive methods), else the same h
};

class Integrator {
 public:
  virtual ~Integrator() = default;
  virtual std::string name() const = 0;
  /// Order of the method (of the solution for dopri5).
  virtual int order() const = 0;
  virtual bool adaptive() const { return false; }
  /// The method as a backend's resident stepper takes it; none for the methods it cannot run
  /// (dopri5, lie-rk4), which step here.
  virtual std::optional<FixedStepMethod> fixed_step_method() const { return std::nullopt; }
  /// One step of size h from state.x at state.time; on acceptance advances state.x,
  /// state.time (by h) and state.step.
  virtual StepOutcome step(Dynamics& dynamics, State& state, double h) = 0;
  /// The discrete adjoint of one accepted step of size h from x, as step() takes it (`step`:
  /// the steps taken before it, State::step, which euler-maruyama's noise is drawn for)
  /// (docs/model.md section 5b): from the new state's cotangent next_bar, writes x's (x_bar,
  /// size() numbers) and adds the numbers' gradient to `gradient` (zero_numbers' shapes). It
  /// takes the step's stages again (S evaluations and S VJPs of the field). Only the methods
  /// whose table entry says IntegratorEntry::differentiates have one.
  virtual void step_vjp(Dynamics& dynamics, const double* x, double h, std::int64_t step,
                        const double* next_bar, double* x_bar, FieldNumbers& gradient);
};

/// The law of the increments shared by a replica's tokens (--common-noise-kind; docs/model.md,
/// "Common noise"): a GOE Brownian matrix, or a skew one (a shared Brownian rotation).
enum class CommonNoiseKind { Symmetric, Rotation };

struct IntegratorSettings {
  std::string name = "rk4";
  double rtol = 1e-8, atol = 1e-10;  ///< dopri5
  double noise_kappa = 0.0;          ///< the stochastic methods: each token's own noise
  std::uint64_t seed = 0;            ///< the stochastic methods' noise
  double common_noise = 0.0;         ///< sigma of the shared noise (stochastic-heun)
  CommonNoiseKind common_noise_kind = CommonNoiseKind::Symmetric;
};

/// One integrator of the table (src/integrators/integrators.cpp, kIntegrators): its name (the
/// value of --integrator), whether it takes noise (--noise-kappa > 0, and it needs it), and
/// its factory. What a resident stepper can run each integrator says itself
/// (Integrator::fixed_step_method).
struct IntegratorEntry {
  const char* name;
  bool stochastic;
  /// Whether it steps states in R^d (--normalization pre, peri, none): the Runge-Kutta
  /// methods, which then leave out their projection; the others move on the sphere only.
  bool takes_euclidean;
  std::unique_ptr<Integrator> (*make)(const IntegratorSettings&);
  /// Whether it steps the unprojected attention output, x <- N(x + h p u) (the reference code's
  /// step): the placements that normalize the output (ngpt) are not its field.
  bool steps_unprojected_output = false;
  /// Whether its steps have a discrete adjoint (Integrator::step_vjp): gradients through runs.
  bool differentiates = false;
  /// Whether it takes the noise in the Stratonovich sense, and so the common noise
  /// (--common-noise), whose Ito form would need a correction drift.
  bool stratonovich = false;
};

/// The noise the stochastic methods draw, as a run of that seed takes it (so that a test or
/// script can replay it): xi ~ N(0, I_d) of token `token` of replica `replica` at step count
/// `step` (d numbers), and the shared increment sigma sqrt(h) dB of the replica over that
/// step (d x d, row-major; kernels::common_increment in src/kernels/fixed_steps.hpp).
void token_noise_draws(std::uint64_t seed, std::uint64_t replica, std::uint64_t token,
                       std::uint64_t step, std::size_t d, double* xi);
void common_noise_increment(CommonNoiseKind kind, double scale, std::uint64_t seed,
                            std::uint64_t replica, std::uint64_t step, std::size_t d,
                            double* increment);

/// The table's entry of that name, or nullptr.
const IntegratorEntry* find_integrator(std::string_view name);

/// Throws std::invalid_argument for an unknown name.
std::unique_ptr<Integrator> make_integrator(const IntegratorSettings& settings);

/// Names accepted by make_integrator, in the table's order.
const std::vector<std::string>& integrator_names();

struct IntegrationStats {
  std::int64_t steps = 0, rejected = 0;
};

/// Called after every step attempt (accepted or rejected) with the state and the counts so
/// far. It may throw to end the integration between two steps (a run's signal handling does),
/// leaving state at the last accepted step.
using StepHook = std::function<void(const State&, const IntegrationStats&)>;

/// Advances state to every time in output_times (increasing, >= state.time), landing on each
/// exactly, and calls observer(state) there. h is the step (fixed methods) or the current
/// proposal (adaptive methods; updated so a continued run steps exactly as an uninterrupted one).
/// A non-finite state throws NumericalError naming the step and time. after_step, when given,
/// runs after every step attempt (progress, interruption); it never changes the trajectory.
/// Where the backend has a resident stepper for the integrator (Dynamics::resident_stepper),
/// the steps between two output times run there in chunks (the same steps, the same times),
/// and after_step runs after each chunk: at least every kResidentChunkSeconds of wall time.
inline constexpr double kResidentChunkSeconds = 0.25;
/// Called after every accepted step with the step size taken and the state it reached (its
/// time the output time where the step landed on one).
using AcceptedStepHook = std::function<void(double h, const State& after)>;
/// on_accepted, when given, runs after every accepted step (and the steps then never run on a
/// resident stepper, which takes them in chunks): a gradient's forward pass records its steps.
IntegrationStats integrate(Integrator& integrator, Dynamics& dynamics, State& state, double& h,
                           double fixed_dt, const std::vector<double>& output_times,
                           const std::function<void(const State&)>& observer,
                           const StepHook& after_step = {},
                           const AcceptedStepHook& on_accepted = {});

/// The step integrate() takes from `time` toward the output time `target` with the fixed step
/// dt: dt, or on the last step of the interval the remainder (dt itself where the remainder is
/// dt within 1e-9 relative); `lands` says the step ends on target (the time is then set to it).
struct FixedStep {
  double h;
  bool lands;
};
FixedStep fixed_step_toward(double time, double target, double dt);

/// y <- N(y) = y / |y| (0 stays 0) for `tokens` rows of d numbers: the directions of states in
/// R^d, which a pre or peri layer reads and the observables are taken on (docs/model.md 2c).
void take_directions(std::size_t tokens, std::size_t d, double* y);

/// Projects every moving token back to the unit sphere (x / |x|); states in R^d
/// (Model::on_sphere false) are left as they are.
void normalize_tokens(const Dynamics& dynamics, double* x);

}  // namespace mfattn
