#pragma once
// The per-token pieces of the fixed-step integrators of include/mfattn/integrators/integrator.hpp,
// written once for the CPU integrators (src/integrators/integrators.cpp) and the CUDA
// backend's resident kernel (src/backends/cuda/resident_steps.hpp):
//   FixedTableau      the explicit Runge-Kutta tableaux of euler, heun and rk4
//   normalize_token   x <- x / |x|
//   geodesic_step     x <- cos(h|w|) x + sin(h|w|) w/|w|, then renormalised (lie-euler)
//   maruyama_step     x <- normalize(x + h f + sqrt(2h/kappa) P_x xi), xi ~ N(0, I) from the
//                     counter-based stream (seed, Noise, replica << 32 | token, step)
//   maruyama_step_vjp its adjoint, the noise replayed from the same stream
//   token_noise       that xi alone (stochastic-heun draws the same numbers)
//   common_increment  the step's shared matrix sigma dB (common noise, stream (seed,
//                     CommonNoise, replica, step)): GOE or skew-symmetric
//   add_common_noise  P_x(dB x), the token's share of it (add_tangent_part: P_x v)
#include <cmath>
#include <cstdint>

#include "core/counter_random.hpp"
#include "kernels/compile_target.hpp"
#include "kernels/token_formulas.hpp"
#include "mfattn/core/rng.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::kernels {
inline namespace MFATTN_CPU_NAMESPACE {

/// An explicit Runge-Kutta tableau of at most four stages: stage s evaluates the field at
/// x + h sum_{m < s} a[s][m] k_m, the step is x + h sum_m b[m] k_m.
struct FixedTableau {
  static constexpr int kMaxStages = 4;
  int stages = 1;
  double a[kMaxStages][kMaxStages] = {};
  double b[kMaxStages] = {1.0};
};
inline constexpr FixedTableau kEulerTableau{1, {}, {1.0}};
inline constexpr FixedTableau kHeunTableau{2, {{}, {1.0}}, {0.5, 0.5}};
inline constexpr FixedTableau kRk4Tableau{4, {{}, {0.5}, {0.0, 0.5}, {0.0, 0.0, 1.0}},
                                          {1.0 / 6, 1.0 / 3, 1.0 / 3, 1.0 / 6}};

/// The stream tags of the integrators' noise: each token's own, and each replica's shared.
inline constexpr std::uint64_t kNoiseStreamTag = static_cast<std::uint64_t>(StreamTag::Noise);
inline constexpr std::uint64_t kCommonNoiseStreamTag = static_cast<std::uint64_t>(
    StreamTag::CommonNoise);

MFATTN_HOST_DEVICE inline double dot_product(const double* a, const double* b, int d) {
  double sum = 0.0;
  for (int c = 0; c < d; ++c) sum += a[c] * b[c];
  return sum;
}

/// x <- x / |x|.
MFATTN_HOST_DEVICE inline void normalize_token(double* x, int d) {
  const double norm = std::sqrt(dot_product(x, x, d));
  for (int c = 0; c < d; ++c) x[c] /= norm;
}

/// x <- cos(h|w|) x + sin(h|w|) w/|w|, then renormalised against rounding drift (w tangent at x;
/// w = 0 leaves x as it is).
MFATTN_HOST_DEVICE inline void geodesic_step(double* x, const double* w, double h, int d) {
  const double speed = std::sqrt(dot_product(w, w, d));
  if (speed == 0.0) return;
  const double angle = h * speed, cos_a = std::cos(angle), sin_a = std::sin(angle) / speed;
  for (int c = 0; c < d; ++c) x[c] = cos_a * x[c] + sin_a * w[c];
  normalize_token(x, d);
}

/// sqrt(2 h / kappa), the noise amplitude of a step h (0 for kappa <= 0: no noise).
MFATTN_HOST_DEVICE inline double noise_amplitude(double h, double kappa) {
  return kappa > 0.0 ? std::sqrt(2.0 * h / kappa) : 0.0;
}

/// xi ~ N(0, I_d), the normal draws of token `token` of replica `replica` at step count `step`
/// from their own stream (seed, Noise, replica << 32 | token, step): independent of the thread
/// count and of other tokens. The host draws through rng.cpp, compiled without contractions
/// whatever the including file's flags (an x86-64-v3 build would fuse the inlined formulas);
/// a device spells each operation uncontracted (core/counter_random.hpp).
MFATTN_HOST_DEVICE inline void token_noise(std::uint64_t seed, std::uint64_t replica,
                                           std::uint64_t token, std::uint64_t step, int d,
                                           double* xi) {
#if defined(__CUDA_ARCH__)
  random::CounterStream stream{
      random::stream_key(seed, kNoiseStreamTag, (replica << 32) | token, step)};
#else
  RandomStream stream(seed, kNoiseStreamTag, (replica << 32) | token, step);
#endif
  for (int c = 0; c < d; ++c) xi[c] = stream.normal();
}

/// The shared increment sigma dB of replica `replica` over the step `step` of size h (d x d,
/// row-major), from the stream (seed, CommonNoise, replica, step), entries drawn row by row:
///   symmetric (GOE): dB_ab = dB_ba = scale z_ab (a < b), dB_aa = sqrt(2) scale z_aa,
///                    so E[dB_ab dB_cd] = scale^2 (delta_ac delta_bd + delta_ad delta_bc);
///   rotation (skew): dB_ab = -dB_ba = scale z_ab (a < b), dB_aa = 0,
///                    so E[dB_ab dB_cd] = scale^2 (delta_ac delta_bd - delta_ad delta_bc);
/// scale = sigma sqrt(h). Either way E[(P_x dB x)(P_x dB x)^T] = scale^2 P_x on the sphere:
/// one token alone is Brownian motion with generator (sigma^2 / 2) Laplacian.
MFATTN_HOST_DEVICE inline void common_increment(bool symmetric, double scale, std::uint64_t seed,
                                                std::uint64_t replica, std::uint64_t step, int d,
                                                double* increment) {
#if defined(__CUDA_ARCH__)
  random::CounterStream stream{random::stream_key(seed, kCommonNoiseStreamTag, replica, step)};
#else
  RandomStream stream(seed, kCommonNoiseStreamTag, replica, step);
#endif
  for (int a = 0; a < d; ++a) {
    increment[a * d + a] = symmetric ? std::sqrt(2.0) * scale * stream.normal() : 0.0;
    for (int b = a + 1; b < d; ++b) {
      const double entry = scale * stream.normal();
      increment[a * d + b] = entry;
      increment[b * d + a] = symmetric ? entry : -entry;
    }
  }
}

/// out += scale P_x v = scale (v - <v, x> x) for a unit x: a noise vector's tangent part.
MFATTN_HOST_DEVICE inline void add_tangent_part(const double* x, const double* v, double scale,
                                                int d, double* out) {
  const double radial = dot_product(v, x, d);
  for (int c = 0; c < d; ++c) out[c] += scale * (v[c] - radial * x[c]);
}

/// The token's share of the shared increment, out += P_x(dB x) for a unit x. scratch: d numbers.
MFATTN_HOST_DEVICE inline void add_common_noise(const double* x, const double* increment, int d,
                                                double* scratch, double* out) {
  for (int a = 0; a < d; ++a) scratch[a] = dot_product(increment + a * d, x, d);
  add_tangent_part(x, scratch, 1.0, d, out);
}

/// One projected Euler-Maruyama step of token `token` of replica `replica` at step count
/// `step` (the steps taken before this one): x <- normalize(x + h f + amplitude P_x xi), xi
/// from the token's own stream, so that the increment depends on neither the thread count
/// nor other tokens. noise: d numbers of scratch.
MFATTN_HOST_DEVICE inline void maruyama_step(double* x, const double* velocity, double h, double amplitude,
                                             std::uint64_t seed, std::uint64_t replica, std::uint64_t token,
                                             std::uint64_t step, int d, double* noise) {
  for (int c = 0; c < d; ++c) noise[c] = 0.0;
  if (amplitude > 0.0) {
    token_noise(seed, replica, token, step, d, noise);
    const double radial = dot_product(noise, x, d);
    for (int c = 0; c < d; ++c) noise[c] = amplitude * (noise[c] - radial * x[c]);
  }
  double norm2 = 0.0;
  for (int c = 0; c < d; ++c) {
    x[c] += h * velocity[c] + noise[c];
    norm2 += x[c] * x[c];
  }
  const double norm = std::sqrt(norm2);
  for (int c = 0; c < d; ++c) x[c] /= norm;
}

/// The adjoint of maruyama_step at the same x, h and stream: with y = x + h f + amplitude
/// (xi - <xi, x> x) and x' = y / |y|, given x'_bar writes y_bar = N'(y)^T x'_bar
/// (direction_derivative; f's cotangent is h y_bar) and x's own share x_bar = y_bar -
/// amplitude (xi <x, y_bar> + <xi, x> y_bar) (without f's). scratch: 2 d numbers.
MFATTN_HOST_DEVICE inline void maruyama_step_vjp(const double* x, const double* velocity, double h,
                                                 double amplitude, std::uint64_t seed,
                                                 std::uint64_t replica, std::uint64_t token,
                                                 std::uint64_t step, int d, const double* next_bar,
                                                 double* y_bar, double* x_bar, double* scratch) {
  double* noise = scratch;
  double* y = scratch + d;
  for (int c = 0; c < d; ++c) noise[c] = 0.0;
  if (amplitude > 0.0) token_noise(seed, replica, token, step, d, noise);
  const double radial = dot_product(noise, x, d);
  // y as the step made it (maruyama_step's operations, in its order).
  for (int c = 0; c < d; ++c)
    y[c] = x[c] + (h * velocity[c] + amplitude * (noise[c] - radial * x[c]));
  for (int c = 0; c < d; ++c) y_bar[c] = next_bar[c];
  direction_derivative(y, d, y_bar);
  const double x_dot_bar = dot_product(x, y_bar, d);
  for (int c = 0; c < d; ++c)
    x_bar[c] = y_bar[c] - amplitude * (noise[c] * x_dot_bar + radial * y_bar[c]);
}

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::kernels
MFATTN_CPU_TARGET_END
