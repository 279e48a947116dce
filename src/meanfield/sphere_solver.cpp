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
///   - with label nodes (rope about e_3: every node's gauge G_c a rotation by alpha_c about
///     e_3) the state is one density per node; rotations about e_3 are diagonal in m, so the
///     field of row c is, per Cartesian component k,
///       F_c,k = sum_c' A_cc' kernel_l e^{-i m gamma} (sigma_c' rotated)_k,  gamma = alpha_c' - alpha_c,
///     with sigma_c',k = y_k rho_c' (transported values: R(gamma) sigma, plain: sigma) and
///     X_c = b P_x F_c (USA) or b P_x F_c / (eps_den + D_c), D_c the same sum over rho_c'.
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

#include "meanfield/label_pairs.hpp"
#include "mfattn/core/gauge.hpp"
#include "mfattn/core/model.hpp"
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
/// A deviation from the mean below this fraction of the mean coefficient is rounding.
constexpr double kDeviationRounding = 1e-12;
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

/// The label nodes of a labelled solve: rotation angles about e_3, pair weights A_cc'.
struct SphereLabels {
  std::vector<double> nodes;     ///< xi_c, recorded as /fields/density/labels
  std::vector<double> rotation;  ///< alpha_c: G(xi_c) rotates by alpha_c about e_3
  std::vector<double> weights;   ///< A_cc' (label_pairs.hpp), row-major
  bool transported = true;       ///< values G_c^T G_c' V y, else V y
};

class SphereSolver final : public DensitySolver {
 public:
  SphereSolver(const IsotropicInteraction& interaction, std::size_t max_degree, SphereLabels labels,
               StepTolerance tolerance);

  const DensityGrid& grid() const override { return grid_; }
  std::string scheme() const override;
  double step(std::vector<double>& density, double max_step) override;
  void rate(const std::vector<double>& density, std::vector<double>& out) override;
  DensityObservables observe(const std::vector<double>& density) override;

 private:
  void check_size(const std::vector<double>& density) const;
  double row_mass(const double* row) const;
  /// One row: points_ values <-> count_ coefficients.
  void analyse(const double* values, Complex* coefficients);
  void synthesise(const Complex* coefficients, double* values);
  /// out = the coefficients of -div(rho X[rho]) for rho = the band-limited density a (every
  /// row); returns max |X| on the grid.
  double drift(const std::vector<Complex>& a, std::vector<Complex>& out);
  double isotropic_drift(const std::vector<Complex>& a, std::vector<Complex>& out);
  double labelled_drift(const std::vector<Complex>& a, std::vector<Complex>& out);
  /// out (coefficients) = the spin-1 divergence part of (flux_theta, flux_phi): -div F.
  void minus_divergence(Complex* out);
  /// The sums over source nodes c' of receiver node c, in one pass over the coefficients:
  ///   density_sum = sum_c' A_cc' kernel_l e^{-i m gamma} rho_c'                       (if not null)
  ///   field_k     = sum_c' A_cc' kernel_l e^{-i m gamma} (R(gamma) or I) (y rho_c')_k  (if not null)
  /// gamma = alpha_c' - alpha_c; sources holds per node `slots` blocks of count_ coefficients
  /// (rho, then y_1 rho, y_2 rho, y_3 rho when slots = 4); field is 3 blocks.
  void receiver_sums(std::size_t c, const Complex* sources, std::size_t slots, Complex* density_sum, Complex* field);
  void diffuse(std::vector<Complex>& a, double time) const;
  bool labelled() const { return !labels_.rotation.empty(); }

  IsotropicInteraction interaction_;
  SphereLabels labels_;
  StepTolerance tolerance_;
  std::size_t rows_ = 1;      // label nodes (1 without labels)
  std::size_t points_ = 0;    // n_theta n_phi, one row's values
  std::size_t count_ = 0;     // coefficients of one row
  int max_degree_;
  int flags_;  // of every sharp_execute
  std::unique_ptr<sharp_geom_info, GeomDeleter> geom_;
  std::unique_ptr<sharp_alm_info, AlmDeleter> alm_;
  DensityGrid grid_;
  FunkHecke factors_;
  std::vector<int> degree_;           // l of each coefficient
  std::vector<int> order_;            // m of each coefficient
  std::vector<double> filter_;        // exp(-36 (l/L)^36) per degree
  std::vector<double> multiplicity_;  // m = 0: 1; m > 0: 2 (a_{l,-m} = (-1)^m conj a_lm)
  // Scratch, sized once.
  std::vector<Complex> a_, k_, stage_, potential_, kernel_, e_, b_, moments_, phase_;
  std::vector<double> rho_, x_theta_, x_phi_, denominator_, cartesian_[3], row_values_;
  std::vector<double> cos_theta_, sin_theta_, cos_phi_, sin_phi_;
};

