#pragma once
// The per-token formulas of docs/model.md section 2 that every preparation and finish takes,
// for the host and a CUDA device:
//   (M y)_a = sum_b M_ab y_b, summed in b order from 0   (Q x, K x, V u, a dense gauge G x), on
//             doubles or (where the finish runs on them) CPU lanes; M is row-major, row(a)
//             gives a pointer to its row a
//   b_j = log p_j                                         (-inf for a null token)
//   f(x) = W2 sigma(W1 x + b1) + b2                       (a layer's feed-forward term)
//   v = placement_velocity(x, p F)                        (a placement's field)
// and beside each the derivatives docs/model.md section 2e takes (a VJP, the transpose of the
// derivative applied to a cotangent, and a JVP, the derivative applied to a tangent):
//   dN(y)[t] = (t - <N(y), t> N(y)) / |y|                (symmetric: its own transpose)
//   sigma'(z), and f's and the placements' VJP and JVP.
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

/// y <- dN(x)[y] = (y - <N(x), y> N(x)) / |x| (0 for x = 0, where N is not differentiable and
/// N(0) = 0 is held): the derivative of direction() at x applied to y, which is also its
/// transpose (the map is symmetric).
MFATTN_HOST_DEVICE inline void direction_derivative(const double* x, int d, double* y) {
  double norm2 = 0.0;
  for (int c = 0; c < d; ++c) norm2 += x[c] * x[c];
  if (!(norm2 > 0.0)) {
    for (int c = 0; c < d; ++c) y[c] = 0.0;
    return;
  }
  const double norm = std::sqrt(norm2);
  double radial = 0.0;
  for (int c = 0; c < d; ++c) radial += x[c] * y[c];
  radial /= norm2;
  for (int c = 0; c < d; ++c) y[c] = (y[c] - radial * x[c]) / norm;
}

/// The VJP of placement_velocity at (x, pu) for the cotangent g of v: adds to x_bar and pu_bar
/// (d numbers each) and returns the derivative with respect to the explicit p_i of peri and
/// ngpt (p_i's share through pu is the caller's). Write n = N(pu), P_x y = y - <x, y> x:
///   post       pu_bar += P_x g,   x_bar -= <x, pu> g + <x, g> pu
///   pre, none  pu_bar += g
///   peri       pu_bar += p dN(pu)[g],   returns <g, n>
///   ngpt       m = alpha p P_x g:  pu_bar += dN(pu)[m],  x_bar -= alpha p (<x, n> g + <x, g> n),
///              returns alpha <g, P_x n>
/// scratch: d numbers.
MFATTN_HOST_DEVICE inline double placement_velocity_vjp(Placement placement, double alpha, double p_i, int d,
                                                       const double* x, const double* pu, const double* g,
                                                       double* x_bar, double* pu_bar, double* scratch) {
  if (placement == Placement::Pre || placement == Placement::None) {
    for (int c = 0; c < d; ++c) pu_bar[c] += g[c];
    return 0.0;
  }
  double x_g = 0.0;
  for (int c = 0; c < d; ++c) x_g += x[c] * g[c];
  if (placement == Placement::Post) {
    double x_pu = 0.0;
    for (int c = 0; c < d; ++c) x_pu += x[c] * pu[c];
    for (int c = 0; c < d; ++c) {
      pu_bar[c] += g[c] - x_g * x[c];
      x_bar[c] -= x_pu * g[c] + x_g * pu[c];
    }
    return 0.0;
  }
  double norm2 = 0.0;
  for (int c = 0; c < d; ++c) norm2 += pu[c] * pu[c];
  if (!(norm2 > 0.0)) return 0.0;  // N(0) = 0 is held: no derivative
  const double norm = std::sqrt(norm2);
  double g_n = 0.0, x_n = 0.0;
  for (int c = 0; c < d; ++c) {
    g_n += g[c] * pu[c] / norm;
    x_n += x[c] * pu[c] / norm;
  }
  if (placement == Placement::Peri) {
    for (int c = 0; c < d; ++c) scratch[c] = p_i * g[c];
    direction_derivative(pu, d, scratch);
    for (int c = 0; c < d; ++c) pu_bar[c] += scratch[c];
    return g_n;
  }
  const double scale = alpha * p_i;
  for (int c = 0; c < d; ++c) scratch[c] = scale * (g[c] - x_g * x[c]);
  direction_derivative(pu, d, scratch);
  for (int c = 0; c < d; ++c) {
    pu_bar[c] += scratch[c];
    x_bar[c] -= scale * (x_n * g[c] + x_g * pu[c] / norm);
  }
  return alpha * (g_n - x_g * x_n);
}

