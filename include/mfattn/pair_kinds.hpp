#pragma once
/// \file pair_kinds.hpp
/// The kinds of pair terms a Model can carry (docs/model.md section 2), as plain enums with no
/// dependency: the kernels layer (src/kernels/pair_terms.hpp) compiles them for the host and
/// for a device alike.

namespace mfattn {

/// Mask m_ij: every pair, causal (xi_j <= xi_i on the first position coordinate), or a
/// window (|xi_i - xi_j| <= window, Euclidean over the position coordinates).
enum class MaskKind { Full, Causal, Window };

/// Auxiliary factor c_ij = c(xi_i - xi_j): 1, exp(-lambda |dxi|), exp(-|dxi|^2 / (2 sigma^2)),
/// cos(omega dxi) (k = 1; sign-changing, so SA rejects it).
enum class AuxFactor { None, Distance, Gaussian, Cosine };

}  // namespace mfattn
