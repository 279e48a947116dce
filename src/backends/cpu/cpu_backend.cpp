// The CPU backend: a single pass over the sources per receiver block, no n x n matrix.
//
// Per evaluation every token is prepared once (O(n d) memory):
//   query  q_i = beta * G_i Q x_i,   key k_j = G_j K x_j,
//   value  z_j = G_j x_j (transported) | x_j (plain),   bias b_j = log p_j (-inf when p_j = 0)
// and each receiver gets an offset B_i >= max_j <q_i, k_j> from Cauchy-Schwarz,
//   B_i = |q_i| * max_{j: p_j > 0} |k_j|,
// so every weight exp(l_ij - B_i), l_ij = <q_i, k_j> + b_j + log(m_ij c_ij), lies in [0, 1]
// and one pass gives
//   S_i = sum_j exp(l_ij - B_i),   A_i = sum_j exp(l_ij - B_i) z_j
// with no running maximum and no rescaling. For Q = K = I the bound is attained (l_ii = B_i).
// When it is loose by more than ~575 (S_i < 1e-250, general Q, K or masks), the receiver is
// recomputed with B_i = max_j l_ij taken exactly, so no weight that matters underflows.
// detail::finish_receiver turns (B_i, S_i, A_i) into the velocity.
//
// Determinism: a receiver's sums are taken in one fixed order (sources in order, fixed
// lanes, fixed horizontal reductions), whatever the thread count or its neighbours in a
// block; padding and null sources add exact zeros and are left out of B_i, so appending
// null tokens changes no bit.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/backend_common.hpp"
#include "backends/cpu/pair_terms.hpp"
#include "backends/cpu/vector_math.hpp"

namespace mfattn {
namespace {

using simd::Lanes;
using simd::kLanes;

constexpr std::size_t kTile = cpu::PairTerms::kTile;  // sources are padded to whole tiles
constexpr std::size_t kBlock = 4;                      // receivers sharing each source load
constexpr std::size_t kSmallDimension = 8;             // lanes over sources up to here
constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr double kLooseBound = 1e-250;                 // S_i below this: take the exact max

std::size_t round_up(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

/// Per-replica prepared operands (see the file comment).
struct Prepared {
  std::size_t d = 0, padded_sources = 0, padded_dim = 0;
  std::size_t bias_free_end = 0;    // sources before this need no bias (all p_j = 1, no padding)
  // Row strides of the lane-major and row-major operands, a line longer than the data so
  // that rows never share cache sets (power-of-two strides thrash the L1).
  std::size_t source_stride = 0, row_stride = 0;
  std::vector<double> queries;      // n x d, receiver-major
  std::vector<double> offsets;      // B_i per receiver
  std::vector<double> keys_t;       // d rows of source_stride (lanes over sources)
  std::vector<double> values_t;     // d rows of source_stride (small d)
  std::vector<double> values_rows;  // padded_sources rows of row_stride (large d)
  std::vector<double> bias;         // padded_sources
};

/// Running sums of one block of receivers over the sources seen so far:
/// S_i as lanes, and A_i as lanes over sources (small d) or as rows (large d).
struct BlockSums {
  std::size_t receivers[kBlock];
  std::size_t count = 0;  // receivers of the block that exist (the rest repeat the last)
  double offset[kBlock];
  Lanes weight_lanes[kBlock];
  Lanes acc_lanes[kBlock][kSmallDimension];
  double* acc = nullptr;  // kBlock rows of acc_stride numbers
  std::size_t acc_stride = 0;
  double weight_sum[kBlock];

  void reset() {
    for (std::size_t r = 0; r < kBlock; ++r) {
      weight_lanes[r] = Lanes{};
      for (auto& lanes : acc_lanes[r]) lanes = Lanes{};
    }
    std::fill(acc, acc + kBlock * acc_stride, 0.0);
  }
};

/// Receivers of a panel share every source tile while it is in cache: kPanelBlocks blocks
/// of kBlock receivers walk the sources tile by tile.
constexpr std::size_t kPanelBlocks = 16;
constexpr std::size_t kSmallSourceTile = 1024;  // (2d + 1) * 8 KiB of operands at most
constexpr std::size_t kLargeSourceTile = 128;   // 2 * 128 * d * 8 bytes of operands

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Model& model, int threads)
      : model_(model), threads_(threads > 0 ? threads : omp_get_max_threads()),
        mass_(model.mass()), pair_terms_(model) {
    for (double p : model.presence) all_present_ = all_present_ && p == 1.0;
  }

