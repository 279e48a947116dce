// Integrators of integrator.hpp. A Runge-Kutta method is its tableau; one generic stepper
// runs every explicit tableau (euler, heun, rk4, dopri5); Lie-group methods act by
// rotations, and the noisy variant adds projected Gaussian increments.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <unsupported/Eigen/MatrixFunctions>

#include "kernels/fixed_steps.hpp"
#include "kernels/token_formulas.hpp"
#include "mfattn/integrators/integrator.hpp"

namespace mfattn {

namespace {

double dot(const double* a, const double* b, std::size_t d) { return kernels::dot_product(a, b, int(d)); }

/// Applies fn(replica, token, offset) to every moving token.
template <class Fn>
void for_each_moving_token(const Dynamics& dynamics, Fn&& fn) {
  const std::size_t n = dynamics.model().n, d = dynamics.model().d;
  for (std::size_t r = 0; r < dynamics.replicas(); ++r)
    for (std::size_t i = 0; i < n; ++i)
      if (dynamics.moves(i)) fn(r, i, (r * n + i) * d);
}

/// A weight that is a fraction, applied as numerator * k / denominator: a weight such as
/// -1/40 is no double, and dividing rounds once where multiplying by a rounded -1/40 would
/// round twice.
struct ExactWeight {
  double numerator = 0.0, denominator = 1.0;
  double times(double k) const { return numerator * k / denominator; }
};

/// An explicit Runge-Kutta method as data: the stages (a, b) and, for an embedded pair, the
/// error estimate and its order. The stepper (RungeKutta) runs any tableau; how the error
/// sets the next step is StepSizeController's business, not the method's.
struct Tableau {
  std::string name;
  int order;                           ///< of the solution b
  std::vector<std::vector<double>> a;  ///< strictly lower triangular rows
  std::vector<double> b;
  /// Embedded pair (empty error: none, a fixed step): the error weights b - b_hat of the
  /// stages, the weight of f at the new state (the first-same-as-last stage, which the next
  /// step reuses from the Dynamics cache), and the order of the embedded solution b_hat, so
  /// the local error estimate is O(h^(embedded_order + 1)).
  std::vector<double> error{};
  ExactWeight last_stage_error{};
  int embedded_order = 0;
  /// The method as a resident stepper takes it (fixed-step tableaux only).
  std::optional<FixedStepKind> fixed_step{};
};

// Fixed-step methods: no error estimate; their stages are the kernels layer's (shared with
// the CUDA backend's resident kernel).
Tableau fixed_tableau(const char* name, int order, const kernels::FixedTableau& fixed, FixedStepKind kind) {
  Tableau t{.name = name, .order = order, .a = {}, .b = {}};
  t.fixed_step = kind;
  for (int s = 0; s < fixed.stages; ++s) {
    t.a.emplace_back(fixed.a[s], fixed.a[s] + s);
    t.b.push_back(fixed.b[s]);
  }
  return t;
}
Tableau euler_tableau() { return fixed_tableau("euler", 1, kernels::kEulerTableau, FixedStepKind::Euler); }
Tableau heun_tableau() { return fixed_tableau("heun", 2, kernels::kHeunTableau, FixedStepKind::Heun); }
Tableau rk4_tableau() { return fixed_tableau("rk4", 4, kernels::kRk4Tableau, FixedStepKind::Rk4); }
Tableau dopri5_tableau() {
  Tableau t;
  t.name = "dopri5";
  t.order = 5;
  t.a = {{},
         {1.0 / 5},
         {3.0 / 40, 9.0 / 40},
         {44.0 / 45, -56.0 / 15, 32.0 / 9},
         {19372.0 / 6561, -25360.0 / 2187, 64448.0 / 6561, -212.0 / 729},
         {9017.0 / 3168, -355.0 / 33, 46732.0 / 5247, 49.0 / 176, -5103.0 / 18656}};
  t.b = {35.0 / 384, 0.0, 500.0 / 1113, 125.0 / 192, -2187.0 / 6784, 11.0 / 84};
  // b - b_hat for the six stages; the seventh (FSAL) stage enters with -1/40.
  t.error = {71.0 / 57600, 0.0, -71.0 / 16695, 71.0 / 1920, -17253.0 / 339200, 22.0 / 525};
  t.last_stage_error = {-1.0, 40.0};
  t.embedded_order = 4;
  return t;
}

/// The step-size rule of an embedded pair, apart from the method: an error norm err (<= 1 is
/// accepted) gives h_next = h clamp(safety err^exponent, min_factor, max_factor), with
/// exponent = -1 / (q + 1) for an estimate of order q; at most max_factor_after_rejection
/// h after a rejection, and max_factor for err = 0.
struct StepSizeController {
  double rtol = 1e-8, atol = 1e-10;  ///< err = max_e |h diff_e| / (atol + rtol max(|x_e|, |x_new_e|))
  double safety = 0.9;
  double min_factor = 0.2, max_factor = 5.0;
  double max_factor_after_rejection = 0.9;
  /// A non-finite error norm (a stage overflowed) counts as this: far beyond 1, a rejection.
  double error_if_not_finite = 1e10;

