#include "mfattn/core/gauge.hpp"

#include <unsupported/Eigen/MatrixFunctions>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

#include "mfattn/core/init.hpp"
#include "mfattn/core/input_file.hpp"
#include "mfattn/core/number_text.hpp"
#include "mfattn/core/rng.hpp"

namespace mfattn {

namespace {

constexpr std::uint64_t kTag = static_cast<std::uint64_t>(StreamTag::Generators);
constexpr double kSkewTolerance = 1e-12;
constexpr double kCommuteTolerance = 1e-12;

std::uint64_t kind_key(GeometryKind kind) { return static_cast<std::uint64_t>(kind); }

// ---------------------------------------------------------------------------------------------
// Block families: angles theta_{i,b} = sum_a W(b,a) xi_{i,a}; cos/sin stored per token and block.

class BlockGauge final : public PositionalGauge {
 public:
  BlockGauge(GeometryKind kind, std::size_t d, std::size_t n, std::size_t k, Matrix table,
             const std::vector<double>& positions, Matrix p)
      : PositionalGauge(kind, d, n, k), blocks_(d / 2), p_(std::move(p)) {
    table_ = std::move(table);
    conjugated_ = p_.size() > 0;
    cos_.resize(n * blocks_);
    sin_.resize(n * blocks_);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t b = 0; b < blocks_; ++b) {
        double theta = 0.0;
        for (std::size_t a = 0; a < k; ++a) theta += table_(b, a) * positions[i * k + a];
        cos_[i * blocks_ + b] = std::cos(theta);
        sin_[i * blocks_ + b] = std::sin(theta);
      }
    generators_.reserve(k);
    for (std::size_t a = 0; a < k; ++a) {
      Matrix om = Matrix::Zero(d, d);
      for (std::size_t b = 0; b < blocks_; ++b) {
        const auto r = static_cast<Eigen::Index>(2 * b);
        om(r, r + 1) = -table_(b, a);
        om(r + 1, r) = table_(b, a);
      }
      if (conjugated_) om = (p_ * om * p_.transpose()).eval();
      if (conjugated_) om = (0.5 * (om - om.transpose())).eval();  // exactly skew
      generators_.push_back(std::move(om));
    }
    commuting_ = true;
  }

  void apply(std::size_t token, const double* in, double* out) const override {
    assert(token < n_);
    if (!conjugated_) {
      rotate(token, in, out, false);
      return;
    }
    double* tmp = scratch();
    Eigen::Map<const Vector> x(in, static_cast<Eigen::Index>(d_));
    Eigen::Map<Vector> t(tmp, static_cast<Eigen::Index>(d_));
    Eigen::Map<Vector> y(out, static_cast<Eigen::Index>(d_));
    y.noalias() = p_.transpose() * x;  // out = P^T in
    rotate(token, out, tmp, false);    // tmp = R out
    y.noalias() = p_ * t;              // out = P tmp
  }

  void apply_transpose(std::size_t token, const double* in, double* out) const override {
    assert(token < n_);
    if (!conjugated_) {
      rotate(token, in, out, true);
      return;
    }
    double* tmp = scratch();
    Eigen::Map<const Vector> x(in, static_cast<Eigen::Index>(d_));
    Eigen::Map<Vector> t(tmp, static_cast<Eigen::Index>(d_));
    Eigen::Map<Vector> y(out, static_cast<Eigen::Index>(d_));
    y.noalias() = p_.transpose() * x;
    rotate(token, out, tmp, true);
    y.noalias() = p_ * t;
  }

  Matrix matrix(std::size_t token) const override {
    Matrix r = Matrix::Identity(d_, d_);
    for (std::size_t b = 0; b < blocks_; ++b) {
      const auto j = static_cast<Eigen::Index>(2 * b);
      const double c = cos_[token * blocks_ + b], s = sin_[token * blocks_ + b];
      r(j, j) = c;
      r(j, j + 1) = -s;
      r(j + 1, j) = s;
      r(j + 1, j + 1) = c;
    }
    if (!conjugated_) return r;
    return p_ * r * p_.transpose();
  }

 private:
  // out = R in (or R^T in); in and out may not alias.
  void rotate(std::size_t token, const double* in, double* out, bool transpose) const {
    const double* c = cos_.data() + token * blocks_;
    const double* s = sin_.data() + token * blocks_;
    const double sign = transpose ? -1.0 : 1.0;
    for (std::size_t b = 0; b < blocks_; ++b) {
      const double x0 = in[2 * b], x1 = in[2 * b + 1], sb = sign * s[b];
      out[2 * b] = c[b] * x0 - sb * x1;
      out[2 * b + 1] = sb * x0 + c[b] * x1;
    }
    if (d_ % 2 == 1) out[d_ - 1] = in[d_ - 1];
  }