  std::string name() const override { return "cpu"; }

  void velocity(std::size_t replicas, const double* x, double* velocity_out,
                double* weight_sums_out) override {
    prepared_.resize(replicas);
    const std::size_t n = model_.n;
    const std::size_t panel = kPanelBlocks * kBlock;
    const std::size_t panels_per_replica = (n + panel - 1) / panel;
    const std::size_t total_panels = replicas * panels_per_replica;
    bool failed = false;
    std::string failure;
#pragma omp parallel num_threads(threads_)
    {
#pragma omp for schedule(static)
      for (std::size_t r = 0; r < replicas; ++r) prepare(x + r * n * model_.d, prepared_[r]);
#pragma omp for schedule(dynamic, 1)
      for (std::size_t unit = 0; unit < total_panels; ++unit) {
        const std::size_t r = unit / panels_per_replica;
        const std::size_t first = (unit % panels_per_replica) * panel;
        try {
          run_panel(r, first, std::min(panel, n - first), x + r * n * model_.d,
                    velocity_out + r * n * model_.d,
                    weight_sums_out ? weight_sums_out + r * n : nullptr);
        } catch (const NumericalError& error) {
#pragma omp critical(mfattn_cpu_failure)
          {
            failed = true;
            failure = error.what();
          }
        }
      }
    }
    if (failed) throw NumericalError(failure);
  }

 private:
  void prepare(const double* x, Prepared& p) const {
    const std::size_t n = model_.n, d = model_.d;
    p.d = d;
    p.padded_sources = round_up(std::max<std::size_t>(n, 1), kTile);
    p.padded_dim = round_up(d, 2 * kLanes);
    p.bias_free_end = all_present_ ? n / kLanes * kLanes : 0;
    p.source_stride = p.padded_sources + kLanes;
    p.row_stride = p.padded_dim + kLanes;
    const std::size_t ns = p.source_stride;
    p.queries.assign(n * d, 0.0);
    p.offsets.assign(n, 0.0);
    p.keys_t.assign(d * ns, 0.0);
    p.bias.assign(p.padded_sources, kNegInf);
    if (d <= kSmallDimension)
      p.values_t.assign(d * ns, 0.0);
    else
      p.values_rows.assign(p.padded_sources * p.row_stride, 0.0);
    std::vector<double> tmp(d), out(d);
    double largest_key = 0.0;
    for (std::size_t j = 0; j < n; ++j) {
      const double* xj = x + j * d;
      transform(model_.q, model_.q_identity, j, xj, tmp.data(), out.data());
      for (std::size_t c = 0; c < d; ++c) p.queries[j * d + c] = model_.beta * out[c];
      transform(model_.k, model_.k_identity, j, xj, tmp.data(), out.data());
      double key_norm2 = 0.0;
      for (std::size_t c = 0; c < d; ++c) {
        p.keys_t[c * ns + j] = out[c];
        key_norm2 += out[c] * out[c];
      }
      const double* z = xj;
      if (model_.gauge && model_.values == ValueTransport::Transported) {
        model_.gauge->apply(j, xj, out.data());
        z = out.data();
      }
      if (d <= kSmallDimension)
        for (std::size_t c = 0; c < d; ++c) p.values_t[c * ns + j] = z[c];
      else
        std::copy(z, z + d, p.values_rows.data() + j * p.row_stride);
      const double presence = model_.presence[j];
      p.bias[j] = presence > 0.0 ? std::log(presence) : kNegInf;
      // Null sources stay out of the bound, so that adding them changes no offset.
      if (presence > 0.0) largest_key = std::max(largest_key, std::sqrt(key_norm2));
    }
    for (std::size_t i = 0; i < n; ++i) {
      double query_norm2 = 0.0;
      for (std::size_t c = 0; c < d; ++c) query_norm2 += p.queries[i * d + c] * p.queries[i * d + c];
      p.offsets[i] = std::sqrt(query_norm2) * largest_key;
    }
  }

