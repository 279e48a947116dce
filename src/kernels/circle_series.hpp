#pragma once
// The attention kernel on the circle as a Fourier series (docs/model.md, "Fast summation on the
// circle"): the formula of `--evaluation fourier` at d = 2, beside the pair terms it sums.
//
// A token x = (cos t, sin t) is z = e^{it}; a real 2 x 2 matrix M acts on z as
//   M z = mu z + nu conj(z),   mu = ((M00 + M11) + i (M10 - M01)) / 2,
//                              nu = ((M00 - M11) + i (M10 + M01)) / 2
// (mu alone: a multiple of a rotation, "conformal"; nu alone: of a reflection). With each
// token's angle xi_j = t_j + sigma phi_j (phi_j the angle of its gauge G_j, a rotation of the
// plane; sigma = +1 for conformal Q and K, -1 for anti-conformal ones, 0 without a gauge) the
// score of section 2 is
//   s_ij = beta <G_i Q x_i, G_j K x_j> = a cos(xi_i - xi_j + alpha) + b cos(xi_i + xi_j + gamma),
//   a e^{i alpha} = beta (mu_Q conj(mu_K) + conj(nu_Q) nu_K),
//   b e^{i gamma} = beta (mu_Q conj(nu_K) + conj(nu_Q) mu_K)      (b = 0 with a gauge),
// a, b >= 0 the moduli (a repulsive beta turns the phases alpha, gamma by pi),
// and, since exp(x cos u) = sum_k I_k(x) e^{iku} (modified Bessel functions, I_-k = I_k),
//   exp(s_ij - |a| - |b|) = sum_{k, l} c_kl e^{i (k + l) xi_i} e^{i (l - k) xi_j},
//   c_kl = Is_k(a) Is_l(b) e^{i (k alpha + l gamma)},   Is_k(x) = e^{-|x|} I_k(x) = sign(x)^k
//   Is_k(|x|).
// A receiver's sums over its sources are then the source moments M_m = sum_j p_j e^{i m xi_j}
// (and the same with the values z_j) contracted with c_kl: O(n P) for n tokens and P = K + L
// frequencies, instead of O(n^2).
//
// Truncation: |k| <= K where 2 sum_{k > K} Is_k(|a|) <= tol / 2, and likewise L for b. Since
// sum_k Is_k(|x|) = 1, every shifted weight exp(s_ij - |a| - |b|) (at most 1) is then within tol
// of its truncated series: the weights are exact to tol relative to the kernel's largest value
// e^{|a| + |b|}, plus rounding (a few ulps of that largest value per frequency).
#include <cmath>
#include <complex>
#include <cstddef>
#include <vector>

namespace mfattn::kernels {

/// mu and nu of a real 2 x 2 matrix (row-major m00, m01, m10, m11): M z = mu z + nu conj(z).
struct PlanarMap {
  std::complex<double> mu, nu;
};
inline PlanarMap planar_map(double m00, double m01, double m10, double m11) {
  return {{0.5 * (m00 + m11), 0.5 * (m10 - m01)}, {0.5 * (m00 - m11), 0.5 * (m10 + m01)}};
}

/// The two terms of the score: a e^{i alpha} (the difference of the angles) and b e^{i gamma}
/// (their sum), beta included.
struct CircleScore {
  std::complex<double> difference, sum;
};
inline CircleScore circle_score(double beta, const PlanarMap& q, const PlanarMap& k) {
  return {beta * (q.mu * std::conj(k.mu) + std::conj(q.nu) * k.nu),
          beta * (q.mu * std::conj(k.nu) + std::conj(q.nu) * k.mu)};
}

/// The score itself, s_ij = Re(a e^{i alpha} w_i conj(w_j)) + Re(b e^{i gamma} w_i w_j), from the
/// tokens' w = e^{i xi}: what the series expands. The series' backends sum it directly for a
/// receiver whose weights the truncated series cannot resolve (few sources, all far).
inline double circle_pair_score(const CircleScore& score, std::complex<double> w_i,
                                std::complex<double> w_j) {
  return (score.difference * w_i * std::conj(w_j)).real() + (score.sum * w_i * w_j).real();
}

/// The zonal score on S^2, kappa <u_i, u_j> of the tokens' directions: what the harmonic series
/// expands (as circle_pair_score, for the receivers it cannot resolve).
inline double zonal_pair_score(double kappa, const double* u_i, const double* u_j) {
  return kappa * (u_i[0] * u_j[0] + u_i[1] * u_j[1] + u_i[2] * u_j[2]);
}

/// The backward recurrence of Miller's algorithm, shared by both Bessel families: values v_k for
/// k = 0..start (start far beyond any truncation: the terms fall like exp(-k^2 / (2 |x|)) past
/// k ~ |x|), from v_start = tiny, v_{k-1} = v_{k+1} + step(k) v_k, rescaled when large (only
/// the ratios matter); the caller normalises them.
template <class Step>
std::vector<double> miller_backward(double ax, Step step) {
  const std::size_t start = std::size_t(ax + 25.0 * std::sqrt(ax) + 60.0);
  std::vector<double> values(start + 2, 0.0);
  values[start] = 1e-300;
  for (std::size_t k = start; k >= 1; --k) {
    values[k - 1] = values[k + 1] + step(k) * values[k];
    if (values[k - 1] > 1e250)
      for (std::size_t j = k - 1; j <= start; ++j) values[j] *= 1e-250;
  }
  return values;
}

/// Keeps values[0..K], K the least with sum_{k > K} weight(k) values[k] <= budget; then
/// values[k] *= (-1)^k when negative (odd orders of a negative argument).
template <class Weight>
void truncate_series(std::vector<double>& values, Weight weight, double budget, bool negative) {
  double tail = 0.0;
  std::size_t keep = values.size() - 1;
  while (keep > 0 && tail + weight(keep) * values[keep] <= budget) {
    tail += weight(keep) * values[keep];
    --keep;
  }
  values.resize(keep + 1);
  if (negative)
    for (std::size_t k = 1; k <= keep; k += 2) values[k] = -values[k];
}

/// Is_k(x) = e^{-|x|} I_k(x) for k = 0..K, K the least with 2 sum_{k > K} Is_k(|x|) <= tol / 2
/// (x = 0: {1}). Miller's recurrence I_{k-1} = I_{k+1} + (2k / |x|) I_k, normalised by
/// Is_0 + 2 sum_{k >= 1} Is_k = 1; negative x takes sign (-1)^k.
inline std::vector<double> scaled_bessel_series(double x, double tol) {
  const double ax = std::fabs(x);
  if (ax == 0.0) return {1.0};
  std::vector<double> values = miller_backward(
      ax, [ax](std::size_t k) { return 2.0 * double(k) / ax; });
  double total = values[0];
  for (std::size_t k = 1; k < values.size(); ++k) total += 2.0 * values[k];
  for (double& v : values) v /= total;
  truncate_series(
      values, [](std::size_t) { return 2.0; }, 0.5 * tol, x < 0);
  return values;
}

}  // namespace mfattn::kernels

