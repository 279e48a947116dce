// Portable random numbers (rng.hpp) and initial states (init.hpp).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "mfattn/core/init.hpp"
#include "mfattn/core/rng.hpp"
#include "mfattn/core/state.hpp"
#include "test_support.hpp"

using namespace mfattn;

namespace {

// Distance in units in the last place, via the monotone map of doubles onto integers.
std::uint64_t ulp_distance(double a, double b) {
  auto ordered = [](double x) {
    const auto i = std::bit_cast<std::int64_t>(x);
    return i < 0 ? std::numeric_limits<std::int64_t>::min() - i : i;
  };
  const std::int64_t ia = ordered(a), ib = ordered(b);
  return ia > ib ? static_cast<std::uint64_t>(ia) - static_cast<std::uint64_t>(ib)
                 : static_cast<std::uint64_t>(ib) - static_cast<std::uint64_t>(ia);
}

double dot(const double* a, const double* b, std::size_t d) {
  double s = 0.0;
  for (std::size_t j = 0; j < d; ++j) s += a[j] * b[j];
  return s;
}


}  // namespace

TEST(Rng, PortableLogMatchesStdLogWithinOneUlp) {
  std::uint64_t worst = 0;
  double worst_x = 1.0;
  auto check = [&](double x) {
    const std::uint64_t u = ulp_distance(portable_log(x), std::log(x));
    if (u > worst) worst = u, worst_x = x;
  };
  // Log-uniform over 1e-300 .. 1e300, with random mantissas.
  RandomStream rs(7, 100);
  for (int k = 0; k < 1'000'000; ++k) check(std::pow(10.0, -300.0 + 600.0 * rs.uniform()));
  // Dense in [0.5, 2], where the reduction does not help and the series does all the work.
  for (int k = 0; k < 1'000'000; ++k) check(0.5 + 1.5 * rs.uniform());
  // Near 1 on both sides, where log x ~ x - 1 is tiny and relative accuracy is hardest.
  for (int k = 1; k <= 200'000; ++k) {
    check(1.0 + k * 0x1.0p-52);
    check(1.0 - k * 0x1.0p-53);
  }
  for (int p = 1; p <= 15; ++p) check(1.0 + std::pow(10.0, -p)), check(1.0 - std::pow(10.0, -p));
  // Powers of two and the reduction boundary sqrt(1/2).
  for (int e = -1000; e <= 1000; ++e) check(std::ldexp(1.0, e));
  check(0.70710678118654752440), check(std::nextafter(0.70710678118654752440, 0.0));
  check(std::numeric_limits<double>::min()), check(std::numeric_limits<double>::max());
  check(std::numeric_limits<double>::denorm_min()), check(1e-310);  // subnormals via frexp
  EXPECT_LE(worst, 1u) << "worst at x = " << worst_x;
  EXPECT_EQ(portable_log(1.0), 0.0);
  EXPECT_EQ(portable_log(0.0), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(portable_log(-1.0)));
}

TEST(Rng, SameKeysGiveSameNumbers) {
  RandomStream a(123, 1, 2, 3), b(123, 1, 2, 3);
  for (int k = 0; k < 1000; ++k) ASSERT_EQ(a.next_u64(), b.next_u64());
  for (int k = 0; k < 1000; ++k) ASSERT_EQ(a.uniform(), b.uniform());
  for (int k = 0; k < 1001; ++k) ASSERT_EQ(a.normal(), b.normal());  // odd: spare in flight
  for (int k = 0; k < 1000; ++k) ASSERT_EQ(a.uniform_symmetric(), b.uniform_symmetric());
}

TEST(Rng, DifferentKeysGiveDifferentNumbers) {
  // Neighbouring and permuted keys, and zero keys: all first outputs must be distinct.
  const std::vector<RandomStream> streams = {
      {0, 0, 0, 0}, {1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1},
      {5, 1, 2, 3}, {5, 1, 3, 2}, {5, 2, 1, 3}, {5, 3, 2, 1}, {6, 1, 2, 3},
      {5, 1, 2, 4}, {5, 1, 2, std::uint64_t{1} << 40}, {5, 1, 2, std::uint64_t{1} << 41}};
  std::set<std::uint64_t> seen;
  for (RandomStream s : streams)
    for (int k = 0; k < 100; ++k) seen.insert(s.next_u64());
  EXPECT_EQ(seen.size(), streams.size() * 100);
}