  /// The exponent for an estimate of order q (dopri5: q = 4, -1/5, the same double as -0.2).
  static double exponent(int estimate_order) { return -1.0 / double(estimate_order + 1); }
  static_assert(-1.0 / 5.0 == -0.2, "the quotient rounds to the literal's double");
  double scale(double x, double x_new) const { return atol + rtol * std::max(std::fabs(x), std::fabs(x_new)); }
  /// h_next / h for an accepted step of that error norm.
  double factor(double error, double exponent) const {
    return error == 0.0 ? max_factor : std::clamp(safety * std::pow(error, exponent), min_factor, max_factor);
  }
};

/// Explicit Runge-Kutta on the embedded field, then projection to the sphere.
class RungeKutta final : public Integrator {
 public:
  RungeKutta(Tableau tableau, StepSizeController controller = {})
      : tableau_(std::move(tableau)),
        controller_(controller),
        exponent_(StepSizeController::exponent(tableau_.embedded_order)) {}
  std::string name() const override { return tableau_.name; }
  int order() const override { return tableau_.order; }
  bool adaptive() const override { return !tableau_.error.empty(); }
  std::optional<FixedStepMethod> fixed_step_method() const override {
    if (adaptive() || !tableau_.fixed_step) return std::nullopt;
    return FixedStepMethod{*tableau_.fixed_step};
  }

  StepOutcome step(Dynamics& dynamics, State& state, double h) override {
    const std::size_t size = state.size(), stages = tableau_.b.size();
    // dopri5's first-same-as-last stage comes from the Dynamics cache of the last evaluation.
    stage_k_.resize(stages + 1);  // and dopri5's error stage
    form_stages(dynamics, state.x.data(), h, size, Stages::Dropped);
    new_x_.resize(size);
    combine_stages(state.x.data(), h, size, new_x_.data());
    normalize_tokens(dynamics, new_x_.data());
    StepOutcome outcome;
    outcome.h_next = h;
    if (adaptive()) {
      auto& k_last = stage_k_[stages];
      dynamics.velocity(new_x_.data(), k_last.data());
      // Max norm: tokens that do not move contribute exact zeros and never change the step.
      double error = 0.0;
      for (std::size_t e = 0; e < size; ++e) {
        double diff = tableau_.last_stage_error.times(k_last[e]);
        for (std::size_t m = 0; m < stages; ++m) diff += tableau_.error[m] * stage_k_[m][e];
        error = std::max(error, std::fabs(h * diff) / controller_.scale(state.x[e], new_x_[e]));
      }
      if (!std::isfinite(error)) error = controller_.error_if_not_finite;
      const double factor = controller_.factor(error, exponent_);
      outcome.h_next = h * factor;
      if (error > 1.0) {
        outcome.accepted = false;
        outcome.h_next = h * std::min(factor, controller_.max_factor_after_rejection);
        return outcome;
      }
    }
    state.x.swap(new_x_);
    state.time += h;
    ++state.step;
    return outcome;
  }

  /// With z_s = x + h sum_{m<s} a_sm k_m, k_s = f(z_s), y = x + h sum_s b_s k_s and
  /// x' = N(y) on the sphere (y in R^d): y_bar = N'(y)^T x'_bar (N' is symmetric), then
  /// k_bar_s = h b_s y_bar + h sum_{t>s} a_ts z_bar_t with z_bar_s = f'(z_s)^T k_bar_s taken
  /// from the last stage back, and x_bar = y_bar + sum_s z_bar_s.
  /// The stages' velocities are taken by the derivatives' forward pass and their tapes kept
  /// (Dynamics::stage_velocity), so that each stage's VJP takes no forward pass of its own,
  /// where the tapes fit kStageTapeNumbers (else each VJP takes its own).
  void step_vjp(Dynamics& dynamics, const double* x, double h, std::int64_t /*step*/,
                const double* next_bar, double* x_bar, FieldNumbers& gradient) override {
    const std::size_t size = dynamics.size(), stages = tableau_.b.size(), d = dynamics.model().d;
    const bool tapes = stages <= Dynamics::kStageSlots && size * stages <= kStageTapeNumbers;
    form_stages(dynamics, x, h, size, tapes ? Stages::KeptWithTapes : Stages::Kept);
    std::vector<double>& y_bar = new_x_;
    y_bar.assign(next_bar, next_bar + size);
    if (dynamics.model().on_sphere()) {
      stage_x_.resize(size);
      combine_stages(x, h, size, stage_x_.data());
      const std::size_t n = dynamics.model().n;
      for (std::size_t t = 0; t < dynamics.replicas() * n; ++t)
        if (dynamics.moves(t % n))
          kernels::direction_derivative(stage_x_.data() + t * d, int(d), y_bar.data() + t * d);
    }
    std::copy(y_bar.begin(), y_bar.end(), x_bar);
    stage_bar_.resize(stages);
    for (std::size_t s = 0; s < stages; ++s) {
      stage_bar_[s].resize(size);
      for (std::size_t e = 0; e < size; ++e) stage_bar_[s][e] = h * tableau_.b[s] * y_bar[e];
    }
    std::vector<double> z_bar(size);
    for (std::size_t s = stages; s-- > 0;) {
      if (tapes)
        dynamics.stage_vjp(s, stage_states_[s].data(), stage_bar_[s].data(), z_bar.data(),
                           gradient);
      else dynamics.vjp(stage_states_[s].data(), stage_bar_[s].data(), z_bar.data(), gradient);
      for (std::size_t e = 0; e < size; ++e) x_bar[e] += z_bar[e];
      const auto& row = tableau_.a[s];
      for (std::size_t m = 0; m < row.size(); ++m)
        for (std::size_t e = 0; e < size; ++e) stage_bar_[m][e] += h * row[m] * z_bar[e];
    }
  }

