#include "mfattn/core/capabilities.hpp"

#include <algorithm>

namespace mfattn {
namespace {

template <class Value>
bool takes(std::span<const Value> accepted, const Value& value) {
  return accepted.empty() || std::find(accepted.begin(), accepted.end(), value) != accepted.end();
}

/// "--kernel usa, sa": the option and the names of the accepted values, in the table's order.
template <class Value, class Key, class KeyOf>
std::string accepted_names(const ChoiceOption<Value>& option, std::span<const Key> accepted, KeyOf&& key_of) {
  return "--" + std::string(option.option) + " " +
         option.names(", ", [&](const Value& value) { return takes(accepted, key_of(value)); });
}

template <class Value, class Key, class KeyOf>
std::string refused_value(std::string_view who, const ChoiceOption<Value>& option, std::span<const Key> accepted,
                          const Key& chosen, KeyOf&& key_of) {
  std::string name;
  for (const Choice<Value>& choice : option.choices)
    if (key_of(choice.value) == chosen) {
      name = choice.name;
      break;
    }
  return "--" + std::string(option.option) + " " + name + ": " + std::string(who) + " takes " +
         accepted_names(option, accepted, key_of);
}

}  // namespace

ModelKinds ModelKinds::of(const Model& model) {
  ModelKinds kinds;
  kinds.kernel = model.normalization;
  kinds.placement = model.placement;
  kinds.factor = model.pair_terms.factor;
  kinds.whole_layer = !model.one_head_of_contents();
  kinds.receivers_at_unit_speed = model.receivers_at_unit_speed;
  kinds.receiver_scales = !model.receiver_scale.empty();
  return kinds;
}

std::string capability_refusal(std::string_view who, const Capabilities& capabilities, const ModelKinds& kinds) {
  const auto same = [](const auto& value) { return value; };
  if (!takes(capabilities.kernels, kinds.kernel))
    return refused_value(who, kKernelOption, capabilities.kernels, kinds.kernel, same);
  if (!takes(capabilities.placements, kinds.placement))
    return refused_value(who, kPlacementOption, capabilities.placements, kinds.placement, same);
  if (!takes(capabilities.factors, kinds.factor))
    return refused_value(who, kAuxFactorOption, capabilities.factors, kinds.factor,
                         [](const AuxFactorChoice& choice) { return choice.factor; });
  if (kinds.whole_layer && !capabilities.whole_layers)
    return "--heads, --head-dim, --mlp, --weights: " + std::string(who) +
           " takes no whole layer (several heads, heads of r < d, a feed-forward term), only the one head of "
           "--q, --k, --v";
  if (kinds.receivers_at_unit_speed && !capabilities.receivers_at_unit_speed)
    return std::string(who) + " takes no receivers at unit speed (the mean-field quadrature's grid points)";
  if (kinds.receiver_scales && !capabilities.receiver_scales)
    return "--usa-denominator factor-rows: " + std::string(who) +
           " takes --usa-denominator count only";
  return "";
}

}  // namespace mfattn
