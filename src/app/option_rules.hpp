#pragma once
// The small rules every option check of `mfattn run` shares (config.cpp parses the options,
// validate.cpp checks them): how a value is shown in a message and refused, and the checks of
// a finite number and of a choice name. Private to src/app.
#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "mfattn/core/choice_table.hpp"
#include "mfattn/app/config.hpp"
#include "mfattn/core/number_text.hpp"

namespace mfattn::option_rules {

/// A value as shown in a message: at most 80 characters.
inline std::string shown(const std::string& value) {
  return value.size() <= 80 ? value : value.substr(0, 77) + "...";
}

[[noreturn]] inline void reject(const std::string& option, const std::string& value,
                         const std::string& accepted) {
  throw UsageError("--" + option + " " + shown(value) + ": " + accepted);
}

/// The names joined by separator ("euler | heun | ...").
inline std::string joined(const std::vector<std::string>& names, const std::string& separator) {
  std::string text;
  for (std::size_t i = 0; i < names.size(); ++i) text += (i ? separator : "") + names[i];
  return text;
}

/// The value a choice option's name selects; any other name is refused, naming the option,
/// the value and the table's names.
template <class Value>
Value require_choice(const ChoiceOption<Value>& option, const std::string& value) {
  if (const Choice<Value>* found = option.find(value)) return found->value;
  reject(std::string(option.option), value, option.accepted());
}

/// The preset an option that also takes a file names, or nothing for a readable file; any
/// other value is refused as require_choice refuses it.
template <class Value>
std::optional<Value> require_preset_or_file(const ChoiceOption<Value>& option, const std::string& value) {
  if (const Choice<Value>* found = option.find(value)) return found->value;
  require_input_file(std::string(option.option), value, option.accepted());
  return std::nullopt;
}

inline void require_finite(const std::string& option, double value) {
  if (!std::isfinite(value)) reject(option, format_number(value), "must be a finite number");
}

/// A span of time (the horizon, a layer's time) that frames and layer starts can resolve: at
/// least kShortestSpanResolutions time resolutions of the run's horizon (a layer's time may
/// also be 0, off).
inline void require_resolved_span(const std::string& option, double span, double horizon, bool zero_is_off) {
  const double shortest = kShortestSpanResolutions * time_resolution(horizon);
  if (span > 0 && span < shortest)
    reject(option, format_number(span),
           std::string(zero_is_off ? "must be 0 or at least " : "must be at least ") + format_number(shortest) +
               " (1e-9 of max(1, horizon): frames and layer starts closer than 1e-12 of it are one time)");
}

/// Bytes in a human unit.
inline std::string format_bytes(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit < 6) {
    bytes /= 1024.0;
    ++unit;
  }
  std::ostringstream out;
  out.precision(bytes < 10 ? 2 : 3);
  out << bytes << ' ' << units[unit];
  return out.str();
}

}  // namespace mfattn::option_rules