TEST(Rng, KnownValuesAreStable) {
  // The SplitMix64 reference: its first output from state 0 is mix64(0x9E3779B97F4A7C15).
  EXPECT_EQ(mix64(0x9E3779B97F4A7C15ULL), 0xE220A8397B1DCDAFULL);
  // Pinned outputs of this implementation: any change to key mixing, the counter construction,
  // the uniform/normal transforms or portable_log shows up here.
  RandomStream s(42, 1, 2, 3);
  const std::uint64_t u64[4] = {s.next_u64(), s.next_u64(), s.next_u64(), s.next_u64()};
  const double u = s.uniform(), v = s.uniform_symmetric();
  const double g0 = s.normal(), g1 = s.normal(), g2 = s.normal();
  EXPECT_EQ(u64[0], 0x6A8AA8D2AC8F0A70ULL);
  EXPECT_EQ(u64[1], 0xDE946E697DC8681FULL);
  EXPECT_EQ(u64[2], 0xB71C9C1BA0736515ULL);
  EXPECT_EQ(u64[3], 0x1E2FC75149B320D0ULL);
  EXPECT_EQ(u, 0x1.61f21a04d50d6p-1);
  EXPECT_EQ(v, 0x1.b0ca1cb01f826p-1);
  EXPECT_EQ(g0, 0x1.a905325614a97p-2);
  EXPECT_EQ(g1, -0x1.dee561a6956cdp-2);
  EXPECT_EQ(g2, 0x1.3a84b52b0b34dp+1);
  EXPECT_EQ(portable_log(0.3), -0x1.34378fcbda721p+0);
  EXPECT_EQ(portable_log(1e300), 0x1.5963447f87fb5p+9);
}

TEST(Rng, NormalHasUnitVarianceAndZeroMean) {
  // N = 1e6 draws; bounds are ~5 standard errors: mean 1e-3, variance sqrt(2/N) = 1.4e-3,
  // fourth moment sqrt(96/N) = 9.8e-3, P(|x| < 1) sqrt(p(1-p)/N) = 4.7e-4.
  constexpr int N = 1'000'000;
  RandomStream s(2024, 9);
  double m1 = 0, m2 = 0, m4 = 0, inside = 0;
  for (int k = 0; k < N; ++k) {
    const double x = s.normal();
    m1 += x, m2 += x * x, m4 += x * x * x * x, inside += std::fabs(x) < 1.0;
  }
  m1 /= N, m2 /= N, m4 /= N, inside /= N;
  EXPECT_NEAR(m1, 0.0, 5e-3);
  EXPECT_NEAR(m2 - m1 * m1, 1.0, 7e-3);
  EXPECT_NEAR(m4, 3.0, 0.05);
  EXPECT_NEAR(inside, 0.6826894921370859, 2.5e-3);
}

TEST(Rng, UniformDrawsStayInTheirIntervals) {
  RandomStream s(3);
  double lo = 1, hi = 0, slo = 1, shi = -1;
  for (int k = 0; k < 1'000'000; ++k) {
    const double u = s.uniform(), v = s.uniform_symmetric();
    lo = std::min(lo, u), hi = std::max(hi, u), slo = std::min(slo, v), shi = std::max(shi, v);
  }
  EXPECT_GE(lo, 0.0);
  EXPECT_LT(hi, 1.0);
  EXPECT_GT(slo, -1.0);
  EXPECT_LT(shi, 1.0);
  EXPECT_LT(lo, 1e-5);
  EXPECT_GT(hi, 1 - 1e-5);
  EXPECT_LT(slo, -1 + 1e-5);
  EXPECT_GT(shi, 1 - 1e-5);
}

TEST(Init, UniformTokensAreUnitVectors) {
  State st(3, 50, 7);
  initialize_state({.kind = InitKind::Uniform, .seed = 11}, st);
  for (std::size_t r = 0; r < st.replicas; ++r)
    for (std::size_t i = 0; i < st.n; ++i)
      EXPECT_NEAR(dot(st.token(r, i), st.token(r, i), st.d), 1.0, 1e-15);
  EXPECT_NE(st.token(0, 0)[0], st.token(1, 0)[0]);  // replicas are independent draws
}

