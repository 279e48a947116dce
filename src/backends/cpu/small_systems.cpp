// The small-system loop (small_systems.hpp). For receivers I (one lane vector) one pass over
// the sources j in order:
//   t_Ij = (beta <Q x_i, K x_j> + log p_j) log2(e) - B_I,   S_I = sum_j 2^t_Ij,   A_I = sum_j 2^t_Ij x_j
// with the Cauchy-Schwarz offset B_I (as the one-sided loop's, in base 2), one term per source
// in order; then detail::finish_receiver's formulas in lanes.
#include "backends/cpu/small_systems.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "backends/backend_common.hpp"
#include "backends/cpu/micro_kernels.hpp"
#include "backends/cpu/vector_math.hpp"

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

class SmallSystems {
 public:
  SmallSystems(const Model& model, const SourceBiases& biases, double mass)
      : model_(model), biases_(biases), mass_(mass) {}

  /// Whether the small-system loop takes the evaluation: few tokens that weigh (at most
  /// kSmallSystemTokens with p_j > 0, so appending null tokens never changes the loop), d <= 4,
  /// no gauge, full mask, no factor, no prefix tokens: the plain attention of the reference
  /// code's ensembles (thousands of replicas of n = 32 to 256), any Q, K, V per replica.
  static bool apply(const Model& model) {
    const auto present = std::count_if(model.presence.begin(), model.presence.end(),
                                       [](double p) { return p > 0.0; });
    return small_systems_allowed() && present <= static_cast<std::ptrdiff_t>(kSmallSystemTokens) &&
           model.d <= kSmallDimension && model.one_head_of_contents() && model.normalization != Normalization::Sinkhorn &&
           !model.gauge && !model.pair_terms.any() && model.prefix_count() == 0;
  }

  /// The small-system loop, called by every thread of a team: whole replicas per thread
  /// (each one's numbers fit L1), no tiles, and lanes over eight receivers at a time, so that
  /// nothing is reduced across lanes. For receivers I (one lane vector) one pass over the
  /// sources j in order: t_Ij = (beta <Q x_i, K x_j> + log p_j) log2(e) - B_I with the
  /// Cauchy-Schwarz offset B_I (as the one-sided loop's, in base 2), S_I = sum_j 2^t_Ij and
  /// A_I = sum_j 2^t_Ij x_j, one term per source in order. A vector with a receiver whose
  /// S_i < 1e-250 (the bound loose by more than ~830 in base 2: general Q, K) is taken again
  /// with the exact maximum per lane (vector_max, then vector_sums again). finish_lanes applies V and the
  /// normaliser in lanes. The bits depend neither on the thread count nor on which receivers
  /// share a vector, and null tokens appended add exact +0s at the end of every sum (2^-inf =
  /// +0) and are left out of B_I.
  void run(std::size_t replicas, const double* x, const FieldOutputs& out,
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

  /// The logit t_Ij + B_I = beta <Q x_i, K x_j> log2(e) + log2(e) log p_j of source j for
  /// the receivers of q (one lane vector): the one expression the maximum and the sums read.
  template <std::size_t kDim>
  MFATTN_SIMD_INLINE static Lanes vector_logit(const SmallOperands<kDim>& o, const Lanes (&q)[kDim],
                                               std::size_t j) {
    const double* k = o.keys + j * kDim;
    Lanes logit = q[0] * k[0] + o.bias[j];
    for (std::size_t c = 1; c < kDim; ++c) logit += q[c] * k[c];
    return logit;
  }

  /// The small system's pair loop, for the receivers of q with their offsets (any B_I with
  /// B_I >= t_Ij + B_I up to rounding): S_I = sum_j 2^(logit_Ij - B_I), A_I = sum_j
  /// 2^(logit_Ij - B_I) x_j, four sources' exps in lockstep, then one at a time; the terms
  /// enter in order (kMayUnderflow: see simd::exp2_nonpositive).
  template <std::size_t kDim, bool kMayUnderflow>
  static void vector_sums(const SmallOperands<kDim>& o, const Lanes (&q)[kDim], const Lanes& offset,
                          const double* x, Lanes& sum, Lanes (&acc)[kDim]) {
    constexpr std::size_t d = kDim;
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
      for (std::size_t g = 0; g < 4; ++g) t[g] = vector_logit(o, q, j + g) - offset;
      simd::exp2_nonpositive<4, kMayUnderflow>(t, w);
      for (std::size_t g = 0; g < 4; ++g) add(w[g], j + g);
    }
    for (; j < o.n; ++j) {
      Lanes t[1] = {vector_logit(o, q, j) - offset}, w[1];
      simd::exp2_nonpositive<1, kMayUnderflow>(t, w);
      add(w[0], j);
    }
  }

  /// The exact maximum M_I of every lane's logits (-inf for a lane that sees no source): the
  /// offsets of a vector whose Cauchy-Schwarz offset was too loose.
  template <std::size_t kDim>
  static Lanes vector_max(const SmallOperands<kDim>& o, const Lanes (&q)[kDim]) {
    Lanes largest = simd::broadcast(kNegInf);
    for (std::size_t j = 0; j < o.n; ++j) largest = simd::max(largest, vector_logit(o, q, j));
    return largest;
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
    // (M y)_a as host::gauged_product forms it (kernels::row_product; no gauge here),
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
      bias[j] = biases_.tokens[j] * kLog2e;
      double query2 = 0.0;
      for (std::size_t c = 0; c < d; ++c) query2 += queries[c * padded + j] * queries[c * padded + j];
      largest_query2 = std::max(largest_query2, query2);
      if (biases_.tokens[j] > kNegInf) {
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
    if (biases_.all_present && 2.0 * largest_offset < 1020.0)
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
    const double* queries = o.queries;
    for (std::size_t v = 0; v < vectors; ++v) {
      Lanes q[d];
      for (std::size_t c = 0; c < d; ++c) q[c] = simd::load(queries + c * padded + v * kLanes);
      Lanes query2 = q[0] * q[0];
      for (std::size_t c = 1; c < d; ++c) query2 += q[c] * q[c];
      // B_I >= t_Ij for every source: 2^(t - B) in [0, 1] (up to the rounding of t).
      const Lanes offset = kernels::cauchy_schwarz_offset(query2, o.largest_key, o.bias_bound);
      Lanes sum, acc[d];
      vector_sums<kDim, kMayUnderflow>(o, q, offset, x, sum, acc);
      const std::size_t count = std::min(kLanes, n - v * kLanes);
      Lanes log2_max = offset;
      bool loose = false;
      for (std::size_t lane = 0; lane < count; ++lane) loose = loose || !(sum[lane] >= 1e-250);
      if (loose) {
        // The sums again from each lane's exact maximum (a lane that sees no source, padding,
        // subtracts 0 instead of -inf: its sums are zeros).
        log2_max = vector_max(o, q);
        vector_sums<kDim, true>(o, q, simd::select(log2_max > kNegInf, log2_max, Lanes{}), x, sum, acc);
      }
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

 private:
  const Model& model_;
  const SourceBiases& biases_;
  double mass_;
};

}  // namespace

bool small_systems_apply(const Model& model) { return SmallSystems::apply(model); }

void evaluate_small_systems(const Model& model, const SourceBiases& biases, double mass, std::size_t replicas,
                            const double* x, const FieldOutputs& out, std::string& failure) {
  SmallSystems(model, biases, mass).run(replicas, x, out, failure);
}

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
