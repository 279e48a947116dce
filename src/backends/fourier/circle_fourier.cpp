// --evaluation fourier on the circle (docs/model.md, "Fast summation on the circle"): the sums
// of every receiver from the source moments of kernels/circle_series.hpp in O(n P), finished by
// the one receiver finish of every backend (detail::finish_receiver).
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <complex>
#include <limits>
#include <numeric>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend_common.hpp"
#include "backends/model_sources.hpp"
#include "kernels/circle_series.hpp"
#include "mfattn/backends/backend.hpp"
#include "mfattn/core/gauge.hpp"

namespace mfattn {
namespace {

using Complex = std::complex<double>;

/// Sources are summed in fixed blocks, each block's moments added in block order, so the sums
/// are the same for every thread count.
constexpr std::size_t kSourceBlock = 4096;

/// A matrix of the one head as a planar map (identity when the head says so).
kernels::PlanarMap planar_of(const Matrix& m, bool identity) {
  return identity ? kernels::PlanarMap{{1.0, 0.0}, {0.0, 0.0}}
                  : kernels::planar_map(m(0, 0), m(0, 1), m(1, 0), m(1, 1));
}

Complex times(const Complex& a, const Complex& b) {
  return {a.real() * b.real() - a.imag() * b.imag(), a.real() * b.imag() + a.imag() * b.real()};
}

/// u / |u| (u itself when 0): the point of the circle a token's kernel reads.
Complex direction(const Complex& u) {
  // sqrt, not hypot (several times slower): a token's norm is near 1, far from overflow.
  const double radius = std::sqrt(u.real() * u.real() + u.imag() * u.imag());
  if (!(radius > 0.0)) return u;
  const double inverse = 1.0 / radius;
  return Complex(u.real() * inverse, u.imag() * inverse);
}

/// x / |x| of a point of R^3 into `out` (x itself when 0): the point of S^2 its kernel reads.
void direction3(const double* x, double* out) {
  const double radius = std::sqrt(x[0] * x[0] + x[1] * x[1] + x[2] * x[2]);
  const double scale = radius > 0.0 ? 1.0 / radius : 1.0;
  for (int c = 0; c < 3; ++c) out[c] = x[c] * scale;
}

/// Whether the series resolves a receiver's SA ratio: the truncated series' error of its shifted
/// weight sum S is at most tol plus a few ulps a term, of each visible source's presence (the
/// visible presence W), so S is known to 1e-8 of itself when that bound is. Else the receiver's
/// sources are summed directly (kernels::circle_pair_score, zonal_pair_score): a receiver that
/// sees only a few far sources at large |beta|, as the first ones under a causal mask. USA
/// divides by the mass, not by S, and needs no such care.
bool series_resolves(double weight_sum, double visible_presence, double tol, std::size_t terms) {
  constexpr double kRelative = 1e-8;
  const double error = visible_presence * (tol + 4.0 * double(terms) * 2.220446049250313e-16);
  return weight_sum * kRelative >= error;
}

bool negligible(const Complex& z, double scale) {
  return std::abs(z) <= 1e-14 * std::max(scale, 1e-300);
}

/// The gauge's sign sigma of kernels/circle_series.hpp for one head: +1 when Q and K are both
/// conformal, -1 when both anti-conformal, 0 without a gauge; nullopt-like -2 when a gauge meets
/// other matrices (the series would need two angles per token).
int gauge_sign(const Model& model, const kernels::PlanarMap& q, const kernels::PlanarMap& k) {
  if (!model.gauge) return 0;
  const double scale = std::abs(q.mu) + std::abs(q.nu) + std::abs(k.mu) + std::abs(k.nu);
  if (negligible(q.nu, scale) && negligible(k.nu, scale)) return 1;
  if (negligible(q.mu, scale) && negligible(k.mu, scale)) return -1;
  return -2;
}

/// Under a causal mask on the circle each contraction of the running moments costs the series'
/// T terms (two complex products each) and serves the receivers of one segment; a receiver
/// sums the sources past its segment's start directly, an exponential and a score each, about
/// kDirectPerTerm terms' work (measured: at beta = 4, n = 10^6, the best segments were 4 to 16
/// sources for Q = K = I, T = 39, and 32 to 64 for random Q and K, T = 1599). A segment of B
/// sources costs a receiver T / B + kDirectPerTerm B / 2 terms: least, 2 sqrt(T), at
/// B = sqrt(2 T / kDirectPerTerm) = sqrt(T).
constexpr double kDirectPerTerm = 2.0;
std::size_t causal_segment(std::size_t terms) {
  return std::max<std::size_t>(
      1, std::size_t(std::lround(std::sqrt(2.0 * double(terms) / kDirectPerTerm))));
}

/// The series of one matrix set: the score's two terms, the coefficients c_kl grouped by the
/// receiver's frequency p = k + l and the source's m = l - k, and the angle rule.
struct SetSeries {
  int sigma = 0;
  double log_max = 0.0;  ///< |a| + |b|: the shift of every weight
  kernels::CircleScore score{};  ///< the score's two terms (circle_pair_score)
  int K = 0, L = 0;      ///< |k| <= K, |l| <= L; frequencies |m|, |p| <= K + L
  /// The nonzero sums c_pm of c_kl over k + l = p, l - k = m (one pair (k, l) per (p, m) of
  /// equal parity), by p, then m: what a receiver's contraction reads.
  struct Term {
    int p, m;
    Complex c;
  };
  std::vector<Term> terms;
  /// Under a causal mask, the sources a receiver may sum directly past its segment's start
  /// before the running moments are contracted anew (causal_segment).
  std::size_t segment = 1;
  int P() const { return K + L; }
};

SetSeries series_of(const Model& model, const AttentionMatrices& set, double tol) {
  const AttentionHead& head = set.heads.front();
  const kernels::PlanarMap q = planar_of(head.query, head.query_identity);
  const kernels::PlanarMap k = planar_of(head.key, head.key_identity);
  SetSeries s;
  s.sigma = gauge_sign(model, q, k);
  const kernels::CircleScore score = kernels::circle_score(model.beta, q, k);
  s.score = score;
  // a e^{i alpha} and b e^{i gamma} with a, b >= 0 (a repulsive beta turns the phases by pi).
  const double a = std::abs(score.difference), b = std::abs(score.sum);
  const double alpha = a > 0 ? std::arg(score.difference) : 0.0,
               gamma = b > 0 ? std::arg(score.sum) : 0.0;
  const std::vector<double> ia = kernels::scaled_bessel_series(a, tol);
  const std::vector<double> ib = kernels::scaled_bessel_series(b, tol);
  s.K = int(ia.size()) - 1;
  s.L = int(ib.size()) - 1;
  s.log_max = std::fabs(a) + std::fabs(b);
  const int P = s.P(), width = 2 * P + 1;
  // coefficients[(p + P) * width + (m + P)], P = K + L, width = 2 P + 1.
  std::vector<Complex> coefficients(std::size_t(width) * std::size_t(width), Complex(0.0, 0.0));
  for (int kk = -s.K; kk <= s.K; ++kk)
    for (int ll = -s.L; ll <= s.L; ++ll) {
      const double magnitude = ia[std::size_t(std::abs(kk))] * ib[std::size_t(std::abs(ll))];
      const Complex c = std::polar(magnitude, double(kk) * alpha + double(ll) * gamma);
      coefficients[std::size_t(kk + ll + P) * std::size_t(width) + std::size_t(ll - kk + P)] += c;
    }
  for (int p = -P; p <= P; ++p)
    for (int m = -P; m <= P; ++m) {
      const Complex c = coefficients[std::size_t(p + P) * std::size_t(width) + std::size_t(m + P)];
      if (c != Complex(0.0, 0.0)) s.terms.push_back(SetSeries::Term{p, m, c});
    }
  s.segment = causal_segment(s.terms.size());
  return s;
}

/// What the two series share as backends: their name, which find_evaluator maps to their
/// registry entry (kSeriesEvaluation: no derivatives, refused there before any work).
class SeriesBackend : public Backend {
 public:
  std::string name() const override { return kSeriesEvaluation.name; }
};

/// The series of the matrix sets last seen, each kept with the numbers it was made from (the
/// head's Q and K, beta, the gauge's presence), so that a set is expanded once, not at every
/// evaluation, and a set whose numbers changed (a new layer) is expanded again.
class SeriesCache {
 public:
  const SetSeries& of(const Model& model, const AttentionMatrices& set, double tol) {
    Key key{model.beta, model.gauge ? 1.0 : 0.0};
    const AttentionHead& head = set.heads.front();
    std::size_t at = 2;
    for (const auto& [matrix, identity] :
         {std::pair{&head.query, head.query_identity}, std::pair{&head.key, head.key_identity}}) {
      key[at++] = identity ? 1.0 : 0.0;
      for (Eigen::Index e = 0; e < 4; ++e) key[at++] = identity ? 0.0 : (*matrix)(e / 2, e % 2);
    }
    for (const Entry& entry : entries_)
      if (entry.set == &set && entry.key == key) return entry.series;
    for (Entry& entry : entries_)
      if (entry.set == &set) {
        entry.key = key;
        entry.series = series_of(model, set, tol);
        return entry.series;
      }
    entries_.push_back(Entry{&set, key, series_of(model, set, tol)});
    return entries_.back().series;
  }

