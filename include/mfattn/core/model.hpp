#pragma once
/// \file model.hpp
/// The physical description of a run as plain data (docs/model.md sections 1-2).
///
/// For a receiver i and a source j (active token or frozen prefix token):
///   s_ij = beta * < G_i Q x_i , G_j K x_j >                       score
///   w_ij = m_ij * p_j * c_ij * exp(s_ij)   (times exp(-beta) when rescaled)
///   v_ij = V G_i^T G_j x_j  (transported)  |  V x_j  (plain)
///   USA: u_i = (1/M) sum_j w_ij v_ij,  M = sum_j p_j
///   SA:  u_i = sum_j w_ij v_ij / (eps_den + sum_j w_ij)
///   dx_i/dt = p_i * P_{x_i}(u_i),   P_x y = y - <x, y> x
/// A whole layer (docs/model.md section 2b: heads and a feed-forward term) sums H heads, each
/// the u_i above with its own Q_h, K_h (r x d, scores gauged in the r-dimensional head space)
/// and V_h = O_h A_h, and adds f(x_i) = W2 sigma(W1 x_i + b1) + b2:
///   dx_i/dt = p_i * P_{x_i}( sum_h u_i^(h) + f(x_i) )
/// Nothing here computes: backends (backend.hpp) evaluate a Model.
#include <Eigen/Dense>

#include "mfattn/core/layer_kinds.hpp"
#include "mfattn/core/pair_kinds.hpp"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mfattn {

using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vector = Eigen::VectorXd;

enum class Normalization { Usa, Sa, Sinkhorn };
enum class TimeScale { Natural, Rescaled };
enum class ValueTransport { Transported, Plain };

/// Positional gauge G(xi_i) in SO(d), applied once per token and evaluation, never per pair.
/// The identity gauge is represented by a null pointer in Model.
class Gauge {
 public:
  virtual ~Gauge() = default;
  /// out = G(xi_token) * in   (in, out of length d; may not alias)
  virtual void apply(std::size_t token, const double* in, double* out) const = 0;
  /// out = G(xi_token)^T * in
  virtual void apply_transpose(std::size_t token, const double* in, double* out) const = 0;
  /// The skew d x d generators of G(xi) = exp(sum_a xi_a Omega_a), which the run records in
  /// /particles/tokens/gauge_generators (every gauge answers; {} says there are none to record).
  virtual std::vector<Matrix> recorded_generators() const = 0;
};

/// One head of attention (docs/model.md sections 2 and 2b); a Model's attention is one or more
/// of them (AttentionMatrices::heads), whatever the options that made it:
///   s_ij = beta <G^(r)_i Q_h x_i, G^(r)_j K_h x_j>,   V_h = O_h A_h (d x d, rank <= rv)
///   v_ij = V_h G_i^T G_j x_j (transported)  |  O_h (A_h x_j) (plain: summed in the rv-dimensional
///          value space, then mapped back once per receiver)
/// G^(r) is the gauge for r = d and Model::head_gauge (the gauge's family computed for
/// dimension r) for r < d. The one head of --q, --k, --v is Q_h = Q, K_h = K (r = d), A_h = I and
/// O_h = V_h = V: its values are summed as they are and V is applied once per receiver.
/// Every matrix is held in full; the *_identity flags say which are the identity, so that a
/// backend skips their products (a property it chooses its loops on, as the symmetric loop
/// takes Q_h = K_h = I).
struct AttentionHead {
  Matrix query, key;  ///< Q_h, K_h: r x d
  Matrix value;       ///< A_h: rv x d
  Matrix output;      ///< O_h: d x rv; empty (0 x 0) when rv = d and O_h = I
  Matrix full_value;  ///< V_h = O_h A_h (d x d): what transported values apply
  bool query_identity = false, key_identity = false;
  bool value_identity = false;       ///< A_h = I: the values are the contents themselves
  bool full_value_identity = false;  ///< V_h = I (and O_h = I)
  std::size_t score_dim() const { return std::size_t(query.rows()); }
  std::size_t value_dim() const { return std::size_t(value.rows()); }
};

