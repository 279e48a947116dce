#pragma once
// The per-token formulas of docs/model.md section 2 that every preparation and finish takes,
// for the host and a CUDA device:
//   (M y)_a = sum_b M_ab y_b, summed in b order from 0   (Q x, K x, V u, a dense gauge G x), on
//             doubles or (where the finish runs on them) CPU lanes; M is row-major, row(a)
//             gives a pointer to its row a
//   b_j = log p_j                                         (-inf for a null token)
//   f(x) = W2 sigma(W1 x + b1) + b2                       (a layer's feed-forward term)
// The host side that reads a Model with them is src/backends/token_operands.hpp.
#include <cmath>
#include <cstddef>

#include "kernels/compile_target.hpp"
#include "mfattn/core/layer_kinds.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::kernels {
inline namespace MFATTN_CPU_NAMESPACE {

/// sum_b m_row[b] y[b], in b order from 0.
template <class Real>
MFATTN_HOST_DEVICE inline Real row_product(const double* m_row, const Real* y, int d) {
  Real sum{};
  for (int b = 0; b < d; ++b) sum += m_row[b] * y[b];
  return sum;
}

/// out = M y, out[a] = row_product(row(a), y, d); out may not alias y.
template <class Real, class Row>
MFATTN_HOST_DEVICE inline void matrix_product(Row&& row, int d, const Real* y, Real* out) {
  for (int a = 0; a < d; ++a) out[a] = row_product(row(a), y, d);
}

/// log p (-inf for p = 0).
MFATTN_HOST_DEVICE inline double log_presence(double presence) {
  return presence > 0.0 ? std::log(presence) : -__builtin_huge_val();
}

/// The row accessor of a row-major d x d array.
struct RowMajorRows {
  const double* m;
  int d;
  MFATTN_HOST_DEVICE const double* operator()(int a) const { return m + a * d; }
};

/// y <- N(y) = y / |y| (0 stays 0): the direction a pre or peri layer reads.
MFATTN_HOST_DEVICE inline void direction(double* y, int d) {
  double norm2 = 0.0;
  for (int c = 0; c < d; ++c) norm2 += y[c] * y[c];
  if (!(norm2 > 0.0)) return;
  const double norm = std::sqrt(norm2);
  for (int c = 0; c < d; ++c) y[c] /= norm;
}

/// The field of a normalization placement (layer_kinds.hpp, docs/model.md section 2c) for
/// one token from pu = p_i F_i, the layer's output times p_i on the states it reads:
///   post  P_x pu      pre, none  pu      peri  p_i N(pu)      ngpt  alpha p_i P_x N(pu)
/// (N(pu) = N(F_i) for p_i > 0; N(0) = 0). v takes d numbers and may not alias x or pu.
MFATTN_HOST_DEVICE inline void placement_velocity(Placement placement, double alpha, double p_i, int d,
                                                  const double* x, const double* pu, double* v) {
  if (placement == Placement::Pre || placement == Placement::None) {
    for (int c = 0; c < d; ++c) v[c] = pu[c];
    return;
  }
  double scale = 1.0;
  if (placement == Placement::Peri || placement == Placement::Ngpt) {
    double norm2 = 0.0;
    for (int c = 0; c < d; ++c) norm2 += pu[c] * pu[c];
    scale = norm2 > 0.0 ? p_i / std::sqrt(norm2) : 0.0;
    if (placement == Placement::Ngpt) scale *= alpha;
  }
  for (int c = 0; c < d; ++c) v[c] = scale * pu[c];
  if (placement == Placement::Peri) return;
  double radial = 0.0;
  for (int c = 0; c < d; ++c) radial += x[c] * v[c];
  for (int c = 0; c < d; ++c) v[c] -= radial * x[c];
}

/// GELU(z) = z/2 (1 + erf(z / sqrt(2))), the exact form (not tanh's), in the precision of z:
/// the feed-forward term's and the O-closure blocks' (oattn/oclosure.cpp) one definition.
template <class Real>
MFATTN_HOST_DEVICE inline Real gelu(Real z) {
  return Real(0.5) * z * (Real(1) + std::erf(z * Real(0.70710678118654752440)));
}

/// sigma(z) of the feed-forward term (layer_kinds.hpp).
MFATTN_HOST_DEVICE inline double activation(Activation kind, double z) {
  switch (kind) {
    case Activation::Relu: return z > 0.0 ? z : 0.0;
    case Activation::Gelu: return gelu(z);
    case Activation::Tanh: return std::tanh(z);
  }
  return z;
}

/// out[a] += f(x)_a = (W2 sigma(W1 x + b1) + b2)_a for a < d, W1 (width x d) and W2
/// (d x width) row-major; hidden holds width numbers.
MFATTN_HOST_DEVICE inline void add_feed_forward(const double* w1, const double* b1, const double* w2,
                                                const double* b2, int width, int d, Activation kind,
                                                const double* x, double* hidden, double* out) {
  // Offsets in std::size_t: W d may pass 2^31.
  for (int h = 0; h < width; ++h)
    hidden[h] = activation(kind, row_product(w1 + std::size_t(h) * std::size_t(d), x, d) + b1[h]);
  for (int a = 0; a < d; ++a) out[a] += row_product(w2 + std::size_t(a) * std::size_t(width), hidden, width) + b2[a];
}

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::kernels
MFATTN_CPU_TARGET_END
