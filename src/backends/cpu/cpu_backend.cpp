// The CPU backend: a single pass over the sources per receiver block, no n x n matrix.
// (When the weights are symmetric, Q = K = I with a full or window mask and a factor of
// |xi_i - xi_j| or none, symmetric_pairs.cpp takes the evaluation instead, one exp per
// unordered pair; this one-sided loop is its fallback.)
//
// Per evaluation every token is prepared once (O(n d) memory):
//   query  q_i = beta * G_i Q x_i,   key k_j = G_j K x_j,
//   value  z_j = G_j x_j (transported) | x_j (plain),   bias b_j = log p_j (-inf when p_j = 0)
// The sources are the frozen prefix tokens (padded to a whole tile; they carry the per-prompt
// mask when it is on) followed by the moving tokens. Each receiver gets an offset
// B_i >= max_j (<q_i, k_j> + b_j) from Cauchy-Schwarz,
//   B_i = |q_i| * max_{j: p_j > 0} |k_j| + max(0, max_j b_j),
// so every weight exp(l_ij - B_i), l_ij = <q_i, k_j> + b_j + log(m_ij c_ij), lies in [0, 1]
// and one pass gives
//   S_i = sum_j exp(l_ij - B_i),   A_i = sum_j exp(l_ij - B_i) z_j
// with no running maximum and no rescaling. For Q = K = I the bound is attained (l_ii = B_i).
// When it is loose by more than ~575 (S_i < 1e-250, general Q, K or masks), the receiver is
// recomputed with B_i = max_j l_ij taken exactly, so no weight that matters underflows.
// detail::finish_receiver turns (B_i, S_i, A_i) into the velocity.
//
// The loop families, each in files of its own: the small-system loop (small_systems.cpp),
// the symmetric loop (symmetric_pairs.cpp), the one-sided loop (one_sided_driver.cpp over
// one_sided_loop.hpp), Sinkhorn attention's scaling (sinkhorn_driver.hpp) and the layer
// assembly of several heads (head_combination.cpp), over the slots' operands
// (slot_operands.cpp). This file chooses among them per evaluation.
//
// The loops take each weight as 2^(t_ij), t_ij = (l_ij - B_i) log2(e), with log2(e) folded
// into the query, the offset and the bias once per receiver (simd::exp2_nonpositive: its
// argument reduction is exact and needs no multiply). Small d (up to 4) keeps lanes over
// sources and the sums A_i in registers, the exp being the bound; larger d runs two
// register-blocked micro-kernels per source tile, like a GEMM: the logits of 6 receivers x
// 32 sources (keys stored in 32-source panels), then A_i += W Z for 6 receivers x 32
// components, each operand load feeding several FMAs.
//
// Determinism: a receiver's sums are taken in one fixed order (sources in order, fixed
// lanes, fixed horizontal reductions), whatever the thread count or its neighbours in a
// block; padding and null sources add exact zeros and are left out of B_i, so appending
// null tokens changes no bit.
#include <omp.h>

#include <memory>
#include <string>