  /// out = G_token M x (M skipped when identity).
  void transform(const Matrix& m, bool identity, std::size_t token, const double* x,
                 double* tmp, double* out) const {
    const std::size_t d = model_.d;
    const double* in = x;
    if (!identity) {
      for (std::size_t a = 0; a < d; ++a) {
        double sum = 0.0;
        for (std::size_t b = 0; b < d; ++b) sum += m(a, b) * x[b];
        tmp[a] = sum;
      }
      in = tmp;
    }
    if (model_.gauge)
      model_.gauge->apply(token, in, out);
    else
      std::copy(in, in + d, out);
  }

  void run_panel(std::size_t replica, std::size_t first, std::size_t receivers_in_panel,
                 const double* x, double* velocity, double* weight_sums) const {
    const Prepared& p = prepared_[replica];
    const std::size_t blocks = (receivers_in_panel + kBlock - 1) / kBlock;
    const std::size_t acc_stride = std::max(p.padded_dim, kSmallDimension);
    thread_local std::vector<BlockSums> panel;
    thread_local std::vector<double> acc_rows;
    panel.resize(kPanelBlocks);
    acc_rows.resize(kPanelBlocks * kBlock * acc_stride);
    for (std::size_t b = 0; b < blocks; ++b) {
      BlockSums& block = panel[b];
      const std::size_t start = first + b * kBlock;
      block.count = std::min(kBlock, first + receivers_in_panel - start);
      for (std::size_t r = 0; r < kBlock; ++r) {
        block.receivers[r] = start + std::min(r, block.count - 1);
        block.offset[r] = p.offsets[block.receivers[r]];
      }
      block.acc = acc_rows.data() + b * kBlock * acc_stride;
      block.acc_stride = acc_stride;
      block.reset();
    }
    const std::size_t tile = p.d <= kSmallDimension ? kSmallSourceTile : kLargeSourceTile;
    pair_terms_.dispatch([&](const auto& terms) {
      for (std::size_t begin = 0; begin < p.padded_sources; begin += tile) {
        const std::size_t end = std::min(p.padded_sources, begin + tile);
        for (std::size_t b = 0; b < blocks; ++b) accumulate(terms, p, panel[b], begin, end);
      }
      for (std::size_t b = 0; b < blocks; ++b) {
        BlockSums& block = panel[b];
        finalize(p, block);
        bool loose = false;
        for (std::size_t r = 0; r < block.count; ++r)
          loose = loose || !(block.weight_sum[r] >= kLooseBound);
        if (!loose) continue;
        // The bound was loose for some receiver: take its exact maximum and sum again. The
        // other receivers keep their offsets, hence the same bits as in the first pass.
        double exact[kBlock];
        max_block(terms, p, block.receivers, exact);
        for (std::size_t r = 0; r < kBlock; ++r)
          if (!(block.weight_sum[r] >= kLooseBound)) block.offset[r] = exact[r];
        block.reset();
        accumulate(terms, p, block, 0, p.padded_sources);
        finalize(p, block);
      }
    });
    double scratch[2 * 64];
    std::vector<double> big_scratch;
    double* work = scratch;
    if (model_.d > 64) {
      big_scratch.resize(2 * model_.d);
      work = big_scratch.data();
    }
    for (std::size_t b = 0; b < blocks; ++b) {
      const BlockSums& block = panel[b];
      for (std::size_t r = 0; r < block.count; ++r) {
        const std::size_t i = block.receivers[r];
        const double sum = detail::finish_receiver(
            model_, mass_, i, x + i * model_.d, block.offset[r], block.weight_sum[r],
            block.acc + r * block.acc_stride, velocity + i * model_.d, work);
        if (weight_sums) weight_sums[i] = sum;
      }
    }
  }

  /// Adds sources [begin, end) to the block's sums.
  template <class Terms>
  void accumulate(const Terms& terms, const Prepared& p, BlockSums& block, std::size_t begin,
                  std::size_t end) const {
    switch (p.d) {
      case 2: return accumulate_small<2>(terms, p, block, begin, end);
      case 3: return accumulate_small<3>(terms, p, block, begin, end);
      case 4: return accumulate_small<4>(terms, p, block, begin, end);
      default:
        if (p.d <= kSmallDimension) return accumulate_small<0>(terms, p, block, begin, end);
        return accumulate_large(terms, p, block, begin, end);
    }
  }

  /// Horizontal sums of the lanes, in a fixed order.
  void finalize(const Prepared& p, BlockSums& block) const {
    for (std::size_t r = 0; r < kBlock; ++r) {
      block.weight_sum[r] = simd::horizontal_sum(block.weight_lanes[r]);
      if (p.d <= kSmallDimension)
        for (std::size_t c = 0; c < p.d; ++c)
          block.acc[r * block.acc_stride + c] = simd::horizontal_sum(block.acc_lanes[r][c]);
    }
  }

