#pragma once
// JSON text shared by the commands that print it (analyze --json, the sweep manifest,
// oclosure --json): strings escaped per RFC 8259, numbers exact, non-finite numbers as null
// (JSON has no NaN or infinity).
#include <cmath>
#include <cstdio>
#include <string>

#include "mfattn/core/number_text.hpp"

namespace mfattn::json {

/// "text" with quote, backslash and control characters escaped; UTF-8 bytes pass through.
inline std::string quoted(const std::string& text) {
  std::string q = "\"";
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': q += "\\\""; break;
      case '\\': q += "\\\\"; break;
      case '\b': q += "\\b"; break;
      case '\f': q += "\\f"; break;
      case '\n': q += "\\n"; break;
      case '\r': q += "\\r"; break;
      case '\t': q += "\\t"; break;
      default:
        if (u < 0x20) {
          char escape[8];
          std::snprintf(escape, sizeof escape, "\\u%04x", u);
          q += escape;
        } else {
          q += c;
        }
    }
  }
  return q + "\"";
}

/// The shortest decimal that reads back to the same double; null when not finite.
inline std::string number(double value) {
  return std::isfinite(value) ? format_number(value) : "null";
}

}  // namespace mfattn::json
