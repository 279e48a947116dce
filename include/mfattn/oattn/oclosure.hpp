#pragma once
/// \file oclosure.hpp
/// O-closure (seeds 000/001, docs/oattention.md): inserting zero tokens must change no
/// existing output. The O-closed components below gate every per-token update by the
/// presence of the token's current carrier, p(h) = |h|^2 / (tau + |h|^2) (oattention.hpp),
/// and weigh every cross-token statistic by it; their standard counterparts are here too, so
/// that hosts can be compared. Tokens are rows (n x D).
///
/// Local maps (zero absorption: a zero token stays exactly zero, an active token is computed
/// from its own row only, so its result never depends on the other tokens):
///   FFN(h)        = W_2 gelu(W_1 h + b_1) + b_2,  gelu(x) = x (1 + erf(x / sqrt 2)) / 2
///   OFFN(h)       = h + p(h) FFN(h)                    standard: h + FFN(h)
///   LN(h)         = gamma . (h - mean(h)) / sqrt(var(h) + eps_norm) + beta_ln   (affine
///                   LayerNorm over the D features; LN(0) = beta_ln, which reactivates zero)
///   ONorm(h)      = h + p(h) (LN(h) - h)               standard: LN(h)
///                   (the normalisation taken as an update and gated like the FFN update:
///                   ONorm(0) = 0; for p -> 1 it is LN)
///   OInject(h, s) = h + p(h) (W_in s + b_in)           standard: h + W_in s + b_in
///                   (s: an external per-token signal, e.g. a positional or condition code)
/// Support-coupled maps (zero mass: a zero token adds no mass to any statistic):
///   OAttention    (oattention.hpp), used as the residual h + OAttention(h)
///   OStandardize: per feature c, with M = sum_j p_j over the tokens,
///                   mu_c = sum_j p_j h_jc / M,  var_c = sum_j p_j (h_jc - mu_c)^2 / M,
///                   z_ic = (h_ic - mu_c) / sqrt(var_c + eps_std),
///                   OStandardize(H)_i = h_i + p_i (z_i - h_i)   (M = 0: H unchanged)
///                 standard: z with the plain mean and variance over all n tokens
///   The sums skip tokens with p_j = 0 (rather than adding 0 * h_j), so the moments, and
///   every active output, are bit-identical with and without zero tokens.
///
/// Blocks (post-norm, as in the original Transformer; two blocks in the ablation):
///   standard        A = LN_1(H + Attn(H)),        H' = LN_2(A + FFN(A))
///   attention-only  A = LN_1(H + OAttention(H)),  H' = LN_2(A + FFN(A))
///   O-block         A = ONorm_1(H + OAttention(H)), H' = ONorm_2(OFFN(A))
/// Front end (optional, before the blocks): Standardize then Inject (standard) or
/// OStandardize then OInject (O). The OTransformer is the O front end followed by two
/// O-blocks: every component O-closed, so inserting zero tokens changes no bit of the
/// existing outputs and the zero tokens' outputs stay exactly 0.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mfattn/oattn/oattention.hpp"

