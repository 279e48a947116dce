#pragma once
// The CUDA backend's resident kernel (docs/cuda.md, "Ensembles"): one block per replica keeps
// the replica's sources in shared memory and advances many fixed steps without returning to
// the host. Written once, as functions that a CUDA block and the host's emulation of it run
// alike: a Team runs each phase for every thread of the block, then waits for all of them
// (the device: thread threadIdx.x, then __syncthreads(); the host: the threads one after
// another), and the phases talk only through memory.
//
// One evaluation of the field at a state y (the replica's n rows of d numbers):
//   phase 1  every source j (the moving tokens, then the prefix tokens): its key
//            k_j = G_j K y_j, value z_j (G_j y_j transported, y_j plain) into shared memory,
//            its query q_j = beta log2(e) G_j Q y_j (moving tokens) into global memory, and the
//            thread's largest |k_j|^2 over present sources; a non-finite y_j is a failure;
//   phase 2  the block's largest |k_j|;
//   phase 3  every receiver i: the offset B_i = |q_i| max_j |k_j| + log2(e) max(0, max_j log p_j),
//            the sums S_i, A_i over the shared sources in receiver_sums.hpp's order (fp32: per
//            tile, into fp64), the exact pass where S_i fell below the loose bound, and the
//            finish of kernels/receiver_finish.hpp (the CPU backend's) into the velocity.
// A step of the method (kernels/fixed_steps.hpp) combines evaluations token by token:
//   rk (euler, heun, rk4)  stage states x + h sum_m a[s][m] k_m, then x + h sum_m b[m] k_m,
//                          normalised for moving tokens
//   euler-unprojected      x + h p u (the attention output before the projection), normalised
//   lie-euler              the geodesic step along the velocity
//   euler-maruyama         x + h f + sqrt(2h/kappa) P_x xi, normalised, xi from the token's
//                          counter-based stream (the CPU's numbers)
// Tokens with p_i = 0 never move (their velocity is 0 and they are not normalised).
// A failure (a non-finite state or stage state, a USA weight that overflows) stops the
// replica after the failing step and is reported with the step's index.
//
// Determinism: each receiver's sums are one thread's, in source order; the stage
// combinations are per token; the largest key is a maximum. So the result depends on neither
// the block size, nor the grid, nor the chunking of steps into launches.
#include <cstddef>
#include <cstdint>

#include "backends/cuda/receiver_sums.hpp"
#include "kernels/fixed_steps.hpp"
#include "kernels/receiver_finish.hpp"