SphereSolver::SphereSolver(const IsotropicInteraction& interaction, std::size_t max_degree, SphereLabels labels,
                           StepTolerance tolerance)
    : interaction_(interaction), labels_(std::move(labels)), tolerance_(tolerance), max_degree_(static_cast<int>(max_degree)),
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
  points_ = n_theta * n_phi;
  count_ = count;
  if (labelled()) {
    rows_ = labels_.rotation.size();
    grid_.shape = {rows_, n_theta, n_phi};
    grid_.labels = labels_.nodes;
    const std::vector<double> ring_weights = grid_.weights;
    grid_.weights.clear();
    for (std::size_t c = 0; c < rows_; ++c) grid_.weights.insert(grid_.weights.end(), ring_weights.begin(), ring_weights.end());
  }
  order_.assign(count, 0);
  for (int m = 0; m <= max_degree_; ++m)
    for (int l = m; l <= max_degree_; ++l) order_[static_cast<std::size_t>(sharp_alm_index(alm_.get(), l, m))] = m;
  for (auto* v : {&a_, &k_, &stage_}) v->assign(rows_ * count, Complex{});
  potential_.assign(3 * count, Complex{});  // the labelled field's 3 components
  for (auto* v : {&kernel_, &e_, &b_}) v->assign(count, Complex{});
  for (auto* v : {&rho_, &x_theta_, &x_phi_, &denominator_, &cartesian_[0], &cartesian_[1], &cartesian_[2]})
    v->assign(points_, 0.0);
  if (labelled()) {
    moments_.assign(rows_ * 4 * count, Complex{});
    row_values_.assign(rows_ * points_, 0.0);
    phase_.assign(static_cast<std::size_t>(max_degree_) + 1, Complex{});
    for (std::size_t i = 0; i < n_theta; ++i) {
      cos_theta_.push_back(std::cos(grid_.theta[i]));
      sin_theta_.push_back(std::sin(grid_.theta[i]));
    }
    for (double phi : grid_.phi) {
      cos_phi_.push_back(std::cos(phi));
      sin_phi_.push_back(std::sin(phi));
    }
  }
}

std::string SphereSolver::scheme() const {
  const std::size_t rings = grid_.shape[grid_.shape.size() - 2], columns = grid_.shape.back();
  return "sphere: libsharp Gauss grid L=" + std::to_string(max_degree_) + " (" + std::to_string(rings) + "x" +
         std::to_string(columns) + ")" +
         (labelled() ? " x " + std::to_string(rows_) + " label nodes (rotations about e_3, " +
                           (labels_.transported ? "transported" : "plain") + " values)"
                     : std::string()) +
         ", pseudo-spectral " + (interaction_.usa ? "USA" : "SA") +
         ", SSP-RK3 + exact diffusion (Strang), exponential filter of order 36";
}

void SphereSolver::check_size(const std::vector<double>& density) const {
  if (density.size() != grid_.size())
    throw std::invalid_argument("sphere solver: density size does not match the grid");
}

double SphereSolver::row_mass(const double* row) const {
  double mass = 0;
  for (std::size_t p = 0; p < points_; ++p) mass += grid_.weights[p] * row[p];
  return mass;
}

void SphereSolver::analyse(const double* values, Complex* coefficients) {
  void* alm[] = {coefficients};
  // An analysis only reads the map; libsharp's C interface has no const.
  void* map[] = {const_cast<double*>(values)};
  sharp_execute(SHARP_MAP2ALM, 0, alm, map, geom_.get(), alm_.get(), flags_, nullptr, nullptr);
}

