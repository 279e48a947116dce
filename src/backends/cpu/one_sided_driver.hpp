#pragma once
// The one-sided loop's driver (one_sided_driver.cpp): panels of receivers of every slot walk
// every source (one_sided_loop.hpp's sweep, one translation unit per factor), and each
// receiver's shifted sums (B_i, S_i, A_i) become
//   - its velocity at once (detail::finish_receiver) where the set is one head of contents,
//   - else its normalized sums u_pre and D_i^(h) in the slot's rows of HeadSums, which
//     combine_heads (head_combination.hpp) maps back and adds.
// It also takes Sinkhorn attention's output pass (after the scaling has rewritten the biases
// and offsets) and the symmetric loop's fall-back.
#include <cstddef>
#include <string>

#include "backends/cpu/head_combination.hpp"
#include "backends/cpu/lane_pair_terms.hpp"
#include "backends/cpu/slot_operands.hpp"
#include "mfattn/backends/backend.hpp"
#include "mfattn/core/model.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::cpu {
inline namespace MFATTN_CPU_NAMESPACE {

class OneSidedDriver {
 public:
  /// head_sums: the slots' rows where the set is not one head of contents (null where it is);
  /// every argument must outlive this object.
  OneSidedDriver(const Model& model, const LanePairTerms& pair_terms, const SlotOperands& operands,
                 HeadSums* head_sums, double mass)
      : model_(model), pair_terms_(pair_terms), operands_(operands), head_sums_(head_sums), mass_(mass) {}

  /// Called by every thread of a team after operands.prepare(). A NumericalError of a
  /// receiver is recorded in `failure`.
  void run(const double* x, const FieldOutputs& out, std::string& failure);

 private:
  void run_panel(std::size_t slot, std::size_t replica, std::size_t first, std::size_t receivers_in_panel,
                 const double* x, double* velocity, double* attention_output, double* weight_sums);
  /// One receiver's shifted sums of a head turned into its normalized sums u_pre
  /// (operand_dim numbers; zeros where the receiver does not move, which every output map
  /// takes to 0); returns D_i of the head (another number where weight_sum_wanted is false and
  /// the finish needs no scale: SA without eps_den skips its exp, as the one head does).
  double finish_head_receiver(const host::HeadOperands& head, std::size_t token, double log_max,
                              double weight_sum_shifted, const double* acc, double* u_pre,
                              bool weight_sum_wanted) const;

  const Model& model_;
  const LanePairTerms& pair_terms_;
  const SlotOperands& operands_;
  HeadSums* head_sums_;
  double mass_;
};

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
