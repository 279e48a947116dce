// Positional gauges G(xi) = exp(sum_a xi_a Omega_a) (gauge.hpp, docs/model.md section 3).
#include <gtest/gtest.h>

#include <unistd.h>

#include <unsupported/Eigen/MatrixFunctions>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "mfattn/core/gauge.hpp"
#include "mfattn/core/rng.hpp"
#include "test_support.hpp"

using namespace mfattn;

namespace {

struct Family {
  GeometryKind kind;
  std::size_t k;  // position_dim
};

// Every family with every position dimension it takes (conjugated and lie: k = 1 and 2).
const std::vector<Family> kAllFamilies = {
    {GeometryKind::Rope, 1},           {GeometryKind::RopeAxial, 2},
    {GeometryKind::RopeMixed, 2},      {GeometryKind::RopeConjugated, 1},
    {GeometryKind::RopeConjugated, 2}, {GeometryKind::Lie, 1},
    {GeometryKind::Lie, 2}};

const std::vector<Family> kCommutingFamilies = {{GeometryKind::Rope, 1},
                                                {GeometryKind::RopeAxial, 2},
                                                {GeometryKind::RopeMixed, 2},
                                                {GeometryKind::RopeConjugated, 1},
                                                {GeometryKind::RopeConjugated, 2}};

std::string label(const Family& f, std::size_t d) {
  return geometry_name(f.kind) + " k=" + std::to_string(f.k) + " d=" + std::to_string(d);
}

GaugeSpec spec_of(const Family& f, std::size_t d, std::uint64_t seed = 11, double base = 10.0) {
  GaugeSpec s;
  s.kind = f.kind;
  s.d = d;
  s.position_dim = f.k;
  s.base = base;  // a small base makes every block turn noticeably
  s.seed = seed;
  return s;
}

// n random positions in [-range, range]^k.
std::vector<double> random_positions(std::size_t n, std::size_t k, double range,
                                     std::uint64_t key) {
  RandomStream rs(99, key);
  std::vector<double> p(n * k);
  for (double& v : p) v = range * rs.uniform_symmetric();
  return p;
}

Vector random_vector(std::size_t d, std::uint64_t key) {
  RandomStream rs(123, key);
  Vector v(static_cast<Eigen::Index>(d));
  for (Eigen::Index j = 0; j < v.size(); ++j) v(j) = rs.normal();
  return v;
}

double max_abs(const Eigen::MatrixXd& m) { return m.cwiseAbs().maxCoeff(); }

// exp(sum_a xi_a Omega_a) from the gauge's own generators, with Eigen's MatrixFunctions.
Eigen::MatrixXd reference_exp(const PositionalGauge& g, const double* xi) {
  const auto d = static_cast<Eigen::Index>(g.dim());
  Eigen::MatrixXd a = Eigen::MatrixXd::Zero(d, d);
  for (std::size_t q = 0; q < g.position_dim(); ++q) a += xi[q] * g.generators()[q];
  return a.exp();
}

// G(xi_token) assembled column by column through apply(), so the hot path is checked too.
Eigen::MatrixXd applied_matrix(const PositionalGauge& g, std::size_t token) {
  const auto d = static_cast<Eigen::Index>(g.dim());
  Eigen::MatrixXd m(d, d);
  Vector e = Vector::Zero(d), col(d);
  for (Eigen::Index c = 0; c < d; ++c) {
    e.setZero();
    e(c) = 1.0;
    g.apply(token, e.data(), col.data());
    m.col(c) = col;
  }
  return m;
}


std::filesystem::path scratch_file(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("mfattn_test_gauge_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir / name;
}

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p);
  out << text;
}

}  // namespace

