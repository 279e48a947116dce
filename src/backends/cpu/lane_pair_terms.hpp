#pragma once
// The pair terms of the CPU pair loops: the kernels' masks and factors (kernels/pair_terms.hpp,
// where the formulas are) read through SourceLanes, a receiver and kLanes sources at once:
//   log-term  l_ij += log(m_ij) [+ log c_ij for nonnegative factors]   (-inf hides a source)
//   factor    w_ij *= c_ij                                             (sign-changing factors)
// Each combination is a small type chosen once per evaluation by LanePairTerms::dispatch and
// compiled into the loop, so the loop has no branch per pair and no class per combination.
// A type says whether it contributes (kHasLogTerm, kHasFactor); the loop skips what it lacks.
#include <algorithm>
#include <vector>

#include "backends/cpu/vector_math.hpp"
#include "kernels/pair_terms.hpp"
#include "mfattn/core/model.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::cpu {
inline namespace MFATTN_CPU_NAMESPACE {

/// Labels of the sources as lanes, in the backend's source order: the prefix tokens first
/// (padded to a whole tile), then the moving tokens: position_dim rows of padded_sources
/// positions, and the prompt of each source (-1 for padding).
struct SourcePositions {
  std::size_t dim = 1, padded_sources = 0;
  std::vector<double> rows;
  std::vector<double> prompts;
  const double* row(std::size_t a) const { return rows.data() + a * padded_sources; }
};

struct ReceiverPosition {
  const double* xi = nullptr;  // the receiver's position_dim coordinates (unread without terms)
  double prompt = 0;
};

/// The pair of a receiver and the kLanes sources from j on, as the kernels' terms read it
/// (kernels/pair_terms.hpp): source labels as lanes, the receiver's as scalars.
struct SourceLanes {
  using Real = simd::Lanes;
  const SourcePositions& sources;
  const ReceiverPosition& receiver_position;
  std::size_t j;
  std::size_t dim() const { return sources.dim; }
  simd::Lanes source(std::size_t a) const { return simd::load(sources.row(a) + j); }
  double receiver(std::size_t a) const { return receiver_position.xi[a]; }
  simd::Lanes source_prompt() const { return simd::load(sources.prompts.data() + j); }
  double receiver_prompt() const { return receiver_position.prompt; }
};

/// A mask and a factor (kernels::PairTerms) bound to the lane-packed source positions: the
/// terms of a receiver and kLanes sources at once.
template <class Mask, class Factor>
struct Terms {
  using Receiver = ReceiverPosition;
  using Formula = kernels::PairTerms<Mask, Factor>;
  static constexpr bool kHasLogTerm = Formula::kHasLogTerm;
  static constexpr bool kHasFactor = Formula::kHasFactor;
  static constexpr bool kPromptMasked = Formula::kPromptMasked;
  const SourcePositions* sources;
  const std::vector<double>* receiver_positions;
  Formula formula;
  const std::vector<double>* receiver_prompts;

  Receiver receiver(std::size_t i) const {
    return Receiver{receiver_positions->data() + i * sources->dim, (*receiver_prompts)[i]};
  }
  simd::Lanes log_term(const Receiver& r, std::size_t j) const {
    return formula.log_term(SourceLanes{*sources, r, j});
  }
  simd::Lanes factor(const Receiver& r, std::size_t j) const {
    return formula.factor(SourceLanes{*sources, r, j});
  }
  /// The derivatives of the log-term or multiplier with respect to the factor's numbers
  /// (Factor::term_derivatives), number_count() lanes into out.
  void term_derivatives(const Receiver& r, std::size_t j, simd::Lanes* out) const {
    formula.aux_factor.term_derivatives(SourceLanes{*sources, r, j}, out);
  }
  std::size_t number_count() const { return formula.aux_factor.number_count(); }
};

/// Holds the padded source labels and picks the Terms types for a model: one for the moving
/// sources and one for the prefix sources (the same type unless the per-prompt mask is on).
class LanePairTerms {
 public:
  static constexpr std::size_t kTile = 64;

  /// Sources before this index are prefix tokens (and padding); the moving ones follow.
  static std::size_t prefix_region(const Model& model) {
    return (model.prefix_count() + kTile - 1) / kTile * kTile;
  }
  static std::size_t padded_sources(const Model& model) {
    return prefix_region(model) + (std::max<std::size_t>(model.n, 1) + kTile - 1) / kTile * kTile;
  }

  // Terms hold pointers into this object (the symmetric loop keeps a copy of them).
  LanePairTerms(const LanePairTerms&) = delete;
  LanePairTerms& operator=(const LanePairTerms&) = delete;

  explicit LanePairTerms(const Model& model) : parameters_(model.pair_terms) {
    const std::size_t k = model.position_dim, first = prefix_region(model);
    sources_.dim = k;
    sources_.padded_sources = padded_sources(model);
    sources_.rows.assign(k * sources_.padded_sources, 0.0);
    sources_.prompts.assign(sources_.padded_sources, -1.0);
    for (std::size_t p = 0; p < model.prefix_count(); ++p) {
      for (std::size_t a = 0; a < k; ++a)
        sources_.rows[a * sources_.padded_sources + p] = model.prefix_positions[p * k + a];
      sources_.prompts[p] = model.prefix_prompt_id[p];
    }
    for (std::size_t j = 0; j < model.n && !model.positions.empty(); ++j)
      for (std::size_t a = 0; a < k; ++a)
        sources_.rows[a * sources_.padded_sources + first + j] = model.positions[j * k + a];
    // The moving tokens' prompts too: the loops over moving sources never read them, but
    // Sinkhorn's column pass takes moving receivers as lanes against a prefix token.
    for (std::size_t j = 0; j < model.n && j < model.prompt_id.size(); ++j)
      sources_.prompts[first + j] = model.prompt_id[j];
    receiver_positions_ = model.positions;
    if (receiver_positions_.empty()) receiver_positions_.assign(model.n * k, 0.0);
    receiver_prompts_.assign(model.n, 0.0);
    for (std::size_t i = 0; i < model.n && i < model.prompt_id.size(); ++i)
      receiver_prompts_[i] = model.prompt_id[i];
  }

  /// The moving tokens' positions, n rows of position_dim (zeros when the model has none).
  const std::vector<double>& receiver_positions() const { return receiver_positions_; }

  /// Calls body(terms, prefix_terms) with the Terms types of the model's mask and factor.
  template <class Body>
  void dispatch(Body&& body) const {
    visit_factor([&](const auto& factor) { dispatch_with(factor, body); });
  }

  /// Calls body(factor) with the model's auxiliary factor as its own type (a translation
  /// unit per factor can then hold that factor's instantiations: one_sided_loop.hpp).
  template <class Body>
  void visit_factor(Body&& body) const {
    kernels::visit_factor(parameters_, body);
  }

  /// dispatch for a factor given by visit_factor.
  template <class Factor, class Body>
  void dispatch_with(Factor factor, Body&& body) const {
    kernels::visit_pair_terms_with(parameters_, factor, [&](const auto& terms, const auto& prefix_terms) {
      body(bind(terms), bind(prefix_terms));
    });
  }

 private:
  template <class Mask, class Factor>
  Terms<Mask, Factor> bind(const kernels::PairTerms<Mask, Factor>& formula) const {
    return Terms<Mask, Factor>{&sources_, &receiver_positions_, formula, &receiver_prompts_};
  }

  kernels::PairTermParameters parameters_;
  SourcePositions sources_;
  std::vector<double> receiver_positions_, receiver_prompts_;
};

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
