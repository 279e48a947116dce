// Numbers as text (include/mfattn/core/number_text.hpp): every text of format_number reads back as
// exactly the double it was made from, and none is longer than it needs to be; format_seconds
// writes the durations of run's progress and sweep's lines.
#include <gtest/gtest.h>

#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "mfattn/core/number_text.hpp"

using mfattn::format_number;
using mfattn::format_seconds;
using mfattn::NanSign;

namespace {

/// The double that `text` reads back as, by from_chars and by strtod (the C library's reader,
/// which Python's float() agrees with); both must give the same bits.
double read_back(const std::string& text) {
  double value = 0.0;
  const auto result = std::from_chars(text.data(), text.data() + text.size(), value);
  EXPECT_EQ(result.ec, std::errc()) << text;
  EXPECT_EQ(result.ptr, text.data() + text.size()) << text;
  const double by_strtod = std::strtod(text.c_str(), nullptr);
  EXPECT_EQ(std::bit_cast<std::uint64_t>(value), std::bit_cast<std::uint64_t>(by_strtod)) << text;
  return value;
}

/// Significant digits of a finite decimal text: from its first to its last nonzero digit
/// ("1.25e-3": 3; "0.001": 1; "100": 1; "120": 2; "0": 1).
int significant_digits(const std::string& text) {
  std::string digits;
  for (const char c : text) {
    if (c == 'e' || c == 'E') break;
    if (c >= '0' && c <= '9') digits += c;
  }
  const auto first = digits.find_first_not_of('0');
  if (first == std::string::npos) return 1;
  return static_cast<int>(digits.find_last_not_of('0') - first + 1);
}

/// The fewest significant digits whose correctly rounded decimal reads back as `value`.
int fewest_digits(double value) {
  char text[64];
  for (int digits = 1;; ++digits) {
    std::snprintf(text, sizeof text, "%.*e", digits - 1, value);
    if (std::strtod(text, nullptr) == value) return digits;
  }
}

/// Round trip, and the shortest property: the text is no longer than the fewest-digit
/// scientific form, and a text with a fraction or an exponent has exactly the fewest digits
/// (a whole number in fixed form is written out in full: "16103276411517024256", 20
/// characters, against "1.6103276411517024e+19").
void expect_exact_and_shortest(double value) {
  const std::string text = format_number(value);
  ASSERT_EQ(std::bit_cast<std::uint64_t>(read_back(text)), std::bit_cast<std::uint64_t>(value))
      << text;
  const int digits = fewest_digits(value);
  char scientific[64];
  std::snprintf(scientific, sizeof scientific, "%.*e", digits - 1, value);
  EXPECT_LE(text.size(), std::string(scientific).size())
      << text << " is longer than " << scientific;
  if (text.find_first_of(".e") != std::string::npos) {
    EXPECT_EQ(significant_digits(text), digits) << text << " against " << scientific;
  }
}

}  // namespace

TEST(NumberText, KnownTexts) {
  EXPECT_EQ(format_number(0.1), "0.1");
  EXPECT_EQ(format_number(0.5), "0.5");
  EXPECT_EQ(format_number(1.0), "1");
  EXPECT_EQ(format_number(100.0), "100");
  EXPECT_EQ(format_number(-2.5), "-2.5");
  EXPECT_EQ(format_number(1e22), "1e+22");
  EXPECT_EQ(format_number(1e-300), "1e-300");
  EXPECT_EQ(format_number(1.0 / 3.0), "0.3333333333333333");
  EXPECT_EQ(format_number(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(format_number(std::numeric_limits<double>::denorm_min()), "5e-324");
  EXPECT_EQ(format_number(std::numeric_limits<double>::max()), "1.7976931348623157e+308");
  EXPECT_EQ(format_number(std::numeric_limits<double>::min()), "2.2250738585072014e-308");
  EXPECT_EQ(format_number(0.0), "0");
  EXPECT_EQ(format_number(-0.0), "-0");
}

TEST(NumberText, NonFinite) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(format_number(inf), "inf");
  EXPECT_EQ(format_number(-inf), "-inf");
  EXPECT_EQ(format_number(inf, NanSign::Dropped), "inf");
  EXPECT_EQ(format_number(-inf, NanSign::Dropped), "-inf");
  EXPECT_EQ(format_number(std::copysign(nan, 1.0)), "nan");
  EXPECT_EQ(format_number(std::copysign(nan, -1.0)), "-nan");
  EXPECT_EQ(format_number(std::copysign(nan, -1.0), NanSign::Dropped), "nan");
  EXPECT_EQ(format_number(std::copysign(nan, 1.0), NanSign::Dropped), "nan");
}

TEST(NumberText, NegativeZeroKeepsItsSign) {
  const double back = read_back(format_number(-0.0));
  EXPECT_EQ(back, 0.0);
  EXPECT_TRUE(std::signbit(back));
}

TEST(NumberText, ExactAndShortest) {
  for (const double value :
       {0.1, 0.2, 0.3, 1.0 / 3.0, 2.0 / 3.0, 1e-300, 1e300, 123456789.0, 1e15, 1e16, 1e17,
        9007199254740993.0, 0.1 + 0.2, 5e-324, 1e-310, 2.2250738585072009e-308,
        std::numeric_limits<double>::min(), std::numeric_limits<double>::max(),
        std::nextafter(1.0, 2.0), std::nextafter(1.0, 0.0), -7.25, 6.02214076e23})
    expect_exact_and_shortest(value);
}

TEST(NumberText, ExactAndShortestOverBitPatterns) {
  // Bit patterns spread over every exponent, denormals included (a fixed generator: the same
  // values on every run).
  std::uint64_t state = 0x9e3779b97f4a7c15u;
  int checked = 0;
  for (int i = 0; i < 20000; ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    const double value = std::bit_cast<double>(state);
    if (!std::isfinite(value)) continue;
    expect_exact_and_shortest(value);
    ++checked;
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(checked, 19000);
  for (std::uint64_t bits : {std::uint64_t{1}, std::uint64_t{2}, std::uint64_t{0x000fffffffffffff},
                             std::uint64_t{0x0008000000000000}, std::uint64_t{0x800fffffffffffff}})
    expect_exact_and_shortest(std::bit_cast<double>(bits));
}

TEST(NumberText, Seconds) {
  EXPECT_EQ(format_seconds(0.0), "0.00 s");
  EXPECT_EQ(format_seconds(0.42), "0.42 s");
  EXPECT_EQ(format_seconds(3.1), "3.10 s");
  EXPECT_EQ(format_seconds(12.34), "12.3 s");
  EXPECT_EQ(format_seconds(59.5), "59.5 s");
  EXPECT_EQ(format_seconds(65.7), "0:01:05");
  EXPECT_EQ(format_seconds(3600.0), "1:00:00");
  EXPECT_EQ(format_seconds(43261.0), "12:01:01");
}
