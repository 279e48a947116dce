#pragma once
// Pair terms of the CPU pair loop: the mask m_ij and the auxiliary factor c_ij, written as
//   log-term  l_ij += log(m_ij) [+ log c_ij for nonnegative factors]   (-inf hides a source)
//   factor    w_ij *= c_ij                                             (sign-changing factors)
// Each combination is a small type chosen once per evaluation by PairTerms::dispatch and
// compiled into the loop, so the loop has no branch per pair and no class per combination.
// A type says whether it contributes (kHasLogTerm, kHasFactor); the loop skips what it lacks.
#include <algorithm>
#include <cmath>
#include <limits>
#include <variant>
#include <vector>

#include "backends/cpu/vector_math.hpp"
#include "mfattn/model.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::cpu {
inline namespace MFATTN_CPU_NAMESPACE {

/// Labels of the sources as lanes, in the backend's source order: the prefix tokens first
/// (padded to a whole tile), then the moving tokens: position_dim rows of padded_sources
/// positions, and the prompt of each source.
struct SourcePositions {
  std::size_t dim = 1, padded_sources = 0;
  std::vector<double> rows;
  std::vector<double> prompts;
  const double* row(std::size_t a) const { return rows.data() + a * padded_sources; }
};

struct ReceiverPosition {
  const double* xi = nullptr;  // the receiver's position_dim coordinates (unread without terms)
  double prompt = 0;
};

struct FullMask {
  static constexpr bool kActive = false;
  simd::Lanes log_term(const SourcePositions&, const ReceiverPosition&, std::size_t) const {
    return simd::Lanes{};
  }
};

/// m_ij = [xi_j <= xi_i] on the first position coordinate.
struct CausalMask {
  static constexpr bool kActive = true;
  simd::Lanes log_term(const SourcePositions& s, const ReceiverPosition& r, std::size_t j) const {
    const simd::Lanes xi = simd::load(s.row(0) + j);
    return simd::select(xi > r.xi[0], simd::broadcast(-std::numeric_limits<double>::infinity()),
                        simd::Lanes{});
  }
};

/// |xi_i - xi_j|^2 over the position coordinates, lanes over sources.
inline simd::Lanes squared_distance(const SourcePositions& s, const ReceiverPosition& r,
                                    std::size_t j) {
  simd::Lanes dist2{};
  for (std::size_t a = 0; a < s.dim; ++a) {
    const simd::Lanes diff = simd::load(s.row(a) + j) - r.xi[a];
    dist2 += diff * diff;
  }
  return dist2;
}

/// m_ij = [|xi_i - xi_j| <= window] (Euclidean over the position coordinates).
struct WindowMask {
  static constexpr bool kActive = true;
  double window_squared = 0.0;
  simd::Lanes log_term(const SourcePositions& s, const ReceiverPosition& r, std::size_t j) const {
    return simd::select(squared_distance(s, r, j) > window_squared,
                        simd::broadcast(-std::numeric_limits<double>::infinity()), simd::Lanes{});
  }
};

/// The per-prompt mask on top of another mask: a source of another prompt is hidden. Used
/// for the prefix sources only (active tokens see the active tokens of every prompt).
template <class Mask>
struct PromptMasked {
  static constexpr bool kActive = true;
  static constexpr bool kPerPrompt = true;
  Mask inner;
  simd::Lanes log_term(const SourcePositions& s, const ReceiverPosition& r, std::size_t j) const {
    simd::Lanes t{};
    if constexpr (Mask::kActive) t = inner.log_term(s, r, j);
    const simd::Lanes prompt = simd::load(s.prompts.data() + j);
    return simd::select(prompt != r.prompt, simd::broadcast(-std::numeric_limits<double>::infinity()), t);
  }
};

/// c_ij = 1.
struct NoFactor {
  static constexpr bool kLog = false, kMultiply = false;
  simd::Lanes log_term(const SourcePositions&, const ReceiverPosition&, std::size_t) const {
    return simd::Lanes{};
  }
  simd::Lanes factor(const SourcePositions&, const ReceiverPosition&, std::size_t) const {
    return simd::broadcast(1.0);
  }
};

/// c_ij = exp(-lambda |xi_i - xi_j|): distance bias (ALiBi-like), as a log-term.
struct DistanceFactor {
  static constexpr bool kLog = true, kMultiply = false;
  double lambda = 1.0;
  simd::Lanes log_term(const SourcePositions& s, const ReceiverPosition& r, std::size_t j) const {
    return simd::sqrt(squared_distance(s, r, j)) * -lambda;
  }
  simd::Lanes factor(const SourcePositions&, const ReceiverPosition&, std::size_t) const {
    return simd::broadcast(1.0);
  }
};

/// c_ij = exp(-|xi_i - xi_j|^2 / (2 sigma^2)): Gaussian, as a log-term.
struct GaussianFactor {
  static constexpr bool kLog = true, kMultiply = false;
  double inverse_two_sigma2 = 0.5;
  simd::Lanes log_term(const SourcePositions& s, const ReceiverPosition& r, std::size_t j) const {
    return squared_distance(s, r, j) * -inverse_two_sigma2;
  }
  simd::Lanes factor(const SourcePositions&, const ReceiverPosition&, std::size_t) const {
    return simd::broadcast(1.0);
  }
};

/// c_ij = cos(omega (xi_i - xi_j)) (k = 1): cosine Toeplitz, sign-changing, so it multiplies
/// the weight instead of entering the logit.
struct CosineFactor {
  static constexpr bool kLog = false, kMultiply = true;
  double omega = 1.0;
  simd::Lanes log_term(const SourcePositions&, const ReceiverPosition&, std::size_t) const {
    return simd::Lanes{};
  }
  simd::Lanes factor(const SourcePositions& s, const ReceiverPosition& r, std::size_t j) const {
    const simd::Lanes diff = simd::load(s.row(0) + j) - r.xi[0];
    simd::Lanes out;
    for (std::size_t l = 0; l < simd::kLanes; ++l) out.set(l, std::cos(omega * diff[l]));
    return out;
  }
};

/// One mask and one factor, bound to the source positions.
template <class Mask, class Factor>
struct Terms {
  using Receiver = ReceiverPosition;
  static constexpr bool kHasLogTerm = Mask::kActive || Factor::kLog;
  static constexpr bool kHasFactor = Factor::kMultiply;
  static constexpr bool kPromptMasked = requires { Mask::kPerPrompt; };
  const SourcePositions* sources;
  const std::vector<double>* receiver_positions;
  Mask mask;
  Factor aux_factor;

  const std::vector<double>* receiver_prompts;

  Receiver receiver(std::size_t i) const {
    return Receiver{receiver_positions->data() + i * sources->dim, (*receiver_prompts)[i]};
  }
  simd::Lanes log_term(const Receiver& r, std::size_t j) const {
    simd::Lanes t{};
    if constexpr (Mask::kActive) t += mask.log_term(*sources, r, j);
    if constexpr (Factor::kLog) t += aux_factor.log_term(*sources, r, j);
    return t;
  }
  simd::Lanes factor(const Receiver& r, std::size_t j) const {
    return aux_factor.factor(*sources, r, j);
  }
};

/// Holds the padded source labels and picks the Terms types for a model: one for the moving
/// sources and one for the prefix sources (the same type unless the per-prompt mask is on).
class PairTerms {
 public:
  static constexpr std::size_t kTile = 64;

  /// Sources before this index are prefix tokens (and padding); the moving ones follow.
  static std::size_t prefix_region(const Model& model) {
    return (model.prefix_count() + kTile - 1) / kTile * kTile;
  }
  static std::size_t padded_sources(const Model& model) {
    return prefix_region(model) + (std::max<std::size_t>(model.n, 1) + kTile - 1) / kTile * kTile;
  }

  // Terms hold pointers into this object (the symmetric loop keeps a copy of them).
  PairTerms(const PairTerms&) = delete;
  PairTerms& operator=(const PairTerms&) = delete;

  explicit PairTerms(const Model& model) : model_(model) {
    const std::size_t k = model.position_dim, first = prefix_region(model);
    sources_.dim = k;
    sources_.padded_sources = padded_sources(model);
    sources_.rows.assign(k * sources_.padded_sources, 0.0);
    sources_.prompts.assign(sources_.padded_sources, -1.0);
    for (std::size_t p = 0; p < model.prefix_count(); ++p) {
      for (std::size_t a = 0; a < k; ++a)
        sources_.rows[a * sources_.padded_sources + p] = model.prefix_positions[p * k + a];
      sources_.prompts[p] = model.prefix_prompt_id[p];
    }
    for (std::size_t j = 0; j < model.n && !model.positions.empty(); ++j)
      for (std::size_t a = 0; a < k; ++a)
        sources_.rows[a * sources_.padded_sources + first + j] = model.positions[j * k + a];
    receiver_positions_ = model.positions;
    if (receiver_positions_.empty()) receiver_positions_.assign(model.n * k, 0.0);
    receiver_prompts_.assign(model.n, 0.0);
    for (std::size_t i = 0; i < model.n && i < model.prompt_id.size(); ++i)
      receiver_prompts_[i] = model.prompt_id[i];
  }

  /// The moving tokens' positions, n rows of position_dim (zeros when the model has none).
  const std::vector<double>& receiver_positions() const { return receiver_positions_; }

  /// Calls body(terms, prefix_terms) with the Terms types of the model's mask and factor.
  template <class Body>
  void dispatch(Body&& body) const {
    visit_factor([&](const auto& factor) { dispatch_with(factor, body); });
  }

  /// Calls body(factor) with the model's auxiliary factor as its own type (a translation
  /// unit per factor can then hold that factor's instantiations: one_sided_loop.hpp).
  template <class Body>
  void visit_factor(Body&& body) const {
    switch (model_.aux_factor) {
      case AuxFactor::None:
        return body(NoFactor{});
      case AuxFactor::Distance:
        return body(DistanceFactor{model_.aux_lambda});
      case AuxFactor::Gaussian:
        return body(GaussianFactor{0.5 / (model_.aux_sigma * model_.aux_sigma)});
      case AuxFactor::Cosine:
        return body(CosineFactor{model_.aux_omega});
    }
  }

  /// dispatch for a factor given by visit_factor.
  template <class Factor, class Body>
  void dispatch_with(Factor factor, Body&& body) const {
    switch (model_.mask) {
      case MaskKind::Full:
        return with_prompts(FullMask{}, factor, body);
      case MaskKind::Causal:
        return with_prompts(CausalMask{}, factor, body);
      case MaskKind::Window:
        return with_prompts(WindowMask{model_.window * model_.window}, factor, body);
    }
  }

 private:
  template <class Mask, class Factor, class Body>
  void with_prompts(Mask mask, Factor factor, Body& body) const {
    const auto terms = make(mask, factor);
    if (model_.per_prompt_mask)
      body(terms, make(PromptMasked<Mask>{mask}, factor));
    else
      body(terms, terms);
  }

  template <class Mask, class Factor>
  Terms<Mask, Factor> make(Mask mask, Factor factor) const {
    return Terms<Mask, Factor>{&sources_, &receiver_positions_, mask, factor, &receiver_prompts_};
  }

  const Model& model_;
  SourcePositions sources_;
  std::vector<double> receiver_positions_, receiver_prompts_;
};

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