 private:
  /// The stage states z_s a step keeps: none (a step), in stage_states_ (an adjoint), or
  /// there with their velocities taken by the derivatives' forward pass, tapes kept (an
  /// adjoint whose stages' VJPs take no forward pass of their own).
  enum class Stages { Dropped, Kept, KeptWithTapes };
  /// The stage states' numbers (R n d x stages) up to which an adjoint keeps every stage's
  /// tape: a tape is O(n) numbers a head, 40 (d = 3) to 90 (d = 64, H = 8) times the state's
  /// numbers, so at most about 190 MB of tapes.
  static constexpr std::size_t kStageTapeNumbers = std::size_t{1} << 18;
  /// k_s = f(z_s) with z_0 = x and z_s = x + h sum_{m<s} a_sm k_m for every stage of the
  /// tableau (not dopri5's error stage), into stage_k_ (z_s as `keep` says).
  void form_stages(Dynamics& dynamics, const double* x, double h, std::size_t size, Stages keep) {
    const bool keep_states = keep != Stages::Dropped;
    const std::size_t stages = tableau_.b.size();
    stage_k_.resize(std::max(stage_k_.size(), stages));
    for (auto& k : stage_k_) k.resize(size);
    stage_x_.resize(size);
    if (keep_states) {
      stage_states_.resize(stages);
      for (auto& z : stage_states_) z.resize(size);
    }
    for (std::size_t s = 0; s < stages; ++s) {
      double* z = keep_states ? stage_states_[s].data() : stage_x_.data();
      if (s == 0) {
        if (keep_states) std::copy(x, x + size, z);
      } else {
        const auto& row = tableau_.a[s];
        for (std::size_t e = 0; e < size; ++e) {
          double incr = 0.0;
          for (std::size_t m = 0; m < row.size(); ++m) incr += row[m] * stage_k_[m][e];
          z[e] = x[e] + h * incr;
        }
      }
      const double* at = s == 0 ? x : z;
      if (keep == Stages::KeptWithTapes) dynamics.stage_velocity(s, at, stage_k_[s].data());
      else dynamics.velocity(at, stage_k_[s].data());
    }
  }
  /// y = x + h sum_s b_s k_s over the stages that form_stages made.
  void combine_stages(const double* x, double h, std::size_t size, double* y) const {
    for (std::size_t e = 0; e < size; ++e) {
      double incr = 0.0;
      for (std::size_t m = 0; m < tableau_.b.size(); ++m) incr += tableau_.b[m] * stage_k_[m][e];
      y[e] = x[e] + h * incr;
    }
  }

