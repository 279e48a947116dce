// The test oracle: docs/model.md section 2 written literally, one pair at a time, with no
// running maximum and no tiling. Slow by design. It shares with the fast backends only the
// definitions of the physics (kernels/: the token operands and the pair terms' formulas),
// none of their loops, bounds or sums.
#include "backends/backend_common.hpp"
#include "backends/reference/reference_derivatives.hpp"
#include "backends/reference/reference_sinkhorn.hpp"
#include "backends/token_operands.hpp"

#include <memory>
#include <vector>

namespace mfattn {
namespace {

class ReferenceBackend final : public detail::ReferenceDerivativesBackend {
 public:
  explicit ReferenceBackend(const Model& model) : ReferenceDerivativesBackend(model), model_(model) {}
  std::string name() const override { return "reference"; }
  ScalingReport last_scaling() const override { return last_scaling_; }

  /// The field of docs/model.md sections 2 and 2b, as literally: for every receiver, every
  /// head's u_i^(h) pair by pair (each pair's value mapped back to R^d:
  /// V_h G_i^T z_j or O_h z_j), the heads in order, plus f(x_i); D_i is the sum of the heads'
  /// weight sums. Sinkhorn attention (section 2d) scales every head's matrix on its own and
  /// sums its plan's weights, P_ij = exp(f_i + l_ij + g_j), whose rows sum to 1.
  void evaluate(std::size_t replicas, const double* x, const FieldOutputs& out) override {
    const std::size_t n = model_.n, d = model_.d;
    const double shift = model_.exponent_shift(), mass = model_.mass();
    const bool sinkhorn_attention = model_.normalization == Normalization::Sinkhorn;
    std::vector<double> u(d), numerator(d), mapped(d), hidden, z;
    last_scaling_ = sinkhorn_attention ? ScalingReport{std::vector<double>(replicas), std::vector<double>(replicas)}
                                       : ScalingReport{};
    for (std::size_t r = 0; r < replicas; ++r) {
      const double* xr = x + r * n * d;
      const AttentionMatrices& matrices = model_.matrices_of(r);
      std::vector<host::HeadOperands> heads;
      for (const AttentionHead& head : matrices.heads) heads.emplace_back(model_, head);
      operands_.resize(heads.size());
      for (std::size_t h = 0; h < heads.size(); ++h) host::prepare_head_operands(heads[h], xr, operands_[h]);
      std::vector<std::unique_ptr<detail::ReferenceSinkhorn>> sinkhorn(heads.size());
      if (sinkhorn_attention)
        for (std::size_t h = 0; h < heads.size(); ++h) {
          sinkhorn[h] = std::make_unique<detail::ReferenceSinkhorn>(model_, operands_[h]);
          note_scaling(r, *sinkhorn[h]);
        }
      hidden.resize(matrices.mlp.width());
      for (std::size_t i = 0; i < n; ++i) {
        double weight_sum = 0.0;
        for (std::size_t h = 0; h < heads.size(); ++h) {
          const host::TokenOperands& operands = operands_[h];
          z.resize(operands.d);
          std::fill(numerator.begin(), numerator.end(), 0.0);
          double denominator = 0.0;
          for (std::size_t j = 0; j < operands.sources; ++j) {
            const kernels::PairWeightTerms<double> terms = host::model_pair_weight_terms(model_, i, j);
            if (!kernels::visible(terms)) continue;
            double weight = 0.0;
            if (sinkhorn[h]) {
              weight = sinkhorn[h]->plan(i, j);
              if (weight == 0.0) continue;
            } else {
              double score = 0.0;
              for (std::size_t c = 0; c < operands.d; ++c) score += operands.query(i)[c] * operands.key(j)[c];
              weight = operands.presence[j] * kernels::weight_factor(terms) * std::exp(model_.beta * score - shift);
            }
            std::copy(operands.value(j), operands.value(j) + operands.d, z.begin());
            heads[h].output(i, z.data(), mapped.data());
            for (std::size_t c = 0; c < d; ++c) numerator[c] += weight * mapped[c];
            denominator += weight;
          }
          // u_i^(h): the plan's rows sum to 1 (Sinkhorn); else the sum over M (USA) or over
          // eps_den + the weights (SA), 0 where that is 0. The first head's is u itself.
          const double normaliser = sinkhorn[h] ? 1.0
                                    : model_.normalization == Normalization::Usa ? mass
                                                                                  : model_.eps_den + denominator;
          for (std::size_t c = 0; c < d; ++c) {
            const double share = sinkhorn[h] ? numerator[c] : normaliser > 0.0 ? numerator[c] / normaliser : 0.0;
            u[c] = h == 0 ? share : u[c] + share;
          }
          weight_sum += sinkhorn[h] ? sinkhorn[h]->weight_sum(i) : denominator;
        }
        if (model_.normalization == Normalization::Usa)
          for (std::size_t c = 0; c < d; ++c)
            if (!std::isfinite(u[c])) throw NumericalError("reference: USA weights overflow");
        host::add_feed_forward(matrices.mlp, xr + i * d, hidden.data(), u.data());
        kernels::tangent_velocity(model_.receiver_speed(i), int(d), xr + i * d, u.data(),
                                  out.velocity + (r * n + i) * d,
                                  out.attention_output ? out.attention_output + (r * n + i) * d : nullptr);
        if (out.weight_sums) out.weight_sums[r * n + i] = weight_sum;
      }
    }
  }

 private:
  /// The largest column error and sweeps of replica r's scalings so far.
  void note_scaling(std::size_t r, const detail::ReferenceSinkhorn& sinkhorn) {
    last_scaling_.column_error[r] = std::max(last_scaling_.column_error[r], sinkhorn.slot().column_error);
    last_scaling_.sweeps[r] = std::max(last_scaling_.sweeps[r], double(sinkhorn.slot().sweeps));
  }

  const Model& model_;
  std::vector<host::TokenOperands> operands_;  ///< a head's each, reused between calls
  ScalingReport last_scaling_;
};

}  // namespace

std::unique_ptr<Backend> make_reference_backend(const Model& model, const BackendOptions&) {
  return std::make_unique<ReferenceBackend>(model);
}

}  // namespace mfattn
