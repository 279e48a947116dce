// The derivatives of the layer's output, pair by pair (reference_derivatives.hpp; docs/model.md
// section 2e). Each head of each replica is one HeadDerivative: its forward pass keeps, per
// receiver, what the derivatives read again (the normaliser and the normalized sums u_pre: O(n)
// numbers), and each derivative pass recomputes every pair's weight from the same formula
// (kernels/pair_terms.hpp, the token operands of token_operands.hpp).
#include "backends/reference/reference_derivatives.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <memory>
#include <vector>

#include "backends/model_sources.hpp"
#include "backends/sinkhorn_scaling.hpp"
#include "backends/token_operands.hpp"
#include "kernels/token_formulas.hpp"

namespace mfattn::detail {
namespace {

using kernels::PairWeightTerms;

// From this many pairs over all heads (n^2 H), the heads of a layer run side by side
// (each_head): the per-token maps of a head are serial matrix products, which then overlap.
constexpr double kHeadsSideBySidePairs = 1 << 18;

double dot(const double* a, const double* b, std::size_t count) {
  double sum = 0.0;
  for (std::size_t c = 0; c < count; ++c) sum += a[c] * b[c];
  return sum;
}

/// count rows of `width` numbers as a matrix (the per-token maps as matrix products: GEMMs
/// instead of a loop of matrix-vector products per token).
Eigen::Map<Matrix> rows(double* data, std::size_t count, std::size_t width) {
  return Eigen::Map<Matrix>(data, Eigen::Index(count), Eigen::Index(width));
}
Eigen::Map<const Matrix> rows(const double* data, std::size_t count, std::size_t width) {
  return Eigen::Map<const Matrix>(data, Eigen::Index(count), Eigen::Index(width));
}

/// Every source's contents y_j (sources x d: the moving tokens' y, then the prefix tokens'),
/// once per layer for all its heads' matrix products.
void take_source_contents(const Model& model, const double* y, Matrix& contents) {
  const std::size_t sources = model.n + model.prefix_count();
  contents.resize(Eigen::Index(sources), Eigen::Index(model.d));
  for (std::size_t j = 0; j < sources; ++j)
    std::copy_n(host::source_content(model, y, j), model.d, contents.row(Eigen::Index(j)).data());
}

/// What one pair's weight is made of: w = p_j * factor_weight, factor_weight = c_ij *
/// exponential (c_ij = 1 without a multiplier), exponential = exp(log m c + beta s - shift)
/// without the multiplier (the factor's log-term in it).
struct PairWeight {
  bool visible = false;
  double score = 0.0;        ///< s_ij = <q_i, k_j> (beta not applied)
  double log_term = 0.0;     ///< log m_ij c_ij of a log-term factor (0 without)
  double multiplier = 1.0;   ///< c_ij of a sign-changing factor (1 without)
  double exponential = 0.0;  ///< exp(log-term) exp(beta s - shift)
  double weight = 0.0;       ///< w_ij
  double factor_weight = 0.0;
};

/// Sinkhorn attention's scalings as run (docs/model.md section 2d), every sweep's kept for the
/// derivatives (unrolled through the sweeps taken: O(n K) numbers). With a_ij = beta s_ij +
/// log m_ij c_ij and b_j = log p_j:
///   rows     f^t_i = -LSE_j (a_ij + rb^t_j),   rb^0 = b
///   columns  rb^t_j = log c_j - Gamma^t_j,    Gamma^t_j = LSE_i (f^(t-1)_i + a_ij)   (t = 1..K)
///   plan     P_ij = exp(f^K_i + a_ij + rb^K_j)
struct SinkhornTape {
  std::vector<std::vector<double>> row_scale;     ///< f^t, t = 0..K
  std::vector<std::vector<double>> row_bias;      ///< rb^t, t = 0..K
  std::vector<std::vector<double>> column_lse;    ///< Gamma^t (t = 1..K at t - 1; the last pass's after)
  std::vector<double> log_target;                 ///< log c_j
  std::vector<char> in_view;                      ///< sources some receiver sees (M_J's)
  double visible_mass = 0.0;                      ///< M_J
  std::size_t sweeps() const { return row_scale.size() - 1; }
};

/// One head's cotangents of its sources' operands, taken back through the score gauge: the
/// factors of the contents' cotangents (HeadDerivative::add_contents_bar), which the layer adds
/// row by row in head order (the heads' VJPs may run side by side; no n x d array per head).
struct ContentCotangents {
  Matrix query_back;              ///< n x r: G_i^T q_bar_i
  Matrix key_back;                ///< sources x r: G_j^T k_bar_j
  std::vector<double> value_bar;  ///< sources x od: z_bar_j
};

/// One head's tangent of its output u^(h) = T M^T as its two factors' tangents (T_dot, and
/// M_dot where the numbers have a tangent), which the layer adds row by row in head order
/// (HeadDerivative::add_field_dot).
struct OutputTangents {
  Matrix t_dot;               ///< n x (M's columns); rows of receivers with N_i = 0 stay 0
  Matrix map_dot_transposed;  ///< M's tangent, transposed; empty: none
};

/// The forward pass and the derivatives of one head of one replica (file comment).
class HeadDerivative {
 public:
  /// passes: SA's and USA's pair passes (null: these pair by pair); contents: the layer's
  /// contents of the states take() is given.
  HeadDerivative(const Model& model, const AttentionHead& head, const HeadNumbers& layout,
                 const Matrix& contents, const PairPasses* passes)
      : model_(model), head_(head), layout_(layout), form_(model, head), contents_(contents),
        passes_(sinkhorn_ ? nullptr : passes),
        score_gauge_(head.score_dim() == model.d ? model.gauge.get() : model.head_gauge.get()),
        full_map_(form_.transported || head.value_identity),
        map_(full_map_ ? head.full_value : layout.output), map_transposed_(map_.transpose()) {}

  /// The forward pass at the states y (the layer's contents already theirs). Taken again at
  /// other states, it refills the arrays of the last: their pages are not mapped afresh.
  void take(const double* y) {
    if (passes_) {
      operands_.resize(model_.n + model_.prefix_count(), form_.operand_dim);
      passes_->fill_operands(model_, head_, y, operands_.queries.data(), operands_.keys.data(),
                             operands_.values.data(), operands_.presence.data(),
                             operands_.log_presence.data());
    } else {
      host::prepare_head_operands(form_, y, operands_);
    }
    forward();
  }

  /// F += u^(h) (n x d) for the receivers [first, first + count): T M^T. (The products here are
  /// added with noalias(): no operand is the sum itself, so Eigen needs no temporary, a fresh
  /// array per product.)
  void add_output(double* field, std::size_t first, std::size_t count) const {
    add_product(false, t_rows().middleRows(Eigen::Index(first), Eigen::Index(count)),
                map_transposed_, rows(field + first * model_.d, count, model_.d));
  }