  Tableau tableau_;
  StepSizeController controller_;
  double exponent_;  ///< the controller's exponent for this tableau's estimate, computed once
  std::vector<std::vector<double>> stage_k_;
  std::vector<double> stage_x_, new_x_;
  std::vector<std::vector<double>> stage_states_, stage_bar_;  ///< step_vjp's z_s and k_bar_s
};

/// y <- exp(sum_k c_k (w_k y_k^T - y_k w_k^T)) y for up to four (y_k, w_k) pairs with w_k
/// tangent at y_k. The generator vanishes outside span{y_k, w_k}, so the exponential is
/// taken in an orthonormal basis of that span (at most 8 x 8) and the rest of y is kept.
struct LieTerm {
  double coefficient;
  const double* base;
  const double* tangent;
};

void apply_exponential(const std::vector<LieTerm>& terms, const double* y, double* out,
                       std::size_t d) {
  constexpr int kMax = 8;
  std::array<std::vector<double>, kMax> basis;
  int rank = 0;
  auto add_to_basis = [&](const double* v) {
    if (rank == kMax) return;
    std::vector<double> u(v, v + d);
    const double original = std::sqrt(dot(u.data(), u.data(), d));
    if (original == 0.0) return;
    for (int pass = 0; pass < 2; ++pass)
      for (int b = 0; b < rank; ++b) {
        const double proj = dot(basis[b].data(), u.data(), d);
        for (std::size_t c = 0; c < d; ++c) u[c] -= proj * basis[b][c];
      }
    const double norm = std::sqrt(dot(u.data(), u.data(), d));
    if (norm <= 1e-13 * original) return;
    for (double& value : u) value /= norm;
    basis[rank++] = std::move(u);
  };
  bool any = false;
  for (const auto& term : terms)
    if (term.coefficient != 0.0 && dot(term.tangent, term.tangent, d) > 0.0) {
      add_to_basis(term.base);
      add_to_basis(term.tangent);
      any = true;
    }
  if (!any) {
    std::copy(y, y + d, out);
    return;
  }
  using Small = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, 0, kMax, kMax>;
  Small generator = Small::Zero(rank, rank);
  for (const auto& term : terms) {
    if (term.coefficient == 0.0) continue;
    Eigen::Matrix<double, Eigen::Dynamic, 1, 0, kMax, 1> py(rank), pw(rank);
    for (int a = 0; a < rank; ++a) {
      py[a] = dot(basis[a].data(), term.base, d);
      pw[a] = dot(basis[a].data(), term.tangent, d);
    }
    generator += term.coefficient * (pw * py.transpose() - py * pw.transpose());
  }
  const Small rotation = generator.exp();
  Eigen::Matrix<double, Eigen::Dynamic, 1, 0, kMax, 1> coords(rank);
  for (int a = 0; a < rank; ++a) coords[a] = dot(basis[a].data(), y, d);
  const auto rotated = (rotation * coords).eval();
  std::copy(y, y + d, out);
  for (int a = 0; a < rank; ++a)
    for (std::size_t c = 0; c < d; ++c) out[c] += (rotated[a] - coords[a]) * basis[a][c];
}

/// The step of the field's reference code: x <- normalize(x + h p u), u the attention output
/// before the tangent projection. Its radial part <x, p u> x only rescales x + h P_x(p u)
/// before the normalisation, so this is projected euler with the step h / (1 + h <x, p u>)
/// per token: first order, with a clock that runs slow where <x, u> > 0 (near collapse).
class EulerUnprojected final : public Integrator {
 public:
  std::string name() const override { return "euler-unprojected"; }
  int order() const override { return 1; }
  std::optional<FixedStepMethod> fixed_step_method() const override {
    return FixedStepMethod{FixedStepKind::EulerUnprojected};
  }
  StepOutcome step(Dynamics& dynamics, State& state, double h) override {
    // The evaluation's own outputs (no copy): normalize_tokens evaluates nothing.
    const double* output = dynamics.attention_output(state.x.data());
    // Only moving tokens are touched, so a token with p_i = 0 keeps its bits (even a -0.0).
    const std::size_t d = state.d;
    for_each_moving_token(dynamics, [&](std::size_t, std::size_t, std::size_t offset) {
      for (std::size_t c = 0; c < d; ++c) state.x[offset + c] += h * output[offset + c];
    });
    normalize_tokens(dynamics, state.x.data());
    state.time += h;
    ++state.step;
    return {true, h};
  }
  /// y = x + h a(x) for the moving tokens (x itself for the others), x' = N(y) on the sphere:
  /// y_bar = N'(y) x'_bar, x_bar = y_bar + h a'(x)^T y_bar over the moving tokens' rows.
  void step_vjp(Dynamics& dynamics, const double* x, double h, std::int64_t /*step*/,
                const double* next_bar, double* x_bar, FieldNumbers& gradient) override {
    const std::size_t size = dynamics.size(), d = dynamics.model().d;
    const double* output = dynamics.attention_output(x);
    y_.assign(x, x + size);
    y_bar_.assign(next_bar, next_bar + size);
    output_bar_.assign(size, 0.0);
    for_each_moving_token(dynamics, [&](std::size_t, std::size_t, std::size_t offset) {
      for (std::size_t c = 0; c < d; ++c) y_[offset + c] += h * output[offset + c];
      if (dynamics.model().on_sphere())
        kernels::direction_derivative(y_.data() + offset, int(d), y_bar_.data() + offset);
      for (std::size_t c = 0; c < d; ++c) output_bar_[offset + c] = h * y_bar_[offset + c];
    });
    dynamics.attention_output_vjp(x, output_bar_.data(), x_bar, gradient);
    for (std::size_t e = 0; e < size; ++e) x_bar[e] += y_bar_[e];
  }

 private:
  std::vector<double> y_, y_bar_, output_bar_;
};

class LieEuler final : public Integrator {
 public:
  std::string name() const override { return "lie-euler"; }
  int order() const override { return 1; }
  std::optional<FixedStepMethod> fixed_step_method() const override { return FixedStepMethod{FixedStepKind::LieEuler}; }
  StepOutcome step(Dynamics& dynamics, State& state, double h) override {
    velocity_.resize(state.size());
    dynamics.velocity(state.x.data(), velocity_.data());
    const std::size_t d = state.d;
    for_each_moving_token(dynamics, [&](std::size_t, std::size_t, std::size_t offset) {
      kernels::geodesic_step(state.x.data() + offset, velocity_.data() + offset, h, int(d));
    });
    state.time += h;
    ++state.step;
    return {true, h};
  }