 private:
  /// beta, the gauge's presence, then for Q and K: identity, and the four entries.
  using Key = std::array<double, 12>;
  struct Entry {
    const AttentionMatrices* set;
    Key key;
    SetSeries series;
  };
  std::vector<Entry> entries_;
};

/// The sources in the order a causal mask reveals them (docs/model.md section 2f): by the
/// first position coordinate (prefix tokens too), those of one position together in a group
/// (under causal every receiver of a group sees the whole group, under causal-strict none of
/// it), cut into blocks of at least kSourceBlock sources (the last may have fewer) that end
/// where a group ends. Positions are labels: the order is made once. The visibility is
/// kernels::CausalMask's, xi_j <= xi_i (strict: <), so the series sums what the pair loops do.
struct CausalOrder {
  bool strict = false;
  std::vector<std::size_t> order;        ///< sources by position (stable: by index on ties)
  std::vector<std::size_t> group_end;    ///< the end in `order` of each group, ascending
  std::vector<std::size_t> block_group;  ///< the first group of each block, then the count
  std::size_t blocks() const { return block_group.size() - 1; }

  static std::unique_ptr<CausalOrder> of(const Model& model) {
    if (!is_causal(model.pair_terms.mask)) return nullptr;
    auto causal = std::make_unique<CausalOrder>();
    causal->strict = model.pair_terms.mask == MaskKind::CausalStrict;
    const std::size_t sources = model.n + model.prefix_count();
    auto position = [&](std::size_t j) { return host::source_position(model, j)[0]; };
    causal->order.resize(sources);
    std::iota(causal->order.begin(), causal->order.end(), std::size_t{0});
    std::stable_sort(causal->order.begin(), causal->order.end(),
                     [&](std::size_t u, std::size_t v) { return position(u) < position(v); });
    for (std::size_t at = 1; at <= sources; ++at)
      if (at == sources || position(causal->order[at]) != position(causal->order[at - 1]))
        causal->group_end.push_back(at);
    causal->block_group.push_back(0);
    std::size_t block_start = 0;
    for (std::size_t g = 0; g < causal->group_end.size(); ++g)
      if (causal->group_end[g] - block_start >= kSourceBlock || g + 1 == causal->group_end.size()) {
        causal->block_group.push_back(g + 1);
        block_start = causal->group_end[g];
      }
    if (causal->block_group.size() == 1) causal->block_group.push_back(0);  // no source at all
    return causal;
  }
  std::size_t group_begin(std::size_t g) const { return g == 0 ? 0 : group_end[g - 1]; }
};

/// The fixed blocks of kSourceBlock sources each sum into their own row of `partial` (stride
/// numbers) in parallel, and the rows are added in block order: the same sums for every thread
/// count. make_adder() gives a block its adder, adder(j, sums) adding source j's moments (the
/// series' own; scratch lives in the adder). Returns the total.
template <class Value, class MakeAdder>
std::vector<Value> block_sums(std::size_t sources, std::size_t stride, int threads,
                              std::vector<Value>& partial, MakeAdder make_adder) {
  const std::size_t blocks = (sources + kSourceBlock - 1) / kSourceBlock;
  partial.assign(blocks * stride, Value{});
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::size_t block = 0; block < blocks; ++block) {
    auto adder = make_adder();
    const std::size_t end = std::min(sources, (block + 1) * kSourceBlock);
    for (std::size_t j = block * kSourceBlock; j < end; ++j) adder(j, partial.data() + block * stride);
  }
  std::vector<Value> total(stride, Value{});
  for (std::size_t block = 0; block < blocks; ++block)
    for (std::size_t h = 0; h < stride; ++h) total[h] += partial[block * stride + h];
  return total;
}

/// The causal sweep both series share (docs/model.md section 2f): each block's totals in
/// parallel, their prefix sums in block order (into `partial`, row b the moments before block
/// b), then each block's groups in order, adding their sources to running moments and handing
/// each receiver those it sees. make_worker() gives a block its worker, with
///   bool add(j, sums): adds source j's moments; false for a source without weight (not seen);
///   void receive(i, running, visible, seen_end): receiver i, the moments of the `visible`
///     weighted sources it sees, which are order[0, seen_end).
/// The same bits for every thread count: blocks are fixed, and each sums in its own order.
template <class Value, class MakeWorker>
void causal_sweep(const CausalOrder& causal, std::size_t n, std::size_t stride, int threads,
                  std::vector<Value>& partial, MakeWorker make_worker) {
  const std::size_t blocks = causal.blocks();
  auto groups = [&](std::size_t block) {
    return std::pair{causal.block_group[block], causal.block_group[block + 1]};
  };
  partial.assign((blocks + 1) * stride, Value{});
  std::vector<std::size_t> seen(blocks + 1, 0);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::size_t block = 0; block < blocks; ++block) {
    auto worker = make_worker();
    const auto [first, last] = groups(block);
    for (std::size_t at = causal.group_begin(first); at < causal.group_begin(last); ++at)
      seen[block + 1] += worker.add(causal.order[at], partial.data() + (block + 1) * stride) ? 1 : 0;
  }
  for (std::size_t block = 1; block <= blocks; ++block) {
    for (std::size_t h = 0; h < stride; ++h) partial[block * stride + h] += partial[(block - 1) * stride + h];
    seen[block] += seen[block - 1];
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::size_t block = 0; block < blocks; ++block) {
    auto worker = make_worker();
    std::vector<Value> running(partial.begin() + std::ptrdiff_t(block * stride),
                               partial.begin() + std::ptrdiff_t((block + 1) * stride));
    std::size_t visible = seen[block];
    auto add_group = [&](std::size_t g) {
      for (std::size_t at = causal.group_begin(g); at < causal.group_end[g]; ++at)
        visible += worker.add(causal.order[at], running.data()) ? 1 : 0;
    };
    const auto [first, last] = groups(block);
    for (std::size_t g = first; g < last; ++g) {
      if (!causal.strict) add_group(g);
      const std::size_t seen_end = causal.strict ? causal.group_begin(g) : causal.group_end[g];
      for (std::size_t at = causal.group_begin(g); at < causal.group_end[g]; ++at)
        if (const std::size_t i = causal.order[at]; i < n)  // prefix tokens are sources only
          worker.receive(i, running.data(), visible, seen_end);
      if (causal.strict) add_group(g);
    }
  }
}