  // Per-thread scratch of length d (apply may run concurrently from many threads).
  double* scratch() const {
    thread_local std::vector<double> buf;
    if (buf.size() < d_) buf.resize(d_);
    return buf.data();
  }

  std::size_t blocks_;
  bool conjugated_ = false;
  Matrix p_;  // empty unless rope-conjugated
  std::vector<double> cos_, sin_;
};

// ---------------------------------------------------------------------------------------------
// Lie: one dense G per token.

class DenseGauge final : public PositionalGauge {
 public:
  DenseGauge(std::size_t d, std::size_t n, std::size_t k, std::vector<Matrix> gens,
             const std::vector<double>& positions)
      : PositionalGauge(GeometryKind::Lie, d, n, k) {
    generators_ = std::move(gens);
    commuting_ = true;
    for (std::size_t a = 0; a < k && commuting_; ++a)
      for (std::size_t b = a + 1; b < k; ++b) {
        const Matrix& x = generators_[a];
        const Matrix& y = generators_[b];
        const double comm = (x * y - y * x).cwiseAbs().maxCoeff();
        const double scale =
            std::max(1.0, x.cwiseAbs().maxCoeff() * y.cwiseAbs().maxCoeff());
        if (comm > kCommuteTolerance * scale) {
          commuting_ = false;
          break;
        }
      }
    g_.resize(n * d * d);
    const auto dd = static_cast<Eigen::Index>(d);
    const auto nn = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for schedule(dynamic, 4)
    for (std::ptrdiff_t ii = 0; ii < nn; ++ii) {
      const auto i = static_cast<std::size_t>(ii);
      Eigen::MatrixXd a = Eigen::MatrixXd::Zero(dd, dd);
      for (std::size_t q = 0; q < k; ++q) a += positions[i * k + q] * generators_[q];
      Eigen::MatrixXd e = a.exp();
      // One Newton-Schulz polar step: the nearest orthogonal matrix to first order.
      const Eigen::MatrixXd corr =
          1.5 * Eigen::MatrixXd::Identity(dd, dd) - 0.5 * (e.transpose() * e);
      e = (e * corr).eval();
      Eigen::Map<Matrix>(g_.data() + i * d * d, dd, dd) = e;
    }
  }

  void apply(std::size_t token, const double* in, double* out) const override {
    assert(token < n_);
    const auto dd = static_cast<Eigen::Index>(d_);
    Eigen::Map<const Matrix> g(g_.data() + token * d_ * d_, dd, dd);
    Eigen::Map<Vector>(out, dd).noalias() = g * Eigen::Map<const Vector>(in, dd);
  }

  void apply_transpose(std::size_t token, const double* in, double* out) const override {
    assert(token < n_);
    const auto dd = static_cast<Eigen::Index>(d_);
    Eigen::Map<const Matrix> g(g_.data() + token * d_ * d_, dd, dd);
    Eigen::Map<Vector>(out, dd).noalias() = g.transpose() * Eigen::Map<const Vector>(in, dd);
  }

  Matrix matrix(std::size_t token) const override {
    const auto dd = static_cast<Eigen::Index>(d_);
    return Eigen::Map<const Matrix>(g_.data() + token * d_ * d_, dd, dd);
  }

 private:
  std::vector<double> g_;  // n row-major d x d matrices
};

// ---------------------------------------------------------------------------------------------

// Frequency table with block b on axis b mod k; the m-th block of axis a has base^(-2m/d_a),
// d_a = 2 B_a (k = 1: standard RoPE). An explicit list (length B) gives W(b, b mod k).
Matrix axis_table(const GaugeSpec& spec, std::size_t k) {
  const std::size_t blocks = spec.d / 2;
  Matrix w = Matrix::Zero(static_cast<Eigen::Index>(blocks), static_cast<Eigen::Index>(k));
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::size_t a = b % k, m = b / k;
    const std::size_t blocks_a = blocks / k + (a < blocks % k ? 1 : 0);
    const double da = 2.0 * static_cast<double>(blocks_a);
    const double omega = spec.frequencies.empty()
                             ? (m == 0 ? 1.0 : std::pow(spec.base, -2.0 * static_cast<double>(m) / da))
                             : spec.frequencies[b];
    w(static_cast<Eigen::Index>(b), static_cast<Eigen::Index>(a)) = omega;
  }
  return w;
}

