#pragma once
/// \file pair_kinds.hpp
/// The kinds of pair terms a Model can carry (docs/model.md section 2), as plain enums with no
/// dependency: the kernels layer (src/kernels/pair_terms.hpp) compiles them for the host and
/// for a device alike.

#include <cstddef>

namespace mfattn {

/// Mask m_ij: every pair, causal (xi_j <= xi_i on the first position coordinate), or a
/// window (|xi_i - xi_j| <= window, Euclidean over the position coordinates).
enum class MaskKind { Full, Causal, Window };

/// Auxiliary factor c_ij = c(xi_i - xi_j): 1, exp(-lambda |dxi|), exp(-|dxi|^2 / (2 sigma^2)),
/// cos(omega dxi), or a Toeplitz series sum_k a_k cos(omega_k dxi) (the last two for k = 1,
/// sign-changing, so SA rejects them).
enum class AuxFactor { None, Distance, Gaussian, Cosine, Toeplitz };

/// The most terms a Toeplitz factor's series takes (the kernels hold them in fixed arrays).
inline constexpr std::size_t kMaxToeplitzTerms = 16;

}  // namespace mfattn