  /// The VJP for F's cotangent field_bar (n x d): the head's matrices' gradients, the numbers'
  /// (gradient) and the factors of the contents' cotangents (contents_bar: add_contents_bar
  /// adds them to y_bar and the prefix's).
  void vjp(const double* field_bar, ContentCotangents& contents_bar, HeadNumbers& head_gradient,
           FieldNumbers& gradient) const {
    const std::size_t n = model_.n, d = model_.d, od = operands_.d, sources = operands_.sources;
    const bool usa = model_.normalization == Normalization::Usa;
    const double mass = model_.mass();
    std::vector<double>& query_bar = scratch_.query;
    std::vector<double>& key_bar = scratch_.key;
    std::vector<double>& value_bar = contents_bar.value_bar;
    zero_operand_rows(query_bar, key_bar, value_bar);
    std::vector<double> u_bar(od), derivatives(kernels::kMaxFactorNumbers);
    double mass_bar = 0.0;
    std::vector<double>& every_u_bar = scratch_.every_u_bar;
    every_u_bar.assign(sinkhorn_ || passes_ ? n * od : 0, 0.0);  // whole passes take them all
    // u_i = 0 held (N_i = 0): no derivative (a NaN goes on, to be seen). With G the rows of
    // field_bar that do: M's cotangent G^T T, t's G M.
    // (A copy only where some row must be zeroed.)
    const bool some_zeroed = std::find(pairs_->normaliser.begin(), pairs_->normaliser.end(), 0.0) !=
                             pairs_->normaliser.end();
    if (some_zeroed) {
      scratch_.zeroed = rows(field_bar, n, d);
      for (std::size_t i = 0; i < n; ++i)
        if (pairs_->normaliser[i] == 0.0) scratch_.zeroed.row(Eigen::Index(i)).setZero();
    }
    const auto moving_bar = rows(some_zeroed ? scratch_.zeroed.data() : field_bar, n, d);
    Matrix& map_gradient = scratch_.map_gradient;
    map_gradient.setZero(Eigen::Index(d), map_.cols());
    add_product(true, moving_bar, t_rows(), map_gradient);
    Matrix& t_bar = scratch_.t_bar;
    t_bar.setZero(Eigen::Index(n), map_.cols());
    add_product(false, moving_bar, map_, t_bar);
    for (std::size_t i = 0; i < n; ++i) {
      if (pairs_->normaliser[i] == 0.0) continue;
      std::fill(u_bar.begin(), u_bar.end(), 0.0);
      if (form_.transported)
        model_.gauge->apply(i, t_bar.row(Eigen::Index(i)).data(), u_bar.data());
      else std::copy_n(t_bar.row(Eigen::Index(i)).data(), t_bar.cols(), u_bar.begin());
      if (sinkhorn_ || passes_)
        std::copy(u_bar.begin(), u_bar.end(), every_u_bar.begin() + std::ptrdiff_t(i * od));
      if (sinkhorn_) continue;
      const double delta = dot(u_bar.data(), u_pre(i), od);
      if (usa) mass_bar -= delta / mass;
      if (passes_) continue;
      for (std::size_t j = 0; j < sources; ++j) {
        const PairWeight pair = weight(i, j);
        if (!pair.visible) continue;
        const double along = dot(u_bar.data(), operands_.value(j), od);
        const double weight_bar = usa ? along / mass : (along - delta) / pairs_->normaliser[i];
        const double share = pair.weight / pairs_->normaliser[i];
        for (std::size_t c = 0; c < od; ++c) value_bar[j * od + c] += share * u_bar[c];
        const double logit_bar = pair.weight * weight_bar;
        for (std::size_t c = 0; c < od; ++c) {
          query_bar[i * od + c] += model_.beta * logit_bar * operands_.key(j)[c];
          key_bar[j * od + c] += model_.beta * logit_bar * operands_.query(i)[c];
        }
        gradient.beta += logit_bar * (pair.score - (rescaled_ ? 1.0 : 0.0));
        if (j < n) gradient.presence[j] += pair.factor_weight * weight_bar;
        if (!has_factor_numbers_) continue;
        const kernels::PairTermDerivatives terms =
            kernels::pair_term_derivatives(model_.pair_terms, host::scalar_pair(model_, i, j), derivatives.data());
        const double term_bar =
            terms.of_multiplier ? operands_.presence[j] * pair.exponential * weight_bar : logit_bar;
        for (std::size_t k = 0; k < terms.count; ++k) gradient.factor[k] += term_bar * derivatives[k];
      }
    }
    if (sinkhorn_) sinkhorn_vjp(every_u_bar, query_bar, key_bar, value_bar, gradient);
    if (passes_) {
      std::vector<double>& source_logit = scratch_.source_logit;
      source_logit.assign(sources, 0.0);
      PairCotangents out{
          query_bar.data(),      key_bar.data(), value_bar.data(), source_logit.data(), 0.0,
          gradient.factor.data()};
      passes_->vjp(*pairs_, every_u_bar.data(), out);
      gradient.beta += out.beta;
      // w_ij = p_j c_ij exp(...): p_j's cotangent sum_i l_bar_ij / p_j.
      for (std::size_t j = 0; j < n; ++j)
        if (model_.presence[j] > 0.0) gradient.presence[j] += source_logit[j] / model_.presence[j];
    }
    if (usa)
      for (std::size_t j = 0; j < n; ++j)
        if (model_.presence[j] > 0.0) gradient.presence[j] += mass_bar;
    gather_sources(query_bar, key_bar, contents_bar, head_gradient);
    if (full_map_) {
      head_gradient.value.noalias() += layout_.output.transpose() * map_gradient;
      head_gradient.output.noalias() += map_gradient * layout_.value.transpose();
    } else {
      head_gradient.output += map_gradient;
    }
  }

  /// Adds the contents' cotangents of sources [first, first + count) (a VJP's contents_bar) to
  /// the moving tokens' rows of y_bar (n x d) and the prefix tokens' of prefix_bar (P x d):
  /// K^T G^T k_bar_j + Q^T G^T q_bar_j + the values' (G_j^T z_bar_j | z_bar_j | A^T z_bar_j).
  void add_contents_bar(const ContentCotangents& contents_bar, std::size_t first,
                        std::size_t count, double* y_bar, double* prefix_bar) const {
    const std::size_t n = model_.n, d = model_.d, od = operands_.d;
    const std::size_t sources = operands_.sources;
    // The moving rows [first, moving_end), then the prefix rows [prefix_first, end).
    const std::size_t end = std::min(first + count, sources), moving_end = std::min(end, n);
    const std::size_t prefix_first = std::max(first, n);
    const auto z_bar = rows(contents_bar.value_bar.data(), sources, od);
    auto add_rows = [&](std::size_t from, std::size_t to, double* bar) {
      if (from >= to) return;
      const Eigen::Index at = Eigen::Index(from), span = Eigen::Index(to - from);
      auto rows_bar = rows(bar, to - from, d);
      add_product(false, contents_bar.key_back.middleRows(at, span), head_.key, rows_bar);
      if (from < n)
        add_product(false, contents_bar.query_back.middleRows(at, span), head_.query, rows_bar);
      if (form_.transported) {
        std::vector<double> back(d);
        for (std::size_t j = from; j < to; ++j) {
          model_.gauge->apply_transpose(j, contents_bar.value_bar.data() + j * od, back.data());
          for (std::size_t c = 0; c < d; ++c) bar[(j - from) * d + c] += back[c];
        }
      } else if (head_.value_identity) {
        rows_bar += z_bar.middleRows(at, span).leftCols(Eigen::Index(d));
      } else {
        const Eigen::Index rv = head_.value.rows();
        add_product(false, z_bar.middleRows(at, span).leftCols(rv), head_.value, rows_bar);
      }
    };
    add_rows(first, moving_end, y_bar + first * d);
    add_rows(prefix_first, end, prefix_bar + (prefix_first - n) * d);
  }

