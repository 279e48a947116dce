// The test oracle: docs/model.md section 2 written literally, one pair at a time, with no
// running maximum, no tiling and no shared code with the fast backends. Slow by design.
#include "backends/backend_common.hpp"

#include <vector>

namespace mfattn {
namespace {

class ReferenceBackend final : public Backend {
 public:
  explicit ReferenceBackend(const Model& model) : model_(model) {}
  std::string name() const override { return "reference"; }

  void velocity(std::size_t replicas, const double* x, double* velocity_out,
                double* weight_sums_out) override {
    const std::size_t n = model_.n, d = model_.d;
    std::vector<double> qx(d), kx(d), gq(d), gk(d), value(d), tmp(d), u(d), numerator(d);
    const double shift = model_.exponent_shift();
    for (std::size_t r = 0; r < replicas; ++r) {
      const double* xr = x + r * n * d;
      for (std::size_t i = 0; i < n; ++i) {
        const double* xi = xr + i * d;
        std::fill(numerator.begin(), numerator.end(), 0.0);
        double denominator = 0.0;
        apply_matrix(model_.q, model_.q_identity, xi, qx.data());
        apply_gauge(i, qx.data(), gq.data());
        // Sources: the n tokens of this replica, then the P frozen prefix tokens.
        for (std::size_t j = 0; j < n + model_.prefix_count(); ++j) {
          const double* xj = detail::source_content(model_, xr, j);
          const double* pos_i = model_.positions.data() + i * model_.position_dim;
          const double* pos_j = detail::source_position(model_, j);
          if (!detail::visible(model_, pos_i, pos_j) || !detail::prompt_visible(model_, i, j))
            continue;
          apply_matrix(model_.k, model_.k_identity, xj, kx.data());
          apply_gauge(j, kx.data(), gk.data());
          double score = 0.0;
          for (std::size_t c = 0; c < d; ++c) score += gq[c] * gk[c];
          const double weight = detail::source_presence(model_, j) *
                                detail::aux_factor_value(model_, pos_i, pos_j) *
                                std::exp(model_.beta * score - shift);
          // v_ij = V G_i^T G_j x_j (transported) or V x_j (plain)
          if (model_.values == ValueTransport::Transported && model_.gauge) {
            model_.gauge->apply(j, xj, tmp.data());
            model_.gauge->apply_transpose(i, tmp.data(), value.data());
          } else {
            std::copy(xj, xj + d, value.data());
          }
          apply_matrix(model_.v, model_.v_identity, value.data(), tmp.data());
          for (std::size_t c = 0; c < d; ++c) numerator[c] += weight * tmp[c];
          denominator += weight;
        }
        if (model_.normalization == Normalization::Usa) {
          const double mass = model_.mass();
          for (std::size_t c = 0; c < d; ++c) u[c] = numerator[c] / mass;
          for (std::size_t c = 0; c < d; ++c)
            if (!std::isfinite(u[c])) throw NumericalError("reference: USA weights overflow");
        } else {
          const double total = model_.eps_den + denominator;
          for (std::size_t c = 0; c < d; ++c) u[c] = total > 0.0 ? numerator[c] / total : 0.0;
        }
        double radial = 0.0;
        for (std::size_t c = 0; c < d; ++c) radial += xi[c] * u[c];
        double* vi = velocity_out + (r * n + i) * d;
        for (std::size_t c = 0; c < d; ++c)
          vi[c] = model_.presence[i] * (u[c] - radial * xi[c]);
        if (weight_sums_out) weight_sums_out[r * n + i] = denominator;
      }
    }
  }

 private:
  void apply_matrix(const Matrix& m, bool identity, const double* in, double* out) const {
    const std::size_t d = model_.d;
    if (identity) {
      std::copy(in, in + d, out);
      return;
    }
    for (std::size_t a = 0; a < d; ++a) {
      double sum = 0.0;
      for (std::size_t b = 0; b < d; ++b) sum += m(a, b) * in[b];
      out[a] = sum;
    }
  }
  void apply_gauge(std::size_t token, const double* in, double* out) const {
    if (model_.gauge)
      model_.gauge->apply(token, in, out);
    else
      std::copy(in, in + model_.d, out);
  }

  const Model& model_;
};

}  // namespace

std::unique_ptr<Backend> make_reference_backend(const Model& model, const BackendOptions&) {
  return std::make_unique<ReferenceBackend>(model);
}

}  // namespace mfattn
