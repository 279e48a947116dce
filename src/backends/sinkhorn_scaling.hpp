#pragma once
// The sweeps of Sinkhorn attention (docs/model.md section 2d), written once for every backend
// that takes it: the order of the passes, the targets, the stopping rule and the updates of
// the scalings, with the formulas of kernels/sinkhorn.hpp. A backend supplies the two passes
// over its pairs (the reference backend pair by pair, the CPU backend in lanes):
//   passes.rows(scaling)     for every active slot and receiver i:
//                            scaling.finish_row(slot, i, L_i),  L_i = LSE_j (l_ij + g_j)
//                            (g_j + log p_j is slot.row_bias[j])
//   passes.columns(scaling)  for every active slot and source j:
//                            scaling.finish_column(slot, j, C_j),  C_j = LSE_i (f_i + l_ij)
//                            (f_i is slot.row_scale[i])
// A slot is one attention matrix: a replica's, or one head's of a layer. run() is called by
// every thread of an OpenMP team, or by one thread outside any: the passes share their loops
// with `omp for` (their implicit barriers order the steps) and the updates between passes run
// in `omp single`, so every thread sees the same decisions.
//
// Sources are numbered as the backend stores them (the CPU backend puts the prefix tokens
// first); the slot's vectors follow that numbering, and the backend fills source_log_presence
// (log p_j, -inf for padding and null sources) and receiver_present before run().
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/sinkhorn.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::host {
inline namespace MFATTN_CPU_NAMESPACE {

/// The scaling of one attention matrix.
struct SinkhornSlot {
  // Filled by the backend (fixed for the run):
  std::vector<double> source_log_presence;  ///< log p_j of every source slot (-inf: none)
  std::vector<char> receiver_present;       ///< p_i > 0 of every receiver
  // The scaling (run() sizes them):
  std::vector<double> row_scale;       ///< f_i (-inf for null receivers and empty rows)
  std::vector<double> row_lse;         ///< L_i of the last row pass
  std::vector<double> first_row_lse;   ///< L_i at g = 0: log of SA's weight sum D_i (before the shift)
  std::vector<double> column_lse;      ///< C_j of the last column pass
  std::vector<double> column_scale;    ///< g_j (-inf for sources with no target)
  std::vector<double> row_bias;        ///< log p_j + g_j, what the rows read
  std::vector<double> log_target;      ///< log c_j
  std::size_t sweeps = 0;              ///< sweeps taken
  double column_error = 0.0;           ///< largest column error of the final plan
  bool active = false;                 ///< still sweeping
  bool first_rows = true;              ///< the row pass at g = 0 (its L_i are the weight sums)
};

class SinkhornScaling {
 public:
  explicit SinkhornScaling(const kernels::SinkhornTerms& terms) : terms_(terms) {}

  std::vector<SinkhornSlot> slots;

  /// Sizes every slot from its source_log_presence and receiver_present (filled by the
  /// backend) and starts it at g = 0; called once per evaluation before run().
  void reset() {
    for (SinkhornSlot& slot : slots) {
      const std::size_t receivers = slot.receiver_present.size(), sources = slot.source_log_presence.size();
      // Receivers that are not present (null tokens, a backend's padding) never weigh in a column.
      slot.row_scale.assign(receivers, 0.0);
      for (std::size_t i = 0; i < receivers; ++i)
        if (!slot.receiver_present[i]) slot.row_scale[i] = -__builtin_huge_val();
      slot.row_lse.assign(receivers, 0.0);
      slot.first_row_lse.assign(receivers, 0.0);
      slot.column_lse.assign(sources, 0.0);
      slot.column_scale.assign(sources, 0.0);
      slot.row_bias = slot.source_log_presence;  // g = 0
      slot.log_target.assign(sources, 0.0);
      slot.sweeps = 0;
      slot.column_error = 0.0;
      slot.active = true;
      slot.first_rows = true;
    }
  }

  /// The rows of every slot at g = 0, then sweeps until every slot stops (see the file comment).
  template <class Passes>
  void run(Passes& passes) {
    passes.rows(*this);
#pragma omp single
    for (SinkhornSlot& slot : slots) slot.first_rows = false;
    for (;;) {
      passes.columns(*this);
#pragma omp single
      {
        sweeping_ = false;
        for (SinkhornSlot& slot : slots)
          if (slot.active) sweeping_ = after_columns(slot) || sweeping_;
      }
      if (!sweeping_) break;
      passes.rows(*this);
    }
  }

  /// A row pass's result for receiver i of a slot.
  static void finish_row(SinkhornSlot& slot, std::size_t i, double row_lse) {
    slot.row_lse[i] = row_lse;
    if (slot.first_rows) slot.first_row_lse[i] = row_lse;
    slot.row_scale[i] = slot.receiver_present[i] ? kernels::row_scale(row_lse) : -__builtin_huge_val();
  }
  /// A column pass's result for source j of a slot: C_j without the source's log p_j, which
  /// is added here.
  static void finish_column(SinkhornSlot& slot, std::size_t j, double column_lse_without_presence) {
    slot.column_lse[j] = column_lse_without_presence + slot.source_log_presence[j];
  }

  const kernels::SinkhornTerms& terms() const { return terms_; }

  /// The largest column error and sweeps over the slots of each group of `slots_per_group`
  /// (a replica's heads) into column_error and sweeps (one number per group).
  void report(std::size_t slots_per_group, std::vector<double>& column_error, std::vector<double>& sweeps_taken) const {
    const std::size_t groups = slots_per_group ? slots.size() / slots_per_group : 0;
    column_error.assign(groups, 0.0);
    sweeps_taken.assign(groups, 0.0);
    for (std::size_t s = 0; s < groups * slots_per_group; ++s) {
      column_error[s / slots_per_group] = std::max(column_error[s / slots_per_group], slots[s].column_error);
      sweeps_taken[s / slots_per_group] = std::max(sweeps_taken[s / slots_per_group], double(slots[s].sweeps));
    }
  }

 private:
  /// The error of the current plan, then (if another sweep runs) the new g and its rows'
  /// biases. Returns whether the slot sweeps again.
  bool after_columns(SinkhornSlot& slot) {
    const std::size_t sources = slot.column_lse.size();
    if (slot.sweeps == 0) set_targets(slot);
    double error = 0.0;
    for (std::size_t j = 0; j < sources; ++j)
      error = std::max(error, kernels::column_error(slot.column_lse[j], slot.column_scale[j], slot.log_target[j]));
    slot.column_error = error;
    if (!kernels::sinkhorn_continues(terms_, slot.sweeps, error)) {
      slot.active = false;
      return false;
    }
    for (std::size_t j = 0; j < sources; ++j) {
      const double g = slot.column_scale[j] = kernels::column_scale(slot.log_target[j], slot.column_lse[j]);
      slot.row_bias[j] = g == -__builtin_huge_val() ? g : slot.source_log_presence[j] + g;
    }
    ++slot.sweeps;
    return true;
  }

  /// c_j = R p_j / M_J from the first column pass: R receivers with p_i > 0 and a source in
  /// view, M_J the presences of the sources some receiver sees.
  static void set_targets(SinkhornSlot& slot) {
    double receivers = 0.0, visible_mass = 0.0;
    for (std::size_t i = 0; i < slot.row_lse.size(); ++i)
      if (slot.receiver_present[i] && slot.first_row_lse[i] != -__builtin_huge_val()) receivers += 1.0;
    for (std::size_t j = 0; j < slot.column_lse.size(); ++j)
      if (slot.column_lse[j] != -__builtin_huge_val()) visible_mass += std::exp(slot.source_log_presence[j]);
    for (std::size_t j = 0; j < slot.column_lse.size(); ++j)
      slot.log_target[j] = kernels::log_column_target(slot.column_lse[j], std::exp(slot.source_log_presence[j]), receivers,
                                             visible_mass);
  }

  kernels::SinkhornTerms terms_;
  bool sweeping_ = false;
};

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::host
MFATTN_CPU_TARGET_END