namespace mfattn::cuda {

/// Largest d, sources (n + P) per replica and threads per block of the resident kernel.
inline constexpr int kResidentMaxDim = 8;
inline constexpr int kResidentMaxSources = 1024;
inline constexpr int kResidentMaxThreads = 256;

enum class ResidentMethod : int { RungeKutta, EulerUnprojected, LieEuler, EulerMaruyama };

/// Failure kinds, as bits of ResidentShared::failure.
inline constexpr int kNonFiniteFailure = 1, kOverflowFailure = 2;
/// ResidentArgs::failure_order of a non-finite state after the step's last evaluation.
inline constexpr int kAfterStep = 1 << 20;

/// Everything the resident kernel reads and writes, on the host or the device. R replicas of n
/// moving tokens and P prefix tokens (S = n + P sources).
template <class Real>
struct ResidentArgs {
  int n = 0, sources = 0, d = 0, position_dim = 0;
  int threads = 32;  ///< threads per block (a power of two, 32 to kResidentMaxThreads)
  bool has_terms = false;
  kernels::PairTermParameters terms;
  kernels::FinishTerms finish;
  double query_scale = 0.0;    ///< beta log2(e)
  double largest_bias = 0.0;   ///< max(0, max_j log p_j) over present sources (natural log)
  const double* presence = nullptr;   ///< n: p_i
  const Real* bias = nullptr;         ///< S: log2 p_j, -inf for a null source
  const double* positions = nullptr;  ///< S x position_dim (read when has_terms)
  const int* prompts = nullptr;       ///< S (read when has_terms)
  const double* prefix = nullptr;     ///< P x d: the prefix tokens' contents
  const double* gauges = nullptr;     ///< S x d x d: G_j row-major; null: no gauge
  bool transported = true;            ///< values G_j y_j (else y_j)
  /// Q, K, V (d x d row-major; null: identity) of replica 0; replica r's are matrix_stride
  /// numbers further on (0: one set for every replica).
  const double *q = nullptr, *k = nullptr, *v = nullptr;
  std::size_t matrix_stride = 0;
  ResidentMethod method = ResidentMethod::RungeKutta;
  kernels::FixedTableau tableau;
  double noise_kappa = 0.0;
  std::uint64_t seed = 0;
  double* x = nullptr;        ///< R x n x d: the state, advanced in place
  double* stage = nullptr;    ///< R x n x d: the stage state
  double* slopes = nullptr;   ///< kMaxStages blocks of R x n x d: the stages' velocities
  Real* queries = nullptr;    ///< R x n x d
  long long* failed_step = nullptr;  ///< R: the failing step's index in the call, -1 for none
  int* failure = nullptr;            ///< R: failure bits
  /// R: where in the failing step: 2 e for a non-finite input of its evaluation e (found
  /// before the evaluation, as Dynamics does), 2 e + 1 for an overflow during it, and
  /// kAfterStep for a non-finite result, so that the earliest failure across replicas is the
  /// CPU path's.
  int* failure_order = nullptr;
  double* failure_value = nullptr;   ///< R: the overflowing exponent (kOverflowFailure)

