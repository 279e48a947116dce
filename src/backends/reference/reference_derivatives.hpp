#pragma once
// The derivatives of the layer's output a_i = p_i F_i(y) (docs/model.md section 2e), pair by
// pair: the oracle the fast derivatives are tested against, and (until the CPU backend has
// derivative lanes of its own) the CPU backend's derivatives too. O(n) memory: every weight is
// recomputed where it is needed, none is stored.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <vector>

#include "kernels/sinkhorn.hpp"
#include "mfattn/backends/backend.hpp"
#include "mfattn/backends/derivatives.hpp"
#include "mfattn/core/model.hpp"

namespace mfattn::detail {

/// LSE_k term(k) over k < count from the terms' exact maximum (-inf where every term is), in
/// k order: the reference's literal log-sum-exp (its Sinkhorn passes, and theirs recorded
/// for the derivatives).
template <class Term>
double exact_log_sum_exp(std::size_t count, Term&& term) {
  double largest = -HUGE_VAL;
  for (std::size_t k = 0; k < count; ++k) largest = std::max(largest, term(k));
  if (largest == -HUGE_VAL) return largest;
  double sum = 0.0;
  for (std::size_t k = 0; k < count; ++k) sum += std::exp(term(k) - largest);
  return kernels::log_sum_exp(largest, sum);
}

/// One head of one replica as the pair passes of SA and USA read it (docs/model.md section 2e):
/// its operands as plain rows (host::TokenOperands's arrays: the n moving tokens, then the P
/// prefix tokens; plain pointers, since every CPU target has its own TokenOperands type) and
/// what the forward pass keeps per receiver, O(n) numbers:
///   offset_i      every weight of receiver i is taken times 2^(-offset_i) (the passes' own
///                 units; never read elsewhere),
///   normaliser_i  N_i in those units: SA eps_den 2^(-offset_i) + S_i, USA M 2^(-offset_i);
///                 0 where u_i = 0 (a receiver that sees no source),
///   u_pre_i       A_i / N_i (operand_dim numbers).
struct HeadPairs {
  const Model& model;
  std::size_t sources = 0, operand_dim = 0;
  std::size_t score_dim = 0;             ///< r: queries and keys are 0 past it
  const double* queries = nullptr;       ///< sources x operand_dim (the first n: the receivers')
  const double* keys = nullptr;          ///< sources x operand_dim
  const double* values = nullptr;        ///< sources x operand_dim
  const double* presence = nullptr;      ///< sources: p_j
  const double* log_presence = nullptr;  ///< sources: log p_j
  std::vector<double> offset, normaliser, u_pre;
  /// What the passes keep between their calls on this head (theirs alone to read).
  std::shared_ptr<void> state;
};

/// What a VJP pass adds to, for the cotangent u_bar (n x od) of the normalized sums, with
/// l_bar_ij = P_ij (<u_bar_i, z_j> - delta_i) (delta_i = <u_bar_i, u_pre_i> for SA, 0 for USA)
/// the cotangent of the logit l_ij = beta s_ij + log m_ij c_ij + log p_j - shift:
///   query  += beta sum_j l_bar_ij k_j (n x od),   key += beta sum_i l_bar_ij q_i,
///   value  += sum_i P_ij u_bar_i (sources x od),  source_logit += sum_i l_bar_ij (sources),
///   beta   += sum_ij l_bar_ij (s_ij - [rescaled time]),   factor += the factor's numbers'.
struct PairCotangents {
  double* query = nullptr;
  double* key = nullptr;
  double* value = nullptr;
  double* source_logit = nullptr;
  double beta = 0.0;
  double* factor = nullptr;
};

/// The operands' and numbers' tangents a JVP pass reads (null factor: the factor's numbers
/// fixed); it writes, in the forward pass's units, numerator_dot_i = sum_j (w_dot_ij z_j +
/// w_ij z_dot_j) (n x od) and sum_dot_i = sum_j w_dot_ij (n).
struct PairTangents {
  const double* query = nullptr;         ///< n x od
  const double* key = nullptr;           ///< sources x od
  const double* value = nullptr;         ///< sources x od
  const double* log_presence = nullptr;  ///< sources: p_dot_j / p_j (0 for prefix tokens)
  double beta = 0.0;
  const double* factor = nullptr;
};

/// C += op(A) B for dense row-major matrices, op(A) = A or (transpose_a) A^T: op(A) m x k,
/// B k x p, C m x p, each row `ld` numbers after the one before. The heads' products with
/// their sources' contents (O(n d^2) numbers, beside the passes' O(n^2)).
struct DenseProduct {
  bool transpose_a = false;
  std::size_t m = 0, k = 0, p = 0;
  const double* a = nullptr;
  std::size_t lda = 0;
  const double* b = nullptr;
  std::size_t ldb = 0;
  double* c = nullptr;
  std::size_t ldc = 0;
};

/// The three O(n^2) passes of SA's and USA's derivatives over one head. The reference's are
/// HeadDerivative's own loops (pair by pair); a backend with faster ones (the CPU backend's
/// lanes, backends/cpu/derivative_lanes.hpp) hands them to ReferenceDerivativesBackend.
/// Sinkhorn attention always takes the reference's unrolled passes.
class PairPasses {
 public:
  virtual ~PairPasses() = default;
  /// offset, normaliser and u_pre of every receiver (and the passes' state).
  virtual void forward(HeadPairs& pairs) const = 0;
  /// Adds to `out` (PairCotangents) for u_bar (n x od; the rows of receivers with N_i = 0
  /// are 0).
  virtual void vjp(const HeadPairs& pairs, const double* u_bar, PairCotangents& out) const = 0;
  /// numerator_dot (n x od) and sum_dot (n) from the tangents (PairTangents).
  virtual void jvp(const HeadPairs& pairs, const PairTangents& in, double* numerator_dot,
                   double* sum_dot) const = 0;
  /// The threads the passes take: a layer's heads run side by side on them (each head's
  /// passes then on one), the same bits whatever the count.
  virtual int threads() const { return 1; }
  /// The head's operands at the states y (host::fill_head_operands' arrays, room made by the
  /// caller), by the backend's own build of host::HeadOperands: the library's shared build
  /// takes them a scalar at a time.
  virtual void fill_operands(const Model& model, const AttentionHead& head, const double* y,
                             double* queries, double* keys, double* values, double* presence,
                             double* log_presence) const = 0;
  /// The heads' dense products (DenseProduct), in the backend's own instructions: the library's
  /// shared code is built for the baseline ISA, where Eigen's products run two doubles to a
  /// register. On the calling thread; every sum of one element in a fixed order.
  virtual void add_product(const DenseProduct& product) const = 0;
};

struct ReplicaLayer;

/// What output_vjp and output_jvp at the states y read, O(n) numbers per head: each head's
/// forward pass (pair by pair, or SA's and USA's by `passes`) and each replica's layer field
/// F (n x d); and the derivatives' own arrays, kept with it. y must outlive it.
class DerivativeTape {
 public:
  DerivativeTape(const Model& model, std::size_t replicas, const double* y,
                 const PairPasses* passes);
  ~DerivativeTape();
  /// The forward pass at other states y (as many replicas), in the arrays of the last.
  void take(const Model& model, const double* y);
  /// a_i = p_i F_i (replicas x n x d): Backend::derivative_forward's output.
  void output(const Model& model, double* a) const;