  /// Lanes over sources: for small d the sums A_i stay in registers as lane vectors.
  template <int kDim, class Terms>
  void accumulate_small(const Terms& terms, const Prepared& p, BlockSums& block,
                        std::size_t begin, std::size_t end) const {
    const std::size_t d = kDim > 0 ? std::size_t(kDim) : p.d;
    constexpr std::size_t kMaxDim = kDim > 0 ? std::size_t(kDim) : kSmallDimension;
    const std::size_t ns = p.source_stride;
    double q[kBlock][kMaxDim] = {};
    double neg_offset[kBlock];
    Lanes acc[kBlock][kMaxDim];
    Lanes sums[kBlock];
    typename Terms::Receiver receiver_terms[kBlock];
    for (std::size_t r = 0; r < kBlock; ++r) {
      for (std::size_t c = 0; c < d; ++c) {
        q[r][c] = p.queries[block.receivers[r] * d + c];
        acc[r][c] = block.acc_lanes[r][c];
      }
      for (std::size_t c = d; c < kMaxDim; ++c) acc[r][c] = Lanes{};
      sums[r] = block.weight_lanes[r];
      neg_offset[r] = -block.offset[r];
      receiver_terms[r] = terms.receiver(block.receivers[r]);
    }
    auto chunk = [&]<bool kBias>(std::size_t j) {
      Lanes keys[kMaxDim] = {}, values[kMaxDim] = {};
      for (std::size_t c = 0; c < d; ++c) {
        keys[c] = simd::load(p.keys_t.data() + c * ns + j);
        values[c] = simd::load(p.values_t.data() + c * ns + j);
      }
      Lanes bias{};
      if constexpr (kBias) bias = simd::load(p.bias.data() + j);
      for (std::size_t r = 0; r < kBlock; ++r) {
        Lanes logit = q[r][0] * keys[0] + neg_offset[r];
        for (std::size_t c = 1; c < d; ++c) logit += q[r][c] * keys[c];
        if constexpr (kBias) logit += bias;
        if constexpr (Terms::kHasLogTerm) logit += terms.log_term(receiver_terms[r], j);
        Lanes weight = simd::exp_nonpositive(logit);
        if constexpr (Terms::kHasFactor) weight *= terms.factor(receiver_terms[r], j);
        sums[r] += weight;
        for (std::size_t c = 0; c < d; ++c) acc[r][c] += weight * values[c];
      }
    };
    // Sources before bias_free_end all have p_j = 1 (bias 0); the rest, padding included,
    // add their bias. Adding a zero bias changes no bit, so both paths agree.
    const std::size_t split = std::clamp(p.bias_free_end, begin, end);
    for (std::size_t j = begin; j < split; j += kLanes) chunk.template operator()<false>(j);
    for (std::size_t j = split; j < end; j += kLanes) chunk.template operator()<true>(j);
    for (std::size_t r = 0; r < kBlock; ++r) {
      block.weight_lanes[r] = sums[r];
      for (std::size_t c = 0; c < d; ++c) block.acc_lanes[r][c] = acc[r][c];
    }
  }

  /// Logits l_ij - offset of 16 sources for the block, lanes over sources.
  template <class Terms>
  void large_logits(const Terms& terms, const Prepared& p, const double* const* q,
                    const double* neg_offset, const typename Terms::Receiver* receiver_terms,
                    std::size_t j, Lanes (*logits)[2]) const {
    const std::size_t d = p.d, ns = p.source_stride;
    Lanes s0[kBlock], s1[kBlock];
    for (std::size_t r = 0; r < kBlock; ++r) s0[r] = s1[r] = simd::broadcast(neg_offset[r]);
    for (std::size_t c = 0; c < d; ++c) {
      const Lanes k0 = simd::load(p.keys_t.data() + c * ns + j);
      const Lanes k1 = simd::load(p.keys_t.data() + c * ns + j + kLanes);
      for (std::size_t r = 0; r < kBlock; ++r) {
        s0[r] += q[r][c] * k0;
        s1[r] += q[r][c] * k1;
      }
    }
    const Lanes b0 = simd::load(p.bias.data() + j);
    const Lanes b1 = simd::load(p.bias.data() + j + kLanes);
    for (std::size_t r = 0; r < kBlock; ++r) {
      logits[r][0] = s0[r] + b0;
      logits[r][1] = s1[r] + b1;
      if constexpr (Terms::kHasLogTerm) {
        logits[r][0] += terms.log_term(receiver_terms[r], j);
        logits[r][1] += terms.log_term(receiver_terms[r], j + kLanes);
      }
    }
  }