  /// The JVP along the contents' tangents (content_dots: sources x d, the layer's) and the
  /// numbers' tangent (null: none; head_tangent: this head's): u^(h)'s tangent as `out`, which
  /// add_field_dot adds to F_dot.
  void jvp(const Matrix& content_dots, const FieldNumbers* tangent, const HeadNumbers* head_tangent,
           OutputTangents& out) const {
    const std::size_t n = model_.n, od = operands_.d, sources = operands_.sources;
    const bool usa = model_.normalization == Normalization::Usa;
    std::vector<double>& query_dot = scratch_.query;
    std::vector<double>& key_dot = scratch_.key;
    std::vector<double>& value_dot = scratch_.value;
    zero_operand_rows(query_dot, key_dot, value_dot);
    spread_sources(content_dots, head_tangent, query_dot, key_dot, value_dot);
    out.map_dot_transposed.resize(0, 0);
    if (head_tangent)
      out.map_dot_transposed = full_map_ ? Matrix((head_tangent->output * layout_.value +
                                                   layout_.output * head_tangent->value)
                                                      .transpose())
                                         : Matrix(head_tangent->output.transpose());
    double mass_dot = 0.0;
    if (tangent)
      for (std::size_t j = 0; j < n; ++j)
        if (model_.presence[j] > 0.0) mass_dot += tangent->presence[j];
    const double beta_dot = tangent ? tangent->beta : 0.0;
    std::vector<double> numerator_dot(od), derivatives(kernels::kMaxFactorNumbers);
    Matrix& t_dot = out.t_dot;
    t_dot.setZero(Eigen::Index(n), map_.cols());  // rows of receivers with N_i = 0 stay 0
    const std::vector<double> sinkhorn_dot =
        sinkhorn_ ? sinkhorn_jvp(query_dot, key_dot, value_dot, tangent) : std::vector<double>();
    std::vector<double>& pass_numerator_dot = scratch_.numerator_dot;
    std::vector<double>& pass_sum_dot = scratch_.sum_dot;
    if (passes_) {
      std::vector<double>& log_presence_dot = scratch_.log_presence_dot;
      log_presence_dot.assign(sources, 0.0);
      if (tangent)
        for (std::size_t j = 0; j < n; ++j)
          if (model_.presence[j] > 0.0)
            log_presence_dot[j] = tangent->presence[j] / model_.presence[j];
      pass_numerator_dot.assign(n * od, 0.0);
      pass_sum_dot.assign(n, 0.0);
      const PairTangents in{
          query_dot.data(), key_dot.data(),
          value_dot.data(), log_presence_dot.data(),
          beta_dot,         tangent && has_factor_numbers_ ? tangent->factor.data() : nullptr};
      passes_->jvp(*pairs_, in, pass_numerator_dot.data(), pass_sum_dot.data());
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (pairs_->normaliser[i] == 0.0) continue;
      if (sinkhorn_) {
        // The plan's rows sum to 1: u_pre's tangent is the sums' own.
        std::copy(sinkhorn_dot.begin() + std::ptrdiff_t(i * od), sinkhorn_dot.begin() + std::ptrdiff_t((i + 1) * od),
                  numerator_dot.begin());
        map_tangent(i, numerator_dot.data(), t_dot);
        continue;
      }
      std::fill(numerator_dot.begin(), numerator_dot.end(), 0.0);
      double sum_dot = 0.0;
      if (passes_) {
        std::copy_n(pass_numerator_dot.begin() + std::ptrdiff_t(i * od), od, numerator_dot.begin());
        sum_dot = pass_sum_dot[i];
      }
      for (std::size_t j = 0; j < sources && !passes_; ++j) {
        const PairWeight pair = weight(i, j);
        if (!pair.visible) continue;
        double logit_dot = model_.beta * (dot(query_dot.data() + i * od, operands_.key(j), od) +
                                          dot(operands_.query(i), key_dot.data() + j * od, od)) +
                           beta_dot * (pair.score - (rescaled_ ? 1.0 : 0.0));
        double weight_dot = 0.0;
        if (tangent && has_factor_numbers_) {
          const kernels::PairTermDerivatives terms =
              kernels::pair_term_derivatives(model_.pair_terms, host::scalar_pair(model_, i, j), derivatives.data());
          double term_dot = 0.0;
          for (std::size_t k = 0; k < terms.count; ++k) term_dot += tangent->factor[k] * derivatives[k];
          if (terms.of_multiplier)
            weight_dot += operands_.presence[j] * pair.exponential * term_dot;
          else
            logit_dot += term_dot;
        }
        if (tangent && j < n) weight_dot += tangent->presence[j] * pair.factor_weight;
        weight_dot += pair.weight * logit_dot;
        for (std::size_t c = 0; c < od; ++c)
          numerator_dot[c] += weight_dot * operands_.value(j)[c] + pair.weight * value_dot[j * od + c];
        sum_dot += weight_dot;
      }
      // USA's N_i is M in the passes' units: M 2^(-offset_i) (the reference's: M itself).
      const double normaliser_dot = usa ? mass_dot * (pairs_->normaliser[i] / model_.mass()) : sum_dot;
      for (std::size_t c = 0; c < od; ++c)
        numerator_dot[c] = (numerator_dot[c] - u_pre(i)[c] * normaliser_dot) / pairs_->normaliser[i];
      map_tangent(i, numerator_dot.data(), t_dot);
    }
  }

  /// F_dot += T_dot M^T + T M_dot^T for the receivers [first, first + count) (a JVP's `in`;
  /// field_dot: n x d).
  void add_field_dot(const OutputTangents& in, std::size_t first, std::size_t count,
                     double* field_dot) const {
    const Eigen::Index at = Eigen::Index(first), span = Eigen::Index(count);
    auto field_dots = rows(field_dot + first * model_.d, count, model_.d);
    add_product(false, in.t_dot.middleRows(at, span), map_transposed_, field_dots);
    if (in.map_dot_transposed.size() > 0)
      add_product(false, t_rows().middleRows(at, span), in.map_dot_transposed, field_dots);
  }

  /// Row i of T_dot from u_pre's tangent (od numbers): G_i^T u_pre_dot, or u_pre_dot.
  void map_tangent(std::size_t i, const double* u_pre_dot, Matrix& t_dot) const {
    double* row = t_dot.row(Eigen::Index(i)).data();
    if (form_.transported) model_.gauge->apply_transpose(i, u_pre_dot, row);
    else std::copy_n(u_pre_dot, t_dot.cols(), row);
  }

