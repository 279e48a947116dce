#pragma once
// The CUDA backend's sums of one receiver (docs/model.md section 2; docs/cuda.md), as
// functions that a CUDA thread and the host run alike (MFATTN_HOST_DEVICE):
//   t_ij = <q_i, k_j> + b_j - B_i + log2(e) log(m_ij c_ij)      (base 2; q_i carries beta log2 e)
//   S_i  = sum_j c_ij 2^(t_ij),     A_i = sum_j c_ij 2^(t_ij) z_j
// with q_i = beta log2(e) G_i Q x_i, k_j = G_j K y_j, z_j the value, b_j = log2 p_j (-inf for a
// null source), B_i the receiver's offset in base 2 and the mask and factor those of
// kernels/pair_terms.hpp, chosen per pair at run time. The host turns (B_i, S_i, A_i) into the
// velocity with detail::finish_receiver, as the CPU backend does.
//
// Order of the sums: sources j = 0, 1, ..., S - 1 (the n moving tokens, then the P prefix
// tokens) one after another, for every receiver. In fp32 the weights and products are floats
// summed per tile of source_tile(d) sources, each tile's sums then added into fp64
// accumulators; in fp64 every term goes straight into the accumulators. The tiles depend on d
// alone, so the result does not depend on the block size, the grid or the device: reruns are
// bitwise equal. The tiles of the moving tokens start at 0 and those of the prefix tokens at
// n (region_tile), so null tokens appended to the moving ones add exact zeros to the last
// moving tile or tiles of their own, and every sum keeps its bits.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/exp2_polynomial.hpp"
#include "kernels/pair_terms.hpp"

