// O-closed components, their standard counterparts, blocks and hosts (include/mfattn/oattn/oclosure.hpp).
// Every per-token map is computed from its own row with explicit loops in a fixed order (no
// matrix-matrix products, whose blocking could depend on the number of tokens), and every
// cross-token sum skips tokens of presence 0: this is what makes zero insertion bit-exact.
#include "mfattn/oattn/oclosure.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/token_formulas.hpp"
#include "mfattn/core/rng.hpp"

namespace mfattn::oclosure {

namespace {

template <class T>
void check_dims(const char* what, bool ok) {
  if (!ok) throw std::invalid_argument(std::string(what) + ": weights do not match the carriers' dimension");
}

/// y = W x + b for one row (b may be empty), entries summed in index order.
template <class T>
void affine(const Rows<T>& w, const Vec<T>& b, const T* x, T* y) {
  const auto rows = w.rows(), cols = w.cols();
  for (Eigen::Index a = 0; a < rows; ++a) {
    T sum = T(0);
    for (Eigen::Index c = 0; c < cols; ++c) sum += w(a, c) * x[c];
    y[a] = b.size() ? sum + b(a) : sum;
  }
}

/// FFN(h_i) of one row into out (length D); hidden: F scratch numbers.
template <class T>
void ffn_row(const FfnWeights<T>& w, const T* h, T* hidden, T* out) {
  affine(w.w1, w.b1, h, hidden);
  for (Eigen::Index f = 0; f < w.w1.rows(); ++f) hidden[f] = kernels::gelu(hidden[f]);
  affine(w.w2, w.b2, hidden, out);
}

template <class T>
void check_ffn(const Rows<T>& h, const FfnWeights<T>& w) {
  check_dims<T>("FFN", w.w1.cols() == h.cols() && w.b1.size() == w.w1.rows() && w.w2.cols() == w.w1.rows() &&
                           w.w2.rows() == h.cols() && w.b2.size() == h.cols());
}

/// LN(h_i) of one row of length D.
template <class T>
void layer_norm_row(const NormWeights<T>& w, double eps, const T* h, T* out, Eigen::Index dim) {
  T mean = T(0);
  for (Eigen::Index c = 0; c < dim; ++c) mean += h[c];
  mean /= static_cast<T>(dim);
  T var = T(0);
  for (Eigen::Index c = 0; c < dim; ++c) var += (h[c] - mean) * (h[c] - mean);
  var /= static_cast<T>(dim);
  const T inv = T(1) / std::sqrt(var + static_cast<T>(eps));
  for (Eigen::Index c = 0; c < dim; ++c) out[c] = w.gamma(c) * ((h[c] - mean) * inv) + w.beta(c);
}

template <class T>
T presence_row(const T* h, Eigen::Index dim, double tau) {
  T norm2 = T(0);
  for (Eigen::Index c = 0; c < dim; ++c) norm2 += h[c] * h[c];
  return norm2 / (static_cast<T>(tau) + norm2);
}

/// Per-feature standardisation with weights p (plain: all 1).
template <class T>
Rows<T> standardize_weighted(const Rows<T>& h, const std::vector<T>& p, bool gated, double eps) {
  const Eigen::Index n = h.rows(), dim = h.cols();
  T mass = T(0);
  for (Eigen::Index i = 0; i < n; ++i)
    if (p[i] != T(0)) mass += p[i];
  Rows<T> out = h;
  if (mass == T(0)) return out;  // nothing present: no statistic, nothing moves
  for (Eigen::Index c = 0; c < dim; ++c) {
    T mean = T(0);
    for (Eigen::Index i = 0; i < n; ++i)
      if (p[i] != T(0)) mean += p[i] * h(i, c);  // zero tokens are skipped, not added as 0
    mean /= mass;
    T var = T(0);
    for (Eigen::Index i = 0; i < n; ++i)
      if (p[i] != T(0)) var += p[i] * (h(i, c) - mean) * (h(i, c) - mean);
    var /= mass;
    const T inv = T(1) / std::sqrt(var + static_cast<T>(eps));
    for (Eigen::Index i = 0; i < n; ++i) {
      const T z = (h(i, c) - mean) * inv;
      out(i, c) = gated ? h(i, c) + p[i] * (z - h(i, c)) : z;
    }
  }
  return out;
}

}  // namespace

template <class T>
std::vector<T> presences(const Rows<T>& h, double tau) {
  std::vector<T> p(static_cast<std::size_t>(h.rows()));
  for (Eigen::Index i = 0; i < h.rows(); ++i) p[i] = presence_row(h.data() + i * h.cols(), h.cols(), tau);
  return p;
}

template <class T>
Rows<T> ffn(const Rows<T>& h, const FfnWeights<T>& w) {
  check_ffn(h, w);
  Rows<T> out(h.rows(), h.cols());
  std::vector<T> hidden(static_cast<std::size_t>(w.w1.rows()));
  for (Eigen::Index i = 0; i < h.rows(); ++i) ffn_row(w, h.data() + i * h.cols(), hidden.data(), out.data() + i * h.cols());
  return out;
}

template <class T>
Rows<T> ffn_residual(const Rows<T>& h, const FfnWeights<T>& w) {
  Rows<T> out = ffn(h, w);
  for (Eigen::Index e = 0; e < out.size(); ++e) out.data()[e] = h.data()[e] + out.data()[e];
  return out;
}

template <class T>
Rows<T> offn(const Rows<T>& h, const FfnWeights<T>& w, const Settings& s) {
  Rows<T> out = ffn(h, w);
  const auto p = presences(h, s.tau);
  for (Eigen::Index i = 0; i < h.rows(); ++i)
    for (Eigen::Index c = 0; c < h.cols(); ++c) out(i, c) = h(i, c) + p[i] * out(i, c);
  return out;
}

template <class T>
Rows<T> layer_norm(const Rows<T>& h, const NormWeights<T>& w, const Settings& s) {
  check_dims<T>("LayerNorm", w.gamma.size() == h.cols() && w.beta.size() == h.cols());
  Rows<T> out(h.rows(), h.cols());
  for (Eigen::Index i = 0; i < h.rows(); ++i)
    layer_norm_row(w, s.eps_norm, h.data() + i * h.cols(), out.data() + i * h.cols(), h.cols());
  return out;
}

template <class T>
Rows<T> onorm(const Rows<T>& h, const NormWeights<T>& w, const Settings& s) {
  Rows<T> out = layer_norm(h, w, s);
  const auto p = presences(h, s.tau);
  for (Eigen::Index i = 0; i < h.rows(); ++i)
    for (Eigen::Index c = 0; c < h.cols(); ++c) out(i, c) = h(i, c) + p[i] * (out(i, c) - h(i, c));
  return out;
}

template <class T>
Rows<T> standardize(const Rows<T>& h, const Settings& s) {
  return standardize_weighted(h, std::vector<T>(static_cast<std::size_t>(h.rows()), T(1)), false, s.eps_std);
}

template <class T>
Rows<T> ostandardize(const Rows<T>& h, const Settings& s) {
  return standardize_weighted(h, presences(h, s.tau), true, s.eps_std);
}

template <class T>
Rows<T> inject(const Rows<T>& h, const Rows<T>& signal, const InjectWeights<T>& w) {
  check_dims<T>("Inject", signal.rows() == h.rows() && w.w.rows() == h.cols() && w.w.cols() == signal.cols() &&
                              w.b.size() == h.cols());
  Rows<T> out(h.rows(), h.cols());
  for (Eigen::Index i = 0; i < h.rows(); ++i) {
    affine(w.w, w.b, signal.data() + i * signal.cols(), out.data() + i * h.cols());
    for (Eigen::Index c = 0; c < h.cols(); ++c) out(i, c) = h(i, c) + out(i, c);
  }
  return out;
}

template <class T>
Rows<T> oinject(const Rows<T>& h, const Rows<T>& signal, const InjectWeights<T>& w, const Settings& s) {
  check_dims<T>("OInject", signal.rows() == h.rows() && w.w.rows() == h.cols() && w.w.cols() == signal.cols() &&
                               w.b.size() == h.cols());
  const auto p = presences(h, s.tau);
  Rows<T> out(h.rows(), h.cols());
  for (Eigen::Index i = 0; i < h.rows(); ++i) {
    affine(w.w, w.b, signal.data() + i * signal.cols(), out.data() + i * h.cols());
    for (Eigen::Index c = 0; c < h.cols(); ++c) out(i, c) = h(i, c) + p[i] * out(i, c);
  }
  return out;
}

template <class T>
Rows<T> block(BlockKind kind, const Rows<T>& h, const BlockWeights<T>& w, const Settings& s) {
  oattn::OAttentionOptions options;
  options.tau = s.tau;
  options.eps_den = s.eps_den;
  const Rows<T> attended = kind == BlockKind::Standard
                               ? oattn::softmax_attention(h, w.attention)
                               : oattn::oattention(h, w.attention, oattn::Visibility::full(), options);
  check_dims<T>("attention", attended.cols() == h.cols());
  Rows<T> residual(h.rows(), h.cols());
  for (Eigen::Index e = 0; e < h.size(); ++e) residual.data()[e] = h.data()[e] + attended.data()[e];
  if (kind == BlockKind::O) return onorm(offn(onorm(residual, w.norm1, s), w.ffn, s), w.norm2, s);
  const Rows<T> a = layer_norm(residual, w.norm1, s);
  return layer_norm(ffn_residual(a, w.ffn), w.norm2, s);
}

template <class T>
Rows<T> host_forward(BlockKind kind, FrontEnd front, const Rows<T>& h, const Rows<T>& signal,
                     const HostWeights<T>& w, const Settings& s, std::vector<Rows<T>>* stages) {
  Rows<T> x = h;
  if (front == FrontEnd::Standard) x = inject(standardize(x, s), signal, w.inject);
  if (front == FrontEnd::O) x = oinject(ostandardize(x, s), signal, w.inject, s);
  if (stages && front != FrontEnd::None) stages->push_back(x);
  for (const auto& b : w.blocks) {
    x = block(kind, x, b, s);
    if (stages) stages->push_back(x);
  }
  return x;
}

Rows<double> random_rows(std::size_t n, std::size_t dim, std::uint64_t seed, std::uint64_t key,
                         std::uint64_t first_id, double scale) {
  Rows<double> out(n, dim);
  for (std::size_t i = 0; i < n; ++i) {
    RandomStream stream(seed, kOClosureTag, key, first_id + i);
    for (std::size_t c = 0; c < dim; ++c) out(i, c) = scale * stream.normal();
  }
  return out;
}

namespace {

Rows<double> random_matrix(std::size_t rows, std::size_t cols, std::uint64_t seed, std::uint64_t index) {
  RandomStream stream(seed, kOClosureTag, kWeightsKey, index);
  Rows<double> m(rows, cols);
  const double scale = 1.0 / std::sqrt(static_cast<double>(cols));  // N(0, 1 / fan_in)
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) m(r, c) = scale * stream.normal();
  return m;
}

Vec<double> random_vector(std::size_t size, double mean, double spread, std::uint64_t seed, std::uint64_t index) {
  RandomStream stream(seed, kOClosureTag, kWeightsKey, index);
  Vec<double> v(size);
  for (std::size_t e = 0; e < size; ++e) v(e) = mean + spread * stream.normal();
  return v;
}

}  // namespace

