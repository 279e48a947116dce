// The zonal solver (docs/meanfield.md, "Zonal densities"): densities of theta = arccos <x, e_1>
// on S^{d-1}, any d >= 2, for a rotation-invariant interaction. Values f are taken with respect
// to the normalized surface measure (uniform: f = 1), whose polar marginal is
//   w(theta) d theta = sin^{d-2}(theta) / Z_d d theta,   Z_d = int_0^pi sin^{d-2}.
// Cells a = 0..N-1 of width h = pi / N, centres theta_a = (a + 1/2) h, cell measures W_a = the
// integral of w over the cell (Gauss-Legendre in the cell), face measures w(theta_{a+1/2}),
// walls at the poles.
//
// The velocity at x (polar angle theta) along e_theta from a source y at theta' averages over
// the azimuth omega in S^{d-2}: <x, y> = cos theta cos theta' + sin theta sin theta' t with t
// = omega_1, and <y, e_theta> = -sin theta cos theta' + cos theta sin theta' t. With
//   H(z) = E[e^{z t}] = Gamma(nu + 1) (2/z)^nu I_nu(z),  H1(z) = E[t e^{z t}] = H'(z),
//   nu = (d - 3) / 2, z = c sin theta sin theta', c = beta a,
// the kernels are K_w = e^{c cos theta cos theta' - shift} H(z) (weight) and
// K_v = b e^{c cos theta cos theta' - shift} (-sin theta cos theta' H(z) + cos theta sin theta' H1(z)),
// summed by the midpoint rule over the cells (second order), as matrices made once.
// The diffusion (1/kappa) (1/w) d/dtheta (w df/dtheta) is the symmetric second difference
// with the face measures; its semigroup is applied exactly through the eigenvectors of the
// symmetrised generator W^{-1/2} A W^{-1/2}.
#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <stdexcept>

#include "meanfield/transport_solver.hpp"

namespace mfattn::meanfield {

namespace {

/// H(z) and H1(z) by their power series in z^2 / 4 (all terms positive, no cancellation):
///   H(z) = sum_k (z^2/4)^k Gamma(nu + 1) / (k! Gamma(nu + k + 1)),  H1(z) = z / (2 (nu + 1)) H_{nu+1}(z).
/// d = 2 (nu = -1/2) gives cosh z and sinh z. Odd in z for H1, even for H.
struct AzimuthAverages {
  double h = 1.0, h1 = 0.0;
};

AzimuthAverages azimuth_averages(double nu, double z) {
  const double q = 0.25 * z * z;
  double term = 1.0, sum = 1.0;
  for (int k = 0; k < 100000 && term > 1e-17 * sum; ++k) {
    term *= q / ((k + 1.0) * (nu + k + 1.0));
    sum += term;
  }
  double term1 = z / (2.0 * (nu + 1.0)), sum1 = term1;
  for (int k = 0; k < 100000 && std::abs(term1) > 1e-17 * std::abs(sum1); ++k) {
    term1 *= q / ((k + 1.0) * (nu + k + 2.0));
    sum1 += term1;
  }
  return {sum, sum1};
}

/// Gauss-Legendre nodes and weights on [-1, 1] (Newton on the Legendre recurrence).
void gauss_legendre(int n, std::vector<double>& nodes, std::vector<double>& weights) {
  nodes.assign(n, 0.0);
  weights.assign(n, 0.0);
  for (int i = 0; i < n; ++i) {
    double x = std::cos(std::numbers::pi * (i + 0.75) / (n + 0.5)), derivative = 0.0;
    for (int iteration = 0; iteration < 100; ++iteration) {
      double p0 = 1.0, p1 = x;
      for (int k = 2; k <= n; ++k) {
        const double p2 = ((2.0 * k - 1.0) * x * p1 - (k - 1.0) * p0) / k;
        p0 = p1;
        p1 = p2;
      }
      derivative = n * (x * p1 - p0) / (x * x - 1.0);
      const double dx = p1 / derivative;
      x -= dx;
      if (std::abs(dx) < 1e-16) break;
    }
    nodes[i] = x;
    weights[i] = 2.0 / ((1.0 - x * x) * derivative * derivative);
  }
}

/// w(theta) = sin^{d-2}(theta) / Z_d, Z_d = int_0^pi sin^{d-2} = sqrt(pi) Gamma((d-1)/2) / Gamma(d/2).
double zonal_polar_density(std::size_t d, double theta) {
  const double power = double(d) - 2.0;
  const double log_normaliser =
      0.5 * std::log(std::numbers::pi) + std::lgamma((double(d) - 1.0) / 2.0) - std::lgamma(double(d) / 2.0);
  const double s = std::sin(theta);
  if (power == 0.0) return std::exp(-log_normaliser);
  return s > 0.0 ? std::exp(power * std::log(s) - log_normaliser) : 0.0;
}

class ZonalSolver final : public TransportSolver {
 public:
  ZonalSolver(const IsotropicInteraction& interaction, std::size_t cells, CellLine line, StepTolerance tolerance)
      : TransportSolver(line, 1, interaction.noise_kappa, tolerance), interaction_(interaction), n_(cells),
        h_(std::numbers::pi / double(cells)) {
    grid_.kind = GridKind::Zonal;
    grid_.shape = {n_};
    for (std::size_t a = 0; a < n_; ++a) grid_.theta.push_back((double(a) + 0.5) * h_);
    grid_.weights = line.cell_measure;
    build_kernels();
    build_cell_modes();
    if (interaction_.noise_kappa > 0.0) build_heat();
  }

