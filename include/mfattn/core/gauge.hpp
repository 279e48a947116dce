#pragma once
/// \file gauge.hpp
/// Positional gauges G(xi) in SO(d) (docs/model.md section 3):
///
///   G(xi) = exp( sum_{a=1..k} xi_a Omega_a ),   Omega_a skew-symmetric d x d,  xi in R^k.
///
/// Notation: B = floor(d/2) rotation blocks, block b (0-based here, b = 0 .. B-1) acts on the
/// coordinates (2b, 2b+1); J = [[0, -1], [1, 0]], so exp(theta J) = [[cos, -sin], [sin, cos]].
/// For odd d the last coordinate (index d-1) is never rotated by the block families.
///
/// Block families (rope, rope-axial, rope-mixed, rope-conjugated) are all described by a
/// B x k frequency table W: the angle of block b for a token at xi is
///   theta_b(xi) = sum_a W(b, a) xi_a,   Omega_a = blockdiag(W(0,a) J, ..., W(B-1,a) J, [0]),
/// so their generators commute and the relative property G(xi)^T G(zeta) = G(zeta - xi) holds.
///
///  - Rope (k = 1):   W(b, 0) = omega_b = base^(-2b/d)   (= base^{-2(b-1)/d} for 1-based b),
///                    or W(b, 0) = frequencies[b] when an explicit list (length B) is given.
///  - RopeAxial (k = 2): block b rotates with axis a(b) = b mod 2 only (W(b, 1 - a(b)) = 0).
///                    Axis a owns B_a blocks (B_0 = ceil(B/2), B_1 = floor(B/2)); the m-th block
///                    of axis a (m = floor(b/2)) has the RoPE frequency of a d_a = 2 B_a
///                    dimensional RoPE:  W(b, a) = base^(-2m/d_a)  (so for d divisible by 4,
///                    base^(-4m/d), the usual axial 2-D RoPE). With d = 2 or 3 axis 1 owns no
///                    block and Omega_1 = 0. An explicit list (length B) gives W(b, b mod 2)
///                    = frequencies[b].
///  - RopeMixed (k = 2): W(b, :) = r_b (cos phi_b, sin phi_b): magnitude r_b = base^(-2b/d)
///                    (the RoPE schedule, or frequencies[b] for an explicit list of length B)
///                    and a direction (cos phi_b, sin phi_b) = g / |g|, g ~ N(0, I_2), i.e. phi_b
///                    uniform on [0, 2 pi), independent per block, from
///                    RandomStream(seed, StreamTag::Generators, kind, 0) (block b uses the draws
///                    2b, 2b+1; a zero draw is redrawn). An explicit list of length 2B instead
///                    gives W row-major: frequencies = (W(0,0), W(0,1), W(1,0), W(1,1), ...),
///                    nothing random.
///  - RopeConjugated (any k >= 1): Omega_a = P D_a P^T with D_a the block diagonal matrices of
///                    rope (k = 1) or of the axial layout generalised to k axes (block b uses axis
///                    b mod k, the m-th block of axis a has base^(-2m/d_a), d_a = 2 B_a; an
///                    explicit list of length B gives W(b, b mod k)), and P Haar-random in O(d):
///                    Gram-Schmidt (two passes) of the Gaussian columns drawn from
///                    RandomStream(seed, StreamTag::Generators, kind, 0), column after column.
///                    G(xi) = P R(xi) P^T with R(xi) the block rotations.
///  - Lie (any k >= 1): generators given, or random: Omega_a(i, j) = z / sqrt(d) for i < j with
///                    z ~ N(0, 1) from RandomStream(seed, StreamTag::Generators, kind, a) in
///                    row-major order, Omega_a(j, i) = -Omega_a(i, j), diagonal 0. They need not
///                    commute: the relative property then FAILS (documented, tested).
///                    G(xi_i) is computed once per token at construction with Eigen's matrix
///                    exponential (scaling and squaring) followed by one Newton-Schulz polar step
///                    X <- X (3 I - X^T X) / 2 that restores orthogonality to rounding.
///
/// Storage and cost per apply (n tokens):
///  - rope, rope-axial, rope-mixed: cos/sin per token and block, O(n d) memory, O(d) per apply.
///  - rope-conjugated: P (d x d) plus cos/sin per token and block: O(d^2 + n d) memory,
///    apply = P R P^T x in O(d^2).
///  - lie: one dense d x d matrix per token, O(n d^2) memory (8 n d^2 bytes: 32 MiB for
///    n = 1000, d = 64), O(d^2) per apply, O(n d^3) construction.
///
/// Random draws use RandomStream only, so generators are the same on every platform up to the
/// rounding of the (non-random) arithmetic that follows (pow, Gram-Schmidt, matrix exponential).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mfattn/core/choice_table.hpp"
#include "mfattn/core/model.hpp"

