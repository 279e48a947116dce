#pragma once
/// \file oattention.hpp
/// OAttention, the support-coupled attention of seeds 000/001 (docs/oattention.md).
///
/// Every token carries a carrier h_i in R^D (not restricted to the sphere) and its presence
///   p_i = |h_i|^2 / (tau + |h_i|^2)                       (tau > 0; exactly 0 iff h_i = 0)
/// Queries, keys and values are q_i = W_q h_i, k_j = W_k h_j (D_head x D) and v_j = W_v h_j
/// (D_value x D), and with a visibility mask m_ij in {0, 1}
///   s_ij = c <q_i, k_j> - o,   c = 1 / sqrt(D_head) unless given, o = 0 unless given
///   OAttention_i(H; m) = p_i * sum_j m_ij p_j e^{s_ij} v_j / (eps_den + sum_j m_ij p_j e^{s_ij})
///
/// Properties (tests/unit/test_oattention.cpp):
///   null receiver    p_i = 0  =>  OAttention_i = 0 exactly (+0.0; the row is not evaluated)
///   null source      p_j = 0  =>  j is skipped: inserting it changes no bit of any other row
///   empty support    no visible source with p_j > 0  =>  OAttention_i = 0 (not 0/0), for
///                    every eps_den >= 0
///
/// Evaluation (why it is stable): per receiver the log-weights l_ij = s_ij + log p_j of the
/// visible sources with p_j > 0 are computed once into a row buffer while their maximum L_i
/// is kept (a running maximum over the row); then S_i = sum_j e^{l_ij - L_i} and
/// A_i = sum_j e^{l_ij - L_i} v_j, every weight in [0, 1] and the largest exactly 1, so
/// nothing overflows or underflows wholesale, and no weight is rescaled after it was added
/// (an online maximum would rescale the sums each time the maximum grows, one rounding per
/// rescale). eps_den is compared with the true-scale sum, as detail::finish_receiver does:
///   OAttention_i = p_i A_i / (S_i + eps_den e^{-L_i}).
/// The sources of a row are summed in index order, so the result of one receiver does not
/// depend on how many other tokens exist.
///
/// Precision: T = double and float compute in T; T = Eigen::half and Eigen::bfloat16 are
/// storage formats: inputs are read in T and every operation (projections, scores,
/// exponentials, sums) is done in float (accumulator_t<T>). Workspace is allocated once
/// per call (O((receivers + sources) D) plus one row of logits), never per pair.
///
/// Link to the particle dynamics (docs/model.md section 2): on the sphere, with the presence
/// taken from the amplitude a_i (carrier h_i = a_i x_i, |x_i| = 1, so |h_i|^2 = a_i^2 and
/// p_i = a_i^2 / (tau + a_i^2), docs/model.md's rule) and queries, keys and values taken from the
/// direction x_i (q_i = G_i Q x_i, k_j = G_j K x_j, values z_j = G_j x_j, c = beta,
/// o = beta in rescaled time and 0 in natural time, D_head = D = d), the SA kernel is
///   u_i = sum_j w_ij v_ij / (eps_den + sum_j w_ij) = V G_i^T OAttention_i / p_i   (p_i > 0)
/// so the particle velocity is
///   dx_i/dt = p_i P_{x_i}(u_i) = P_{x_i}(V G_i^T OAttention_i),   P_x y = y - <x, y> x,
/// with the same eps_den (OAttention already carries the receiver factor p_i; a null
/// receiver has velocity 0 on both sides). With plain values z_j = x_j and G_i^T is
/// dropped; with Q = K = V = I and no gauge, dx_i/dt = P_{x_i}(OAttention_i(X)).
/// See sa_velocity_via_oattention.
#include <Eigen/Core>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "mfattn/core/capabilities.hpp"
#include "mfattn/core/model.hpp"

namespace mfattn::oattn {

/// The type every operation is done in: T itself, float for the 16-bit storage formats.
template <class T>
struct Accumulator {
  using type = T;
};
template <>
struct Accumulator<Eigen::half> {
  using type = float;
};
template <>
struct Accumulator<Eigen::bfloat16> {
  using type = float;
};
template <class T>
using accumulator_t = typename Accumulator<T>::type;

/// Tokens as rows (n x D, row-major), the layout of State and of every function here.
template <class T>
using Rows = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// The visibility mask m_ij (receiver i, source j).
class Visibility {
 public:
  enum class Kind { Full, Causal, Dense };
  /// m_ij = 1.
  static Visibility full() { return Visibility(Kind::Full); }
  /// m_ij = [j <= i]: receivers and sources index the same sequence.
  static Visibility causal() { return Visibility(Kind::Causal); }
  /// m_ij = m[i * sources + j] != 0 (receivers x sources, row-major).
  static Visibility dense(std::size_t receivers, std::size_t sources, std::vector<std::uint8_t> m);

  Kind kind() const { return kind_; }
  bool operator()(std::size_t i, std::size_t j) const {
    switch (kind_) {
      case Kind::Full:
        return true;
      case Kind::Causal:
        return j <= i;
      case Kind::Dense:
        return dense_[i * sources_ + j] != 0;
    }
    return true;
  }
  /// Throws std::invalid_argument when a dense mask does not have this shape.
  void check_shape(std::size_t receivers, std::size_t sources) const;

