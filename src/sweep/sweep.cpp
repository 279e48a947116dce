// mfattn sweep, part 1: the sweep file, its cases, case ids, shards and the command's options.
#include "mfattn/sweep/sweep.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "mfattn/core/number_text.hpp"
#include "sweep/sweep_expression.hpp"

namespace mfattn {
namespace po = boost::program_options;

namespace {

/// Options that the sweep sets for every case itself: never keys of a sweep file.
const std::set<std::string> kSweepOwned = {"out", "config", "resume"};
/// Options that the sweep always passes (--quiet --overwrite): dropped from the base, refused
/// as axes.
const std::set<std::string> kAlwaysPassed = {"quiet", "overwrite"};
/// Options left out of the case id: how a run executes, not what it computes (option_role).
bool not_in_id(const std::string& name) { return option_role(name) == OptionRole::Execution; }

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

std::string last_part(const std::string& key) {
  const auto dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

std::string lower(std::string text) {
  for (auto& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

/// The `run` arguments of one option value: "--name=value", or "--name" / nothing for a
/// switch (true / false, as Boost reads switches in config files).
std::vector<std::string> option_tokens(const po::options_description& table, const std::string& name,
                                       const std::string& value, const std::string& where) {
  const auto& option = table.find(name, false);
  if (option.semantic()->max_tokens() == 0) {
    const std::string flag = lower(value);
    if (flag.empty() || flag == "1" || flag == "true" || flag == "yes" || flag == "on")
      return {"--" + name};
    if (flag == "0" || flag == "false" || flag == "no" || flag == "off") return {};
    throw UsageError(where + "--" + name + " " + value + ": a switch, accepted: true, false");
  }
  return {"--" + name + "=" + value};
}

/// The option that a parse_run_arguments message is about: "--n -3: ..." or Boost's
/// "... option '--n' ...".
std::string option_named_in(const std::string& message) {
  if (message.rfind("--", 0) == 0) {
    const auto end = message.find_first_of(" :=", 2);
    return message.substr(2, end == std::string::npos ? std::string::npos : end - 2);
  }
  const auto begin = message.find("'--");
  if (begin == std::string::npos) return {};
  const auto end = message.find('\'', begin + 3);
  if (end == std::string::npos) return {};
  return message.substr(begin + 3, end - begin - 3);
}

/// Exact text of a parameter value (shortest round-trip for doubles).
std::string exact_text(const ParameterValue& value) {
  if (const auto* integer = std::get_if<std::int64_t>(&value)) return std::to_string(*integer);
  if (const auto* real = std::get_if<double>(&value)) return format_number(*real);
  if (const auto* flag = std::get_if<bool>(&value)) return *flag ? "true" : "false";
  if (const auto* text = std::get_if<std::string>(&value)) return *text;
  std::string joined;
  for (double x : std::get<std::vector<double>>(value)) {
    if (!joined.empty()) joined += ',';
    joined += format_number(x);
  }
  return joined;
}

/// The resolved parameters of `run` with nothing given: run's defaults, typed.
const std::map<std::string, ParameterValue>& default_values() {
  static const std::map<std::string, ParameterValue> defaults = [] {
    std::map<std::string, ParameterValue> values;
    for (const auto& p : parse_run_arguments({"--out", "default.h5"}).parameters) values[p.name] = p.value;
    return values;
  }();
  return defaults;
}

/// The same as text: the reference the id is taken against.
const std::map<std::string, std::string>& default_parameters() {
  static const std::map<std::string, std::string> defaults = [] {
    std::map<std::string, std::string> values;
    for (const auto& [name, value] : default_values()) values[name] = exact_text(value);
    return values;
  }();
  return defaults;
}

/// What an option of the run table holds, from its Boost value type.
enum class ValueKind { Integer, Real, Switch, Text };
ValueKind value_kind(const po::options_description& table, const std::string& name) {
  const auto* semantic = table.find(name, false).semantic().get();
  if (semantic->max_tokens() == 0) return ValueKind::Switch;
  if (dynamic_cast<const po::typed_value<std::int64_t>*>(semantic)) return ValueKind::Integer;
  if (dynamic_cast<const po::typed_value<double>*>(semantic)) return ValueKind::Real;
  return ValueKind::Text;
}

/// Why an option cannot be a number in an expression ("" when it can).
std::string not_numeric(ValueKind kind, const std::string& name) {
  if (kind == ValueKind::Switch) return "--" + name + " is a switch (true / false), not a number";
  if (kind == ValueKind::Text) return "--" + name + " takes text, not a number";
  return {};
}

/// The number an option value's text stands for, read as run reads it (Boost accepts a
/// leading '+'); nullopt when it is no number of the option's kind (run then refuses it).
std::optional<double> read_number(const std::string& text, ValueKind kind) {
  std::string_view digits = text;
  if (digits.size() > 1 && digits.front() == '+') digits.remove_prefix(1);
  const char* end = digits.data() + digits.size();
  if (kind == ValueKind::Integer) {
    std::int64_t integer = 0;
    const auto result = std::from_chars(digits.data(), end, integer);
    if (digits.empty() || result.ec != std::errc() || result.ptr != end) return std::nullopt;
    return static_cast<double>(integer);
  }
  double real = 0.0;
  const auto result = std::from_chars(digits.data(), end, real);
  if (digits.empty() || result.ec != std::errc() || result.ptr != end || !std::isfinite(real)) return std::nullopt;
  return real;
}

/// The number of a resolved parameter (integers and doubles only).
std::optional<double> parameter_number(const ParameterValue& value) {
  if (const auto* integer = std::get_if<std::int64_t>(&value)) return static_cast<double>(*integer);
  if (const auto* real = std::get_if<double>(&value)) return *real;
  return std::nullopt;
}

/// The line of every `key = value` line of a sweep file, in order: the lines that Boost's
/// parse_config_file turns into options (it drops '#' comments and blank lines and reads
/// "[section]" lines; any other line without '=' is its error), so entry i is the line of
/// parsed option i.
std::vector<std::size_t> option_lines(const std::string& text) {
  std::vector<std::size_t> lines;
  std::istringstream in(text);
  std::size_t number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (const auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    const auto begin = line.find_first_not_of(" \t\r\f\v");
    if (begin == std::string::npos || line[begin] == '[') continue;
    if (line.find('=') != std::string::npos) lines.push_back(number);
  }
  return lines;
}

/// "FILE:LINE: ", or "FILE: " when the line is not known.
std::string at_line(const std::string& origin, std::size_t line) {
  std::string text = origin;
  if (line) {
    text += ':';
    text += std::to_string(line);
  }
  text += ": ";
  return text;
}

/// Where a variable of a derived expression takes its value from, in every case.
struct VariableSource {
  enum class From { Derived, Axis, Fixed } from = From::Fixed;
  std::size_t index = 0;        ///< Derived: into plan.derived; Axis: into plan.axes
  std::string option;           ///< the run option
  std::string text;             ///< Fixed: the base value as written (or run's default)
  std::optional<double> fixed;  ///< Fixed: its number (nullopt: not a number)
};

/// A [derived] line ready for evaluation.
struct DerivedRule {
  Expression expression;
  ValueKind kind = ValueKind::Real;
  std::vector<VariableSource> sources;  ///< one per expression variable
};

std::size_t parse_count(const std::string& option, const std::string& text, std::size_t lowest) {
  std::size_t value = 0;
  const auto result = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || result.ec != std::errc() || result.ptr != text.data() + text.size() || value < lowest)
    throw UsageError(option + " " + text + ": must be an integer >= " + std::to_string(lowest));
  return value;
}

/// A factor of the grid, in file order: a plain axis, or a zip group (by label) at its first key.
struct SweepFactor {
  bool zipped = false;
  std::string label;
  std::vector<SweepAxis> axes;
  std::vector<std::size_t> lines;
};

/// What a sweep file says before its cases are made: its factors, and the base options (name
/// and value, in file order) with the set of their names.
struct SweepFile {
  std::vector<SweepFactor> factors;
  std::vector<std::pair<std::string, std::string>> base;
  std::set<std::string> base_keys;
};

bool is_axis_name(const std::vector<SweepFactor>& factors, const std::string& name) {
  for (const auto& factor : factors)
    for (const auto& axis : factor.axes)
      if (axis.name == name) return true;
  return false;
}

/// "FILE:LINE: derived NAME: ", the start of a derived option's messages.
std::string derived_at(const std::string& origin, const SweepDerived& derived) {
  return at_line(origin, derived.line) + "derived " + derived.name + ": ";
}

/// Reads the sections of a sweep file: [axes] and [zip...] keys into factors, [derived] keys
/// into plan.derived, and every other key into the base options.
SweepFile read_sweep_file(const std::string& text, const std::string& origin, const po::options_description& table,
                          SweepPlan& plan) {
  std::istringstream in(text);
  po::parsed_options parsed(nullptr);
  try {
    parsed = po::parse_config_file(in, po::options_description(), /*allow_unregistered=*/true);
  } catch (const po::error& e) {
    throw UsageError(origin + ": " + option_error_text(e));
  }
  const std::vector<std::size_t> lines = option_lines(text);
  SweepFile file;
  for (std::size_t i = 0; i < parsed.options.size(); ++i) {
    const auto& option = parsed.options[i];
    const std::string& key = option.string_key;
    const std::size_t line = i < lines.size() && lines.size() == parsed.options.size() ? lines[i] : 0;
    const std::string at = at_line(origin, line);
    const std::string name = last_part(key);
    const std::string value = option.value.empty() ? std::string() : option.value.front();
    const auto dot = key.find('.');
    const std::string section = dot == std::string::npos ? std::string() : key.substr(0, dot);
    if (section == "axes" || section == "zip") {
      if (!table.find_nothrow(name, false))
        throw UsageError("axis " + name + ": not an option of mfattn run (" + origin +
                         ": unknown key '" + key + "'" + closest_options_note(table, name) + ")");
      if (kSweepOwned.count(name) || kAlwaysPassed.count(name))
        throw UsageError("axis " + name + ": not allowed (the sweep sets --" + name + " itself)");
      if (is_axis_name(file.factors, name)) throw UsageError("axis " + name + ": given twice");
      SweepAxis axis{name, split_words(value), section == "zip", {}};
      if (axis.values.empty()) throw UsageError("axis " + name + ": no values");
      SweepFactor* factor = nullptr;
      if (axis.zipped) {
        // "zip.beta" is [zip]; "zip.LABEL.beta" is [zip.LABEL] (LABEL may hold dots).
        const auto last_dot = key.rfind('.');
        axis.zip_label = last_dot > dot ? key.substr(dot + 1, last_dot - dot - 1) : std::string();
        for (auto& candidate : file.factors)
          if (candidate.zipped && candidate.label == axis.zip_label) factor = &candidate;
      }
      if (!factor) {
        factor = &file.factors.emplace_back();
        factor->zipped = axis.zipped;
        factor->label = axis.zip_label;
      }
      factor->axes.push_back(axis);
      factor->lines.push_back(line);
    } else if (section == "derived") {
      const std::string derived = key.substr(dot + 1);
      if (!table.find_nothrow(derived, false))
        throw UsageError(at + "unknown key '" + key + "' (not an option of mfattn run" +
                         closest_options_note(table, derived) + ")");
      if (kSweepOwned.count(derived) || kAlwaysPassed.count(derived))
        throw UsageError(at + "derived " + derived + ": not allowed (the sweep sets --" + derived + " itself)");
      for (const auto& earlier : plan.derived)
        if (earlier.name == derived)
          throw UsageError(at + "derived " + derived + ": given twice (first on line " +
                           std::to_string(earlier.line) + ")");
      plan.derived.push_back({derived, value, line});
    } else {
      if (!table.find_nothrow(name, false))
        throw UsageError(origin + ": unknown key '" + key + "' (not an option of mfattn run" +
                         closest_options_note(table, name) + ")");
      if (kSweepOwned.count(name))
        throw UsageError(origin + ": key '" + key + "' is not allowed in a sweep file (the sweep sets --" +
                         name + " itself)");
      if (kAlwaysPassed.count(name)) continue;
      file.base_keys.insert(name);
      file.base.emplace_back(name, value);
    }
  }
  return file;
}

/// The plan's axes and factors from the file's (each axis once, zip groups of equal length),
/// and the base options as arguments.
void lay_out_axes(const SweepFile& file, const std::string& origin, const po::options_description& table,
                  SweepPlan& plan) {
  for (const auto& factor : file.factors) {
    for (std::size_t a = 0; a < factor.axes.size(); ++a) {
      const SweepAxis& axis = factor.axes[a];
      if (file.base_keys.count(axis.name))
        throw UsageError("axis " + axis.name + ": also set in the base config (keep one)");
      if (axis.values.size() != factor.axes.front().values.size()) {
        const SweepAxis& first = factor.axes.front();
        const std::size_t line = factor.lines[a];
        throw UsageError(at_line(origin, line) + "[zip" + (factor.label.empty() ? "" : "." + factor.label) + "]: axis " +
                         axis.name + " has " + std::to_string(axis.values.size()) +
                         (axis.values.size() == 1 ? " value, axis " : " values, axis ") +
                         first.name + " " + std::to_string(first.values.size()) +
                         " (the axes of a zip group advance together: give each as many values)");
      }
    }
    std::vector<std::size_t> members;
    for (const auto& axis : factor.axes) {
      members.push_back(plan.axes.size());
      plan.axes.push_back(axis);
    }
    plan.factors.push_back(members);
  }
  plan.sets_threads = file.base_keys.count("threads") > 0;
  for (const auto& axis : plan.axes) plan.sets_threads = plan.sets_threads || axis.name == "threads";
  for (const auto& derived : plan.derived) plan.sets_threads = plan.sets_threads || derived.name == "threads";
  for (const auto& [name, value] : file.base) {
    const auto tokens = option_tokens(table, name, value, origin + ": ");
    plan.base_arguments.insert(plan.base_arguments.end(), tokens.begin(), tokens.end());
  }

}

/// The derived expressions: parsed, and each variable tied to where its value comes from.
std::vector<DerivedRule> derived_rules(const SweepFile& file, const std::string& origin,
                                       const po::options_description& table, const SweepPlan& plan) {
  std::vector<DerivedRule> rules;
  for (std::size_t k = 0; k < plan.derived.size(); ++k) {
    const SweepDerived& derived = plan.derived[k];
    const std::string at = derived_at(origin, derived);
    if (is_axis_name(file.factors, derived.name)) throw UsageError(at + "also an axis (keep one)");
    if (file.base_keys.count(derived.name)) throw UsageError(at + "also set in the base config (keep one)");
    DerivedRule rule;
    rule.kind = value_kind(table, derived.name);
    if (const std::string why = not_numeric(rule.kind, derived.name); !why.empty())
      throw UsageError(at + why + "; only numeric options can be derived");
    try {
      rule.expression = Expression::parse(derived.expression);
    } catch (const ExpressionSyntaxError& e) {
      throw UsageError(at + "syntax error at column " + std::to_string(e.column) + " of '" + derived.expression +
                       "': " + e.what());
    }
    for (const auto& variable : rule.expression.variables()) {
      std::string option = variable;
      std::replace(option.begin(), option.end(), '_', '-');
      if (!table.find_nothrow(option, false))
        throw UsageError(at + "unknown variable '" + variable +
                         "' (variables are the numeric options of mfattn run, with '-' written as '_', e.g. "
                         "save_every; constants: pi, e)");
      const std::string here = at + "variable " + variable + ": ";
      if (const std::string why = not_numeric(value_kind(table, option), option); !why.empty())
        throw UsageError(here + why);
      VariableSource source;
      source.option = option;
      const auto derived_as = std::find_if(plan.derived.begin(), plan.derived.end(),
                                           [&option](const SweepDerived& d) { return d.name == option; });
      const auto position = static_cast<std::size_t>(derived_as - plan.derived.begin());
      const auto axis_as = std::find_if(plan.axes.begin(), plan.axes.end(),
                                        [&option](const SweepAxis& axis) { return axis.name == option; });
      if (position == k)
        throw UsageError(here + "it is the option being derived (a derived option may use only the options "
                                "derived above it)");
      if (derived_as != plan.derived.end() && position > k)
        throw UsageError(here + "it is derived below (line " + std::to_string(derived_as->line) +
                         "): a derived option may use only the options derived above it");
      if (derived_as != plan.derived.end()) {
        source.from = VariableSource::From::Derived;
        source.index = position;
      } else if (axis_as != plan.axes.end()) {
        source.from = VariableSource::From::Axis;
        source.index = static_cast<std::size_t>(axis_as - plan.axes.begin());
      } else {
        const ValueKind kind = value_kind(table, option);
        for (const auto& [name, value] : file.base)
          if (name == option) source.text = value, source.fixed = read_number(value, kind);
        if (!file.base_keys.count(option)) {
          const auto standard = default_values().find(option);
          if (standard == default_values().end())
            throw UsageError(here + "not set in the sweep file, and --" + option + " has no default");
          source.text = exact_text(standard->second);
          source.fixed = parameter_number(standard->second);
        }
      }
      rule.sources.push_back(source);
    }
    rules.push_back(std::move(rule));
  }

  return rules;
}

/// The cases: the grid (mixed radix over the factors, last factor fastest), each case's
/// derived values, and each case validated as `mfattn run` validates it, with its id.
void expand_cases(const std::vector<DerivedRule>& rules, const std::string& origin,
                  const po::options_description& table, const SweepCountHook& counted, SweepPlan& plan) {
  // The grid: mixed radix over the factors, last factor fastest.
  std::size_t total = 1;
  for (const auto& members : plan.factors) {
    const std::size_t length = plan.axes[members.front()].values.size();
    if (total > 100000000 / length) throw UsageError(origin + ": more than 10^8 cases");
    total *= length;
  }
  if (counted) counted(plan, total);
  // Each axis value's tokens once (a bad switch value is named with its axis).
  std::vector<std::vector<std::vector<std::string>>> axis_tokens;
  for (const auto& axis : plan.axes) {
    auto& per_value = axis_tokens.emplace_back();
    for (const auto& value : axis.values)
      per_value.push_back(option_tokens(table, axis.name, value, "axis " + axis.name + " value " + value + ": "));
  }
  // The numbers of the axis values that expressions use (nullopt: not a number).
  std::vector<std::vector<std::optional<double>>> axis_numbers(plan.axes.size());
  for (const auto& rule : rules)
    for (const auto& source : rule.sources)
      if (source.from == VariableSource::From::Axis && axis_numbers[source.index].empty())
        for (const auto& value : plan.axes[source.index].values)
          axis_numbers[source.index].push_back(read_number(value, value_kind(table, source.option)));

  const auto case_where = [&plan, total](const SweepCase& c) {
    if (plan.axes.empty()) return std::string();
    std::string where;
    for (std::size_t a = 0; a < plan.axes.size(); ++a)
      where += (a ? ", " : "") + plan.axes[a].name + "=" + c.values[a];
    return " in case " + std::to_string(c.index) + " of " + std::to_string(total) + " (" + where + ")";
  };
  // A message of parse_run_arguments about a case, naming the axis value or derived value at
  // fault, else the case.
  const auto explain = [&](const std::string& message, const SweepCase& c) {
    const std::string named = option_named_in(message);
    for (std::size_t a = 0; a < plan.axes.size(); ++a)
      if (plan.axes[a].name == named) return UsageError("axis " + named + " value " + c.values[a] + ": " + message);
    for (std::size_t k = 0; k < c.derived.size(); ++k)
      if (plan.derived[k].name == named) {
        const SweepDerived& derived = plan.derived[k];
        return UsageError(at_line(origin, derived.line) + "derived " + named + " = " + c.derived[k] + case_where(c) + ": " + message);
      }
    if (plan.axes.empty()) return UsageError(origin + ": " + message);
    std::string where;
    for (std::size_t a = 0; a < plan.axes.size(); ++a)
      where += (a ? ", " : "") + plan.axes[a].name + "=" + c.values[a];
    return UsageError("case " + std::to_string(c.index) + " of " + std::to_string(total) + " (" + where +
                      "): " + message);
  };
  const auto parse_case = [&](const SweepCase& c) {
    std::vector<std::string> args = c.arguments;
    args.insert(args.end(), {"--out", "sweep-case.h5"});
    try {
      return parse_run_arguments(args);
    } catch (const UsageError& e) {
      throw explain(e.what(), c);
    }
  };

  std::map<std::string, std::size_t> seen;
  plan.cases.reserve(total);
  std::vector<std::size_t> digit(plan.axes.size());
  std::vector<double> derived_numbers, variable_values;
  for (std::size_t index = 0; index < total; ++index) {
    SweepCase c;
    c.index = index;
    c.arguments = plan.base_arguments;
    std::size_t rest = index;
    for (std::size_t f = plan.factors.size(); f-- > 0;) {
      const std::size_t length = plan.axes[plan.factors[f].front()].values.size();
      for (const std::size_t a : plan.factors[f]) digit[a] = rest % length;
      rest /= length;
    }
    for (std::size_t a = 0; a < plan.axes.size(); ++a) {
      c.values.push_back(plan.axes[a].values[digit[a]]);
      const auto& tokens = axis_tokens[a][digit[a]];
      c.arguments.insert(c.arguments.end(), tokens.begin(), tokens.end());
    }
    const std::size_t given_arguments = c.arguments.size();  // base and axes
    derived_numbers.clear();
    for (std::size_t k = 0; k < rules.size(); ++k) {
      const DerivedRule& rule = rules[k];
      const std::string at = derived_at(origin, plan.derived[k]);
      variable_values.clear();
      for (std::size_t v = 0; v < rule.sources.size(); ++v) {
        const VariableSource& source = rule.sources[v];
        std::optional<double> number;
        std::string written = source.text;
        switch (source.from) {
          case VariableSource::From::Derived: number = derived_numbers[source.index]; break;
          case VariableSource::From::Axis:
            number = axis_numbers[source.index][digit[source.index]];
            written = c.values[source.index];
            break;
          case VariableSource::From::Fixed: number = source.fixed; break;
        }
        if (!number) {
          // Not a number of the option's kind: run's own message says what is wrong with it
          // (the case without its derived values), else this one.
          SweepCase plain = c;
          plain.derived.clear();
          plain.arguments.resize(given_arguments);
          (void)parse_case(plain);
          throw UsageError(at + "variable " + rule.expression.variables()[v] + ": --" + source.option + " " +
                           written + " is not a number" + case_where(c));
        }
        variable_values.push_back(*number);
      }
      double value = 0.0;
      try {
        value = rule.expression.evaluate(variable_values);
      } catch (const ExpressionValueError& e) {
        throw UsageError(at + e.what() + case_where(c));
      }
      std::string value_text;
      if (rule.kind == ValueKind::Integer) {
        // Integral and inside the int64 range (2^63 is exactly representable; it is not in range).
        if (std::floor(value) != value || !(std::fabs(value) < 9223372036854775808.0))
          throw UsageError(at + "--" + plan.derived[k].name + " takes an integer, the expression gives " +
                           format_number(value) + case_where(c));
        value_text = std::to_string(static_cast<std::int64_t>(value));
        value = static_cast<double>(static_cast<std::int64_t>(value));  // no -0 for later expressions
      } else {
        value_text = format_number(value);
      }
      derived_numbers.push_back(value);
      c.derived.push_back(value_text);
      c.arguments.push_back("--" + plan.derived[k].name + "=" + value_text);
    }
    const RunConfig cfg = parse_case(c);
    if (!rules.empty()) {
      // The values used are the case's resolved ones, and each derived value reads back as
      // computed: what the expressions saw is what the case runs with.
      const auto resolved = [&cfg](const std::string& option) -> std::optional<double> {
        for (const auto& p : cfg.parameters)
          if (p.name == option) return parameter_number(p.value);
        return std::nullopt;
      };
      for (std::size_t k = 0; k < rules.size(); ++k) {
        if (resolved(plan.derived[k].name) != derived_numbers[k])
          throw UsageError(derived_at(origin, plan.derived[k]) + "the value " + c.derived[k] +
                           " does not read back as itself in run" + case_where(c));
        for (const auto& source : rules[k].sources) {
          const double used = source.from == VariableSource::From::Derived ? derived_numbers[source.index]
                              : source.from == VariableSource::From::Axis
                                  ? *axis_numbers[source.index][digit[source.index]]
                                  : *source.fixed;
          if (resolved(source.option) != used)
            throw UsageError(derived_at(origin, plan.derived[k]) + "--" + source.option + " resolves to another value " +
                             "than the " + format_number(used) + " read from the sweep file" + case_where(c));
        }
      }
    }
    c.id = case_id(cfg);
    if (const auto [seen_at, fresh] = seen.emplace(c.id, index); !fresh) {
      const SweepCase& first = plan.cases[seen_at->second];
      for (std::size_t a = 0; a < plan.axes.size(); ++a)
        if (first.values[a] != c.values[a])
          throw UsageError("axis " + plan.axes[a].name + " value " + c.values[a] + ": the same case as value " +
                           first.values[a] + " (case id " + c.id + ": " +
                           (not_in_id(plan.axes[a].name)
                                ? "--" + plan.axes[a].name + " does not change the trajectory, so it is no axis)"
                                : std::string("the two values are equal)")));
      throw UsageError(origin + ": two cases with the same id " + c.id);
    }
    plan.cases.push_back(std::move(c));
  }
}

}  // namespace

std::uint64_t fnv1a64(std::string_view bytes) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (const char c : bytes) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

std::vector<std::string> id_parameters(const RunConfig& cfg) {
  const auto& defaults = default_parameters();
  std::vector<std::string> lines;
  for (const auto& p : cfg.parameters) {
    if (not_in_id(p.name)) continue;
    const std::string text = exact_text(p.value);
    const auto standard = defaults.find(p.name);
    if (standard != defaults.end() && standard->second == text) continue;
    lines.push_back(p.name + "=" + text);
  }
  std::sort(lines.begin(), lines.end());
  return lines;
}

std::string case_id(const RunConfig& cfg) {
  std::string canonical;
  for (const auto& line : id_parameters(cfg)) canonical += line + "\n";
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a64(canonical)));
  return hex;
}

std::string case_values_text(const SweepPlan& plan, const SweepCase& c, const std::string& separator) {
  std::string text;
  for (std::size_t a = 0; a < plan.axes.size() && a < c.values.size(); ++a)
    text += (text.empty() ? "" : separator) + plan.axes[a].name + "=" + c.values[a];
  for (std::size_t k = 0; k < plan.derived.size() && k < c.derived.size(); ++k)
    text += (text.empty() ? "" : separator) + plan.derived[k].name + "=" + c.derived[k];
  return text;
}

SweepPlan make_sweep(const std::string& text, const std::string& origin, const SweepCountHook& counted) {
  RunConfig scratch;
  const auto table = run_options(scratch);
  SweepPlan plan;
  plan.path = origin;
  const SweepFile file = read_sweep_file(text, origin, table, plan);
  lay_out_axes(file, origin, table, plan);
  const std::vector<DerivedRule> rules = derived_rules(file, origin, table, plan);
  expand_cases(rules, origin, table, counted, plan);
  return plan;
}

SweepPlan load_sweep(const std::string& path, const SweepCountHook& counted) {
  return make_sweep(read_config_text(path), path, counted);
}

Shard parse_shard(const std::string& text) {
  const auto slash = text.find('/');
  if (slash == std::string::npos)
    throw UsageError("--shard " + text + ": expected I/N with 0 <= I < N (e.g. 0/4)");
  Shard shard;
  try {
    shard.index = parse_count("--shard", text.substr(0, slash), 0);
    shard.count = parse_count("--shard", text.substr(slash + 1), 1);
  } catch (const UsageError&) {
    throw UsageError("--shard " + text + ": expected I/N with 0 <= I < N (e.g. 0/4)");
  }
  if (shard.index >= shard.count)
    throw UsageError("--shard " + text + ": expected I/N with 0 <= I < N (e.g. 0/4)");
  return shard;
}

std::optional<Shard> slurm_shard() {
  const char* id = std::getenv("SLURM_ARRAY_TASK_ID");
  const char* count = std::getenv("SLURM_ARRAY_TASK_COUNT");
  if (!id || !count || !*id || !*count) return std::nullopt;
  const char* min = std::getenv("SLURM_ARRAY_TASK_MIN");
  const char* step = std::getenv("SLURM_ARRAY_TASK_STEP");
  const std::string where = std::string("SLURM_ARRAY_TASK_ID=") + id + ", SLURM_ARRAY_TASK_COUNT=" + count +
                            ", SLURM_ARRAY_TASK_MIN=" + (min ? min : "unset") +
                            ", SLURM_ARRAY_TASK_STEP=" + (step ? step : "unset");
  try {
    const std::size_t task = parse_count("SLURM_ARRAY_TASK_ID", id, 0);
    const std::size_t tasks = parse_count("SLURM_ARRAY_TASK_COUNT", count, 1);
    const std::size_t first = min && *min ? parse_count("SLURM_ARRAY_TASK_MIN", min, 0) : 0;
    const std::size_t stride = step && *step ? parse_count("SLURM_ARRAY_TASK_STEP", step, 1) : 1;
    if (task >= first && (task - first) % stride == 0 && (task - first) / stride < tasks)
      return Shard{(task - first) / stride, tasks};
  } catch (const UsageError&) {
  }
  throw UsageError(where + ": the task id is not MIN + k * STEP with 0 <= k < COUNT; give --shard I/N");
}

std::vector<std::size_t> assigned_cases(std::size_t case_count, Shard shard, int rank, int ranks) {
  std::vector<std::size_t> mine;
  std::size_t position = 0;
  for (std::size_t index = shard.index; index < case_count; index += shard.count, ++position)
    if (position % static_cast<std::size_t>(ranks) == static_cast<std::size_t>(rank)) mine.push_back(index);
  return mine;
}

std::size_t assigned_count(std::size_t case_count, Shard shard, int rank, int ranks) {
  const std::size_t share = shard.index < case_count ? (case_count - shard.index + shard.count - 1) / shard.count : 0;
  const auto r = static_cast<std::size_t>(rank), k = static_cast<std::size_t>(ranks);
  return r < share ? (share - r + k - 1) / k : 0;
}

std::string default_out_dir(const std::string& sweep_path) {
  const std::filesystem::path path(sweep_path);
  return (path.parent_path() / path.stem()).string();
}

std::string sweep_usage() {
  return "usage: mfattn sweep --config SWEEP.ini [--out-dir DIR] [--jobs N] [--threads T] [--shard I/N] [--resume] [--dry-run]\n"
         "  Runs every case of a sweep file (a base config plus an [axes] section of run options,\n"
         "  each with a whitespace-separated list of values; [zip] / [zip.LABEL] groups of axes\n"
         "  that advance together; cases = Cartesian product of the axes and groups in file order,\n"
         "  the last fastest; a [derived] section of option = expression lines evaluated per case)\n"
         "  as `mfattn run` into DIR/<case id>.h5, skipping complete cases, and writes\n"
         "  DIR/manifest.csv and DIR/manifest.json. See docs/sweeps.md.\n"
         "  --config SWEEP.ini  the sweep file (required)\n"
         "  --out-dir DIR       case files and manifest (default: the sweep file's stem next to it)\n"
         "  --jobs N            cases at once on this machine (1); threads per case = max(1, cores / N)\n"
         "                      unless the sweep file sets threads\n"
         "  --threads T         threads of each case (default: as --jobs says); refused when the\n"
         "                      sweep file sets threads\n"
         "  --shard I/N         only cases with index % N == I (default: the Slurm array task, from\n"
         "                      SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN and SLURM_ARRAY_TASK_COUNT)\n"
         "  --resume            continue interrupted cases from their last frame (run --resume)\n"
         "                      instead of restarting them\n"
         "  --dry-run           print the number of cases, then list the cases of this share, their\n"
         "                      ids, status, axis and derived values; write nothing\n"
         "  Under mpirun (builds with MPI) the ranks split the cases and rank 0 writes the manifest.\n"
         "  A case that another process is running is waited for. SIGTERM / SIGINT are passed on to\n"
         "  the running cases; the sweep then writes the manifest, names the undone cases on stderr\n"
         "  and exits 128 + signal. Killed, its cases get SIGTERM.\n"
         "  Exit codes: 0 every case of this share complete, 2 bad sweep file or options (nothing\n"
         "  runs), 3 a case failed numerically, 4 I/O failure or a case that died, 128 + S stopped\n"
         "  by signal S (cases undone).\n";
}

SweepOptions parse_sweep_arguments(const std::vector<std::string>& args) {
  SweepOptions options;
  std::string shard, jobs = "1", threads;
  po::options_description table("mfattn sweep options");
  table.add_options()("config", po::value(&options.config), "sweep file")(
      "out-dir", po::value(&options.out_dir), "output folder")("jobs", po::value(&jobs),
                                                               "cases at once")(
      "threads", po::value(&threads), "threads per case")("shard", po::value(&shard), "I/N")(
      "resume", po::bool_switch(&options.resume), "continue interrupted cases")(
      "dry-run", po::bool_switch(&options.dry_run), "list cases only");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(table).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(option_error_text(e, &table));
  }
  if (options.config.empty()) throw UsageError("--config: missing (the sweep file is required)");
  const std::size_t job_count = parse_count("--jobs", jobs, 1);
  if (job_count > 4096) throw UsageError("--jobs " + jobs + ": must be an integer in [1, 4096]");
  options.jobs = static_cast<int>(job_count);
  if (vm.count("threads")) {
    const std::size_t count = parse_count("--threads", threads, 1);
    if (count > 4096)
      throw UsageError("--threads " + threads + ": must be an integer in [1, 4096]");
    options.threads = static_cast<int>(count);
  }
  if (vm.count("shard")) options.shard = parse_shard(shard);
  else options.shard = slurm_shard();
  if (options.out_dir.empty()) options.out_dir = default_out_dir(options.config);
  return options;
}

}  // namespace mfattn