 private:
  std::vector<double> velocity_;
};

/// CF4: Y2 = exp(F1/2) y, Y3 = exp(F2/2) y, Y4 = exp(F3 - F1/2) Y2,
///      y+ = exp(F1/4 + F2/6 + F3/6 - F4/12) exp(-F1/12 + F2/6 + F3/6 + F4/4) y,
/// with F_k = h (w_k Y_k^T - Y_k w_k^T), w_k = f(Y_k).
class LieRk4 final : public Integrator {
 public:
  std::string name() const override { return "lie-rk4"; }
  int order() const override { return 4; }
  StepOutcome step(Dynamics& dynamics, State& state, double h) override {
    const std::size_t size = state.size(), d = state.d;
    for (auto* v : {&y2_, &y3_, &y4_, &w1_, &w2_, &w3_, &w4_, &half_}) v->assign(size, 0.0);
    y2_ = y3_ = y4_ = state.x;
    const double* x = state.x.data();
    dynamics.velocity(x, w1_.data());
    for_each_moving_token(dynamics, [&](std::size_t, std::size_t, std::size_t o) {
      apply_exponential({{h / 2, x + o, w1_.data() + o}}, x + o, y2_.data() + o, d);
    });
    dynamics.velocity(y2_.data(), w2_.data());
    for_each_moving_token(dynamics, [&](std::size_t, std::size_t, std::size_t o) {
      apply_exponential({{h / 2, y2_.data() + o, w2_.data() + o}}, x + o, y3_.data() + o, d);
    });
    dynamics.velocity(y3_.data(), w3_.data());
    for_each_moving_token(dynamics, [&](std::size_t, std::size_t, std::size_t o) {
      apply_exponential({{h, y3_.data() + o, w3_.data() + o}, {-h / 2, x + o, w1_.data() + o}},
                        y2_.data() + o, y4_.data() + o, d);
    });
    dynamics.velocity(y4_.data(), w4_.data());
    for_each_moving_token(dynamics, [&](std::size_t, std::size_t, std::size_t o) {
      const double* b1 = x + o;
      const double* b2 = y2_.data() + o;
      const double* b3 = y3_.data() + o;
      const double* b4 = y4_.data() + o;
      apply_exponential({{-h / 12, b1, w1_.data() + o}, {h / 6, b2, w2_.data() + o},
                         {h / 6, b3, w3_.data() + o}, {h / 4, b4, w4_.data() + o}},
                        x + o, half_.data() + o, d);
      double* target = state.x.data() + o;
      std::vector<double> result(d);
      apply_exponential({{h / 4, b1, w1_.data() + o}, {h / 6, b2, w2_.data() + o},
                         {h / 6, b3, w3_.data() + o}, {-h / 12, b4, w4_.data() + o}},
                        half_.data() + o, result.data(), d);
      const double norm = std::sqrt(dot(result.data(), result.data(), d));
      for (std::size_t c = 0; c < d; ++c) target[c] = result[c] / norm;
    });
    state.time += h;
    ++state.step;
    return {true, h};
  }

 private:
  std::vector<double> y2_, y3_, y4_, w1_, w2_, w3_, w4_, half_;
};

/// Projected Euler-Maruyama: x <- normalize(x + h f(x) + sqrt(2h/kappa) P_x xi). The
/// increment of token i of replica r at step s comes from its own counter-based stream
/// (seed, replica, token, step): independent of thread count and of other tokens.
class EulerMaruyama final : public Integrator {
 public:
  EulerMaruyama(double kappa, std::uint64_t seed) : kappa_(kappa), seed_(seed) {}
  std::string name() const override { return "euler-maruyama"; }
  int order() const override { return 1; }
  std::optional<FixedStepMethod> fixed_step_method() const override {
    return FixedStepMethod{FixedStepKind::EulerMaruyama, kappa_, seed_};
  }
  StepOutcome step(Dynamics& dynamics, State& state, double h) override {
    const std::size_t d = state.d;
    velocity_.resize(state.size());
    dynamics.velocity(state.x.data(), velocity_.data());
    const double amplitude = kernels::noise_amplitude(h, kappa_);
    std::vector<double> noise(d);
    for_each_moving_token(dynamics, [&](std::size_t r, std::size_t i, std::size_t o) {
      kernels::maruyama_step(state.x.data() + o, velocity_.data() + o, h, amplitude, seed_, r, i,
                             static_cast<std::uint64_t>(state.step), int(d), noise.data());
    });
    state.time += h;
    ++state.step;
    return {true, h};
  }
  /// The noise of step `step` drawn again (maruyama_step_vjp): y_bar and x's own share per
  /// moving token, then x_bar += f'(x)^T (h y_bar); a token that does not move keeps x'_bar.
  void step_vjp(Dynamics& dynamics, const double* x, double h, std::int64_t step,
                const double* next_bar, double* x_bar, FieldNumbers& gradient) override {
    const std::size_t size = dynamics.size(), d = dynamics.model().d;
    velocity_.resize(size);
    // The field by the derivatives' forward pass, its tape kept for the VJP below.
    dynamics.stage_velocity(0, x, velocity_.data());
    const double amplitude = kernels::noise_amplitude(h, kappa_);
    velocity_bar_.assign(size, 0.0);
    std::copy(next_bar, next_bar + size, x_bar);
    std::vector<double>& scratch = scratch_;
    scratch.resize(2 * d);
    for_each_moving_token(dynamics, [&](std::size_t r, std::size_t i, std::size_t o) {
      kernels::maruyama_step_vjp(x + o, velocity_.data() + o, h, amplitude, seed_, r, i,
                                 static_cast<std::uint64_t>(step), int(d), next_bar + o,
                                 velocity_bar_.data() + o, x_bar + o, scratch.data());
      for (std::size_t c = 0; c < d; ++c) velocity_bar_[o + c] *= h;
    });
    field_bar_.resize(size);
    dynamics.stage_vjp(0, x, velocity_bar_.data(), field_bar_.data(), gradient);
    for (std::size_t e = 0; e < size; ++e) x_bar[e] += field_bar_[e];
  }