  MFATTN_HOST_DEVICE double* slope(int s) const {
    return slopes + std::size_t(s) * replicas_stride();
  }
  MFATTN_HOST_DEVICE std::size_t replicas_stride() const { return replicas * std::size_t(n) * std::size_t(d); }
  std::size_t replicas = 0;
};

/// The block's shared memory: the sources' keys, values and labels, and the phases' notes.
template <class Real>
struct ResidentShared {
  Real* keys;          ///< S x d
  Real* values;        ///< S x d
  Real* bias;          ///< S
  double* positions;   ///< S x position_dim (with terms)
  int* prompts;        ///< S (with terms)
  double* partial;     ///< threads: each thread's largest |k_j|^2
  double* largest_key; ///< 1
  double* failure_value;  ///< 1
  int* failure;        ///< 1: failure bits of the current step
  int* order;          ///< 1: ResidentArgs::failure_order of the current step's failure
  int* evaluations;    ///< 1: evaluations so far in the current step
};

/// Bytes of shared memory one block takes.
MFATTN_HOST_DEVICE inline std::size_t resident_shared_bytes(int sources, int d, int position_dim, int threads,
                                                           bool terms, std::size_t real_size) {
  std::size_t bytes = std::size_t(sources) * (2 * std::size_t(d) + 1) * real_size;
  bytes = (bytes + 7) / 8 * 8;
  if (terms) bytes += std::size_t(sources) * std::size_t(position_dim) * sizeof(double);
  bytes += (std::size_t(threads) + 2) * sizeof(double);
  if (terms) bytes += std::size_t(sources) * sizeof(int);
  return bytes + 3 * sizeof(int);
}

/// The shared arrays carved out of `base` (16-byte aligned, resident_shared_bytes long).
template <class Real>
MFATTN_HOST_DEVICE inline ResidentShared<Real> carve_resident_shared(unsigned char* base, const ResidentArgs<Real>& a) {
  ResidentShared<Real> mem;
  const std::size_t sources = std::size_t(a.sources), d = std::size_t(a.d);
  mem.keys = reinterpret_cast<Real*>(base);
  mem.values = mem.keys + sources * d;
  mem.bias = mem.values + sources * d;
  std::size_t offset = (sources * (2 * d + 1) * sizeof(Real) + 7) / 8 * 8;
  mem.positions = reinterpret_cast<double*>(base + offset);
  if (a.has_terms) offset += sources * std::size_t(a.position_dim) * sizeof(double);
  mem.partial = reinterpret_cast<double*>(base + offset);
  mem.largest_key = mem.partial + a.threads;
  mem.failure_value = mem.largest_key + 1;
  offset += (std::size_t(a.threads) + 2) * sizeof(double);
  mem.prompts = reinterpret_cast<int*>(base + offset);
  if (a.has_terms) offset += sources * sizeof(int);
  mem.failure = reinterpret_cast<int*>(base + offset);
  mem.order = mem.failure + 1;
  mem.evaluations = mem.failure + 2;
  return mem;
}

/// The host's team: each phase for threads 0, 1, ..., size - 1 in turn.
struct HostTeam {
  int size;
  template <class Phase>
  void each(Phase&& phase) const {
    for (int t = 0; t < size; ++t) phase(t);
  }
};

/// out = M y (M row-major d x d; null: the identity, out = y). Returns out or y.
MFATTN_HOST_DEVICE inline const double* apply_matrix(const double* m, const double* y, int d, double* out) {
  if (!m) return y;
  kernels::matrix_product(kernels::RowMajorRows{m, d}, d, y, out);
  return out;
}

/// out = M^T y (M row-major d x d).
MFATTN_HOST_DEVICE inline void apply_transpose(const double* m, const double* y, int d, double* out) {
  for (int c = 0; c < d; ++c) {
    double sum = 0.0;
    for (int r = 0; r < d; ++r) sum += m[r * d + c] * y[r];
    out[c] = sum;
  }
}

/// value <- max(value, candidate) for candidate >= 0 (threads of a phase may race: a maximum
/// is the same whoever writes last).
MFATTN_HOST_DEVICE inline void keep_largest(double* value, double candidate) {
#if defined(__CUDA_ARCH__)
  // Non-negative doubles order as their bit patterns.
  atomicMax(reinterpret_cast<unsigned long long*>(value), static_cast<unsigned long long>(__double_as_longlong(candidate)));
#else
  if (candidate > *value) *value = candidate;
#endif
}

/// Sets a failure bit (threads of a phase may set the same bit together).
MFATTN_HOST_DEVICE inline void mark_failure(int* failure, int bit) {
#if defined(__CUDA_ARCH__)
  atomicOr(failure, bit);
#else
  *failure |= bit;
#endif
}

/// One replica's block: its arguments, shared memory and place.
template <class Real, int kDim, bool kExactDim, bool kTerms>
struct ResidentReplica {
  static constexpr double kLooseBound = sizeof(Real) == sizeof(float) ? 0x1p-60 : 1e-250;
  const ResidentArgs<Real>& a;
  ResidentShared<Real> mem;
  std::size_t replica;

  MFATTN_HOST_DEVICE std::size_t row(int i) const { return replica * std::size_t(a.n) + std::size_t(i); }
  MFATTN_HOST_DEVICE const double* matrix(const double* m) const {
    return m ? m + replica * a.matrix_stride : nullptr;
  }
  MFATTN_HOST_DEVICE const double* gauge(int j) const {
    return a.gauges ? a.gauges + std::size_t(j) * std::size_t(a.d) * std::size_t(a.d) : nullptr;
  }
  /// The shared sources as receiver_sums.hpp's arguments (replica 0 of a one-replica view).
  MFATTN_HOST_DEVICE SumsArgs<Real> sources_view() const {
    SumsArgs<Real> view;
    view.queries = a.queries + replica * std::size_t(a.n) * std::size_t(a.d);
    view.keys = mem.keys;
    view.values = mem.values;
    view.bias = mem.bias;
    view.positions = mem.positions;
    view.prompts = mem.prompts;
    view.n = a.n;
    view.sources = a.sources;
    view.d = a.d;
    view.position_dim = a.position_dim;
    view.has_terms = a.has_terms;
    view.terms = a.terms;
    return view;
  }

