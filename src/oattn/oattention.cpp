// OAttention (include/mfattn/oattn/oattention.hpp): the kernel, the carrier form, standard softmax
// attention for comparison, the literal oracle and the link to the SA particle velocity.
#include "mfattn/oattn/oattention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/receiver_finish.hpp"
#include "backends/token_operands.hpp"

namespace mfattn::oattn {

Visibility Visibility::dense(std::size_t receivers, std::size_t sources, std::vector<std::uint8_t> m) {
  if (m.size() != receivers * sources)
    throw std::invalid_argument("Visibility::dense: " + std::to_string(m.size()) + " entries for " +
                                std::to_string(receivers) + " x " + std::to_string(sources));
  Visibility v(Kind::Dense);
  v.receivers_ = receivers;
  v.sources_ = sources;
  v.dense_ = std::move(m);
  return v;
}

void Visibility::check_shape(std::size_t receivers, std::size_t sources) const {
  if (kind_ == Kind::Dense && (receivers != receivers_ || sources != sources_))
    throw std::invalid_argument("OAttention: dense mask of " + std::to_string(receivers_) + " x " +
                                std::to_string(sources_) + " for " + std::to_string(receivers) +
                                " receivers and " + std::to_string(sources) + " sources");
}

double effective_score_scale(const OAttentionOptions& options, std::size_t d_head) {
  return options.score_scale ? *options.score_scale : 1.0 / std::sqrt(static_cast<double>(d_head));
}

namespace {

template <class A, class T>
A to_acc(T value) {
  return static_cast<A>(value);
}

void check_options(const OAttentionOptions& options) {
  if (!(options.eps_den >= 0.0) || !std::isfinite(options.eps_den))
    throw std::invalid_argument("OAttention: eps_den must be finite and >= 0");
  if (!(options.tau > 0.0) || !std::isfinite(options.tau))
    throw std::invalid_argument("OAttention: tau must be finite and > 0");
}

/// The kernel in the accumulator type A (see the header for the two passes and eps_den).
template <class A>
void kernel(std::size_t receivers, std::size_t sources, std::size_t dh, std::size_t dv, const A* q,
            const A* k, const A* v, const A* p_receiver, const A* p_source, const Visibility& mask,
            const OAttentionOptions& options, A* out) {
  mask.check_shape(receivers, sources);
  const A c = static_cast<A>(effective_score_scale(options, dh));
  const A offset = static_cast<A>(options.score_offset);
  const A eps = static_cast<A>(std::min(options.eps_den, static_cast<double>(std::numeric_limits<A>::max())));
  constexpr A minus_inf = -std::numeric_limits<A>::infinity();
  // Workspace, once per call: log p_j of every source, one row of logits and its flags, and
  // the value accumulator.
  std::vector<A> log_p(sources), logits(sources), acc(dv);
  std::vector<std::uint8_t> active(sources);
  for (std::size_t j = 0; j < sources; ++j)
    log_p[j] = p_source[j] > A(0) ? std::log(p_source[j]) : minus_inf;
  for (std::size_t i = 0; i < receivers; ++i) {
    A* o = out + i * dv;
    const A p_i = p_receiver[i];
    if (p_i == A(0)) {
      // Null receiver: p_i times a finite number is 0; the row is not evaluated.
      std::fill(o, o + dv, A(0));
      continue;
    }
    const A* qi = q + i * dh;
    A top = minus_inf;
    for (std::size_t j = 0; j < sources; ++j) {
      // Null sources and hidden ones are skipped, not weighted by 0: they take no part in
      // any operation of this row, which is what makes insertion bit-exact.
      active[j] = p_source[j] > A(0) && mask(i, j);
      if (!active[j]) continue;
      const A* kj = k + j * dh;
      A dot = A(0);
      for (std::size_t a = 0; a < dh; ++a) dot += qi[a] * kj[a];
      const A l = c * dot - offset + log_p[j];
      logits[j] = l;
      top = std::max(top, l);
    }
    if (top == minus_inf) {
      // Empty support: no visible source with p_j > 0. The limit of the formula is 0.
      std::fill(o, o + dv, A(0));
      continue;
    }
    A weight_sum = A(0);
    std::fill(acc.begin(), acc.end(), A(0));
    for (std::size_t j = 0; j < sources; ++j) {
      if (!active[j]) continue;
      const A w = std::exp(logits[j] - top);  // in [0, 1]
      weight_sum += w;
      const A* vj = v + j * dv;
      for (std::size_t a = 0; a < dv; ++a) acc[a] += w * vj[a];
    }
    // eps_den against the true-scale sum e^top S: eps + e^top S = e^top (S + eps e^-top).
    // e^top may over- or underflow; eps / inf = 0 and eps / 0 = inf give the right limits.
    const A denominator = weight_sum + (eps > A(0) ? eps / std::exp(top) : A(0));
    for (std::size_t a = 0; a < dv; ++a) o[a] = p_i * (acc[a] / denominator);
  }
}

template <class T>
std::vector<accumulator_t<T>> converted(const T* data, std::size_t count) {
  using A = accumulator_t<T>;
  std::vector<A> out(count);
  for (std::size_t e = 0; e < count; ++e) out[e] = to_acc<A>(data[e]);
  return out;
}

template <class T>
void check_weights(const Rows<T>& h, const AttentionWeights<T>& w) {
  const auto dim = h.cols();
  if (w.w_q.cols() != dim || w.w_k.cols() != dim || w.w_v.cols() != dim || w.w_q.rows() != w.w_k.rows() ||
      w.w_q.rows() == 0 || w.w_v.rows() == 0)
    throw std::invalid_argument("OAttention: weights must be W_q, W_k (D_head x " + std::to_string(dim) +
                                ") and W_v (D_value x " + std::to_string(dim) + ")");
}

}  // namespace

template <class T>
accumulator_t<T> presence(const T* h, std::size_t d, double tau) {
  using A = accumulator_t<T>;
  A norm2 = A(0);
  for (std::size_t c = 0; c < d; ++c) {
    const A x = to_acc<A>(h[c]);
    norm2 += x * x;
  }
  return norm2 / (static_cast<A>(tau) + norm2);
}

template <class T>
void oattention_qkv(const QkvView<T>& in, const Visibility& mask, const OAttentionOptions& options,
                    accumulator_t<T>* out) {
  using A = accumulator_t<T>;
  check_options(options);
  if constexpr (std::is_same_v<A, T>) {
    kernel<A>(in.receivers, in.sources, in.d_head, in.d_value, in.q, in.k, in.v, in.p_receiver,
              in.p_source, mask, options, out);
  } else {
    // Storage formats: read once into the accumulator type (what a mixed-precision kernel
    // does on load), then compute exactly as for float.
    const auto q = converted(in.q, in.receivers * in.d_head);
    const auto k = converted(in.k, in.sources * in.d_head);
    const auto v = converted(in.v, in.sources * in.d_value);
    kernel<A>(in.receivers, in.sources, in.d_head, in.d_value, q.data(), k.data(), v.data(),
              in.p_receiver, in.p_source, mask, options, out);
  }
}

template <class T>
Rows<accumulator_t<T>> project(const Rows<T>& h, const Rows<T>& w) {
  using A = accumulator_t<T>;
  if (w.cols() != h.cols()) throw std::invalid_argument("project: W has the wrong number of columns");
  const std::size_t n = static_cast<std::size_t>(h.rows()), dim = static_cast<std::size_t>(h.cols()),
                    out_dim = static_cast<std::size_t>(w.rows());
  const auto wa = converted(w.data(), out_dim * dim);
  Rows<A> y(h.rows(), w.rows());
  std::vector<A> row(dim);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t b = 0; b < dim; ++b) row[b] = to_acc<A>(h(i, b));
    for (std::size_t a = 0; a < out_dim; ++a) {
      A sum = A(0);
      for (std::size_t b = 0; b < dim; ++b) sum += wa[a * dim + b] * row[b];
      y(i, a) = sum;
    }
  }
  return y;
}