HostWeights<double> random_host_weights(std::size_t dim, std::size_t blocks, std::uint64_t seed) {
  if (dim == 0 || blocks > 255) throw std::invalid_argument("random_host_weights: dim >= 1 and at most 255 blocks");
  const std::size_t hidden = 4 * dim;
  HostWeights<double> w;
  constexpr std::uint64_t kInjectBlock = 255;
  w.inject = {random_matrix(dim, dim, seed, kInjectBlock * 256 + 0),
              random_vector(dim, 0.0, 0.1, seed, kInjectBlock * 256 + 1)};
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::uint64_t base = b * 256;
    BlockWeights<double> block;
    block.attention = {random_matrix(dim, dim, seed, base + 0), random_matrix(dim, dim, seed, base + 1),
                       random_matrix(dim, dim, seed, base + 2)};
    block.ffn = {random_matrix(hidden, dim, seed, base + 3), random_vector(hidden, 0.0, 0.1, seed, base + 4),
                 random_matrix(dim, hidden, seed, base + 5), random_vector(dim, 0.0, 0.1, seed, base + 6)};
    block.norm1 = {random_vector(dim, 1.0, 0.1, seed, base + 7), random_vector(dim, 0.0, 0.1, seed, base + 8)};
    block.norm2 = {random_vector(dim, 1.0, 0.1, seed, base + 9), random_vector(dim, 0.0, 0.1, seed, base + 10)};
    w.blocks.push_back(std::move(block));
  }
  return w;
}

