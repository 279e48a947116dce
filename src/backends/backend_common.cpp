#include "backends/backend_common.hpp"

#include "backends/reference/reference_sinkhorn.hpp"
#include "backends/token_operands.hpp"
#include "kernels/attention_statistics.hpp"

#include <algorithm>
#include <iterator>
#include <limits>
#include <omp.h>
#include <sstream>
#include <vector>

namespace mfattn {

double energy_from_weight_sums(const Model& model, const double* x, const double* weight_sums,
                               std::size_t replica) {
  if (model.beta == 0.0) return std::numeric_limits<double>::quiet_NaN();  // 1 / (2 beta)
  const double mass = model.mass();
  double total = 0.0;
  for (std::size_t i = 0; i < model.n; ++i) total += model.presence[i] * weight_sums[i];
  // Prefix tokens are receivers of the energy's double sum although they never move: their
  // rows are taken here, pair by pair (P (n + P) pairs per frame).
  const std::size_t prefix = model.prefix_count(), sources = model.n + prefix;
  if (prefix > 0) {
    // A layer's energy is the sum of its heads' (docs/model.md section 2b).
    const AttentionMatrices& matrices = model.matrices_of(replica);
    thread_local host::TokenOperands operands;
    const double shift = model.exponent_shift();
    for (const AttentionHead& head : matrices.heads) {
      host::prepare_head_operands(host::HeadOperands(model, head), x, operands);
      for (std::size_t p = model.n; p < sources; ++p) {
        const double* query = operands.query(p);
        double row = 0.0;
        for (std::size_t j = 0; j < sources; ++j) {
          const kernels::PairWeightTerms<double> terms = host::model_pair_weight_terms(model, p, j);
          if (!kernels::visible(terms)) continue;
          const double* key = operands.key(j);
          double score = 0.0;
          for (std::size_t c = 0; c < operands.d; ++c) score += query[c] * key[c];
          row += operands.presence[j] * kernels::weight_factor(terms) *
                 std::exp(model.beta * score - shift);
        }
        total += model.prefix_weight * row;
      }
    }
  }
  return total / (2.0 * model.beta * mass * mass);
}

namespace {

/// One head's log-weights l_ij = beta <q_i, k_j> + b_j + log(m_ij c_ij) of one replica's layer,
/// row by row, from which every receiver's normalised plan is taken (the statistics and the
/// plans themselves): b_j = log p_j, or for Sinkhorn's plan log p_j + g_j with g_j its column
/// scaling (a row's own scaling f_i drops out of its normalised plan). The scaling is the
/// reference backend's, pair by pair, each pass spread over the threads: O(n^2) a sweep.
class HeadLogits {
 public:
  HeadLogits(const Model& model, const AttentionHead& head, const double* read) : model_(model) {
    host::prepare_head_operands(host::HeadOperands(model, head), read, operands_);
    bias_ = operands_.log_presence;
    if (model.normalization == Normalization::Sinkhorn)
      bias_ = detail::ReferenceSinkhorn(model, operands_, omp_get_max_threads()).slot().row_bias;
  }
  std::size_t sources() const { return model_.n + model_.prefix_count(); }
  /// visit(j, l_ij) for every source j that receiver i sees with positive presence.
  template <class Visit>
  void row(std::size_t i, Visit&& visit) const {
    const double* query = operands_.query(i);
    for (std::size_t j = 0; j < sources(); ++j) {
      if (!(operands_.presence[j] > 0.0)) continue;
      const kernels::PairWeightTerms<double> terms = host::model_pair_weight_terms(model_, i, j);
      if (!kernels::visible(terms)) continue;
      const double* key = operands_.key(j);
      double score = 0.0;
      for (std::size_t c = 0; c < operands_.d; ++c) score += query[c] * key[c];
      visit(j, model_.beta * score + bias_[j] + terms.log_term);
    }
  }