 private:
  /// The pair (i, j)'s weight, as the reference backend forms it.
  PairWeight weight(std::size_t i, std::size_t j) const {
    PairWeight pair = pair_logit(i, j);
    if (!pair.visible) return pair;
    // One exponent: SA's offset holds the log-term too, so exp(beta s - shift - offset) alone
    // could overflow where its product with exp(log-term) does not.
    pair.exponential = std::exp(model_.beta * pair.score + pair.log_term - model_.exponent_shift() -
                                (offset_.empty() ? 0.0 : offset_[i]));
    pair.factor_weight = pair.multiplier * pair.exponential;
    pair.weight = operands_.presence[j] * pair.factor_weight;
    return pair;
  }
  /// The pair's visibility, score and terms without its exponentials (the offsets and
  /// Sinkhorn's passes take their own).
  PairWeight pair_logit(std::size_t i, std::size_t j) const {
    PairWeight pair;
    if (!(operands_.presence[j] > 0.0)) return pair;
    // Without a mask, factor or per-prompt rule every pair is visible with c_ij = 1.
    const PairWeightTerms<double> terms =
        has_pair_terms_ ? host::model_pair_weight_terms(model_, i, j) : PairWeightTerms<double>{0.0, 1.0};
    if (!kernels::visible(terms)) return pair;
    pair.visible = true;
    pair.score = dot(operands_.query(i), operands_.key(j), operands_.d);
    pair.log_term = terms.log_term;
    pair.multiplier = terms.multiplier;
    return pair;
  }

  /// Every receiver's normaliser (M, or eps_den + D_i; 0: u_i = 0), u_pre and t_i.
  void forward() {
    const std::size_t n = model_.n, od = operands_.d;
    const bool usa = model_.normalization == Normalization::Usa;
    // The head as the passes read it; its normaliser and u_pre are the forward pass's either way.
    // (Taken again: the arrays and the passes' state of the last forward pass refilled.)
    if (!pairs_)
      pairs_ = std::make_unique<HeadPairs>(HeadPairs{
          model_, 0, 0, 0, nullptr, nullptr, nullptr, nullptr, nullptr, {}, {}, {}, nullptr});
    pairs_->sources = operands_.sources;
    pairs_->operand_dim = operands_.d;
    pairs_->score_dim = head_.score_dim();
    pairs_->queries = operands_.queries.data();
    pairs_->keys = operands_.keys.data();
    pairs_->values = operands_.values.data();
    pairs_->presence = operands_.presence.data();
    pairs_->log_presence = operands_.log_presence.data();
    pairs_->offset.clear();
    pairs_->normaliser.assign(n, 0.0);
    pairs_->u_pre.assign(n * od, 0.0);
    t_.assign(n * std::size_t(map_.cols()), 0.0);
    if (passes_) {
      passes_->forward(*pairs_);
      for (std::size_t i = 0; i < n; ++i)
        if (pairs_->normaliser[i] != 0.0) map_sums(i);
      return;
    }
    if (sinkhorn_) {
      tape_ = SinkhornTape{};
      record_scalings();
    }
    if (model_.normalization == Normalization::Sa) take_offsets();
    const double mass = model_.mass();
    for (std::size_t i = 0; i < n; ++i) {
      double sum = 0.0;
      double* numerator = pairs_->u_pre.data() + i * od;
      for (std::size_t j = 0; j < operands_.sources; ++j) {
        const PairWeight pair = sinkhorn_ ? pair_logit(i, j) : weight(i, j);
        if (!pair.visible) continue;
        const double w = sinkhorn_ ? plan(i, j, pair) : pair.weight;
        for (std::size_t c = 0; c < od; ++c) numerator[c] += w * operands_.value(j)[c];
        sum += w;
      }
      // The plan's rows sum to 1 (an empty row, a null receiver: u_i = 0).
      // SA's weights are exp(-offset_i) times the true ones, and eps_den with them.
      const double eps_den = offset_.empty() || !(model_.eps_den > 0.0) ? model_.eps_den
                                                                         : model_.eps_den * std::exp(-offset_[i]);
      pairs_->normaliser[i] = sinkhorn_ ? (sum > 0.0 ? 1.0 : 0.0) : usa ? mass : eps_den + sum;
      if (pairs_->normaliser[i] == 0.0) {
        std::fill(numerator, numerator + od, 0.0);
        continue;
      }
      for (std::size_t c = 0; c < od; ++c) numerator[c] /= pairs_->normaliser[i];
      map_sums(i);
    }
  }

  /// t_i from u_pre_i: G_i^T u_pre_i for transported values, else u_pre_i itself.
  void map_sums(std::size_t i) {
    double* ti = t_.data() + i * std::size_t(map_.cols());
    if (form_.transported) model_.gauge->apply_transpose(i, u_pre(i), ti);
    else std::copy(u_pre(i), u_pre(i) + map_.cols(), ti);
  }

  /// a_ij = beta s_ij + log m_ij c_ij, Sinkhorn's logit without log p_j.
  double logit(const PairWeight& pair) const { return model_.beta * pair.score + pair.log_term; }
  /// exp(row + a_ij + column), 0 where either scale is -inf.
  double scaled(double row, const PairWeight& pair, double column) const {
    if (row == -HUGE_VAL || column == -HUGE_VAL) return 0.0;
    return std::exp(row + logit(pair) + column);
  }
  /// P_ij of the final plan.
  double plan(std::size_t i, std::size_t j, const PairWeight& pair) const {
    return scaled(tape_.row_scale.back()[i], pair, tape_.row_bias.back()[j]);
  }
  /// Visible pairs of present sources, in receiver-major order: body(i, j, pair).
  template <class Body>
  void each_pair(Body&& body) const {
    for (std::size_t i = 0; i < model_.n; ++i)
      for (std::size_t j = 0; j < operands_.sources; ++j) {
        const PairWeight pair = pair_logit(i, j);
        if (pair.visible) body(i, j, pair);
      }
  }

  /// Runs Sinkhorn's sweeps (host::SinkhornScaling, the backends' one procedure) over passes
  /// that keep every sweep's scalings.
  void record_scalings() {
    struct RecordingPasses {
      HeadDerivative& self;
      void rows(host::SinkhornScaling& scaling) {
        host::SinkhornSlot& slot = scaling.slots.front();
        self.tape_.row_bias.push_back(slot.row_bias);
        for (std::size_t i = 0; i < self.model_.n; ++i)
          scaling.finish_row(slot, i, exact_log_sum_exp(self.operands_.sources, [&](std::size_t j) {
                               const PairWeight pair = self.pair_logit(i, j);
                               return pair.visible ? self.logit(pair) + slot.row_bias[j] : -HUGE_VAL;
                             }));
        self.tape_.row_scale.push_back(slot.row_scale);
      }
      void columns(host::SinkhornScaling& scaling) {
        host::SinkhornSlot& slot = scaling.slots.front();
        std::vector<double> lse(self.operands_.sources);
        for (std::size_t j = 0; j < self.operands_.sources; ++j) {
          lse[j] = exact_log_sum_exp(self.model_.n, [&](std::size_t i) {
            const PairWeight pair = self.pair_logit(i, j);
            return pair.visible ? slot.row_scale[i] + self.logit(pair) : -HUGE_VAL;
          });
          scaling.finish_column(slot, j, lse[j]);
        }
        self.tape_.column_lse.push_back(lse);
      }
    };
    host::SinkhornScaling scaling(kernels::SinkhornTerms{std::size_t(model_.sinkhorn.sweeps), model_.sinkhorn.tolerance});
    host::SinkhornSlot& slot = scaling.slots.emplace_back();
    slot.source_log_presence = operands_.log_presence;
    for (std::size_t i = 0; i < model_.n; ++i) slot.receiver_present.push_back(model_.presence[i] > 0.0);
    scaling.reset();
    RecordingPasses passes{*this};
    scaling.run(passes);
    tape_.log_target = slot.log_target;
    for (std::size_t j = 0; j < operands_.sources; ++j) {
      const bool seen = tape_.column_lse.front()[j] != -HUGE_VAL && operands_.presence[j] > 0.0;
      tape_.in_view.push_back(seen);
      if (seen) tape_.visible_mass += operands_.presence[j];
    }
  }