/// The circle's source moments m = 0..P of one source, added to sum (3 (P + 1) complex numbers
/// as doubles): M_m += p e^{i m xi}, Z_m += p z e^{i m xi}, W_m += p conj(z) e^{i m xi}.
/// Plain real arithmetic: std::complex's product checks for infinities (__muldc3), which made
/// this loop three times slower.
inline void add_circle_moments(double* sum, int P, const Complex& step, const Complex& z,
                               double p) {
  const double step_re = step.real(), step_im = step.imag(), z_re = z.real(), z_im = z.imag();
  double power_re = p, power_im = 0.0;
  for (int m = 0; m <= P; ++m) {
    sum[2 * m] += power_re;
    sum[2 * m + 1] += power_im;
    // power z and power conj(z)
    const double pz_re = power_re * z_re - power_im * z_im,
                 pz_im = power_re * z_im + power_im * z_re;
    const double pw_re = power_re * z_re + power_im * z_im,
                 pw_im = power_im * z_re - power_re * z_im;
    sum[2 * (P + 1 + m)] += pz_re;
    sum[2 * (P + 1 + m) + 1] += pz_im;
    sum[2 * (2 * (P + 1) + m)] += pw_re;
    sum[2 * (2 * (P + 1) + m) + 1] += pw_im;
    const double next_re = power_re * step_re - power_im * step_im;
    power_im = power_re * step_im + power_im * step_re;
    power_re = next_re;
  }
}

