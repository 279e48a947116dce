#pragma once
// The small-system loop of the CPU backend (small_systems.cpp): few tokens that weigh, d <= 4,
// one head of contents, no gauge, full mask, no factor, no prefix tokens: the plain attention
// of the reference code's ensembles (thousands of replicas of n = 32 to 256), whole replicas
// per thread and lanes over receivers, no tiles.
#include <cstddef>
#include <string>

#include "backends/cpu/slot_operands.hpp"
#include "mfattn/backends/backend.hpp"
#include "mfattn/core/model.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::cpu {
inline namespace MFATTN_CPU_NAMESPACE {

/// Whether the small-system loop takes every evaluation of the model (and
/// MFATTN_CPU_SMALL_SYSTEMS is not "off").
bool small_systems_apply(const Model& model);

/// The small-system loop's evaluation of `replicas` replicas, called by every thread of a team
/// (whole replicas per thread). A NumericalError of a replica is recorded in `failure`.
void evaluate_small_systems(const Model& model, const SourceBiases& biases, double mass, std::size_t replicas,
                            const double* x, const FieldOutputs& out, std::string& failure);

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
