// combine_heads (head_combination.hpp): the heads' outputs added per receiver.
#include "backends/cpu/head_combination.hpp"

#include <omp.h>

#include <algorithm>

#include "backends/token_operands.hpp"
#include "kernels/receiver_finish.hpp"
#include "kernels/token_formulas.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::cpu {
inline namespace MFATTN_CPU_NAMESPACE {

void combine_heads(const Model& model, const SlotOperands& operands, HeadSums& sums,
                   const SinkhornDriver* sinkhorn, std::size_t replicas, const double* x, const FieldOutputs& out) {
  const std::size_t n = model.n, d = model.d;
  const std::size_t heads = operands.heads_per_replica(), slots = replicas * heads;
  const std::size_t width = operands.operand_dim();
  // Sinkhorn's D_i^(h) are SA's (the energy's), from the first row pass: only where asked.
  if (sinkhorn && out.weight_sums) {
#pragma omp for schedule(static)
    for (std::size_t row = 0; row < slots * n; ++row) sums.weight_sums[row] = sinkhorn->weight_sum(row / n, row % n);
  }
#pragma omp for schedule(static)
  for (std::size_t unit = 0; unit < replicas * n; ++unit) {
    const std::size_t r = unit / n, i = unit % n;
    const FeedForward& mlp = model.matrices_of(r).mlp;
    thread_local std::vector<double> u, u_pre, u_head, hidden;
    u.assign(d, 0.0);
    u_pre.resize(std::max(width, d));
    u_head.resize(d);
    hidden.resize(mlp.width());
    double weight_sum = 0.0;
    for (std::size_t h = 0; h < heads; ++h) {
      const std::size_t slot = r * heads + h, row = slot * n + i;
      std::copy_n(sums.outputs.data() + row * width, width, u_pre.data());
      operands.head(slot).output(i, u_pre.data(), u_head.data());
      for (std::size_t c = 0; c < d; ++c) u[c] += u_head[c];
      weight_sum += sums.weight_sums[row];
    }
    const double* xi = x + unit * d;
    host::add_feed_forward(mlp, xi, hidden.data(), u.data());
    kernels::tangent_velocity(model.receiver_speed(i), int(d), xi, static_cast<const double*>(u.data()),
                              out.velocity + unit * d, out.attention_output ? out.attention_output + unit * d : nullptr);
    if (out.weight_sums) out.weight_sums[unit] = weight_sum;
  }
}

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
