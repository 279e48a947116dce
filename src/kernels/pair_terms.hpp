#pragma once
// The pair terms of docs/model.md section 2, written once for every backend and number type:
//   mask        m_ij in {0, 1}, as the log-term log m_ij in {0, -inf}
//   factor      c_ij = c(xi_i - xi_j), as a log-term log c_ij when it is positive, or as a
//               multiplier of the weight when it changes sign
//   per prompt  a pair with a prefix token is hidden unless both share a prompt
// so that the weight is w_ij = exp(s_ij + log p_j + log m_ij [+ log c_ij]) [* c_ij].
//
// Each term is a small struct over plain numbers (no Eigen, no std::vector, no pointer into
// host memory), with a formula templated on the pair it reads, so the same line serves
//   - one pair in double (the reference backend, the energy, the OAttention link: ScalarPair),
//   - eight sources at once in SIMD lanes (the CPU pair loops: cpu::SourceLanes),
//   - a CUDA thread's pair (the same header compiles under nvcc: MFATTN_HOST_DEVICE).
// A Pair provides: Real (double or a lane type); dim(); source(a) (Real) and receiver(a)
// (double), the coordinates of the two positions; source_prompt() (Real) and
// receiver_prompt() (double). Where Real is a lane type, comparisons give lane masks, and
// hide_where, sqrt and cos have overloads for them beside the lane type (found by argument-
// dependent lookup).
//
// Each term also says whether it is symmetric (c_ij = c_ji, m_ij = m_ji): the CPU backend's
// symmetric loop, one exp per unordered pair, is taken exactly when every term of the model is
// (symmetric_pairs_apply), and the energy of section 4 is then a Lyapunov function of USA.
//
// A factor's numbers are differentiated beside its formula (docs/model.md section 2e):
// number_count() and term_derivatives(pair, out), the derivatives of its log-term (kLog) or of
// its multiplier (kMultiply) with respect to each of its numbers; numbers(out), their values in
// the same order; number_groups(kind, out), the names the derivatives are reported under
// (include/mfattn/backends/derivatives.hpp: the option's name with '_', and where in the
// order each starts). Masks have none (a window is a threshold: its derivative is zero almost
// everywhere and is not taken).
//
// Adding a factor: its struct here (its formula and its numbers' derivatives, the kinds it
// serves, how it reads its parameters) and its name in AuxFactorTypes; its enum value and parameters in
// include/mfattn/core/pair_kinds.hpp; its option entry in include/mfattn/app/run_choices.hpp
// (docs/architecture.md). Every reader (visit_factor, the CPU's per-factor translation units
// that CMakeLists.txt makes from AuxFactorTypes, the CUDA thread's pair) follows the list.
#include <cmath>
#include <cstddef>
#include <type_traits>