// Standard RoPE schedule needs da = d (not 2 floor(d/2)) for odd d: omega_b = base^(-2b/d).
Matrix rope_table(const GaugeSpec& spec) {
  const std::size_t blocks = spec.d / 2;
  Matrix w(static_cast<Eigen::Index>(blocks), 1);
  for (std::size_t b = 0; b < blocks; ++b)
    w(static_cast<Eigen::Index>(b), 0) =
        spec.frequencies.empty()
            ? (b == 0 ? 1.0
                      : std::pow(spec.base, -2.0 * static_cast<double>(b) /
                                                static_cast<double>(spec.d)))
            : spec.frequencies[b];
  return w;
}

Matrix mixed_table(const GaugeSpec& spec) {
  const std::size_t blocks = spec.d / 2;
  Matrix w(static_cast<Eigen::Index>(blocks), 2);
  if (spec.frequencies.size() == 2 * blocks) {
    for (std::size_t b = 0; b < blocks; ++b)
      for (std::size_t a = 0; a < 2; ++a)
        w(static_cast<Eigen::Index>(b), static_cast<Eigen::Index>(a)) = spec.frequencies[2 * b + a];
    return w;
  }
  const Matrix mag = rope_table(spec);
  RandomStream rs(spec.seed, kTag, kind_key(GeometryKind::RopeMixed), 0);
  for (std::size_t b = 0; b < blocks; ++b) {
    double gx = 0.0, gy = 0.0, r = 0.0;
    while (r == 0.0) {
      gx = rs.normal();
      gy = rs.normal();
      r = std::sqrt(gx * gx + gy * gy);
    }
    const double m = mag(static_cast<Eigen::Index>(b), 0);
    w(static_cast<Eigen::Index>(b), 0) = m * gx / r;
    w(static_cast<Eigen::Index>(b), 1) = m * gy / r;
  }
  return w;
}

// Haar-random orthogonal P: Gram-Schmidt (two passes) of Gaussian columns.
Matrix haar_orthogonal(std::size_t d, std::uint64_t seed) {
  RandomStream rs(seed, kTag, kind_key(GeometryKind::RopeConjugated), 0);
  const auto dd = static_cast<Eigen::Index>(d);
  Eigen::MatrixXd q(dd, dd);
  for (Eigen::Index c = 0; c < dd; ++c) {
    for (;;) {
      for (Eigen::Index j = 0; j < dd; ++j) q(j, c) = rs.normal();
      for (int pass = 0; pass < 2; ++pass)
        for (Eigen::Index l = 0; l < c; ++l) q.col(c) -= q.col(l).dot(q.col(c)) * q.col(l);
      const double nr = q.col(c).norm();
      if (nr > 1e-8) {  // a (measure-zero) dependent column is redrawn from the same stream
        q.col(c) /= nr;
        break;
      }
    }
  }
  return q;
}

std::vector<Matrix> random_lie_generators(std::size_t d, std::size_t k, std::uint64_t seed) {
  std::vector<Matrix> out;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const auto dd = static_cast<Eigen::Index>(d);
  for (std::size_t a = 0; a < k; ++a) {
    RandomStream rs(seed, kTag, kind_key(GeometryKind::Lie), a);
    Matrix om = Matrix::Zero(dd, dd);
    for (Eigen::Index i = 0; i < dd; ++i)
      for (Eigen::Index j = i + 1; j < dd; ++j) {
        om(i, j) = scale * rs.normal();
        om(j, i) = -om(i, j);
      }
    out.push_back(std::move(om));
  }
  return out;
}

void check_frequencies(const GaugeSpec& spec, const std::string& name, bool allow_pairs) {
  const std::size_t blocks = spec.d / 2;
  const auto& f = spec.frequencies;
  if (!f.empty() && f.size() != blocks && !(allow_pairs && f.size() == 2 * blocks)) {
    std::string expected = std::to_string(blocks) + " (floor(d/2) for d = " +
                           std::to_string(spec.d) + ")";
    if (allow_pairs) expected += " or " + std::to_string(2 * blocks) + " (x,y pairs)";
    throw std::invalid_argument(name + ": expected " + expected + " frequencies, got " +
                                std::to_string(f.size()));
  }
  for (std::size_t i = 0; i < f.size(); ++i)
    if (!std::isfinite(f[i]))
      throw std::invalid_argument(name + ": frequency " + std::to_string(i + 1) +
                                  " is not finite");
}