  /// A logit's cotangent a_bar of the pair into q_bar_i, k_bar_j, beta's and the factor's.
  void add_logit_bar(std::size_t i, std::size_t j, const PairWeight& pair, double a_bar, std::vector<double>& query_bar,
                     std::vector<double>& key_bar, FieldNumbers& gradient, double* derivatives) const {
    const std::size_t od = operands_.d;
    for (std::size_t c = 0; c < od; ++c) {
      query_bar[i * od + c] += model_.beta * a_bar * operands_.key(j)[c];
      key_bar[j * od + c] += model_.beta * a_bar * operands_.query(i)[c];
    }
    gradient.beta += a_bar * pair.score;
    if (!has_factor_numbers_) return;
    const kernels::PairTermDerivatives terms =
        kernels::pair_term_derivatives(model_.pair_terms, host::scalar_pair(model_, i, j), derivatives);
    for (std::size_t k = 0; k < terms.count; ++k) gradient.factor[k] += a_bar * derivatives[k];
  }

  /// The pairs' share of Sinkhorn's VJP, backwards through the sweeps (SinkhornTape's
  /// formulas): u_bar (n x od) the normalized sums' cotangents.
  void sinkhorn_vjp(const std::vector<double>& u_bar, std::vector<double>& query_bar, std::vector<double>& key_bar,
                    std::vector<double>& value_bar, FieldNumbers& gradient) const {
    const std::size_t n = model_.n, od = operands_.d, sources = operands_.sources, K = tape_.sweeps();
    std::vector<double> derivatives(kernels::kMaxFactorNumbers), row_bar(n, 0.0), bias_bar(sources, 0.0),
        target_bar(sources, 0.0);
    each_pair([&](std::size_t i, std::size_t j, const PairWeight& pair) {
      const double p = plan(i, j, pair);
      if (p == 0.0) return;
      const double share = p * dot(u_bar.data() + i * od, operands_.value(j), od);
      for (std::size_t c = 0; c < od; ++c) value_bar[j * od + c] += p * u_bar[i * od + c];
      add_logit_bar(i, j, pair, share, query_bar, key_bar, gradient, derivatives.data());
      row_bar[i] += share;
      bias_bar[j] += share;
    });
    for (std::size_t t = K + 1; t-- > 0;) {
      // f^t = -LSE_j (a + rb^t).
      const std::vector<double>& f = tape_.row_scale[t];
      each_pair([&](std::size_t i, std::size_t j, const PairWeight& pair) {
        const double softmax = scaled(f[i], pair, tape_.row_bias[t][j]);
        if (softmax == 0.0) return;
        add_logit_bar(i, j, pair, -row_bar[i] * softmax, query_bar, key_bar, gradient, derivatives.data());
        bias_bar[j] -= row_bar[i] * softmax;
      });
      if (t == 0) break;
      // rb^t = log c - LSE_i (f^(t-1) + a).
      std::fill(row_bar.begin(), row_bar.end(), 0.0);
      for (std::size_t j = 0; j < sources; ++j) target_bar[j] += bias_bar[j];
      each_pair([&](std::size_t i, std::size_t j, const PairWeight& pair) {
        const double gamma = tape_.column_lse[t - 1][j];
        if (gamma == -HUGE_VAL || tape_.row_bias[t][j] == -HUGE_VAL) return;
        const double softmax = scaled(tape_.row_scale[t - 1][i], pair, -gamma);
        if (softmax == 0.0) return;
        add_logit_bar(i, j, pair, -bias_bar[j] * softmax, query_bar, key_bar, gradient, derivatives.data());
        row_bar[i] -= bias_bar[j] * softmax;
      });
      std::fill(bias_bar.begin(), bias_bar.end(), 0.0);
    }
    // rb^0 = b = log p; log c_j = log(R p_j / M_J).
    double mass_bar = 0.0;
    for (std::size_t j = 0; j < sources; ++j) {
      const bool targeted = tape_.log_target[j] != -HUGE_VAL;
      if (targeted) mass_bar -= target_bar[j] / tape_.visible_mass;
      if (j >= n || !(model_.presence[j] > 0.0)) continue;
      gradient.presence[j] += (bias_bar[j] + (targeted ? target_bar[j] : 0.0)) / model_.presence[j];
    }
    for (std::size_t j = 0; j < n; ++j)
      if (tape_.in_view[j]) gradient.presence[j] += mass_bar;
  }

  /// The pairs' share of Sinkhorn's JVP: the normalized sums' tangents (n x od) from the
  /// operands' (query_dot, key_dot, value_dot) and the numbers'.
  std::vector<double> sinkhorn_jvp(const std::vector<double>& query_dot, const std::vector<double>& key_dot,
                                   const std::vector<double>& value_dot, const FieldNumbers* tangent) const {
    const std::size_t n = model_.n, od = operands_.d, sources = operands_.sources, K = tape_.sweeps();
    std::vector<double> derivatives(kernels::kMaxFactorNumbers);
    auto logit_dot = [&](std::size_t i, std::size_t j, const PairWeight& pair) {
      double dot_a = model_.beta * (dot(query_dot.data() + i * od, operands_.key(j), od) +
                                    dot(operands_.query(i), key_dot.data() + j * od, od));
      if (tangent) dot_a += tangent->beta * pair.score;
      if (tangent && has_factor_numbers_) {
        const kernels::PairTermDerivatives terms =
            kernels::pair_term_derivatives(model_.pair_terms, host::scalar_pair(model_, i, j), derivatives.data());
        for (std::size_t k = 0; k < terms.count; ++k) dot_a += tangent->factor[k] * derivatives[k];
      }
      return dot_a;
    };
    std::vector<double> log_presence_dot(sources, 0.0), target_dot(sources, 0.0);
    double mass_dot = 0.0;
    if (tangent)
      for (std::size_t j = 0; j < n; ++j)
        if (model_.presence[j] > 0.0) {
          log_presence_dot[j] = tangent->presence[j] / model_.presence[j];
          if (tape_.in_view[j]) mass_dot += tangent->presence[j];
        }
    for (std::size_t j = 0; j < sources; ++j)
      if (tape_.log_target[j] != -HUGE_VAL) target_dot[j] = log_presence_dot[j] - mass_dot / tape_.visible_mass;
    std::vector<double> bias_dot = log_presence_dot, row_dot(n, 0.0), column_dot(sources);
    for (std::size_t t = 0;; ++t) {
      std::fill(row_dot.begin(), row_dot.end(), 0.0);
      each_pair([&](std::size_t i, std::size_t j, const PairWeight& pair) {
        const double softmax = scaled(tape_.row_scale[t][i], pair, tape_.row_bias[t][j]);
        if (softmax != 0.0) row_dot[i] -= softmax * (logit_dot(i, j, pair) + bias_dot[j]);
      });
      if (t == K) break;
      std::fill(column_dot.begin(), column_dot.end(), 0.0);
      each_pair([&](std::size_t i, std::size_t j, const PairWeight& pair) {
        const double gamma = tape_.column_lse[t][j];
        if (gamma == -HUGE_VAL) return;
        const double softmax = scaled(tape_.row_scale[t][i], pair, -gamma);
        if (softmax != 0.0) column_dot[j] += softmax * (row_dot[i] + logit_dot(i, j, pair));
      });
      for (std::size_t j = 0; j < sources; ++j) bias_dot[j] = target_dot[j] - column_dot[j];
    }
    std::vector<double> sums_dot(n * od, 0.0);
    each_pair([&](std::size_t i, std::size_t j, const PairWeight& pair) {
      const double p = plan(i, j, pair);
      if (p == 0.0) return;
      const double rate = row_dot[i] + logit_dot(i, j, pair) + bias_dot[j];
      for (std::size_t c = 0; c < od; ++c)
        sums_dot[i * od + c] += p * (rate * operands_.value(j)[c] + value_dot[j * od + c]);
    });
    return sums_dot;
  }

