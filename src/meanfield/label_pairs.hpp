#pragma once
// The label nodes' pair weights shared by the labelled solvers (circle and S^2): for receiver
// node c and source node c', A_cc' = m_cc' c_cc' / M_xi, the mask and auxiliary factor of
// kernels/pair_terms.hpp times the label quadrature weight 1/M_xi (uniform nodes).
#include <cstddef>
#include <vector>

#include "backends/model_sources.hpp"
#include "mfattn/core/model.hpp"

namespace mfattn::meanfield {

inline std::vector<double> label_pair_weights(const Model& label_model) {
  const std::size_t labels = label_model.n;
  std::vector<double> weights(labels * labels);
  for (std::size_t c = 0; c < labels; ++c)
    for (std::size_t c2 = 0; c2 < labels; ++c2)
      weights[c * labels + c2] =
          kernels::weight_factor(host::model_pair_weight_terms(label_model, c, c2)) / double(labels);
  return weights;
}

}  // namespace mfattn::meanfield