void SphereSolver::synthesise(const Complex* coefficients, double* values) {
  void* alm[] = {const_cast<Complex*>(coefficients)};  // a synthesis only reads the a_lm
  void* map[] = {values};
  sharp_execute(SHARP_ALM2MAP, 0, alm, map, geom_.get(), alm_.get(), flags_, nullptr, nullptr);
}

double SphereSolver::drift(const std::vector<Complex>& a, std::vector<Complex>& out) {
  return labelled() ? labelled_drift(a, out) : isotropic_drift(a, out);
}

void SphereSolver::minus_divergence(Complex* out) {
  void* alm[] = {e_.data(), b_.data()};
  void* map[] = {x_theta_.data(), x_phi_.data()};
  sharp_execute(SHARP_MAP2ALM, 1, alm, map, geom_.get(), alm_.get(), flags_, nullptr, nullptr);
  // -(div F)_lm = sqrt(l(l+1)) E_lm; the curl part B does not move mass. At l = 0 the factor
  // is exactly 0, so the mass is kept to rounding.
  for (std::size_t i = 0; i < count_; ++i) {
    const double l = degree_[i];
    out[i] = std::sqrt(l * (l + 1)) * e_[i];
  }
}

double SphereSolver::isotropic_drift(const std::vector<Complex>& a, std::vector<Complex>& out) {
  const bool usa = interaction_.usa;
  for (std::size_t i = 0; i < count_; ++i) {
    potential_[i] = factors_.potential[static_cast<std::size_t>(degree_[i])] * a[i];
    if (!usa) kernel_[i] = factors_.kernel[static_cast<std::size_t>(degree_[i])] * a[i];
  }
  {
    void* alm[] = {potential_.data()};
    void* map[] = {x_theta_.data(), x_phi_.data()};
    sharp_execute(SHARP_ALM2MAP_DERIV1, 1, alm, map, geom_.get(), alm_.get(), flags_, nullptr,
                  nullptr);
  }
  synthesise(a.data(), rho_.data());
  if (!usa) synthesise(kernel_.data(), denominator_.data());

  // X = b grad phi (USA) or b grad phi / (eps_den + int w dmu) (SA); the flux rho X
  // overwrites X in place.
  double max_speed2 = 0;
  for (std::size_t p = 0; p < points_; ++p) {
    const double scale = usa ? interaction_.value_scale
                             : interaction_.value_scale / (interaction_.eps_den + denominator_[p]);
    const double xt = scale * x_theta_[p];
    const double xp = scale * x_phi_[p];
    max_speed2 = std::max(max_speed2, xt * xt + xp * xp);
    x_theta_[p] = rho_[p] * xt;
    x_phi_[p] = rho_[p] * xp;
  }
  minus_divergence(out.data());
  return std::sqrt(max_speed2);
}

void SphereSolver::receiver_sums(std::size_t c, const Complex* sources, std::size_t slots, Complex* density_sum,
                                 Complex* field) {
  if (density_sum != nullptr) std::fill_n(density_sum, count_, Complex{});
  if (field != nullptr) std::fill_n(field, 3 * count_, Complex{});
  const bool transported = labels_.transported;
  for (std::size_t c2 = 0; c2 < rows_; ++c2) {
    const double weight = labels_.weights[c * rows_ + c2];
    if (weight == 0.0) continue;
    const double gamma = labels_.rotation[c2] - labels_.rotation[c];
    // weight e^{-i m gamma} per order m (the pair's rotation about e_3 is diagonal in m).
    for (std::size_t m = 0; m < phase_.size(); ++m) phase_[m] = weight * std::polar(1.0, -double(m) * gamma);
    const Complex* rho = sources + c2 * slots * count_;
    if (density_sum != nullptr)
      for (std::size_t i = 0; i < count_; ++i) density_sum[i] += phase_[static_cast<std::size_t>(order_[i])] * rho[i];
    if (field == nullptr) continue;
    // (R(gamma) y)_1 = cos y_1 - sin y_2, (R(gamma) y)_2 = sin y_1 + cos y_2 for transported values.
    const double cg = transported ? std::cos(gamma) : 1.0, sg = transported ? std::sin(gamma) : 0.0;
    const Complex *y1 = rho + count_, *y2 = y1 + count_, *y3 = y2 + count_;
    Complex *f1 = field, *f2 = field + count_, *f3 = field + 2 * count_;
    for (std::size_t i = 0; i < count_; ++i) {
      const Complex phase = phase_[static_cast<std::size_t>(order_[i])];
      const Complex a1 = phase * y1[i], a2 = phase * y2[i];
      f1[i] += cg * a1 - sg * a2;
      f2[i] += sg * a1 + cg * a2;
      f3[i] += phase * y3[i];
    }
  }
  // kernel_l does not depend on the source: applied once.
  for (std::size_t i = 0; i < count_; ++i) {
    const double kernel = factors_.kernel[static_cast<std::size_t>(degree_[i])];
    if (density_sum != nullptr) density_sum[i] *= kernel;
    if (field != nullptr)
      for (std::size_t k = 0; k < 3; ++k) field[k * count_ + i] *= kernel;
  }
}