  /// The labels of the sources into shared memory (once per launch).
  template <class Team>
  MFATTN_HOST_DEVICE void load_labels(const Team& team) const {
    team.each([&](int t) {
      for (int j = t; j < a.sources; j += team.size) {
        mem.bias[j] = a.bias[j];
        if constexpr (kTerms) {
          mem.prompts[j] = a.prompts[j];
          for (int c = 0; c < a.position_dim; ++c)
            mem.positions[j * a.position_dim + c] = a.positions[j * a.position_dim + c];
        }
      }
      if (t == 0) {
        *mem.failure = 0;
        *mem.failure_value = 0.0;
      }
    });
  }

  /// The field at y (this replica's n rows) into velocity (and p_i u_i into attention_output
  /// when not null), both with rows of the whole R x n x d arrays. False after a failure.
  template <class Team>
  MFATTN_HOST_DEVICE MFATTN_DEVICE_NOINLINE bool evaluate(const Team& team, const double* y_all, double* velocity_all,
                                   double* attention_all) const {
    const int d = a.d;
    const double* q = matrix(a.q);
    const double* k = matrix(a.k);
    team.each([&](int t) {  // phase 1: operands
      double largest = 0.0;
      for (int j = t; j < a.sources; j += team.size) {
        const double* y = j < a.n ? y_all + row(j) * std::size_t(d) : a.prefix + std::size_t(j - a.n) * std::size_t(d);
        double tmp[kDim], out[kDim];
        if (j < a.n)
          for (int c = 0; c < d; ++c)
            if (!std::isfinite(y[c])) mark_failure(mem.failure, kNonFiniteFailure);
        const double* g = gauge(j);
        const double* key = apply_matrix(k, y, d, tmp);
        key = apply_matrix(g, key, d, out);
        double norm2 = 0.0;
        for (int c = 0; c < d; ++c) {
          const Real stored = Real(key[c]);
          mem.keys[j * d + c] = stored;
          norm2 += double(stored) * double(stored);
        }
        // Null sources stay out of the bound, so that adding them changes no offset.
        if (a.bias[j] > Real(kernels::negative_infinity()) && norm2 > largest) largest = norm2;
        const double* value = a.transported ? apply_matrix(g, y, d, out) : y;
        for (int c = 0; c < d; ++c) mem.values[j * d + c] = Real(value[c]);
        if (j < a.n) {
          const double* query = apply_matrix(g, apply_matrix(q, y, d, tmp), d, out);
          Real* stored = a.queries + row(j) * std::size_t(d);
          for (int c = 0; c < d; ++c) stored[c] = Real(a.query_scale * query[c]);
        }
      }
      mem.partial[t] = largest;
    });
    team.each([&](int t) {  // phase 2: the largest key
      if (t != 0) return;
      double largest = 0.0;
      for (int u = 0; u < team.size; ++u) largest = mem.partial[u] > largest ? mem.partial[u] : largest;
      *mem.largest_key = std::sqrt(largest);
    });
    const int evaluation = *mem.evaluations;
    if (failed(team)) {
      note_order(team, 2 * evaluation);
      return false;
    }
    const SumsArgs<Real> view = sources_view();
    const double* v = matrix(a.v);
    team.each([&](int t) {  // phase 3: sums and finish
      for (int i = t; i < a.n; i += team.size) {
        Receiver<Real, kDim> receiver;
        load_receiver<Real, kDim, kExactDim, kTerms>(view, 0, i, receiver);
        double query2 = 0.0;
        for (int c = 0; c < d; ++c) query2 += double(receiver.query[c]) * double(receiver.query[c]);
        Real neg_offset = Real(-kernels::cauchy_schwarz_offset(query2, *mem.largest_key, a.largest_bias * kLog2e));
        ReceiverSums<Real, kDim, kExactDim> sums;
        sum_over_sources<Real, kDim, kExactDim, kTerms>(view, 0, receiver, neg_offset, sums);
        if (!(sums.sum >= kLooseBound)) {
          // The exact pass: the receiver's largest log-weight as its offset.
          const Real largest = exact_log2_max<Real, kDim, kExactDim, kTerms>(view, 0, receiver);
          neg_offset = -largest;
          sums = ReceiverSums<Real, kDim, kExactDim>{};
          if (largest != Real(kernels::negative_infinity()))
            sum_over_sources<Real, kDim, kExactDim, kTerms>(view, 0, receiver, neg_offset, sums);
        }
        const double log_max = -double(neg_offset) * kLn2;
        const double scale = kernels::finish_needs_scale(a.finish, false)
                                 ? std::exp(log_max - a.finish.exponent_shift)
                                 : 1.0;
        const double* x_i = y_all + row(i) * std::size_t(d);
        const double* g = gauge(i);
        double scratch[2 * kDim];
        const kernels::FinishOutcome outcome = kernels::finish_sums(
            a.finish, a.presence[i], d, x_i, log_max, scale, sums.sum, sums.acc, v,
            velocity_all + row(i) * std::size_t(d),
            attention_all ? attention_all + row(i) * std::size_t(d) : nullptr, scratch,
            [&](const double* in, double* rotated) {
              if (!g || !a.transported) return false;
              apply_transpose(g, in, d, rotated);
              return true;
            });
        if (outcome.overflow) {
          mark_failure(mem.failure, kOverflowFailure);
          // The largest overflowing exponent (above 709, so positive).
          keep_largest(mem.failure_value, outcome.log_scale > 0.0 ? outcome.log_scale : 0.0);
        }
      }
    });
    if (failed(team)) {
      note_order(team, 2 * evaluation + 1);
      return false;
    }
    team.each([&](int t) {
      if (t == 0) ++*mem.evaluations;
    });
    return true;
  }