std::string describe_skew_error(const Matrix& a, std::size_t d) {
  for (std::size_t i = 0; i < d; ++i)
    for (std::size_t j = i; j < d; ++j) {
      const auto ii = static_cast<Eigen::Index>(i), jj = static_cast<Eigen::Index>(j);
      const double asym = std::fabs(a(ii, jj) + a(jj, ii));
      if (!(asym <= kSkewTolerance)) {
        if (i == j)
          return "not skew-symmetric: diagonal entry (" + std::to_string(i + 1) + "," +
                 std::to_string(i + 1) + ") = " + format_number(a(ii, ii)) + " is not 0";
        return "not skew-symmetric: entries (" + std::to_string(i + 1) + "," +
               std::to_string(j + 1) + ") = " + format_number(a(ii, jj)) + " and (" +
               std::to_string(j + 1) + "," + std::to_string(i + 1) + ") = " +
               format_number(a(jj, ii)) + " do not sum to 0 (|sum| = " + format_number(asym) + " > 1e-12)";
      }
    }
  return {};
}

}  // namespace

Matrix PositionalGauge::matrix(std::size_t token) const {
  Matrix g(d_, d_);
  Vector e = Vector::Zero(static_cast<Eigen::Index>(d_));
  Vector col(static_cast<Eigen::Index>(d_));
  for (std::size_t c = 0; c < d_; ++c) {
    e.setZero();
    e(static_cast<Eigen::Index>(c)) = 1.0;
    apply(token, e.data(), col.data());
    g.col(static_cast<Eigen::Index>(c)) = col;
  }
  return g;
}

std::vector<Matrix> PositionalGauge::recorded_generators() const { return generators_; }

std::string geometry_name(GeometryKind kind) {
  for (const Choice<GeometryKind>& choice : kGeometryChoices)
    if (choice.value == kind) return std::string(choice.name);
  return "unknown";
}

std::vector<std::string> geometry_names() {
  std::vector<std::string> names;
  for (const Choice<GeometryKind>& choice : kGeometryChoices) names.emplace_back(choice.name);
  return names;
}

GeometryKind parse_geometry(const std::string& name) {
  for (const Choice<GeometryKind>& choice : kGeometryChoices)
    if (name == choice.name) return choice.value;
  std::string accepted;
  for (const auto& known : geometry_names()) accepted += (accepted.empty() ? "" : ", ") + known;
  throw std::invalid_argument("unknown geometry '" + name + "' (accepted: " + accepted + ")");
}

std::shared_ptr<const PositionalGauge> make_gauge(const GaugeSpec& spec,
                                                  const std::vector<double>& positions,
                                                  std::size_t n) {
  if (spec.kind == GeometryKind::None) return nullptr;
  const std::string name = geometry_name(spec.kind);
  const std::size_t d = spec.d, k = spec.position_dim;
  if (d < 2) throw std::invalid_argument(name + ": d must be >= 2 (got " + std::to_string(d) + ")");
  const auto need_k = [&](std::size_t want) {
    if (k != want)
      throw std::invalid_argument(name + " needs position_dim = " + std::to_string(want) +
                                  " (got " + std::to_string(k) + ")");
  };
  if (k < 1) throw std::invalid_argument(name + ": position_dim must be >= 1 (got 0)");
  if (positions.size() != n * k)
    throw std::invalid_argument(name + ": expected " + std::to_string(n) + " x " +
                                std::to_string(k) + " = " + std::to_string(n * k) +
                                " position numbers, got " + std::to_string(positions.size()));
  for (std::size_t i = 0; i < positions.size(); ++i)
    if (!std::isfinite(positions[i]))
      throw std::invalid_argument(name + ": position of token " + std::to_string(i / k) +
                                  " is not finite");
  if (spec.kind != GeometryKind::Lie) {
    if (!spec.generators.empty())
      throw std::invalid_argument(name + ": explicit generators are only accepted with "
                                  "geometry 'lie' (which takes any skew generators)");
    if (!std::isfinite(spec.base) || !(spec.base > 0.0))
      throw std::invalid_argument(name + ": base must be finite and > 0 (got " +
                                  format_number(spec.base) + ")");
  }

  switch (spec.kind) {
    case GeometryKind::Rope:
      need_k(1);
      check_frequencies(spec, name, false);
      return std::make_shared<BlockGauge>(spec.kind, d, n, k, rope_table(spec), positions,
                                          Matrix());
    case GeometryKind::RopeAxial:
      need_k(2);
      check_frequencies(spec, name, false);
      return std::make_shared<BlockGauge>(spec.kind, d, n, k, axis_table(spec, 2), positions,
                                          Matrix());
    case GeometryKind::RopeMixed:
      need_k(2);
      check_frequencies(spec, name, true);
      return std::make_shared<BlockGauge>(spec.kind, d, n, k, mixed_table(spec), positions,
                                          Matrix());
    case GeometryKind::RopeConjugated: {
      check_frequencies(spec, name, false);
      Matrix table = k == 1 ? rope_table(spec) : axis_table(spec, k);
      return std::make_shared<BlockGauge>(spec.kind, d, n, k, std::move(table), positions,
                                          haar_orthogonal(d, spec.seed));
    }
    case GeometryKind::Lie: {
      std::vector<Matrix> gens;
      if (spec.generators.empty()) {
        gens = random_lie_generators(d, k, spec.seed);
      } else {
        if (spec.generators.size() != k)
          throw std::invalid_argument("lie: expected position_dim = " + std::to_string(k) +
                                      " generators, got " +
                                      std::to_string(spec.generators.size()));
        for (std::size_t a = 0; a < k; ++a) {
          const Matrix& g = spec.generators[a];
          if (static_cast<std::size_t>(g.rows()) != d || static_cast<std::size_t>(g.cols()) != d)
            throw std::invalid_argument("lie: generator " + std::to_string(a + 1) + " is " +
                                        std::to_string(g.rows()) + " x " +
                                        std::to_string(g.cols()) + ", expected " +
                                        std::to_string(d) + " x " + std::to_string(d));
          if (!g.allFinite())
            throw std::invalid_argument("lie: generator " + std::to_string(a + 1) +
                                        " has a non-finite entry");
          if (const std::string why = describe_skew_error(g, d); !why.empty())
            throw std::invalid_argument("lie: generator " + std::to_string(a + 1) + " is " + why);
          gens.push_back(0.5 * (g - g.transpose()));
        }
      }
      return std::make_shared<DenseGauge>(d, n, k, std::move(gens), positions);
    }
    case GeometryKind::None: break;
  }
  return nullptr;
}

