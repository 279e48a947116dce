#include "meanfield/circle_fields.hpp"

#include <algorithm>
#include <cmath>
#include <complex>
#include <numbers>
#include <stdexcept>

#include "backends/model_sources.hpp"
#include "meanfield/label_pairs.hpp"
#include "meanfield/real_transform.hpp"
#include "mfattn/backends/backend.hpp"

namespace mfattn::meanfield {

namespace {

/// A 2 x 2 matrix, row-major.
struct Planar {
  double a[4] = {1, 0, 0, 1};
  double operator()(int r, int c) const { return a[2 * r + c]; }
};

Planar product(const Planar& x, const Planar& y) {
  Planar p;
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 2; ++c) p.a[2 * r + c] = x(r, 0) * y(0, c) + x(r, 1) * y(1, c);
  return p;
}

Planar transpose(const Planar& x) { return Planar{{x(0, 0), x(1, 0), x(0, 1), x(1, 1)}}; }

Planar planar(const Matrix& m, bool identity) {
  return identity ? Planar{} : Planar{{m(0, 0), m(0, 1), m(1, 0), m(1, 1)}};
}

/// A multiple of a rotation, [[p, -q], [q, p]], to rounding.
bool is_conformal(const Planar& m) {
  const double scale = std::abs(m(0, 0)) + std::abs(m(0, 1)) + std::abs(m(1, 0)) + std::abs(m(1, 1));
  const double tolerance = 1e-12 * std::max(scale, 1e-300);
  return std::abs(m(0, 0) - m(1, 1)) <= tolerance && std::abs(m(0, 1) + m(1, 0)) <= tolerance;
}

/// G(xi_c)^T G(xi_c') of the label model's gauge (I without one).
Planar relative_gauge(const Model& model, std::size_t c, std::size_t c2) {
  if (!model.gauge) return Planar{};
  Planar g;
  for (int column = 0; column < 2; ++column) {
    const double unit[2] = {column == 0 ? 1.0 : 0.0, column == 1 ? 1.0 : 0.0};
    double moved[2], back[2];
    model.gauge->apply(c2, unit, moved);
    model.gauge->apply_transpose(c, moved, back);
    g.a[column] = back[0];
    g.a[2 + column] = back[1];
  }
  return g;
}

/// The kernel of one label pair with the receiver at x = e(0) and the source at e(delta):
/// score beta <B e(0), e(delta)>... written out as beta (B e(delta))_0, value's tangent part
/// (V' e(delta))_1 (the tangent at e(0) is e_1).
struct PairKernel {
  Planar score, value;
};

PairKernel pair_kernel(const Model& model, std::size_t c, std::size_t c2) {
  // The one head of --q, --k, --v (meanfield takes no layer options).
  const AttentionHead& m = model.matrices_of(0).heads.front();
  const Planar relative = relative_gauge(model, c, c2);
  const Planar q = planar(m.query, m.query_identity), k = planar(m.key, m.key_identity),
               v = planar(m.full_value, m.full_value_identity);
  PairKernel kernel;
  kernel.score = product(transpose(q), product(relative, k));
  kernel.value = model.values == ValueTransport::Transported ? product(v, relative) : v;
  return kernel;
}

class FourierField final : public CircleField {
 public:
  FourierField(const Model& model, std::size_t angles)
      : labels_(model.n), m_(angles), transform_(angles), label_weight_(label_pair_weights(model)),
        usa_(model.normalization == Normalization::Usa), eps_den_(model.eps_den) {
    // The kernels depend on the label offset c' - c only (uniform label nodes, a gauge
    // linear in xi); each offset's three kernels are transformed once.
    const std::size_t offsets = 2 * labels_ - 1;
    const std::size_t modes = transform_.modes();
    velocity_kernel_.assign(offsets * modes, 0.0);
    face_weight_kernel_.assign(offsets * modes, 0.0);
    centre_weight_kernel_.assign(offsets * modes, 0.0);
    std::vector<bool> done(offsets, false);
    std::vector<PairKernel> kernel_of(offsets);
    const double h = 2.0 * std::numbers::pi / double(m_);
    std::vector<double> velocity(m_), face_weight(m_), centre_weight(m_);
    for (std::size_t c = 0; c < labels_; ++c)
      for (std::size_t c2 = 0; c2 < labels_; ++c2) {
        const std::size_t offset = c2 + labels_ - 1 - c;
        const PairKernel kernel = pair_kernel(model, c, c2);
        if (done[offset]) {
          for (int e = 0; e < 4; ++e)
            if (std::abs(kernel.score.a[e] - kernel_of[offset].score.a[e]) > 1e-12 ||
                std::abs(kernel.value.a[e] - kernel_of[offset].value.a[e]) > 1e-12)
              throw std::invalid_argument("the gauge's rotations are not a function of the label offset");
          continue;
        }
        done[offset] = true;
        kernel_of[offset] = kernel;
        for (std::size_t j = 0; j < m_; ++j) {
          // Sources at theta_a + j h seen from the face theta_a + h / 2 and from the centre.
          auto weight = [&](double delta) {
            return std::exp(model.beta * (kernel.score(0, 0) * std::cos(delta) + kernel.score(0, 1) * std::sin(delta)) -
                            model.exponent_shift());
          };
          auto tangent = [&](double delta) {
            return kernel.value(1, 0) * std::cos(delta) + kernel.value(1, 1) * std::sin(delta);
          };
          const double face_delta = double(j) * h - 0.5 * h, centre_delta = double(j) * h;
          face_weight[j] = weight(face_delta) * h;
          velocity[j] = face_weight[j] * tangent(face_delta);
          centre_weight[j] = weight(centre_delta) * h;
        }
        store_conjugate_transform(velocity, velocity_kernel_, offset);
        store_conjugate_transform(face_weight, face_weight_kernel_, offset);
        store_conjugate_transform(centre_weight, centre_weight_kernel_, offset);
      }
  }