/// The feed-forward term f(x) = W2 sigma(W1 x + b1) + b2 (W1: W x d, W2: d x W); none when
/// W1 is empty.
struct FeedForward {
  Matrix w1, w2;
  Vector b1, b2;
  Activation activation = Activation::Relu;
  std::size_t width() const { return std::size_t(w1.rows()); }
  bool empty() const { return w1.rows() == 0; }
};

/// The weights of one replica's layer: its heads (at least one; every set of a Model has the
/// same shape) and the feed-forward term (empty: none):
///   dx_i/dt = p_i P_{x_i}( sum_h u_i^(h) + f(x_i) )
struct AttentionMatrices {
  std::vector<AttentionHead> heads;
  FeedForward mlp;
  /// One head and no feed-forward term: the field is that head's u_i alone (backends finish
  /// such a receiver in one step).
  bool single_head() const { return heads.size() == 1 && mlp.empty(); }
};

/// Sinkhorn attention's numbers (docs/model.md section 2d; kNumberOptions binds them): at most
/// `sweeps` sweeps, stopping once the largest column error is at most `tolerance` (0: never
/// early). The run's RunConfig holds them and the Model copies them whole, so that a new
/// number is its field here and its entry in that table.
struct SinkhornParameters {
  std::int64_t sweeps = 100;
  double tolerance = 1e-12;
};

/// The one head of Q = K = V = I in dimension d (the attention of a Model built in code that
/// names no matrices).
AttentionMatrices identity_attention(std::size_t d);
/// The same, made once per d and kept for the process (what Model::matrices_of returns for a
/// Model without matrices).
const AttentionMatrices& identity_attention_of_dimension(std::size_t d);

struct Model {
  std::size_t n = 0;           ///< tokens that move (active ones, null tokens included)
  std::size_t d = 3;           ///< ambient dimension, >= 2
  double beta = 1.0;           ///< inverse temperature, any finite number (< 0: repulsive)
  Normalization normalization = Normalization::Usa;
  TimeScale time_scale = TimeScale::Natural;
  ValueTransport values = ValueTransport::Transported;

  /// The attention in force: one set shared by every replica (--matrices shared), or one per
  /// replica (--matrices per-replica); none means the one head of Q = K = V = I
  /// (identity_attention). A run with --regen-period replaces them at the start of every
  /// layer (Dynamics::matrices_changed).
  std::vector<AttentionMatrices> matrices;
  /// How many distinct sets there are: matrices_of(0), ..., matrices_of(count - 1) are every
  /// one (one when none is named: the identity's).
  std::size_t matrix_set_count() const { return std::max<std::size_t>(matrices.size(), 1); }
  /// The set replica r uses.
  const AttentionMatrices& matrices_of(std::size_t replica) const {
    if (matrices.empty()) return identity_attention_of_dimension(d);
    return matrices.size() == 1 ? matrices.front() : matrices[replica];
  }
  /// True when every set is one head with Q = K = I (the weights are symmetric in i and j).
  bool query_key_identity() const;

  /// presence p_i in [0, 1] of each token (size n); p_i = a_i^2 / (tau + a_i^2).
  std::vector<double> presence;
  double eps_den = 0.0;        ///< SA denominator epsilon, >= 0
  /// Sinkhorn attention's numbers (docs/model.md section 2d), as the options set them.
  SinkhornParameters sinkhorn;
  /// What a receiver's velocity is multiplied by: its presence p_i (false, the particles of
  /// docs/model.md section 2), or 1 whatever its presence (true). The mean-field quadrature
  /// (docs/meanfield.md) sets it: its grid points are sources whose presences are their
  /// masses and receivers that sample the field X[mu], which does not depend on the mass
  /// at the point. Every backend but cuda honours it (cuda refuses such a model).
  bool receivers_at_unit_speed = false;
  /// Per-receiver factors s_i of the velocity (empty: none). --usa-denominator factor-rows sets
  /// s_i = M / D_i, D_i = sum_j m_ij c_ij p_j (0 where D_i = 0), which turns USA's 1/M into each
  /// row's 1/D_i. D_i does not depend on the state, so it is taken once (model builder). The
  /// CUDA backend and the derivatives declare that they take none (capabilities.hpp).
  std::vector<double> receiver_scale;
  /// The factor of receiver i's velocity: p_i (or 1 with receivers_at_unit_speed), times s_i.
  double receiver_speed(std::size_t i) const {
    const double speed = receivers_at_unit_speed ? 1.0 : presence[i];
    return receiver_scale.empty() ? speed : speed * receiver_scale[i];
  }