/// The JVP of placement_velocity at (x, pu) along x_dot, pu_dot and the explicit p_i's p_dot
/// (peri and ngpt; pu_dot carries p_i's share through pu): v_dot (d numbers; may not alias
/// the others). Each placement's line is written beside its case below.
MFATTN_HOST_DEVICE inline void placement_velocity_jvp(Placement placement, double alpha, double p_i, double p_dot,
                                                      int d, const double* x, const double* pu,
                                                      const double* x_dot, const double* pu_dot, double* v_dot) {
  if (placement == Placement::Pre || placement == Placement::None) {
    for (int c = 0; c < d; ++c) v_dot[c] = pu_dot[c];
    return;
  }
  if (placement == Placement::Post) {
    // v = pu - <x, pu> x:  v_dot = pu_dot - (<x_dot, pu> + <x, pu_dot>) x - <x, pu> x_dot
    double radial_dot = 0.0, radial = 0.0;
    for (int c = 0; c < d; ++c) {
      radial_dot += x_dot[c] * pu[c] + x[c] * pu_dot[c];
      radial += x[c] * pu[c];
    }
    for (int c = 0; c < d; ++c) v_dot[c] = pu_dot[c] - radial_dot * x[c] - radial * x_dot[c];
    return;
  }
  double norm2 = 0.0;
  for (int c = 0; c < d; ++c) norm2 += pu[c] * pu[c];
  if (!(norm2 > 0.0)) {
    for (int c = 0; c < d; ++c) v_dot[c] = 0.0;
    return;
  }
  const double norm = std::sqrt(norm2);
  // n_dot = dN(pu)[pu_dot], into v_dot
  for (int c = 0; c < d; ++c) v_dot[c] = pu_dot[c];
  direction_derivative(pu, d, v_dot);
  if (placement == Placement::Peri) {
    // v = p n:  v_dot = p_dot n + p n_dot
    for (int c = 0; c < d; ++c) v_dot[c] = p_dot * pu[c] / norm + p_i * v_dot[c];
    return;
  }
  // ngpt, v = alpha p (n - <x, n> x):
  //   v_dot = alpha p_dot P_x n + alpha p (n_dot - (<x_dot, n> + <x, n_dot>) x - <x, n> x_dot)
  double x_n = 0.0, radial_dot = 0.0;
  for (int c = 0; c < d; ++c) {
    x_n += x[c] * pu[c] / norm;
    radial_dot += x_dot[c] * pu[c] / norm + x[c] * v_dot[c];
  }
  for (int c = 0; c < d; ++c)
    v_dot[c] = alpha * p_dot * (pu[c] / norm - x_n * x[c]) +
               alpha * p_i * (v_dot[c] - radial_dot * x[c] - x_n * x_dot[c]);
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

/// sigma'(z) (relu: 1 for z > 0, else 0; gelu: Phi(z) + z phi(z), the standard normal's
/// distribution and density; tanh: 1 - tanh(z)^2).
MFATTN_HOST_DEVICE inline double activation_derivative(Activation kind, double z) {
  switch (kind) {
    case Activation::Relu: return z > 0.0 ? 1.0 : 0.0;
    case Activation::Gelu:
      return 0.5 * (1.0 + std::erf(z * 0.70710678118654752440)) + z * std::exp(-0.5 * z * z) * 0.39894228040143267794;
    case Activation::Tanh: {
      const double t = std::tanh(z);
      return 1.0 - t * t;
    }
  }
  return 1.0;
}

/// A gradient (Number = double) or a tangent (const double) of the feed-forward term's
/// numbers (W1: width x d, b1: width, W2: d x width, b2: d; row-major; null: none).
template <class Number>
struct FeedForwardArrays {
  Number* w1 = nullptr;
  Number* b1 = nullptr;
  Number* w2 = nullptr;
  Number* b2 = nullptr;
};

/// The VJP of f at x for the cotangent g (d numbers), z = W1 x + b1, e = sigma'(z) (W2^T g):
///   x_bar += W1^T e,  grad.w1 += e x^T,  grad.b1 += e,  grad.w2 += g sigma(z)^T,  grad.b2 += g
/// (grad's arrays may be null: not wanted). hidden: 2 width numbers.
MFATTN_HOST_DEVICE inline void feed_forward_vjp(const double* w1, const double* b1, const double* w2, int width,
                                                int d, Activation kind, const double* x, const double* g,
                                                double* hidden, double* x_bar, const FeedForwardArrays<double>& grad) {
  double* slope = hidden + width;
  for (int h = 0; h < width; ++h) {
    const double z = row_product(w1 + std::size_t(h) * std::size_t(d), x, d) + b1[h];
    hidden[h] = activation(kind, z);
    double back = 0.0;
    for (int a = 0; a < d; ++a) back += w2[std::size_t(a) * std::size_t(width) + std::size_t(h)] * g[a];
    slope[h] = activation_derivative(kind, z) * back;
  }
  for (int h = 0; h < width; ++h) {
    const double* row = w1 + std::size_t(h) * std::size_t(d);
    for (int b = 0; b < d; ++b) x_bar[b] += row[b] * slope[h];
    if (grad.w1)
      for (int b = 0; b < d; ++b) grad.w1[std::size_t(h) * std::size_t(d) + std::size_t(b)] += slope[h] * x[b];
    if (grad.b1) grad.b1[h] += slope[h];
  }
  for (int a = 0; a < d; ++a) {
    if (grad.w2)
      for (int h = 0; h < width; ++h) grad.w2[std::size_t(a) * std::size_t(width) + std::size_t(h)] += g[a] * hidden[h];
    if (grad.b2) grad.b2[a] += g[a];
  }
}

/// The JVP of f at x along x_dot and the numbers' tangents (tangent's arrays may be null:
/// zero), added to out:
///   out += W2 (sigma'(z) (W1 x_dot + W1' x + b1')) + W2' sigma(z) + b2'
/// hidden: 2 width numbers.
MFATTN_HOST_DEVICE inline void feed_forward_jvp(const double* w1, const double* b1, const double* w2, int width,
                                                int d, Activation kind, const double* x, const double* x_dot,
                                                const FeedForwardArrays<const double>& tangent, double* hidden, double* out) {
  double* slope = hidden + width;
  for (int h = 0; h < width; ++h) {
    const std::size_t row = std::size_t(h) * std::size_t(d);
    const double z = row_product(w1 + row, x, d) + b1[h];
    hidden[h] = activation(kind, z);
    double z_dot = row_product(w1 + row, x_dot, d);
    if (tangent.w1) z_dot += row_product(tangent.w1 + row, x, d);
    if (tangent.b1) z_dot += tangent.b1[h];
    slope[h] = activation_derivative(kind, z) * z_dot;
  }
  for (int a = 0; a < d; ++a) {
    const std::size_t row = std::size_t(a) * std::size_t(width);
    out[a] += row_product(w2 + row, slope, width);
    if (tangent.w2) out[a] += row_product(tangent.w2 + row, hidden, width);
    if (tangent.b2) out[a] += tangent.b2[a];
  }
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
