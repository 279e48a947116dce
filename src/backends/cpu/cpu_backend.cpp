// The CPU backend: an online-softmax ("flash") pair loop over cache-sized source tiles.
//
// Per evaluation every token is prepared once (O(n d) memory, no n x n matrix):
//   query  q_i = beta * G_i Q x_i,   key k_j = G_j K x_j,
//   value  z_j = G_j x_j (transported) | x_j (plain),   bias b_j = log p_j (-inf when p_j = 0)
// and for each receiver, over sources in tiles of kTile,
//   l_ij = <q_i, k_j> + b_j + log(m_ij c_ij),   m_i = running max of l_ij,
//   S_i = sum_j exp(l_ij - m_i),  A_i = sum_j exp(l_ij - m_i) z_j,
// rescaling S_i, A_i by exp(m_old - m_new) whenever a tile raises the maximum.
// detail::finish_receiver turns (m_i, S_i, A_i) into the velocity.
//
// Determinism: a receiver's sums are taken in one fixed order (tiles in order, fixed lanes,
// fixed horizontal reductions), whatever the thread count or its neighbours in a block, and
// padding or null sources contribute exact zeros, so appending null tokens changes no bit.
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

constexpr std::size_t kTile = cpu::PairTerms::kTile;  // sources per tile
constexpr std::size_t kChunksPerTile = kTile / kLanes;
constexpr std::size_t kBlock = 4;                    // receivers sharing each source load
constexpr std::size_t kSmallDimension = 8;           // lanes over sources up to here
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

