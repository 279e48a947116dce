#pragma once
// Sinkhorn attention on the CPU backend (docs/model.md section 2d): every slot's scaling by
// the passes of sinkhorn_passes.hpp over the prepared operands, then the scaled biases and
// offsets written back into them, so that the one-sided loop's output pass is SA's with them.
// Each slot's SA weight sum D_i (the energy's) comes from its first row pass:
//   D_i = exp(L_i(g = 0) - shift).
#include <cmath>
#include <cstddef>
#include <vector>

#include "backends/cpu/lane_pair_terms.hpp"
#include "backends/cpu/micro_kernels.hpp"
#include "backends/cpu/sinkhorn_passes.hpp"
#include "backends/cpu/slot_operands.hpp"
#include "backends/sinkhorn_scaling.hpp"
#include "mfattn/backends/backend.hpp"
#include "mfattn/backends/backend_errors.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::cpu {
inline namespace MFATTN_CPU_NAMESPACE {

class SinkhornDriver {
 public:
  /// prepared: the slots' operands (SlotOperands::prepared), which must outlive this object.
  SinkhornDriver(const Model& model, const LanePairTerms& pair_terms, std::vector<Prepared>& prepared)
      : model_(model), passes_(model, pair_terms, prepared),
        scaling_(kernels::SinkhornTerms{std::size_t(model.sinkhorn.sweeps), model.sinkhorn.tolerance}) {
    // Validation refuses these options first; a model built by hand meets this.
    if (!SinkhornPasses::takes(model))
      throw BackendUnavailable("cpu: Sinkhorn attention takes symmetric masks and nonnegative factors only "
                               "(no causal mask, no cosine or toeplitz factor)");
  }

  /// Called by every thread of the team after the slots are prepared.
  void scale(const SourceBiases& biases) {
    passes_.prepare(scaling_, biases.tokens, biases.prefix);
    scaling_.run(passes_);
    passes_.apply(scaling_);
  }
  /// SA's weight sum D_i of slot s's unscaled weights (the energy's), from its first row pass.
  double weight_sum(std::size_t slot, std::size_t i) const {
    return std::exp(scaling_.slots[slot].first_row_lse[i] - model_.exponent_shift());
  }
  /// The last evaluation's column errors and sweeps, per replica of slots_per_replica slots.
  void report(std::size_t slots_per_replica, ScalingReport& report) const {
    scaling_.report(slots_per_replica, report.column_error, report.sweeps);
  }

 private:
  const Model& model_;
  SinkhornPasses passes_;
  host::SinkhornScaling scaling_;
};

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
