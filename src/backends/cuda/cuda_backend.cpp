// The CUDA backend (docs/cuda.md). Per evaluation:
//   1. the host forms every token's operands with the kernels layer (token_operands.hpp:
//      the gauge, Q, K and the values once per token) and each receiver's Cauchy-Schwarz
//      offset B_i = |q_i| max_j |k_j| + max(0, max_j log p_j), in base 2, as the CPU backend;
//   2. the engine (a CUDA device, or the host's emulation of it) sums every receiver's
//      S_i = sum_j c_ij 2^(t_ij - B_i) and A_i = sum_j c_ij 2^(t_ij - B_i) z_j;
//   3. a receiver whose offset was too loose (S_i below 1e-250 in fp64, 2^-60 in fp32) is
//      summed again with its exact maximum (the engine's exact pass);
//   4. the host finishes each receiver with detail::finish_receiver, the CPU backend's own
//      (V, G_i^T, the normaliser, the projection, USA overflow), in double.
// The host's share is O(R (n + P) d^2) per evaluation against the device's O(R n (n + P) d).
#include "backends/cuda/cuda_backend.hpp"

#include <omp.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <sstream>

#include "backends/backend_common.hpp"
#include "backends/cuda/sums_engine.hpp"
#include "backends/model_sources.hpp"
#include "backends/token_operands.hpp"

namespace mfattn {
namespace cuda {
namespace {

/// Why the CUDA backend cannot take the model ("" when it can), naming the option.
std::string refusal(const Model& model) {
  std::ostringstream why;
  const bool terms = model.pair_terms.any();
  if (model.d > std::size_t(kMaxDim))
    why << "--backend cuda: --d " << model.d << " is above " << kMaxDim
        << ", the largest d the CUDA pair loop takes (use --backend cpu)";
  else if (terms && model.position_dim > std::size_t(kMaxPositionDim))
    why << "--backend cuda: positions of " << model.position_dim
        << " coordinates with a mask or auxiliary factor; the CUDA pair loop reads at most "
        << kMaxPositionDim << " (use --backend cpu)";
  else if (model.n + model.prefix_count() > std::size_t(INT_MAX))
    why << "--backend cuda: more than " << INT_MAX << " sources per replica";
  return why.str();
}

template <class Real>
class ResidentSteps;

template <class Real>
class CudaBackend final : public Backend {
 public:
  static constexpr bool kFloat = std::is_same_v<Real, float>;
  /// Offsets looser than this leave a sum below it: the exact pass takes the receiver.
  static constexpr double kLooseBound = kFloat ? 0x1p-60 : 1e-250;

  /// The model must have passed refusal() (make_with checks it before making the engine).
  CudaBackend(const Model& model, int threads, std::unique_ptr<SumsEngine<Real>> engine, bool emulated)
      : model_(model), threads_(threads > 0 ? threads : omp_get_max_threads()), mass_(model.mass()),
        engine_(std::move(engine)), emulated_(emulated) {
    const std::size_t n = model.n, sources = n + model.prefix_count(), k = model.position_dim;
    args_.n = int(n);
    args_.sources = int(sources);
    args_.d = int(model.d);
    args_.position_dim = int(k);
    args_.terms = model.pair_terms;
    args_.has_terms = model.pair_terms.any();
    bias_.resize(sources);
    largest_bias_ = 0.0;
    for (std::size_t j = 0; j < sources; ++j) {
      const double log_p = kernels::log_presence(host::source_presence(model, j));
      bias_[j] = Real(log_p * kLog2e);
      if (log_p > -INFINITY) largest_bias_ = std::max(largest_bias_, log_p);
    }
    if (args_.has_terms) {
      positions_.resize(sources * k);
      prompts_.resize(sources);
      for (std::size_t j = 0; j < sources; ++j) {
        std::copy_n(host::source_position(model, j), k, positions_.data() + j * k);
        prompts_[j] = host::source_prompt(model, j);
      }
    }
    args_.bias = bias_.data();
    args_.positions = positions_.data();
    args_.prompts = prompts_.data();
  }

