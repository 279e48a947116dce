// The CPU backend: a single pass over the sources per receiver block, no n x n matrix.
// (When the weights are symmetric, Q = K = I with a full or window mask and a factor of
// |xi_i - xi_j| or none, symmetric_pairs.cpp takes the evaluation instead, one exp per
// unordered pair; this one-sided loop is its fallback.)
//
// Per evaluation every token is prepared once (O(n d) memory):
//   query  q_i = beta * G_i Q x_i,   key k_j = G_j K x_j,
//   value  z_j = G_j x_j (transported) | x_j (plain),   bias b_j = log p_j (-inf when p_j = 0)
// The sources are the frozen prefix tokens (padded to a whole tile; they carry the per-prompt
// mask when it is on) followed by the moving tokens. Each receiver gets an offset
// B_i >= max_j (<q_i, k_j> + b_j) from Cauchy-Schwarz,
//   B_i = |q_i| * max_{j: p_j > 0} |k_j| + max(0, max_j b_j),
// so every weight exp(l_ij - B_i), l_ij = <q_i, k_j> + b_j + log(m_ij c_ij), lies in [0, 1]
// and one pass gives
//   S_i = sum_j exp(l_ij - B_i),   A_i = sum_j exp(l_ij - B_i) z_j
// with no running maximum and no rescaling. For Q = K = I the bound is attained (l_ii = B_i).
// When it is loose by more than ~575 (S_i < 1e-250, general Q, K or masks), the receiver is
// recomputed with B_i = max_j l_ij taken exactly, so no weight that matters underflows.
// detail::finish_receiver turns (B_i, S_i, A_i) into the velocity.
//
// The loops take each weight as 2^(t_ij), t_ij = (l_ij - B_i) log2(e), with log2(e) folded
// into the query, the offset and the bias once per receiver (simd::exp2_nonpositive: its
// argument reduction is exact and needs no multiply). Small d (up to 4) keeps lanes over
// sources and the sums A_i in registers, the exp being the bound; larger d runs two
// register-blocked micro-kernels per source tile, like a GEMM: the logits of 6 receivers x
// 32 sources (keys stored in 32-source panels), then A_i += W Z for 6 receivers x 32
// components, each operand load feeding several FMAs.
//
// Determinism: a receiver's sums are taken in one fixed order (sources in order, fixed
// lanes, fixed horizontal reductions), whatever the thread count or its neighbours in a
// block; padding and null sources add exact zeros and are left out of B_i, so appending
// null tokens changes no bit.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend_common.hpp"
#include "backends/cpu/micro_kernels.hpp"
#include "backends/cpu/one_sided_loop.hpp"
#include "backends/cpu/lane_pair_terms.hpp"
#include "backends/cpu/sinkhorn_passes.hpp"
#include "backends/cpu/symmetric_pairs.hpp"
#include "backends/cpu/cpu_kernels.hpp"
#include "backends/cpu/vector_math.hpp"
#include "backends/token_operands.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::cpu {
inline namespace MFATTN_CPU_NAMESPACE {
namespace {

/// At most this many tokens with p_j > 0 take the small-system loop. One thread, d = 3, SA,
/// evaluations per second against the tiled loops (symmetric there): n = 16 3.8x, n = 32
/// 1.9x (one replica) to 2.5x (512), n = 48 1.3x to 1.7x, n = 64 0.92x to 1.2x.
constexpr std::size_t kSmallSystemTokens = 48;
constexpr double kLn2 = 0.69314718055994530942;  // 1 / log2(e): log-weights back to base e

/// MFATTN_CPU_SMALL_SYSTEMS=off keeps small systems on the tiled loops (for tests of those
/// loops at small n, and for comparisons).
bool small_systems_allowed() {
  const char* setting = std::getenv("MFATTN_CPU_SMALL_SYSTEMS");
  return !setting || std::string(setting) != "off";
}

using one_sided::BlockSums;
using one_sided::kLargeSourceTile;
using one_sided::kPanelBlocks;
using one_sided::kSmallSourceTile;

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Model& model, int threads)
      : model_(model), threads_(threads > 0 ? threads : omp_get_max_threads()),
        mass_(model.mass()), all_present_(model.every_token_present()), pair_terms_(model),
        one_head_of_contents_(detail::one_head_of_contents(model)), small_systems_(small_systems_apply(model)),
        symmetric_(!small_systems_ && model.normalization != Normalization::Sinkhorn &&
                           cpu::symmetric_pairs_apply(model)
                       ? std::make_unique<cpu::SymmetricPairs>(model, pair_terms_)
                       : nullptr),
        sinkhorn_passes_(model, pair_terms_, prepared_) {
    if (model.normalization == Normalization::Sinkhorn) {
      // Validation refuses these options first; a model built by hand meets this.
      if (!SinkhornPasses::takes(model))
        throw BackendUnavailable("cpu: Sinkhorn attention takes symmetric masks and nonnegative factors only "
                                 "(no causal mask, no cosine or toeplitz factor)");
      sinkhorn_ = std::make_unique<kernels::SinkhornScaling>(
          kernels::SinkhornTerms{std::size_t(model.sinkhorn.sweeps), model.sinkhorn.tolerance});
    }
    // b_j = log p_j is fixed for the whole run: taken once here, not per evaluation.
    for (double p : model.presence) token_bias_.push_back(kernels::log_presence(p));
    prefix_bias_ = kernels::log_presence(model.prefix_weight);
  }

  std::string name() const override { return "cpu"; }
  ScalingReport last_scaling() const override {
    ScalingReport report;
    // A slot per (replica, head).
    const std::size_t slots_per_replica = model_.matrices_of(0).heads.size();
    if (sinkhorn_) sinkhorn_->report(slots_per_replica, report.column_error, report.sweeps);
    return report;
  }
  std::string describe() const override {
    return "loop " + last_loop_ + " cpu_kernels " + simd::kInstructionSet;
  }

  void evaluate(std::size_t replicas, const double* x, const FieldOutputs& out) override {
    bool fall_back = false;
    std::string failure;
    // Small evaluations run on one thread: waking a team costs more than it saves, and on a
    // busy machine a late thread stalls every step. The symmetric loop's rounds overlap (see
    // symmetric_pairs.hpp), so a team already pays off there at n = 256.
    // Sinkhorn attention takes up to 2 K + 3 passes over the pairs.
    const double passes = sinkhorn_ ? 2.0 * double(model_.sinkhorn.sweeps) + 3.0 : 1.0;
    const double pairs = passes * double(replicas) * double(model_.n) * double(model_.n);
    const int team =
        pairs < (symmetric_ ? kSymmetricPairsPerExtraThread : kPairsPerExtraThread) ? 1 : threads_;
    // The loops' worksharing constructs are orphaned: called outside a parallel region (one
    // thread) they run as a team of one, without the cost of opening a region (at n = 256 its
    // futex calls were a fifth of an evaluation).
    auto on_team = [team](auto&& body) {
      if (team == 1) return body();
#pragma omp parallel num_threads(team)
      body();
    };
    if (small_systems_) {
      on_team([&] { small_systems(replicas, x, out, failure); });
      last_loop_ = "small-systems";
      if (!failure.empty()) throw NumericalError(failure);
      return;
    }
    // Every (replica, head) pair is a slot s = r H + h with operands of its own.
    const std::size_t heads = model_.matrices_of(0).heads.size(), slots = replicas * heads;
    head_operands_.clear();
    for (std::size_t r = 0; r < replicas; ++r)
      for (const AttentionHead& head : model_.matrices_of(r).heads) head_operands_.emplace_back(model_, head);
    if (!one_head_of_contents_) {
      head_outputs_.resize(slots * model_.n * head_operands_.front().operand_dim);
      head_weight_sums_.resize(slots * model_.n);
    }
    on_team([&] {
      prepare(slots, x, heads);
      if (sinkhorn_) scale_sinkhorn();
      if (symmetric_)
        symmetric_->evaluate(prepared_, replicas, x, out, fall_back, failure);
      else
        one_sided(slots, x, out, failure, heads);
      if (!one_head_of_contents_) combine_heads(replicas, x, out);
    });
    last_loop_ = symmetric_ && !fall_back ? "symmetric" : sinkhorn_ ? "sinkhorn" : "one-sided";
    if (fall_back) {
      // The shared offset of the symmetric loop was too loose: every receiver again, each
      // with its own offset (and its exact maximum where that is loose too).
      failure.clear();
      on_team([&] { one_sided(slots, x, out, failure, heads); });
    }
    if (!failure.empty()) throw NumericalError(failure);
    if (sinkhorn_ && one_head_of_contents_ && out.weight_sums)
      for (std::size_t r = 0; r < replicas; ++r)
        for (std::size_t i = 0; i < model_.n; ++i) out.weight_sums[r * model_.n + i] = sinkhorn_weight_sum(r, i);
  }

 private:
  /// Sinkhorn attention (docs/model.md section 2d), called by every thread of the team after
  /// prepare(): every slot's scaling, then its biases and offsets for the one-sided loop, whose
  /// output pass is SA's with them.
  void scale_sinkhorn() {
    sinkhorn_passes_.prepare(*sinkhorn_, token_bias_, prefix_bias_);
    sinkhorn_->run(sinkhorn_passes_);
    sinkhorn_passes_.apply(*sinkhorn_);
  }
  /// SA's weight sum D_i of slot s's unscaled weights (the energy's), from its first row pass.
  double sinkhorn_weight_sum(std::size_t slot, std::size_t i) const {
    return std::exp(sinkhorn_->slots[slot].first_row_lse[i] - model_.exponent_shift());
  }

  /// Whether the small-system loop takes the evaluation: few tokens that weigh (at most
  /// kSmallSystemTokens with p_j > 0, so appending null tokens never changes the loop), d <= 4,
  /// no gauge, full mask, no factor, no prefix tokens: the plain attention of the reference
  /// code's ensembles (thousands of replicas of n = 32 to 256), any Q, K, V per replica.
  static bool small_systems_apply(const Model& model) {
    const auto present = std::count_if(model.presence.begin(), model.presence.end(),
                                       [](double p) { return p > 0.0; });
    return small_systems_allowed() && present <= static_cast<std::ptrdiff_t>(kSmallSystemTokens) &&
           model.d <= kSmallDimension && detail::one_head_of_contents(model) && model.normalization != Normalization::Sinkhorn &&
           !model.gauge && !model.pair_terms.any() && model.prefix_count() == 0;
  }

  /// The small-system loop, called by every thread of a team: whole replicas per thread
  /// (each one's numbers fit L1), no tiles, and lanes over eight receivers at a time, so that
  /// nothing is reduced across lanes. For receivers I (one lane vector) one pass over the
  /// sources j in order: t_Ij = (beta <Q x_i, K x_j> + log p_j) log2(e) - B_I with the
  /// Cauchy-Schwarz offset B_I (as the one-sided loop's, in base 2), S_I = sum_j 2^t_Ij and
  /// A_I = sum_j 2^t_Ij x_j, one term per source in order. A vector with a receiver whose
  /// S_i < 1e-250 (the bound loose by more than ~830 in base 2: general Q, K) is taken again
  /// with the exact maximum per lane (exact_vector). finish_lanes applies V and the
  /// normaliser in lanes. The bits depend neither on the thread count nor on which receivers
  /// share a vector, and null tokens appended add exact +0s at the end of every sum (2^-inf =
  /// +0) and are left out of B_I.
  void small_systems(std::size_t replicas, const double* x, const FieldOutputs& out,
                     std::string& failure) const {
#pragma omp for schedule(static)
    for (std::size_t r = 0; r < replicas; ++r) {
      try {
        switch (model_.d) {
          case 2: small_replica<2>(r, x, out); break;
          case 3: small_replica<3>(r, x, out); break;
          default: small_replica<4>(r, x, out); break;
        }
      } catch (const NumericalError& error) {
#pragma omp critical(mfattn_cpu_failure)
        failure = error.what();
      }
    }
  }

  /// One replica's operands for the small-system loop: keys as rows (kDim per source),
  /// queries (scaled by beta log2(e)) and coordinates transposed (kDim rows of `padded`
  /// receivers), biases log2(e) log p_j, and the largest key norm and bias of the sources
  /// that weigh.
  template <std::size_t kDim>
  struct SmallOperands {
    std::size_t n = 0, padded = 0;
    const double* keys = nullptr;
    const double* queries = nullptr;
    const double* coordinates = nullptr;
    const double* bias = nullptr;
    double largest_key = 0.0, bias_bound = 0.0;
  };

  /// The shifted sums of one receiver vector with the exact maximum of every lane's logits
  /// (two passes: the logits and their maximum M_I, then S_I = sum_j 2^(t_Ij - M_I) and
  /// A_I): for the vectors whose Cauchy-Schwarz offset is too loose. log2_max: M_I (-inf for
  /// a lane that sees no source).
  template <std::size_t kDim>
  static void exact_vector(const SmallOperands<kDim>& o, std::size_t v, const double* x, Lanes& sum,
                           Lanes (&acc)[kDim], Lanes& log2_max) {
    constexpr std::size_t d = kDim;
    thread_local AlignedDoubles logits;
    logits.resize(o.n * kLanes);
    Lanes q[d];
    for (std::size_t c = 0; c < d; ++c) q[c] = simd::load(o.queries + c * o.padded + v * kLanes);
    Lanes largest = simd::broadcast(kNegInf);
    for (std::size_t j = 0; j < o.n; ++j) {
      const double* k = o.keys + j * d;
      Lanes logit = q[0] * k[0] + o.bias[j];
      for (std::size_t c = 1; c < d; ++c) logit += q[c] * k[c];
      simd::store(logits.data() + j * kLanes, logit);
      largest = simd::max(largest, logit);
    }
    // A lane that sees no source (padding) subtracts 0 instead of -inf: its sums are zeros.
    const Lanes shift = simd::select(largest > kNegInf, largest, Lanes{});
    sum = Lanes{};
    for (std::size_t c = 0; c < d; ++c) acc[c] = Lanes{};
    auto add = [&](const Lanes& w, std::size_t j) {
      sum += w;
      const double* z = x + j * d;
      for (std::size_t c = 0; c < d; ++c) acc[c] += w * z[c];
    };
    std::size_t j = 0;
    for (; j + 4 <= o.n; j += 4) {
      Lanes t[4], w[4];
      for (std::size_t g = 0; g < 4; ++g) t[g] = simd::load(logits.data() + (j + g) * kLanes) - shift;
      simd::exp2_nonpositive<4>(t, w);
      for (std::size_t g = 0; g < 4; ++g) add(w[g], j + g);
    }
    for (; j < o.n; ++j) {
      Lanes t[1] = {simd::load(logits.data() + j * kLanes) - shift}, w[1];
      simd::exp2_nonpositive<1>(t, w);
      add(w[0], j);
    }
    log2_max = largest;
  }

  template <std::size_t kDim>
  void small_replica(std::size_t r, const double* x_all, const FieldOutputs& out) const {
    // d as a constant (small_systems dispatches d = 2, 3, 4), so every loop over it unrolls.
    constexpr std::size_t d = kDim;
    const std::size_t n = model_.n, vectors = (n + kLanes - 1) / kLanes;
    const std::size_t padded = vectors * kLanes;
    const double* x = x_all + r * n * d;
    const AttentionMatrices& matrices = model_.matrices_of(r);
    const AttentionHead& head = matrices.heads.front();
    thread_local AlignedDoubles keys, queries, coordinates, bias;
    keys.resize(n * d);
    queries.assign(d * padded, 0.0);
    coordinates.assign(d * padded, 0.0);
    bias.resize(n);
    Scratch scratch;
    double* work = scratch.rows(d);
    // (M y)_a as kernels::gauged_product forms it (kernels::row_product; no gauge here),
    // straight into the operands: a scratch row written and read back per token stalled on
    // store forwarding.
    auto product = [](const Matrix& m, bool identity, const double* y, std::size_t a) {
      return identity ? y[a] : kernels::row_product(m.data() + a * d, y, int(d));
    };
    double largest_key2 = 0.0, largest_bias = kNegInf, largest_query2 = 0.0;
    for (std::size_t j = 0; j < n; ++j) {
      const double* xj = x + j * d;
      double* key = keys.data() + j * d;
      for (std::size_t c = 0; c < d; ++c) {
        key[c] = product(head.key, head.key_identity, xj, c);
        queries[c * padded + j] = model_.beta * product(head.query, head.query_identity, xj, c) * kLog2e;
        coordinates[c * padded + j] = xj[c];
      }
      bias[j] = token_bias_[j] * kLog2e;
      double query2 = 0.0;
      for (std::size_t c = 0; c < d; ++c) query2 += queries[c * padded + j] * queries[c * padded + j];
      largest_query2 = std::max(largest_query2, query2);
      if (token_bias_[j] > kNegInf) {
        double key2 = 0.0;
        for (std::size_t c = 0; c < d; ++c) key2 += key[c] * key[c];
        largest_key2 = std::max(largest_key2, key2);
        largest_bias = std::max(largest_bias, bias[j]);
      }
    }
    const SmallOperands<kDim> o{n, padded, keys.data(), queries.data(), coordinates.data(), bias.data(),
                                std::sqrt(largest_key2), std::max(0.0, largest_bias)};
    // Every t_ij >= -|q_i| |k_j| - B_i >= -2 max_i B_i: with every source weighing (no
    // -inf bias) and that bound above -1020, no exponent can underflow and the exp skips its
    // select (the same bits).
    const double largest_offset = kernels::cauchy_schwarz_offset(largest_query2, o.largest_key, o.bias_bound);
    if (all_present_ && 2.0 * largest_offset < 1020.0)
      receiver_vectors<kDim, false>(r, o, x, matrices, out, work);
    else
      receiver_vectors<kDim, true>(r, o, x, matrices, out, work);
  }

  /// The receiver vectors of small_replica (kMayUnderflow: see simd::exp2_nonpositive).
  template <std::size_t kDim, bool kMayUnderflow>
  void receiver_vectors(std::size_t r, const SmallOperands<kDim>& o, const double* x,
                        const AttentionMatrices& matrices, const FieldOutputs& out, double* work) const {
    constexpr std::size_t d = kDim;
    const std::size_t n = o.n, padded = o.padded, vectors = padded / kLanes;
    const double* keys = o.keys;
    const double* queries = o.queries;
    const double* bias = o.bias;
    for (std::size_t v = 0; v < vectors; ++v) {
      Lanes q[d];
      for (std::size_t c = 0; c < d; ++c) q[c] = simd::load(queries + c * padded + v * kLanes);
      Lanes query2 = q[0] * q[0];
      for (std::size_t c = 1; c < d; ++c) query2 += q[c] * q[c];
      // B_I >= t_Ij for every source: 2^(t - B) in [0, 1] (up to the rounding of t).
      const Lanes offset = kernels::cauchy_schwarz_offset(query2, o.largest_key, o.bias_bound);
      Lanes sum{}, acc[d] = {};
      auto add = [&](const Lanes& w, std::size_t j) {
        sum += w;
        const double* z = x + j * d;
        for (std::size_t c = 0; c < d; ++c) acc[c] += w * z[c];
      };
      auto exponent = [&](std::size_t j) {
        const double* k = keys + j * d;
        Lanes logit = q[0] * k[0] + bias[j];
        for (std::size_t c = 1; c < d; ++c) logit += q[c] * k[c];
        return logit - offset;
      };
      // Four sources' exps in lockstep, then one at a time; the terms enter in order.
      std::size_t j = 0;
      for (; j + 4 <= n; j += 4) {
        Lanes t[4], w[4];
        for (std::size_t g = 0; g < 4; ++g) t[g] = exponent(j + g);
        simd::exp2_nonpositive<4, kMayUnderflow>(t, w);
        for (std::size_t g = 0; g < 4; ++g) add(w[g], j + g);
      }
      for (; j < n; ++j) {
        Lanes t[1] = {exponent(j)}, w[1];
        simd::exp2_nonpositive<1, kMayUnderflow>(t, w);
        add(w[0], j);
      }
      const std::size_t count = std::min(kLanes, n - v * kLanes);
      Lanes log2_max = offset;
      bool loose = false;
      for (std::size_t lane = 0; lane < count; ++lane) loose = loose || !(sum[lane] >= 1e-250);
      if (loose) exact_vector<kDim>(o, v, x, sum, acc, log2_max);
      finish_lanes<kDim>(r, v, count, matrices, o, x, log2_max, sum, acc, out, work);
    }
  }

  /// detail::finish_receiver for the `count` receivers of lane vector v, in lanes (the same
  /// formulas; the kernel's instruction set may fuse multiply-adds that the scalar one
  /// rounds twice). A lane that finish_receiver treats apart (no visible source, p_i = 0, a
  /// scale or USA output that is not finite) is finished by it instead: which lanes those
  /// are depends on each lane's own numbers only, so a receiver's bits do not depend on the
  /// receivers that share its vector (null tokens appended change none).
  template <std::size_t kDim>
  void finish_lanes(std::size_t r, std::size_t v, std::size_t count, const AttentionMatrices& matrices,
                    const SmallOperands<kDim>& o, const double* x, const Lanes& log2_max,
                    const Lanes& sum, const Lanes (&acc)[kDim], const FieldOutputs& out,
                    double* work) const {
    constexpr std::size_t d = kDim;
    const std::size_t n = model_.n, first = v * kLanes;
    const bool usa = model_.normalization == Normalization::Usa;
    const bool needs_scale = out.weight_sums != nullptr || usa || model_.eps_den > 0.0;
    Lanes log_max{}, scale = simd::broadcast(1.0), presence{};
    // The scales exp(log_max - shift) as 2^(M_I - shift log2(e)), eight at once (the
    // exponential is good for exponents in [-1022, 1023]; std::exp takes the others).
    Lanes power{};
    if (needs_scale) {
      const double shift = model_.exponent_shift() * kLog2e;
      Lanes exponent[1] = {}, powers[1];
      for (std::size_t lane = 0; lane < count; ++lane)
        if (log2_max[lane] > kNegInf) exponent[0].set(lane, log2_max[lane] - shift);
      simd::exp2_nonpositive<1>(exponent, powers);
      power = powers[0];
      for (std::size_t lane = 0; lane < count; ++lane)
        if (!(std::fabs(exponent[0][lane]) <= 1000.0)) power.set(lane, kNegInf);  // out of range
    }
    for (std::size_t lane = 0; lane < count; ++lane) {
      const double m = log2_max[lane] > kNegInf ? log2_max[lane] * kLn2 : kNegInf;
      log_max.set(lane, m);
      if (needs_scale && m > kNegInf)
        scale.set(lane, power[lane] >= 0.0 ? power[lane] : detail::receiver_scale(model_, m));
      presence.set(lane, model_.receiver_speed(first + lane));
    }
    // The scalar finish's steps (kernels/receiver_finish.hpp) on lanes: lane-wise +, *, /
    // round as the scalar operations do.
    Lanes u_pre[d];
    kernels::normalized_sums(usa, mass_, model_.eps_den, scale, sum, acc, int(d), u_pre);
    // u = V u_pre (no gauge in this loop), then v_i = p_i (u - <x_i, u> x_i).
    Lanes u[d];
    const AttentionHead& head = matrices.heads.front();
    if (head.full_value_identity) {
      for (std::size_t c = 0; c < d; ++c) u[c] = u_pre[c];
    } else {
      kernels::matrix_product(kernels::RowMajorRows{head.full_value.data(), int(d)}, int(d), u_pre, u);
    }
    Lanes xi[d];
    for (std::size_t c = 0; c < d; ++c) xi[c] = simd::load(o.coordinates + c * o.padded + first);
    Lanes moved[d], output_lanes[d];
    kernels::tangent_velocity(presence, int(d), xi, u, moved, output_lanes);
    const Lanes weight_sums = scale * sum;
    for (std::size_t lane = 0; lane < count; ++lane) {
      const std::size_t i = first + lane;
      double* velocity = out.velocity + (r * n + i) * d;
      double* output = out.attention_output ? out.attention_output + (r * n + i) * d : nullptr;
      bool apart = log_max[lane] == kNegInf || presence[lane] == 0.0 || !std::isfinite(scale[lane]);
      if (usa)
        for (std::size_t c = 0; c < d; ++c) apart = apart || !std::isfinite(u_pre[c][lane]);
      if (apart) {
        double sums[kDim];
        for (std::size_t c = 0; c < d; ++c) sums[c] = acc[c][lane];
        const double weight_sum = detail::finish_receiver(
            model_, matrices, mass_, i, x + i * d, log_max[lane], sum[lane], sums,
            {velocity, output, out.weight_sums != nullptr}, work);
        if (out.weight_sums) out.weight_sums[r * n + i] = weight_sum;
        continue;
      }
      for (std::size_t c = 0; c < d; ++c) velocity[c] = moved[c][lane];
      if (output)
        for (std::size_t c = 0; c < d; ++c) output[c] = output_lanes[c][lane];
      if (out.weight_sums) out.weight_sums[r * n + i] = weight_sums[lane];
    }
  }

  /// The field of sets that are not one head of contents (docs/model.md section 2b), called by
  /// every thread of a team after the one-sided loop has put each (replica, head) slot's
  /// normalized sums u_pre into its rows (operand_dim numbers: O(H n rv) memory, not H n d):
  /// per receiver u_i^(h) = the head's output map of u_pre and
  /// v_i = p_i P_{x_i}(sum_h u_i^(h) + f(x_i)), the heads added in order, so the bits do not
  /// depend on the threads.
  void combine_heads(std::size_t replicas, const double* x, const FieldOutputs& out) {
    const std::size_t n = model_.n, d = model_.d;
    const std::size_t heads = model_.matrices_of(0).heads.size(), slots = replicas * heads;
    const std::size_t width = head_operands_.front().operand_dim;
    if (sinkhorn_) {
#pragma omp for schedule(static)
      for (std::size_t row = 0; row < slots * n; ++row) head_weight_sums_[row] = sinkhorn_weight_sum(row / n, row % n);
    }
#pragma omp for schedule(static)
    for (std::size_t unit = 0; unit < replicas * n; ++unit) {
      const std::size_t r = unit / n, i = unit % n;
      const FeedForward& mlp = model_.matrices_of(r).mlp;
      thread_local std::vector<double> u, u_pre, u_head, hidden;
      u.assign(d, 0.0);
      u_pre.resize(std::max(width, d));
      u_head.resize(d);
      hidden.resize(mlp.width());
      double weight_sum = 0.0;
      for (std::size_t h = 0; h < heads; ++h) {
        const std::size_t slot = r * heads + h, row = slot * n + i;
        std::copy_n(head_outputs_.data() + row * width, width, u_pre.data());
        head_operands_[slot].output(i, u_pre.data(), u_head.data());
        for (std::size_t c = 0; c < d; ++c) u[c] += u_head[c];
        weight_sum += head_weight_sums_[row];
      }
      const double* xi = x + unit * d;
      kernels::add_feed_forward(mlp, xi, hidden.data(), u.data());
      kernels::tangent_velocity(model_.receiver_speed(i), int(d), xi, static_cast<const double*>(u.data()),
                                out.velocity + unit * d,
                                out.attention_output ? out.attention_output + unit * d : nullptr);
      if (out.weight_sums) out.weight_sums[unit] = weight_sum;
    }
  }

  /// Turns one receiver's shifted sums of a layer's head into its normalized sums u_pre
  /// (operand_dim numbers; zeros where the receiver does not move, which every output map
  /// takes to 0); returns D_i of the head (another number where weight_sum_wanted is false
  /// and the finish needs no scale: SA without eps_den skips its exp, as the one head does).
  double finish_head_receiver(const kernels::HeadOperands& head, std::size_t token, double log_max,
                              double weight_sum_shifted, const double* acc, double* u_pre,
                              bool weight_sum_wanted) const {
    kernels::FinishOutcome outcome;
    const kernels::FinishTerms terms = detail::finish_terms(model_, mass_);
    const bool needs_scale = log_max > kNegInf && kernels::finish_needs_scale(terms, weight_sum_wanted);
    const double scale = needs_scale ? detail::receiver_scale(model_, log_max) : 1.0;
    if (!kernels::normalized_receiver_sums(terms, model_.receiver_speed(token),
                                           int(head.operand_dim), log_max, scale, weight_sum_shifted, acc, u_pre,
                                           outcome)) {
      if (outcome.overflow) throw NumericalError(detail::usa_overflow_message(model_, outcome.log_scale));
      std::fill(u_pre, u_pre + head.operand_dim, 0.0);
    }
    return outcome.weight_sum;
  }

  /// The one-sided loop, called by every thread of a team: panels of receivers walk every
  /// source. Panels of every (replica, head) slot (heads_per_replica H a replica): slot s
  /// reads replica s / H's contents; a set of one head of contents finishes each receiver's
  /// velocity at once, any other slot its normalized sums into its own rows (combine_heads).
  void one_sided(std::size_t slots, const double* x, const FieldOutputs& out, std::string& failure,
                 std::size_t heads_per_replica) {
    const std::size_t n = model_.n;
    const std::size_t panel = kPanelBlocks * block_size(head_operands_.front().operand_dim);
    const std::size_t panels_per_replica = (n + panel - 1) / panel;
    const std::size_t total_panels = slots * panels_per_replica;
#pragma omp for schedule(dynamic, 1)
    for (std::size_t unit = 0; unit < total_panels; ++unit) {
      const std::size_t slot = unit / panels_per_replica, r = slot / heads_per_replica;
      const std::size_t first = (unit % panels_per_replica) * panel;
      try {
        const std::size_t replica_start = r * n * model_.d;
        run_panel(slot, r, first, std::min(panel, n - first), x + replica_start, out.velocity + replica_start,
                  out.attention_output ? out.attention_output + replica_start : nullptr,
                  out.weight_sums ? out.weight_sums + r * n : nullptr, head_operands_[slot]);
      } catch (const NumericalError& error) {
#pragma omp critical(mfattn_cpu_failure)
        failure = error.what();
      }
    }
  }

  /// Sizes and the parts fixed for the run (padding, bias), once per replica: later
  /// evaluations overwrite the token entries only, so no array is cleared or reallocated.
  void prepare_layout(Prepared& p, std::size_t d) const {
    const std::size_t n = model_.n;
    if (p.d == d && p.queries.size() == n * d) return;
    p.d = d;
    p.first_moving = cpu::PairTerms::prefix_region(model_);
    p.padded_sources = cpu::PairTerms::padded_sources(model_);
    p.padded_dim = round_up(d, kLanes);
    p.bias_free_begin = p.first_moving;
    // Sinkhorn attention rewrites every bias per evaluation (log p_j + g_j).
    p.bias_free_end = all_present_ && !sinkhorn_ ? p.first_moving + n / kLanes * kLanes : p.first_moving;
    p.source_stride = p.padded_sources + kLanes;
    p.row_stride = p.padded_dim + kLanes;
    p.queries.assign(n * d, 0.0);
    p.offsets.assign(n, 0.0);
    p.key_panels.assign(d * p.padded_sources, 0.0);
    p.bias.assign(p.padded_sources, kNegInf);
    for (std::size_t q = 0; q < model_.prefix_count(); ++q) p.bias[q] = prefix_bias_;
    for (std::size_t j = 0; j < n; ++j) p.bias[p.first_moving + j] = token_bias_[j];
    p.bias_log2.resize(p.padded_sources);
    for (std::size_t j = 0; j < p.padded_sources; ++j) p.bias_log2[j] = p.bias[j] * kLog2e;
    if (d <= kSmallDimension)
      p.values_t.assign(d * p.source_stride, 0.0);
    else
      p.values_rows.assign(p.padded_sources * p.row_stride, 0.0);
  }

  /// Called by every thread of the team: queries, keys and values of every slot's tokens
  /// (spread over the threads), then the offsets B_i. The largest key and bias are maxima,
  /// the same whichever thread sees which token. Slot s is head s mod H of replica s / H
  /// (H = heads_per_replica), its operands head_operands_[s] (operand_dim numbers each).
  void prepare(std::size_t slots, const double* x, std::size_t heads_per_replica) {
    const std::size_t n = model_.n, d = head_operands_.front().operand_dim, content_dim = model_.d;
#pragma omp single
    {
      prepared_.resize(slots);
      largest_key_.assign(slots, 0.0);
      largest_bias_.assign(slots, 0.0);
      for (std::size_t r = 0; r < slots; ++r) {
        prepare_layout(prepared_[r], d);
        std::vector<double> products(std::max<std::size_t>(head_operands_[r].product_count, 1));
        for (std::size_t q = 0; q < model_.prefix_count(); ++q) {
          const double* y = model_.prefix.data() + q * content_dim;
          head_operands_[r].products(y, products.data());
          add_source(prepared_[r], q, n + q, y, largest_key_[r], largest_bias_[r], head_operands_[r],
                     products.data());
        }
      }
    }
    std::vector<double> key(slots, 0.0), bias(slots, 0.0);
#pragma omp for schedule(static) nowait
    for (std::size_t unit = 0; unit < slots * n; ++unit) {
      const std::size_t r = unit / n, i = unit % n;
      Prepared& p = prepared_[r];
      const double* xi = x + ((r / heads_per_replica) * n + i) * content_dim;
      Scratch scratch;
      double* work = scratch.rows(d);
      const kernels::HeadOperands& head = head_operands_[r];
      thread_local std::vector<double> products;
      // Q_h x, K_h x, A_h x together (those that are not the identity), read by the query here
      // and the key and value below.
      products.resize(std::max<std::size_t>(head.product_count, 1));
      head.products(xi, products.data());
      head.query(i, xi, products.data(), work + d, work);
      for (std::size_t c = 0; c < d; ++c) p.queries[i * d + c] = model_.beta * work[c];
      add_source(p, p.first_moving + i, i, xi, key[r], bias[r], head, products.data());
    }
#pragma omp critical(mfattn_cpu_prepare)
    for (std::size_t r = 0; r < slots; ++r) {
      largest_key_[r] = std::max(largest_key_[r], key[r]);
      largest_bias_[r] = std::max(largest_bias_[r], bias[r]);
    }
#pragma omp barrier
    // The largest key norm from the largest squared norm: sqrt is monotone and correctly
    // rounded, so this is the largest of the norms (one root per replica, not per token).
#pragma omp single
    for (double& largest : largest_key_) largest = std::sqrt(largest);
#pragma omp for schedule(static)
    for (std::size_t unit = 0; unit < slots * n; ++unit) {
      const std::size_t r = unit / n, i = unit % n;
      Prepared& p = prepared_[r];
      double query_norm2 = 0.0;
      for (std::size_t c = 0; c < d; ++c) query_norm2 += p.queries[i * d + c] * p.queries[i * d + c];
      p.offsets[i] = kernels::cauchy_schwarz_offset(query_norm2, largest_key_[r], largest_bias_[r]);
    }
#pragma omp single
    for (Prepared& p : prepared_) {
      const double largest_offset = n ? *std::max_element(p.offsets.begin(), p.offsets.end()) : 0.0;
      p.logits_above_underflow = 2.0 * largest_offset * kLog2e < 1020.0;
    }
  }


  /// Source s of p holds gauge token `token` with contents y: its key, value, and its share
  /// of the largest squared key norm and bias; products holds the head's products of y
  /// (HeadOperands::products). Null sources stay out of the bound, so that adding them
  /// changes no offset.
  void add_source(Prepared& p, std::size_t s, std::size_t token, const double* y, double& largest_key_norm2,
                  double& largest_bias, const kernels::HeadOperands& head, const double* products) const {
    const std::size_t d = p.d;
    Scratch scratch;
    double* out = scratch.rows(d);
    const double* key = out;
    head.key(token, y, products, out + d, out);
    double key_norm2 = 0.0;
    double* panel = p.key_panels.data() + p.key_index(0, s);
    for (std::size_t c = 0; c < d; ++c) {
      panel[c * kKeyPanel] = key[c];
      key_norm2 += key[c] * key[c];
    }
    const double* z = out;
    head.value(token, y, products, out);
    if (d <= kSmallDimension)
      for (std::size_t c = 0; c < d; ++c) p.values_t[c * p.source_stride + s] = z[c];
    else
      std::copy(z, z + d, p.values_rows.data() + s * p.row_stride);
    if (p.bias[s] > kNegInf) {
      largest_key_norm2 = std::max(largest_key_norm2, key_norm2);
      largest_bias = std::max(largest_bias, p.bias[s]);
    }
  }

  static std::size_t block_size(std::size_t d) {
    return d <= kSmallDimension ? kSmallBlock : kLargeBlock;
  }

  void run_panel(std::size_t slot, std::size_t replica, std::size_t first, std::size_t receivers_in_panel,
                 const double* x, double* velocity, double* attention_output, double* weight_sums,
                 const kernels::HeadOperands& head) {
    const Prepared& p = prepared_[slot];
    const std::size_t size = block_size(p.d);
    const std::size_t blocks = (receivers_in_panel + size - 1) / size;
    const std::size_t acc_stride = std::max(p.padded_dim, kSmallDimension);
    thread_local std::vector<BlockSums> panel;
    thread_local std::vector<double> acc_rows;
    panel.resize(kPanelBlocks);
    acc_rows.resize(kPanelBlocks * size * acc_stride);
    for (std::size_t b = 0; b < blocks; ++b) {
      BlockSums& block = panel[b];
      const std::size_t start = first + b * size;
      block.size = size;
      block.count = std::min(size, first + receivers_in_panel - start);
      for (std::size_t r = 0; r < size; ++r) {
        block.receivers[r] = start + std::min(r, block.count - 1);
        block.offset[r] = p.offsets[block.receivers[r]];
      }
      block.acc = acc_rows.data() + b * size * acc_stride;
      block.acc_stride = acc_stride;
      block.reset();
    }
    const std::size_t tile = p.d <= kSmallDimension ? kSmallSourceTile : kLargeSourceTile;
    // One translation unit per auxiliary factor holds the loop (one_sided_loop.hpp).
    pair_terms_.visit_factor([&](const auto& factor) {
      one_sided::sweep_panel_with(pair_terms_, factor, p, panel.data(), blocks, tile);
    });
    if (!one_head_of_contents_) {
      // u_pre into the slot's rows (combine_heads maps them back and adds them).
      for (std::size_t b = 0; b < blocks; ++b)
        for (std::size_t r = 0; r < panel[b].count; ++r) {
          const BlockSums& block = panel[b];
          const std::size_t i = block.receivers[r], row = slot * model_.n + i;
          head_weight_sums_[row] =
              finish_head_receiver(head, i, block.offset[r], block.weight_sum[r], block.acc + r * block.acc_stride,
                                   head_outputs_.data() + row * head.operand_dim, weight_sums != nullptr);
        }
      return;
    }
    Scratch scratch;
    double* work = scratch.rows(model_.d);
    const AttentionMatrices& matrices = model_.matrices_of(replica);
    for (std::size_t b = 0; b < blocks; ++b) {
      const BlockSums& block = panel[b];
      for (std::size_t r = 0; r < block.count; ++r) {
        const std::size_t i = block.receivers[r];
        const double sum = detail::finish_receiver(
            model_, matrices, mass_, i, x + i * model_.d, block.offset[r], block.weight_sum[r],
            block.acc + r * block.acc_stride,
            {velocity + i * model_.d, attention_output ? attention_output + i * model_.d : nullptr,
             weight_sums != nullptr},
            work);
        if (weight_sums) weight_sums[i] = sum;
      }
    }
  }

  const Model& model_;
  int threads_;
  double mass_;
  bool all_present_;                // every p_j = 1
  std::vector<double> token_bias_;  // log p_j of the moving tokens (-inf for p_j = 0)
  double prefix_bias_ = 0.0;        // log of the prefix weight
  cpu::PairTerms pair_terms_;
  bool one_head_of_contents_;  // every set one head of contents: receivers finish at once
  bool small_systems_;  // the small-system loop takes every evaluation (small_systems_apply)
  std::unique_ptr<cpu::SymmetricPairs> symmetric_;  // null: the symmetric loop does not apply
  std::string last_loop_ = "none";
  std::vector<Prepared> prepared_;
  // Per replica, while preparing (largest_key_ holds the squared norm until its one root).
  std::vector<double> largest_key_, largest_bias_;
  // The slots (replica r, head h at r H + h): each head's operands, and where the set is not
  // one head of contents its normalized sums u_pre (n rows of operand_dim a slot) and D_i^(h)
  // (n a slot).
  std::vector<kernels::HeadOperands> head_operands_;
  std::vector<double> head_outputs_, head_weight_sums_;
  // Sinkhorn attention: the passes over prepared_ and every slot's scaling (null: SA or USA).
  SinkhornPasses sinkhorn_passes_;
  std::unique_ptr<kernels::SinkhornScaling> sinkhorn_;
};

}  // namespace

std::unique_ptr<Backend> make_backend(const Model& model, int threads) {
  return std::make_unique<CpuBackend>(model, threads);
}

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
