#pragma once
// The operands every pair loop of the CPU backend reads but the small-system loop, prepared
// once per evaluation for every slot (a slot is one head of one replica, s = r H + h):
//   query  q_i = beta * (head's query of x_i),   key  k_j,   value  z_j   (host::HeadOperands)
//   bias   b_j = log p_j (-inf when p_j = 0),    offset  B_i = |q_i| max_j |k_j| + max(0, max_j b_j)
// laid out for the lanes (Prepared, micro_kernels.hpp): the frozen prefix tokens first (padded
// to a whole tile), then the moving tokens. The offset is the Cauchy-Schwarz bound of every
// logit of receiver i (see cpu_backend.cpp); null sources stay out of it, so that appending
// null tokens changes no bit.
#include <cstddef>
#include <vector>

#include "backends/cpu/micro_kernels.hpp"
#include "backends/token_operands.hpp"
#include "mfattn/core/model.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::cpu {
inline namespace MFATTN_CPU_NAMESPACE {

/// b_j = log p_j of every source, fixed for the whole run: taken once, not per evaluation.
struct SourceBiases {
  explicit SourceBiases(const Model& model);
  std::vector<double> tokens;  ///< log p_j of the moving tokens (-inf for p_j = 0)
  double prefix = 0.0;         ///< log of the prefix weight
  bool all_present = false;    ///< every p_j = 1
};

class SlotOperands {
 public:
  /// biases_rewritten: Sinkhorn attention rewrites every bias per evaluation (log p_j + g_j),
  /// so no run of sources may skip its bias.
  SlotOperands(const Model& model, const SourceBiases& biases, bool biases_rewritten);

  /// The heads of `replicas` replicas, slot r H + h holding head h of replica r's matrices.
  void set_heads(std::size_t replicas);
  /// Called by every thread of a team: queries, keys and values of every slot's tokens
  /// (spread over the threads), then the offsets B_i. The largest key and bias are maxima,
  /// the same whichever thread sees which token.
  void prepare(const double* x);

  std::size_t slots() const { return heads_.size(); }
  std::size_t heads_per_replica() const { return heads_per_replica_; }
  /// Numbers per query, key and value: d for a head of contents, the head's r otherwise.
  std::size_t operand_dim() const { return heads_.front().operand_dim; }
  const host::HeadOperands& head(std::size_t slot) const { return heads_[slot]; }
  const Prepared& prepared(std::size_t slot) const { return prepared_[slot]; }
  /// Every slot's operands: the symmetric loop and Sinkhorn's passes read (and Sinkhorn's
  /// rewrites the biases and offsets of) them in place.
  std::vector<Prepared>& prepared() { return prepared_; }

 private:
  /// Sizes and the parts fixed for the run (padding, bias), once per slot: later evaluations
  /// overwrite the token entries only, so no array is cleared or reallocated.
  void prepare_layout(Prepared& p, std::size_t d) const;
  /// Source s of p holds gauge token `token` with contents y: its key, value, and its share
  /// of the largest squared key norm and bias; products holds the head's products of y
  /// (HeadOperands::products).
  void add_source(Prepared& p, std::size_t s, std::size_t token, const double* y, double& largest_key_norm2,
                  double& largest_bias, const host::HeadOperands& head, const double* products) const;

  const Model& model_;
  const SourceBiases& biases_;
  bool biases_rewritten_;
  std::size_t heads_per_replica_ = 1;
  std::vector<host::HeadOperands> heads_;
  std::vector<Prepared> prepared_;
  // Per slot, while preparing (largest_key_ holds the squared norm until its one root).
  std::vector<double> largest_key_, largest_bias_;
};

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
