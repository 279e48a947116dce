#include "mfattn/core/number_text.hpp"

#include <charconv>
#include <cmath>
#include <iomanip>
#include <sstream>

namespace mfattn {

std::string format_number(double value, NanSign nan_sign) {
  if (nan_sign == NanSign::Dropped && std::isnan(value)) return "nan";
  char buffer[64];  // the longest shortest form, "-2.2250738585072014e-308", is 24 characters
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

std::string format_significant(double value, int digits) {
  if (std::isnan(value)) return "nan";
  std::ostringstream out;
  out << std::setprecision(digits) << value;
  return out.str();
}

std::string format_seconds(double seconds) {
  std::ostringstream out;
  if (seconds < 60) {
    out << std::fixed << std::setprecision(seconds < 10 ? 2 : 1) << seconds << " s";
  } else {
    const auto total = static_cast<long>(seconds);
    out << total / 3600 << ':' << std::setw(2) << std::setfill('0') << (total / 60) % 60 << ':'
        << std::setw(2) << total % 60;
  }
  return out.str();
}

}  // namespace mfattn