  /// Lanes over components: for large d the weights of a tile are staged and A_i += W Z runs
  /// as a register-blocked product (kBlock receivers x 2 lane vectors of components).
  template <class Terms>
  void accumulate_large(const Terms& terms, const Prepared& p, BlockSums& block,
                        std::size_t begin, std::size_t end) const {
    const std::size_t d = p.d, dp = p.padded_dim;
    const double* q[kBlock];
    double neg_offset[kBlock];
    typename Terms::Receiver receiver_terms[kBlock];
    for (std::size_t r = 0; r < kBlock; ++r) {
      q[r] = p.queries.data() + block.receivers[r] * d;
      neg_offset[r] = -block.offset[r];
      receiver_terms[r] = terms.receiver(block.receivers[r]);
    }
    alignas(64) double weights[kBlock][kTile];
    for (std::size_t tile = begin; tile < end; tile += kTile) {
      for (std::size_t chunk = 0; chunk < kTile; chunk += 2 * kLanes) {
        const std::size_t j = tile + chunk;
        Lanes logits[kBlock][2];
        large_logits(terms, p, q, neg_offset, receiver_terms, j, logits);
        for (std::size_t r = 0; r < kBlock; ++r)
          for (std::size_t h = 0; h < 2; ++h) {
            Lanes weight = simd::exp_nonpositive(logits[r][h]);
            if constexpr (Terms::kHasFactor)
              weight *= terms.factor(receiver_terms[r], j + h * kLanes);
            block.weight_lanes[r] += weight;
            simd::store(weights[r] + chunk + h * kLanes, weight);
          }
      }
      for (std::size_t cb = 0; cb < dp; cb += 2 * kLanes) {
        Lanes a0[kBlock] = {}, a1[kBlock] = {};
        for (std::size_t t = 0; t < kTile; ++t) {
          const double* row = p.values_rows.data() + (tile + t) * p.row_stride + cb;
          const Lanes z0 = simd::load(row);
          const Lanes z1 = simd::load(row + kLanes);
          for (std::size_t r = 0; r < kBlock; ++r) {
            a0[r] += weights[r][t] * z0;
            a1[r] += weights[r][t] * z1;
          }
        }
        for (std::size_t r = 0; r < kBlock; ++r) {
          double* acc = block.acc + r * block.acc_stride + cb;
          simd::store(acc, simd::load(acc) + a0[r]);
          simd::store(acc + kLanes, simd::load(acc + kLanes) + a1[r]);
        }
      }
    }
  }

  /// max_j l_ij for each receiver of the block (-inf when no source is visible).
  template <class Terms>
  void max_block(const Terms& terms, const Prepared& p, const std::size_t* receivers,
                 double* exact) const {
    const std::size_t d = p.d, ns = p.padded_sources;
    const double* q[kBlock];
    const double zero[kBlock] = {};
    typename Terms::Receiver receiver_terms[kBlock];
    Lanes best[kBlock];
    for (std::size_t r = 0; r < kBlock; ++r) {
      q[r] = p.queries.data() + receivers[r] * d;
      receiver_terms[r] = terms.receiver(receivers[r]);
      best[r] = simd::broadcast(kNegInf);
    }
    for (std::size_t j = 0; j < ns; j += 2 * kLanes) {
      Lanes logits[kBlock][2];
      large_logits(terms, p, q, zero, receiver_terms, j, logits);
      for (std::size_t r = 0; r < kBlock; ++r)
        best[r] = simd::max(best[r], simd::max(logits[r][0], logits[r][1]));
    }
    for (std::size_t r = 0; r < kBlock; ++r) exact[r] = simd::horizontal_max(best[r]);
  }

  const Model& model_;
  int threads_;
  double mass_;
  bool all_present_ = true;
  cpu::PairTerms pair_terms_;
  std::vector<Prepared> prepared_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Model& model, int threads) {
  return std::make_unique<CpuBackend>(model, threads);
}

}  // namespace mfattn