 private:
  const Model& model_;
  host::TokenOperands operands_;
  std::vector<double> bias_;
};

}  // namespace

std::vector<PlanSummary> attention_plan_summaries(const Model& model, const double* read,
                                                  std::size_t replica) {
  const AttentionMatrices& matrices = model.matrices_of(replica);
  std::vector<PlanSummary> summaries;
  for (const AttentionHead& head : matrices.heads) {
    const HeadLogits logits(model, head, read);
    struct Moments {
      double sum = 0.0, low = std::numeric_limits<double>::infinity(),
             high = -std::numeric_limits<double>::infinity();
      void add(double v) {
        sum += v;
        low = std::min(low, v);
        high = std::max(high, v);
      }
    } entropy, largest, participation;
    // Each receiver's plan on its own (rows spread over the threads), then the summaries in
    // receiver order: the same numbers for any thread count.
    std::vector<double> row_entropy(model.n), row_largest(model.n), row_participation(model.n);
    std::vector<char> sees(model.n, 0);
#pragma omp parallel for schedule(dynamic, 16)
    for (std::int64_t row = 0; row < std::int64_t(model.n); ++row) {
      const auto i = std::size_t(row);
      if (!(model.presence[i] > 0.0)) continue;
      kernels::PlanStatistics plan(0, 0);
      logits.row(i, [&](std::size_t, double logit) { plan.add(logit, nullptr); });
      if (plan.sources == 0) continue;  // a receiver that sees no source
      sees[i] = 1;
      row_entropy[i] = plan.entropy();
      row_largest[i] = plan.largest_weight();
      row_participation[i] = plan.participation();
    }
    std::size_t receivers = 0;
    for (std::size_t i = 0; i < model.n; ++i) {
      if (!sees[i]) continue;
      ++receivers;
      entropy.add(row_entropy[i]);
      largest.add(row_largest[i]);
      participation.add(row_participation[i]);
    }
    const double nan = std::numeric_limits<double>::quiet_NaN(), count = double(receivers);
    auto summary = [&](const Moments& m, double(&out)[3]) {
      out[0] = receivers ? m.sum / count : nan;
      out[1] = receivers ? m.low : nan;
      out[2] = receivers ? m.high : nan;
    };
    PlanSummary s;
    summary(entropy, s.entropy);
    summary(largest, s.largest_weight);
    summary(participation, s.participation);
    summaries.push_back(s);
  }
  return summaries;
}

void attention_plan(const Model& model, const double* read, std::size_t replica, std::size_t head,
                    double* plan) {
  const HeadLogits logits(model, model.matrices_of(replica).heads.at(head), read);
  const std::size_t sources = logits.sources();
  std::fill(plan, plan + model.n * sources, 0.0);
#pragma omp parallel for schedule(dynamic, 16)
  for (std::int64_t row = 0; row < std::int64_t(model.n); ++row) {
    const auto i = std::size_t(row);
    if (!(model.presence[i] > 0.0)) continue;
    double* out = plan + i * sources;
    // One pass over the pairs: the log-weights (-inf where hidden), and their largest, so that
    // no exponential overflows.
    constexpr double kHidden = -std::numeric_limits<double>::infinity();
    std::fill(out, out + sources, kHidden);
    double largest = kHidden;
    logits.row(i,
               [&](std::size_t j, double logit) { largest = std::max(largest, out[j] = logit); });
    if (largest == kHidden) {  // sees no source
      std::fill(out, out + sources, 0.0);
      continue;
    }
    double total = 0.0;
    for (std::size_t j = 0; j < sources; ++j) total += out[j] = std::exp(out[j] - largest);
    for (std::size_t j = 0; j < sources; ++j) out[j] /= total;
  }
}

namespace {

// The factory of kBackendNames[i] (include/mfattn/backends/backend.hpp) at index i.
using BackendFactory = std::unique_ptr<Backend> (*)(const Model&, const BackendOptions&);
constexpr BackendFactory kBackendFactories[] = {make_cpu_backend, make_reference_backend,
                                                make_cuda_backend};
static_assert(std::size(kBackendFactories) == std::size(kBackendNames),
              "every backend in kBackendNames needs its factory here, at the same index");

}  // namespace

std::unique_ptr<Backend> make_backend(const std::string& name, const Model& model,
                                      const BackendOptions& options) {
  for (std::size_t i = 0; i < std::size(kBackendNames); ++i) {
    if (name != kBackendNames[i].name) continue;
    // --evaluation: the series replaces the entry's pair loop where it is asked for, or where
    // auto finds that it applies and that n is large enough to pay.
    if (options.evaluation != PairEvaluation::Direct) {
      if (!kBackendNames[i].takes_series) {
        if (options.evaluation == PairEvaluation::Fourier)
          throw BackendUnavailable("--evaluation fourier: runs on the host, not --backend " + name);
      } else if (const std::string refusal = fourier_evaluation_refusal(model); !refusal.empty()) {
        if (options.evaluation == PairEvaluation::Fourier) throw BackendUnavailable(refusal);
      } else if (options.evaluation == PairEvaluation::Fourier ||
                 model.n >= fourier_from_tokens(model, options.evaluation_tol)) {
        return make_fourier_backend(model, options);
      }
    }
    // What the entry declares it takes (a model built in code; validate() refuses options so).
    const std::string refusal = capability_refusal("--backend " + name, kBackendNames[i].takes, ModelKinds::of(model));
    if (!refusal.empty()) throw BackendUnavailable(refusal);
    return kBackendFactories[i](model, options);
  }
  const std::string accepted = backend_names_text(", ");
  throw BackendUnavailable("--backend " + name + ": unknown backend (accepted: " + accepted + ")");
}

std::string described_loop(const Backend& backend) {
  const std::string description = backend.describe();
  const std::string key = "loop ";
  if (description.rfind(key, 0) != 0) return "";
  const std::size_t end = description.find(' ', key.size());
  return description.substr(key.size(), end == std::string::npos ? std::string::npos : end - key.size());
}

namespace detail {

double receiver_scale(const Model& model, double log_max) {
  return std::exp(log_max - model.exponent_shift());
}

double finish_receiver(const Model& model, const AttentionMatrices& matrices, double mass,
                       std::size_t token, const double* x_i, double log_max,
                       double weight_sum_shifted, const double* acc, ReceiverOutput out,
                       double* scratch) {
  // The scale exp(log_max - shift) enters USA's u_i, eps_den's share and D_i; SA without
  // eps_den needs it for D_i only.
  const bool needs_scale = kernels::finish_needs_scale(finish_terms(model, mass), out.weight_sum_wanted);
  return finish_receiver(model, matrices, mass, token, x_i, log_max,
                         needs_scale ? receiver_scale(model, log_max) : 1.0, weight_sum_shifted, acc, out,
                         scratch);
}

double finish_receiver(const Model& model, const AttentionMatrices& matrices, double mass,
                       std::size_t token, const double* x_i, double log_max, double scale,
                       double weight_sum_shifted, const double* acc, ReceiverOutput out,
                       double* scratch) {
  const kernels::FinishTerms terms = finish_terms(model, mass);
  const bool transported = model.gauge && model.values == ValueTransport::Transported;
  // The one head's V_h = V, applied once to the sums of the values (A_h = I).
  const AttentionHead& head = matrices.heads.front();
  const kernels::FinishOutcome outcome = kernels::finish_sums(
      terms, model.receiver_speed(token), int(model.d), x_i, log_max, scale, weight_sum_shifted, acc,
      head.full_value_identity ? nullptr : head.full_value.data(), out.velocity, out.attention_output, scratch,
      [&](const double* in, double* rotated) {
        if (transported) model.gauge->apply_transpose(token, in, rotated);
        return transported;
      });
  if (outcome.overflow) throw NumericalError(usa_overflow_message(model, outcome.log_scale));
  return outcome.weight_sum;
}

kernels::FinishTerms finish_terms(const Model& model, double mass) {
  return {model.normalization == Normalization::Usa, model.exponent_shift(), model.eps_den, mass};
}

std::string usa_overflow_message(const Model& model, double log_scale) {
  std::ostringstream message;
  message << "USA weights overflow double (exponent up to " << log_scale << " > 709.78)";
  if (model.time_scale == TimeScale::Natural && model.beta > 0)
    message << "; use --time-scale rescaled, which divides every weight by exp(beta)";
  else if (model.beta < 0)
    message << "; a repulsive beta weighs the far sources by up to exp(|beta| |Q x| |K y|): take a "
               "smaller |beta| or --kernel sa";
  return message.str();
}

}  // namespace detail
}  // namespace mfattn
