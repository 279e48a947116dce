/// \file sphere_solver.cpp
/// The mean-field equation on S^2 (d = 3) for a rotation-invariant interaction
/// (solvers.hpp), pseudo-spectral with libsharp:
///   - the density is band-limited at degree L and kept as values on a Gauss-Legendre grid
///     fine enough (3/2 rule) that the quadratic flux rho X is analysed without aliasing;
///   - the interaction is diagonal in the degree (Funk-Hecke), so the potential phi with
///     X = b grad phi (USA) costs one scalar analysis and one gradient synthesis;
///   - div(rho X) comes from the spin-1 analysis of the flux (its E part);
///   - diffusion is the exact factor exp(-l(l+1) t / kappa), Strang-split around an SSP-RK3
///     step of the drift;
///   - after each step the exponential filter exp(-36 (l/L)^36) damps the top degrees (the
///     degree L to rounding, l <= L/2 by less than 1e-10): without it a collapsing density,
///     whose clusters the grid cannot resolve, grows Gibbs oscillations without bound; with
///     it the solve stays bounded (not positive: min_density records how far it is from it).
/// libsharp conventions, checked numerically (tests/unit/test_meanfield_sphere.cpp): a_lm of
/// orthonormal Y_lm with the Condon-Shortley phase, m >= 0 stored; rings ordered by
/// increasing colatitude with weights (Gauss weight) 2 pi / n_phi; the derivative synthesis
/// gives (d_theta f, d_phi f / sin theta) and the spin-1 analysis of grad f gives
/// E_lm = sqrt(l(l+1)) f_lm, hence (div F)_lm = -sqrt(l(l+1)) E_lm[F].
#include <libsharp/sharp.h>
#include <libsharp/sharp_almhelpers.h>
#include <libsharp/sharp_geomhelpers.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <complex>
#include <limits>
#include <memory>
#include <numbers>
#include <stdexcept>
#include <string>
#include <vector>

#include "mfattn/meanfield/solvers.hpp"

namespace mfattn::meanfield {
namespace {

using Complex = std::complex<double>;
constexpr double kPi = std::numbers::pi;

/// Beyond this the grid (about 3L/2 x 3L doubles per field, a dozen fields) stops fitting in
/// a workstation's memory.
constexpr std::size_t kMaxDegree = 2048;
/// Beyond this the Miller recurrence below needs more than ~2|c| terms for nothing: the
/// kernel is then far narrower than any affordable grid resolves.
constexpr double kMaxExponent = 1e5;
/// The Courant number C of dt = C pi / (L max|X|). Advection of degree-L modes has
/// eigenvalues up to about i L max|X|, and SSP-RK3 is stable on the imaginary axis up to
/// sqrt(3); C pi = 1.57 keeps a margin.
constexpr double kCourant = 0.5;
/// Below this degree libsharp runs serially (SHARP_NO_OPENMP): a transform then takes well
/// under a millisecond and OpenMP's fork/join costs more than it saves (measured 16 ms vs
/// 0.07 ms at L = 16 on a loaded 2-core machine; threads only paid off on an idle one).
constexpr std::size_t kThreadedDegree = 128;

struct GeomDeleter {
  void operator()(sharp_geom_info* info) const { sharp_destroy_geom_info(info); }
};
struct AlmDeleter {
  void operator()(sharp_alm_info* info) const { sharp_destroy_alm_info(info); }
};

/// The smallest 2^a 3^b 5^c >= n, so that the ring FFTs stay fast.
std::size_t fft_friendly(std::size_t n) {
  for (;; ++n) {
    std::size_t rest = n;
    for (std::size_t p = 2; p <= 5; ++p)  // p = 4 finds nothing left after p = 2
      while (rest % p == 0) rest /= p;
    if (rest == 1) return n;
  }
}

/// The Funk-Hecke eigenvalues, per degree l = 0..L, times e^{-shift}:
///   kernel_l    of exp(c t):          4 pi i_l(c)
///   potential_l of G with G' = e^{ct}: 4 pi i_l(c) / c for l >= 1 (0 for l = 0: constants
///                                     have no gradient)
/// i_0(c) = sinh(c)/c; the ratios q_l = i_l / (c i_{l-1}) solve q_l = 1/(2l+1 + c^2 q_{l+1})
/// (from i_{l-1} - i_{l+1} = (2l+1)/c i_l), run downward from far above L (Miller's method
/// for the minimal solution). This is exact at c = 0 (q_l = 1/(2l+1), so potential_1 = 4 pi/3
/// and potential_l = 0 for l >= 2), keeps the parity i_l(-c) = (-1)^l i_l(c), and never forms
/// e^c separately from e^{-shift}, so rescaled time (shift = beta) does not overflow.
struct FunkHecke {
  std::vector<double> kernel, potential;
};

FunkHecke funk_hecke(double c, double shift, std::size_t max_degree) {
  const double ac = std::abs(c);
  const double i0 = ac < 1 ? std::exp(-shift) * (ac == 0 ? 1.0 : std::sinh(ac) / ac)
                           : (std::exp(ac - shift) - std::exp(-ac - shift)) / (2 * ac);
  const std::size_t top = max_degree + 40 + static_cast<std::size_t>(2 * ac);
  std::vector<double> q(top + 2, 0.0);
  for (std::size_t l = top; l >= 1; --l)
    q[l] = 1.0 / (2.0 * static_cast<double>(l) + 1.0 + c * c * q[l + 1]);
  FunkHecke f{std::vector<double>(max_degree + 1), std::vector<double>(max_degree + 1, 0.0)};
  double ratio = 1;  // i_{l-1}(c) / i_0(c)
  f.kernel[0] = 4 * kPi * i0;
  for (std::size_t l = 1; l <= max_degree; ++l) {
    f.potential[l] = 4 * kPi * i0 * ratio * q[l];
    ratio *= c * q[l];
    f.kernel[l] = 4 * kPi * i0 * ratio;
  }
  return f;
}

class SphereSolver final : public DensitySolver {
 public:
  SphereSolver(const IsotropicInteraction& interaction, std::size_t max_degree);

