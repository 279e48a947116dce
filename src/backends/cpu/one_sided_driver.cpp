// OneSidedDriver (one_sided_driver.hpp): panels of receivers over every source.
#include "backends/cpu/one_sided_driver.hpp"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "backends/backend_common.hpp"
#include "backends/cpu/micro_kernels.hpp"
#include "backends/cpu/one_sided_loop.hpp"
#include "kernels/receiver_finish.hpp"
#include "mfattn/core/evaluation_watch.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::cpu {
inline namespace MFATTN_CPU_NAMESPACE {
namespace {

using one_sided::BlockSums;
using one_sided::kLargeSourceTile;
using one_sided::kPanelBlocks;
using one_sided::kSmallSourceTile;

std::size_t block_size(std::size_t d) { return d <= kSmallDimension ? kSmallBlock : kLargeBlock; }

}  // namespace

void OneSidedDriver::run(const double* x, const FieldOutputs& out, std::string& failure) {
  const std::size_t n = model_.n, slots = operands_.slots(), heads_per_replica = operands_.heads_per_replica();
  const std::size_t panel = kPanelBlocks * block_size(operands_.operand_dim());
  const std::size_t panels_per_replica = (n + panel - 1) / panel;
  const std::size_t total_panels = slots * panels_per_replica;
  // The evaluation's pass (its team runs under EvaluationPass::Scope, cpu_backend.cpp).
  const EvaluationPass* pass = EvaluationPass::current();
#pragma omp for schedule(dynamic, 1)
  for (std::size_t unit = 0; unit < total_panels; ++unit) {
    // A stop skips the panels left; the pass throws before anything reads the outputs.
    if (EvaluationPass::stopping(pass)) continue;
    const std::size_t slot = unit / panels_per_replica, r = slot / heads_per_replica;
    const std::size_t first = (unit % panels_per_replica) * panel;
    try {
      const std::size_t replica_start = r * n * model_.d;
      const std::size_t receivers = std::min(panel, n - first);
      run_panel(slot, r, first, receivers, x + replica_start, out.velocity + replica_start,
                out.attention_output ? out.attention_output + replica_start : nullptr,
                out.weight_sums ? out.weight_sums + r * n : nullptr);
      EvaluationPass::done(pass, double(receivers) * double(n));
    } catch (const NumericalError& error) {
#pragma omp critical(mfattn_cpu_failure)
      failure = error.what();
    }
  }
}

double OneSidedDriver::finish_head_receiver(const host::HeadOperands& head, std::size_t token, double log_max,
                                            double weight_sum_shifted, const double* acc, double* u_pre,
                                            bool weight_sum_wanted) const {
  kernels::FinishOutcome outcome;
  const kernels::FinishTerms terms = detail::finish_terms(model_, mass_);
  const bool needs_scale = log_max > kNegInf && kernels::finish_needs_scale(terms, weight_sum_wanted);
  const double scale = needs_scale ? detail::receiver_scale(model_, log_max) : 1.0;
  if (!kernels::normalized_receiver_sums(terms, model_.receiver_speed(token), int(head.operand_dim), log_max, scale,
                                         weight_sum_shifted, acc, u_pre, outcome)) {
    if (outcome.overflow) throw NumericalError(detail::usa_overflow_message(model_, outcome.log_scale));
    std::fill(u_pre, u_pre + head.operand_dim, 0.0);
  }
  return outcome.weight_sum;
}

void OneSidedDriver::run_panel(std::size_t slot, std::size_t replica, std::size_t first,
                               std::size_t receivers_in_panel, const double* x, double* velocity,
                               double* attention_output, double* weight_sums) {
  const Prepared& p = operands_.prepared(slot);
  const host::HeadOperands& head = operands_.head(slot);
  const std::size_t size = block_size(p.d);
  const std::size_t blocks = (receivers_in_panel + size - 1) / size;
  const std::size_t acc_stride = std::max(p.padded_dim, kSmallDimension);
  thread_local std::vector<BlockSums> panel;
  thread_local std::vector<double> acc_rows;
  panel.resize(kPanelBlocks);
  acc_rows.resize(kPanelBlocks * size * acc_stride);
  for (std::size_t b = 0; b < blocks; ++b) {
    BlockSums& block = panel[b];
    const std::size_t start = first + b * size;
    block.size = size;
    block.count = std::min(size, first + receivers_in_panel - start);
    for (std::size_t r = 0; r < size; ++r) {
      block.receivers[r] = start + std::min(r, block.count - 1);
      block.offset[r] = p.offsets[block.receivers[r]];
    }
    block.acc = acc_rows.data() + b * size * acc_stride;
    block.acc_stride = acc_stride;
    block.reset();
  }
  const std::size_t tile = p.d <= kSmallDimension ? kSmallSourceTile : kLargeSourceTile;
  // One translation unit per auxiliary factor holds the loop (one_sided_loop.hpp).
  pair_terms_.visit_factor([&](const auto& factor) {
    one_sided::sweep_panel_with(pair_terms_, factor, p, panel.data(), blocks, tile);
  });
  if (head_sums_) {
    // u_pre into the slot's rows (combine_heads maps them back and adds them).
    for (std::size_t b = 0; b < blocks; ++b)
      for (std::size_t r = 0; r < panel[b].count; ++r) {
        const BlockSums& block = panel[b];
        const std::size_t i = block.receivers[r], row = slot * model_.n + i;
        head_sums_->weight_sums[row] =
            finish_head_receiver(head, i, block.offset[r], block.weight_sum[r], block.acc + r * block.acc_stride,
                                 head_sums_->outputs.data() + row * head.operand_dim, weight_sums != nullptr);
      }
    return;
  }
  Scratch scratch;
  double* work = scratch.rows(model_.d);
  const AttentionMatrices& matrices = model_.matrices_of(replica);
  for (std::size_t b = 0; b < blocks; ++b) {
    const BlockSums& block = panel[b];
    for (std::size_t r = 0; r < block.count; ++r) {
      const std::size_t i = block.receivers[r];
      const double sum = detail::finish_receiver(
          model_, matrices, mass_, i, x + i * model_.d, block.offset[r], block.weight_sum[r],
          block.acc + r * block.acc_stride,
          {velocity + i * model_.d, attention_output ? attention_output + i * model_.d : nullptr,
           weight_sums != nullptr},
          work);
      if (weight_sums) weight_sums[i] = sum;
    }
  }
}

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