std::vector<Matrix> read_generators(const std::string& path, std::size_t k_expected,
                                    std::size_t d) {
  if (d < 1) throw std::invalid_argument("read_generators: d must be >= 1");
  std::istringstream in(read_input_file(path, kMaxNumbersFileBytes));
  const auto dd = static_cast<Eigen::Index>(d);
  std::vector<Matrix> blocks;
  Matrix current(dd, dd);
  std::size_t rows = 0;  // rows of the current block read so far
  std::size_t lineno = 0;
  std::string line;
  while (std::getline(in, line)) {
    ++lineno;
    const auto fail = [&](const std::string& what) {
      throw std::invalid_argument(path + ":" + std::to_string(lineno) + " (block " +
                                  std::to_string(blocks.size() + 1) + ", row " +
                                  std::to_string(rows + 1) + "): " + what);
    };
    std::string_view s(line);
    const bool comment_only = s.find('#') != std::string_view::npos &&
                              s.find_first_not_of(" \t\r\v\f") == s.find('#');
    std::vector<double> vals;
    if (const std::string error = parse_number_line(line, vals); !error.empty()) fail(error);
    if (vals.empty()) {
      // A blank line ends a block; it may not split one. Comment-only lines are ignored.
      if (!comment_only && rows != 0)
        fail("blank line inside a block: a block has d = " + std::to_string(d) +
             " rows, only " + std::to_string(rows) + " read");
      continue;
    }
    if (vals.size() != d)
      fail("expected d = " + std::to_string(d) + " numbers, found " + std::to_string(vals.size()));
    for (std::size_t j = 0; j < d; ++j)
      current(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(j)) = vals[j];
    if (++rows == d) {
      blocks.push_back(current);
      rows = 0;
    }
  }
  if (rows != 0)
    throw std::invalid_argument(path + ": block " + std::to_string(blocks.size() + 1) +
                                " is incomplete: " + std::to_string(rows) + " of d = " +
                                std::to_string(d) + " rows");
  if (blocks.empty()) throw std::invalid_argument(path + ": contains no generator blocks");
  if (k_expected != 0 && blocks.size() != k_expected)
    throw std::invalid_argument(path + ": expected " + std::to_string(k_expected) +
                                " generator blocks (one per position axis), found " +
                                std::to_string(blocks.size()));
  for (std::size_t a = 0; a < blocks.size(); ++a) {
    if (const std::string why = describe_skew_error(blocks[a], d); !why.empty())
      throw std::invalid_argument(path + ": block " + std::to_string(a + 1) + " is " + why);
    blocks[a] = (0.5 * (blocks[a] - blocks[a].transpose())).eval();
  }
  return blocks;
}

}  // namespace mfattn