  /// SA's offsets: every weight of receiver i and its normaliser are taken times exp(-offset_i),
  /// offset_i = max_j (beta s_ij + log m_ij c_ij + log p_j) - shift, so that no exponential
  /// overflows where the field does not (the derivatives read only their ratios, P_ij).
  void take_offsets() {
    offset_.assign(model_.n, 0.0);
    std::vector<double> largest(model_.n, -HUGE_VAL);
    for (std::size_t i = 0; i < model_.n; ++i)
      for (std::size_t j = 0; j < operands_.sources; ++j) {
        const PairWeight pair = pair_logit(i, j);
        if (pair.visible)
          largest[i] = std::max(largest[i], model_.beta * pair.score + pair.log_term + operands_.log_presence[j] -
                                                model_.exponent_shift());
      }
    for (std::size_t i = 0; i < model_.n; ++i)
      if (std::isfinite(largest[i])) offset_[i] = largest[i];
  }

  const double* u_pre(std::size_t i) const { return pairs_->u_pre.data() + i * operands_.d; }
  const double* t(std::size_t i) const { return t_.data() + i * std::size_t(map_.cols()); }
  /// t_i as the rows of an n x cols matrix.
  Eigen::Map<const Matrix> t_rows() const {
    return rows(t_.data(), model_.n, std::size_t(map_.cols()));
  }

  /// out (r numbers) = G^(r)_token^T in, or in.
  void score_transpose(std::size_t token, const double* in, double* out) const {
    const std::size_t r = head_.score_dim();
    if (score_gauge_)
      score_gauge_->apply_transpose(token, in, out);
    else
      std::copy(in, in + r, out);
  }
  void score_apply(std::size_t token, const double* in, double* out) const {
    const std::size_t r = head_.score_dim();
    if (score_gauge_)
      score_gauge_->apply(token, in, out);
    else
      std::copy(in, in + r, out);
  }

  /// The operands' cotangents or tangents, zeroed: queries n rows of od, keys and values one
  /// row a source.
  void zero_operand_rows(std::vector<double>& queries, std::vector<double>& keys,
                         std::vector<double>& values) const {
    queries.assign(model_.n * operands_.d, 0.0);
    keys.assign(operands_.sources * operands_.d, 0.0);
    values.assign(operands_.sources * operands_.d, 0.0);
  }

  /// c += op(a) b (op: a^T where transpose_a), row-major dense blocks: by the passes' products
  /// where there are passes, else Eigen's.
  template <class A, class B, class C>
  void add_product(bool transpose_a, const A& a, const B& b, C&& c) const {
    if (!passes_) {
      if (transpose_a) c.noalias() += a.transpose() * b;
      else c.noalias() += a * b;
      return;
    }
    passes_->add_product(DenseProduct{
        transpose_a, std::size_t(c.rows()), std::size_t(transpose_a ? a.rows() : a.cols()),
        std::size_t(c.cols()), a.data(), std::size_t(a.outerStride()), b.data(),
        std::size_t(b.outerStride()), c.data(), std::size_t(c.outerStride())});
  }

  /// The first `width` of each row of `operand` (count rows of od) taken through G_j^T of the
  /// score gauge (or as they are), as a count x width matrix.
  void score_rows_back(const std::vector<double>& operand, std::size_t count, Matrix& back) const {
    const std::size_t od = operands_.d, r = head_.score_dim();
    back.setZero(Eigen::Index(count), Eigen::Index(r));
    for (std::size_t j = 0; j < count; ++j)
      score_transpose(j, operand.data() + j * od, back.row(Eigen::Index(j)).data());
  }

  /// The operands' cotangents taken back through the score gauge (contents_bar) and into the
  /// head's matrices' gradients: q = G Q y, k = G K y, z = G y | y | A y (as matrix products
  /// over the sources' rows).
  void gather_sources(const std::vector<double>& query_bar, const std::vector<double>& key_bar,
                      ContentCotangents& contents_bar, HeadNumbers& head_gradient) const {
    const std::size_t n = model_.n, od = operands_.d, sources = operands_.sources;
    const Matrix& contents = contents_;
    score_rows_back(query_bar, n, contents_bar.query_back);
    score_rows_back(key_bar, sources, contents_bar.key_back);
    add_product(true, contents_bar.query_back, contents.topRows(Eigen::Index(n)),
                head_gradient.query);
    add_product(true, contents_bar.key_back, contents, head_gradient.key);
    if (!form_.transported && !head_.value_identity) {
      const Eigen::Index rv = head_.value.rows();
      add_product(true, rows(contents_bar.value_bar.data(), sources, od).leftCols(rv), contents,
                  head_gradient.value);
    }
  }

