#pragma once
/// \file layer_kinds.hpp
/// The kinds a whole layer's feed-forward term takes (docs/model.md section 2b), with no
/// dependency, so that the model (core), the option table (app) and the kernels' formula
/// (src/kernels/token_formulas.hpp, host and device) read one enum:
///   relu  sigma(z) = max(z, 0)
///   gelu  sigma(z) = z (1 + erf(z / sqrt 2)) / 2      (torch.nn.GELU(), its erf form)
///   tanh  sigma(z) = tanh z
/// where the layer's normalization sits (docs/model.md section 2c; F_i the layer's output,
/// N(y) = y / |y|, 0 for y = 0):
///   post  x on S^{d-1}   dx_i/dt = p_i P_{x_i} F_i(x)
///   pre   x in R^d       dx_i/dt = p_i F_i(N(x))
///   peri  x in R^d       dx_i/dt = p_i N(F_i(N(x)))
///   ngpt  x on S^{d-1}   dx_i/dt = alpha p_i P_{x_i} N(F_i(x))
///   none  x in R^d       dx_i/dt = p_i F_i(x)
/// and the layer's shape as the option table binds it (kNumberOptions, model_choices.hpp):
/// the run's RunConfig holds it and the Model copies it whole, so that a new integer of the
/// layer is its field here and its entry in that table.
#include <cstdint>

namespace mfattn {

enum class Activation { Relu, Gelu, Tanh };

enum class Placement { Post, Pre, Peri, Ngpt, None };

/// Whether the states of a placement stay on the sphere (post, ngpt) or live in R^d.
constexpr bool placement_on_sphere(Placement placement) {
  return placement == Placement::Post || placement == Placement::Ngpt;
}
/// Whether the layer reads the directions N(x_j) of the states (pre, peri).
constexpr bool placement_reads_directions(Placement placement) {
  return placement == Placement::Pre || placement == Placement::Peri;
}

/// The shape of a whole layer; the defaults are the options' defaults (one head of r = d, no
/// feed-forward term: the model of docs/model.md section 2).
struct LayerShape {
  std::int64_t heads = 1;      ///< H, attention heads summed
  std::int64_t head_dim = 0;   ///< r of every head; 0: r = d (the Model holds the resolved r)
  std::int64_t mlp_width = 0;  ///< W, the feed-forward term's hidden width (0: none)
};

}  // namespace mfattn