TEST(Init, TokenContentsIndependentOfTokenCount) {
  for (InitKind kind : {InitKind::Uniform, InitKind::Hemisphere, InitKind::Clustered}) {
    const InitSpec spec{.kind = kind, .seed = 5, .clusters = 4, .spread = 0.3};
    State small(2, 10, 4), big(2, 13, 4);
    initialize_state(spec, small);
    initialize_state(spec, big);
    for (std::size_t r = 0; r < 2; ++r)
      for (std::size_t i = 0; i < 10; ++i)
        for (std::size_t j = 0; j < 4; ++j)
          ASSERT_EQ(std::bit_cast<std::uint64_t>(small.token(r, i)[j]),
                    std::bit_cast<std::uint64_t>(big.token(r, i)[j]))
              << "kind " << static_cast<int>(kind) << " r " << r << " i " << i;
  }
}

TEST(Init, HemisphereHasNonnegativeLastCoordinate) {
  State st(2, 1000, 3);
  initialize_state({.kind = InitKind::Hemisphere, .seed = 1}, st);
  for (std::size_t r = 0; r < 2; ++r)
    for (std::size_t i = 0; i < st.n; ++i) {
      EXPECT_GE(st.token(r, i)[2], 0.0);
      EXPECT_NEAR(dot(st.token(r, i), st.token(r, i), 3), 1.0, 1e-15);
    }
}

TEST(Init, ClusteredTokensGatherAroundTheirCentre) {
  State st(1, 30, 5);
  initialize_state({.kind = InitKind::Clustered, .seed = 2, .clusters = 3, .spread = 0.01}, st);
  for (std::size_t i = 0; i + 3 < st.n; ++i) {
    EXPECT_NEAR(dot(st.token(0, i), st.token(0, i), 5), 1.0, 1e-15);
    EXPECT_GT(dot(st.token(0, i), st.token(0, i + 3), 5), 0.99);  // same centre i % 3
  }
  EXPECT_THROW(initialize_state({.kind = InitKind::Clustered, .clusters = 0}, st),
               std::invalid_argument);
}

TEST(Init, EquiangularGivesCommonInnerProduct) {
  struct Case { std::size_t n, d; double rho; };
  for (const Case c : {Case{5, 5, 0.5}, Case{4, 8, -1.0 / 3.0}, Case{10, 12, 0.9},
                       Case{6, 6, 0.0}, Case{7, 7, -1.0 / 6.0}, Case{1, 3, 0.2},
                       Case{20, 32, 0.99}, Case{3, 3, -0.49}}) {
    State st(2, c.n, c.d);
    initialize_state({.kind = InitKind::Equiangular, .seed = 8, .rho = c.rho}, st);
    for (std::size_t r = 0; r < 2; ++r)
      for (std::size_t i = 0; i < c.n; ++i)
        for (std::size_t j = 0; j < c.n; ++j)
          ASSERT_NEAR(dot(st.token(r, i), st.token(r, j), c.d), i == j ? 1.0 : c.rho, 1e-14)
              << "n " << c.n << " d " << c.d << " rho " << c.rho << " (" << i << ", " << j << ")";
    // The random rotation makes the configuration generic and different per replica.
    EXPECT_NE(st.token(0, 0)[0], st.token(1, 0)[0]);
  }
}

TEST(Init, EquiangularNeedsDimensionAtLeastN) {
  State st(1, 5, 4);
  const std::string msg =
      mfattn::testing::message_of([&] { initialize_state({.kind = InitKind::Equiangular, .rho = 0.2}, st); });
  EXPECT_NE(msg.find("--init equiangular needs d >= n (n = 5, d = 4)"), std::string::npos) << msg;
  State ok(1, 5, 5);
  EXPECT_NE(mfattn::testing::message_of([&] {
              initialize_state({.kind = InitKind::Equiangular, .rho = -0.3}, ok);
            }).find("--init-rho"),
            std::string::npos);  // below -1/(n-1) = -0.25
  EXPECT_THROW(initialize_state({.kind = InitKind::Equiangular, .rho = 1.0}, ok),
               std::invalid_argument);
  EXPECT_NO_THROW(initialize_state({.kind = InitKind::Equiangular, .rho = -0.25}, ok));
}

