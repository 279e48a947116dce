#pragma once
// The layer assembly of the CPU backend (docs/model.md section 2b), for every set of heads that
// is not one head of contents: the loops leave each (replica, head) slot's normalized sums
// u_pre in its rows (operand_dim numbers a receiver: O(H n r) memory, not H n d), and per
// receiver
//   u_i^(h) = O_h u_pre,   v_i = p_i P_{x_i}(sum_h u_i^(h) + f(x_i)),   D_i = sum_h D_i^(h)
// the heads added in order, so that the bits do not depend on the threads.
#include <cstddef>
#include <vector>

#include "backends/cpu/sinkhorn_driver.hpp"
#include "backends/cpu/slot_operands.hpp"
#include "mfattn/backends/backend.hpp"
#include "mfattn/core/model.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::cpu {
inline namespace MFATTN_CPU_NAMESPACE {

/// Every slot's normalized sums u_pre (n rows of operand_dim a slot) and weight sums D_i^(h)
/// (n a slot), row slot * n + i.
struct HeadSums {
  std::vector<double> outputs, weight_sums;
  void resize(std::size_t slots, std::size_t n, std::size_t operand_dim) {
    outputs.resize(slots * n * operand_dim);
    weight_sums.resize(slots * n);
  }
};

/// Called by every thread of a team after the pair loop has filled `sums` (sinkhorn: the
/// scaling whose first row passes give each slot's D_i^(h), null for SA and USA): writes
/// every receiver's velocity and, where out asks, its attention output and D_i.
void combine_heads(const Model& model, const SlotOperands& operands, HeadSums& sums,
                   const SinkhornDriver* sinkhorn, std::size_t replicas, const double* x, const FieldOutputs& out);

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
