#pragma once
/// \file model_choices.hpp
/// The choice tables of the model's own kinds (choice_table.hpp): --kernel, --normalization
/// and --aux-factor. They sit beside the Model (not with the other options' tables in
/// app/run_choices.hpp) because the capabilities of every registered entry (capabilities.hpp:
/// backends, the mean-field solver, the OAttention link) name these values in their
/// refusals, and some of those entries lie below the app layer.
#include "mfattn/core/choice_table.hpp"
#include "mfattn/core/layer_kinds.hpp"
#include "mfattn/core/model.hpp"
#include "mfattn/core/pair_kinds.hpp"

namespace mfattn {

inline constexpr Choice<Normalization> kKernelChoices[] = {
    {"usa", Normalization::Usa, "unnormalised"},
    {"sa", Normalization::Sa, "softmax"},
    {"sinkhorn", Normalization::Sinkhorn, "softmax scaled to a doubly stochastic matrix"},
};
inline constexpr ChoiceOption<Normalization> kKernelOption{.option = "kernel", .choices = kKernelChoices};

/// An auxiliary factor and what validation must know of it: a factor that changes sign can
/// make the SA denominator vanish (so SA refuses it), and one defined on a line needs 1-D
/// positions. The rules read these fields, so a new factor is one entry below.
struct AuxFactorChoice {
  AuxFactor factor;
  bool changes_sign = false;
  bool needs_one_dimensional_positions = false;
  bool operator==(const AuxFactorChoice&) const = default;
};
inline constexpr Choice<AuxFactorChoice> kAuxFactorChoices[] = {
    {"none", {AuxFactor::None}},
    {"distance", {AuxFactor::Distance}, "exp(-lambda |dxi|)"},
    {"gaussian", {AuxFactor::Gaussian}, "exp(-|dxi|^2/(2 sigma^2))"},
    {"cosine", {AuxFactor::Cosine, true, true}, "cos(omega dxi), k = 1, USA only"},
    {"toeplitz", {AuxFactor::Toeplitz, true, true}, "sum_k a_k cos(omega_k dxi), k = 1, USA only"},
    {"power", {AuxFactor::Power}, "(1 + |dxi|)^(-r), KERPLE's power kernel"},
};
inline constexpr ChoiceOption<AuxFactorChoice> kAuxFactorOption{.option = "aux-factor",
                                                                .choices = kAuxFactorChoices};

inline constexpr Choice<Placement> kPlacementChoices[] = {
    {"post", Placement::Post, "x on the sphere, p P_x F(x)"},
    {"pre", Placement::Pre, "x in R^d, p F(N(x))"},
    {"peri", Placement::Peri, "x in R^d, p N(F(N(x)))"},
    {"ngpt", Placement::Ngpt, "x on the sphere, alpha p P_x N(F(x))"},
    {"none", Placement::None, "x in R^d, p F(x)"},
};
inline constexpr ChoiceOption<Placement> kPlacementOption{.option = "normalization",
                                                          .choices = kPlacementChoices};

}  // namespace mfattn
