// --evaluation fourier on the circle (docs/model.md, "Fast summation on the circle"): the sums
// of every receiver from the source moments of kernels/circle_series.hpp in O(n P), finished by
// the one receiver finish of every backend (detail::finish_receiver).
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <complex>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend_common.hpp"
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
  const double radius = std::hypot(u.real(), u.imag());
  return radius > 0.0 ? Complex(u.real() / radius, u.imag() / radius) : u;
}

/// x / |x| of a point of R^3 into `out` (x itself when 0): the point of S^2 its kernel reads.
void direction3(const double* x, double* out) {
  const double radius = std::sqrt(x[0] * x[0] + x[1] * x[1] + x[2] * x[2]);
  const double scale = radius > 0.0 ? 1.0 / radius : 1.0;
  for (int c = 0; c < 3; ++c) out[c] = x[c] * scale;
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

/// The series of one matrix set: the score's two terms, the coefficients c_kl grouped by the
/// receiver's frequency p = k + l and the source's m = l - k, and the angle rule.
struct SetSeries {
  int sigma = 0;
  double log_max = 0.0;  ///< |a| + |b|: the shift of every weight
  int K = 0, L = 0;      ///< |k| <= K, |l| <= L; frequencies |m|, |p| <= K + L
  /// terms[(p + P) * width + (m + P)]: the sum of c_kl over k + l = p, l - k = m (sparse in
  /// fact: one pair (k, l) per (p, m) of equal parity), P = K + L, width = 2 P + 1.
  std::vector<Complex> coefficients;
  int P() const { return K + L; }
};

SetSeries series_of(const Model& model, const AttentionMatrices& set, double tol) {
  const AttentionHead& head = set.heads.front();
  const kernels::PlanarMap q = planar_of(head.query, head.query_identity);
  const kernels::PlanarMap k = planar_of(head.key, head.key_identity);
  SetSeries s;
  s.sigma = gauge_sign(model, q, k);
  const kernels::CircleScore score = kernels::circle_score(model.beta, q, k);
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
  s.coefficients.assign(std::size_t(width) * std::size_t(width), Complex(0.0, 0.0));
  for (int kk = -s.K; kk <= s.K; ++kk)
    for (int ll = -s.L; ll <= s.L; ++ll) {
      const double magnitude = ia[std::size_t(std::abs(kk))] * ib[std::size_t(std::abs(ll))];
      const Complex c = std::polar(magnitude, double(kk) * alpha + double(ll) * gamma);
      s.coefficients[std::size_t(kk + ll + P) * std::size_t(width) + std::size_t(ll - kk + P)] += c;
    }
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

class FourierCircleBackend final : public SeriesBackend {
 public:
  FourierCircleBackend(const Model& model, const BackendOptions& options)
      : model_(model), threads_(options.threads > 0 ? options.threads : omp_get_max_threads()),
        tol_(options.evaluation_tol) {
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

  void evaluate(std::size_t replicas, const double* x, const FieldOutputs& out) override {
    const std::size_t n = model_.n, d = model_.d;
    const double mass = model_.mass();
    const bool transported = model_.gauge && model_.values == ValueTransport::Transported;
    for (std::size_t r = 0; r < replicas; ++r) {
      const AttentionMatrices& set = model_.matrices_of(r);
      const SetSeries& s = series_.of(model_, set, tol_);
      const int P = s.P(), width = 2 * P + 1;
      last_frequencies_ = width;
      const double* xr = x + r * n * d;
      // Each source's angle xi_j, value z_j (z-space: G_j x_j when transported) and presence.
      const std::size_t prefix = model_.prefix_count(), sources = n + prefix;
      angle_.resize(sources);
      value_.resize(sources);
      weight_.resize(sources);
      // e^{i xi_j} = u_j e^{i sigma phi_j} with u_j = x_j as a complex number (unit): no angle
      // is taken, so no sine or cosine either.
      for (std::size_t j = 0; j < sources; ++j) {
        const double* xj = j < n ? xr + j * d : model_.prefix.data() + (j - n) * d;
        const Complex u(xj[0], xj[1]);
        const Complex phase = s.sigma == 0  ? Complex(1.0, 0.0)
                              : s.sigma > 0 ? phases_[j]
                                            : std::conj(phases_[j]);
        // The kernel reads the token's direction (a stage of heun or rk4 lies off the circle
        // by O(h^2): docs/model.md section 2f), the value the token itself, as the pair loop.
        angle_[j] = times(direction(u), phase);
        value_[j] = transported ? times(u, phases_[j]) : u;
        weight_[j] = j < n ? model_.presence[j] : model_.prefix_weight;
      }
      // Source moments, m = 0..P: M_m = sum p e^{i m xi}, Z_m = sum p z e^{i m xi},
      // W_m = sum p conj(z) e^{i m xi} (so that Z_-m = conj(W_m)); M_-m = conj(M_m).
      const std::size_t blocks = (sources + kSourceBlock - 1) / kSourceBlock;
      const std::size_t stride = 3 * std::size_t(P + 1);
      partial_.assign(blocks * stride, Complex(0.0, 0.0));
      // Plain real arithmetic: std::complex's product checks for infinities (__muldc3), which
      // made this loop three times slower.
#pragma omp parallel for schedule(static) num_threads(threads_)
      for (std::size_t block = 0; block < blocks; ++block) {
        Complex* sums = partial_.data() + block * stride;
        const std::size_t end = std::min(sources, (block + 1) * kSourceBlock);
        for (std::size_t j = block * kSourceBlock; j < end; ++j) {
          if (weight_[j] == 0.0) continue;
          const double step_re = angle_[j].real(), step_im = angle_[j].imag();
          const double z_re = value_[j].real(), z_im = value_[j].imag();
          double power_re = weight_[j], power_im = 0.0;
          double* sum = reinterpret_cast<double*>(sums);
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
      }
      std::vector<Complex> moments(stride, Complex(0.0, 0.0));
      for (std::size_t block = 0; block < blocks; ++block)
        for (std::size_t m = 0; m < stride; ++m) moments[m] += partial_[block * stride + m];
      auto source_moment = [&](int m) {
        return m >= 0 ? moments[std::size_t(m)] : std::conj(moments[std::size_t(-m)]);
      };
      auto value_moment = [&](int m) {
        return m >= 0 ? moments[std::size_t(P + 1 + m)]
                      : std::conj(moments[std::size_t(2 * (P + 1) - m)]);
      };
      // The receivers' coefficients: C_p = sum c_kl M_{l-k}, Cz_p = sum c_kl Z_{l-k}.
      std::vector<Complex> weights(static_cast<std::size_t>(width)),
          values(static_cast<std::size_t>(width));
      for (int p = -P; p <= P; ++p) {
        Complex cw(0.0, 0.0), cz(0.0, 0.0);
        const Complex* row = s.coefficients.data() + std::size_t(p + P) * std::size_t(width);
        for (int m = -P; m <= P; ++m) {
          const Complex c = row[m + P];
          if (c == Complex(0.0, 0.0)) continue;
          cw += c * source_moment(m);
          cz += c * value_moment(m);
        }
        weights[std::size_t(p + P)] = cw;
        values[std::size_t(p + P)] = cz;
      }
      // Each receiver: S_i = Re C_0 + 2 Re sum_{p >= 1} C_p w^p (C_-p = conj(C_p)) and
      // A_i = Cz_0 + sum_{p >= 1} (Cz_p w^p + Cz_-p conj(w)^p), w = e^{i xi_i}, by Horner from the
      // top frequency (|w| = 1: stable), then the common finish.
      const AttentionMatrices& matrices = set;
      double* velocity = out.velocity + r * n * d;
      double* sums_out = out.weight_sums ? out.weight_sums + r * n : nullptr;
      double* attention = out.attention_output ? out.attention_output + r * n * d : nullptr;
#pragma omp parallel for schedule(static) num_threads(threads_)
      for (std::size_t i = 0; i < n; ++i) {
        const double w_re = angle_[i].real(), w_im = angle_[i].imag();
        // Index q + P of the arrays is frequency q.
        const double* cw = reinterpret_cast<const double*>(weights.data()) + 2 * P;
        const double* cz = reinterpret_cast<const double*>(values.data()) + 2 * P;
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
        const double weight_sum = cw[0] + 2.0 * tw_re;
        const double acc[2] = {cz[0] + up_re + down_re, cz[1] + up_im + down_im};
        double scratch[4];
        detail::ReceiverOutput target{velocity + i * d, attention ? attention + i * d : nullptr,
                                      sums_out != nullptr};
        const double sum = detail::finish_receiver(model_, matrices, mass, i, xr + i * d, s.log_max,
                                                   weight_sum, acc, target, scratch);
        if (sums_out) sums_out[i] = sum;
      }
    }
  }

 private:
  const Model& model_;
  int threads_;
  double tol_;
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

// --evaluation fourier on S^2 for zonal kernels (kernels/circle_series.hpp, the harmonic
// series): per token its (L + 1)^2 harmonics; the source moments of the weights and of the
// values' three coordinates; each receiver's sums their contraction with its own harmonics.
class FourierSphereBackend final : public SeriesBackend {
 public:
  FourierSphereBackend(const Model& model, const BackendOptions& options)
      : model_(model), threads_(options.threads > 0 ? options.threads : omp_get_max_threads()),
        tol_(options.evaluation_tol) {}

  std::string describe() const override {
    return "loop fourier degree " + std::to_string(last_degree_);
  }

  void evaluate(std::size_t replicas, const double* x, const FieldOutputs& out) override {
    constexpr double kFourPi = 12.566370614359172;
    const std::size_t n = model_.n, d = 3, prefix = model_.prefix_count(), sources = n + prefix;
    const double mass = model_.mass();
    for (std::size_t r = 0; r < replicas; ++r) {
      const AttentionMatrices& set = model_.matrices_of(r);
      const double kappa = model_.beta * zonal_scale(set.heads.front(), d);
      const std::vector<double> radial = kernels::scaled_spherical_bessel_series(kappa, tol_);
      const int L = int(radial.size()) - 1;
      last_degree_ = L;
      const std::size_t harmonics = std::size_t(L + 1) * std::size_t(L + 1);
      const double* xr = x + r * n * d;
      // Source moments in fixed blocks: for each harmonic, sum p Y and sum p Y z_c (c = 0, 1, 2).
      const std::size_t blocks = (sources + kSourceBlock - 1) / kSourceBlock;
      partial_.assign(blocks * 4 * harmonics, 0.0);
#pragma omp parallel num_threads(threads_)
      {
        std::vector<double> y(harmonics), scratch(2 * std::size_t(L + 1));
#pragma omp for schedule(static)
        for (std::size_t block = 0; block < blocks; ++block) {
          double* sums = partial_.data() + block * 4 * harmonics;
          const std::size_t end = std::min(sources, (block + 1) * kSourceBlock);
          for (std::size_t j = block * kSourceBlock; j < end; ++j) {
            const double p = j < n ? model_.presence[j] : model_.prefix_weight;
            if (p == 0.0) continue;
            const double* xj = j < n ? xr + j * d : model_.prefix.data() + (j - n) * d;
            double unit[3];
            direction3(xj, unit);  // the kernel reads directions, the values the tokens
            kernels::real_spherical_harmonics(unit, L, y.data(), scratch.data());
            for (std::size_t h = 0; h < harmonics; ++h) {
              const double w = p * y[h];
              sums[h] += w;
              sums[harmonics + h] += w * xj[0];
              sums[2 * harmonics + h] += w * xj[1];
              sums[3 * harmonics + h] += w * xj[2];
            }
          }
        }
      }
      // Summed in block order, and scaled by 4 pi is_l: the receivers' coefficients.
      std::vector<double> coefficients(4 * harmonics, 0.0);
      for (std::size_t block = 0; block < blocks; ++block)
        for (std::size_t h = 0; h < 4 * harmonics; ++h)
          coefficients[h] += partial_[block * 4 * harmonics + h];
      for (int l = 0; l <= L; ++l)
        for (int m = -l; m <= l; ++m)
          for (std::size_t part = 0; part < 4; ++part)
            coefficients[part * harmonics + std::size_t(l * l + l + m)] *= kFourPi *
                                                                           radial[std::size_t(l)];
      double* velocity = out.velocity + r * n * d;
      double* sums_out = out.weight_sums ? out.weight_sums + r * n : nullptr;
      double* attention = out.attention_output ? out.attention_output + r * n * d : nullptr;
#pragma omp parallel num_threads(threads_)
      {
        std::vector<double> y(harmonics), scratch(2 * std::size_t(L + 1));
#pragma omp for schedule(static)
        for (std::size_t i = 0; i < n; ++i) {
          double unit[3];
          direction3(xr + i * d, unit);
          kernels::real_spherical_harmonics(unit, L, y.data(), scratch.data());
          double weight_sum = 0.0, acc[3] = {0.0, 0.0, 0.0};
          for (std::size_t h = 0; h < harmonics; ++h) {
            weight_sum += coefficients[h] * y[h];
            acc[0] += coefficients[harmonics + h] * y[h];
            acc[1] += coefficients[2 * harmonics + h] * y[h];
            acc[2] += coefficients[3 * harmonics + h] * y[h];
          }
          double finish_scratch[6];
          detail::ReceiverOutput target{velocity + i * d, attention ? attention + i * d : nullptr,
                                        sums_out != nullptr};
          const double sum = detail::finish_receiver(model_, set, mass, i, xr + i * d,
                                                     std::fabs(kappa), weight_sum, acc, target,
                                                     finish_scratch);
          if (sums_out) sums_out[i] = sum;
        }
      }
    }
  }

 private:
  const Model& model_;
  int threads_;
  double tol_;
  std::vector<double> partial_;
  int last_degree_ = 0;
};

}  // namespace

namespace {

/// The series' work per token for one matrix set at tolerance tol: the frequencies P + 1 of
/// the circle (the moments' and the Horner loops' length), the (L + 1)^2 harmonics of S^2.
double series_work(std::size_t d, double beta, const AttentionHead& head, double tol) {
  if (d == 3) {
    const double kappa = beta * zonal_scale(head, 3);
    const double harmonics = double(kernels::scaled_spherical_bessel_series(kappa, tol).size());
    return harmonics * harmonics;
  }
  const kernels::CircleScore score = kernels::circle_score(
      beta, planar_of(head.query, head.query_identity), planar_of(head.key, head.key_identity));
  return double(kernels::scaled_bessel_series(std::abs(score.difference), tol).size() +
                kernels::scaled_bessel_series(std::abs(score.sum), tol).size() - 1);
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
  const double reference = series_work(model.d, 4.0, identity, 1e-13);
  double work = 0.0;
  for (std::size_t r = 0; r < std::max<std::size_t>(model.matrices.size(), 1); ++r)
    work = std::max(work,
                    series_work(model.d, model.beta, model.matrices_of(r).heads.front(), tol));
  return std::size_t(std::ceil(double(measured) * std::max(work / reference, 1.0)));
}

std::string fourier_evaluation_refusal(const Model& model) {
  const std::string who = "--evaluation " + std::string(kSeriesEvaluation.name);
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
    for (std::size_t r = 0; r < std::max<std::size_t>(model.matrices.size(), 1); ++r)
      if (std::isnan(zonal_scale(model.matrices_of(r).heads.front(), 3)))
        return who +
               ": on S^2 takes zonal kernels, Q^T K = c I (--q and --k identity, or a rotation and its scaling)";
  }
  if (model.pair_terms.any())
    return who + ": takes no mask or per-prompt rule (they break the series)";
  for (std::size_t r = 0; model.d == 2 && r < std::max<std::size_t>(model.matrices.size(), 1);
       ++r) {
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
  if (model.d == 3) return std::make_unique<FourierSphereBackend>(model, options);
  return std::make_unique<FourierCircleBackend>(model, options);
}

}  // namespace mfattn