  const DensityGrid& grid() const override { return grid_; }
  std::string scheme() const override;
  double step(std::vector<double>& density, double max_step) override;
  void rate(const std::vector<double>& density, std::vector<double>& out) override;
  DensityObservables observe(const std::vector<double>& density) override;

 private:
  void check_size(const std::vector<double>& density) const;
  double grid_mass(const std::vector<double>& density) const;
  void analyse(const std::vector<double>& values, std::vector<Complex>& coefficients);
  void synthesise(const std::vector<Complex>& coefficients, std::vector<double>& values);
  /// out = the coefficients of -div(rho X[rho]) for rho = the band-limited density a;
  /// returns max |X| on the grid.
  double drift(const std::vector<Complex>& a, std::vector<Complex>& out);
  void diffuse(std::vector<Complex>& a, double time) const;

  IsotropicInteraction interaction_;
  int max_degree_;
  int flags_;  // of every sharp_execute
  std::unique_ptr<sharp_geom_info, GeomDeleter> geom_;
  std::unique_ptr<sharp_alm_info, AlmDeleter> alm_;
  DensityGrid grid_;
  FunkHecke factors_;
  std::vector<int> degree_;           // l of each coefficient
  std::vector<double> filter_;        // exp(-36 (l/L)^36) per degree
  std::vector<double> multiplicity_;  // m = 0: 1; m > 0: 2 (a_{l,-m} = (-1)^m conj a_lm)
  // Scratch, sized once.
  std::vector<Complex> a_, k_, stage_, potential_, kernel_, e_, b_;
  std::vector<double> rho_, x_theta_, x_phi_, denominator_;
};

SphereSolver::SphereSolver(const IsotropicInteraction& interaction, std::size_t max_degree)
    : interaction_(interaction), max_degree_(static_cast<int>(max_degree)),
      flags_(SHARP_DP | (max_degree < kThreadedDegree ? SHARP_NO_OPENMP : 0)) {
  // Gauss-Legendre with n rings integrates cos-theta polynomials of degree 2n - 1 exactly and
  // n_phi points integrate e^{i k phi} for |k| < n_phi: the flux's analysis integrates
  // products of three degree-L fields, degree 3L.
  const std::size_t n_theta = (3 * max_degree + 2) / 2;
  const std::size_t n_phi = fft_friendly(3 * max_degree + 1);
  sharp_geom_info* geom = nullptr;
  sharp_make_gauss_geom_info(static_cast<int>(n_theta), static_cast<int>(n_phi), 0.0, 1,
                             static_cast<int>(n_phi), &geom);
  geom_.reset(geom);
  sharp_alm_info* alm = nullptr;
  sharp_make_triangular_alm_info(max_degree_, max_degree_, 1, &alm);
  alm_.reset(alm);

  grid_.kind = GridKind::Sphere;
  grid_.shape = {n_theta, n_phi};
  grid_.theta.assign(n_theta, 0.0);
  grid_.phi.resize(n_phi);
  for (std::size_t j = 0; j < n_phi; ++j)
    grid_.phi[j] = 2 * kPi * static_cast<double>(j) / static_cast<double>(n_phi);
  grid_.weights.assign(n_theta * n_phi, 0.0);
  for (int p = 0; p < geom_->npairs; ++p) {
    for (const sharp_ringinfo& ring : {geom_->pair[p].r1, geom_->pair[p].r2}) {
      if (ring.nph <= 0)
        continue;  // libsharp marks the missing partner of an odd count's equator ring by nph = -1
      const auto row = static_cast<std::size_t>(ring.ofs) / n_phi;
      grid_.theta[row] = ring.theta;
      std::fill_n(grid_.weights.begin() + static_cast<std::ptrdiff_t>(row * n_phi), n_phi,
                  ring.weight);
    }
  }

  factors_ = funk_hecke(interaction.beta * interaction.score_scale, interaction.exponent_shift,
                        max_degree);
  for (double value : factors_.kernel)
    if (!std::isfinite(value))
      throw std::invalid_argument("sphere solver: exp(beta a <x,y> - shift) overflows");

  const auto count = static_cast<std::size_t>(sharp_alm_count(alm_.get()));
  filter_.resize(static_cast<std::size_t>(max_degree_) + 1);
  for (std::size_t l = 0; l < filter_.size(); ++l)
    filter_[l] = std::exp(-36.0 * std::pow(double(l) / double(max_degree_), 36.0));
  degree_.assign(count, 0);
  multiplicity_.assign(count, 0.0);
  for (int m = 0; m <= max_degree_; ++m)
    for (int l = m; l <= max_degree_; ++l) {
      const auto index = static_cast<std::size_t>(sharp_alm_index(alm_.get(), l, m));
      degree_[index] = l;
      multiplicity_[index] = m == 0 ? 1.0 : 2.0;
    }
  for (auto* v : {&a_, &k_, &stage_, &potential_, &kernel_, &e_, &b_}) v->assign(count, Complex{});
  for (auto* v : {&rho_, &x_theta_, &x_phi_, &denominator_}) v->assign(grid_.size(), 0.0);
}

std::string SphereSolver::scheme() const {
  return "sphere: libsharp Gauss grid L=" + std::to_string(max_degree_) + " (" +
         std::to_string(grid_.shape[0]) + "x" + std::to_string(grid_.shape[1]) +
         "), pseudo-spectral " + (interaction_.usa ? "USA" : "SA") +
         ", SSP-RK3 + exact diffusion (Strang), exponential filter of order 36";
}

void SphereSolver::check_size(const std::vector<double>& density) const {
  if (density.size() != grid_.size())
    throw std::invalid_argument("sphere solver: density size does not match the grid");
}

double SphereSolver::grid_mass(const std::vector<double>& density) const {
  double mass = 0;
  for (std::size_t p = 0; p < density.size(); ++p) mass += grid_.weights[p] * density[p];
  return mass;
}

void SphereSolver::analyse(const std::vector<double>& values, std::vector<Complex>& coefficients) {
  void* alm[] = {coefficients.data()};
  // An analysis only reads the map; libsharp's C interface has no const.
  void* map[] = {const_cast<double*>(values.data())};
  sharp_execute(SHARP_MAP2ALM, 0, alm, map, geom_.get(), alm_.get(), flags_, nullptr, nullptr);
}

void SphereSolver::synthesise(const std::vector<Complex>& coefficients,
                              std::vector<double>& values) {
  values.resize(grid_.size());
  void* alm[] = {const_cast<Complex*>(coefficients.data())};  // a synthesis only reads the a_lm
  void* map[] = {values.data()};
  sharp_execute(SHARP_ALM2MAP, 0, alm, map, geom_.get(), alm_.get(), flags_, nullptr, nullptr);
}

double SphereSolver::drift(const std::vector<Complex>& a, std::vector<Complex>& out) {
  const bool usa = interaction_.usa;
  for (std::size_t i = 0; i < a.size(); ++i) {
    potential_[i] = factors_.potential[static_cast<std::size_t>(degree_[i])] * a[i];
    if (!usa) kernel_[i] = factors_.kernel[static_cast<std::size_t>(degree_[i])] * a[i];
  }
  {
    void* alm[] = {potential_.data()};
    void* map[] = {x_theta_.data(), x_phi_.data()};
    sharp_execute(SHARP_ALM2MAP_DERIV1, 1, alm, map, geom_.get(), alm_.get(), flags_, nullptr,
                  nullptr);
  }
  synthesise(a, rho_);
  if (!usa) synthesise(kernel_, denominator_);

  // X = b grad phi (USA) or b grad phi / (eps_den + int w dmu) (SA); the flux rho X
  // overwrites X in place.
  double max_speed2 = 0;
  for (std::size_t p = 0; p < rho_.size(); ++p) {
    const double scale = usa ? interaction_.value_scale
                             : interaction_.value_scale / (interaction_.eps_den + denominator_[p]);
    const double xt = scale * x_theta_[p];
    const double xp = scale * x_phi_[p];
    max_speed2 = std::max(max_speed2, xt * xt + xp * xp);
    x_theta_[p] = rho_[p] * xt;
    x_phi_[p] = rho_[p] * xp;
  }
  {
    void* alm[] = {e_.data(), b_.data()};
    void* map[] = {x_theta_.data(), x_phi_.data()};
    sharp_execute(SHARP_MAP2ALM, 1, alm, map, geom_.get(), alm_.get(), flags_, nullptr, nullptr);
  }
  // -(div F)_lm = sqrt(l(l+1)) E_lm; the curl part B does not move mass. At l = 0 the factor
  // is exactly 0, so the mass is kept to rounding.
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double l = degree_[i];
    out[i] = std::sqrt(l * (l + 1)) * e_[i];
  }
  return std::sqrt(max_speed2);
}

void SphereSolver::diffuse(std::vector<Complex>& a, double time) const {
  std::vector<double> factor(static_cast<std::size_t>(max_degree_) + 1);
  for (std::size_t l = 0; l < factor.size(); ++l) {
    const double ll = static_cast<double>(l);
    factor[l] = std::exp(-ll * (ll + 1) * time / interaction_.noise_kappa);
  }
  for (std::size_t i = 0; i < a.size(); ++i) a[i] *= factor[static_cast<std::size_t>(degree_[i])];
}

double SphereSolver::step(std::vector<double>& density, double max_step) {
  check_size(density);
  if (!(max_step > 0)) throw std::invalid_argument("sphere solver: max_step must be > 0");
  analyse(density, a_);
  // The step depends only on the incoming density (its max |X|) and max_step.
  const double speed = drift(a_, k_);
  double dt = max_step;
  if (speed > 0) dt = std::min(dt, kCourant * kPi / (max_degree_ * speed));

  const bool diffusive = interaction_.noise_kappa > 0;
  if (diffusive) {
    diffuse(a_, dt / 2);
    drift(a_, k_);
  }
  // SSP-RK3 (Shu-Osher form) on the coefficients.
  const std::size_t n = a_.size();
  for (std::size_t i = 0; i < n; ++i) stage_[i] = a_[i] + dt * k_[i];
  drift(stage_, k_);
  for (std::size_t i = 0; i < n; ++i) stage_[i] = 0.75 * a_[i] + 0.25 * (stage_[i] + dt * k_[i]);
  drift(stage_, k_);
  for (std::size_t i = 0; i < n; ++i) a_[i] = a_[i] / 3.0 + 2.0 / 3.0 * (stage_[i] + dt * k_[i]);
  if (diffusive) diffuse(a_, dt / 2);
  for (std::size_t i = 0; i < n; ++i) a_[i] *= filter_[static_cast<std::size_t>(degree_[i])];
  // The drift and diffusion keep a_00 exactly, but a libsharp synthesis-analysis round trip
  // moves it by a biased ~1e-15 relative (measured), which adds up over thousands of steps:
  // restore the incoming mass with a uniform correction of that size.
  const double mass = grid_mass(density);
  synthesise(a_, density);
  const double correction = (mass - grid_mass(density)) / (4 * kPi);
  for (double& value : density) value += correction;
  return dt;
}

void SphereSolver::rate(const std::vector<double>& density, std::vector<double>& out) {
  check_size(density);
  analyse(density, a_);
  drift(a_, k_);
  if (interaction_.noise_kappa > 0)
    for (std::size_t i = 0; i < k_.size(); ++i) {
      const double l = degree_[i];
      k_[i] -= l * (l + 1) / interaction_.noise_kappa * a_[i];
    }
  synthesise(k_, out);
}

DensityObservables SphereSolver::observe(const std::vector<double>& density) {
  check_size(density);
  DensityObservables obs;
  analyse(density, a_);
  obs.mass = grid_mass(density);
  obs.min_density = *std::min_element(density.begin(), density.end());
  double entropy = 0;  // sum weights rho log rho over rho > 0: not exact, rho log rho is not
                       // band-limited
  for (std::size_t p = 0; p < density.size(); ++p)
    if (density[p] > 0) entropy += grid_.weights[p] * density[p] * std::log(density[p]);
  // int int K(<x,y>) dmu dmu = sum_{l, |m| <= l} kernel_l |a_lm|^2 and the degree-k power
  // sum_m |a_km|^2, from the stored m >= 0.
  double pair = 0;
  std::array<double, kRecordedModes> power{};
  for (std::size_t i = 0; i < a_.size(); ++i) {
    const auto l = static_cast<std::size_t>(degree_[i]);
    const double p = multiplicity_[i] * std::norm(a_[i]);
    pair += factors_.kernel[l] * p;
    if (l >= 1 && l <= kRecordedModes) power[l - 1] += p;
  }
  // A Dirac at x0 has sum_m |Y_km(x0)|^2 = (2k+1)/(4 pi), hence A_k = 1.
  for (std::size_t k = 1; k <= kRecordedModes; ++k)
    obs.modes[k - 1] = std::sqrt(4 * kPi / (2.0 * static_cast<double>(k) + 1) * power[k - 1]);
  obs.order_parameter = obs.modes[0];  // |int x dmu|^2 = (4 pi / 3) sum_m |a_1m|^2
  obs.energy = interaction_.beta > 0 ? pair / (2 * interaction_.beta)
                                     : std::numeric_limits<double>::quiet_NaN();
  obs.free_energy = obs.energy;
  if (interaction_.noise_kappa > 0) obs.free_energy -= entropy / interaction_.noise_kappa;
  return obs;
}

}  // namespace