std::size_t round_up(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

/// Per-replica prepared operands (see the file comment).
struct Prepared {
  std::size_t d = 0, padded_sources = 0, padded_dim = 0;
  std::vector<double> queries;      // n x d, receiver-major
  std::vector<double> keys_t;       // d x padded_sources (lanes over sources)
  std::vector<double> values_t;     // d x padded_sources   (small d)
  std::vector<double> values_rows;  // padded_sources x padded_dim (large d)
  std::vector<double> bias;         // padded_sources
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Model& model, int threads)
      : model_(model), threads_(threads > 0 ? threads : omp_get_max_threads()),
        mass_(model.mass()), pair_terms_(model) {}

  std::string name() const override { return "cpu"; }

  void velocity(std::size_t replicas, const double* x, double* velocity_out,
                double* weight_sums_out) override {
    prepared_.resize(replicas);
    const std::size_t n = model_.n;
    const std::size_t blocks_per_replica = (n + kBlock - 1) / kBlock;
    const std::size_t total_blocks = replicas * blocks_per_replica;
    bool failed = false;
    std::string failure;
#pragma omp parallel num_threads(threads_)
    {
#pragma omp for schedule(static)
      for (std::size_t r = 0; r < replicas; ++r) prepare(x + r * n * model_.d, prepared_[r]);
#pragma omp for schedule(dynamic, 1)
      for (std::size_t b = 0; b < total_blocks; ++b) {
        const std::size_t r = b / blocks_per_replica;
        const std::size_t first = (b % blocks_per_replica) * kBlock;
        try {
          run_block(r, first, x + r * n * model_.d, velocity_out + r * n * model_.d,
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
    const std::size_t ns = p.padded_sources;
    p.queries.assign(n * d, 0.0);
    p.keys_t.assign(d * ns, 0.0);
    p.bias.assign(ns, kNegInf);
    if (d <= kSmallDimension)
      p.values_t.assign(d * ns, 0.0);
    else
      p.values_rows.assign(ns * p.padded_dim, 0.0);
    std::vector<double> tmp(d), out(d);
    for (std::size_t j = 0; j < n; ++j) {
      const double* xj = x + j * d;
      // query
      transform(model_.q, model_.q_identity, j, xj, tmp.data(), out.data());
      for (std::size_t c = 0; c < d; ++c) p.queries[j * d + c] = model_.beta * out[c];
      // key
      transform(model_.k, model_.k_identity, j, xj, tmp.data(), out.data());
      for (std::size_t c = 0; c < d; ++c) p.keys_t[c * ns + j] = out[c];
      // value in z-space
      const double* z = xj;
      if (model_.gauge && model_.values == ValueTransport::Transported) {
        model_.gauge->apply(j, xj, out.data());
        z = out.data();
      }
      if (d <= kSmallDimension)
        for (std::size_t c = 0; c < d; ++c) p.values_t[c * ns + j] = z[c];
      else
        std::copy(z, z + d, p.values_rows.data() + j * p.padded_dim);
      const double presence = model_.presence[j];
      p.bias[j] = presence > 0.0 ? std::log(presence) : kNegInf;
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

  void run_block(std::size_t replica, std::size_t first, const double* x, double* velocity,
                 double* weight_sums) const {
    const Prepared& p = prepared_[replica];
    const std::size_t count = std::min(kBlock, model_.n - first);
    std::size_t receivers[kBlock];
    for (std::size_t r = 0; r < kBlock; ++r) receivers[r] = first + std::min(r, count - 1);
    double log_max[kBlock], weight_sum[kBlock];
    thread_local std::vector<double> acc;
    acc.assign(kBlock * std::max(p.padded_dim, kSmallDimension), 0.0);
    const std::size_t acc_stride = std::max(p.padded_dim, kSmallDimension);
    pair_terms_.dispatch([&](const auto& terms) {
      switch (model_.d) {
        case 2: block_small<2>(terms, p, receivers, log_max, weight_sum, acc.data(), acc_stride); break;
        case 3: block_small<3>(terms, p, receivers, log_max, weight_sum, acc.data(), acc_stride); break;
        case 4: block_small<4>(terms, p, receivers, log_max, weight_sum, acc.data(), acc_stride); break;
        default:
          if (model_.d <= kSmallDimension)
            block_small<0>(terms, p, receivers, log_max, weight_sum, acc.data(), acc_stride);
          else
            block_large(terms, p, receivers, log_max, weight_sum, acc.data(), acc_stride);
      }
    });
    double scratch[2 * 64];
    std::vector<double> big_scratch;
    double* work = scratch;
    if (model_.d > 64) {
      big_scratch.resize(2 * model_.d);
      work = big_scratch.data();
    }
    for (std::size_t r = 0; r < count; ++r) {
      const std::size_t i = receivers[r];
      const double sum = detail::finish_receiver(model_, mass_, i, x + i * model_.d, log_max[r],
                                                 weight_sum[r], acc.data() + r * acc_stride,
                                                 velocity + i * model_.d, work);
      if (weight_sums) weight_sums[i] = sum;
    }
  }

  /// Lanes over sources: for small d the accumulators A_i stay in registers as lane vectors.
  template <int kDim, class Terms>
  void block_small(const Terms& terms, const Prepared& p, const std::size_t* receivers,
                   double* log_max, double* weight_sum, double* acc_out,
                   std::size_t acc_stride) const {
    const std::size_t d = kDim > 0 ? std::size_t(kDim) : p.d;
    constexpr std::size_t kMaxDim = kDim > 0 ? std::size_t(kDim) : kSmallDimension;
    const std::size_t ns = p.padded_sources;
    double q[kBlock][kMaxDim];
    Lanes acc[kBlock][kMaxDim];
    Lanes sums[kBlock];
    double running_max[kBlock];
    typename Terms::Receiver receiver_terms[kBlock];
    for (std::size_t r = 0; r < kBlock; ++r) {
      for (std::size_t c = 0; c < d; ++c) {
        q[r][c] = p.queries[receivers[r] * d + c];
        acc[r][c] = Lanes{};
      }
      sums[r] = Lanes{};
      running_max[r] = kNegInf;
      receiver_terms[r] = terms.receiver(receivers[r]);
    }
    Lanes logits[kBlock][kChunksPerTile];
    for (std::size_t tile = 0; tile < ns; tile += kTile) {
      Lanes tile_max[kBlock];
      for (std::size_t r = 0; r < kBlock; ++r) tile_max[r] = simd::broadcast(kNegInf);
      for (std::size_t chunk = 0; chunk < kChunksPerTile; ++chunk) {
        const std::size_t j = tile + chunk * kLanes;
        Lanes keys[kMaxDim] = {};
        for (std::size_t c = 0; c < d; ++c) keys[c] = simd::load(p.keys_t.data() + c * ns + j);
        const Lanes bias = simd::load(p.bias.data() + j);
        for (std::size_t r = 0; r < kBlock; ++r) {
          Lanes score = q[r][0] * keys[0];
          for (std::size_t c = 1; c < d; ++c) score += q[r][c] * keys[c];
          score += bias;
          if constexpr (Terms::kHasLogTerm) score += terms.log_term(receiver_terms[r], j);
          logits[r][chunk] = score;
          tile_max[r] = simd::max(tile_max[r], score);
        }
      }
      bool any_active = false;
      for (std::size_t r = 0; r < kBlock; ++r) {
        const double new_max = simd::horizontal_max(tile_max[r]);
        if (new_max > running_max[r]) {
          if (running_max[r] != kNegInf) {
            const double scale = std::exp(running_max[r] - new_max);
            for (std::size_t c = 0; c < d; ++c) acc[r][c] *= scale;
            sums[r] *= scale;
          }
          running_max[r] = new_max;
        }
        any_active = any_active || running_max[r] != kNegInf;
      }
      if (!any_active) continue;
      for (std::size_t chunk = 0; chunk < kChunksPerTile; ++chunk) {
        const std::size_t j = tile + chunk * kLanes;
        Lanes values[kMaxDim] = {};
        for (std::size_t c = 0; c < d; ++c)
          values[c] = simd::load(p.values_t.data() + c * ns + j);
        for (std::size_t r = 0; r < kBlock; ++r) {
          if (running_max[r] == kNegInf) continue;
          Lanes weight = simd::exp_nonpositive(logits[r][chunk] - running_max[r]);
          if constexpr (Terms::kHasFactor) weight *= terms.factor(receiver_terms[r], j);
          sums[r] += weight;
          for (std::size_t c = 0; c < d; ++c) acc[r][c] += weight * values[c];
        }
      }
    }
    for (std::size_t r = 0; r < kBlock; ++r) {
      log_max[r] = running_max[r];
      weight_sum[r] = simd::horizontal_sum(sums[r]);
      for (std::size_t c = 0; c < d; ++c)
        acc_out[r * acc_stride + c] = simd::horizontal_sum(acc[r][c]);
    }
  }

  /// Lanes over components: for large d the tile's weights are staged and A_i += W Z runs as
  /// a register-blocked product (kBlock receivers x 2 lane vectors of components).
  template <class Terms>
  void block_large(const Terms& terms, const Prepared& p, const std::size_t* receivers,
                   double* log_max, double* weight_sum, double* acc, std::size_t acc_stride) const {
    const std::size_t d = p.d, ns = p.padded_sources, dp = p.padded_dim;
    const double* q[kBlock];
    Lanes sums[kBlock];
    double running_max[kBlock];
    typename Terms::Receiver receiver_terms[kBlock];
    for (std::size_t r = 0; r < kBlock; ++r) {
      q[r] = p.queries.data() + receivers[r] * d;
      sums[r] = Lanes{};
      running_max[r] = kNegInf;
      receiver_terms[r] = terms.receiver(receivers[r]);
    }
    alignas(64) double weights[kBlock][kTile];
    Lanes logits[kBlock][kChunksPerTile];
    for (std::size_t tile = 0; tile < ns; tile += kTile) {
      Lanes tile_max[kBlock];
      for (std::size_t r = 0; r < kBlock; ++r) tile_max[r] = simd::broadcast(kNegInf);
      for (std::size_t chunk = 0; chunk < kChunksPerTile; chunk += 2) {
        const std::size_t j = tile + chunk * kLanes;
        Lanes s0[kBlock] = {}, s1[kBlock] = {};
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
          s0[r] += b0;
          s1[r] += b1;
          if constexpr (Terms::kHasLogTerm) {
            s0[r] += terms.log_term(receiver_terms[r], j);
            s1[r] += terms.log_term(receiver_terms[r], j + kLanes);
          }
          logits[r][chunk] = s0[r];
          logits[r][chunk + 1] = s1[r];
          tile_max[r] = simd::max(tile_max[r], simd::max(s0[r], s1[r]));
        }
      }
      bool any_active = false;
      for (std::size_t r = 0; r < kBlock; ++r) {
        const double new_max = simd::horizontal_max(tile_max[r]);
        if (new_max > running_max[r]) {
          if (running_max[r] != kNegInf) {
            const double scale = std::exp(running_max[r] - new_max);
            for (std::size_t c = 0; c < dp; ++c) acc[r * acc_stride + c] *= scale;
            sums[r] *= scale;
          }
          running_max[r] = new_max;
        }
        any_active = any_active || running_max[r] != kNegInf;
        for (std::size_t chunk = 0; chunk < kChunksPerTile; ++chunk) {
          Lanes weight = Lanes{};
          if (running_max[r] != kNegInf) {
            weight = simd::exp_nonpositive(logits[r][chunk] - running_max[r]);
            if constexpr (Terms::kHasFactor)
              weight *= terms.factor(receiver_terms[r], tile + chunk * kLanes);
          }
          sums[r] += weight;
          simd::store(weights[r] + chunk * kLanes, weight);
        }
      }
      if (!any_active) continue;
      for (std::size_t cb = 0; cb < dp; cb += 2 * kLanes) {
        Lanes a0[kBlock] = {}, a1[kBlock] = {};
        for (std::size_t t = 0; t < kTile; ++t) {
          const double* row = p.values_rows.data() + (tile + t) * dp + cb;
          const Lanes z0 = simd::load(row);
          const Lanes z1 = simd::load(row + kLanes);
          for (std::size_t r = 0; r < kBlock; ++r) {
            a0[r] += weights[r][t] * z0;
            a1[r] += weights[r][t] * z1;
          }
        }
        for (std::size_t r = 0; r < kBlock; ++r) {
          double* out = acc + r * acc_stride + cb;
          simd::store(out, simd::load(out) + a0[r]);
          simd::store(out + kLanes, simd::load(out + kLanes) + a1[r]);
        }
      }
    }
    for (std::size_t r = 0; r < kBlock; ++r) {
      log_max[r] = running_max[r];
      weight_sum[r] = simd::horizontal_sum(sums[r]);
    }
  }

  const Model& model_;
  int threads_;
  double mass_;
  cpu::PairTerms pair_terms_;
  std::vector<Prepared> prepared_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Model& model, int threads) {
  return std::make_unique<CpuBackend>(model, threads);
}

}  // namespace mfattn