namespace mfattn {

enum class GeometryKind { None, Rope, RopeAxial, RopeMixed, RopeConjugated, Lie };

/// Every geometry by name, in the order --geometry's help lists them: the one list that
/// geometry_name, parse_geometry and the option table (run_choices.hpp) read.
inline constexpr Choice<GeometryKind> kGeometryChoices[] = {
    {"none", GeometryKind::None},
    {"rope", GeometryKind::Rope},
    {"rope-axial", GeometryKind::RopeAxial},
    {"rope-mixed", GeometryKind::RopeMixed},
    {"rope-conjugated", GeometryKind::RopeConjugated},
    {"lie", GeometryKind::Lie},
};

/// What the options' rules and the model builder must know of a geometry.
/// Planar: its positions are 2-D (k = 2), as rope-axial and rope-mixed pair each plane with
/// two position coordinates.
constexpr bool is_planar(GeometryKind kind) {
  return kind == GeometryKind::RopeAxial || kind == GeometryKind::RopeMixed;
}
/// Takes its generators from --generators (lie; the others build theirs).
constexpr bool takes_generators(GeometryKind kind) { return kind == GeometryKind::Lie; }
/// Holds a dense d x d matrix per token (lie, rope-conjugated; the rest are 2 x 2 blocks).
constexpr bool holds_dense_matrices(GeometryKind kind) {
  return kind == GeometryKind::Lie || kind == GeometryKind::RopeConjugated;
}

/// The name of kind in kGeometryChoices ("rope-axial").
std::string geometry_name(GeometryKind kind);

/// The names parse_geometry accepts, in kGeometryChoices' order.
std::vector<std::string> geometry_names();

/// Inverse of geometry_name. Throws std::invalid_argument listing the accepted names.
GeometryKind parse_geometry(const std::string& name);

struct GaugeSpec {
  GeometryKind kind = GeometryKind::None;
  std::size_t d = 3;             ///< ambient dimension, >= 2
  std::size_t position_dim = 1;  ///< k: rope 1; rope-axial, rope-mixed 2; conjugated, lie >= 1
  double base = 10000;           ///< RoPE base, finite and > 0
  /// Optional explicit frequency list (empty: the base schedule); see the file comment for the
  /// lengths each family accepts. Not used by lie.
  std::vector<double> frequencies{};
  std::uint64_t seed = 0;        ///< rope-mixed directions, rope-conjugated P, random lie
  /// Optional explicit generators (e.g. from read_generators): only with GeometryKind::Lie;
  /// exactly position_dim skew-symmetric d x d matrices (to 1e-12; skew part used).
  std::vector<Matrix> generators{};
};

/// A gauge built for n tokens at the given positions (n rows of position_dim numbers).
class PositionalGauge : public Gauge {
 public:
  GeometryKind kind() const { return kind_; }
  std::size_t dim() const { return d_; }
  std::size_t tokens() const { return n_; }
  std::size_t position_dim() const { return k_; }
  /// The k skew generators actually used, so a reader can rebuild G(xi) = exp(sum xi_a Omega_a).
  const std::vector<Matrix>& generators() const { return generators_; }
  /// What the output records: generators(), for every family (block or dense).
  std::vector<Matrix> recorded_generators() const override;
  /// True when all generators commute (then G(xi)^T G(zeta) = G(zeta - xi)). Block families:
  /// always; lie: max |[Omega_a, Omega_b]| <= 1e-12 max(1, |Omega_a| |Omega_b|) (max norms).
  bool commuting() const { return commuting_; }
  /// Block families: the B x k frequency table W (theta_b = sum_a W(b,a) xi_a); lie: 0 x 0.
  const Matrix& frequency_table() const { return table_; }
  /// G(xi_token) as a dense d x d matrix (for tests and references; O(d^2) or more).
  virtual Matrix matrix(std::size_t token) const;

 protected:
  PositionalGauge(GeometryKind kind, std::size_t d, std::size_t n, std::size_t k)
      : kind_(kind), d_(d), n_(n), k_(k) {}
  GeometryKind kind_;
  std::size_t d_, n_, k_;
  std::vector<Matrix> generators_;
  Matrix table_;
  bool commuting_ = true;
};

/// Builds the gauge of `spec` for n tokens at `positions` (n * spec.position_dim numbers,
/// row-major, finite). Returns null for GeometryKind::None (Model's identity gauge).
/// Throws std::invalid_argument on an impossible spec (wrong position_dim for the family,
/// d < 2, bad base, a frequency list of the wrong length (the message names the expected
/// length), generators of the wrong count/shape or not skew, generators with a non-lie kind).
std::shared_ptr<const PositionalGauge> make_gauge(const GaugeSpec& spec,
                                                  const std::vector<double>& positions,
                                                  std::size_t n);

/// Reads k blocks of d rows of d numbers (whitespace or comma separated; '#' starts a comment;
/// blank lines may separate blocks but not split one). Each block must be skew-symmetric:
/// |A(i,j) + A(j,i)| <= 1e-12 for all i, j (the diagonal included); the skew part
/// (A - A^T)/2 is returned. k_expected = 0 accepts any k >= 1. Throws std::invalid_argument
/// naming the file, the block (1-based) and what is wrong.
std::vector<Matrix> read_generators(const std::string& path, std::size_t k_expected,
                                    std::size_t d);

}  // namespace mfattn
