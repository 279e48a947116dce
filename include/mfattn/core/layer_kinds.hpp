#pragma once
/// \file layer_kinds.hpp
/// The kinds a whole layer's feed-forward term takes (docs/model.md section 2b), with no
/// dependency, so that the model (core), the option table (app) and the kernels' formula
/// (src/kernels/token_formulas.hpp, host and device) read one enum:
///   relu  sigma(z) = max(z, 0)
///   gelu  sigma(z) = z (1 + erf(z / sqrt 2)) / 2      (torch.nn.GELU(), its erf form)
///   tanh  sigma(z) = tanh z
/// and the layer's shape as the option table binds it (kLayerShapeNumbers, run_choices.hpp):
/// the run's RunConfig holds it and the Model copies it whole, so that a new integer of the
/// layer is its field here and its entry in that table.
#include <cstdint>

namespace mfattn {

enum class Activation { Relu, Gelu, Tanh };

/// The shape of a whole layer; the defaults are the options' defaults (one head of r = d, no
/// feed-forward term: the model of docs/model.md section 2).
struct LayerShape {
  std::int64_t heads = 1;      ///< H, attention heads summed
  std::int64_t head_dim = 0;   ///< r of every head; 0: r = d (the Model holds the resolved r)
  std::int64_t mlp_width = 0;  ///< W, the feed-forward term's hidden width (0: none)
};

}  // namespace mfattn