#define MFATTN_OCLOSURE_INSTANTIATE(T)                                                                        \
  template std::vector<T> presences<T>(const Rows<T>&, double);                                              \
  template Rows<T> ffn<T>(const Rows<T>&, const FfnWeights<T>&);                                             \
  template Rows<T> ffn_residual<T>(const Rows<T>&, const FfnWeights<T>&);                                    \
  template Rows<T> offn<T>(const Rows<T>&, const FfnWeights<T>&, const Settings&);                           \
  template Rows<T> layer_norm<T>(const Rows<T>&, const NormWeights<T>&, const Settings&);                    \
  template Rows<T> onorm<T>(const Rows<T>&, const NormWeights<T>&, const Settings&);                         \
  template Rows<T> standardize<T>(const Rows<T>&, const Settings&);                                          \
  template Rows<T> ostandardize<T>(const Rows<T>&, const Settings&);                                         \
  template Rows<T> inject<T>(const Rows<T>&, const Rows<T>&, const InjectWeights<T>&);                       \
  template Rows<T> oinject<T>(const Rows<T>&, const Rows<T>&, const InjectWeights<T>&, const Settings&);     \
  template Rows<T> block<T>(BlockKind, const Rows<T>&, const BlockWeights<T>&, const Settings&);             \
  template Rows<T> host_forward<T>(BlockKind, FrontEnd, const Rows<T>&, const Rows<T>&, const HostWeights<T>&, \
                                   const Settings&, std::vector<Rows<T>>*);
MFATTN_OCLOSURE_INSTANTIATE(double)
MFATTN_OCLOSURE_INSTANTIATE(float)
#undef MFATTN_OCLOSURE_INSTANTIATE

}  // namespace mfattn::oclosure