  std::string name() const override { return "cuda"; }
  std::string device_name() const override { return engine_->device_name(); }
  /// "loop cuda precision P device NAME exact_receivers K", and for a device its SM count,
  /// clock and the pair rate its arithmetic allows at this d (pair_rate_ceiling).
  std::string describe() const override {
    std::string device = device_name();
    std::replace(device.begin(), device.end(), ' ', '_');
    std::ostringstream text;
    text << "loop cuda precision " << (kFloat ? "float" : "double") << " device " << device
         << " exact_receivers " << exact_receivers_;
    if (const DeviceProperties* properties = engine_->properties())
      text << " sms " << properties->multiprocessors << " clock_mhz " << properties->clock_hz / 1e6
           << " pair_ceiling " << pair_rate_ceiling(*properties, kFloat, model_.d);
    return text.str();
  }

  std::unique_ptr<ResidentStepper> resident_stepper(const FixedStepMethod& method, std::size_t replicas) override;

  void evaluate(std::size_t replicas, const double* x, const FieldOutputs& out) override {
    const std::size_t n = model_.n, d = model_.d, rows = replicas * n;
    prepare(replicas, x);
    engine_->bounded_sums(args_, replicas);
    loose_.clear();
    for (std::size_t row = 0; row < rows; ++row)
      if (!(sums_[row] >= kLooseBound)) loose_.push_back(std::int64_t(row));
    if (!loose_.empty()) engine_->exact_sums(args_, replicas, loose_);
    exact_receivers_ = loose_.size();

    std::string failure;
#pragma omp parallel num_threads(threads_)
    {
      double scratch[2 * kMaxDim];
#pragma omp for schedule(static)
      for (std::size_t row = 0; row < rows; ++row) {
        const std::size_t r = row / n, i = row % n;
        // The offset the sums were taken with, in natural log units (-inf: nothing visible).
        const double log_max = -double(neg_offsets_[row]) * kLn2;
        try {
          const double sum = detail::finish_receiver(
              model_, model_.matrices_of(r), mass_, i, x + row * d, log_max, sums_[row],
              acc_.data() + row * d,
              {out.velocity + row * d, out.attention_output ? out.attention_output + row * d : nullptr,
               out.weight_sums != nullptr},
              scratch);
          if (out.weight_sums) out.weight_sums[row] = sum;
        } catch (const NumericalError& error) {
#pragma omp critical(mfattn_cuda_failure)
          failure = error.what();
        }
      }
    }
    if (!failure.empty()) throw NumericalError(failure);
  }