  /// Positions xi (n rows of k columns, row-major); used by masks, factors and gauges.
  std::size_t position_dim = 1;
  std::vector<double> positions;

  /// The mask, the auxiliary factor and the per-prompt rule (pair_kinds.hpp): the kernels'
  /// parameters, filled once by the model builder and read by every backend as they are.
  /// Per-prompt: a pair that includes a prefix token is visible only when both share a prompt
  /// (active tokens see the active tokens of every prompt); symmetric, so the energy of
  /// section 4 keeps its gradient structure.
  PairTermParameters pair_terms;

  std::shared_ptr<const Gauge> gauge;  ///< null: G = I (tokens 0..n-1, then prefix n..n+P-1)
  /// The score gauge G^(r) of heads of r < d (the same family and frequencies, computed for r;
  /// heads of r = d take `gauge` itself); null: none.
  std::shared_ptr<const Gauge> head_gauge;
  /// The layer's shape as the options set it (kNumberOptions), head_dim resolved to r.
  LayerShape layer;
  /// Where the layer's normalization sits (docs/model.md section 2c; layer_kinds.hpp): post
  /// is the field above; the others take the layer's output F_i on the states or on their
  /// directions, and pre, peri and none leave the states in R^d.
  Placement placement = Placement::Post;
  double ngpt_alpha = 1.0;  ///< alpha of ngpt, > 0
  bool on_sphere() const { return placement_on_sphere(placement); }

  /// Prompts and frozen prefix tokens (docs/model.md sections 1 and 3). Sources are indexed
  /// 0..n-1 (the tokens that move) then n..n+P-1 (prefix token p is source n + p, for the
  /// gauge too). Prefix tokens act as sources for every receiver the masks allow, carry the
  /// presence prefix_weight (> 1 counts a prefix token as several) and never move.
  std::size_t prompts = 1;
  std::vector<int> prompt_id;            ///< g_i of the n tokens, in 0..prompts-1
  std::vector<double> prefix;            ///< P rows of d: the prefix contents y_p (unit)
  std::vector<double> prefix_positions;  ///< P rows of position_dim
  std::vector<int> prefix_prompt_id;     ///< prompt of each prefix token
  double prefix_weight = 1.0;

  double noise_kappa = 0.0;    ///< 0: deterministic; else dx += sqrt(2/kappa) P_x dW
  double common_noise =
      0.0;  ///< 0: none; else dx += sigma P_x(dB x), dB shared by a replica's tokens

  /// Number P of prefix tokens.
  std::size_t prefix_count() const { return d ? prefix.size() / d : 0; }
  /// Mass M = sum of source presences, prefix tokens included (USA normaliser).
  double mass() const;
  /// True when every token has p_i = 1 (no amplitudes, no null tokens).
  bool every_token_present() const;
  /// True when every matrix set is one head whose values are the contents (A_h = I, r = d: the
  /// head of --q, --k, --v) and no feed-forward term: a receiver's field is then its one sum of
  /// values, V_h G_i^T applied once, and the loops that take only such heads apply.
  bool one_head_of_contents() const;
  /// True when the dynamics is a gradient ascent of the energy (docs/model.md section 4).
  bool is_gradient_flow() const;
  /// Weight shift applied in the exponent: beta in rescaled time, 0 in natural time.
  double exponent_shift() const { return time_scale == TimeScale::Rescaled ? beta : 0.0; }
};

/// The one head of --q, --k, --v: Q_h = Q, K_h = K (d x d), A_h = I, O_h = V_h = V, with the
/// identity flags given.
AttentionHead square_head(Matrix q, bool q_identity, Matrix k, bool k_identity, Matrix v, bool v_identity);

/// p = a^2 / (tau + a^2); exactly 0 for a = 0.
double presence_from_amplitude(double amplitude, double tau);

}  // namespace mfattn
