#pragma once
// The derivatives of the layer's output a_i = p_i F_i(y) (docs/model.md section 2e), pair by
// pair: the oracle the fast derivatives are tested against, and (until the CPU backend has
// derivative lanes of its own) the CPU backend's derivatives too. O(n) memory: every weight is
// recomputed where it is needed, none is stored.
#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/sinkhorn.hpp"
#include "mfattn/backends/backend.hpp"
#include "mfattn/backends/derivatives.hpp"
#include "mfattn/core/model.hpp"

namespace mfattn::detail {

/// LSE_k term(k) over k < count from the terms' exact maximum (-inf where every term is), in
/// k order: the reference's literal log-sum-exp (its Sinkhorn passes, and theirs recorded
/// for the derivatives).
template <class Term>
double exact_log_sum_exp(std::size_t count, Term&& term) {
  double largest = -HUGE_VAL;
  for (std::size_t k = 0; k < count; ++k) largest = std::max(largest, term(k));
  if (largest == -HUGE_VAL) return largest;
  double sum = 0.0;
  for (std::size_t k = 0; k < count; ++k) sum += std::exp(term(k) - largest);
  return kernels::log_sum_exp(largest, sum);
}

/// Backend::output_vjp of the formulas, pair by pair.
void reference_output_vjp(const Model& model, std::size_t replicas, const double* y, const double* output_cotangent,
                          double* y_cotangent, FieldNumbers& gradient);
/// Backend::output_jvp of the formulas, pair by pair.
void reference_output_jvp(const Model& model, std::size_t replicas, const double* y, const double* y_tangent,
                          const FieldNumbers* tangent, double* output_tangent);

/// A backend whose derivatives are these (the reference backend, and the CPU backend until it
/// has lanes for them): Backend::output_vjp and output_jvp on the model it was made for.
class ReferenceDerivativesBackend : public Backend {
 public:
  explicit ReferenceDerivativesBackend(const Model& model) : derivative_model_(model) {}
  void output_vjp(std::size_t replicas, const double* y, const double* output_cotangent, double* y_cotangent,
                  FieldNumbers& gradient) override {
    reference_output_vjp(derivative_model_, replicas, y, output_cotangent, y_cotangent, gradient);
  }
  void output_jvp(std::size_t replicas, const double* y, const double* y_tangent, const FieldNumbers* tangent,
                  double* output_tangent) override {
    reference_output_jvp(derivative_model_, replicas, y, y_tangent, tangent, output_tangent);
  }

 private:
  const Model& derivative_model_;
};

}  // namespace mfattn::detail