 private:
  /// Queries, keys, values and offsets of every replica (step 1 of the file comment).
  void prepare(std::size_t replicas, const double* x) {
    const std::size_t n = model_.n, d = model_.d, sources = n + model_.prefix_count();
    queries_.resize(replicas * n * d);
    keys_.resize(replicas * sources * d);
    values_.resize(replicas * sources * d);
    key_norm2_.resize(replicas * sources);
    largest_key_.resize(replicas);
    neg_offsets_.resize(replicas * n);
    sums_.resize(replicas * n);
    acc_.resize(replicas * n * d);
    const double query_scale = model_.beta * kLog2e;
#pragma omp parallel num_threads(threads_)
    {
      double work[2 * kMaxDim];
#pragma omp for schedule(static)
      for (std::size_t unit = 0; unit < replicas * sources; ++unit) {
        const std::size_t r = unit / sources, j = unit % sources;
        const AttentionHead& head = model_.matrices_of(r).heads.front();
        const double* y = host::source_content(model_, x + r * n * d, j);
        if (j < n) {
          const double* query = host::gauged_product(model_, head.query, head.query_identity, j, y, work + d, work);
          for (std::size_t c = 0; c < d; ++c) queries_[(r * n + j) * d + c] = Real(query_scale * query[c]);
        }
        const double* key = host::gauged_product(model_, head.key, head.key_identity, j, y, work + d, work);
        double norm2 = 0.0;
        for (std::size_t c = 0; c < d; ++c) {
          const Real stored = Real(key[c]);
          keys_[unit * d + c] = stored;
          norm2 += double(stored) * double(stored);
        }
        // Null sources stay out of the bound, so that adding them changes no offset.
        key_norm2_[unit] = bias_[j] > Real(-INFINITY) ? norm2 : 0.0;
        const double* value = host::source_value(model_, j, y, work);
        for (std::size_t c = 0; c < d; ++c) values_[unit * d + c] = Real(value[c]);
      }
      // Each replica's largest squared key norm (a maximum: the same on any thread), then
      // the offsets.
#pragma omp for schedule(static)
      for (std::size_t r = 0; r < replicas; ++r) {
        const double* norms = key_norm2_.data() + r * sources;
        largest_key_[r] = std::sqrt(*std::max_element(norms, norms + sources));
      }
#pragma omp for schedule(static)
      for (std::size_t row = 0; row < replicas * n; ++row) {
        double query2 = 0.0;
        for (std::size_t c = 0; c < d; ++c) query2 += double(queries_[row * d + c]) * double(queries_[row * d + c]);
        neg_offsets_[row] = Real(-kernels::cauchy_schwarz_offset(query2, largest_key_[row / n], largest_bias_ * kLog2e));
      }
    }
    args_.queries = queries_.data();
    args_.keys = keys_.data();
    args_.values = values_.data();
    args_.neg_offsets = neg_offsets_.data();
    args_.sums = sums_.data();
    args_.acc = acc_.data();
  }

  const Model& model_;
  int threads_;
  double mass_;
  double largest_bias_ = 0.0;  // max(0, largest log p_j over the present sources)
  std::unique_ptr<SumsEngine<Real>> engine_;
  SumsArgs<Real> args_;
  std::vector<Real> bias_, queries_, keys_, values_, neg_offsets_;
  std::vector<double> positions_, key_norm2_, largest_key_, sums_, acc_;
  std::vector<int> prompts_;
  std::vector<std::int64_t> loose_;
  std::size_t exact_receivers_ = 0;  // the last evaluation's exact-pass receivers
  bool emulated_;  // the engines run on the host (the tests' emulation)

  friend class ResidentSteps<Real>;
};


/// The resident kernel as integrate() drives it (resident_steps.hpp): the model's labels,
/// gauges and prefix packed once, its matrices at every call (a new layer's take effect).
template <class Real>
class ResidentSteps final : public ResidentStepper {
 public:
  ResidentSteps(const CudaBackend<Real>& backend, std::unique_ptr<ResidentEngine<Real>> engine,
                ResidentArgs<Real> args)
      : model_(backend.model_), engine_(std::move(engine)), args_(args) {
    const Model& model = model_;
    const std::size_t d = model.d, sources = std::size_t(args_.sources);
    if (model.gauge) {
      // G_j as a dense matrix: its columns are G_j e_c.
      gauges_.assign(sources * d * d, 0.0);
      std::vector<double> unit(d, 0.0), column(d);
      for (std::size_t j = 0; j < sources; ++j)
        for (std::size_t c = 0; c < d; ++c) {
          unit[c] = 1.0;
          model.gauge->apply(j, unit.data(), column.data());
          unit[c] = 0.0;
          for (std::size_t r = 0; r < d; ++r) gauges_[(j * d + r) * d + c] = column[r];
        }
    }
    args_.presence = model.presence.data();
    // The backend's own label arrays (it outlives its steppers).
    args_.bias = backend.bias_.data();
    args_.positions = backend.positions_.data();
    args_.prompts = backend.prompts_.data();
    args_.prefix = model.prefix.data();
    args_.gauges = model.gauge ? gauges_.data() : nullptr;
    failed_step_.resize(args_.replicas);
    failure_.resize(args_.replicas);
    failure_value_.resize(args_.replicas);
    failure_order_.resize(args_.replicas);
    args_.failure_order = failure_order_.data();
    args_.failed_step = failed_step_.data();
    args_.failure = failure_.data();
    args_.failure_value = failure_value_.data();
  }

