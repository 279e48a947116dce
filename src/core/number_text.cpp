#include "mfattn/number_text.hpp"

#include <charconv>
#include <cmath>

namespace mfattn {

std::string format_number(double value, NanSign nan_sign) {
  if (nan_sign == NanSign::Dropped && std::isnan(value)) return "nan";
  char buffer[64];  // the longest shortest form, "-2.2250738585072014e-308", is 24 characters
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

}  // namespace mfattn
