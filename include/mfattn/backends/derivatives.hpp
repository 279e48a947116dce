#pragma once
/// \file derivatives.hpp
/// The numbers of a Model that its field is differentiated with respect to (docs/model.md
/// section 2e), as gradients (a VJP's result) or as tangents (a JVP's direction), in the layout
/// of a --weights file:
///   head h:  query Q_h (r x d), key K_h (r x d), value A_h (rv x d), output O_h (d x rv), with
///            V_h = O_h A_h. A head whose values are the contents (the one head of --q, --k,
///            --v: AttentionHead::value_identity) is written value = V_h (d x d), output = I;
///            a head without an output map has output = I.
///   mlp:     w1 (W x d), b1 (W), w2 (d x W), b2 (d)
///   beta; prefix (the prefix tokens' contents y_p, P x d); presence (p_i of the n moving
///   tokens; a null token's p_i = 0 is a label: its entry is 0 in a gradient and ignored in a
///   tangent); factor (the auxiliary factor's numbers, factor_number_names).
/// Not differentiated (labels or choices; docs/model.md section 2e lists them): positions,
/// prompts, the gauge's frequencies or generators, the mask's window, the prefix weight,
/// eps_den, tau, ngpt's alpha, the time scale, Sinkhorn's stopping rule.
#include <cstddef>
#include <string>
#include <vector>

#include "mfattn/core/model.hpp"

namespace mfattn {

/// One head's matrices in the weights file's layout (above).
struct HeadNumbers {
  Matrix query, key, value, output;
};

/// One matrix set's numbers: its heads and its feed-forward term (empty matrices: none).
struct LayerNumbers {
  std::vector<HeadNumbers> heads;
  Matrix w1, w2;
  Vector b1, b2;
};

/// Every differentiated number of a Model: one LayerNumbers per matrix set of
/// Model::matrices (one for a Model without matrices, whose set is the identity head).
struct FieldNumbers {
  std::vector<LayerNumbers> sets;
  double beta = 0.0;
  std::vector<double> prefix;    ///< P x d
  std::vector<double> presence;  ///< n
  std::vector<double> factor;    ///< factor_number_names' numbers, in their order
};

/// A set's weights in the layout above (model.weights() of Python; the values a gradient is
/// taken at).
LayerNumbers layer_numbers(const AttentionMatrices& set);

/// Every number of the model's layout, zero (the start of a gradient's sums).
FieldNumbers zero_numbers(const Model& model);
/// Every number of the model's layout at its value (the point a gradient is taken at).
FieldNumbers model_numbers(const Model& model);

/// The names of the factor's numbers, where each starts in FieldNumbers::factor and how
/// many numbers it has: aux_lambda (distance), aux_sigma (gaussian), aux_omega (cosine),
/// toeplitz_coefficients and toeplitz_frequencies (K each), aux_power and aux_power_scale,
/// aux_gamma (cauchy); none for no factor.
struct FactorNumberName {
  std::string name;
  std::size_t first = 0, count = 1;
};
std::vector<FactorNumberName> factor_number_names(const PairTermParameters& parameters);

/// How many numbers FieldNumbers::factor holds: the kernel's derivatives of the factor
/// (kernels::pair_term_derivatives), which factor_number_names points into (the cosine is a
/// one-term Toeplitz series, a_1 = 1 then omega_1: its aux_omega is the second).
std::size_t factor_numbers_count(const PairTermParameters& parameters);

}  // namespace mfattn