std::unique_ptr<DensitySolver> make_sphere_solver(const IsotropicInteraction& interaction,
                                                  std::size_t max_degree) {
  if (interaction.d != 3) throw std::invalid_argument("sphere solver: needs d = 3");
  if (max_degree < 2 || max_degree > kMaxDegree)
    throw std::invalid_argument("sphere solver: max degree must be in [2, " +
                                std::to_string(kMaxDegree) + "]");
  const double c = interaction.beta * interaction.score_scale;
  if (!std::isfinite(interaction.beta) || interaction.beta < 0 ||
      !std::isfinite(interaction.score_scale) || !std::isfinite(interaction.value_scale) ||
      !std::isfinite(interaction.exponent_shift) || !std::isfinite(c) || std::abs(c) > kMaxExponent)
    throw std::invalid_argument(
        "sphere solver: beta must be >= 0 and beta, a, b, shift finite with |beta a| <= 1e5");
  if (!(interaction.eps_den >= 0) || !std::isfinite(interaction.eps_den) ||
      !(interaction.noise_kappa >= 0) || !std::isfinite(interaction.noise_kappa))
    throw std::invalid_argument("sphere solver: eps_den and noise_kappa must be finite and >= 0");
  return std::make_unique<SphereSolver>(interaction, max_degree);
}

}  // namespace mfattn::meanfield