  /// The operands' tangents from the contents' (y_dot, the prefix's) and the matrices' (as
  /// matrix products over the sources' rows, then each row's gauge).
  void spread_sources(const Matrix& content_dots, const HeadNumbers* head_tangent,
                      std::vector<double>& query_dot, std::vector<double>& key_dot,
                      std::vector<double>& value_dot) const {
    const std::size_t n = model_.n, d = model_.d, od = operands_.d, sources = operands_.sources;
    const Matrix& contents = contents_;
    // Q_h y_dot + Q_dot y, then G_j.
    auto score_dots = [&](const Matrix& m, const Matrix* m_dot, std::size_t count,
                          std::vector<double>& out) {
      Matrix products = Matrix::Zero(Eigen::Index(count), m.rows());
      add_product(false, content_dots.topRows(Eigen::Index(count)), Matrix(m.transpose()),
                  products);
      if (m_dot)
        add_product(false, contents.topRows(Eigen::Index(count)), Matrix(m_dot->transpose()),
                    products);
      for (std::size_t j = 0; j < count; ++j)
        score_apply(j, products.row(Eigen::Index(j)).data(), out.data() + j * od);
    };
    score_dots(head_.query, head_tangent ? &head_tangent->query : nullptr, n, query_dot);
    score_dots(head_.key, head_tangent ? &head_tangent->key : nullptr, sources, key_dot);
    if (form_.transported) {
      for (std::size_t j = 0; j < sources; ++j)
        model_.gauge->apply(j, content_dots.row(Eigen::Index(j)).data(), value_dot.data() + j * od);
    } else if (head_.value_identity) {
      rows(value_dot.data(), sources, od).leftCols(Eigen::Index(d)) = content_dots;
    } else {
      const Eigen::Index rv = head_.value.rows();
      Matrix products = Matrix::Zero(content_dots.rows(), rv);
      add_product(false, content_dots, Matrix(head_.value.transpose()), products);
      if (head_tangent)
        add_product(false, contents, Matrix(head_tangent->value.transpose()), products);
      rows(value_dot.data(), sources, od).leftCols(rv) = products;
    }
  }