namespace mfattn::kernels {

// The zonal kernel on S^2 as a spherical-harmonic series (docs/model.md section 2f): with
// Q^T K = c I the score is s_ij = kappa <x_i, x_j>, kappa = beta c, and
//   exp(kappa t) = sum_l (2l + 1) i_l(kappa) P_l(t)          (i_l: modified spherical Bessel)
//   P_l(<x, y>) = 4 pi / (2l + 1) sum_{m = -l..l} Y_lm(x) Y_lm(y)   (real orthonormal Y_lm)
// so exp(kappa <x, y> - |kappa|) = 4 pi sum_l is_l(kappa) sum_m Y_lm(x) Y_lm(y),
// is_l(x) = e^{-|x|} i_l(x) (= (-1)^l is_l(|x|) for x < 0). Truncation: L the least with
// sum_{l > L} (2l + 1) |is_l(kappa)| <= tol (|P_l| <= 1): every shifted weight within tol.

/// is_l(x) = e^{-|x|} i_l(x), l = 0..L (x = 0: {1}): Miller's recurrence
/// i_{l-1} = i_{l+1} + ((2l + 1) / |x|) i_l, normalised by is_0 = (1 - e^{-2|x|}) / (2|x|).
inline std::vector<double> scaled_spherical_bessel_series(double x, double tol) {
  const double ax = std::fabs(x);
  if (ax == 0.0) return {1.0};
  std::vector<double> values = miller_backward(
      ax, [ax](std::size_t l) { return double(2 * l + 1) / ax; });
  const double scale = -std::expm1(-2.0 * ax) / (2.0 * ax) / values[0];
  for (double& v : values) v *= scale;
  truncate_series(
      values, [](std::size_t l) { return double(2 * l + 1); }, tol, x < 0);
  return values;
}

/// The real orthonormal spherical harmonics Y_lm(u) of a unit vector u, l = 0..L, written to
/// out[l * l + l + m] (m = -l..l; m > 0 the cosines, m < 0 the sines). The associated Legendre
/// part without its sin^m factor (so no division by sin theta at the poles) times
/// Re, Im of (u_0 + i u_1)^m, which carries it: out needs (L + 1)^2 numbers, scratch 2 (L + 1).
inline void real_spherical_harmonics(const double* u, int L, double* out, double* scratch) {
  constexpr double kInvFourPi = 0.07957747154594767;  // 1 / (4 pi)
  const double t = u[2];
  double* power_re = scratch;
  double* power_im = scratch + (L + 1);
  power_re[0] = 1.0, power_im[0] = 0.0;
  for (int m = 1; m <= L; ++m) {
    power_re[m] = power_re[m - 1] * u[0] - power_im[m - 1] * u[1];
    power_im[m] = power_re[m - 1] * u[1] + power_im[m - 1] * u[0];
  }
  double diagonal = std::sqrt(kInvFourPi);  // lambda_mm / sin^m, lambda_00 = 1 / sqrt(4 pi)
  for (int m = 0; m <= L; ++m) {
    if (m > 0) diagonal *= std::sqrt(double(2 * m + 1) / double(2 * m));
    const double factor = m == 0 ? 1.0 : std::sqrt(2.0);
    double before = 0.0, current = diagonal;  // lambda_{l-2, m}, lambda_{l-1, m} (over sin^m)
    for (int l = m; l <= L; ++l) {
      double value;
      if (l == m) {
        value = diagonal;
      } else if (l == m + 1) {
        value = std::sqrt(double(2 * m + 3)) * t * diagonal;
      } else {
        const double a = std::sqrt(double(4 * l * l - 1) / double(l * l - m * m));
        const double b = std::sqrt(double((l - 1) * (l - 1) - m * m) /
                                   double(4 * (l - 1) * (l - 1) - 1));
        value = a * (t * current - b * before);
      }
      if (l > m) {
        before = current;
        current = value;
      }
      if (m == 0) {
        out[l * l + l] = value;
      } else {
        out[l * l + l + m] = factor * value * power_re[m];
        out[l * l + l - m] = factor * value * power_im[m];
      }
    }
  }
}

}  // namespace mfattn::kernels