double SphereSolver::labelled_drift(const std::vector<Complex>& a, std::vector<Complex>& out) {
  const bool usa = interaction_.usa;
  const std::size_t n_phi = grid_.phi.size(), stride = 4 * count_;  // a source row's slots
  // Per source row: its values (kept for its own flux below) and the coefficients of rho
  // (slot 0) and of y_k rho (slots 1..3).
  for (std::size_t c2 = 0; c2 < rows_; ++c2) {
    Complex* moments = moments_.data() + c2 * stride;
    std::copy_n(a.data() + c2 * count_, count_, moments);
    double* rho = row_values_.data() + c2 * points_;
    synthesise(a.data() + c2 * count_, rho);
    for (std::size_t p = 0; p < points_; ++p) {
      const std::size_t ring = p / n_phi, column = p % n_phi;
      cartesian_[0][p] = rho[p] * sin_theta_[ring] * cos_phi_[column];
      cartesian_[1][p] = rho[p] * sin_theta_[ring] * sin_phi_[column];
      cartesian_[2][p] = rho[p] * cos_theta_[ring];
    }
    for (std::size_t k = 0; k < 3; ++k) analyse(cartesian_[k].data(), moments + (k + 1) * count_);
  }
  double max_speed2 = 0;
  for (std::size_t c = 0; c < rows_; ++c) {
    // F (3 blocks of potential_) and, for SA, D (kernel_).
    receiver_sums(c, moments_.data(), 4, usa ? nullptr : kernel_.data(), potential_.data());
    for (std::size_t k = 0; k < 3; ++k) synthesise(potential_.data() + k * count_, cartesian_[k].data());
    if (!usa) synthesise(kernel_.data(), denominator_.data());
    const double* rho = row_values_.data() + c * points_;
    // X = b P_x F (/ (eps_den + D) for SA) in the (e_theta, e_phi) frame; the flux rho X.
    for (std::size_t p = 0; p < points_; ++p) {
      const std::size_t ring = p / n_phi, column = p % n_phi;
      const double ct = cos_theta_[ring], st = sin_theta_[ring], cp = cos_phi_[column], sp = sin_phi_[column];
      const double scale = usa ? interaction_.value_scale
                               : interaction_.value_scale / (interaction_.eps_den + denominator_[p]);
      const double fx = cartesian_[0][p], fy = cartesian_[1][p], fz = cartesian_[2][p];
      const double xt = scale * (ct * cp * fx + ct * sp * fy - st * fz);
      const double xp = scale * (-sp * fx + cp * fy);
      max_speed2 = std::max(max_speed2, xt * xt + xp * xp);
      x_theta_[p] = rho[p] * xt;
      x_phi_[p] = rho[p] * xp;
    }
    minus_divergence(out.data() + c * count_);
  }
  return std::sqrt(max_speed2);
}

void SphereSolver::diffuse(std::vector<Complex>& a, double time) const {
  std::vector<double> factor(static_cast<std::size_t>(max_degree_) + 1);
  for (std::size_t l = 0; l < factor.size(); ++l) {
    const double ll = static_cast<double>(l);
    factor[l] = std::exp(-ll * (ll + 1) * time / interaction_.noise_kappa);
  }
  for (std::size_t i = 0; i < a.size(); ++i) a[i] *= factor[static_cast<std::size_t>(degree_[i % count_])];
}