  std::size_t replicas;
  const double* y;
  const PairPasses* passes;  ///< null: pair by pair
  std::vector<std::unique_ptr<ReplicaLayer>> layers;
};

/// Backend::output_vjp of the formulas at the tape's states.
void reference_output_vjp(const Model& model, const DerivativeTape& tape,
                          const double* output_cotangent, double* y_cotangent,
                          FieldNumbers& gradient);
/// Backend::output_jvp of the formulas at the tape's states.
void reference_output_jvp(const Model& model, const DerivativeTape& tape, const double* y_tangent,
                          const FieldNumbers* tangent, double* output_tangent);

/// A backend whose derivatives are these (the reference backend pair by pair; the CPU backend
/// with its lanes as the pair passes): Backend::derivative_forward, output_vjp and output_jvp
/// on the model it was made for. derivative_forward keeps its tape, keyed by the address of
/// the states it was taken at, for the next derivative call at those states, which uses it up
/// (a call without one takes its own forward pass). Up to kKeptTapes tapes are kept at once,
/// at as many addresses (a Runge-Kutta step's stages: Dynamics::stage_velocity); a forward
/// pass at an address already kept is taken again in that tape. A used tape's arrays serve
/// the next forward pass (O(n) numbers held between calls): at n = 1024, d = 64, H = 8
/// mapping their pages afresh was a tenth of a VJP.
class ReferenceDerivativesBackend : public Backend {
 public:
  static constexpr std::size_t kKeptTapes = 8;
  explicit ReferenceDerivativesBackend(const Model& model) : derivative_model_(model) {}
  void derivative_forward(std::size_t replicas, const double* y, double* output) override {
    std::unique_ptr<DerivativeTape> tape = kept_tape(replicas, y);
    if (tape) tape->take(derivative_model_, y);
    else tape = fresh_tape(replicas, y);
    tape->output(derivative_model_, output);
    kept_.push_back(std::move(tape));
    if (kept_.size() > kKeptTapes) {  // the oldest kept tape's arrays serve the next one
      spare_ = std::move(kept_.front());
      kept_.erase(kept_.begin());
    }
  }
  void output_vjp(std::size_t replicas, const double* y, const double* output_cotangent, double* y_cotangent,
                  FieldNumbers& gradient) override {
    std::unique_ptr<DerivativeTape> tape = tape_at(replicas, y);
    reference_output_vjp(derivative_model_, *tape, output_cotangent, y_cotangent, gradient);
    spare_ = std::move(tape);
  }
  void output_jvp(std::size_t replicas, const double* y, const double* y_tangent, const FieldNumbers* tangent,
                  double* output_tangent) override {
    std::unique_ptr<DerivativeTape> tape = tape_at(replicas, y);
    reference_output_jvp(derivative_model_, *tape, y_tangent, tangent, output_tangent);
    spare_ = std::move(tape);
  }
  void matrices_changed() override {
    kept_.clear();
    spare_.reset();
  }