  /// Records where in the step the failure happened (thread 0, then a barrier).
  template <class Team>
  MFATTN_HOST_DEVICE void note_order(const Team& team, int order) const {
    team.each([&](int t) {
      if (t == 0) *mem.order = order;
    });
  }

  /// Whether a phase so far failed, the same answer for every thread: all read the flag
  /// before any goes on to a phase that may set it.
  template <class Team>
  MFATTN_HOST_DEVICE bool failed(const Team& team) const {
    const bool any = *mem.failure != 0;
    team.each([](int) {});
    return any;
  }

  /// Applies step(i, x_i) to every moving token's row of `rows`, in one phase.
  template <class Team, class Step>
  MFATTN_HOST_DEVICE void each_moving_token(const Team& team, Step&& step) const {
    team.each([&](int t) {
      for (int i = t; i < a.n; i += team.size)
        if (a.presence[i] > 0.0) step(i, a.x + row(i) * std::size_t(a.d));
    });
  }

  /// x + h sum_m c[m] k_m for every token (every coordinate, as Integrator::step takes it),
  /// into out; normalised for moving tokens when `normalize` (the step's end).
  template <class Team>
  MFATTN_HOST_DEVICE void combine(const Team& team, const double* c, int terms, double h, double* out_all,
                                  bool normalize) const {
    const int d = a.d;
    team.each([&](int t) {
      for (int i = t; i < a.n; i += team.size) {
        const std::size_t base = row(i) * std::size_t(d);
        for (int e = 0; e < d; ++e) {
          double increment = 0.0;
          for (int m = 0; m < terms; ++m) increment += c[m] * a.slope(m)[base + std::size_t(e)];
          out_all[base + std::size_t(e)] = a.x[base + std::size_t(e)] + h * increment;
        }
        if (normalize && a.presence[i] > 0.0) kernels::normalize_token(out_all + base, d);
      }
    });
  }

