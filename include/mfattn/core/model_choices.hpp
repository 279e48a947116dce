#pragma once
/// \file model_choices.hpp
/// The tables of the model's own kinds and numbers (choice_table.hpp): --kernel,
/// --normalization and --aux-factor, and every number of a feature of the model
/// (kNumberOptions). They sit beside the Model (not with the other options' tables in
/// app/run_choices.hpp) because the capabilities of every registered entry (capabilities.hpp:
/// backends, the mean-field solver, the OAttention link) name these values in their
/// refusals, and some of those entries lie below the app layer; the numbers sit with them so
/// that a feature's struct, its kinds and its numbers are read from one place: a factor with
/// a parameter is its formula (src/kernels/pair_terms.hpp), its kind and parameter field
/// (pair_kinds.hpp) and its two entries here.
#include <cstdint>
#include <variant>

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
    {"power", {AuxFactor::Power}, "(1 + s |dxi|)^(-r), KERPLE's logarithmic kernel"},
    {"cauchy", {AuxFactor::Cauchy}, "1 / (1 + |dxi|^2 / gamma^2), heavy-tailed"},
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

/// What a number option accepts besides being finite: >= 0, > 0, or an integer in
/// [least, most] (most 0: up to d, for --head-dim).
enum class NumberRule { Finite, AtLeastZero, Positive, IntegerRange };

/// A number of a feature that an option sets: the option, its field in the struct of its
/// feature (the run's RunConfig and the Model hold each whole: PairTermParameters, LayerShape,
/// SinkhornParameters; RunConfig::feature<F> finds it), what it accepts and its help line.
/// run_options binds each, validate() checks each, /parameters records each and the model
/// builder copies each feature's struct whole: a new number of a feature is its field and one
/// entry here (two files), a number of a new feature also its struct's alternative below.
struct NumberOption {
  using Field = std::variant<double PairTermParameters::*, std::int64_t LayerShape::*, std::int64_t SinkhornParameters::*,
                             double SinkhornParameters::*>;
  const char* option;
  Field field;
  NumberRule rule;
  const char* help;
  std::int64_t least = 0, most = 0;  ///< IntegerRange's bounds
};
inline constexpr NumberOption kNumberOptions[] = {
    {"aux-lambda", &PairTermParameters::lambda, NumberRule::AtLeastZero, "distance factor lambda >= 0"},
    {"aux-sigma", &PairTermParameters::sigma, NumberRule::Positive, "gaussian factor sigma > 0"},
    {"aux-omega", &PairTermParameters::omega, NumberRule::Finite, "cosine factor omega, any finite number"},
    {"aux-power", &PairTermParameters::power, NumberRule::AtLeastZero, "power factor r >= 0: (1 + s |dxi|)^(-r)"},
    {"aux-power-scale", &PairTermParameters::power_scale, NumberRule::Positive,
     "power factor distance scale s > 0: (1 + s |dxi|)^(-r)"},
    {"aux-gamma", &PairTermParameters::gamma, NumberRule::Positive, "cauchy factor gamma > 0: 1 / (1 + |dxi|^2 / gamma^2)"},
    {"window", &PairTermParameters::window, NumberRule::Positive, "window half-width for --mask window, > 0"},
    {"heads", &LayerShape::heads, NumberRule::IntegerRange, "attention heads H, 1 to 64, summed: sum_h u_i^(h)", 1,
     64},
    {"head-dim", &LayerShape::head_dim, NumberRule::IntegerRange,
     "r of every head (Q_h, K_h are r x d; scores gauged in dimension r), 1 to d (0: d)", 0, 0},
    {"mlp", &LayerShape::mlp_width, NumberRule::IntegerRange,
     "hidden width W of the feed-forward term f(x) = W2 sigma(W1 x + b1) + b2, 0 to 65536 (0: none)", 0, 65536},
    {"sinkhorn-iterations", &SinkhornParameters::sweeps, NumberRule::IntegerRange,
     "--kernel sinkhorn: at most this many sweeps (columns, then rows), 0 to 100000 (0: SA)", 0, 100000},
    {"sinkhorn-tol", &SinkhornParameters::tolerance, NumberRule::AtLeastZero,
     "--kernel sinkhorn: stop once every column sum is within this of its share, >= 0 (0: never early)"},
};

}  // namespace mfattn