  const DensityGrid& grid() const override { return grid_; }
  std::string scheme() const override {
    return "zonal d=" + std::to_string(interaction_.d) + ": " + std::to_string(n_) +
           " polar cells, finite volumes, Heun + Euler error control, exact heat semigroup";
  }

  DensityObservables observe(const std::vector<double>& density) override {
    DensityObservables o;
    const std::vector<double>& w = grid_.weights;
    o.min_density = std::numeric_limits<double>::infinity();
    double entropy = 0.0;
    for (std::size_t a = 0; a < n_; ++a) {
      o.mass += w[a] * density[a];
      o.min_density = std::min(o.min_density, density[a]);
      if (density[a] > 0.0) entropy += w[a] * density[a] * std::log(density[a]);
    }
    // A_k = |int P_k(cos theta) dmu|: each cell's mass times the cell average of P_k.
    for (std::size_t k = 0; k < kRecordedModes; ++k) {
      o.modes[k] = 0.0;
      for (std::size_t a = 0; a < n_; ++a) o.modes[k] += w[a] * density[a] * cell_modes_[k * n_ + a];
    }
    for (double& mode : o.modes) mode = std::abs(mode);
    o.order_parameter = o.modes[0];
    if (interaction_.beta != 0.0) {
      // E = 1/(2 beta) int int w dmu dmu: the centres' weight sums.
      const Eigen::Map<const Eigen::VectorXd> f(density.data(), n_);
      const Eigen::VectorXd masses = f.cwiseProduct(cell_measure_);
      o.energy = masses.dot(centre_weight_ * masses) / (2.0 * interaction_.beta);
    } else {
      o.energy = std::numeric_limits<double>::quiet_NaN();
    }
    o.free_energy = interaction_.noise_kappa > 0.0 ? o.energy - entropy / interaction_.noise_kappa : o.energy;
    return o;
  }

 protected:
  void face_velocity(const std::vector<double>& density, std::vector<double>& v) override {
    const Eigen::Map<const Eigen::VectorXd> f(density.data(), n_);
    const Eigen::VectorXd masses = f.cwiseProduct(cell_measure_);
    v.resize(n_);
    Eigen::Map<Eigen::VectorXd> out(v.data(), n_);
    out.noalias() = face_velocity_ * masses;
    if (!interaction_.usa) {
      const Eigen::VectorXd denominator = face_weight_ * masses;
      for (std::size_t a = 0; a < n_; ++a) {
        const double total = interaction_.eps_den + denominator[a];
        out[a] = total > 0.0 ? out[a] / total : 0.0;
      }
    }
  }