  /// A non-finite state after the step is a failure (as integrate()'s check of every number).
  template <class Team>
  MFATTN_HOST_DEVICE bool state_finite(const Team& team) const {
    team.each([&](int t) {
      for (int i = t; i < a.n; i += team.size)
        for (int c = 0; c < a.d; ++c)
          if (!std::isfinite(a.x[row(i) * std::size_t(a.d) + std::size_t(c)]))
            mark_failure(mem.failure, kNonFiniteFailure);
    });
    if (failed(team)) {
      note_order(team, kAfterStep);
      return false;
    }
    return true;
  }

  /// One step of the method from a.x; false after a failure.
  template <class Team>
  MFATTN_HOST_DEVICE bool step(const Team& team, double h, std::uint64_t steps_before) const {
    const int d = a.d;
    team.each([&](int t) {
      if (t == 0) *mem.evaluations = 0;
    });
    switch (a.method) {
      case ResidentMethod::RungeKutta: {
        const kernels::FixedTableau& tableau = a.tableau;
        if (!evaluate(team, a.x, a.slope(0), nullptr)) return false;
        for (int s = 1; s < tableau.stages; ++s) {
          combine(team, tableau.a[s], s, h, a.stage, false);
          if (!evaluate(team, a.stage, a.slope(s), nullptr)) return false;
        }
        combine(team, tableau.b, tableau.stages, h, a.x, true);
        break;
      }
      case ResidentMethod::EulerUnprojected: {
        double* output = a.slope(1);
        if (!evaluate(team, a.x, a.slope(0), output)) return false;
        each_moving_token(team, [&](int i, double* x) {
          const double* out = output + row(i) * std::size_t(d);
          for (int c = 0; c < d; ++c) x[c] += h * out[c];
          kernels::normalize_token(x, d);
        });
        break;
      }
      case ResidentMethod::LieEuler: {
        if (!evaluate(team, a.x, a.slope(0), nullptr)) return false;
        each_moving_token(team, [&](int i, double* x) {
          kernels::geodesic_step(x, a.slope(0) + row(i) * std::size_t(d), h, d);
        });
        break;
      }
      case ResidentMethod::EulerMaruyama: {
        if (!evaluate(team, a.x, a.slope(0), nullptr)) return false;
        const double amplitude = kernels::noise_amplitude(h, a.noise_kappa);
        each_moving_token(team, [&](int i, double* x) {
          double noise[kDim];
          kernels::maruyama_step(x, a.slope(0) + row(i) * std::size_t(d), h, amplitude, a.seed, replica,
                                 std::uint64_t(i), steps_before, d, noise);
        });
        break;
      }
    }
    return state_finite(team);
  }

  /// `steps` steps of size h, the first after steps_before steps; a failure stops the replica
  /// and records its step (0-based in this call) and kind.
  template <class Team>
  MFATTN_HOST_DEVICE void advance(const Team& team, long long steps_before, long long steps, double h) const {
    load_labels(team);
    long long done = 0;
    while (done < steps && step(team, h, std::uint64_t(steps_before + done))) ++done;
    team.each([&](int t) {
      if (t != 0) return;
      a.failed_step[replica] = done < steps ? done : -1;
      a.failure[replica] = *mem.failure;
      a.failure_value[replica] = (*mem.failure & kOverflowFailure) ? *mem.failure_value : 0.0;
      a.failure_order[replica] = done < steps ? *mem.order : 0;
    });
  }
};

/// Calls body(std::integral_constant<int, kDim>{}, std::bool_constant<kExactDim>{}) for the
/// resident kernel's compiled dimensions: 2 and 3 exactly, 4 to 8 padded to 8.
template <class Body>
void visit_resident_dimension(int d, Body&& body) {
  switch (d) {
    case 2: return body(std::integral_constant<int, 2>{}, std::true_type{});
    case 3: return body(std::integral_constant<int, 3>{}, std::true_type{});
    default: return body(std::integral_constant<int, kResidentMaxDim>{}, std::false_type{});
  }
}

}  // namespace mfattn::cuda