double SphereSolver::step(std::vector<double>& density, double max_step) {
  check_size(density);
  if (!(max_step > 0)) throw std::invalid_argument("sphere solver: max_step must be > 0");
  for (std::size_t c = 0; c < rows_; ++c) analyse(density.data() + c * points_, a_.data() + c * count_);
  // The step depends only on the incoming density (its max |X|) and max_step.
  const double speed = drift(a_, k_);
  double dt = max_step;
  if (speed > 0) dt = std::min(dt, kCourant * kPi / (max_degree_ * speed));
  // The density's deviation from its mean changes by at most relative_change() of itself
  // (StepTolerance): dt <= relative_change / gamma with gamma = |drift| / |deviation|, the
  // growth rate of a small perturbation of the uniform state, which the bound above (max |X|
  // of order eps) never sees. A deviation below 1e-12 of the mean is rounding.
  double deviation = 0.0, change = 0.0, mean = 0.0;
  for (std::size_t i = 0; i < a_.size(); ++i) {
    const double weight = multiplicity_[i % count_];
    if (degree_[i % count_] == 0) {
      mean = std::max(mean, std::abs(a_[i]));
      continue;
    }
    deviation += weight * std::norm(a_[i]);
    change += weight * std::norm(k_[i]);
  }
  const double growth = std::sqrt(change) / (std::sqrt(deviation) + kDeviationRounding * mean);
  if (growth > 0) dt = std::min(dt, tolerance_.relative_change() / growth);

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
  for (std::size_t i = 0; i < n; ++i) a_[i] *= filter_[static_cast<std::size_t>(degree_[i % count_])];
  // The drift and diffusion keep a_00 exactly, but a libsharp synthesis-analysis round trip
  // moves it by a biased ~1e-15 relative (measured), which adds up over thousands of steps:
  // restore each row's incoming mass with a uniform correction of that size.
  for (std::size_t c = 0; c < rows_; ++c) {
    double* row = density.data() + c * points_;
    const double mass = row_mass(row);
    synthesise(a_.data() + c * count_, row);
    const double correction = (mass - row_mass(row)) / (4 * kPi);
    for (std::size_t p = 0; p < points_; ++p) row[p] += correction;
  }
  return dt;
}

void SphereSolver::rate(const std::vector<double>& density, std::vector<double>& out) {
  check_size(density);
  for (std::size_t c = 0; c < rows_; ++c) analyse(density.data() + c * points_, a_.data() + c * count_);
  drift(a_, k_);
  if (interaction_.noise_kappa > 0)
    for (std::size_t i = 0; i < k_.size(); ++i) {
      const double l = degree_[i % count_];
      k_[i] -= l * (l + 1) / interaction_.noise_kappa * a_[i];
    }
  out.resize(density.size());
  for (std::size_t c = 0; c < rows_; ++c) synthesise(k_.data() + c * count_, out.data() + c * points_);
}