  void heat(std::vector<double>& density, double t) override {
    // f <- W^{-1/2} U e^{t Lambda} U^T W^{1/2} f.
    Eigen::Map<Eigen::VectorXd> f(density.data(), n_);
    Eigen::VectorXd y = heat_vectors_.transpose() * f.cwiseProduct(root_measure_);
    for (std::size_t a = 0; a < n_; ++a) y[a] *= std::exp(t * heat_rates_[a]);
    f = (heat_vectors_ * y).cwiseQuotient(root_measure_);
    for (std::size_t a = 0; a < n_; ++a) f[a] = std::max(f[a], 0.0);
  }

  void add_diffusion(const std::vector<double>& density, std::vector<double>& out) const override {
    const CellLine& cells = line();
    const double coefficient = 1.0 / (interaction_.noise_kappa * h_);
    for (std::size_t a = 0; a < n_; ++a) {
      double flux = 0.0;
      if (a + 1 < n_) flux += cells.face_measure[a] * (density[a + 1] - density[a]);
      if (a > 0) flux -= cells.face_measure[a - 1] * (density[a] - density[a - 1]);
      out[a] += coefficient * flux / cells.cell_measure[a];
    }
  }

 private:
  // Each source cell's kernel is its average over the cell under the measure w (4 Gauss
  // points): a density constant on cells is then integrated exactly up to the kernel's
  // variation of order h^8, so the uniform density stays put to rounding (a midpoint rule
  // would leave it an O(h^2) drift that seeds the instabilities the solver studies).
  void build_kernels() {
    const double c = interaction_.beta * interaction_.score_scale, nu = (double(interaction_.d) - 3.0) / 2.0;
    const double shift = interaction_.exponent_shift, b = interaction_.value_scale;
    cell_measure_ = Eigen::Map<const Eigen::VectorXd>(grid_.weights.data(), n_);
    std::vector<double> nodes, node_weights;
    gauss_legendre(4, nodes, node_weights);
    face_velocity_ = Eigen::MatrixXd::Zero(n_, n_);
    face_weight_ = Eigen::MatrixXd::Zero(n_, n_);
    centre_weight_ = Eigen::MatrixXd::Zero(n_, n_);
    for (std::size_t s = 0; s < n_; ++s)
      for (std::size_t q = 0; q < nodes.size(); ++q) {
        const double source = (double(s) + 0.5 + 0.5 * nodes[q]) * h_;
        const double share = 0.5 * h_ * node_weights[q] * polar_density(source) / cell_measure_[s];
        if (!(share > 0.0)) continue;
        for (std::size_t a = 0; a < n_; ++a) {
          const double face = (double(a) + 1.0) * h_, centre = grid_.theta[a];
          const auto at_face = azimuth_averages(nu, c * std::sin(face) * std::sin(source));
          const double face_exponential = share * std::exp(c * std::cos(face) * std::cos(source) - shift);
          face_weight_(a, s) += face_exponential * at_face.h;
          face_velocity_(a, s) += b * face_exponential *
                                  (-std::sin(face) * std::cos(source) * at_face.h + std::cos(face) * std::sin(source) * at_face.h1);
          const auto at_centre = azimuth_averages(nu, c * std::sin(centre) * std::sin(source));
          centre_weight_(a, s) += share * std::exp(c * std::cos(centre) * std::cos(source) - shift) * at_centre.h;
        }
      }
  }

  double polar_density(double theta) const { return zonal_polar_density(interaction_.d, theta); }

