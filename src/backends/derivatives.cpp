// The layout of the differentiated numbers (include/mfattn/backends/derivatives.hpp).
#include "mfattn/backends/derivatives.hpp"

#include "kernels/pair_terms.hpp"

namespace mfattn {

LayerNumbers layer_numbers(const AttentionMatrices& set) {
  LayerNumbers numbers;
  for (const AttentionHead& head : set.heads) {
    HeadNumbers& out = numbers.heads.emplace_back();
    out.query = head.query;
    out.key = head.key;
    const auto d = head.full_value.rows();
    if (head.value_identity) {
      // The values are the contents and V_h is applied once per receiver: value = V_h, output = I.
      out.value = head.full_value;
      out.output = Matrix::Identity(d, d);
    } else {
      out.value = head.value;
      out.output = head.output.size() ? head.output : Matrix(Matrix::Identity(d, head.value.rows()));
    }
  }
  numbers.w1 = set.mlp.w1;
  numbers.b1 = set.mlp.b1;
  numbers.w2 = set.mlp.w2;
  numbers.b2 = set.mlp.b2;
  return numbers;
}

FieldNumbers zero_numbers(const Model& model) {
  FieldNumbers numbers;
  const std::size_t sets = model.matrix_set_count();
  for (std::size_t s = 0; s < sets; ++s) {
    LayerNumbers layout = layer_numbers(model.matrices_of(s));
    for (HeadNumbers& head : layout.heads)
      for (Matrix* m : {&head.query, &head.key, &head.value, &head.output}) m->setZero();
    layout.w1.setZero();
    layout.b1.setZero();
    layout.w2.setZero();
    layout.b2.setZero();
    numbers.sets.push_back(std::move(layout));
  }
  numbers.prefix.assign(model.prefix.size(), 0.0);
  numbers.presence.assign(model.n, 0.0);
  numbers.factor.assign(factor_numbers_count(model.pair_terms), 0.0);
  return numbers;
}

FieldNumbers model_numbers(const Model& model) {
  FieldNumbers numbers;
  const std::size_t sets = model.matrix_set_count();
  for (std::size_t s = 0; s < sets; ++s) numbers.sets.push_back(layer_numbers(model.matrices_of(s)));
  numbers.beta = model.beta;
  numbers.prefix = model.prefix;
  numbers.presence = model.presence;
  // The factor's numbers in the order of its derivatives (pair_terms.hpp's numbers()).
  numbers.factor.assign(factor_numbers_count(model.pair_terms), 0.0);
  kernels::visit_factor(model.pair_terms, [&](const auto& factor) { factor.numbers(numbers.factor.data()); });
  return numbers;
}

std::size_t factor_numbers_count(const PairTermParameters& parameters) {
  return kernels::visit_factor(parameters, [](const auto& factor) { return factor.number_count(); });
}

std::vector<FactorNumberName> factor_number_names(const PairTermParameters& parameters) {
  kernels::FactorNumberGroup groups[2 * kernels::kMaxFactorNumbers];
  const std::size_t count = kernels::visit_factor(
      parameters, [&](const auto& factor) { return factor.number_groups(parameters.factor, groups); });
  std::vector<FactorNumberName> names;
  for (std::size_t g = 0; g < count; ++g) names.push_back({groups[g].name, groups[g].first, groups[g].count});
  return names;
}

}  // namespace mfattn