DensityObservables SphereSolver::observe(const std::vector<double>& density) {
  check_size(density);
  DensityObservables obs;
  const double row_weight = 1.0 / double(rows_);
  for (std::size_t c = 0; c < rows_; ++c) analyse(density.data() + c * points_, a_.data() + c * count_);
  obs.min_density = *std::min_element(density.begin(), density.end());
  double entropy = 0;  // sum weights rho log rho over rho > 0: not exact, rho log rho is not
                       // band-limited
  for (std::size_t p = 0; p < density.size(); ++p) {
    obs.mass += row_weight * grid_.weights[p] * density[p];
    if (density[p] > 0) entropy += row_weight * grid_.weights[p] * density[p] * std::log(density[p]);
  }
  // The marginal's coefficients (the mean of the rows) in stage_'s first row.
  std::fill_n(stage_.begin(), count_, Complex{});
  for (std::size_t c = 0; c < rows_; ++c)
    for (std::size_t i = 0; i < count_; ++i) stage_[i] += row_weight * a_[c * count_ + i];
  // The degree-k power sum_m |a_km|^2 from the stored m >= 0; A_k = sqrt(4 pi / (2k+1) power),
  // so that a Dirac at x0 (sum_m |Y_km(x0)|^2 = (2k+1)/(4 pi)) has A_k = 1.
  auto amplitudes = [&](const Complex* coefficients) {
    std::array<double, kRecordedModes> power{};
    for (std::size_t i = 0; i < count_; ++i) {
      const auto l = static_cast<std::size_t>(degree_[i]);
      if (l >= 1 && l <= kRecordedModes) power[l - 1] += multiplicity_[i] * std::norm(coefficients[i]);
    }
    for (std::size_t k = 1; k <= kRecordedModes; ++k)
      power[k - 1] = std::sqrt(4 * kPi / (2.0 * static_cast<double>(k) + 1) * power[k - 1]);
    return power;
  };
  obs.modes = amplitudes(stage_.data());
  obs.order_parameter = obs.modes[0];  // |int x dmu|^2 = (4 pi / 3) sum_m |a_1m|^2
  // The energy 1/(2 beta) sum_c (1/M_xi) int rho_c D_c with D_c = sum_c' A_cc' (w * rho_c'):
  // without labels int int w dmu dmu = sum_lm kernel_l |a_lm|^2.
  double pair = 0;
  if (labelled()) {
    double conditional = 0;
    for (std::size_t c = 0; c < rows_; ++c) {
      conditional += row_weight * (1.0 - amplitudes(a_.data() + c * count_)[0]);
      receiver_sums(c, a_.data(), 1, kernel_.data(), nullptr);
      for (std::size_t i = 0; i < count_; ++i)
        pair += row_weight * multiplicity_[i] * (std::conj(a_[c * count_ + i]) * kernel_[i]).real();
    }
    obs.conditional_variance = conditional;
    obs.marginal_variance = 1.0 - obs.modes[0];
  } else {
    for (std::size_t i = 0; i < count_; ++i)
      pair += factors_.kernel[static_cast<std::size_t>(degree_[i])] * multiplicity_[i] * std::norm(a_[i]);
  }
  obs.energy = interaction_.beta != 0 ? pair / (2 * interaction_.beta)
                                      : std::numeric_limits<double>::quiet_NaN();
  obs.free_energy = obs.energy;
  if (interaction_.noise_kappa > 0) obs.free_energy -= entropy / interaction_.noise_kappa;
  return obs;
}

/// The label nodes of label_model, whose gauge (if any) must rotate about e_3 at every node.
SphereLabels sphere_labels(const Model& label_model) {
  SphereLabels labels;
  labels.transported = label_model.values == ValueTransport::Transported;
  labels.weights = label_pair_weights(label_model);
  for (std::size_t c = 0; c < label_model.n; ++c) {
    labels.nodes.push_back(label_model.positions.empty() ? 0.0 : label_model.positions[c * label_model.position_dim]);
    double alpha = 0.0;
    if (label_model.gauge) {
      double columns[3][3];
      for (int k = 0; k < 3; ++k) {
        const double unit[3] = {k == 0 ? 1.0 : 0.0, k == 1 ? 1.0 : 0.0, k == 2 ? 1.0 : 0.0};
        label_model.gauge->apply(c, unit, columns[k]);
      }
      alpha = std::atan2(columns[0][1], columns[0][0]);
      const double ca = std::cos(alpha), sa = std::sin(alpha);
      const double expected[3][3] = {{ca, sa, 0.0}, {-sa, ca, 0.0}, {0.0, 0.0, 1.0}};
      for (int k = 0; k < 3; ++k)
        for (int r = 0; r < 3; ++r)
          if (std::abs(columns[k][r] - expected[k][r]) > 1e-12)
            throw UnsupportedLabelGauge("the gauge of label node " + std::to_string(c) +
                                        " is not a rotation about e_3 (S^2 takes rope with one rotating block)");
    }
    labels.rotation.push_back(alpha);
  }
  return labels;
}

}  // namespace

std::unique_ptr<DensitySolver> make_sphere_solver(const IsotropicInteraction& interaction,
                                                  std::size_t max_degree, const StepTolerance& tolerance,
                                                  const Model* label_model) {
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
  if (label_model != nullptr && label_model->n == 0) throw std::invalid_argument("sphere solver: no label nodes");
  return std::make_unique<SphereSolver>(interaction, max_degree,
                                        label_model != nullptr ? sphere_labels(*label_model) : SphereLabels{},
                                        tolerance);
}

}  // namespace mfattn::meanfield