  std::string name() const override { return "fourier"; }

  void face_velocity(const std::vector<double>& density, std::vector<double>& v) override {
    transform_rows(density);
    v.resize(labels_ * m_);
    std::vector<double>& numerator = numerator_, &denominator = denominator_;
    numerator.resize(m_);
    denominator.resize(m_);
    // USA divides by the total mass M = int dmu (1 to rounding for a probability density), as
    // the particles' u_i = (1/M) sum_j w_ij v_ij and the pair loop of QuadratureField do.
    double mass = 0.0;
    for (double rho : density) mass += rho;
    mass *= 2.0 * std::numbers::pi / double(m_ * labels_);
    for (std::size_t c = 0; c < labels_; ++c) {
      correlate(c, velocity_kernel_, numerator);
      if (usa_) {
        for (std::size_t a = 0; a < m_; ++a) v[c * m_ + a] = numerator[a] / mass;
      } else {
        correlate(c, face_weight_kernel_, denominator);
        for (std::size_t a = 0; a < m_; ++a) {
          const double total = eps_den_ + denominator[a];
          v[c * m_ + a] = total > 0.0 ? numerator[a] / total : 0.0;
        }
      }
    }
  }

  void weight_sums(const std::vector<double>& density, std::vector<double>& sums) override {
    transform_rows(density);
    sums.resize(labels_ * m_);
    std::vector<double>& row = numerator_;
    row.resize(m_);
    for (std::size_t c = 0; c < labels_; ++c) {
      correlate(c, centre_weight_kernel_, row);
      std::copy(row.begin(), row.end(), sums.begin() + c * m_);
    }
  }

 private:
  // The correlation sum_b f_b g_{b-a} is, mode by mode, F(k) conj(G(k)): kernels are kept
  // conjugated.
  void store_conjugate_transform(const std::vector<double>& samples, std::vector<Complex>& kernels,
                                 std::size_t offset) {
    const std::size_t modes = transform_.modes();
    transform_.forward(samples.data(), kernels.data() + offset * modes);
    for (std::size_t k = 0; k < modes; ++k) kernels[offset * modes + k] = std::conj(kernels[offset * modes + k]);
  }

  // Each row's masses' spectrum (the label weight 1/M_xi is in label_weight_).
  void transform_rows(const std::vector<double>& density) {
    const std::size_t modes = transform_.modes();
    row_spectra_.resize(labels_ * modes);
    for (std::size_t c = 0; c < labels_; ++c) transform_.forward(density.data() + c * m_, row_spectra_.data() + c * modes);
  }

  // out_a = sum_c' A_cc' sum_b rho_c'b g_{c'-c}(b - a): receiver row c at every point.
  void correlate(std::size_t c, const std::vector<Complex>& kernels, std::vector<double>& out) {
    const std::size_t modes = transform_.modes();
    sum_.assign(modes, Complex(0.0, 0.0));
    for (std::size_t c2 = 0; c2 < labels_; ++c2) {
      const double weight = label_weight_[c * labels_ + c2];
      if (weight == 0.0) continue;
      const Complex* kernel = kernels.data() + (c2 + labels_ - 1 - c) * modes;
      const Complex* row = row_spectra_.data() + c2 * modes;
      for (std::size_t k = 0; k < modes; ++k) sum_[k] += weight * (row[k] * kernel[k]);
    }
    transform_.backward(sum_.data(), out.data());
    const double inverse = 1.0 / double(m_);
    for (double& value : out) value *= inverse;
  }