template <class T>
Rows<accumulator_t<T>> oattention(const Rows<T>& h, const AttentionWeights<T>& weights,
                                  const Visibility& mask, const OAttentionOptions& options) {
  using A = accumulator_t<T>;
  check_options(options);
  check_weights(h, weights);
  const std::size_t n = static_cast<std::size_t>(h.rows()), dim = static_cast<std::size_t>(h.cols());
  std::vector<A> p(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = presence(h.data() + i * dim, dim, options.tau);
  const Rows<A> q = project(h, weights.w_q), k = project(h, weights.w_k), v = project(h, weights.w_v);
  Rows<A> out(h.rows(), weights.w_v.rows());
  kernel<A>(n, n, static_cast<std::size_t>(q.cols()), static_cast<std::size_t>(v.cols()), q.data(),
            k.data(), v.data(), p.data(), p.data(), mask, options, out.data());
  return out;
}

template <class T>
Rows<T> softmax_attention(const Rows<T>& h, const AttentionWeights<T>& weights, const Visibility& mask,
                          std::optional<double> score_scale) {
  check_weights(h, weights);
  const std::size_t n = static_cast<std::size_t>(h.rows());
  mask.check_shape(n, n);
  const Rows<T> q = project(h, weights.w_q), k = project(h, weights.w_k), v = project(h, weights.w_v);
  const std::size_t dh = static_cast<std::size_t>(q.cols()), dv = static_cast<std::size_t>(v.cols());
  const T c = static_cast<T>(score_scale ? *score_scale : 1.0 / std::sqrt(static_cast<double>(dh)));
  Rows<T> out = Rows<T>::Zero(h.rows(), v.cols());
  std::vector<T> logits(n);
  for (std::size_t i = 0; i < n; ++i) {
    T top = -std::numeric_limits<T>::infinity();
    for (std::size_t j = 0; j < n; ++j) {
      if (!mask(i, j)) continue;
      T dot = T(0);
      for (std::size_t a = 0; a < dh; ++a) dot += q(i, a) * k(j, a);
      logits[j] = c * dot;
      top = std::max(top, logits[j]);
    }
    if (top == -std::numeric_limits<T>::infinity()) continue;
    T total = T(0);
    for (std::size_t j = 0; j < n; ++j) {
      if (!mask(i, j)) continue;
      const T w = std::exp(logits[j] - top);
      total += w;
      for (std::size_t a = 0; a < dv; ++a) out(i, a) += w * v(j, a);
    }
    for (std::size_t a = 0; a < dv; ++a) out(i, a) /= total;
  }
  return out;
}

template <class A>
void oattention_direct(const QkvView<A>& in, const Visibility& mask, const OAttentionOptions& options, A* out) {
  mask.check_shape(in.receivers, in.sources);
  const A c = static_cast<A>(effective_score_scale(options, in.d_head));
  const A offset = static_cast<A>(options.score_offset);
  std::vector<A> numerator(in.d_value);
  for (std::size_t i = 0; i < in.receivers; ++i) {
    std::fill(numerator.begin(), numerator.end(), A(0));
    A denominator = static_cast<A>(options.eps_den);
    for (std::size_t j = 0; j < in.sources; ++j) {
      if (!mask(i, j)) continue;
      A dot = A(0);
      for (std::size_t a = 0; a < in.d_head; ++a) dot += in.q[i * in.d_head + a] * in.k[j * in.d_head + a];
      const A w = in.p_source[j] * std::exp(c * dot - offset);
      denominator += w;
      for (std::size_t a = 0; a < in.d_value; ++a) numerator[a] += w * in.v[j * in.d_value + a];
    }
    for (std::size_t a = 0; a < in.d_value; ++a)
      out[i * in.d_value + a] = denominator > A(0) ? in.p_receiver[i] * (numerator[a] / denominator) : A(0);
  }
}

template void oattention_direct<double>(const QkvView<double>&, const Visibility&, const OAttentionOptions&,
                                        double*);
template void oattention_direct<float>(const QkvView<float>&, const Visibility&, const OAttentionOptions&,
                                       float*);

void sa_velocity_via_oattention(const Model& model, const double* x, double* velocity,
                                std::size_t replica) {
  if (const std::string refusal = capability_refusal("the OAttention link", kOAttentionTakes, ModelKinds::of(model));
      !refusal.empty())
    throw std::invalid_argument("sa_velocity_via_oattention: " + refusal);
  const AttentionHead& head = model.matrices_of(replica).heads.front();
  const std::size_t n = model.n, d = model.d, sources = n + model.prefix_count();
  const bool transported = model.gauge && model.values == ValueTransport::Transported;
  auto multiply = [d](const Matrix& m, bool identity, const double* in, double* out) {
    if (identity)
      std::copy(in, in + d, out);
    else
      kernels::matrix_product(kernels::RowMajorRows{m.data(), int(d)}, int(d), in, out);
  };
  // q_i = G_i Q x_i, k_j = G_j K y_j, z_j and p_j, as every backend prepares them.
  host::TokenOperands operands;
  host::prepare_head_operands(host::HeadOperands(model, head), x, operands);
  // m_ij: the model's positional mask and the per-prompt rule, as the backends apply them.
  Visibility mask = Visibility::full();
  if (model.pair_terms.any()) {
    std::vector<std::uint8_t> m(n * sources);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < sources; ++j)
        m[i * sources + j] = kernels::visible(host::model_pair_weight_terms(model, i, j));
    mask = Visibility::dense(n, sources, std::move(m));
  }
  OAttentionOptions options;
  options.eps_den = model.eps_den;
  options.score_scale = model.beta;
  options.score_offset = model.exponent_shift();
  std::vector<double> out(n * d), r(d), s(d);
  const QkvView<double> view{n, sources, d, d, operands.queries.data(), operands.keys.data(),
                             operands.values.data(), model.presence.data(), operands.presence.data()};
  oattention_qkv(view, mask, options, out.data());
  for (std::size_t i = 0; i < n; ++i) {
    const double* o = out.data() + i * d;
    const double* xi = x + i * d;
    // r = V R_i OAttention_i, then the tangent projection; OAttention_i already carries p_i.
    if (transported) model.gauge->apply_transpose(i, o, s.data());
    else std::copy(o, o + d, s.data());
    multiply(head.full_value, head.full_value_identity, s.data(), r.data());
    // The tangent projection with p_i = 1 (OAttention_i carries p_i already; 1 * y is y).
    kernels::tangent_velocity(1.0, int(d), xi, r.data(), velocity + i * d, static_cast<double*>(nullptr));
  }
}

#define MFATTN_OATTN_INSTANTIATE(T)                                                                    \
  template accumulator_t<T> presence<T>(const T*, std::size_t, double);                               \
  template void oattention_qkv<T>(const QkvView<T>&, const Visibility&, const OAttentionOptions&,      \
                                  accumulator_t<T>*);                                                  \
  template Rows<accumulator_t<T>> project<T>(const Rows<T>&, const Rows<T>&);                         \
  template Rows<accumulator_t<T>> oattention<T>(const Rows<T>&, const AttentionWeights<T>&,           \
                                                const Visibility&, const OAttentionOptions&);
MFATTN_OATTN_INSTANTIATE(double)
MFATTN_OATTN_INSTANTIATE(float)
MFATTN_OATTN_INSTANTIATE(Eigen::half)
MFATTN_OATTN_INSTANTIATE(Eigen::bfloat16)
#undef MFATTN_OATTN_INSTANTIATE

template Rows<double> softmax_attention<double>(const Rows<double>&, const AttentionWeights<double>&,
                                                const Visibility&, std::optional<double>);
template Rows<float> softmax_attention<float>(const Rows<float>&, const AttentionWeights<float>&,
                                              const Visibility&, std::optional<double>);

}  // namespace mfattn::oattn