  ResidentOutcome advance(double* x, std::int64_t steps_before, std::int64_t steps, double h) override {
    pack_matrices();
    args_.x = x;
    engine_->advance(args_, steps_before, steps, h);
    ResidentOutcome outcome;
    outcome.steps_done = steps;
    for (std::size_t r = 0; r < args_.replicas; ++r)
      if (failed_step_[r] >= 0 && failed_step_[r] < outcome.steps_done) outcome.steps_done = failed_step_[r];
    if (outcome.steps_done == steps) return outcome;
    // The earliest failure of that step (failure_order: where in the step), as the CPU path
    // meets it: a non-finite input before its evaluation, an overflow during it.
    std::size_t first = args_.replicas;
    for (std::size_t r = 0; r < args_.replicas; ++r)
      if (failed_step_[r] == outcome.steps_done && (first == args_.replicas || failure_order_[r] < failure_order_[first]))
        first = r;
    if (failure_order_[first] % 2 == 1 && failure_order_[first] != kAfterStep)
      outcome.numerical_error = detail::usa_overflow_message(model_, failure_value_[first]);
    else
      outcome.non_finite_state = true;
    return outcome;
  }

 private:
  /// Q, K and V of every matrix set's one head, row-major; a factor that is the identity in
  /// every set is passed as null (no product).
  void pack_matrices() {
    const std::size_t d = model_.d;
    const std::size_t sets = model_.matrices.size() > 1 ? args_.replicas : 1;
    args_.matrix_stride = sets > 1 ? d * d : 0;
    auto pack = [&](std::vector<double>& out, auto member, auto identity) -> const double* {
      bool all_identity = true;
      for (std::size_t r = 0; r < sets; ++r) all_identity = all_identity && model_.matrices_of(r).heads.front().*identity;
      if (all_identity) return nullptr;
      out.assign(sets * d * d, 0.0);
      for (std::size_t r = 0; r < sets; ++r) {
        const AttentionHead& head = model_.matrices_of(r).heads.front();
        for (std::size_t a = 0; a < d; ++a)
          for (std::size_t b = 0; b < d; ++b)
            out[(r * d + a) * d + b] = head.*identity ? double(a == b) : (head.*member)(a, b);
      }
      return out.data();
    };
    args_.q = pack(q_, &AttentionHead::query, &AttentionHead::query_identity);
    args_.k = pack(k_, &AttentionHead::key, &AttentionHead::key_identity);
    args_.v = pack(v_, &AttentionHead::full_value, &AttentionHead::full_value_identity);
  }

