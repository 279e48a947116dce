#pragma once
/// \file pair_kinds.hpp
/// The pair terms a Model carries (docs/model.md section 2) as plain numbers with no
/// dependency, so that the model (core), the option table (app) and the kernels layer's
/// formulas (src/kernels/pair_terms.hpp, compiled for the host and for a device alike) read
/// one struct:
///   mask        m_ij: every pair, causal (xi_j <= xi_i on the first position coordinate), or
///               a window (|xi_i - xi_j| <= window, Euclidean over the position coordinates)
///   factor      c_ij = c(xi_i - xi_j), one of
///                 none      1
///                 distance  exp(-lambda |dxi|)
///                 gaussian  exp(-|dxi|^2 / (2 sigma^2))
///                 cosine    cos(omega dxi)                     (k = 1, changes sign)
///                 toeplitz  sum_k a_k cos(omega_k dxi)         (k = 1, changes sign)
///                 power     (1 + s |dxi|)^(-r)                 (KERPLE's logarithmic kernel)
///                 cauchy    1 / (1 + |dxi|^2 / gamma^2)        (heavy-tailed, positive definite)
///   per prompt  a pair with a prefix token is hidden unless both share a prompt
/// Adding a factor: its formula and its entry in the factor list (src/kernels/pair_terms.hpp),
/// its enum value here, its entry in kAuxFactorChoices (include/mfattn/core/model_choices.hpp)
/// and, with a parameter, that parameter's field here and its entry in kNumberOptions (the
/// same file): three files.

#include <cstddef>

namespace mfattn {

/// Causal: xi_j <= xi_i (a token sees itself); CausalStrict: xi_j < xi_i (it does not, and the
/// first token sees no source).
enum class MaskKind { Full, Causal, Window, CausalStrict };

/// Whether the mask lets a token see only the tokens before it (not symmetric in i and j).
constexpr bool is_causal(MaskKind kind) {
  return kind == MaskKind::Causal || kind == MaskKind::CausalStrict;
}

enum class AuxFactor { None, Distance, Gaussian, Cosine, Toeplitz, Power, Cauchy };

/// The most terms a Toeplitz factor's series takes (the kernels hold them in fixed arrays).
inline constexpr std::size_t kMaxToeplitzTerms = 16;

/// The coefficients a_k and frequencies omega_k of a Toeplitz factor, at most kMaxTerms.
struct ToeplitzSeries {
  static constexpr std::size_t kMaxTerms = kMaxToeplitzTerms;
  std::size_t terms = 1;  ///< at most kMaxTerms
  double coefficient[kMaxTerms] = {1.0};
  double frequency[kMaxTerms] = {1.0};
};

/// A model's pair terms as plain numbers a device can copy. The option table binds the
/// numbers (kNumberOptions) and the model builder fills the rest; the defaults here are
/// the options' defaults.
struct PairTermParameters {
  MaskKind mask = MaskKind::Full;
  double window = 1.0;         ///< |xi_i - xi_j| <= window for MaskKind::Window
  AuxFactor factor = AuxFactor::None;
  double lambda = 1.0;         ///< distance factor exp(-lambda |dxi|)
  double sigma = 1.0;          ///< Gaussian factor exp(-|dxi|^2 / (2 sigma^2))
  double omega = 1.0;          ///< cosine factor cos(omega dxi)
  double power = 1.0;          ///< power factor (1 + power_scale |dxi|)^(-power)
  double power_scale = 1.0;    ///< the power factor's distance scale (KERPLE's logarithmic r2)
  double gamma = 1.0;          ///< Cauchy factor 1 / (1 + |dxi|^2 / gamma^2)
  ToeplitzSeries toeplitz;     ///< the Toeplitz factor's series
  bool per_prompt = false;     ///< the per-prompt rule on pairs with a prefix token

  /// True when a mask, a factor or the per-prompt rule is on (the pair loops read positions).
  constexpr bool any() const { return mask != MaskKind::Full || factor != AuxFactor::None || per_prompt; }
};

}  // namespace mfattn