namespace mfattn::oclosure {

using oattn::Rows;
template <class T>
using Vec = Eigen::Matrix<T, Eigen::Dynamic, 1>;

template <class T>
struct FfnWeights {
  Rows<T> w1;  ///< F x D
  Vec<T> b1;   ///< F
  Rows<T> w2;  ///< D x F
  Vec<T> b2;   ///< D
};

template <class T>
struct NormWeights {
  Vec<T> gamma, beta;  ///< D each
};

template <class T>
struct InjectWeights {
  Rows<T> w;  ///< D x D_signal
  Vec<T> b;   ///< D
};

template <class T>
struct BlockWeights {
  oattn::AttentionWeights<T> attention;  ///< W_q, W_k, W_v: D x D (D_head = D_value = D)
  FfnWeights<T> ffn;
  NormWeights<T> norm1, norm2;
};

template <class T>
struct HostWeights {
  InjectWeights<T> inject;
  std::vector<BlockWeights<T>> blocks;
};

struct Settings {
  double tau = 1.0;       ///< presence scale of every component
  double eps_den = 1e-12; ///< OAttention
  double eps_norm = 1e-5; ///< LayerNorm / ONorm
  double eps_std = 1e-5;  ///< Standardize / OStandardize
};

/// p(h_i) of every row, in T (squares summed in index order).
template <class T>
std::vector<T> presences(const Rows<T>& h, double tau);

// Components (each instantiated for double and float).
template <class T> Rows<T> ffn(const Rows<T>& h, const FfnWeights<T>& w);
template <class T> Rows<T> ffn_residual(const Rows<T>& h, const FfnWeights<T>& w);
template <class T> Rows<T> offn(const Rows<T>& h, const FfnWeights<T>& w, const Settings& s);
template <class T> Rows<T> layer_norm(const Rows<T>& h, const NormWeights<T>& w, const Settings& s);
template <class T> Rows<T> onorm(const Rows<T>& h, const NormWeights<T>& w, const Settings& s);
template <class T> Rows<T> standardize(const Rows<T>& h, const Settings& s);
template <class T> Rows<T> ostandardize(const Rows<T>& h, const Settings& s);
template <class T> Rows<T> inject(const Rows<T>& h, const Rows<T>& signal, const InjectWeights<T>& w);
template <class T>
Rows<T> oinject(const Rows<T>& h, const Rows<T>& signal, const InjectWeights<T>& w, const Settings& s);

enum class BlockKind { Standard, AttentionOnly, O };
enum class FrontEnd { None, Standard, O };

/// One block of the given kind (see the file comment); full visibility.
template <class T>
Rows<T> block(BlockKind kind, const Rows<T>& h, const BlockWeights<T>& w, const Settings& s);

/// Front end (if any), then every block of w in order. stages, when given, receives the
/// carriers after the front end (only when there is one) and after each block.
template <class T>
Rows<T> host_forward(BlockKind kind, FrontEnd front, const Rows<T>& h, const Rows<T>& signal,
                     const HostWeights<T>& w, const Settings& s, std::vector<Rows<T>>* stages = nullptr);

/// Seeded weights: matrices with i.i.d. N(0, 1 / fan_in) entries, biases and LayerNorm
/// shifts N(0, 0.1^2), LayerNorm gains 1 + N(0, 0.1^2); FFN width 4 D, signal dimension D.
/// Entry e (row-major) of parameter k of block b is draw e of
///   RandomStream(seed, kOClosureTag, kWeightsKey, b * 256 + k)
/// (the inject weights use b = 255), so every parameter has its own stream and changing one
/// size never changes another parameter's numbers.
HostWeights<double> random_host_weights(std::size_t dim, std::size_t blocks, std::uint64_t seed);

/// The same weights in another precision.
template <class U, class T>
HostWeights<U> cast_weights(const HostWeights<T>& w) {
  HostWeights<U> out;
  out.inject = {w.inject.w.template cast<U>(), w.inject.b.template cast<U>()};
  for (const auto& b : w.blocks) {
    BlockWeights<U> c;
    c.attention = {b.attention.w_q.template cast<U>(), b.attention.w_k.template cast<U>(),
                   b.attention.w_v.template cast<U>()};
    c.ffn = {b.ffn.w1.template cast<U>(), b.ffn.b1.template cast<U>(), b.ffn.w2.template cast<U>(),
             b.ffn.b2.template cast<U>()};
    c.norm1 = {b.norm1.gamma.template cast<U>(), b.norm1.beta.template cast<U>()};
    c.norm2 = {b.norm2.gamma.template cast<U>(), b.norm2.beta.template cast<U>()};
    out.blocks.push_back(std::move(c));
  }
  return out;
}

/// Stream tag of every O-closure draw: ASCII "OCLOSURE", far from the StreamTag values of
/// rng.hpp (1..7), so these streams never meet the simulation's. The second key says what
/// is drawn, the third which one (parameter or token id).
inline constexpr std::uint64_t kOClosureTag = 0x4F434C4F53555245ULL;
inline constexpr std::uint64_t kWeightsKey = 1;    ///< host weights (index b * 256 + k)
inline constexpr std::uint64_t kCarriersKey = 2;   ///< ablation carriers (index: token id)
inline constexpr std::uint64_t kSignalsKey = 3;    ///< ablation signals (index: token id)
inline constexpr std::uint64_t kPrecisionKey = 4;  ///< precision-table W_q, W_k, W_v (index: which * 2^32 + row)
inline constexpr std::uint64_t kPrecisionCarriersKey = 5;  ///< precision carriers (token id)

/// n rows of dim i.i.d. N(0, scale^2) numbers, row i from RandomStream(seed, kOClosureTag,
/// key, first_id + i): a token's row depends on its id only.
Rows<double> random_rows(std::size_t n, std::size_t dim, std::uint64_t seed, std::uint64_t key,
                         std::uint64_t first_id = 0, double scale = 1.0);

}  // namespace mfattn::oclosure