 protected:
  /// Hands SA's and USA's pair passes to the derivatives (a backend with faster ones).
  void set_pair_passes(std::unique_ptr<PairPasses> passes) { passes_ = std::move(passes); }

 private:
  /// The kept tape taken at (replicas, y), taken out of the kept ones; null where there is none.
  std::unique_ptr<DerivativeTape> kept_tape(std::size_t replicas, const double* y) {
    for (auto at = kept_.begin(); at != kept_.end(); ++at)
      if ((*at)->replicas == replicas && (*at)->y == y) {
        std::unique_ptr<DerivativeTape> tape = std::move(*at);
        kept_.erase(at);
        return tape;
      }
    return nullptr;
  }
  /// The kept tape taken at (replicas, y), else a fresh one; either way none is kept there.
  std::unique_ptr<DerivativeTape> tape_at(std::size_t replicas, const double* y) {
    std::unique_ptr<DerivativeTape> tape = kept_tape(replicas, y);
    return tape ? std::move(tape) : fresh_tape(replicas, y);
  }
  /// A tape taken at (replicas, y): the spare one's arrays refilled where it has as many
  /// replicas (a forward pass that throws leaves no spare).
  std::unique_ptr<DerivativeTape> fresh_tape(std::size_t replicas, const double* y) {
    std::unique_ptr<DerivativeTape> tape = std::move(spare_);
    if (tape && tape->replicas == replicas) {
      tape->take(derivative_model_, y);
      return tape;
    }
    tape.reset();
    return std::make_unique<DerivativeTape>(derivative_model_, replicas, y, passes_.get());
  }

  const Model& derivative_model_;
  std::unique_ptr<PairPasses> passes_;
  std::vector<std::unique_ptr<DerivativeTape>> kept_;  ///< oldest first
  std::unique_ptr<DerivativeTape> spare_;
};

}  // namespace mfattn::detail