namespace mfattn::cuda {

/// Largest d the CUDA pair loop takes (its per-thread arrays are this long at most).
inline constexpr int kMaxDim = 64;
/// Largest number of position coordinates the masks and factors read on the device.
inline constexpr int kMaxPositionDim = 8;
inline constexpr double kLog2e = 1.4426950408889634;
inline constexpr double kLn2 = 0.6931471805599453;

/// Sources per tile: staged in shared memory together, and in fp32 summed as floats before
/// their sums join the fp64 accumulators. A function of d only (see the file comment).
MFATTN_HOST_DEVICE constexpr int source_tile(int d) { return d <= 4 ? 256 : d <= 16 ? 128 : 32; }

/// The two runs of sources that tiles never straddle: the moving tokens [0, n) and the prefix
/// tokens [n, S).
struct SourceRegion {
  int begin, end;
};
MFATTN_HOST_DEVICE inline SourceRegion source_region(int region, int n, int sources) {
  return region == 0 ? SourceRegion{0, n} : SourceRegion{n, sources};
}

/// The tile_index-th tile of source order: the moving tokens' tiles, then the prefix
/// tokens' (start and count); false past the last. The device kernel stages these tiles in
/// shared memory; sum_over_sources walks the same ones.
MFATTN_HOST_DEVICE inline bool region_tile(int n, int sources, int tile, int tile_index, int& start,
                                           int& count) {
  const int moving_tiles = (n + tile - 1) / tile;
  const bool moving = tile_index < moving_tiles;
  const SourceRegion run = source_region(moving ? 0 : 1, n, sources);
  start = run.begin + (moving ? tile_index : tile_index - moving_tiles) * tile;
  if (start >= run.end) return false;
  count = run.end - start < tile ? run.end - start : tile;
  return true;
}

/// The arrays of one evaluation, on the host or the device (row-major, as the names say).
/// R replicas of n receivers; S = n + P sources per replica (P prefix tokens).
template <class Real>
struct SumsArgs {
  const Real* queries = nullptr;      ///< R x n x d: beta log2(e) G_i Q x_i
  const Real* keys = nullptr;         ///< R x S x d: G_j K y_j
  const Real* values = nullptr;       ///< R x S x d: z_j
  const Real* bias = nullptr;         ///< S: log2 p_j (-inf for p_j = 0), every replica alike
  const double* positions = nullptr;  ///< S x position_dim (read when has_terms)
  const int* prompts = nullptr;       ///< S: prompt of each source (read when has_terms)
  Real* neg_offsets = nullptr;        ///< R x n: -B_i (base 2); the exact pass writes them
  double* sums = nullptr;             ///< R x n: S_i
  double* acc = nullptr;              ///< R x n x d: A_i
  int n = 0, sources = 0, d = 0, position_dim = 0;
  bool has_terms = false;             ///< a mask, factor or per-prompt rule is on
  kernels::PairTermParameters terms;
};

/// a * b + c rounded once, in the type of its operands.
MFATTN_HOST_DEVICE inline double fused(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return fma(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
MFATTN_HOST_DEVICE inline float fused(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return fmaf(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

/// 2^t for t <= 0: the shared polynomial in fp64; the exponential unit (ex2.approx, relative
/// error 2^-22, subnormal results flushed to 0) on the device in fp32, exp2f on the host.
MFATTN_HOST_DEVICE inline double exp2_weight(double t) { return kernels::exp2_nonpositive_scalar(t); }
MFATTN_HOST_DEVICE inline float exp2_weight(float t) {
#if defined(__CUDA_ARCH__)
  float out;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(out) : "f"(t));
  return out;
#else
  return std::exp2(t);
#endif
}

/// The running sums of one receiver (see the file comment for their order).
template <class Real, int kDim, bool kExactDim>
struct ReceiverSums {
  static constexpr bool kTiled = std::is_same_v<Real, float>;
  double sum = 0.0;
  double acc[kDim] = {};
  Real tile_sum = 0;
  Real tile_acc[kTiled ? kDim : 1] = {};

  MFATTN_HOST_DEVICE void add(Real weight, const Real* value, int d) {
    if constexpr (kTiled) {
      tile_sum += weight;
MFATTN_UNROLL
      for (int c = 0; c < kDim; ++c)
        if (kExactDim || c < d) tile_acc[c] = fused(weight, value[c], tile_acc[c]);
    } else {
      sum += weight;
MFATTN_UNROLL
      for (int c = 0; c < kDim; ++c)
        if (kExactDim || c < d) acc[c] = fused(weight, value[c], acc[c]);
    }
  }
  /// The end of a tile: its float sums join the fp64 accumulators (fp64: nothing to do).
  MFATTN_HOST_DEVICE void end_tile(int d) {
    if constexpr (kTiled) {
      sum += double(tile_sum);
      tile_sum = 0;
MFATTN_UNROLL
      for (int c = 0; c < kDim; ++c)
        if (kExactDim || c < d) {
          acc[c] += double(tile_acc[c]);
          tile_acc[c] = 0;
        }
    }
  }
};

/// The receiver's query (d numbers) and its position and prompt, gathered once.
template <class Real, int kDim>
struct Receiver {
  Real query[kDim] = {};
  double position[kMaxPositionDim] = {};
  double prompt = 0.0;
};

template <class Real, int kDim, bool kExactDim, bool kTerms>
MFATTN_HOST_DEVICE inline void load_receiver(const SumsArgs<Real>& a, std::size_t replica, int i,
                                             Receiver<Real, kDim>& out) {
  const int d = kExactDim ? kDim : a.d;
  const Real* query = a.queries + (replica * std::size_t(a.n) + std::size_t(i)) * std::size_t(d);
MFATTN_UNROLL
  for (int c = 0; c < kDim; ++c)
    if (kExactDim || c < d) out.query[c] = query[c];
  if constexpr (kTerms) {
    for (int c = 0; c < a.position_dim; ++c)
      out.position[c] = a.positions[std::size_t(i) * std::size_t(a.position_dim) + std::size_t(c)];
    out.prompt = a.prompts[i];
  }
}

/// log2 of the pair's weight before the offset, and its multiplier: <q_i, k_j> + b_j +
/// log2(e) log(m_ij c_ij). key and the source's position point to its d and position_dim
/// numbers (in global or shared memory).
template <class Real, int kDim, bool kExactDim, bool kTerms>
MFATTN_HOST_DEVICE inline Real pair_logit(const SumsArgs<Real>& a, const Receiver<Real, kDim>& receiver,
                                          const Real* key, Real bias_plus, int source,
                                          const double* source_position, int source_prompt,
                                          Real& factor) {
  const int d = kExactDim ? kDim : a.d;
  Real t = bias_plus;
MFATTN_UNROLL
  for (int c = 0; c < kDim; ++c)
    if (kExactDim || c < d) t = fused(receiver.query[c], key[c], t);
  factor = Real(1);
  if constexpr (kTerms) {
    const kernels::ScalarPair pair{receiver.position, source_position, std::size_t(a.position_dim),
                                   receiver.prompt, double(source_prompt)};
    // Receivers are moving tokens (numbered below n): the per-prompt rule concerns the pair
    // when the source is a prefix token.
    const kernels::PairWeightTerms<double> terms =
        kernels::pair_weight_terms(a.terms, pair, kernels::pair_has_prefix_token(0, source, a.n));
    t += Real(kLog2e * terms.log_term);
    factor = Real(terms.multiplier);
  }
  return t;
}

/// Source j's term of receiver i's sums: its weight c_ij 2^(t_ij) (bias_plus = b_j - B_i)
/// and its value, added in source order. key, value and the source's position point to its
/// numbers in global or shared memory.
template <class Real, int kDim, bool kExactDim, bool kTerms>
MFATTN_HOST_DEVICE inline void add_source(const SumsArgs<Real>& a, const Receiver<Real, kDim>& receiver,
                                          const Real* key, const Real* value, Real bias_plus, int source,
                                          const double* source_position, int source_prompt,
                                          ReceiverSums<Real, kDim, kExactDim>& sums) {
  Real factor;
  const Real t = pair_logit<Real, kDim, kExactDim, kTerms>(a, receiver, key, bias_plus, source,
                                                           source_position, source_prompt, factor);
  Real weight = exp2_weight(t);
  if constexpr (kTerms) weight *= factor;
  sums.add(weight, value, kExactDim ? kDim : a.d);
}

/// The largest base-2 log-weight max_j (<q_i, k_j> + b_j + log2(e) log(m_ij c_ij)) of
/// receiver i over every source, -inf when no source with weight is visible: the exact
/// offset of a receiver whose Cauchy-Schwarz offset was too loose.
template <class Real, int kDim, bool kExactDim, bool kTerms>
MFATTN_HOST_DEVICE inline Real exact_log2_max(const SumsArgs<Real>& a, std::size_t replica,
                                              const Receiver<Real, kDim>& receiver) {
  const int d = kExactDim ? kDim : a.d;
  const Real* keys = a.keys + replica * std::size_t(a.sources) * std::size_t(d);
  Real largest = Real(kernels::negative_infinity());
  for (int j = 0; j < a.sources; ++j) {
    Real factor;
    const double* position =
        kTerms ? a.positions + std::size_t(j) * std::size_t(a.position_dim) : nullptr;
    const Real t = pair_logit<Real, kDim, kExactDim, kTerms>(
        a, receiver, keys + std::size_t(j) * std::size_t(d), a.bias[j], j, position,
        kTerms ? a.prompts[j] : 0, factor);
    largest = t > largest ? t : largest;
  }
  return largest;
}

/// S_i and A_i of receiver i over every source with the offset -neg_offset, read straight
/// from the arrays (the exact pass on the device, and the host's emulation of the device
/// loop); the tiled device kernel takes the same sums through shared memory.
template <class Real, int kDim, bool kExactDim, bool kTerms>
MFATTN_HOST_DEVICE inline void sum_over_sources(const SumsArgs<Real>& a, std::size_t replica,
                                                const Receiver<Real, kDim>& receiver,
                                                Real neg_offset,
                                                ReceiverSums<Real, kDim, kExactDim>& sums) {
  const int d = kExactDim ? kDim : a.d;
  const int tile = source_tile(d);
  const Real* keys = a.keys + replica * std::size_t(a.sources) * std::size_t(d);
  const Real* values = a.values + replica * std::size_t(a.sources) * std::size_t(d);
  int start = 0, count = 0;
  for (int tile_index = 0; region_tile(a.n, a.sources, tile, tile_index, start, count); ++tile_index) {
    for (int j = start; j < start + count; ++j)
      add_source<Real, kDim, kExactDim, kTerms>(
          a, receiver, keys + std::size_t(j) * std::size_t(d), values + std::size_t(j) * std::size_t(d),
          a.bias[j] + neg_offset, j,
          kTerms ? a.positions + std::size_t(j) * std::size_t(a.position_dim) : nullptr,
          kTerms ? a.prompts[j] : 0, sums);
    sums.end_tile(d);
  }
}

/// Writes receiver (replica, i)'s sums into a.sums and a.acc.
template <class Real, int kDim, bool kExactDim>
MFATTN_HOST_DEVICE inline void store_sums(const SumsArgs<Real>& a, std::size_t replica, int i,
                                          const ReceiverSums<Real, kDim, kExactDim>& sums) {
  const int d = kExactDim ? kDim : a.d;
  const std::size_t row = replica * std::size_t(a.n) + std::size_t(i);
  a.sums[row] = sums.sum;
MFATTN_UNROLL
  for (int c = 0; c < kDim; ++c)
    if (kExactDim || c < d) a.acc[row * std::size_t(d) + std::size_t(c)] = sums.acc[c];
}

/// The exact pass for receiver (replica, i): its largest log-weight becomes its offset (in
/// a.neg_offsets), then its sums over every source. No visible source: offset -inf, sums 0.
template <class Real, int kDim, bool kExactDim, bool kTerms>
MFATTN_HOST_DEVICE inline void exact_receiver(const SumsArgs<Real>& a, std::size_t replica, int i) {
  Receiver<Real, kDim> receiver;
  load_receiver<Real, kDim, kExactDim, kTerms>(a, replica, i, receiver);
  const Real largest = exact_log2_max<Real, kDim, kExactDim, kTerms>(a, replica, receiver);
  const std::size_t row = replica * std::size_t(a.n) + std::size_t(i);
  a.neg_offsets[row] = -largest;
  ReceiverSums<Real, kDim, kExactDim> sums;
  if (largest != Real(kernels::negative_infinity()))
    sum_over_sources<Real, kDim, kExactDim, kTerms>(a, replica, receiver, -largest, sums);
  store_sums<Real, kDim, kExactDim>(a, replica, i, sums);
}

/// The first pass for receiver (replica, i), with its Cauchy-Schwarz offset from a.neg_offsets.
template <class Real, int kDim, bool kExactDim, bool kTerms>
MFATTN_HOST_DEVICE inline void bounded_receiver(const SumsArgs<Real>& a, std::size_t replica, int i) {
  Receiver<Real, kDim> receiver;
  load_receiver<Real, kDim, kExactDim, kTerms>(a, replica, i, receiver);
  ReceiverSums<Real, kDim, kExactDim> sums;
  sum_over_sources<Real, kDim, kExactDim, kTerms>(
      a, replica, receiver, a.neg_offsets[replica * std::size_t(a.n) + std::size_t(i)], sums);
  store_sums<Real, kDim, kExactDim>(a, replica, i, sums);
}

}  // namespace mfattn::cuda
