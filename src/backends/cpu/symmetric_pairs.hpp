#pragma once
// The CPU backend's symmetric pair loop: when the logit of a pair is the same number both
// ways, s_ij = s_ji, one exponential serves the receiver i and the receiver j, halving the
// exps (the bound at d <= 4) and taking 3 instead of 4 n^2 d flops at large d.
//
// It applies (symmetric_pairs_apply) when Q = K = I (any V, SA or USA, any gauge, presence
// and null tokens), there is no prefix token, the mask is full or a sliding window and the
// auxiliary factor is none, the distance bias or the Gaussian:
//   s_ij = beta <G_i x_i, G_j x_j> = s_ji   (G: the positional gauge, or I),
//   m_ij = m_ji and c_ij = c_ji (both functions of |xi_i - xi_j|).
// The mask and the factor enter as one log-term per pair, log m_ab + log c_ab, taken once per
// block for both roles; a block whose tiles' positions are all farther apart than the window
// is skipped (its weights are exact zeros, so skipping changes no bit). The causal mask and
// the cosine factor (sign-changing) are not symmetric in this sense: they run one-sided.
// Every receiver then shares one offset B = max over present receivers of the one-sided
// loop's B_i = |q_i| max_{p_j > 0} |k_j| + max(0, max_j log p_j) (Cauchy-Schwarz, attained to
// rounding by the self pair), and with e_ij = exp(s_ij - B)
//   S_i = sum_j p_j e_ij,   A_i = sum_j e_ij (p_j z_j)
// are the one-sided loop's sums with the presence taken as a factor instead of a bias.
//
// Tiles of kTile tokens. The pair of tiles (I, J), I < J, is one block: its e_ab (a in I,
// b in J) are taken once and added to the receivers of I ("row" role, lanes over b) and of J
// ("column" role, sequential over a); a diagonal block (I, I) takes the pairs of the tile as
// a triangle of strips (both roles between strips, the row role within one). Blocks run in
// rounds r = I + J: the blocks of one round share no tile, and every tile meets its partners
// in ascending order (I < J in rounds I + J < 2J, itself in round 2J, then J' > J). Each
// receiver keeps two sets of sums, one for the blocks of even rounds and one for odd rounds,
// added when the receiver is finished: a block of round r writes the sums of parity r mod 2,
// which the blocks of round r - 2 wrote last, so it starts once those two blocks (one per
// tile) are done (per-tile, per-parity counters, no barrier per round); the blocks of rounds
// r - 1 and r run side by side, and two threads already share the work at n = 128 (rounds 0
// and 1 at once). Each receiver's sums are therefore taken in one fixed order (per parity,
// partner tiles ascending; inside a block the column role adds one term per source in order,
// the row role a lane vector; then even + odd), whichever thread runs which block;
// appending null tokens (p = 0, on the sphere, left out of B) only adds exact zeros at the
// end of a parity's order, so no other bit changes.
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>


#include "backends/cpu/micro_kernels.hpp"
#include "backends/cpu/lane_pair_terms.hpp"
#include "mfattn/backends/backend.hpp"
#include "mfattn/core/model.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::cpu {
inline namespace MFATTN_CPU_NAMESPACE {

/// Whether the symmetric loop applies to the model (see the file comment).
bool symmetric_pairs_apply(const Model& model);

class SymmetricPairs {
 public:
  /// terms: the backend's pair terms (positions), which must outlive this object.
  SymmetricPairs(const Model& model, const LanePairTerms& terms);

  /// Called by every thread of an OpenMP team, after prepared[r] holds the operands of each
  /// replica (no prefix region: source j is token j). Writes every receiver's velocity and,
  /// where out asks, D_i and the attention output. Sets `fall_back` (and leaves the outputs unfinished)
  /// when the shared offset is too loose for some replica: 2 B log2(e) >= 1020 (weights could
  /// underflow) or a present receiver's S_i < kLooseBound; the caller then evaluates with the
  /// one-sided loop. A NumericalError of a receiver is recorded in `failure` (first one kept).
  void evaluate(const std::vector<Prepared>& prepared, std::size_t replicas, const double* x,
                const FieldOutputs& out, bool& fall_back, std::string& failure);

 private:
  /// One replica's operands and running sums, token-major padded to whole tiles.
  struct Replica {
    double offset = 0.0;         // B
    double neg_offset_log2 = 0;  // -B log2(e)
    double scale = 1.0;          // exp(B - shift): true weights over the computed ones
    bool offset_usable = true;   // 2 B log2(e) < 1020: no logit reaches the underflow edge
    AlignedDoubles queries;     // padded x d, q_i log2(e) (zeros for padding)
    AlignedDoubles presence;    // padded (0 for padding)
    // p_j z_j: d rows of stride (d <= 4) or padded rows of row_stride (d > 4): the prepared
    // values themselves when every p_j = 1, else weighted_values.
    const double* values = nullptr;
    AlignedDoubles weighted_values;
    // The running sums of one round parity (see the file comment).
    struct Sums {
      AlignedDoubles acc;         // A_i, laid out like values
      AlignedDoubles weight_sum;  // S_i, padded
      // d <= 4: the row role's lane sums, d + 1 lane vectors (S_i, A_i) per receiver, reduced
      // and added to weight_sum, acc when the receiver is finished.
      AlignedDoubles row_lanes;
    };
    Sums sums[2];  // of the blocks of even rounds, of odd rounds
  };

  void layout(const Prepared& p, Replica& replica) const;
  double build_tile(const Prepared& p, Replica& replica, std::size_t tile) const;
  void run_block(const Prepared& p, Replica& replica, std::size_t row_tile,
                 std::size_t column_tile) const;
  // log_terms (kLogTerms; large blocks: when not null): kTile x kTile numbers, row a - a_begin
  // holding log2(e) (log m_ab + log c_ab) for the sources of the column tile.
  template <std::size_t kDim, bool kDiagonal, bool kAllPresent, bool kLogTerms>
  void small_block(const Prepared& p, Replica& replica, std::size_t row_tile,
                   std::size_t column_tile, const double* log_terms) const;
  template <bool kColumn>
  void large_block(const Prepared& p, Replica& replica, std::size_t row_tile,
                   std::size_t column_tile, const double* log_terms) const;

  const Model& model_;
  double mass_;
  std::size_t padded_ = 0, tiles_ = 0, stride_ = 0;  // stride_: rows of the d <= 4 layout
  bool all_present_;                                  // every p_j = 1
  // Fills the log-terms of block (I, J) (see small_block); empty: full mask, no factor.
  std::function<void(std::size_t, std::size_t, double*)> block_log_terms_;
  std::vector<char> skipped_;  // tiles_ x tiles_: the window hides every pair of the block
  std::vector<Replica> replicas_;
  // Per tile of each replica and round parity: the next round of that parity the tile may
  // take part in (see evaluate).
  std::unique_ptr<std::atomic<std::size_t>[]> progress_;
  std::size_t progress_size_ = 0;
  std::unique_ptr<std::atomic<std::size_t>[]> claimed_;  // blocks claimed per round (2 threads)
};

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