/// The receivers' coefficients from source moments (add_circle_moments' layout):
/// C_p = sum_m c_pm M_m and Cz_p = sum_m c_pm Z_m, p = -P..P at index p + P, over the
/// series' nonzero terms (M_-m = conj(M_m), Z_-m = conj(W_m)).
inline void contract_circle(const SetSeries& s, const Complex* moments, Complex* weights,
                            Complex* values) {
  const int P = s.P();
  std::fill(weights, weights + 2 * P + 1, Complex(0.0, 0.0));
  std::fill(values, values + 2 * P + 1, Complex(0.0, 0.0));
  for (const SetSeries::Term& term : s.terms) {
    const int m = term.m;
    const Complex source = m >= 0 ? moments[m] : std::conj(moments[-m]);
    const Complex value = m >= 0 ? moments[P + 1 + m] : std::conj(moments[2 * (P + 1) - m]);
    weights[term.p + P] += term.c * source;
    values[term.p + P] += term.c * value;
  }
}

/// A receiver's sums at w = e^{i xi_i} from its coefficients: S_i = Re C_0 + 2 Re sum_{p >= 1}
/// C_p w^p (C_-p = conj(C_p)) and A_i = Cz_0 + sum_{p >= 1} (Cz_p w^p + Cz_-p conj(w)^p), by
/// Horner from the top frequency (|w| = 1: stable).
inline double circle_receiver_sums(const Complex* weights, const Complex* values, int P,
                                   const Complex& w, double* acc) {
  const double w_re = w.real(), w_im = w.imag();
  // Index q + P of the arrays is frequency q.
  const double* cw = reinterpret_cast<const double*>(weights) + 2 * P;
  const double* cz = reinterpret_cast<const double*>(values) + 2 * P;
  double tw_re = 0.0, tw_im = 0.0, up_re = 0.0, up_im = 0.0, down_re = 0.0, down_im = 0.0;
  for (int q = P; q >= 1; --q) {
    // t <- (t + C_q) w: after the loop t = sum_{q >= 1} C_q w^q.
    const double aw_re = tw_re + cw[2 * q], aw_im = tw_im + cw[2 * q + 1];
    tw_re = aw_re * w_re - aw_im * w_im;
    tw_im = aw_re * w_im + aw_im * w_re;
    const double au_re = up_re + cz[2 * q], au_im = up_im + cz[2 * q + 1];
    up_re = au_re * w_re - au_im * w_im;
    up_im = au_re * w_im + au_im * w_re;
    // the negative frequencies with conj(w)
    const double ad_re = down_re + cz[-2 * q], ad_im = down_im + cz[-2 * q + 1];
    down_re = ad_re * w_re + ad_im * w_im;
    down_im = ad_im * w_re - ad_re * w_im;
  }
  acc[0] = cz[0] + up_re + down_re;
  acc[1] = cz[1] + up_im + down_im;
  return cw[0] + 2.0 * tw_re;
}

class FourierCircleBackend final : public SeriesBackend {
 public:
  FourierCircleBackend(const Model& model, const BackendOptions& options)
      : model_(model), threads_(options.threads > 0 ? options.threads : omp_get_max_threads()),
        tol_(options.evaluation_tol), sa_(model.normalization == Normalization::Sa),
        causal_(CausalOrder::of(model)) {
    // Each source's gauge e^{i phi_j} = G_j e_1 (tokens, then prefix tokens).
    const std::size_t sources = model.n + model.prefix_count();
    phases_.assign(sources, Complex(1.0, 0.0));
    if (model.gauge)
      for (std::size_t j = 0; j < sources; ++j) {
        const double e1[2] = {1.0, 0.0};
        double moved[2];
        model.gauge->apply(j, e1, moved);
        phases_[j] = Complex(moved[0], moved[1]);
      }
  }

  std::string describe() const override {
    return "loop fourier frequencies " + std::to_string(last_frequencies_);
  }
  /// A new layer: the series of the old sets are dropped (the cache would find them stale by
  /// their numbers anyway; this keeps it from growing).
  void matrices_changed() override { series_ = SeriesCache{}; }

  void evaluate(std::size_t replicas, const double* x, const FieldOutputs& out) override {
    const std::size_t n = model_.n, d = model_.d;
    const bool transported = model_.gauge && model_.values == ValueTransport::Transported;
    mass_ = model_.mass();  // O(n): once an evaluation, not once a receiver
    for (std::size_t r = 0; r < replicas; ++r) {
      const AttentionMatrices& set = model_.matrices_of(r);
      const SetSeries& s = series_.of(model_, set, tol_);
      last_frequencies_ = 2 * s.P() + 1;
      const double* xr = x + r * n * d;
      // Each source's angle xi_j, value z_j (z-space: G_j x_j when transported) and presence.
      const std::size_t prefix = model_.prefix_count(), sources = n + prefix;
      angle_.resize(sources);
      value_.resize(sources);
      weight_.resize(sources);
      // e^{i xi_j} = u_j e^{i sigma phi_j} with u_j = x_j as a complex number (unit): no angle
      // is taken, so no sine or cosine either.
      for (std::size_t j = 0; j < sources; ++j) {
        const double* xj = host::source_content(model_, xr, j);
        const Complex u(xj[0], xj[1]);
        const Complex phase = s.sigma == 0  ? Complex(1.0, 0.0)
                              : s.sigma > 0 ? phases_[j]
                                            : std::conj(phases_[j]);
        // The kernel reads the token's direction (a stage of heun or rk4 lies off the circle
        // by O(h^2): docs/model.md section 2f), the value the token itself, as the pair loop.
        angle_[j] = times(direction(u), phase);
        value_[j] = transported ? times(u, phases_[j]) : u;
        weight_[j] = host::source_presence(model_, j);
      }
      const Outputs outputs{out.velocity + r * n * d,
                            out.weight_sums ? out.weight_sums + r * n : nullptr,
                            out.attention_output ? out.attention_output + r * n * d : nullptr};
      if (causal_) evaluate_causal(set, s, xr, outputs);
      else evaluate_full(set, s, xr, outputs);
    }
  }