  // The average over each cell, under w, of the Gegenbauer polynomials P_1..P_16 of S^{d-1}
  // (gegenbauer_polynomials) at 4 Gauss points: the uniform density's amplitudes are then 0 up to
  // O(h^8), not the O(h^2) of centre values.
  void build_cell_modes() {
    std::vector<double> nodes, node_weights;
    gauss_legendre(4, nodes, node_weights);
    cell_modes_.assign(kRecordedModes * n_, 0.0);
    for (std::size_t a = 0; a < n_; ++a)
      for (std::size_t q = 0; q < nodes.size(); ++q) {
        const double theta = (double(a) + 0.5 + 0.5 * nodes[q]) * h_;
        const double share = 0.5 * h_ * node_weights[q] * polar_density(theta) / cell_measure_[a];
        if (!(share > 0.0)) continue;
        double polynomials[kRecordedModes + 1];
        gegenbauer_polynomials(interaction_.d, std::cos(theta), polynomials, kRecordedModes + 1);
        for (std::size_t k = 1; k <= kRecordedModes; ++k) cell_modes_[(k - 1) * n_ + a] += share * polynomials[k];
      }
  }

  void build_heat() {
    const CellLine& cells = line();
    Eigen::MatrixXd generator = Eigen::MatrixXd::Zero(n_, n_);
    const double coefficient = 1.0 / (interaction_.noise_kappa * h_);
    root_measure_ = cell_measure_.cwiseSqrt();
    for (std::size_t a = 0; a + 1 < n_; ++a) {
      const double coupling = coefficient * cells.face_measure[a] / (root_measure_[a] * root_measure_[a + 1]);
      generator(a, a + 1) = generator(a + 1, a) = coupling;
      generator(a, a) -= coefficient * cells.face_measure[a] / cell_measure_[a];
      generator(a + 1, a + 1) -= coefficient * cells.face_measure[a] / cell_measure_[a + 1];
    }
    Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eigen(generator);
    heat_vectors_ = eigen.eigenvectors();
    heat_rates_ = eigen.eigenvalues();
  }

  IsotropicInteraction interaction_;
  std::size_t n_;
  double h_;
  DensityGrid grid_;
  Eigen::VectorXd cell_measure_, root_measure_, heat_rates_;
  std::vector<double> cell_modes_;  // [k][cell]: cell averages of P_{k+1}
  Eigen::MatrixXd face_velocity_, face_weight_, centre_weight_, heat_vectors_;
};

/// The polar cells of S^{d-1}: measures of the normalized surface measure (the smallest
/// normal double where the polar caps of high dimensions hold less: those cells carry no mass).
CellLine polar_cells(std::size_t d, std::size_t cells) {
  const double h = std::numbers::pi / double(cells);
  auto density = [&](double theta) { return zonal_polar_density(d, theta); };
  std::vector<double> nodes, weights;
  gauss_legendre(16, nodes, weights);
  CellLine line;
  line.cells = cells;
  line.periodic = false;
  line.cell_measure.resize(cells);
  line.face_measure.resize(cells);
  for (std::size_t a = 0; a < cells; ++a) {
    double measure = 0.0;
    for (std::size_t q = 0; q < nodes.size(); ++q)
      measure += 0.5 * h * weights[q] * density((double(a) + 0.5 + 0.5 * nodes[q]) * h);
    line.cell_measure[a] = std::max(measure, std::numeric_limits<double>::min());
    line.face_measure[a] = a + 1 < cells ? density((double(a) + 1.0) * h) : 0.0;
  }
  return line;
}

}  // namespace

std::unique_ptr<DensitySolver> make_zonal_solver(const IsotropicInteraction& interaction, std::size_t polar_cells_count,
                                                 const StepTolerance& tolerance) {
  if (interaction.d < 2) throw std::invalid_argument("zonal densities need d >= 2");
  if (polar_cells_count < 4) throw std::invalid_argument("the zonal solver needs at least 4 polar cells");
  return std::make_unique<ZonalSolver>(interaction, polar_cells_count, polar_cells(interaction.d, polar_cells_count),
                                       tolerance);
}

}  // namespace mfattn::meanfield
