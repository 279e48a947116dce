#pragma once
// The two passes of Sinkhorn attention's scaling (backends/sinkhorn_scaling.hpp) on the CPU
// backend's prepared operands, in lanes, O(n) memory: the weights are recomputed every pass,
// never stored. For a slot (a replica's or a head's matrix) with queries q_i (beta applied),
// keys k_j in their panels and the pair terms' log-terms t_ij:
//   rows     L_i = LSE_j (<q_i, k_j> + t_ij + row_bias_j)     lanes over sources j
//   columns  C_j = LSE_i (f_i + <q_i, k_j> + t_ij)            lanes over receivers i
// Each log-sum-exp is one pass summing exp(l - B) in lanes from a Cauchy-Schwarz bound B of
// the line's logits (the one-sided loop's offset, with the line's largest bias), recomputing
// the line from its exact maximum only where B is loose by more than ~575: one exp per pair
// and pass, the same bits for any thread count. The columns read the queries transposed (d rows
// of the padded receivers), and the pair terms with the roles of the pair exchanged: source
// j's labels as the scalar side, the receivers' as lanes. That is the same term because
// Sinkhorn attention takes symmetric masks and factors only (validated: no causal mask, no
// sign-changing factor; checked again here).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "backends/cpu/lane_pair_terms.hpp"
#include "backends/cpu/micro_kernels.hpp"
#include "backends/cpu/vector_math.hpp"
#include "backends/sinkhorn_scaling.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::cpu {
inline namespace MFATTN_CPU_NAMESPACE {

class SinkhornPasses {
 public:
  SinkhornPasses(const Model& model, const LanePairTerms& pair_terms, std::vector<Prepared>& prepared)
      : model_(model), pair_terms_(pair_terms), prepared_(prepared) {}

  /// Receivers padded to four whole lanes (the columns' lanes and row_scale's length).
  std::size_t padded_receivers() const { return (model_.n + 4 * kLanes - 1) / (4 * kLanes) * (4 * kLanes); }

  /// The slots' fixed parts (source log-presences in the prepared order, receivers present),
  /// then the transposed queries of every slot. Called by every thread of the team.
  void prepare(host::SinkhornScaling& scaling, const std::vector<double>& token_bias, double prefix_bias) {
    const std::size_t n = model_.n, slots = prepared_.size(), padded = padded_receivers();
#pragma omp single
    {
      scaling.slots.resize(slots);
      queries_t_.resize(slots);
      for (std::size_t s = 0; s < slots; ++s) {
        const Prepared& p = prepared_[s];
        host::SinkhornSlot& slot = scaling.slots[s];
        slot.source_log_presence.assign(p.padded_sources, kNegInf);
        for (std::size_t q = 0; q < model_.prefix_count(); ++q) slot.source_log_presence[q] = prefix_bias;
        for (std::size_t j = 0; j < n; ++j) slot.source_log_presence[p.first_moving + j] = token_bias[j];
        slot.receiver_present.assign(padded, 0);
        for (std::size_t i = 0; i < n; ++i) slot.receiver_present[i] = model_.presence[i] > 0.0;
        queries_t_[s].assign(prepared_[s].d * padded, 0.0);
      }
      scaling.reset();
    }
#pragma omp for schedule(static)
    for (std::size_t unit = 0; unit < slots * n; ++unit) {
      const std::size_t s = unit / n, i = unit % n, d = prepared_[s].d;
      for (std::size_t c = 0; c < d; ++c) queries_t_[s][c * padded + i] = prepared_[s].queries[i * d + c];
    }
#pragma omp single
    {
      largest_key_.assign(slots, 0.0);
      largest_query_.assign(slots, 0.0);
      largest_row_bias_.assign(slots, kNegInf);
      largest_row_scale_.assign(slots, kNegInf);
      std::vector<double> key;
      for (std::size_t s = 0; s < slots; ++s) {
        const Prepared& p = prepared_[s];
        key.resize(p.d);
        for (std::size_t j = 0; j < p.padded_sources; ++j) {
          if (scaling.slots[s].source_log_presence[j] == kNegInf) continue;
          for (std::size_t c = 0; c < p.d; ++c) key[c] = p.key_panels[p.key_index(c, j)];
          largest_key_[s] = std::max(largest_key_[s], norm(key.data(), p.d));
        }
        for (std::size_t i = 0; i < n; ++i)
          if (scaling.slots[s].receiver_present[i])
            largest_query_[s] = std::max(largest_query_[s], norm(p.queries.data() + i * p.d, p.d));
      }
    }
  }

  /// Whether the passes take the model's pair terms: symmetric ones with no sign-changing
  /// factor (the backend refuses the others before any evaluation).
  static bool takes(const Model& model) {
    bool takes_terms = false;
    kernels::visit_pair_terms(model.pair_terms, [&](const auto& terms, const auto& prefix_terms) {
      takes_terms = usable_pair<decltype(terms), decltype(prefix_terms)>();
    });
    return takes_terms;
  }

  void rows(host::SinkhornScaling& scaling) {
    const std::size_t n = model_.n;
#pragma omp single
    for (std::size_t s = 0; s < scaling.slots.size(); ++s) {
      const std::vector<double>& bias = scaling.slots[s].row_bias;
      largest_row_bias_[s] = *std::max_element(bias.begin(), bias.end());
    }
    pair_terms_.dispatch([&](const auto& terms, const auto& prefix_terms) {
      if constexpr (!usable_pair<decltype(terms), decltype(prefix_terms)>()) return;
#pragma omp for schedule(dynamic, 8)
      for (std::size_t unit = 0; unit < scaling.slots.size() * n; ++unit) {
        host::SinkhornSlot& slot = scaling.slots[unit / n];
        if (!slot.active) continue;
        const std::size_t i = unit % n;
        const Prepared& p = prepared_[unit / n];
        scaling.finish_row(slot, i, with_dimension<decltype(terms), decltype(prefix_terms)>(p.d, [&](auto dim) {
                             return row_lse<decltype(dim)::value>(terms, prefix_terms, p, unit / n, slot, i);
                           }));
      }
    });
  }

  void columns(host::SinkhornScaling& scaling) {
    const std::size_t sources = prepared_.empty() ? 0 : prepared_.front().padded_sources;
#pragma omp single
    for (std::size_t s = 0; s < scaling.slots.size(); ++s) {
      const std::vector<double>& scale = scaling.slots[s].row_scale;
      largest_row_scale_[s] = *std::max_element(scale.begin(), scale.end());
    }
    pair_terms_.dispatch([&](const auto& terms, const auto& prefix_terms) {
      if constexpr (!usable_pair<decltype(terms), decltype(prefix_terms)>()) return;
#pragma omp for schedule(dynamic, 8)
      for (std::size_t unit = 0; unit < scaling.slots.size() * sources; ++unit) {
        const std::size_t s = unit / sources, j = unit % sources;
        host::SinkhornSlot& slot = scaling.slots[s];
        if (!slot.active) continue;
        if (slot.source_log_presence[j] == kNegInf) {
          scaling.finish_column(slot, j, kNegInf);
          continue;
        }
        const Prepared& p = prepared_[s];
        scaling.finish_column(slot, j, with_dimension<decltype(terms), decltype(prefix_terms)>(p.d, [&](auto dim) {
                                return column_lse<decltype(dim)::value>(terms, prefix_terms, p, s, slot, j);
                              }));
      }
    });
  }

  /// Every slot's prepared biases and offsets for the output pass, SA's one-sided loop with
  /// the plan's scalings: bias log p_j + g_j and offset L_i (>= every logit of the row), so
  /// that its normalised sums are sum_j P_ij z_j.
  void apply(const host::SinkhornScaling& scaling) {
#pragma omp for schedule(static)
    for (std::size_t s = 0; s < prepared_.size(); ++s) {
      Prepared& p = prepared_[s];
      const host::SinkhornSlot& slot = scaling.slots[s];
      for (std::size_t j = 0; j < p.padded_sources; ++j) {
        p.bias[j] = slot.row_bias[j];
        p.bias_log2[j] = slot.row_bias[j] * kLog2e;
      }
      for (std::size_t i = 0; i < model_.n; ++i) p.offsets[i] = slot.row_lse[i];
      p.logits_above_underflow = false;
    }
  }

 private:
  static constexpr double kNegInf = -std::numeric_limits<double>::infinity();

  /// A pair-terms type (the kernels' formula, or the lanes' Terms around one) the passes take.
  template <class T>
  static constexpr bool usable() {
    if constexpr (requires { typename T::Formula; })
      return usable<typename T::Formula>();
    else
      return T::kSymmetric && !T::kHasFactor;
  }
  template <class A, class B>
  static constexpr bool usable_pair() {
    return usable<std::decay_t<A>>() && usable<std::decay_t<B>>();
  }

  /// LSE of one line (a row: lanes over sources; a column: lanes over receivers) whose
  /// logits logit(k) (natural units, kLanes from k on, `count` a multiple of 4 kLanes) are at
  /// most `bound`: one pass summing exp(l - bound) in lanes, four vectors in lockstep, and
  /// bound + log S. Where the bound is loose by more than ~575 (S < kLooseBound) the line is
  /// taken again from its exact maximum m: a pass for m, a pass for the sum. Every sum runs in
  /// the same order whatever the thread, so the bits do not depend on the thread count.
  template <class Logits>
  static double line_lse(std::size_t count, double bound, Logits&& logit) {
    if (bound == kNegInf) return kNegInf;
    double sum = 0.0;
    if (bound < std::numeric_limits<double>::infinity()) {
      sum = exp_sum(count, bound, logit);
      if (sum >= kLooseBound) return kernels::log_sum_exp(bound, sum);
    }
    Lanes largest[4];
    for (Lanes& m : largest) m = simd::broadcast(kNegInf);
    for (std::size_t k = 0; k < count; k += 4 * kLanes)
      for (std::size_t h = 0; h < 4; ++h) largest[h] = simd::max(largest[h], logit(k + h * kLanes));
    const double m =
        simd::horizontal_max(simd::max(simd::max(largest[0], largest[1]), simd::max(largest[2], largest[3])));
    if (m == kNegInf) return m;
    return kernels::log_sum_exp(m, exp_sum(count, m, logit));
  }

  /// sum_k exp(logit(k) - offset) over the line, the lanes reduced in a fixed order.
  template <class Logits>
  static double exp_sum(std::size_t count, double offset, Logits&& logit) {
    const double shift = offset * kLog2e;
    Lanes sums[4] = {};
    for (std::size_t k = 0; k < count; k += 4 * kLanes) {
      Lanes t[4], e[4];
      for (std::size_t h = 0; h < 4; ++h) t[h] = logit(k + h * kLanes) * kLog2e - shift;
      simd::exp2_nonpositive(t, e);
      for (std::size_t h = 0; h < 4; ++h) sums[h] += e[h];
    }
    return simd::horizontal_sum((sums[0] + sums[1]) + (sums[2] + sums[3]));
  }

  /// body(std::integral_constant<int, D>) with D = d for d = 2, 3, 4 (the dot products then
  /// unroll), else D = 0 (any d). Only the plain pairs (no mask, factor or per-prompt rule)
  /// take the fixed dimensions: each is a loop of its own per instruction set, and every
  /// combination of pair terms times dimensions would be compiled.
  template <class Terms, class PrefixTerms, class Body>
  static double with_dimension(std::size_t d, Body&& body) {
    if constexpr (std::decay_t<Terms>::kHasLogTerm || std::decay_t<PrefixTerms>::kHasLogTerm)
      return body(std::integral_constant<int, 0>{});
    switch (d) {
      case 2: return body(std::integral_constant<int, 2>{});
      case 3: return body(std::integral_constant<int, 3>{});
      case 4: return body(std::integral_constant<int, 4>{});
      default: return body(std::integral_constant<int, 0>{});
    }
  }

  static double norm(const double* v, std::size_t d) {
    double sum = 0.0;
    for (std::size_t c = 0; c < d; ++c) sum += v[c] * v[c];
    return std::sqrt(sum);
  }

  /// L_i = LSE_j (<q_i, k_j> + t_ij + row_bias_j), bounded by |q_i| max|k_j| + max row_bias
  /// (log-terms are <= 0: masks and nonnegative factors of at most 1).
  template <int kDim, class Terms, class PrefixTerms>
  double row_lse(const Terms& terms, const PrefixTerms& prefix_terms, const Prepared& p, std::size_t s,
                 const host::SinkhornSlot& slot, std::size_t i) const {
    const std::size_t d = kDim > 0 ? std::size_t(kDim) : p.d, first = p.first_moving;
    const double* q = p.queries.data() + i * d;
    const double* bias = slot.row_bias.data();
    const auto receiver = terms.receiver(i);
    const auto prefix_receiver = prefix_terms.receiver(i);
    const double bound = norm(q, d) * largest_key_[s] + largest_row_bias_[s];
    return line_lse(p.padded_sources, bound, [&](std::size_t j) {
      Lanes l = simd::load(bias + j);
      const double* keys = p.key_lanes(0, j);
      for (std::size_t c = 0; c < d; ++c) l += q[c] * simd::load(keys + c * kKeyPanel);
      if (j < first) {
        if constexpr (PrefixTerms::kHasLogTerm) l += prefix_terms.log_term(prefix_receiver, j);
      } else {
        if constexpr (Terms::kHasLogTerm) l += terms.log_term(receiver, j);
      }
      return l;
    });
  }

  /// C_j without log p_j: LSE_i (f_i + <q_i, k_j> + t_ij), bounded by |k_j| max|q_i| + max f.
  template <int kDim, class Terms, class PrefixTerms>
  double column_lse(const Terms& terms, const PrefixTerms& prefix_terms, const Prepared& p, std::size_t s,
                    const host::SinkhornSlot& slot, std::size_t j) const {
    const std::size_t d = kDim > 0 ? std::size_t(kDim) : p.d, padded = padded_receivers();
    thread_local std::vector<double> key;
    key.resize(d);
    for (std::size_t c = 0; c < d; ++c) key[c] = p.key_panels[p.key_index(c, j)];
    // For small d the key in a local array, which no store can alias (so it stays in registers).
    double local_key[4] = {};
    const double* k = key.data();
    if constexpr (kDim > 0) {
      for (std::size_t c = 0; c < d; ++c) local_key[c] = key[c];
      k = local_key;
    }
    const double* qt = queries_t_[s].data();
    const double* row_scale = slot.row_scale.data();
    const double bound = norm(k, d) * largest_query_[s] + largest_row_scale_[s];
    auto line = [&](const auto& pair_terms, const ReceiverPosition& source) {
      return line_lse(padded, bound, [&](std::size_t i) {
        Lanes l = simd::load(row_scale + i);
        for (std::size_t c = 0; c < d; ++c) l += k[c] * simd::load(qt + c * padded + i);
        // The pair (i, j) read as (j, i): source j's labels as the scalar side.
        if constexpr (std::decay_t<decltype(pair_terms)>::kHasLogTerm)
          l += pair_terms.log_term(source, p.first_moving + i);
        return l;
      });
    };
    if (j >= p.first_moving) return line(terms, terms.receiver(j - p.first_moving));
    const std::size_t position_dim = model_.position_dim;
    const ReceiverPosition prefix{
        model_.prefix_positions.empty() ? nullptr : model_.prefix_positions.data() + j * position_dim,
        double(model_.prefix_prompt_id[j])};
    return line(prefix_terms, prefix);
  }

  const Model& model_;
  const LanePairTerms& pair_terms_;
  std::vector<Prepared>& prepared_;
  std::vector<std::vector<double>> queries_t_;  // per slot: d rows of the padded receivers
  // Per slot: the largest |k_j| over sources with p_j > 0 and |q_i| over present receivers
  // (per evaluation), the largest row bias and row scale (per pass): the lines' bounds. Null
  // tokens stay out of them, so appending them changes no bit.
  std::vector<double> largest_key_, largest_query_, largest_row_bias_, largest_row_scale_;
};

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
