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

namespace mfattn::cpu {

/// Positions of the sources as lanes: position_dim rows of padded_sources numbers.
struct SourcePositions {
  std::size_t dim = 1, padded_sources = 0;
  std::vector<double> rows;
  const double* row(std::size_t a) const { return rows.data() + a * padded_sources; }
};

struct ReceiverPosition {
  double xi[4] = {0, 0, 0, 0};  // the first (up to) four position coordinates
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
    return xi > r.xi[0] ? simd::broadcast(-std::numeric_limits<double>::infinity()) : simd::Lanes{};
  }
};

/// m_ij = [|xi_i - xi_j| <= window] (Euclidean over the position coordinates).
struct WindowMask {
  static constexpr bool kActive = true;
  double window_squared = 0.0;
  simd::Lanes log_term(const SourcePositions& s, const ReceiverPosition& r, std::size_t j) const {
    simd::Lanes dist2{};
    for (std::size_t a = 0; a < s.dim && a < 4; ++a) {
      const simd::Lanes diff = simd::load(s.row(a) + j) - r.xi[a];
      dist2 += diff * diff;
    }
    return dist2 > window_squared ? simd::broadcast(-std::numeric_limits<double>::infinity())
                                  : simd::Lanes{};
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

/// |xi_i - xi_j|^2 over the position coordinates, lanes over sources.
inline simd::Lanes squared_distance(const SourcePositions& s, const ReceiverPosition& r,
                                    std::size_t j) {
  simd::Lanes dist2{};
  for (std::size_t a = 0; a < s.dim && a < 4; ++a) {
    const simd::Lanes diff = simd::load(s.row(a) + j) - r.xi[a];
    dist2 += diff * diff;
  }
  return dist2;
}

/// c_ij = exp(-lambda |xi_i - xi_j|): distance bias (ALiBi-like), as a log-term.
struct DistanceFactor {
  static constexpr bool kLog = true, kMultiply = false;
  double lambda = 1.0;
  simd::Lanes log_term(const SourcePositions& s, const ReceiverPosition& r, std::size_t j) const {
    simd::Lanes dist2 = squared_distance(s, r, j), dist;
    for (std::size_t l = 0; l < simd::kLanes; ++l) dist[l] = std::sqrt(dist2[l]);
    return dist * -lambda;
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
    for (std::size_t l = 0; l < simd::kLanes; ++l) out[l] = std::cos(omega * diff[l]);
    return out;
  }
};

/// One mask and one factor, bound to the source positions.
template <class Mask, class Factor>
struct Terms {
  using Receiver = ReceiverPosition;
  static constexpr bool kHasLogTerm = Mask::kActive || Factor::kLog;
  static constexpr bool kHasFactor = Factor::kMultiply;
  const SourcePositions* sources;
  const std::vector<double>* receiver_positions;
  Mask mask;
  Factor aux_factor;

  Receiver receiver(std::size_t i) const {
    Receiver r;
    for (std::size_t a = 0; a < sources->dim && a < 4; ++a)
      r.xi[a] = (*receiver_positions)[i * sources->dim + a];
    return r;
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

/// Holds the padded source positions and picks the Terms type for a model.
class PairTerms {
 public:
  static constexpr std::size_t kTile = 64;

  explicit PairTerms(const Model& model) : model_(model) {
    const std::size_t k = model.position_dim;
    sources_.dim = k;
    sources_.padded_sources = (std::max<std::size_t>(model.n, 1) + kTile - 1) / kTile * kTile;
    sources_.rows.assign(k * sources_.padded_sources, 0.0);
    for (std::size_t j = 0; j < model.n && !model.positions.empty(); ++j)
      for (std::size_t a = 0; a < k; ++a)
        sources_.rows[a * sources_.padded_sources + j] = model.positions[j * k + a];
    receiver_positions_ = model.positions;
    if (receiver_positions_.empty()) receiver_positions_.assign(model.n * k, 0.0);
  }

  /// Calls body(terms) with the Terms type of the model's mask and factor.
  template <class Body>
  void dispatch(Body&& body) const {
    switch (model_.aux_factor) {
      case AuxFactor::None:
        return with_mask(NoFactor{}, body);
      case AuxFactor::Distance:
        return with_mask(DistanceFactor{model_.aux_lambda}, body);
      case AuxFactor::Gaussian:
        return with_mask(GaussianFactor{0.5 / (model_.aux_sigma * model_.aux_sigma)}, body);
      case AuxFactor::Cosine:
        return with_mask(CosineFactor{model_.aux_omega}, body);
    }
  }

 private:
  template <class Factor, class Body>
  void with_mask(Factor factor, Body& body) const {
    switch (model_.mask) {
      case MaskKind::Full:
        return body(make(FullMask{}, factor));
      case MaskKind::Causal:
        return body(make(CausalMask{}, factor));
      case MaskKind::Window:
        return body(make(WindowMask{model_.window * model_.window}, factor));
    }
  }

  template <class Mask, class Factor>
  Terms<Mask, Factor> make(Mask mask, Factor factor) const {
    return Terms<Mask, Factor>{&sources_, &receiver_positions_, mask, factor};
  }

  const Model& model_;
  SourcePositions sources_;
  std::vector<double> receiver_positions_;
};

}  // namespace mfattn::cpu