 private:
  double kappa_;
  std::uint64_t seed_;
  std::vector<double> velocity_, velocity_bar_, field_bar_, scratch_;
};

/// Stochastic Heun, the Stratonovich scheme (strong order 1/2, weak order 1): with g(x) the
/// step's noise at x, g_i(x) = sqrt(2h/kappa) P_{x_i} xi_i + P_{x_i}(sigma dB x_i) (the same
/// draws at both stages: xi_i from the token's stream as euler-maruyama's, dB from the
/// replica's; both stages are unit tokens, P_y = I - y y^T),
///   y = normalize(x + h f(x) + g(x)),   x <- normalize(x + h (f(x) + f(y)) / 2 + (g(x) + g(y)) /
///   2).
/// The predictor is put back on the sphere, unlike heun's stage: the field is then evaluated
/// where it is defined (a Post field off the sphere is the formula's extension, and
/// mfattn.Model evaluates unit tokens only, so a test can replay the step). That moves y by
/// O(h) along x, which changes the step by O(h^{3/2}) with mean 0: the same limit.
class StochasticHeun final : public Integrator {
 public:
  explicit StochasticHeun(const IntegratorSettings& s)
      : kappa_(s.noise_kappa), sigma_(s.common_noise),
        symmetric_(s.common_noise_kind == CommonNoiseKind::Symmetric), seed_(s.seed) {}
  std::string name() const override { return "stochastic-heun"; }
  int order() const override { return 1; }
  StepOutcome step(Dynamics& dynamics, State& state, double h) override {
    const std::size_t size = state.size(), d = state.d;
    const auto step = static_cast<std::uint64_t>(state.step);
    const double amplitude = kernels::noise_amplitude(h, kappa_);
    // The shared increments, one d x d matrix per replica.
    increments_.assign(sigma_ > 0.0 ? dynamics.replicas() * d * d : 0, 0.0);
    if (sigma_ > 0.0)
      for (std::size_t r = 0; r < dynamics.replicas(); ++r)
        kernels::common_increment(symmetric_, sigma_ * std::sqrt(h), seed_, r, step, int(d),
                                  increments_.data() + r * d * d);
    if (amplitude > 0.0) {
      draws_.resize(size);
      for_each_moving_token(dynamics, [&](std::size_t r, std::size_t i, std::size_t o) {
        kernels::token_noise(seed_, r, i, step, int(d), draws_.data() + o);
      });
    }
    first_.resize(size);
    second_.resize(size);
    noise_.resize(size);
    dynamics.velocity(state.x.data(), first_.data());
    predictor_ = state.x;
    for_each_moving_token(dynamics, [&](std::size_t r, std::size_t, std::size_t o) {
      add_noise(state.x.data() + o, r, o, amplitude, d, noise_.data() + o);
      for (std::size_t c = 0; c < d; ++c) predictor_[o + c] += h * first_[o + c] + noise_[o + c];
      kernels::normalize_token(predictor_.data() + o, int(d));
    });
    dynamics.velocity(predictor_.data(), second_.data());
    late_.resize(d);
    for_each_moving_token(dynamics, [&](std::size_t r, std::size_t, std::size_t o) {
      add_noise(predictor_.data() + o, r, o, amplitude, d, late_.data());
      double* x = state.x.data() + o;
      for (std::size_t c = 0; c < d; ++c)
        x[c] += h * 0.5 * (first_[o + c] + second_[o + c]) + 0.5 * (noise_[o + c] + late_[c]);
      kernels::normalize_token(x, int(d));
    });
    state.time += h;
    ++state.step;
    return {true, h};
  }

 private:
  /// g(x) of the unit token x at offset o of replica r: its own draws projected, plus the
  /// common share.
  void add_noise(const double* x, std::size_t r, std::size_t o, double amplitude, std::size_t d,
                 double* out) {
    for (std::size_t c = 0; c < d; ++c) out[c] = 0.0;
    if (amplitude > 0.0) kernels::add_tangent_part(x, draws_.data() + o, amplitude, int(d), out);
    if (sigma_ > 0.0) {
      shared_.resize(d);
      kernels::add_common_noise(x, increments_.data() + r * d * d, int(d), shared_.data(), out);
    }
  }

