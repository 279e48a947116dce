#pragma once
/// \file capabilities.hpp
/// What a registered entry takes of a model (docs/architecture.md, "A capability of a
/// backend"). Every entry that evaluates a Model (a backend of kBackendNames, the mean-field
/// solver, the OAttention link) declares here which values of the model's kinds it takes; the
/// options' validation refuses a run against it before anything runs, and the entry refuses
/// a Model built in code against it, both with one line generated from the choice tables
/// (model_choices.hpp), so that no refusal lists accepted values by hand:
///   --kernel sinkhorn: --backend cuda takes --kernel usa, sa
#include <span>
#include <string>
#include <string_view>

#include "mfattn/core/model.hpp"
#include "mfattn/core/model_choices.hpp"

namespace mfattn {

/// The model's kinds as a run chooses them: of a Model (ModelKinds::of), or of validated
/// options before the Model exists.
struct ModelKinds {
  Normalization kernel = Normalization::Usa;
  Placement placement = Placement::Post;
  AuxFactor factor = AuxFactor::None;
  bool whole_layer = false;              ///< several heads, heads of r < d or A_h != I, a feed-forward term
  bool receivers_at_unit_speed = false;  ///< the mean-field quadrature's grid points (Model)
  bool receiver_scales = false;          ///< per-receiver scales (--usa-denominator factor-rows)
  static ModelKinds of(const Model& model);
};

/// For each kind, the values an entry takes (an empty span: every value).
struct Capabilities {
  std::span<const Normalization> kernels{};
  std::span<const Placement> placements{};
  std::span<const AuxFactor> factors{};
  bool whole_layers = true;
  bool receivers_at_unit_speed = true;
  bool receiver_scales = true;
};

/// The refusal of `kinds` by the entry `who` ("--backend cuda", "mfattn meanfield"): one line
/// naming the option, its value and what the entry takes ("" when it takes them all).
std::string capability_refusal(std::string_view who, const Capabilities& capabilities, const ModelKinds& kinds);

}  // namespace mfattn
