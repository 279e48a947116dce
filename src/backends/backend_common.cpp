#include "backends/backend_common.hpp"

#include "kernels/token_operands.hpp"

#include <algorithm>
#include <iterator>
#include <sstream>
#include <vector>

namespace mfattn {

double energy_from_weight_sums(const Model& model, const double* x, const double* weight_sums,
                               std::size_t replica) {
  if (model.beta <= 0.0) return std::numeric_limits<double>::quiet_NaN();
  const double mass = model.mass();
  double total = 0.0;
  for (std::size_t i = 0; i < model.n; ++i) total += model.presence[i] * weight_sums[i];
  // Prefix tokens are receivers of the energy's double sum although they never move: their
  // rows are taken here, pair by pair (P (n + P) pairs per frame).
  const std::size_t prefix = model.prefix_count(), sources = model.n + prefix, d = model.d;
  if (prefix > 0) {
    thread_local kernels::TokenOperands operands;
    kernels::prepare_token_operands(model, model.matrices_of(replica), x, operands);
    const kernels::PairTermParameters terms = kernels::pair_term_parameters(model);
    const double shift = model.exponent_shift();
    for (std::size_t p = model.n; p < sources; ++p) {
      const double* query = operands.query(p);
      double row = 0.0;
      for (std::size_t j = 0; j < sources; ++j) {
        const kernels::ScalarPair pair = kernels::scalar_pair(model, p, j);
        if (!kernels::pair_visible(terms, pair, kernels::prompt_rule_applies(model, p, j))) continue;
        const double* key = operands.key(j);
        double score = 0.0;
        for (std::size_t c = 0; c < d; ++c) score += query[c] * key[c];
        row += operands.presence[j] * kernels::pair_factor(terms, pair) *
               std::exp(model.beta * score - shift);
      }
      total += model.prefix_weight * row;
    }
  }
  return total / (2.0 * model.beta * mass * mass);
}

namespace {

// The factory of kBackendNames[i] (include/mfattn/backend.hpp) at index i.
using BackendFactory = std::unique_ptr<Backend> (*)(const Model&, const BackendOptions&);
constexpr BackendFactory kBackendFactories[] = {make_cpu_backend, make_reference_backend,
                                                make_cuda_backend};
static_assert(std::size(kBackendFactories) == std::size(kBackendNames),
              "every backend in kBackendNames needs its factory here, at the same index");

}  // namespace

std::unique_ptr<Backend> make_backend(const std::string& name, const Model& model,
                                      const BackendOptions& options) {
  for (std::size_t i = 0; i < std::size(kBackendNames); ++i)
    if (name == kBackendNames[i].name) return kBackendFactories[i](model, options);
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
  return finish_receiver(model, matrices, mass, token, x_i, log_max, receiver_scale(model, log_max),
                         weight_sum_shifted, acc, out, scratch);
}

double finish_receiver(const Model& model, const AttentionMatrices& matrices, double mass,
                       std::size_t token, const double* x_i, double log_max, double scale,
                       double weight_sum_shifted, const double* acc, ReceiverOutput out,
                       double* scratch) {
  const std::size_t d = model.d;
  const double p_i = model.presence[token];
  auto stay = [&] {
    std::fill(out.velocity, out.velocity + d, 0.0);
    if (out.attention_output) std::fill(out.attention_output, out.attention_output + d, 0.0);
  };
  if (log_max == -std::numeric_limits<double>::infinity()) {
    // No source with weight is visible: the receiver does not move.
    stay();
    return 0.0;
  }
  // True weights are exp(log_max - shift) times the shifted ones; the sums are combined in
  // log space where the plain product would overflow although the result does not.
  const double log_scale = log_max - model.exponent_shift();
  const double weight_sum = std::isfinite(scale) ? scale * weight_sum_shifted
                                                 : std::exp(log_scale + std::log(weight_sum_shifted));
  if (p_i == 0.0) {
    // A null receiver does not move, whatever its sums.
    stay();
    return weight_sum;
  }
  double* u_pre = scratch;
  double* u = scratch + d;
  if (model.normalization == Normalization::Usa) {
    const double factor = scale / mass;
    bool finite = true;
    for (std::size_t c = 0; c < d; ++c) {
      u_pre[c] = std::isfinite(factor)
                     ? factor * acc[c]
                     : std::copysign(std::exp(log_scale + std::log(std::fabs(acc[c]) / mass)), acc[c]);
      finite = finite && std::isfinite(u_pre[c]);
    }
    if (!finite) {
      std::ostringstream message;
      message << "USA weights overflow double (exponent up to " << log_scale << " > 709.78)";
      if (model.time_scale == TimeScale::Natural)
        message << "; use --time-scale rescaled, which divides every weight by exp(beta)";
      throw NumericalError(message.str());
    }
  } else {
    // eps_den is compared with the true weight sum: eps + scale * S = scale * (eps/scale + S).
    const double denominator =
        weight_sum_shifted + (model.eps_den > 0.0 ? model.eps_den / scale : 0.0);
    for (std::size_t c = 0; c < d; ++c) u_pre[c] = acc[c] / denominator;
  }
  // u = V G_i^T u_pre (transported values) or V u_pre (plain values).
  const double* rotated = u_pre;
  if (model.gauge && model.values == ValueTransport::Transported) {
    model.gauge->apply_transpose(token, u_pre, u);
    std::copy(u, u + d, u_pre);
  }
  if (!matrices.v_identity) {
    for (std::size_t r = 0; r < d; ++r) {
      double sum = 0.0;
      for (std::size_t c = 0; c < d; ++c) sum += matrices.v(r, c) * rotated[c];
      u[r] = sum;
    }
    rotated = u;
  }
  double radial = 0.0;
  for (std::size_t c = 0; c < d; ++c) radial += x_i[c] * rotated[c];
  for (std::size_t c = 0; c < d; ++c) out.velocity[c] = p_i * (rotated[c] - radial * x_i[c]);
  if (out.attention_output)
    for (std::size_t c = 0; c < d; ++c) out.attention_output[c] = p_i * rotated[c];
  return weight_sum;
}

}  // namespace detail
}  // namespace mfattn