TEST(Gauge, EveryFamilyIsOrthogonal) {
  const std::size_t n = 7;
  for (std::size_t d : {2u, 3u, 4u, 5u, 8u})
    for (const Family& f : kAllFamilies) {
      const auto pos = random_positions(n, f.k, 6.0, d);
      const auto g = make_gauge(spec_of(f, d), pos, n);
      ASSERT_TRUE(g) << label(f, d);
      for (std::size_t i = 0; i < n; ++i)
        for (const Eigen::MatrixXd& m : {Eigen::MatrixXd(g->matrix(i)), applied_matrix(*g, i)}) {
          const auto dd = static_cast<Eigen::Index>(d);
          EXPECT_LE(max_abs(m.transpose() * m - Eigen::MatrixXd::Identity(dd, dd)), 1e-13)
              << label(f, d) << " token " << i;
          EXPECT_NEAR(m.determinant(), 1.0, 1e-12) << label(f, d) << " token " << i;
        }
    }
}

TEST(Gauge, MatchesMatrixExponentialOfItsGenerators) {
  const std::size_t n = 6;
  for (std::size_t d : {2u, 3u, 4u, 5u, 8u})
    for (const Family& f : kAllFamilies) {
      const auto pos = random_positions(n, f.k, 3.0, 100 + d);
      const auto g = make_gauge(spec_of(f, d), pos, n);
      ASSERT_EQ(g->generators().size(), f.k) << label(f, d);
      for (const Matrix& om : g->generators()) {
        ASSERT_EQ(static_cast<std::size_t>(om.rows()), d);
        EXPECT_EQ(max_abs(om + om.transpose()), 0.0) << label(f, d) << ": not exactly skew";
      }
      for (std::size_t i = 0; i < n; ++i) {
        const Eigen::MatrixXd ref = reference_exp(*g, pos.data() + i * f.k);
        EXPECT_LE(max_abs(g->matrix(i) - ref), 1e-12) << label(f, d) << " token " << i;
        EXPECT_LE(max_abs(applied_matrix(*g, i) - ref), 1e-12) << label(f, d) << " token " << i;
      }
    }
  // An explicit frequency list too.
  GaugeSpec s = spec_of({GeometryKind::Rope, 1}, 6);
  s.frequencies = {0.3, -1.7, 2.5};
  const std::vector<double> pos = {-2.0, 0.0, 0.4, 3.1};
  const auto g = make_gauge(s, pos, pos.size());
  for (std::size_t i = 0; i < pos.size(); ++i)
    EXPECT_LE(max_abs(g->matrix(i) - reference_exp(*g, &pos[i])), 1e-12) << "token " << i;
}

TEST(Gauge, RelativePropertyHoldsForCommutingFamilies) {
  for (std::size_t d : {2u, 3u, 4u, 5u, 8u})
    for (const Family& f : kCommutingFamilies) {
      // Tokens at xi, zeta and zeta - xi.
      const auto two = random_positions(2, f.k, 4.0, 200 + d);
      std::vector<double> pos(two);
      for (std::size_t a = 0; a < f.k; ++a) pos.push_back(two[f.k + a] - two[a]);
      const auto g = make_gauge(spec_of(f, d), pos, 3);
      EXPECT_TRUE(g->commuting()) << label(f, d);
      const Eigen::MatrixXd lhs = g->matrix(0).transpose() * g->matrix(1);
      EXPECT_LE(max_abs(lhs - g->matrix(2)), 1e-12) << label(f, d);
    }
}

TEST(Gauge, RelativePropertyFailsForLie) {
  // Documented failure: random (non-commuting) Lie generators break G(xi)^T G(zeta) = G(zeta-xi).
  for (std::size_t d : {3u, 4u, 8u}) {
    const Family f{GeometryKind::Lie, 2};
    const std::vector<double> pos = {0.9, -1.2, 1.4, 0.6, 1.4 - 0.9, 0.6 + 1.2};
    const auto g = make_gauge(spec_of(f, d), pos, 3);
    EXPECT_FALSE(g->commuting()) << label(f, d);
    const Eigen::MatrixXd lhs = g->matrix(0).transpose() * g->matrix(1);
    EXPECT_GT(max_abs(lhs - g->matrix(2)), 1e-3) << label(f, d);
  }
}