  double kappa_, sigma_;
  bool symmetric_;
  std::uint64_t seed_;
  std::vector<double> increments_, draws_, first_, second_, noise_, predictor_, shared_, late_;
};
}  // namespace

namespace {

/// x_i / |x_i| for every moving token, d fixed (2, 3: the loops unroll) or not (0).
template <std::size_t kDim>
void normalize_moving_tokens(const Dynamics& dynamics, double* x) {
  const std::size_t d = kDim ? kDim : dynamics.model().d;
  for_each_moving_token(dynamics, [&](std::size_t, std::size_t, std::size_t o) {
    kernels::normalize_token(x + o, int(d));
  });
}

}  // namespace

void take_directions(std::size_t tokens, std::size_t d, double* y) {
  for (std::size_t t = 0; t < tokens; ++t) kernels::direction(y + t * d, int(d));
}

void normalize_tokens(const Dynamics& dynamics, double* x) {
  // States in R^d (--normalization pre, peri, none) are not projected: the Runge-Kutta
  // methods then integrate the field as it is.
  if (!dynamics.model().on_sphere()) return;
  switch (dynamics.model().d) {
    case 2: return normalize_moving_tokens<2>(dynamics, x);
    case 3: return normalize_moving_tokens<3>(dynamics, x);
    default: return normalize_moving_tokens<0>(dynamics, x);
  }
}

namespace {
template <class Method>
std::unique_ptr<Integrator> make_plain(const IntegratorSettings&) {
  return std::make_unique<Method>();
}
template <Tableau (*kTableau)()>
std::unique_ptr<Integrator> make_fixed_step(const IntegratorSettings&) {
  return std::make_unique<RungeKutta>(kTableau());
}
std::unique_ptr<Integrator> make_dopri5(const IntegratorSettings& s) {
  StepSizeController controller;
  controller.rtol = s.rtol;
  controller.atol = s.atol;
  return std::make_unique<RungeKutta>(dopri5_tableau(), controller);
}
std::unique_ptr<Integrator> make_euler_maruyama(const IntegratorSettings& s) {
  return std::make_unique<EulerMaruyama>(s.noise_kappa, s.seed);
}
std::unique_ptr<Integrator> make_stochastic_heun(const IntegratorSettings& s) {
  return std::make_unique<StochasticHeun>(s);
}
/// The integrators, each once: --integrator's help and validation (integrator_names,
/// find_integrator) and make_integrator read this table.
const IntegratorEntry kIntegrators[] = {
    {"euler", false, false, make_fixed_step<euler_tableau>, false, true},
    {"euler-unprojected", false, false, make_plain<EulerUnprojected>, true, true},
    {"heun", false, true, make_fixed_step<heun_tableau>, false, true},
    {"rk4", false, true, make_fixed_step<rk4_tableau>, false, true},
    {"lie-euler", false, false, make_plain<LieEuler>},
    {"lie-rk4", false, false, make_plain<LieRk4>},
    {"dopri5", false, true, make_dopri5, false, true},
    {"euler-maruyama", true, false, make_euler_maruyama, false, true},
    {"stochastic-heun", true, false, make_stochastic_heun, false, false, true},
};
}  // namespace

void token_noise_draws(std::uint64_t seed, std::uint64_t replica, std::uint64_t token,
                       std::uint64_t step, std::size_t d, double* xi) {
  kernels::token_noise(seed, replica, token, step, int(d), xi);
}

void common_noise_increment(CommonNoiseKind kind, double scale, std::uint64_t seed,
                            std::uint64_t replica, std::uint64_t step, std::size_t d,
                            double* increment) {
  kernels::common_increment(kind == CommonNoiseKind::Symmetric, scale, seed, replica, step, int(d),
                            increment);
}

const IntegratorEntry* find_integrator(std::string_view name) {
  for (const IntegratorEntry& entry : kIntegrators)
    if (name == entry.name) return &entry;
  return nullptr;
}

const std::vector<std::string>& integrator_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all;
    for (const IntegratorEntry& entry : kIntegrators) all.emplace_back(entry.name);
    return all;
  }();
  return names;
}

std::unique_ptr<Integrator> make_integrator(const IntegratorSettings& s) {
  if (const IntegratorEntry* entry = find_integrator(s.name)) return entry->make(s);
  std::string accepted;
  for (const auto& known : integrator_names()) accepted += (accepted.empty() ? "" : ", ") + known;
  throw std::invalid_argument("--integrator " + s.name + ": unknown (accepted: " + accepted + ")");
}

namespace {
[[noreturn]] void fail_non_finite(std::int64_t step, double time) {
  std::ostringstream message;
  message << "non-finite state at step " << step << ", t = " << time
          << " (the velocity overflowed or the step diverged)";
  throw NumericalError(message.str());
}

void check_finite(const State& state) {
  for (double value : state.x)
    if (!std::isfinite(value)) fail_non_finite(state.step, state.time);
}

/// How many steps the next resident chunk takes: one at first, then as many as the last
/// chunk's rate fits in kResidentChunkSeconds (at most four times the last).
struct ResidentChunks {
  std::int64_t steps = 1;
  void measured(std::int64_t done, double seconds) {
    const double fits = seconds > 0.0 ? double(done) * kResidentChunkSeconds / seconds : 4.0 * double(done);
    steps = std::max<std::int64_t>(1, std::min<std::int64_t>(4 * std::max<std::int64_t>(done, 1),
                                                             static_cast<std::int64_t>(fits)));
  }
};

/// The step that lands on an output time `remaining` ahead, for a method whose step would be
/// `proposal`: the remainder, unless it is that step within rounding (1e-9 relative), when
/// the step itself is taken. The frame time is then set exactly, and the step is the one a
/// run without a frame there takes: the positions at a time do not depend on which frames
/// are written, as long as the frames lie on the step grid.
double landing_step(double remaining, double proposal) {
  return std::fabs(remaining - proposal) <= proposal * 1e-9 ? proposal : remaining;
}
}  // namespace