#include "backends/backend_common.hpp"
#include "backends/cpu/cpu_kernels.hpp"
#include "backends/cpu/derivative_lanes.hpp"
#include "backends/cpu/head_combination.hpp"
#include "backends/cpu/lane_pair_terms.hpp"
#include "backends/cpu/micro_kernels.hpp"
#include "backends/cpu/one_sided_driver.hpp"
#include "backends/cpu/sinkhorn_driver.hpp"
#include "backends/cpu/slot_operands.hpp"
#include "backends/cpu/small_systems.hpp"
#include "backends/cpu/symmetric_pairs.hpp"
#include "backends/cpu/vector_math.hpp"
#include "backends/reference/reference_derivatives.hpp"
#include "mfattn/core/evaluation_watch.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::cpu {
inline namespace MFATTN_CPU_NAMESPACE {
namespace {

// The CPU backend. Its derivatives (Backend::output_vjp, output_jvp) are the reference's
// formulas with SA's and USA's pair passes in lanes (derivative_lanes.hpp; Sinkhorn's stay
// pair by pair).
class CpuBackend final : public detail::ReferenceDerivativesBackend {
 public:
  CpuBackend(const Model& model, int threads)
      : ReferenceDerivativesBackend(model), model_(model),
        threads_(threads > 0 ? threads : omp_get_max_threads()), mass_(model.mass()),
        biases_(model), pair_terms_(model), small_systems_(small_systems_apply(model)),
        operands_(model, biases_, model.normalization == Normalization::Sinkhorn),
        symmetric_(!small_systems_ && model.normalization != Normalization::Sinkhorn &&
                           cpu::symmetric_pairs_apply(model)
                       ? std::make_unique<SymmetricPairs>(model, pair_terms_)
                       : nullptr),
        sinkhorn_(model.normalization == Normalization::Sinkhorn
                      ? std::make_unique<SinkhornDriver>(model, pair_terms_, operands_.prepared())
                      : nullptr),
        several_heads_(!model.one_head_of_contents()),
        one_sided_(model, pair_terms_, operands_, several_heads_ ? &head_sums_ : nullptr, mass_) {
    set_pair_passes(make_lane_pair_passes(pair_terms_, threads_));
  }

  std::string name() const override { return "cpu"; }
  ScalingReport last_scaling() const override {
    ScalingReport report;
    // A slot per (replica, head).
    if (sinkhorn_) sinkhorn_->report(model_.matrices_of(0).heads.size(), report);
    return report;
  }
  std::string describe() const override {
    return "loop " + last_loop_ + " cpu_kernels " + simd::kInstructionSet;
  }

  void evaluate(std::size_t replicas, const double* x, const FieldOutputs& out) override {
    bool fall_back = false;
    std::string failure;
    // Small evaluations run on one thread: waking a team costs more than it saves, and on a
    // busy machine a late thread stalls every step. The symmetric loop's rounds overlap (see
    // symmetric_pairs.hpp), so a team already pays off there at n = 256.
    // Sinkhorn attention takes up to 2 K + 3 passes over the pairs.
    const double passes = sinkhorn_ ? 2.0 * double(model_.sinkhorn.sweeps) + 3.0 : 1.0;
    const double pairs = passes * double(replicas) * double(model_.n) * double(model_.n);
    const int team =
        pairs < (symmetric_ ? kSymmetricPairsPerExtraThread : kPairsPerExtraThread) ? 1 : threads_;
    // The loops' worksharing constructs are orphaned: called outside a parallel region (one
    // thread) they run as a team of one, without the cost of opening a region (at n = 256 its
    // futex calls were a fifth of an evaluation).
    auto on_team = [team](auto&& body) {
      if (team == 1) return body();
#pragma omp parallel num_threads(team)
      body();
    };
    if (small_systems_) {
      on_team([&] { evaluate_small_systems(model_, biases_, mass_, replicas, x, out, failure); });
      last_loop_ = "small-systems";
      if (!failure.empty()) throw NumericalError(failure);
      return;
    }
    // Every (replica, head) pair is a slot s = r H + h with operands of its own.
    operands_.set_heads(replicas);
    if (several_heads_) head_sums_.resize(operands_.slots(), model_.n, operands_.operand_dim());
    // Long passes report progress and stop between their units (evaluation_watch.hpp): a stop
    // is looked at before the loops' fall-back and failures, which skipped units would fake.
    // Sinkhorn's scaling sweeps are not counted in units, so its passes are not watched.
    const EvaluationPass pass(
        sinkhorn_ ? 0.0 : double(operands_.slots()) * double(model_.n) * double(model_.n));
    on_team([&] {
      const EvaluationPass::Scope in_pass(&pass);
      operands_.prepare(x);
      if (sinkhorn_) sinkhorn_->scale(biases_);
      if (symmetric_)
        symmetric_->evaluate(operands_.prepared(), replicas, x, out, fall_back, failure);
      else
        one_sided_.run(x, out, failure);
      if (several_heads_)
        combine_heads(model_, operands_, head_sums_, sinkhorn_.get(), replicas, x, out);
    });
    pass.finish();
    last_loop_ = symmetric_ && !fall_back ? "symmetric" : sinkhorn_ ? "sinkhorn" : "one-sided";
    if (fall_back) {
      // The shared offset of the symmetric loop was too loose: every receiver again, each
      // with its own offset (and its exact maximum where that is loose too).
      failure.clear();
      on_team([&] {
        const EvaluationPass::Scope in_pass(&pass);
        one_sided_.run(x, out, failure);
      });
      pass.finish();
    }
    if (!failure.empty()) throw NumericalError(failure);
    if (sinkhorn_ && !several_heads_ && out.weight_sums)
      for (std::size_t r = 0; r < replicas; ++r)
        for (std::size_t i = 0; i < model_.n; ++i) out.weight_sums[r * model_.n + i] = sinkhorn_->weight_sum(r, i);
  }

 private:
  const Model& model_;
  int threads_;
  double mass_;
  SourceBiases biases_;
  LanePairTerms pair_terms_;
  bool small_systems_;  // the small-system loop takes every evaluation (small_systems_apply)
  SlotOperands operands_;
  std::unique_ptr<SymmetricPairs> symmetric_;  // null: the symmetric loop does not apply
  std::unique_ptr<SinkhornDriver> sinkhorn_;   // null: SA or USA
  HeadSums head_sums_;  // the slots' rows where the set is not one head of contents
  bool several_heads_;  // some set is not one head of contents: its heads are combined per receiver
  OneSidedDriver one_sided_;
  std::string last_loop_ = "none";
};

}  // namespace

std::unique_ptr<Backend> make_backend(const Model& model, int threads) {
  return std::make_unique<CpuBackend>(model, threads);
}

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