TEST(Gauge, LieWithGivenCommutingGeneratorsIsRecognisedAsCommuting) {
  // The conjugated family's generators handed to 'lie' give the same G and commuting() = true.
  const std::size_t d = 5;
  const auto pos = random_positions(4, 2, 3.0, 7);
  const auto conj = make_gauge(spec_of({GeometryKind::RopeConjugated, 2}, d), pos, 4);
  GaugeSpec s = spec_of({GeometryKind::Lie, 2}, d);
  s.generators = conj->generators();
  const auto lie = make_gauge(s, pos, 4);
  EXPECT_TRUE(lie->commuting());
  for (std::size_t i = 0; i < 4; ++i) EXPECT_LE(max_abs(lie->matrix(i) - conj->matrix(i)), 1e-12);
  // Wrong number or shape of given generators is refused.
  s.generators.pop_back();
  EXPECT_NE(mfattn::testing::message_of([&] { make_gauge(s, pos, 4); }).find("expected position_dim = 2"),
            std::string::npos);
  s.generators = {Matrix::Zero(4, 4), Matrix::Zero(4, 4)};
  EXPECT_NE(mfattn::testing::message_of([&] { make_gauge(s, pos, 4); }).find("expected 5 x 5"), std::string::npos);
  // Explicit generators are only for 'lie'.
  GaugeSpec r = spec_of({GeometryKind::Rope, 1}, d);
  r.generators = {Matrix::Zero(5, 5)};
  EXPECT_NE(mfattn::testing::message_of([&] { make_gauge(r, {0.0}, 1); }).find("only accepted with geometry 'lie'"),
            std::string::npos);
}

TEST(Gauge, RopeOddDimensionLeavesLastCoordinate) {
  const std::vector<double> xi = {-2.3, -0.5, 0.0, 0.8, 3.0, 17.25};
  GaugeSpec s = spec_of({GeometryKind::Rope, 1}, 3, 0, 10000.0);
  const auto g = make_gauge(s, xi, xi.size());
  for (std::size_t i = 0; i < xi.size(); ++i) {
    const double e1[3] = {1, 0, 0}, e2[3] = {0, 1, 0}, e3[3] = {0, 0, 1};
    double o1[3], o2[3], o3[3];
    g->apply(i, e1, o1);
    g->apply(i, e2, o2);
    g->apply(i, e3, o3);
    // omega_1 = base^0 = 1: the x-y plane turns by xi.
    const double c = std::cos(xi[i]), s1 = std::sin(xi[i]);
    EXPECT_NEAR(o1[0], c, 1e-15);
    EXPECT_NEAR(o1[1], s1, 1e-15);
    EXPECT_EQ(o1[2], 0.0);
    EXPECT_NEAR(o2[0], -s1, 1e-15);
    EXPECT_NEAR(o2[1], c, 1e-15);
    EXPECT_EQ(o2[2], 0.0);
    EXPECT_EQ(o3[0], 0.0);
    EXPECT_EQ(o3[1], 0.0);
    EXPECT_EQ(o3[2], 1.0);
  }
  // d = 5: the last coordinate is fixed as well, for every family built on RoPE blocks.
  for (const Family& f : {Family{GeometryKind::Rope, 1}, Family{GeometryKind::RopeAxial, 2},
                          Family{GeometryKind::RopeMixed, 2}}) {
    const auto pos = random_positions(3, f.k, 5.0, 3);
    const auto h = make_gauge(spec_of(f, 5), pos, 3);
    for (std::size_t i = 0; i < 3; ++i) {
      const Matrix m = h->matrix(i);
      for (Eigen::Index j = 0; j < 5; ++j) {
        EXPECT_EQ(m(4, j), j == 4 ? 1.0 : 0.0) << label(f, 5);
        EXPECT_EQ(m(j, 4), j == 4 ? 1.0 : 0.0) << label(f, 5);
      }
    }
  }
}

