// The circle solver (docs/meanfield.md, "The circle"): one periodic line of M finite-volume
// cells per label node, stepped by TransportSolver (semi-Lagrangian on periodic lines), the velocity from circle_fields.hpp, the
// heat semigroup exact by FFT.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <stdexcept>

#include "meanfield/circle_fields.hpp"
#include "meanfield/transport_solver.hpp"
#include "meanfield/real_transform.hpp"
#include "mfattn/meanfield/solvers.hpp"

namespace mfattn::meanfield {

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

CellLine periodic_line(std::size_t angles) {
  const double h = 2.0 * std::numbers::pi / double(angles);
  CellLine line;
  line.cells = angles;
  line.periodic = true;
  line.cell_measure.assign(angles, h);
  line.face_measure.assign(angles, 1.0);
  return line;
}

class CircleSolver final : public TransportSolver {
 public:
  CircleSolver(const Model& label_model, std::size_t angles, bool labelled, std::unique_ptr<CircleField> field,
               StepTolerance tolerance)
      : TransportSolver(periodic_line(angles), label_model.n, label_model.noise_kappa, tolerance),
        labels_(label_model.n), m_(angles), h_(2.0 * std::numbers::pi / double(angles)),
        beta_(label_model.beta), field_(std::move(field)), transform_(angles) {
    grid_.kind = GridKind::Circle;
    grid_.shape = labelled ? std::vector<std::size_t>{labels_, m_} : std::vector<std::size_t>{m_};
    for (std::size_t a = 0; a < m_; ++a) grid_.theta.push_back(double(a) * h_);
    if (labelled)
      for (std::size_t c = 0; c < labels_; ++c) grid_.labels.push_back(label_model.positions[c * label_model.position_dim]);
    grid_.weights.assign(labels_ * m_, h_);
  }

  const DensityGrid& grid() const override { return grid_; }

  std::string scheme() const override {
    return "circle: " + std::to_string(m_) + " cells" +
           (labels_ > 1 ? " x " + std::to_string(labels_) + " label nodes" : "") +
           ", flux-form semi-Lagrangian (Heun characteristics, error control on the feet), exact heat semigroup; velocity by " + field_->name();
  }

  DensityObservables observe(const std::vector<double>& density) override {
    DensityObservables o;
    const double label_weight = 1.0 / double(labels_);
    std::vector<double> marginal(m_, 0.0);
    double entropy = 0.0, conditional = 0.0;
    o.min_density = kInfinity;
    for (std::size_t c = 0; c < labels_; ++c) {
      Complex first(0.0, 0.0);
      for (std::size_t a = 0; a < m_; ++a) {
        const double rho = density[c * m_ + a];
        marginal[a] += label_weight * rho;
        o.min_density = std::min(o.min_density, rho);
        if (rho > 0.0) entropy += label_weight * h_ * rho * std::log(rho);
        first += h_ * rho * std::polar(1.0, grid_.theta[a]);
      }
      conditional += label_weight * (1.0 - std::abs(first));
    }
    for (std::size_t a = 0; a < m_; ++a) o.mass += h_ * marginal[a];
    for (std::size_t k = 1; k <= kRecordedModes; ++k) {
      Complex mode(0.0, 0.0);
      for (std::size_t a = 0; a < m_; ++a) mode += h_ * marginal[a] * std::polar(1.0, double(k) * grid_.theta[a]);
      o.modes[k - 1] = std::abs(mode);
    }
    o.order_parameter = o.modes[0];
    if (grid_.shape.size() == 2) {
      o.conditional_variance = conditional;
      o.marginal_variance = 1.0 - o.modes[0];
    }
    if (beta_ != 0.0) {
      field_->weight_sums(density, sums_);
      double total = 0.0;
      for (std::size_t i = 0; i < density.size(); ++i) total += label_weight * h_ * density[i] * sums_[i];
      o.energy = total / (2.0 * beta_);
    } else {
      o.energy = std::numeric_limits<double>::quiet_NaN();
    }
    o.free_energy = noise_kappa() > 0.0 ? o.energy - entropy / noise_kappa() : o.energy;
    return o;
  }

 protected:
  void face_velocity(const std::vector<double>& density, std::vector<double>& v) override {
    field_->face_velocity(density, v);
  }

  void add_diffusion(const std::vector<double>& density, std::vector<double>& out) const override {
    const double coefficient = 1.0 / (noise_kappa() * h_ * h_);
    for (std::size_t c = 0; c < labels_; ++c) {
      const double* f = density.data() + c * m_;
      for (std::size_t a = 0; a < m_; ++a)
        out[c * m_ + a] += coefficient * (f[(a + 1) % m_] - 2.0 * f[a] + f[(a + m_ - 1) % m_]);
    }
  }

  // exp(t Delta_h / kappa) on every row, Delta_h the periodic second difference: mode k is
  // multiplied by exp(-t (4 / (kappa h^2)) sin^2(pi k / M)). The semigroup's matrix is
  // non-negative; the FFT's rounding can leave values of order 1e-17 max rho below 0, which
  // are set to 0.
  void heat(std::vector<double>& density, double t) override {
    spectrum_.resize(transform_.modes());
    const double rate = 4.0 / (noise_kappa() * h_ * h_);
    for (std::size_t c = 0; c < labels_; ++c) {
      double* row = density.data() + c * m_;
      transform_.forward(row, spectrum_.data());
      for (std::size_t k = 0; k < spectrum_.size(); ++k) {
        const double s = std::sin(std::numbers::pi * double(k) / double(m_));
        spectrum_[k] *= std::exp(-t * rate * s * s) / double(m_);
      }
      transform_.backward(spectrum_.data(), row);
      for (std::size_t a = 0; a < m_; ++a) row[a] = std::max(row[a], 0.0);
    }
  }

  std::size_t labels_, m_;
  double h_, beta_;
  std::unique_ptr<CircleField> field_;
  RealTransform transform_;
  DensityGrid grid_;
  std::vector<double> sums_;
  std::vector<Complex> spectrum_;
};

}  // namespace

std::unique_ptr<DensitySolver> make_circle_solver(const Model& label_model, const CircleOptions& options) {
  if (label_model.d != 2) throw std::invalid_argument("the circle solver needs d = 2");
  if (options.angles < 4) throw std::invalid_argument("the circle solver needs at least 4 angles");
  const bool fourier = options.evaluation == CircleEvaluation::Fourier ||
                       (options.evaluation == CircleEvaluation::Automatic && circle_kernels_commute(label_model));
  if (options.evaluation == CircleEvaluation::Fourier && !circle_kernels_commute(label_model))
    throw std::invalid_argument("the kernel does not commute with rotations: no FFT evaluation");
  std::unique_ptr<CircleField> field = fourier ? make_fourier_field(label_model, options.angles)
                                               : make_quadrature_field(label_model, options.angles, options.threads);
  return std::make_unique<CircleSolver>(label_model, options.angles, options.labelled, std::move(field),
                                        options.tolerance);
}

}  // namespace mfattn::meanfield