 private:
  struct Outputs {
    double* velocity;
    double* weight_sums;
    double* attention;
  };

  /// Receiver i from its sums (log_max -inf: it sees no source with weight).
  void finish(const AttentionMatrices& set, double log_max, std::size_t i, const double* xr,
              double weight_sum, const double* acc, const Outputs& out) const {
    const std::size_t d = model_.d;
    double scratch[4];
    detail::ReceiverOutput target{out.velocity + i * d,
                                  out.attention ? out.attention + i * d : nullptr,
                                  out.weight_sums != nullptr};
    const double sum = detail::finish_receiver(model_, set, mass_, i, xr + i * d, log_max,
                                               weight_sum, acc, target, scratch);
    if (out.weight_sums) out.weight_sums[i] = sum;
  }

  /// Every receiver sees every source: the moments once, the coefficients once.
  void evaluate_full(const AttentionMatrices& set, const SetSeries& s, const double* xr,
                     const Outputs& out) {
    const std::size_t n = model_.n, sources = angle_.size();
    const int P = s.P(), width = 2 * P + 1;
    const std::vector<Complex> moments =
        block_sums(sources, 3 * std::size_t(P + 1), threads_, partial_, [&] {
          return [&](std::size_t j, Complex* sums) { add_source(s, j, sums); };
        });
    std::vector<Complex> weights(static_cast<std::size_t>(width)),
        values(static_cast<std::size_t>(width));
    contract_circle(s, moments.data(), weights.data(), values.data());
    const double presence = moments[0].real();  // M_0: every source's presence
#pragma omp parallel for schedule(static) num_threads(threads_)
    for (std::size_t i = 0; i < n; ++i)
      receive(
          set, s, i, xr, weights.data(), values.data(), presence, true, sources, sources,
          [](std::size_t k) { return k; }, out);
  }

  /// Source j's moments (add_circle_moments); false for a source without weight.
  bool add_source(const SetSeries& s, std::size_t j, Complex* sums) const {
    if (weight_[j] == 0.0) return false;
    add_circle_moments(reinterpret_cast<double*>(sums), s.P(), angle_[j], value_[j], weight_[j]);
    return true;
  }

  /// Receiver i, which sees source(0), ..., source(count - 1): the coefficients cover the first
  /// `covered` of them (`presence` their presences' sum), the rest are summed term by term
  /// (`sees`: some has weight). Its sums by Horner plus those terms, or, where the series does
  /// not resolve them (series_resolves), all term by term; then the common finish.
  template <class Source>
  void receive(const AttentionMatrices& set, const SetSeries& s, std::size_t i, const double* xr,
               const Complex* weights, const Complex* values, double presence, bool sees,
               std::size_t covered, std::size_t count, Source source, const Outputs& out) const {
    double acc[2];
    double weight_sum = circle_receiver_sums(weights, values, s.P(), angle_[i], acc);
    if (covered < count) weight_sum += direct_sums(s, i, covered, count, source, acc);
    if (sa_ && sees && !series_resolves(weight_sum, presence, tol_, s.terms.size())) {
      acc[0] = acc[1] = 0.0;
      weight_sum = direct_sums(s, i, 0, count, source, acc);
    }
    finish(set, sees ? s.log_max : -std::numeric_limits<double>::infinity(), i, xr, weight_sum,
           acc, out);
  }

  /// Receiver i's shifted sums over source(begin), ..., source(end - 1), term by term
  /// (kernels::circle_pair_score), added to acc; returns their weight sum. For the sources past
  /// a causal segment's start, and for the receivers the series does not resolve.
  template <class Source>
  double direct_sums(const SetSeries& s, std::size_t i, std::size_t begin, std::size_t end,
                     Source source, double* acc) const {
    double weight_sum = 0.0;
    for (std::size_t k = begin; k < end; ++k) {
      const std::size_t j = source(k);
      if (weight_[j] == 0.0) continue;
      const double w = weight_[j] *
                       std::exp(kernels::circle_pair_score(s.score, angle_[i], angle_[j]) -
                                s.log_max);
      weight_sum += w;
      acc[0] += w * value_[j].real();
      acc[1] += w * value_[j].imag();
    }
    return weight_sum;
  }