 private:
  explicit Visibility(Kind kind) : kind_(kind) {}
  Kind kind_;
  std::size_t receivers_ = 0, sources_ = 0;
  std::vector<std::uint8_t> dense_;
};

/// Parameters of OAttention (see the file comment for the formula).
struct OAttentionOptions {
  double tau = 1.0;           ///< presence scale (carrier form only), > 0
  double eps_den = 1e-12;     ///< >= 0; mfattn's default with presence weights
  /// c; unset means 1 / sqrt(D_head), the scaled dot product of the seeds ("standard
  /// scaled dot-product score"). The particle link sets beta.
  std::optional<double> score_scale;
  double score_offset = 0.0;  ///< o; equivalent to eps_den e^{o} with o = 0
};

/// The scale actually used: c, or 1 / sqrt(d_head) when c is unset.
double effective_score_scale(const OAttentionOptions& options, std::size_t d_head);

/// p = |h|^2 / (tau + |h|^2) of one carrier of length d, computed in accumulator_t<T>
/// (squares summed in index order).
template <class T>
accumulator_t<T> presence(const T* h, std::size_t d, double tau);

/// Projected inputs of the kernel. q: receivers x d_head, k: sources x d_head,
/// v: sources x d_value (row-major), presences in the accumulator type.
template <class T>
struct QkvView {
  std::size_t receivers = 0, sources = 0, d_head = 0, d_value = 0;
  const T* q = nullptr;
  const T* k = nullptr;
  const T* v = nullptr;
  const accumulator_t<T>* p_receiver = nullptr;
  const accumulator_t<T>* p_source = nullptr;
};

/// The kernel: OAttention from given queries, keys, values and presences (tau unused).
/// out: receivers x d_value in accumulator_t<T>. Instantiated for double, float,
/// Eigen::half, Eigen::bfloat16.
template <class T>
void oattention_qkv(const QkvView<T>& in, const Visibility& mask, const OAttentionOptions& options,
                    accumulator_t<T>* out);

/// The weights of one attention: W_q, W_k (D_head x D), W_v (D_value x D).
template <class T>
struct AttentionWeights {
  Rows<T> w_q, w_k, w_v;
};

/// y_i = W h_i for every row, in accumulator_t<T>, each entry summed in index order
/// (per token, so a token's projection never depends on the other tokens).
template <class T>
Rows<accumulator_t<T>> project(const Rows<T>& h, const Rows<T>& w);

/// OAttention of carriers h (n x D): presences from h, projections in accumulator_t<T>,
/// then oattention_qkv. Returns n x D_value.
template <class T>
Rows<accumulator_t<T>> oattention(const Rows<T>& h, const AttentionWeights<T>& weights,
                                  const Visibility& mask = Visibility::full(),
                                  const OAttentionOptions& options = {});

/// Standard scaled dot-product softmax attention, for comparison (no presence):
///   Attn_i = sum_j m_ij e^{s_ij} v_j / sum_j m_ij e^{s_ij},  s_ij = c <q_i, k_j>
/// (maximum-shifted; 0 for a row that sees no source). A zero carrier is NOT inert here:
/// as a receiver (q_i = 0) it gets the plain average of the visible values, and as a source
/// (k_j = v_j = 0) it adds e^0 = 1 to every denominator. Instantiated for double and float.
template <class T>
Rows<T> softmax_attention(const Rows<T>& h, const AttentionWeights<T>& weights,
                          const Visibility& mask = Visibility::full(),
                          std::optional<double> score_scale = std::nullopt);

/// The literal formula, pair by pair in A, without any shift: the test oracle in double
/// (it overflows for scores above ~709 in double, ~88 in float, which the callers avoid).
/// Instantiated for double and float.
template <class A>
void oattention_direct(const QkvView<A>& in, const Visibility& mask, const OAttentionOptions& options,
                       A* out);

/// What the OAttention link takes of a model (capabilities.hpp): SA (USA has no denominator,
/// Sinkhorn scales its columns too), no auxiliary factor, the one head of Q, K, V.
inline constexpr Normalization kOAttentionKernels[] = {Normalization::Sa};
inline constexpr AuxFactor kOAttentionFactors[] = {AuxFactor::None};
inline constexpr Capabilities kOAttentionTakes{
    .kernels = kOAttentionKernels, .factors = kOAttentionFactors, .whole_layers = false};


/// The particle link: the velocity v_i = P_{x_i}(V R_i OAttention_i) of every token of one
/// replica (x: n x d), OAttention taken with q_i = G_i Q x_i, k_j = G_j K x_j, values
/// z_j = G_j x_j and R_i = G_i^T (transported values) or z_j = x_j and R_i = I (plain
/// values; V is linear, so it is applied once to the output), the model's
/// presences (prefix tokens as sources of presence prefix_weight), m_ij from the model's
/// masks, c = beta, o = exponent_shift() and the model's eps_den. Equals the SA velocity
/// p_i P_{x_i}(u_i) of docs/model.md section 2 up to rounding. Throws std::invalid_argument for
/// USA (no denominator: not OAttention) and for auxiliary factors (not part of OAttention).
/// x: one replica's n rows; replica says whose matrices (Model::matrices_of) it takes.
void sa_velocity_via_oattention(const Model& model, const double* x, double* velocity,
                                std::size_t replica = 0);

}  // namespace mfattn::oattn