#include "kernels/compile_target.hpp"
#include "mfattn/core/pair_kinds.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::kernels {
// Kernel code of each instruction set has a namespace of its own (kernels/compile_target.hpp):
// no two targets share an instantiation of these templates.
inline namespace MFATTN_CPU_NAMESPACE {

using mfattn::PairTermParameters;
using mfattn::ToeplitzSeries;

// The scalar forms of the functions the formulas call; lane types bring their own.
MFATTN_HOST_DEVICE inline double sqrt(double x) { return std::sqrt(x); }
MFATTN_HOST_DEVICE inline double cos(double x) { return std::cos(x); }
MFATTN_HOST_DEVICE inline double sin(double x) { return std::sin(x); }
MFATTN_HOST_DEVICE inline double log1p(double x) { return std::log1p(x); }
MFATTN_HOST_DEVICE inline double exp(double x) { return std::exp(x); }
/// -inf (numeric_limits is host-only under nvcc; the builtin serves both compilers).
MFATTN_HOST_DEVICE constexpr double negative_infinity() { return -__builtin_huge_val(); }
/// condition ? -inf : otherwise: the log-term of a hidden pair.
MFATTN_HOST_DEVICE inline double hide_where(bool condition, double otherwise) {
  return condition ? negative_infinity() : otherwise;
}

/// |xi_i - xi_j|^2 over the position coordinates, summed in coordinate order.
template <class Pair>
MFATTN_HOST_DEVICE inline typename Pair::Real squared_distance(const Pair& pair) {
  typename Pair::Real sum{};
  for (std::size_t a = 0; a < pair.dim(); ++a) {
    const typename Pair::Real difference = pair.source(a) - pair.receiver(a);
    sum += difference * difference;
  }
  return sum;
}

// ---- masks: log_term(pair) is 0 (visible) or -inf (hidden) ----

/// m_ij = 1.
struct FullMask {
  static constexpr bool kActive = false, kSymmetric = true;
  MFATTN_HOST_DEVICE static FullMask from(const PairTermParameters&) { return {}; }
  template <class Pair>
  MFATTN_HOST_DEVICE typename Pair::Real log_term(const Pair&) const {
    return typename Pair::Real{};
  }
};

/// m_ij = [xi_j <= xi_i] on the first position coordinate, or [xi_j < xi_i] (strict: a token
/// does not see itself). One type for both, so the strict mask adds no pair loop to compile.
struct CausalMask {
  static constexpr bool kActive = true, kSymmetric = false;
  bool strict = false;
  MFATTN_HOST_DEVICE static CausalMask from(const PairTermParameters& p) {
    return {p.mask == MaskKind::CausalStrict};
  }
  template <class Pair>
  MFATTN_HOST_DEVICE typename Pair::Real log_term(const Pair& pair) const {
    return hide_where(
        strict ? pair.source(0) >= pair.receiver(0) : pair.source(0) > pair.receiver(0),
        typename Pair::Real{});
  }
};

/// m_ij = [|xi_i - xi_j| <= window] (Euclidean over the position coordinates).
struct WindowMask {
  static constexpr bool kActive = true, kSymmetric = true;
  double window_squared = 0.0;
  MFATTN_HOST_DEVICE static WindowMask from(const PairTermParameters& p) { return {p.window * p.window}; }
  template <class Pair>
  MFATTN_HOST_DEVICE typename Pair::Real log_term(const Pair& pair) const {
    return hide_where(squared_distance(pair) > window_squared, typename Pair::Real{});
  }
};

/// The per-prompt rule on top of a mask: a source of another prompt is hidden. Backends apply
/// it to the pairs with a prefix token only (active tokens see the active tokens of every
/// prompt); symmetric, since sharing a prompt is.
template <class Mask>
struct PromptMasked {
  static constexpr bool kActive = true, kSymmetric = Mask::kSymmetric, kPerPrompt = true;
  Mask inner;
  template <class Pair>
  MFATTN_HOST_DEVICE typename Pair::Real log_term(const Pair& pair) const {
    typename Pair::Real term{};
    if constexpr (Mask::kActive) term = inner.log_term(pair);
    return hide_where(pair.source_prompt() != pair.receiver_prompt(), term);
  }
};

// ---- auxiliary factors: kLog (log_term(pair) = log c_ij) or kMultiply (factor(pair) = c_ij) ----

/// What a factor declares besides its formula and its parameters: the kinds of AuxFactor it
/// serves, and whether it enters the logit as log c_ij (kLog: a positive factor) or multiplies
/// the weight (kMultiply: a sign-changing one). Every factor here is even, c(delta) = c(-delta),
/// hence symmetric in (i, j).
template <bool kIsLog, AuxFactor... kKinds>
struct FactorKinds {
  static constexpr bool kLog = kIsLog, kMultiply = !kIsLog, kSymmetric = true;
  MFATTN_HOST_DEVICE static constexpr bool serves(AuxFactor kind) { return ((kind == kKinds) || ...); }
};

/// The most numbers a factor has (a Toeplitz series' coefficients and frequencies).
inline constexpr std::size_t kMaxFactorNumbers = 2 * kMaxToeplitzTerms;

/// A name a factor's numbers are reported under: count of them from `first` in the order of
/// term_derivatives.
struct FactorNumberGroup {
  const char* name;
  std::size_t first = 0, count = 1;
};

/// c_ij = 1.
struct NoFactor {
  static constexpr bool kLog = false, kMultiply = false, kSymmetric = true;
  MFATTN_HOST_DEVICE static constexpr bool serves(AuxFactor kind) { return kind == AuxFactor::None; }
  MFATTN_HOST_DEVICE static NoFactor from(const PairTermParameters&) { return {}; }
  MFATTN_HOST_DEVICE static constexpr std::size_t number_count() { return 0; }
  template <class Pair>
  MFATTN_HOST_DEVICE void term_derivatives(const Pair&, typename Pair::Real*) const {}
  MFATTN_HOST_DEVICE void numbers(double*) const {}
  static std::size_t number_groups(AuxFactor, FactorNumberGroup*) { return 0; }
};

/// c_ij = exp(-lambda |xi_i - xi_j|): the distance bias (ALiBi-like), as a log-term.
struct DistanceFactor : FactorKinds<true, AuxFactor::Distance> {
  double lambda = 1.0;
  MFATTN_HOST_DEVICE static DistanceFactor from(const PairTermParameters& p) { return {{}, p.lambda}; }
  template <class Pair>
  MFATTN_HOST_DEVICE typename Pair::Real log_term(const Pair& pair) const {
    return sqrt(squared_distance(pair)) * -lambda;
  }
  /// d/dlambda = -|dxi|.
  MFATTN_HOST_DEVICE static constexpr std::size_t number_count() { return 1; }
  MFATTN_HOST_DEVICE void numbers(double* out) const { out[0] = lambda; }
  static std::size_t number_groups(AuxFactor, FactorNumberGroup* out) {
    out[0] = {"aux_lambda"};
    return 1;
  }
  template <class Pair>
  MFATTN_HOST_DEVICE void term_derivatives(const Pair& pair, typename Pair::Real* out) const {
    out[0] = -sqrt(squared_distance(pair));
  }
};

/// c_ij = exp(-|xi_i - xi_j|^2 / (2 sigma^2)): Gaussian, as a log-term.
struct GaussianFactor : FactorKinds<true, AuxFactor::Gaussian> {
  double inverse_two_sigma2 = 0.5;  // the reciprocal taken once
  double sigma = 1.0;
  MFATTN_HOST_DEVICE static GaussianFactor from(const PairTermParameters& p) {
    return {{}, 0.5 / (p.sigma * p.sigma), p.sigma};
  }
  template <class Pair>
  MFATTN_HOST_DEVICE typename Pair::Real log_term(const Pair& pair) const {
    return squared_distance(pair) * -inverse_two_sigma2;
  }
  /// d/dsigma = |dxi|^2 / sigma^3 = |dxi|^2 * (2 inverse_two_sigma2 / sigma).
  MFATTN_HOST_DEVICE static constexpr std::size_t number_count() { return 1; }
  MFATTN_HOST_DEVICE void numbers(double* out) const { out[0] = sigma; }
  static std::size_t number_groups(AuxFactor, FactorNumberGroup* out) {
    out[0] = {"aux_sigma"};
    return 1;
  }
  template <class Pair>
  MFATTN_HOST_DEVICE void term_derivatives(const Pair& pair, typename Pair::Real* out) const {
    out[0] = squared_distance(pair) * (2.0 * inverse_two_sigma2 / sigma);
  }
};

/// c_ij = sum_k a_k cos(omega_k (xi_i - xi_j)) (k = 1): a Toeplitz factor (a function of
/// xi_i - xi_j alone), as a finite cosine series. The cosine factor cos(omega dxi) is its
/// one-term case (a_1 = 1: the same bits as the cosine alone). It changes sign, so it
/// multiplies the weight instead of entering the logit; symmetric (cos is even), but the
/// symmetric loop takes log-terms only.
struct ToeplitzFactor : FactorKinds<false, AuxFactor::Cosine, AuxFactor::Toeplitz> {
  ToeplitzSeries series;
  MFATTN_HOST_DEVICE static ToeplitzFactor from(const PairTermParameters& p) {
    if (p.factor != AuxFactor::Cosine) return {{}, p.toeplitz};
    ToeplitzFactor cosine;  // the one-term series a_1 = 1, omega_1 = omega
    cosine.series.frequency[0] = p.omega;
    return cosine;
  }
  template <class Pair>
  MFATTN_HOST_DEVICE typename Pair::Real factor(const Pair& pair) const {
    const typename Pair::Real difference = pair.source(0) - pair.receiver(0);
    // From zero, so that an empty series is c = 0, not a read of an unset term; 0 + a_1 cos is
    // a_1 cos exactly (a cosine is never -0), so the one-term case keeps the cosine's bits.
    typename Pair::Real sum{};
    for (std::size_t k = 0; k < series.terms; ++k)
      sum += series.coefficient[k] * cos(series.frequency[k] * difference);
    return sum;
  }
  /// dc/da_k = cos(omega_k dxi) (k < K), then dc/domega_k = -a_k dxi sin(omega_k dxi); the
  /// cosine factor's one number omega is its frequency omega_1 (index 1).
  MFATTN_HOST_DEVICE std::size_t number_count() const { return 2 * series.terms; }
  MFATTN_HOST_DEVICE void numbers(double* out) const {
    for (std::size_t k = 0; k < series.terms; ++k) {
      out[k] = series.coefficient[k];
      out[series.terms + k] = series.frequency[k];
    }
  }
  /// The cosine's one number is omega (its a_1 = 1 is not an option); a Toeplitz series' are
  /// its coefficients and its frequencies.
  std::size_t number_groups(AuxFactor kind, FactorNumberGroup* out) const {
    if (kind == AuxFactor::Cosine) {
      out[0] = {"aux_omega", 1, 1};
      return 1;
    }
    out[0] = {"toeplitz_coefficients", 0, series.terms};
    out[1] = {"toeplitz_frequencies", series.terms, series.terms};
    return 2;
  }
  template <class Pair>
  MFATTN_HOST_DEVICE void term_derivatives(const Pair& pair, typename Pair::Real* out) const {
    const typename Pair::Real difference = pair.source(0) - pair.receiver(0);
    for (std::size_t k = 0; k < series.terms; ++k) {
      out[k] = cos(series.frequency[k] * difference);
      out[series.terms + k] = sin(series.frequency[k] * difference) * difference * -series.coefficient[k];
    }
  }
};

/// c_ij = (1 + s |xi_i - xi_j|)^(-r): the logarithmic kernel of the KERPLE family (r = r1, s =
/// r2 there), as the log-term -r log(1 + s |dxi|) (log1p keeps the small distances exact; s =
/// 1, the default, multiplies exactly, so its bits are those of (1 + |dxi|)^(-r)). Positive
/// and even, so USA keeps its energy ascent and SA takes it.
struct PowerFactor : FactorKinds<true, AuxFactor::Power> {
  double power = 1.0, scale = 1.0;
  MFATTN_HOST_DEVICE static PowerFactor from(const PairTermParameters& p) { return {{}, p.power, p.power_scale}; }
  template <class Pair>
  MFATTN_HOST_DEVICE typename Pair::Real log_term(const Pair& pair) const {
    return log1p(sqrt(squared_distance(pair)) * scale) * -power;
  }
  /// d/dr = -log1p(s |dxi|), d/ds = -r |dxi| / (1 + s |dxi|).
  MFATTN_HOST_DEVICE static constexpr std::size_t number_count() { return 2; }
  MFATTN_HOST_DEVICE void numbers(double* out) const {
    out[0] = power;
    out[1] = scale;
  }
  static std::size_t number_groups(AuxFactor, FactorNumberGroup* out) {
    out[0] = {"aux_power"};
    out[1] = {"aux_power_scale", 1, 1};
    return 2;
  }
  template <class Pair>
  MFATTN_HOST_DEVICE void term_derivatives(const Pair& pair, typename Pair::Real* out) const {
    const typename Pair::Real distance = sqrt(squared_distance(pair));
    out[0] = -log1p(distance * scale);
    out[1] = distance * -power / (distance * scale + 1.0);
  }
};

/// c_ij = 1 / (1 + |xi_i - xi_j|^2 / gamma^2): the Cauchy kernel (the rational quadratic of
/// shape 1), as the log-term -log(1 + |dxi|^2 / gamma^2). Heavy-tailed (c ~ gamma^2 / |dxi|^2)
/// where the Gaussian falls off at once; positive, even and positive definite in every k, so
/// USA keeps its energy ascent and SA takes it.
struct CauchyFactor : FactorKinds<true, AuxFactor::Cauchy> {
  double inverse_gamma2 = 1.0;  // the reciprocal taken once
  double gamma = 1.0;
  MFATTN_HOST_DEVICE static CauchyFactor from(const PairTermParameters& p) {
    return {{}, 1.0 / (p.gamma * p.gamma), p.gamma};
  }
  template <class Pair>
  MFATTN_HOST_DEVICE typename Pair::Real log_term(const Pair& pair) const {
    return -log1p(squared_distance(pair) * inverse_gamma2);
  }
  /// d/dgamma = (2 |dxi|^2 / gamma^3) / (1 + |dxi|^2 / gamma^2).
  MFATTN_HOST_DEVICE static constexpr std::size_t number_count() { return 1; }
  MFATTN_HOST_DEVICE void numbers(double* out) const { out[0] = gamma; }
  static std::size_t number_groups(AuxFactor, FactorNumberGroup* out) {
    out[0] = {"aux_gamma"};
    return 1;
  }
  template <class Pair>
  MFATTN_HOST_DEVICE void term_derivatives(const Pair& pair, typename Pair::Real* out) const {
    const typename Pair::Real scaled = squared_distance(pair) * inverse_gamma2;
    out[0] = scaled * (2.0 / gamma) / (scaled + 1.0);
  }
};

/// The auxiliary factors, each once. visit_factor tries them in this order, and
/// CMakeLists.txt reads this line (keep it on one line) to compile the CPU's one-sided loop
/// once per factor.
template <class... Factors>
struct FactorList {
  static constexpr std::size_t kCount = sizeof...(Factors);
};
using AuxFactorTypes = FactorList<NoFactor, DistanceFactor, GaussianFactor, ToeplitzFactor, PowerFactor, CauchyFactor>;

/// The factor at index I of a FactorList.
template <std::size_t I, class List>
struct FactorAtIndex;
template <std::size_t I, class First, class... Rest>
struct FactorAtIndex<I, FactorList<First, Rest...>> : FactorAtIndex<I - 1, FactorList<Rest...>> {};
template <class First, class... Rest>
struct FactorAtIndex<0, FactorList<First, Rest...>> {
  using type = First;
};
template <std::size_t I>
using FactorAt = typename FactorAtIndex<I, AuxFactorTypes>::type;

/// The log-term and the multiplier of one pair's weight w_ij = exp(s_ij + log p_j + log_term)
/// * multiplier: log_term = log m_ij [+ log c_ij] (-inf: hidden), multiplier = c_ij for a
/// sign-changing factor, else 1.
template <class Real>
struct PairWeightTerms {
  Real log_term;
  Real multiplier;
};

/// One mask and one factor: the log-term and the multiplier of a pair's weight.
template <class Mask, class Factor>
struct PairTerms {
  static constexpr bool kHasLogTerm = Mask::kActive || Factor::kLog;
  static constexpr bool kHasFactor = Factor::kMultiply;
  static constexpr bool kPromptMasked = requires { Mask::kPerPrompt; };
  static constexpr bool kSymmetric = Mask::kSymmetric && Factor::kSymmetric;
  Mask mask;
  Factor aux_factor;

  /// log m_ij [+ log c_ij]: 0 when the pair has no log-term, -inf when it is hidden.
  template <class Pair>
  MFATTN_HOST_DEVICE typename Pair::Real log_term(const Pair& pair) const {
    typename Pair::Real term{};
    if constexpr (Mask::kActive) term += mask.log_term(pair);
    if constexpr (Factor::kLog) term += aux_factor.log_term(pair);
    return term;
  }
  /// The multiplier of the weight: c_ij for a sign-changing factor, else 1.
  template <class Pair>
  MFATTN_HOST_DEVICE typename Pair::Real factor(const Pair& pair) const {
    if constexpr (Factor::kMultiply)
      return aux_factor.factor(pair);
    else
      return typename Pair::Real{} + 1.0;
  }
  /// Both, for one pair: the one reading of the terms every backend makes. A scalar pair the
  /// mask hides is -inf with multiplier 1 at once: no factor is evaluated for it (the same sum
  /// as log_term's, mask first, for a visible pair).
  template <class Pair>
  MFATTN_HOST_DEVICE PairWeightTerms<typename Pair::Real> weight_terms(const Pair& pair) const {
    using Real = typename Pair::Real;
    Real term{};
    if constexpr (Mask::kActive) {
      term += mask.log_term(pair);
      if constexpr (std::is_same_v<Real, double>)
        if (term == negative_infinity()) return {term, 1.0};
    }
    if constexpr (Factor::kLog) term += aux_factor.log_term(pair);
    return {term, factor(pair)};
  }
};

/// Calls body(factor) with the parameters' auxiliary factor as its own type: the first of
/// AuxFactorTypes (from index I) that serves the parameters' kind, read from the parameters.
template <std::size_t I = 0, class Body>
MFATTN_HOST_DEVICE inline decltype(auto) visit_factor(const PairTermParameters& parameters, Body&& body) {
  if constexpr (I == AuxFactorTypes::kCount) {
    return body(NoFactor{});
  } else {
    using Factor = FactorAt<I>;
    if (Factor::serves(parameters.factor)) return body(Factor::from(parameters));
    return visit_factor<I + 1>(parameters, body);
  }
}

/// Calls body(mask) with the parameters' mask as its own type (without the per-prompt rule).
template <class Body>
MFATTN_HOST_DEVICE inline decltype(auto) visit_mask(const PairTermParameters& parameters,
                                                    Body&& body) {
  switch (parameters.mask) {
    case MaskKind::Causal:
    case MaskKind::CausalStrict: return body(CausalMask::from(parameters));
    case MaskKind::Window:
      return body(WindowMask::from(parameters));
    case MaskKind::Full:
      break;
  }
  return body(FullMask::from(parameters));
}

/// Calls body(terms, prefix_terms) with the PairTerms of the moving sources and of the prefix
/// sources (the same type unless the per-prompt rule is on), for a factor given by
/// visit_factor.
template <class Factor, class Body>
MFATTN_HOST_DEVICE inline void visit_pair_terms_with(const PairTermParameters& parameters,
                                                     Factor factor, Body&& body) {
  visit_mask(parameters, [&](auto mask) {
    using Mask = decltype(mask);
    const PairTerms<Mask, Factor> terms{mask, factor};
    if (parameters.per_prompt)
      body(terms, PairTerms<PromptMasked<Mask>, Factor>{PromptMasked<Mask>{mask}, factor});
    else
      body(terms, terms);
  });
}

/// visit_pair_terms_with for the parameters' own factor.
template <class Body>
MFATTN_HOST_DEVICE inline void visit_pair_terms(const PairTermParameters& parameters, Body&& body) {
  visit_factor(parameters, [&](auto factor) { visit_pair_terms_with(parameters, factor, body); });
}

/// True when every term is symmetric in (i, j) and none multiplies the weight: the condition
/// of the symmetric pair loop on the terms.
MFATTN_HOST_DEVICE inline bool symmetric_log_terms(const PairTermParameters& parameters) {
  bool symmetric = false;
  visit_pair_terms(parameters, [&](const auto& terms, const auto& prefix_terms) {
    using Terms = std::remove_cvref_t<decltype(terms)>;
    using PrefixTerms = std::remove_cvref_t<decltype(prefix_terms)>;
    symmetric = Terms::kSymmetric && PrefixTerms::kSymmetric && !Terms::kHasFactor;
  });
  return symmetric;
}

/// One pair in double: positions of position_dim coordinates and the two prompts.
struct ScalarPair {
  using Real = double;
  const double* receiver_position;
  const double* source_position;
  std::size_t position_dim;
  double receiver_prompt_id = 0, source_prompt_id = 0;
  MFATTN_HOST_DEVICE std::size_t dim() const { return position_dim; }
  MFATTN_HOST_DEVICE double source(std::size_t a) const { return source_position[a]; }
  MFATTN_HOST_DEVICE double receiver(std::size_t a) const { return receiver_position[a]; }
  MFATTN_HOST_DEVICE double source_prompt() const { return source_prompt_id; }
  MFATTN_HOST_DEVICE double receiver_prompt() const { return receiver_prompt_id; }
};

/// Whether the per-prompt rule concerns the pair (receiver, source), numbered as sources
/// (0..moving-1 the tokens that move, then the prefix tokens): it does when either is a prefix
/// token (active tokens see the active tokens of every prompt).
MFATTN_HOST_DEVICE constexpr bool pair_has_prefix_token(std::size_t receiver, std::size_t source,
                                                        std::size_t moving) {
  return receiver >= moving || source >= moving;
}

/// The log-term and multiplier of one pair in double, the terms chosen at run time:
/// PairTerms::weight_terms of the parameters' mask and factor, with the per-prompt rule where
/// prefix_pair (pair_has_prefix_token). The scalar readers (the reference backend, the
/// energy, OAttention's mask, the CUDA thread) call this; the CPU lanes call weight_terms'
/// parts on the same PairTerms types, chosen once per evaluation.
MFATTN_HOST_DEVICE inline PairWeightTerms<double> pair_weight_terms(const PairTermParameters& parameters,
                                                                    const ScalarPair& pair, bool prefix_pair) {
  PairWeightTerms<double> out{0.0, 1.0};
  visit_pair_terms(parameters, [&](const auto& terms, const auto& prefix_terms) {
    if (prefix_pair)
      out = prefix_terms.weight_terms(pair);
    else
      out = terms.weight_terms(pair);
  });
  return out;
}

/// The derivatives of one visible pair's log-term (a factor of kLog) or of its multiplier (one
/// of kMultiply) with respect to the factor's numbers (Factor::term_derivatives) into out (at
/// most kMaxFactorNumbers); says how many and which of the two they are of.
struct PairTermDerivatives {
  std::size_t count = 0;
  bool of_multiplier = false;
};
MFATTN_HOST_DEVICE inline PairTermDerivatives pair_term_derivatives(const PairTermParameters& parameters,
                                                                    const ScalarPair& pair, double* out) {
  PairTermDerivatives result;
  visit_factor(parameters, [&](const auto& factor) {
    using Factor = std::remove_cvref_t<decltype(factor)>;
    factor.term_derivatives(pair, out);
    result = {factor.number_count(), Factor::kMultiply};
  });
  return result;
}

/// Whether a pair is visible (its log-term is not -inf).
MFATTN_HOST_DEVICE inline bool visible(const PairWeightTerms<double>& terms) {
  return terms.log_term != negative_infinity();
}

/// The pair's factor exp(log-term) * multiplier of a visible pair: c_ij (1 without a factor).
MFATTN_HOST_DEVICE inline double weight_factor(const PairWeightTerms<double>& terms) {
  return exp(terms.log_term) * terms.multiplier;
}

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::kernels
MFATTN_CPU_TARGET_END