  /// A causal mask (causal_sweep): the running moments are contracted at the start of each
  /// segment (anew once a receiver would sum s.segment sources or more past the last start),
  /// and each receiver adds the sources it sees past that start term by term: O(n (P +
  /// sqrt(T))) for the series' T = (2K + 1)(2L + 1) terms, not O(n T) for a contraction of its
  /// own. The segments follow the sources' order alone, so the bits do not depend on threads.
  void evaluate_causal(const AttentionMatrices& set, const SetSeries& s, const double* xr,
                       const Outputs& out) {
    const CausalOrder& causal = *causal_;
    const std::size_t width = 2 * std::size_t(s.P()) + 1;
    struct Worker {
      const FourierCircleBackend& series;
      const AttentionMatrices& set;
      const SetSeries& s;
      const CausalOrder& causal;
      const double* xr;
      const Outputs& out;
      std::vector<Complex> weights, values;
      std::size_t contracted_end = std::numeric_limits<std::size_t>::max();
      double contracted_presence = 0.0;
      bool add(std::size_t j, Complex* sums) const { return series.add_source(s, j, sums); }
      // `running` holds the moments of order[0, seen_end), so contracted they cover those.
      void receive(std::size_t i, const Complex* running, std::size_t visible, std::size_t seen_end) {
        if (seen_end < contracted_end || seen_end - contracted_end >= s.segment) {
          contract_circle(s, running, weights.data(), values.data());
          contracted_end = seen_end;
          contracted_presence = running[0].real();
        }
        series.receive(
            set, s, i, xr, weights.data(), values.data(), contracted_presence, visible > 0,
            contracted_end, seen_end, [&](std::size_t k) { return causal.order[k]; }, out);
      }
    };
    causal_sweep(causal, model_.n, 3 * std::size_t(s.P() + 1), threads_, partial_, [&] {
      return Worker{*this, set, s, causal, xr, out, std::vector<Complex>(width), std::vector<Complex>(width)};
    });
  }

  const Model& model_;
  int threads_;
  double tol_;
  bool sa_;                              ///< SA: a receiver's ratio needs its sum resolved
  std::unique_ptr<CausalOrder> causal_;  ///< null: no mask
  double mass_ = 1.0;                    ///< model_.mass() of this evaluation
  std::vector<Complex> phases_, angle_, value_,
      partial_;  // e^{i phi_j}, e^{i xi_j}, z_j, block sums
  std::vector<double> weight_;
  SeriesCache series_;
  int last_frequencies_ = 0;
};

/// c of Q^T K = c I for one head of d = 3 (NaN when it is no multiple of I).
double zonal_scale(const AttentionHead& head, std::size_t d) {
  const Matrix q = head.query_identity ? Matrix::Identity(Eigen::Index(d), Eigen::Index(d))
                                       : head.query;
  const Matrix k = head.key_identity ? Matrix::Identity(Eigen::Index(d), Eigen::Index(d))
                                     : head.key;
  const Matrix form = q.transpose() * k;
  const double c = form(0, 0);
  const double tolerance = 1e-12 * std::max(form.cwiseAbs().maxCoeff(), 1e-300);
  for (Eigen::Index r = 0; r < form.rows(); ++r)
    for (Eigen::Index s = 0; s < form.cols(); ++s)
      if (std::fabs(form(r, s) - (r == s ? c : 0.0)) > tolerance) return std::nan("");
  return c;
}

/// sqrt(4 pi): the presences' sum is sqrt(4 pi) times the moment of Y_00.
constexpr double kSqrtFourPi = 3.5449077018110318;

// --evaluation fourier on S^2 for zonal kernels (kernels/circle_series.hpp, the harmonic
// series): per token its (L + 1)^2 harmonics; the source moments of the weights and of the
// values' three coordinates; each receiver's sums their contraction with its own harmonics,
// scaled by 4 pi is_l(kappa).

class FourierSphereBackend final : public SeriesBackend {
 public:
  FourierSphereBackend(const Model& model, const BackendOptions& options)
      : model_(model), threads_(options.threads > 0 ? options.threads : omp_get_max_threads()),
        tol_(options.evaluation_tol), sa_(model.normalization == Normalization::Sa),
        causal_(CausalOrder::of(model)) {}

  std::string describe() const override {
    return "loop fourier degree " + std::to_string(last_degree_);
  }

  void evaluate(std::size_t replicas, const double* x, const FieldOutputs& out) override {
    constexpr double kFourPi = 12.566370614359172;
    const std::size_t n = model_.n, d = 3;
    for (std::size_t r = 0; r < replicas; ++r) {
      const AttentionMatrices& set = model_.matrices_of(r);
      const double kappa = model_.beta * zonal_scale(set.heads.front(), d);
      const std::vector<double> radial = kernels::scaled_spherical_bessel_series(kappa, tol_);
      const int L = int(radial.size()) - 1;
      last_degree_ = L;
      const std::size_t harmonics = std::size_t(L + 1) * std::size_t(L + 1);
      // Each harmonic's factor 4 pi is_l.
      scale_.resize(harmonics);
      for (int l = 0; l <= L; ++l)
        for (int m = -l; m <= l; ++m)
          scale_[std::size_t(l * l + l + m)] = kFourPi * radial[std::size_t(l)];
      const Frame frame{set,
                        x + r * n * d,
                        model_.mass(),
                        kappa,
                        std::fabs(kappa),
                        L,
                        harmonics,
                        out.velocity + r * n * d,
                        out.weight_sums ? out.weight_sums + r * n : nullptr,
                        out.attention_output ? out.attention_output + r * n * d : nullptr};
      if (causal_) evaluate_causal(frame);
      else evaluate_full(frame);
    }
  }

 private:
  struct Frame {
    const AttentionMatrices& set;
    const double* xr;
    double mass;  ///< model_.mass(), once an evaluation
    double kappa;  ///< the zonal score's factor (kernels::zonal_pair_score)
    double log_max;
    int L;
    std::size_t harmonics;
    double* velocity;
    double* weight_sums;
    double* attention;
  };

  const double* source(const Frame& f, std::size_t j) const {
    return host::source_content(model_, f.xr, j);
  }
  double presence(std::size_t j) const { return host::source_presence(model_, j); }