  const Model& model_;
  const AttentionHead& head_;
  const HeadNumbers& layout_;
  host::HeadOperands form_;
  const Matrix& contents_;  ///< the layer's source_contents
  bool sinkhorn_ = model_.normalization == Normalization::Sinkhorn;
  const PairPasses* passes_;  ///< SA's and USA's pair passes; null: pair by pair here
  const Gauge* score_gauge_;
  bool full_map_;  ///< u = V_h t (transported, or values that are the contents), else O_h t
  Matrix map_;     ///< V_h (d x d) or O_h (d x rv; I where the head has none)
  Matrix map_transposed_;
  host::TokenOperands operands_;
  std::vector<double> t_;
  std::vector<double> offset_;  ///< SA's (take_offsets); empty: none
  std::unique_ptr<HeadPairs> pairs_;  ///< the operands and the forward pass's N_i and u_pre_i
  bool has_pair_terms_ = model_.pair_terms.any();
  bool rescaled_ = model_.time_scale == TimeScale::Rescaled;  ///< l_ij carries -beta (d/dbeta: s_ij - 1)
  bool has_factor_numbers_ = factor_numbers_count(model_.pair_terms) > 0;
  SinkhornTape tape_;
  /// The derivatives' arrays, kept from call to call (a head's VJP or JVP runs on one thread;
  /// each refills what it reads).
  struct Scratch {
    std::vector<double> query, key, value, every_u_bar, source_logit, log_presence_dot,
        numerator_dot, sum_dot;
    Matrix zeroed, map_gradient, t_bar;
  };
  mutable Scratch scratch_;
};

/// The set of replica r in `numbers` (per-replica sets: r's; shared: the one).
template <class Numbers>
auto& set_of(const Model& model, Numbers& numbers, std::size_t r) {
  return numbers.sets[model.matrices.size() > 1 ? r : 0];
}

}  // namespace

namespace {

/// body(h) for every head: the heads side by side on the passes' threads where there are
/// several and the pairs are many (each head's passes then run on one thread), else one after
/// the other. Each head writes only its own results, which the caller adds in head order, so
/// the bits do not depend on the thread count. The first exception is rethrown.
template <class Body>
void each_head(const Model& model, std::size_t heads, const PairPasses* passes, Body&& body) {
  const double pairs = double(model.n) * double(model.n) * double(heads);
  const int team = passes && heads > 1 && pairs >= kHeadsSideBySidePairs
                       ? int(std::min<std::size_t>(std::size_t(passes->threads()), heads))
                       : 1;
  if (team == 1) {  // no region: each head's passes then take their own team
    for (std::size_t h = 0; h < heads; ++h) body(h);
    return;
  }
  std::exception_ptr failure;
#pragma omp parallel for schedule(dynamic, 1) num_threads(team)
  for (std::size_t h = 0; h < heads; ++h) {
    try {
      body(h);
    } catch (...) {
#pragma omp critical(mfattn_head_failure)
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

/// body(first, count) for every block of kContentRows of `count` rows: side by side on the
/// passes' threads where the rows are many. Each block's rows are its own, whichever thread
/// takes it, so the bits do not depend on the thread count.
constexpr std::size_t kContentRows = 256;
template <class Body>
void each_row_block(std::size_t count, const PairPasses* passes, Body&& body) {
  const std::size_t blocks = (count + kContentRows - 1) / kContentRows;
  const int team = passes && blocks > 1 ? passes->threads() : 1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(team)
  for (std::size_t b = 0; b < blocks; ++b)
    body(b * kContentRows, std::min(kContentRows, count - b * kContentRows));
}

/// One head's share of the VJP's numbers outside the head's matrices (beta, the presences,
/// the factor's), which several heads add to.
struct HeadShare {
  FieldNumbers numbers;
  explicit HeadShare(const FieldNumbers& like) {
    numbers.prefix.assign(like.prefix.size(), 0.0);
    numbers.presence.assign(like.presence.size(), 0.0);
    numbers.factor.assign(like.factor.size(), 0.0);
  }
  void add_to(FieldNumbers& to) const {
    to.beta += numbers.beta;
    for (std::size_t e = 0; e < numbers.prefix.size(); ++e) to.prefix[e] += numbers.prefix[e];
    for (std::size_t e = 0; e < numbers.presence.size(); ++e) to.presence[e] += numbers.presence[e];
    for (std::size_t e = 0; e < numbers.factor.size(); ++e) to.factor[e] += numbers.factor[e];
  }
};

}  // namespace

/// Every head of replica r, and F = sum_h u^(h) + f(y) (n x d), at the states take() is given.
struct ReplicaLayer {
  const AttentionMatrices& set;
  LayerNumbers layout;
  Matrix contents;  ///< take_source_contents(y), which every head's matrix products read
  std::vector<std::unique_ptr<HeadDerivative>> heads;
  std::vector<double> field;
  /// The derivatives' arrays of the layer, kept from call to call.
  std::vector<double> field_bar, field_dot;
  std::vector<ContentCotangents> contents_bar;
  std::vector<OutputTangents> outputs;
  Matrix content_dots;

  ReplicaLayer(const Model& model, std::size_t r, const PairPasses* passes)
      : set(model.matrices_of(r)), layout(layer_numbers(set)), heads(set.heads.size()),
        contents_bar(set.heads.size()), outputs(set.heads.size()) {
    for (std::size_t h = 0; h < heads.size(); ++h)
      heads[h] = std::make_unique<HeadDerivative>(model, set.heads[h], layout.heads[h], contents,
                                                  passes);
  }

  /// The forward pass of every head at the states y, and F.
  void take(const Model& model, const double* y, const PairPasses* passes) {
    take_source_contents(model, y, contents);
    each_head(model, heads.size(), passes, [&](std::size_t h) { heads[h]->take(y); });
    field.assign(model.n * model.d, 0.0);
    // Each receiver's row takes the heads in order.
    each_row_block(model.n, passes, [&](std::size_t first, std::size_t count) {
      for (const auto& head : heads) head->add_output(field.data(), first, count);
    });
    std::vector<double> hidden(set.mlp.width());
    for (std::size_t i = 0; i < model.n; ++i) host::add_feed_forward(set.mlp, y + i * model.d, hidden.data(),
                                                                     field.data() + i * model.d);
  }
};

DerivativeTape::DerivativeTape(const Model& model, std::size_t replica_count, const double* states,
                               const PairPasses* pair_passes)
    : replicas(replica_count), y(nullptr), passes(pair_passes) {
  for (std::size_t r = 0; r < replicas; ++r)
    layers.push_back(std::make_unique<ReplicaLayer>(model, r, passes));
  take(model, states);
}

void DerivativeTape::take(const Model& model, const double* states) {
  y = nullptr;  // (unusable until every layer has its forward pass)
  for (std::size_t r = 0; r < replicas; ++r)
    layers[r]->take(model, states + r * model.n * model.d, passes);
  y = states;
}

DerivativeTape::~DerivativeTape() = default;

void DerivativeTape::output(const Model& model, double* a) const {
  const std::size_t n = model.n, d = model.d;
  for (std::size_t r = 0; r < replicas; ++r)
    for (std::size_t i = 0; i < n; ++i) {
      const double p = model.receiver_speed(i);
      for (std::size_t c = 0; c < d; ++c) a[(r * n + i) * d + c] = p * layers[r]->field[i * d + c];
    }
}

void reference_output_vjp(const Model& model, const DerivativeTape& tape,
                          const double* output_cotangent, double* y_cotangent,
                          FieldNumbers& gradient) {
  const std::size_t n = model.n, d = model.d, replicas = tape.replicas;
  const double* y = tape.y;
  std::fill(y_cotangent, y_cotangent + replicas * n * d, 0.0);
  for (std::size_t r = 0; r < replicas; ++r) {
    const double* yr = y + r * n * d;
    const double* a_bar = output_cotangent + r * n * d;
    double* y_bar = y_cotangent + r * n * d;
    ReplicaLayer& layer = *tape.layers[r];
    LayerNumbers& set_gradient = set_of(model, gradient, r);
    // a_i = p_i F_i: F's cotangent p_i a_bar_i, and p_i's <a_bar_i, F_i> (a null token's p_i
    // is a label).
    std::vector<double>& field_bar = layer.field_bar;
    field_bar.resize(n * d);
    for (std::size_t i = 0; i < n; ++i) {
      const double p = model.receiver_speed(i);
      for (std::size_t c = 0; c < d; ++c) field_bar[i * d + c] = p * a_bar[i * d + c];
      if (p > 0.0) gradient.presence[i] += dot(a_bar + i * d, layer.field.data() + i * d, d);
    }
    const FeedForward& mlp = layer.set.mlp;
    if (!mlp.empty()) {
      std::vector<double> hidden(2 * mlp.width());
      const kernels::FeedForwardArrays<double> arrays{set_gradient.w1.data(), set_gradient.b1.data(), set_gradient.w2.data(),
                                              set_gradient.b2.data()};
      for (std::size_t i = 0; i < n; ++i)
        kernels::feed_forward_vjp(mlp.w1.data(), mlp.b1.data(), mlp.w2.data(), int(mlp.width()), int(d), mlp.activation,
                                  yr + i * d, field_bar.data() + i * d, hidden.data(), y_bar + i * d, arrays);
    }
    const std::size_t heads = layer.heads.size();
    std::vector<HeadShare> shares(heads, HeadShare(gradient));
    std::vector<ContentCotangents>& contents_bar = layer.contents_bar;
    each_head(model, heads, tape.passes, [&](std::size_t h) {
      layer.heads[h]->vjp(field_bar.data(), contents_bar[h], set_gradient.heads[h],
                          shares[h].numbers);
    });
    for (const HeadShare& share : shares) share.add_to(gradient);
    // The contents' cotangents: each row takes the heads in order.
    each_row_block(n + model.prefix_count(), tape.passes, [&](std::size_t first, std::size_t count) {
      for (std::size_t h = 0; h < heads; ++h)
        layer.heads[h]->add_contents_bar(contents_bar[h], first, count, y_bar,
                                         gradient.prefix.data());
    });
  }
}

void reference_output_jvp(const Model& model, const DerivativeTape& tape, const double* y_tangent,
                          const FieldNumbers* tangent, double* output_tangent) {
  const std::size_t n = model.n, d = model.d, replicas = tape.replicas;
  const double* y = tape.y;
  for (std::size_t r = 0; r < replicas; ++r) {
    const double* yr = y + r * n * d;
    const double* y_dot = y_tangent + r * n * d;
    double* a_dot = output_tangent + r * n * d;
    ReplicaLayer& layer = *tape.layers[r];
    const LayerNumbers* set_tangent = tangent ? &set_of(model, *tangent, r) : nullptr;
    std::vector<double>& field_dot = layer.field_dot;
    field_dot.assign(n * d, 0.0);
    const FeedForward& mlp = layer.set.mlp;
    if (!mlp.empty()) {
      std::vector<double> hidden(2 * mlp.width());
      kernels::FeedForwardArrays<const double> arrays;
      if (set_tangent)
        arrays = {set_tangent->w1.data(), set_tangent->b1.data(), set_tangent->w2.data(), set_tangent->b2.data()};
      for (std::size_t i = 0; i < n; ++i)
        kernels::feed_forward_jvp(mlp.w1.data(), mlp.b1.data(), mlp.w2.data(), int(mlp.width()), int(d), mlp.activation,
                                  yr + i * d, y_dot + i * d, arrays, hidden.data(), field_dot.data() + i * d);
    }
    // The contents' tangents (sources x d): y_dot's rows, then the prefix's (0 without a tangent).
    const std::size_t prefix = model.prefix_count();
    Matrix& content_dots = layer.content_dots;
    content_dots.resize(Eigen::Index(n + prefix), Eigen::Index(d));
    content_dots.topRows(Eigen::Index(n)) = rows(y_dot, n, d);
    if (tangent && prefix > 0)
      content_dots.bottomRows(Eigen::Index(prefix)) = rows(tangent->prefix.data(), prefix, d);
    else content_dots.bottomRows(Eigen::Index(prefix)).setZero();
    const std::size_t heads = layer.heads.size();
    std::vector<OutputTangents>& outputs = layer.outputs;
    each_head(model, heads, tape.passes, [&](std::size_t h) {
      layer.heads[h]->jvp(content_dots, tangent, set_tangent ? &set_tangent->heads[h] : nullptr,
                          outputs[h]);
    });
    // Each receiver's row takes the heads in order.
    each_row_block(n, tape.passes, [&](std::size_t first, std::size_t count) {
      for (std::size_t h = 0; h < heads; ++h)
        layer.heads[h]->add_field_dot(outputs[h], first, count, field_dot.data());
    });
    // a_i = p_i F_i: p_i F_dot_i + p_dot_i F_i.
    for (std::size_t i = 0; i < n; ++i) {
      const double p = model.receiver_speed(i);
      const double p_dot = tangent && p > 0.0 ? tangent->presence[i] : 0.0;
      for (std::size_t c = 0; c < d; ++c)
        a_dot[i * d + c] = p * field_dot[i * d + c] + p_dot * layer.field[i * d + c];
    }
  }
}

}  // namespace mfattn::detail