FixedStep fixed_step_toward(double time, double target, double dt) {
  const double remaining = target - time;
  const bool lands = remaining <= dt * (1.0 + 1e-9);
  return {lands ? landing_step(remaining, dt) : dt, lands};
}

void Integrator::step_vjp(Dynamics&, const double*, double, std::int64_t, const double*, double*,
                          FieldNumbers&) {
  throw std::logic_error("--integrator " + name() + ": its steps have no adjoint");
}

namespace {

/// integrate()'s steps up to target on a resident stepper: the fixed step while the remainder
/// exceeds it by more than a relative 1e-9, then the remainder, landing on target exactly; the
/// times accumulate one step at a time as Integrator::step advances them, so the steps and
/// times are those of the loop in integrate(). after_step runs after each chunk but the last.
void advance_resident(ResidentStepper& resident, ResidentChunks& chunks, State& state, double fixed_dt,
                      double target, IntegrationStats& stats, const StepHook& after_step) {
  while (state.time < target) {
    const auto [h, lands] = fixed_step_toward(state.time, target, fixed_dt);
    std::int64_t count = 1;
    if (!lands) {
      double time = state.time + fixed_dt;
      while (count < chunks.steps && !(target - time <= fixed_dt * (1.0 + 1e-9))) {
        time += fixed_dt;
        ++count;
      }
    }
    const auto start = std::chrono::steady_clock::now();
    const ResidentOutcome outcome = resident.advance(state.x.data(), state.step, count, h);
    chunks.measured(outcome.steps_done,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    for (std::int64_t k = 0; k < outcome.steps_done; ++k) {
      state.time += h;
      ++state.step;
      ++stats.steps;
    }
    if (outcome.non_finite_state) fail_non_finite(state.step + 1, state.time + h);
    if (outcome.failed()) {
      std::ostringstream message;
      message << outcome.numerical_error << " (at step " << state.step + 1 << ", t = " << state.time + h << ")";
      throw NumericalError(message.str());
    }
    if (lands) {
      state.time = target;
      return;
    }
    if (after_step) after_step(state, stats);
  }
}
}  // namespace

IntegrationStats integrate(Integrator& integrator, Dynamics& dynamics, State& state, double& h,
                           double fixed_dt, const std::vector<double>& output_times,
                           const std::function<void(const State&)>& observer,
                           const StepHook& after_step, const AcceptedStepHook& on_accepted) {
  IntegrationStats stats;
  ResidentStepper* resident = integrator.adaptive() || on_accepted
                                  ? nullptr
                                  : dynamics.resident_stepper(integrator);
  ResidentChunks chunks;
  for (double target : output_times) {
    if (resident) advance_resident(*resident, chunks, state, fixed_dt, target, stats, after_step);
    // Land on each output time exactly: the last step of an interval is clipped, and a
    // remainder within rounding of one step is taken as that step.
    while (state.time < target) {
      // dopri5's landing step is clipped as it comes: its proposal depends on the frames anyway.
      FixedStep next = fixed_step_toward(state.time, target, fixed_dt);
      if (integrator.adaptive()) {
        const double remaining = target - state.time;
        next.lands = remaining <= h * (1.0 + 1e-9);
        next.h = next.lands ? remaining : h;
      }
      const auto [step, lands] = next;
      StepOutcome outcome;
      try {
        outcome = integrator.step(dynamics, state, step);
      } catch (const NonFiniteState&) {
        fail_non_finite(state.step + 1, state.time + step);
      } catch (const NumericalError& error) {
        std::ostringstream message;
        message << error.what() << " (at step " << state.step + 1 << ", t = " << state.time + step << ")";
        throw NumericalError(message.str());
      }
      if (!outcome.accepted) {
        ++stats.rejected;
        h = outcome.h_next;
        if (h < 1e-14 * std::max(1.0, std::fabs(state.time)))
          throw NumericalError("dopri5 step size underflow at t = " + std::to_string(state.time));
        if (after_step) after_step(state, stats);
        continue;
      }
      ++stats.steps;
      // A clipped landing step says little about the step the method wants: keep h then.
      if (integrator.adaptive() && !lands) h = outcome.h_next;
      if (lands) state.time = target;
      check_finite(state);
      if (on_accepted) on_accepted(step, state);
      // At a landing the frame comes first, so an interruption keeps the frame.
      if (after_step && !lands) after_step(state, stats);
    }
    observer(state);
    if (after_step) after_step(state, stats);
  }
  return stats;
}

}  // namespace mfattn