  /// Source j's moments added to sums (4 harmonics numbers): p Y and p Y z_c, c = 0, 1, 2, with
  /// Y of its direction (the kernel reads directions, the values the tokens). y, scratch: the
  /// harmonics' room.
  void add_moments(const Frame& f, std::size_t j, double* sums, double* y, double* scratch) const {
    const double p = presence(j);
    const double* xj = source(f, j);
    double unit[3];
    direction3(xj, unit);
    kernels::real_spherical_harmonics(unit, f.L, y, scratch);
    const std::size_t H = f.harmonics;
    for (std::size_t h = 0; h < H; ++h) {
      const double w = p * y[h];
      sums[h] += w;
      sums[H + h] += w * xj[0];
      sums[2 * H + h] += w * xj[1];
      sums[3 * H + h] += w * xj[2];
    }
  }

  /// Receiver i from moments (scaled: the coefficients, or not: scaled here by scale_).
  /// sees: some weighted source is visible; presence: their presences' sum; source(0), ...,
  /// source(count - 1): the visible sources, summed term by term for a receiver the series
  /// does not resolve (series_resolves).
  template <class Source>
  void finish_one(const Frame& f, std::size_t i, const double* moments, bool scaled, bool sees,
                  double presence, std::size_t count, Source source_of, double* y,
                  double* scratch) const {
    double unit[3];
    direction3(f.xr + i * 3, unit);
    kernels::real_spherical_harmonics(unit, f.L, y, scratch);
    const std::size_t H = f.harmonics;
    double weight_sum = 0.0, acc[3] = {0.0, 0.0, 0.0};
    for (std::size_t h = 0; h < H; ++h) {
      const double yh = scaled ? y[h] : y[h] * scale_[h];
      weight_sum += moments[h] * yh;
      acc[0] += moments[H + h] * yh;
      acc[1] += moments[2 * H + h] * yh;
      acc[2] += moments[3 * H + h] * yh;
    }
    if (sa_ && sees && !series_resolves(weight_sum, presence, tol_, H)) {
      // Term by term (kernels::zonal_pair_score of the directions; the values the tokens).
      weight_sum = acc[0] = acc[1] = acc[2] = 0.0;
      for (std::size_t k = 0; k < count; ++k) {
        const std::size_t j = source_of(k);
        const double p = this->presence(j);
        if (p == 0.0) continue;
        const double* xj = source(f, j);
        double u[3];
        direction3(xj, u);
        const double w = p * std::exp(kernels::zonal_pair_score(f.kappa, unit, u) - f.log_max);
        weight_sum += w;
        for (int c = 0; c < 3; ++c) acc[c] += w * xj[c];
      }
    }
    double finish_scratch[6];
    detail::ReceiverOutput target{f.velocity + i * 3, f.attention ? f.attention + i * 3 : nullptr,
                                  f.weight_sums != nullptr};
    const double sum = detail::finish_receiver(
        model_, f.set, f.mass, i, f.xr + i * 3,
        sees ? f.log_max : -std::numeric_limits<double>::infinity(), weight_sum, acc, target,
        finish_scratch);
    if (f.weight_sums) f.weight_sums[i] = sum;
  }

  /// Per block or thread: room for one token's harmonics (taken again for each use rather
  /// than kept: n (L + 1)^2 numbers would be 3.2 GB at n = 10^6, L = 19).
  struct Harmonics {
    std::vector<double> y, scratch;
    explicit Harmonics(const Frame& f) : y(f.harmonics), scratch(2 * std::size_t(f.L + 1)) {}
  };

  /// Source j's moments added to sums (add_moments); false for a source without weight.
  bool add_source(const Frame& f, std::size_t j, double* sums, Harmonics& room) const {
    if (presence(j) == 0.0) return false;
    add_moments(f, j, sums, room.y.data(), room.scratch.data());
    return true;
  }

  /// Every receiver sees every source: the moments (block_sums), scaled once.
  void evaluate_full(const Frame& f) {
    const std::size_t n = model_.n, sources = n + model_.prefix_count(), H = f.harmonics;
    std::vector<double> coefficients = block_sums(sources, 4 * H, threads_, partial_, [&] {
      return [&f, this, room = Harmonics(f)](std::size_t j, double* sums) mutable {
        add_source(f, j, sums, room);
      };
    });
    const double presence_total = coefficients[0] * kSqrtFourPi;  // Y_00 = 1 / sqrt(4 pi)
    for (std::size_t part = 0; part < 4; ++part)
      for (std::size_t h = 0; h < H; ++h) coefficients[part * H + h] *= scale_[h];
#pragma omp parallel num_threads(threads_)
    {
      Harmonics room(f);
#pragma omp for schedule(static)
      for (std::size_t i = 0; i < n; ++i)
        finish_one(f, i, coefficients.data(), true, true, presence_total, sources,
                   [](std::size_t k) { return k; }, room.y.data(), room.scratch.data());
    }
  }

  /// A causal mask (causal_sweep): each receiver reads the running moments as the unmasked
  /// series reads the total, at the same cost.
  void evaluate_causal(const Frame& f) {
    const CausalOrder& causal = *causal_;
    struct Worker {
      const FourierSphereBackend& series;
      const Frame& f;
      const CausalOrder& causal;
      Harmonics room;
      bool add(std::size_t j, double* sums) { return series.add_source(f, j, sums, room); }
      void receive(std::size_t i, const double* running, std::size_t visible, std::size_t seen_end) {
        series.finish_one(f, i, running, false, visible > 0, running[0] * kSqrtFourPi, seen_end,
                          [&](std::size_t k) { return causal.order[k]; }, room.y.data(),
                          room.scratch.data());
      }
    };
    causal_sweep(causal, model_.n, 4 * f.harmonics, threads_, partial_,
                 [&] { return Worker{*this, f, causal, Harmonics(f)}; });
  }