  const Model& model_;
  std::unique_ptr<ResidentEngine<Real>> engine_;
  ResidentArgs<Real> args_;
  std::vector<double> gauges_, q_, k_, v_, failure_value_;
  std::vector<int> failure_, failure_order_;
  std::vector<long long> failed_step_;
};

/// The resident kernel's method for a fixed-step integrator.
void resident_method(FixedStepKind kind, ResidentMethod& method, kernels::FixedTableau& tableau) {
  method = ResidentMethod::RungeKutta;
  switch (kind) {
    case FixedStepKind::Euler: tableau = kernels::kEulerTableau; break;
    case FixedStepKind::Heun: tableau = kernels::kHeunTableau; break;
    case FixedStepKind::Rk4: tableau = kernels::kRk4Tableau; break;
    case FixedStepKind::EulerUnprojected: method = ResidentMethod::EulerUnprojected; break;
    case FixedStepKind::LieEuler: method = ResidentMethod::LieEuler; break;
    case FixedStepKind::EulerMaruyama: method = ResidentMethod::EulerMaruyama; break;
  }
}

/// Threads per block: the power of two from 32 to kResidentMaxThreads nearest above n.
int resident_threads(std::size_t n) {
  int threads = 32;
  while (threads < kResidentMaxThreads && std::size_t(threads) < n) threads *= 2;
  return threads;
}

template <class Real>
std::unique_ptr<ResidentStepper> CudaBackend<Real>::resident_stepper(const FixedStepMethod& method,
                                                                     std::size_t replicas) {
  ResidentArgs<Real> a;
  resident_method(method.kind, a.method, a.tableau);
  const std::size_t sources = std::size_t(args_.sources);
  if (model_.d > std::size_t(kResidentMaxDim) || sources > std::size_t(kResidentMaxSources) ||
      model_.n == 0 || replicas == 0)
    return nullptr;
  std::unique_ptr<ResidentEngine<Real>> engine;
  if (emulated_) {
    engine = make_host_resident_engine<Real>();
  } else {
#if defined(MFATTN_HAVE_CUDA)
    engine = make_device_resident_engine<Real>();
#else
    return nullptr;
#endif
  }
  a.n = args_.n;
  a.sources = args_.sources;
  a.d = args_.d;
  a.position_dim = args_.position_dim;
  a.threads = resident_threads(model_.n);
  a.has_terms = args_.has_terms;
  a.terms = args_.terms;
  a.finish = detail::finish_terms(model_, mass_);
  a.query_scale = model_.beta * kLog2e;
  a.largest_bias = largest_bias_;
  a.transported = model_.values == ValueTransport::Transported;
  a.noise_kappa = method.noise_kappa;
  a.seed = method.seed;
  a.replicas = replicas;
  if (resident_shared_bytes(a.sources, a.d, a.position_dim, a.threads, a.has_terms, sizeof(Real)) >
      engine->shared_limit())
    return nullptr;
  return std::make_unique<ResidentSteps<Real>>(*this, std::move(engine), a);
}

template <class Real>
std::unique_ptr<Backend> make_with(const Model& model, const BackendOptions& options, bool emulated) {
  // What the registry entry declares it takes (the emulation too), then the loops' sizes.
  if (const std::string why = capability_refusal("--backend cuda", find_backend("cuda")->takes, ModelKinds::of(model));
      !why.empty())
    throw BackendUnavailable(why);
  if (const std::string why = refusal(model); !why.empty()) throw BackendUnavailable(why);
  std::unique_ptr<SumsEngine<Real>> engine;
  if (emulated) {
    engine = make_host_engine<Real>();
  } else {
#if defined(MFATTN_HAVE_CUDA)
    try {
      engine = make_device_engine<Real>();
    } catch (const BackendUnavailable& error) {
      throw BackendUnavailable(std::string(error.what()) + "; accepted here: " +
                               backend_names_text(", ", "cuda"));
    }
#else
    throw BackendUnavailable("--backend cuda: this build of mfattn has no CUDA support (accepted here: " +
                             backend_names_text(", ", "cuda") + "; docs/cuda.md says how to build it)");
#endif
  }
  return std::make_unique<CudaBackend<Real>>(model, options.threads, std::move(engine), emulated);
}

}  // namespace

std::unique_ptr<Backend> make_emulated_cuda_backend(const Model& model, const BackendOptions& options) {
  if (options.precision == Precision::Float) return make_with<float>(model, options, true);
  return make_with<double>(model, options, true);
}

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(const Model& model, const BackendOptions& options) {
  // What it takes of a model is its registry entry's (kBackendNames), checked by make_backend.
  if (options.precision == Precision::Float) return cuda::make_with<float>(model, options, false);
  return cuda::make_with<double>(model, options, false);
}

}  // namespace mfattn