TEST(Gauge, RopeFrequenciesFollowBase) {
  for (std::size_t d : {2u, 7u, 8u}) {
    for (double base : {10000.0, 100.0}) {
      GaugeSpec s = spec_of({GeometryKind::Rope, 1}, d, 0, base);
      const auto g = make_gauge(s, {1.0}, 1);
      const Matrix& om = g->generators()[0];
      for (std::size_t b = 1; b <= d / 2; ++b) {  // 1-based block index, as in docs/model.md
        const double want = std::pow(base, -2.0 * static_cast<double>(b - 1) / static_cast<double>(d));
        const auto r = static_cast<Eigen::Index>(2 * (b - 1));
        EXPECT_NEAR(om(r + 1, r), want, 1e-15 * want) << "d=" << d << " b=" << b;
        EXPECT_EQ(om(r, r + 1), -om(r + 1, r));
        EXPECT_NEAR(g->frequency_table()(r / 2, 0), want, 1e-15 * want);
        // At xi = 1 the block turns by omega_b.
        EXPECT_NEAR(g->matrix(0)(r + 1, r), std::sin(want), 1e-15);
      }
    }
  }
  // An explicit list is used as given.
  GaugeSpec s = spec_of({GeometryKind::Rope, 1}, 8);
  s.frequencies = {0.25, 3.0, -1.5, 0.0};
  const auto g = make_gauge(s, {2.0}, 1);
  for (Eigen::Index b = 0; b < 4; ++b) {
    EXPECT_EQ(g->generators()[0](2 * b + 1, 2 * b), s.frequencies[static_cast<std::size_t>(b)]);
    EXPECT_NEAR(g->matrix(0)(2 * b + 1, 2 * b), std::sin(2.0 * s.frequencies[static_cast<std::size_t>(b)]),
                1e-15);
  }
  // A list of the wrong length throws naming the expected length.
  s.frequencies = {1.0, 2.0, 3.0};
  const std::string msg = mfattn::testing::message_of([&] { make_gauge(s, {0.0}, 1); });
  EXPECT_NE(msg.find("expected 4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("got 3"), std::string::npos) << msg;
  GaugeSpec a = spec_of({GeometryKind::RopeAxial, 2}, 9);
  a.frequencies = {1.0};
  EXPECT_NE(mfattn::testing::message_of([&] { make_gauge(a, {0.0, 0.0}, 1); }).find("expected 4"),
            std::string::npos);
}

TEST(Gauge, RopeAxialAlternatesAxesWithPerAxisFrequencies) {
  // d = 8, base 100: blocks 0, 2 on axis x, blocks 1, 3 on axis y; each axis is a 4-dim RoPE:
  // frequencies 1, 100^(-2/4).
  const auto g = make_gauge(spec_of({GeometryKind::RopeAxial, 2}, 8, 0, 100.0), {0.0, 0.0}, 1);
  Matrix want(4, 2);
  want << 1, 0, 0, 1, 0.1, 0, 0, 0.1;
  EXPECT_LE(max_abs(g->frequency_table() - want), 1e-16);
  // d = 10 (5 blocks): x owns 3 blocks (d_x = 6), y owns 2 (d_y = 4).
  const auto h = make_gauge(spec_of({GeometryKind::RopeAxial, 2}, 10, 0, 100.0), {0.0, 0.0}, 1);
  Matrix want10(5, 2);
  want10 << 1, 0, 0, 1, std::pow(100.0, -2.0 / 6), 0, 0, 0.1, std::pow(100.0, -4.0 / 6), 0;
  EXPECT_LE(max_abs(h->frequency_table() - want10), 1e-16);
  // The y position does not move the x blocks and vice versa.
  const auto p = make_gauge(spec_of({GeometryKind::RopeAxial, 2}, 4, 0, 100.0),
                            {0.0, 0.7, 0.3, 0.0}, 2);
  const Matrix m0 = p->matrix(0), m1 = p->matrix(1);
  EXPECT_EQ(m0(1, 0), 0.0);
  EXPECT_NEAR(m0(3, 2), std::sin(0.7), 1e-15);
  EXPECT_NEAR(m1(1, 0), std::sin(0.3), 1e-15);
  EXPECT_EQ(m1(3, 2), 0.0);
}

TEST(Gauge, RopeMixedHasRopeMagnitudesAndSeededDirections) {
  const std::size_t d = 9;
  const auto g = make_gauge(spec_of({GeometryKind::RopeMixed, 2}, d, 5, 100.0), {0.0, 0.0}, 1);
  const auto same = make_gauge(spec_of({GeometryKind::RopeMixed, 2}, d, 5, 100.0), {0.0, 0.0}, 1);
  const auto other = make_gauge(spec_of({GeometryKind::RopeMixed, 2}, d, 6, 100.0), {0.0, 0.0}, 1);
  const Matrix& w = g->frequency_table();
  ASSERT_EQ(w.rows(), 4);
  for (Eigen::Index b = 0; b < 4; ++b) {
    const double want = std::pow(100.0, -2.0 * static_cast<double>(b) / static_cast<double>(d));
    EXPECT_NEAR(w.row(b).norm(), want, 1e-15) << "block " << b;
    EXPECT_GT(std::fabs(w(b, 0)), 0.0);  // a genuine mixture: both axes involved
    EXPECT_GT(std::fabs(w(b, 1)), 0.0);
  }
  EXPECT_EQ(max_abs(w - same->frequency_table()), 0.0);
  EXPECT_GT(max_abs(w - other->frequency_table()), 1e-3);
  // An explicit list of 2B numbers gives the table row-major; B numbers give the magnitudes.
  GaugeSpec s = spec_of({GeometryKind::RopeMixed, 2}, 4);
  s.frequencies = {0.5, -0.25, 2.0, 1.0};
  Matrix want(2, 2);
  want << 0.5, -0.25, 2.0, 1.0;
  EXPECT_EQ(max_abs(make_gauge(s, {0.0, 0.0}, 1)->frequency_table() - want), 0.0);
  s.frequencies = {3.0, 0.5};
  const Matrix w2 = make_gauge(s, {0.0, 0.0}, 1)->frequency_table();
  EXPECT_NEAR(w2.row(0).norm(), 3.0, 1e-15);
  EXPECT_NEAR(w2.row(1).norm(), 0.5, 1e-15);
  s.frequencies = {1.0, 2.0, 3.0};
  const std::string msg = mfattn::testing::message_of([&] { make_gauge(s, {0.0, 0.0}, 1); });
  EXPECT_NE(msg.find("expected 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("or 4"), std::string::npos) << msg;
}

TEST(Gauge, ApplyTransposeInvertsApply) {
  const std::size_t n = 5;
  for (std::size_t d : {2u, 3u, 5u, 8u, 11u})
    for (const Family& f : kAllFamilies) {
      const auto pos = random_positions(n, f.k, 5.0, 300 + d);
      const auto g = make_gauge(spec_of(f, d), pos, n);
      for (std::size_t i = 0; i < n; ++i) {
        const Vector x = random_vector(d, i);
        Vector y(x.size()), z(x.size()), w(x.size());
        g->apply(i, x.data(), y.data());
        g->apply_transpose(i, y.data(), z.data());
        EXPECT_LE((z - x).cwiseAbs().maxCoeff(), 1e-13) << label(f, d) << " token " << i;
        // apply agrees with matrix(), apply_transpose with its transpose.
        const Matrix m = g->matrix(i);
        EXPECT_LE((y - m * x).cwiseAbs().maxCoeff(), 1e-13) << label(f, d);
        g->apply_transpose(i, x.data(), w.data());
        EXPECT_LE((w - m.transpose() * x).cwiseAbs().maxCoeff(), 1e-13) << label(f, d);
        EXPECT_GT((y - x).cwiseAbs().maxCoeff(), 1e-6) << label(f, d) << ": G = I?";
      }
    }
}

TEST(Gauge, ReadGeneratorsRejectsNonSkew) {
  const auto good = scratch_file("good.txt");
  write_file(good,
             "# two generators for d = 3\n"
             "0 1.5 -2\n"
             "-1.5, 0, 0.25  # commas work too\n"
             "2 -0.25 0\n"
             "\n"
             "\n"
             "0 0 1e-13\n"          // asymmetry 1e-13: within 1e-12
             "0 0 -3\n"
             "0 3 0\n");
  const auto gens = read_generators(good.string(), 2, 3);
  ASSERT_EQ(gens.size(), 2u);
  EXPECT_EQ(gens[0](0, 1), 1.5);
  EXPECT_EQ(gens[0](2, 1), -0.25);
  EXPECT_EQ(gens[1](1, 2), -3.0);
  for (const Matrix& om : gens) EXPECT_EQ(max_abs(om + om.transpose()), 0.0);
  EXPECT_EQ(read_generators(good.string(), 0, 3).size(), 2u);
  // They build a 'lie' gauge.
  GaugeSpec s = spec_of({GeometryKind::Lie, 2}, 3);
  s.generators = gens;
  EXPECT_FALSE(make_gauge(s, {0.1, 0.2}, 1)->commuting());

  const auto bad = scratch_file("bad.txt");
  write_file(bad,
             "0 1 0\n-1 0 0\n0 0 0\n\n"
             "0 0.5 0\n-0.4 0 0\n0 0 0\n");
  std::string msg = mfattn::testing::message_of([&] { read_generators(bad.string(), 0, 3); });
  EXPECT_NE(msg.find(bad.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("block 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not skew-symmetric"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(1,2)"), std::string::npos) << msg;

  write_file(bad, "0 1 0\n-1 1e-9 0\n0 0 0\n");
  msg = mfattn::testing::message_of([&] { read_generators(bad.string(), 1, 3); });
  EXPECT_NE(msg.find("block 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("diagonal entry (2,2)"), std::string::npos) << msg;

  // Wrong count, wrong row length, a block split by a blank line, an incomplete block.
  EXPECT_NE(mfattn::testing::message_of([&] { read_generators(good.string(), 1, 3); })
                .find("expected 1 generator blocks"),
            std::string::npos);
  write_file(bad, "0 1\n-1 0 0\n0 0 0\n");
  msg = mfattn::testing::message_of([&] { read_generators(bad.string(), 0, 3); });
  EXPECT_NE(msg.find(":1 (block 1, row 1): expected d = 3 numbers, found 2"), std::string::npos)
      << msg;
  write_file(bad, "0 1 0\n\n-1 0 0\n0 0 0\n");
  EXPECT_NE(mfattn::testing::message_of([&] { read_generators(bad.string(), 0, 3); }).find("blank line inside a block"),
            std::string::npos);
  write_file(bad, "0 1 0\n-1 0 0\n");
  EXPECT_NE(mfattn::testing::message_of([&] { read_generators(bad.string(), 0, 3); }).find("incomplete"),
            std::string::npos);
  write_file(bad, "0 x 0\n-1 0 0\n0 0 0\n");
  EXPECT_NE(mfattn::testing::message_of([&] { read_generators(bad.string(), 0, 3); }).find("'x' is not a number"),
            std::string::npos);
  EXPECT_NE(mfattn::testing::message_of([&] { read_generators((bad.parent_path() / "missing.txt").string(), 0, 3); })
                .find("no such file"),
            std::string::npos);
  std::filesystem::remove_all(good.parent_path());
}

TEST(Gauge, ParseGeometryAndSpecValidation) {
  for (const char* name : {"none", "rope", "rope-axial", "rope-mixed", "rope-conjugated", "lie"})
    EXPECT_EQ(geometry_name(parse_geometry(name)), name);
  const std::string msg = mfattn::testing::message_of([] { parse_geometry("rope3d"); });
  EXPECT_NE(msg.find("'rope3d'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("none, rope, rope-axial, rope-mixed, rope-conjugated, lie"), std::string::npos)
      << msg;
  // none is the identity gauge: a null pointer, as Model expects.
  EXPECT_EQ(make_gauge(spec_of({GeometryKind::None, 1}, 3), {0.0}, 1), nullptr);
  // position_dim must suit the family; positions must be n x k.
  EXPECT_NE(mfattn::testing::message_of([] { make_gauge(spec_of({GeometryKind::RopeAxial, 1}, 4), {0.0}, 1); })
                .find("needs position_dim = 2"),
            std::string::npos);
  EXPECT_NE(mfattn::testing::message_of([] { make_gauge(spec_of({GeometryKind::Rope, 1}, 4), {0.0, 1.0}, 1); })
                .find("expected 1 x 1 = 1 position numbers, got 2"),
            std::string::npos);
  EXPECT_NE(mfattn::testing::message_of([] { make_gauge(spec_of({GeometryKind::Rope, 1}, 4, 0, -1.0), {0.0}, 1); })
                .find("base must be finite and > 0"),
            std::string::npos);
}