TEST(Init, FileRowsMustHaveUnitNorm) {
  State st(2, 3, 2);
  InitSpec spec{.kind = InitKind::File, .file_rows = {1, 0, 0.6, 0.8, 0, -1}};
  initialize_state(spec, st);
  for (std::size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(st.token(r, 1)[0], 0.6);
    EXPECT_EQ(st.token(r, 2)[1], -1.0);
  }
  spec.file_rows = {1, 0, 0, 1.1, 0, 1};
  const std::string msg = mfattn::testing::message_of([&] { initialize_state(spec, st); });
  EXPECT_NE(msg.find("row 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--normalize-init"), std::string::npos) << msg;
  spec.normalize_file_rows = true;
  initialize_state(spec, st);
  EXPECT_EQ(st.token(1, 1)[1], 1.0);
  spec.file_rows.pop_back(), spec.file_rows.pop_back();  // two rows for n = 3
  EXPECT_THROW(initialize_state(spec, st), std::invalid_argument);
  spec.file_rows = {1, 0, 0, 0, 0, 1};  // a zero row cannot be normalised
  EXPECT_NE(mfattn::testing::message_of([&] { initialize_state(spec, st); }).find("row 2"), std::string::npos);
}

TEST(Init, ReadTextRowsAcceptsCommasAndComments) {
  const std::string path = ::testing::TempDir() + "mfattn_read_text_rows.txt";
  auto write = [&](const char* text) { std::ofstream(path) << text; };
  write("# three unit vectors\n1, 0, 0\n0 1 0   # trailing comment\n\n  0.6,0.8 , -0e0\r\n");
  std::size_t rows = 0;
  const std::vector<double> v = read_text_rows(path, 3, rows);
  EXPECT_EQ(rows, 3u);
  EXPECT_EQ(v, (std::vector<double>{1, 0, 0, 0, 1, 0, 0.6, 0.8, 0}));

  write("1 0 0\n# c\n0 1\n");
  std::string msg = mfattn::testing::message_of([&] { read_text_rows(path, 3, rows); });
  EXPECT_NE(msg.find(path + ":3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("row 2"), std::string::npos) << msg;
  write("1 0 zero\n");
  EXPECT_NE(mfattn::testing::message_of([&] { read_text_rows(path, 3, rows); }).find("'zero'"), std::string::npos);
  write("1,,0\n");
  EXPECT_THROW(read_text_rows(path, 2, rows), std::invalid_argument);
  write("# nothing\n");
  EXPECT_THROW(read_text_rows(path, 2, rows), std::invalid_argument);
  EXPECT_NE(mfattn::testing::message_of([&] { read_text_rows(path + ".missing", 2, rows); }).find("no such file"),
            std::string::npos);
}

TEST(Init, UniformIsIsotropic) {
  // N = 1e5 tokens on S^2: |mean| ~ 1/sqrt(N) = 3.2e-3 (bound 5x); second moment = I/3 with
  // standard errors sqrt(4/45/N) = 9.4e-4 (diagonal) and sqrt(1/15/N) = 8.2e-4 (off-diagonal).
  constexpr std::size_t N = 100'000, d = 3;
  State st(1, N, d);
  initialize_state({.kind = InitKind::Uniform, .seed = 99}, st);
  double mean[d] = {}, second[d][d] = {};
  for (std::size_t i = 0; i < N; ++i) {
    const double* x = st.token(0, i);
    for (std::size_t a = 0; a < d; ++a) {
      mean[a] += x[a] / N;
      for (std::size_t b = 0; b < d; ++b) second[a][b] += x[a] * x[b] / N;
    }
  }
  EXPECT_LT(std::sqrt(dot(mean, mean, d)), 5.0 / std::sqrt(double(N)));
  for (std::size_t a = 0; a < d; ++a)
    for (std::size_t b = 0; b < d; ++b) EXPECT_NEAR(second[a][b], a == b ? 1.0 / 3 : 0.0, 5e-3);
}