  const Model& model_;
  int threads_;
  double tol_;
  bool sa_;                              ///< SA: a receiver's ratio needs its sum resolved
  std::unique_ptr<CausalOrder> causal_;  ///< null: no mask
  std::vector<double> partial_, scale_;
  int last_degree_ = 0;
};

/// The series' work per token for one matrix set at tolerance tol: the frequencies P + 1 of
/// the circle (the moments' and the Horner loops' length), the (L + 1)^2 harmonics of S^2.
/// A causal mask on the circle adds each receiver's share of its segment's contraction and its
/// direct sums past the segment's start (causal_segment: about 2 sqrt(T) terms for the series'
/// T = (2K + 1)(2L + 1)), a term of two complex products about a third of a frequency's six.
double series_work(std::size_t d, double beta, const AttentionHead& head, double tol, bool causal) {
  if (d == 3) {
    const double kappa = beta * zonal_scale(head, 3);
    const double harmonics = double(kernels::scaled_spherical_bessel_series(kappa, tol).size());
    return harmonics * harmonics;
  }
  const kernels::CircleScore score = kernels::circle_score(
      beta, planar_of(head.query, head.query_identity), planar_of(head.key, head.key_identity));
  const double K = double(kernels::scaled_bessel_series(std::abs(score.difference), tol).size()) -
                   1.0;
  const double L = double(kernels::scaled_bessel_series(std::abs(score.sum), tol).size()) - 1.0;
  if (!causal) return K + L + 1.0;
  const double terms = (2.0 * K + 1.0) * (2.0 * L + 1.0);
  const double segment = double(causal_segment(std::size_t(terms)));
  return K + L + 1.0 + (terms / segment + kDirectPerTerm * segment / 2.0) / 3.0;
}

}  // namespace

std::size_t fourier_from_tokens(const Model& model, double tol) {
  // The crossovers measured at beta = 4, Q = K = I and the default tolerance
  // (docs/performance.md: the series faster from about 500 tokens on the circle, 8000 on S^2),
  // on the circle with a margin of two (the symmetric pair loop there is the fastest direct
  // loop; a gauge or prefix tokens take the one-sided loop, which favours the series more).
  const std::size_t measured = model.d == 2 ? 1024 : 8192;
  AttentionHead identity;
  identity.query_identity = identity.key_identity = true;
  const double reference = series_work(model.d, 4.0, identity, 1e-13, false);
  double work = 0.0;
  for (std::size_t r = 0; r < model.matrix_set_count(); ++r)
    work = std::max(work, series_work(model.d, model.beta, model.matrices_of(r).heads.front(), tol,
                                      is_causal(model.pair_terms.mask)));
  return std::size_t(std::ceil(double(measured) * std::max(work / reference, 1.0)));
}

std::string fourier_evaluation_refusal(const Model& model) {
  // Appended, not "a" + std::string(b): GCC 12 warns of the latter's inlined copy (a false
  // -Warray-bounds).
  std::string who = "--evaluation ";
  who += kSeriesEvaluation.name;
  if (model.d != 2 && model.d != 3)
    return who + ": takes d = 2 (the circle) or d = 3 (S^2, zonal kernels); d = " +
           std::to_string(model.d) + " is summed directly";
  // What the registry entry declares of the model's kinds (kernel, placement, factor, layer).
  if (std::string refusal = capability_refusal(who, kSeriesEvaluation.takes, ModelKinds::of(model));
      !refusal.empty())
    return refusal;
  // The geometry the series needs, beyond the kinds.
  if (model.d == 3) {
    if (model.gauge)
      return who + ": on S^2 takes no gauge (the zonal series needs kernels of <x_i, x_j> alone)";
    for (std::size_t r = 0; r < model.matrix_set_count(); ++r)
      if (std::isnan(zonal_scale(model.matrices_of(r).heads.front(), 3)))
        return who +
               ": on S^2 takes zonal kernels, Q^T K = c I (--q and --k identity, or a rotation and its scaling)";
  }
  // A causal mask is taken by prefix sums in position order; a window or the per-prompt rule
  // would take differences of them (cancellation) or one series a prompt.
  if (model.pair_terms.per_prompt ||
      (model.pair_terms.mask != MaskKind::Full && !is_causal(model.pair_terms.mask)))
    return who +
           ": takes --mask full, causal or causal-strict (a window or per-prompt rule breaks the series)";
  for (std::size_t r = 0; model.d == 2 && r < model.matrix_set_count(); ++r) {
    const AttentionHead& head = model.matrices_of(r).heads.front();
    const kernels::PlanarMap q = planar_of(head.query, head.query_identity);
    const kernels::PlanarMap k = planar_of(head.key, head.key_identity);
    if (gauge_sign(model, q, k) == -2)
      return who +
             ": with a gauge, Q and K must both commute with rotations (a I + b J) or both be reflections' "
             "multiples (a R + b R J): the series would need two angles per token";
  }
  return "";
}

std::unique_ptr<Backend> make_fourier_backend(const Model& model, const BackendOptions& options) {
  if (model.d != 2 && model.d != 3)
    throw std::logic_error("make_fourier_backend: d = " + std::to_string(model.d) +
                           " (make_backend checks the model)");
  if (model.d == 3) return std::make_unique<FourierSphereBackend>(model, options);
  return std::make_unique<FourierCircleBackend>(model, options);
}

}  // namespace mfattn