  std::size_t labels_, m_;
  RealTransform transform_;
  std::vector<double> label_weight_;
  bool usa_;
  double eps_den_;
  std::vector<Complex> velocity_kernel_, face_weight_kernel_, centre_weight_kernel_;
  std::vector<Complex> row_spectra_, sum_;
  std::vector<double> numerator_, denominator_;  // one row's sums, kept between evaluations
};

/// The label model's gauge seen by the grid's tokens: token c M + a sits at label node c.
class RowGauge final : public Gauge {
 public:
  RowGauge(std::shared_ptr<const Gauge> labels, std::size_t angles) : labels_(std::move(labels)), angles_(angles) {}
  void apply(std::size_t token, const double* in, double* out) const override {
    labels_->apply(token / angles_, in, out);
  }
  void apply_transpose(std::size_t token, const double* in, double* out) const override {
    labels_->apply_transpose(token / angles_, in, out);
  }
  std::vector<Matrix> recorded_generators() const override { return labels_->recorded_generators(); }

 private:
  std::shared_ptr<const Gauge> labels_;
  std::size_t angles_;
};

class QuadratureField final : public CircleField {
 public:
  QuadratureField(const Model& label_model, std::size_t angles, int threads)
      : labels_(label_model.n), m_(angles), threads_(threads), grid_(label_model) {
    const std::size_t n = labels_ * m_, k = label_model.position_dim;
    grid_.n = n;
    grid_.presence.assign(n, 0.0);
    grid_.receivers_at_unit_speed = true;
    grid_.prompt_id.assign(n, 0);
    grid_.positions.resize(n * k);
    for (std::size_t i = 0; i < n; ++i)
      std::copy_n(label_model.positions.begin() + (i / m_) * k, k, grid_.positions.begin() + i * k);
    if (label_model.gauge) grid_.gauge = std::make_shared<RowGauge>(label_model.gauge, m_);
    points_.resize(n * 2);
    for (std::size_t i = 0; i < n; ++i) {
      const double theta = 2.0 * std::numbers::pi * double(i % m_) / double(m_);
      points_[2 * i] = std::cos(theta);
      points_[2 * i + 1] = std::sin(theta);
    }
  }

  std::string name() const override { return "quadrature (cpu pair loop)"; }

  void face_velocity(const std::vector<double>& density, std::vector<double>& v) override {
    evaluate(density, nullptr);
    v.resize(labels_ * m_);
    for (std::size_t c = 0; c < labels_; ++c)
      for (std::size_t a = 0; a < m_; ++a) {
        const std::size_t i = c * m_ + a, next = c * m_ + (a + 1) % m_;
        v[i] = 0.5 * (tangent(i) + tangent(next));
      }
  }

  void weight_sums(const std::vector<double>& density, std::vector<double>& sums) override {
    sums.resize(labels_ * m_);
    evaluate(density, sums.data());
  }

 private:
  // The presences are the masses: the backend reads them when it is made, so every
  // evaluation makes one (set-up O(n), the evaluation O(n^2)).
  void evaluate(const std::vector<double>& density, double* sums) {
    const double h = 2.0 * std::numbers::pi / double(m_);
    for (std::size_t i = 0; i < grid_.n; ++i) grid_.presence[i] = std::max(density[i], 0.0) * h / double(labels_);
    velocity_.resize(grid_.n * 2);
    std::unique_ptr<Backend> backend = make_cpu_backend(grid_, BackendOptions{threads_, Precision::Double});
    backend->velocity(1, points_.data(), velocity_.data(), sums);
  }

  // d theta / dt at grid point i: the tangent velocity's component along (-sin, cos).
  double tangent(std::size_t i) const {
    return -points_[2 * i + 1] * velocity_[2 * i] + points_[2 * i] * velocity_[2 * i + 1];
  }

  std::size_t labels_, m_;
  int threads_;
  Model grid_;
  std::vector<double> points_, velocity_;
};

}  // namespace

bool circle_kernels_commute(const Model& label_model) {
  for (std::size_t c = 0; c < label_model.n; ++c)
    for (std::size_t c2 = 0; c2 < label_model.n; ++c2) {
      const PairKernel kernel = pair_kernel(label_model, c, c2);
      if (!is_conformal(kernel.score) || !is_conformal(kernel.value)) return false;
    }
  return true;
}

std::unique_ptr<CircleField> make_fourier_field(const Model& label_model, std::size_t angles) {
  return std::make_unique<FourierField>(label_model, angles);
}

std::unique_ptr<CircleField> make_quadrature_field(const Model& label_model, std::size_t angles, int threads) {
  return std::make_unique<QuadratureField>(label_model, angles, threads);
}

}  // namespace mfattn::meanfield
