#include "mfattn/app/config.hpp"

#include "app/option_rules.hpp"
#include "mfattn/backends/backend.hpp"
#include "mfattn/core/gauge.hpp"
#include "mfattn/core/input_file.hpp"
#include "mfattn/integrators/integrator.hpp"
#include "mfattn/core/number_text.hpp"
#include "mfattn/app/run_choices.hpp"
#include "mfattn/app/validate.hpp"

#include <omp.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cfloat>
#include <charconv>
#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <tuple>

namespace mfattn {

bool parse_number_list(const std::string& text, std::vector<double>& out) {
  std::string normalized = text;
  std::replace(normalized.begin(), normalized.end(), ',', ' ');
  std::istringstream in(normalized);
  std::string item;
  out.clear();
  while (in >> item) {
    std::size_t used = 0;
    double value = 0.0;
    try {
      value = std::stod(item, &used);
    } catch (...) {
      return false;
    }
    if (used != item.size() || !std::isfinite(value)) return false;
    out.push_back(value);
  }
  return !out.empty();
}
namespace po = boost::program_options;
using namespace option_rules;

namespace {

template <class T>
po::typed_value<T>* bound(T& field) {
  return po::value<T>(&field)->default_value(field);
}
po::typed_value<double>* bound(double& field) {
  return po::value<double>(&field)->default_value(field, format_number(field));
}
template <class T>
po::typed_value<T>* bound(T& field, const std::string& shown) {
  return po::value<T>(&field)->default_value(field, shown);
}

/// Binds every number of kNumberOptions whose field lies in Feature, in the table's order.
template <class Feature>
void add_numbers(po::options_description& table, RunConfig& c) {
  for (const NumberOption& number : kNumberOptions)
    std::visit(
        [&](auto field) {
          if constexpr (std::is_same_v<decltype(feature_of_field(field)), Feature>)
            table.add_options()(number.option, bound(c.feature<Feature>().*field), number.help);
        },
        number.field);
}

/// The options that take a list: several words on the command line are joined by commas.
const std::vector<std::string> kListOptions = {"save-times", "rope-freqs", "amplitudes",
                                               "toeplitz-coefficients", "toeplitz-frequencies"};
bool is_list_option(const std::string& name) {
  return std::find(kListOptions.begin(), kListOptions.end(), name) != kListOptions.end();
}
/// "--save-times, --rope-freqs, ... and --toeplitz-frequencies", for the messages.
std::string list_options_text() {
  std::string text;
  for (std::size_t i = 0; i < kListOptions.size(); ++i)
    text += (i == 0 ? "" : i + 1 == kListOptions.size() ? " and " : ", ") + ("--" + kListOptions[i]);
  return text;
}

}  // namespace

ToeplitzSeries toeplitz_series(const RunConfig& c) {
  std::vector<double> coefficients, frequencies;
  for (const auto& [name, text, out] :
       {std::tuple{"toeplitz-coefficients", &c.toeplitz_coefficients, &coefficients},
        std::tuple{"toeplitz-frequencies", &c.toeplitz_frequencies, &frequencies}})
    if (!parse_number_list(*text, *out) || out->size() > kMaxToeplitzTerms)
      reject(name, *text, "needs 1 to " + std::to_string(kMaxToeplitzTerms) +
                              " finite numbers, comma separated");
  if (coefficients.size() != frequencies.size())
    reject("toeplitz-frequencies", c.toeplitz_frequencies,
           "needs as many numbers as --toeplitz-coefficients (" + std::to_string(coefficients.size()) +
               "), got " + std::to_string(frequencies.size()));
  ToeplitzSeries series;
  series.terms = coefficients.size();
  std::copy(coefficients.begin(), coefficients.end(), series.coefficient);
  std::copy(frequencies.begin(), frequencies.end(), series.frequency);
  return series;
}

OptionRole option_role(const std::string& name) {
  static const std::map<std::string, OptionRole> roles = {
      {"horizon", OptionRole::Extent},      {"save-every", OptionRole::Extent},
      {"threads", OptionRole::Execution},   {"out", OptionRole::Execution},
      {"config", OptionRole::Execution},    {"quiet", OptionRole::Execution},
      {"overwrite", OptionRole::Execution}, {"resume", OptionRole::Execution},
      {"flush-interval", OptionRole::Execution},
  };
  const auto found = roles.find(name);
  return found == roles.end() ? OptionRole::Trajectory : found->second;
}

namespace {

// --backend's help line: the registry's names and summaries.
const std::string& backend_help() {
  static const std::string help = [] {
    std::string help = backend_names_text(" | ");
    for (const BackendName& entry : kBackendNames)
      help += std::string("; ") + entry.name + ": " + entry.summary;
    return help;
  }();
  return help;
}

/// Converts one stored option value to a typed /parameters attribute.
ParameterValue to_parameter(const boost::any& value) {
  if (const auto* v = boost::any_cast<std::int64_t>(&value)) return *v;
  if (const auto* v = boost::any_cast<double>(&value)) return *v;
  if (const auto* v = boost::any_cast<bool>(&value)) return *v;
  if (const auto* v = boost::any_cast<std::string>(&value)) return *v;
  return std::string("<unprintable>");
}


/// The fields of a Boost option error. Its what() substitutes them into a template with a
/// loop that never ends when a field holds its own placeholder ("%value%" in a value), and
/// its get_option_name() misreads short options, so messages are made from the fields.
struct BoostErrorFields : po::error_with_option_name {
  static std::string field(const po::error_with_option_name& e, const std::string& key) {
    const auto& fields = e.*(&BoostErrorFields::m_substitutions);
    const auto at = fields.find(key);
    return at == fields.end() ? std::string() : at->second;
  }
  /// The option's name without leading dashes (the token as given if there is no name).
  static std::string name(const po::error_with_option_name& e) {
    std::string text = field(e, "option");
    if (text.empty()) text = field(e, "original_token");
    while (!text.empty() && text.front() == '-') text.erase(text.begin());
    return text;
  }
};

/// The option named name exactly, or nullptr. An empty name is no option (Boost would match
/// every option's empty short name and throw).
const po::option_description* find_option(const po::options_description& table, const std::string& name) {
  if (name.empty()) return nullptr;
  try {
    return table.find_nothrow(name, false);
  } catch (const po::error&) {
    return nullptr;
  }
}

/// What an option accepts, from its type and the range its description gives ("active
/// tokens, >= 1" -> "must be an integer >= 1").
std::string accepted_text(const po::option_description& option) {
  const auto semantic = option.semantic();
  const std::string& about = option.description();
  if (semantic->max_tokens() == 0 || dynamic_cast<const po::typed_value<bool>*>(semantic.get()))
    return "a switch: accepted true, false, yes, no, on, off, 1, 0";
  std::string kind = "must be a value";
  if (dynamic_cast<const po::typed_value<std::int64_t>*>(semantic.get())) kind = "must be an integer";
  else if (dynamic_cast<const po::typed_value<double>*>(semantic.get())) kind = "must be a number";
  // The range: "in [a, b)" / "in (a, b)", else the first ">= x", "> x", "<= x", "< x".
  for (const char* opening : {"in [", "in ("}) {
    const auto at = about.find(opening);
    if (at == std::string::npos) continue;
    const auto comma = about.find(", ", at);
    const auto close = comma == std::string::npos ? comma : about.find_first_of(")]", comma);
    if (close != std::string::npos) return kind + " " + about.substr(at, close + 1 - at);
  }
  const auto at = about.find_first_of("<>");
  if (at != std::string::npos) {
    auto end = about.find_first_of(",;()", at);
    std::string range = about.substr(at, end == std::string::npos ? std::string::npos : end - at);
    while (!range.empty() && range.back() == ' ') range.pop_back();
    return kind + " " + range;
  }
  return kind + " (" + about + ")";
}

}  // namespace

std::string stored_value_text(const std::string& key, const std::string& stored) {
  return key == "eps-den" && stored == "-1" ? "auto" : stored;
}

namespace {

/// Rewrites one option value before it is stored: "auto" for --eps-den (stored as -1, the
/// automatic value; stored_value_text turns it back), and refuses a negative --eps-den.
void prepare_value(const std::string& key, std::string& value) {
  // Every option's default is what leaving it out gives; an empty value given on purpose
  // (--weights '', a config line "weights =") would otherwise be taken silently as that default.
  if (value.empty()) reject(key, "''", "is empty (leave the option out for its default)");
  if (key != "eps-den") return;
  if (value == "auto") {
    value = "-1";
    return;
  }
  double number = 0.0;
  const auto result = std::from_chars(value.data(), value.data() + value.size(), number);
  if (result.ec == std::errc() && result.ptr == value.data() + value.size() && !(number >= 0.0))
    reject(key, value, "must be a number >= 0, or auto (0 without presence weights, 1e-12 with)");
}

/// Stores parsed options into vm; Boost's errors become "--name VALUE: what is accepted",
/// prefixed with where (for a config line).
void store_checked(const po::parsed_options& parsed, const po::options_description& table,
                   po::variables_map& vm, const std::string& where) {
  try {
    po::store(parsed, vm);
  } catch (const po::error_with_option_name& e) {
    const std::string name = BoostErrorFields::name(e);
    const po::option_description* option = find_option(table, name);
    std::string value;
    for (const auto& given : parsed.options)
      if (given.string_key == name && !given.value.empty()) {
        value = given.value.front();
        break;
      }
    if (dynamic_cast<const po::multiple_occurrences*>(&e))
      throw UsageError(where + repeated_option_message("--" + name, list_options_text() +
                                                                        " take a comma separated list"));
    if (option && (dynamic_cast<const po::validation_error*>(&e) ||
                   dynamic_cast<const po::invalid_bool_value*>(&e)))
      throw UsageError(where + "--" + name + " " + shown(value) + ": " + accepted_text(*option));
    throw UsageError(where + option_error_text(e, &table));
  }
}

/// Refuses stray words, joins the words of a list option with commas.
po::parsed_options tidy(const po::parsed_options& parsed, const po::options_description& table) {
  po::parsed_options result(&table);
  for (const auto& option : parsed.options) {
    if (!option.string_key.empty()) {
      result.options.push_back(option);
      if (!result.options.back().value.empty())
        prepare_value(option.string_key, result.options.back().value.front());
      continue;
    }
    const std::string word = option.original_tokens.empty() ? std::string() : option.original_tokens.front();
    if (result.options.empty())
      throw UsageError("stray argument '" + shown(word) +
                       "': every argument is an option --name VALUE (see mfattn run --help)");
    po::option& last = result.options.back();
    if (is_list_option(last.string_key) && last.value.size() == 1) {
      last.value.front() += "," + word;
      last.original_tokens.push_back(word);
      continue;
    }
    const std::string before = last.value.empty() ? "" : " " + shown(last.value.front());
    const po::option_description* described = find_option(table, last.string_key);
    const bool is_switch = described && described->semantic()->max_tokens() == 0;
    throw UsageError("--" + last.string_key + before + " " + shown(word) + ": stray value '" + shown(word) +
                     "' (" + (is_switch ? "--" + last.string_key + " is a switch and takes no value"
                                        : "--" + last.string_key + " takes one value") +
                     "; only " + list_options_text() + " take lists)");
  }
  return result;
}

std::string trimmed(const std::string& text) {
  const char* space = " \t\r\f\v";
  const auto begin = text.find_first_not_of(space);
  if (begin == std::string::npos) return {};
  return text.substr(begin, text.find_last_not_of(space) + 1 - begin);
}

}  // namespace

std::string one_line(const std::string& message) {
  std::string line = message.size() <= 2000 ? message : message.substr(0, 1997) + "...";
  for (char& c : line)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return line;
}

UsageError::UsageError(const std::string& message) : std::runtime_error(one_line(message)) {}

std::string repeated_option_message(const std::string& option, const std::string& note) {
  return option + ": given more than once (give each option once" + (note.empty() ? "" : "; " + note) + ")";
}

std::vector<std::string> closest_option_names(const po::options_description& table, const std::string& name) {
  // Levenshtein distance: a typo (--heds), a missing or extra letter (--head, --headss).
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<std::size_t> row(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
      std::size_t diagonal = row[0];
      row[0] = i;
      for (std::size_t j = 1; j <= b.size(); ++j) {
        const std::size_t above = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
        diagonal = above;
      }
    }
    return row[b.size()];
  };
  const std::size_t limit = std::max<std::size_t>(1, name.size() / 3);
  std::vector<std::pair<std::size_t, std::string>> near;
  for (const auto& option : table.options()) {
    const std::string& candidate = option->long_name();
    const std::size_t d = distance(name, candidate);
    // A stem of three letters or more names every option it begins (--mlp -> --mlp-activation).
    const bool stem = name.size() >= 3 && candidate.starts_with(name);
    if (d <= limit || stem) near.emplace_back(stem ? 0 : d, candidate);
  }
  std::sort(near.begin(), near.end());
  std::vector<std::string> names;
  for (std::size_t k = 0; k < near.size() && k < 3; ++k) names.push_back("--" + near[k].second);
  return names;
}

std::string closest_options_note(const po::options_description& table, const std::string& name) {
  std::string note;
  for (const std::string& near : closest_option_names(table, name)) note += (note.empty() ? "; the closest: " : ", ") + near;
  return note;
}

std::string option_error_text(const po::error& error, const po::options_description* table) {
  const auto* e = dynamic_cast<const po::error_with_option_name*>(&error);
  if (!e) return error.what();
  const std::string option = "--" + shown(BoostErrorFields::name(*e));
  const std::string value = shown(BoostErrorFields::field(*e, "value"));
  if (dynamic_cast<const po::invalid_config_file_syntax*>(e))
    return "invalid line '" + shown(BoostErrorFields::field(*e, "invalid_line")) + "' (expected key = value or [section])";
  if (dynamic_cast<const po::unknown_option*>(e)) {
    std::string text = option + ": no such option";
    std::string bare = BoostErrorFields::name(*e);
    while (bare.starts_with("-")) bare.erase(0, 1);
    const std::vector<std::string> near = table ? closest_option_names(*table, bare) : std::vector<std::string>{};
    for (std::size_t k = 0; k < near.size(); ++k)
      text += (k == 0 ? " (the closest: " : ", ") + near[k] + (k + 1 == near.size() ? ")" : "");
    return text + "; --help lists every option";
  }
  if (dynamic_cast<const po::multiple_occurrences*>(e)) return repeated_option_message(option);
  if (dynamic_cast<const po::required_option*>(e)) return option + ": required";
  if (const auto* syntax = dynamic_cast<const po::invalid_command_line_syntax*>(e)) {
    switch (syntax->kind()) {
      case po::invalid_syntax::missing_parameter: return option + ": a value is missing";
      case po::invalid_syntax::extra_parameter: return option + ": takes no value";
      case po::invalid_syntax::long_not_allowed:
      case po::invalid_syntax::long_adjacent_not_allowed:
      case po::invalid_syntax::short_adjacent_not_allowed:
      case po::invalid_syntax::empty_adjacent_parameter: return option + ": malformed option (give --name VALUE)";
      default: return option + ": invalid syntax";
    }
  }
  if (dynamic_cast<const po::validation_error*>(e)) return option + " " + value + ": invalid value";
  return option + ": invalid option";
}

std::string read_small_text_file(const std::string& option, const std::string& path, std::size_t limit) {
  try {
    return read_input_file(path, limit);
  } catch (const InputFileRefused& e) {
    reject(option, path, e.what());
  }
}

std::string read_config_text(const std::string& path) {
  std::string text = read_small_text_file("config", path, kMaxConfigBytes);
  // Editors on Windows start UTF-8 files with a byte order mark: it is no part of the first key.
  constexpr std::string_view kByteOrderMark = "\xEF\xBB\xBF";
  if (text.starts_with(kByteOrderMark)) text.erase(0, kByteOrderMark.size());
  return text;
}

void require_input_file(const std::string& option, const std::string& path, const std::string& names) {
  try {
    check_input_file(path);
  } catch (const InputFileRefused& e) {
    // Nothing there, for an option that also takes names: most likely a mistyped name, so
    // the names come first.
    if (!names.empty() && e.missing()) reject(option, path, names + " (no such file)");
    reject(option, path, e.what() + (names.empty() ? "" : "; " + names));
  }
}

std::vector<ConfigEntry> parse_config_text(const std::string& text, const std::string& origin,
                                           const po::options_description& table) {
  std::vector<ConfigEntry> entries;
  std::map<std::string, std::size_t> first_line;
  std::size_t begin = 0, line_number = 0;
  std::string section;
  while (begin < text.size()) {
    const std::size_t end = std::min(text.find('\n', begin), text.size());
    std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    ++line_number;
    const std::string where = origin + ":" + std::to_string(line_number) + ": ";
    if (const auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    line = trimmed(line);
    if (line.empty()) continue;
    if (line.front() == '[') {
      if (line.back() != ']')
        throw UsageError(where + "a section line must be [name], got '" + shown(line) + "'");
      section = trimmed(line.substr(1, line.size() - 2));
      continue;  // sections are prefixes only: the key's last dotted part names the option
    }
    const auto equals = line.find('=');
    if (equals == std::string::npos)
      throw UsageError(where + "expected key = value or [section], got '" + shown(line) + "'");
    const std::string written = trimmed(line.substr(0, equals));
    if (written.empty()) throw UsageError(where + "no key before '=' in '" + shown(line) + "'");
    const std::string full_key = section.empty() ? written : section + "." + written;
    const auto dot = full_key.rfind('.');
    const std::string key = dot == std::string::npos ? full_key : full_key.substr(dot + 1);
    if (!find_option(table, key))
      throw UsageError(where + "unknown key '" + shown(full_key) + "' (not an option of mfattn run" +
                       closest_options_note(table, key) + ")");
    if (key == "config")
      throw UsageError(where + "key '" + shown(full_key) +
                       "' is not accepted in a config file (a config file cannot name another; "
                       "give --config on the command line)");
    if (const auto [at, fresh] = first_line.emplace(key, line_number); !fresh)
      throw UsageError(where + "--" + key + " given twice (first on line " + std::to_string(at->second) + ")");
    entries.push_back({key, trimmed(line.substr(equals + 1)), line_number});
  }
  return entries;
}

po::parsed_options read_config_file(const std::string& path, const po::options_description& table,
                                    std::string& text) {
  text = read_config_text(path);
  po::parsed_options parsed(&table);
  for (auto& entry : parse_config_text(text, path, table)) {
    prepare_value(entry.key, entry.value);
    po::option option(entry.key, {entry.value});
    option.original_tokens = {entry.key, entry.value};
    parsed.options.push_back(option);
  }
  return parsed;
}

void store_command_line(const std::vector<std::string>& args, const po::options_description& table,
                        po::variables_map& vm) {
  const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
  po::parsed_options parsed(&table);
  try {
    parsed = po::command_line_parser(args).options(table).style(style).run();
  } catch (const po::invalid_command_line_syntax& e) {
    const std::string name = BoostErrorFields::name(e);
    const po::option_description* option = find_option(table, name);
    if (e.kind() == po::invalid_syntax::missing_parameter && option)
      throw UsageError("--" + name + ": a value is missing (" + accepted_text(*option) + ")");
    throw UsageError(option_error_text(e, &table));
  } catch (const po::error& e) {
    throw UsageError(option_error_text(e, &table));
  }
  store_checked(tidy(parsed, table), table, vm, "");
}

std::vector<std::string> parse_command_options(const std::vector<std::string>& args, const po::options_description& table,
                                               po::variables_map& vm) {
  // Every option once, in either form (--name VALUE, --name=VALUE): run's rule (store_checked).
  std::vector<std::string> given;
  for (const std::string& word : args) {
    if (!word.starts_with("--")) continue;
    const std::string name = word.substr(0, word.find('='));
    if (std::find(given.begin(), given.end(), name) != given.end()) throw UsageError(repeated_option_message(name));
    given.push_back(name);
  }
  // Long options only, so that a value may start with '-' (--replica -1 is refused by the
  // command's rule, not taken for an option); the words that are no option are its operands.
  constexpr const char* kOperands = "operand";
  po::options_description with_operands;
  with_operands.add(table);
  with_operands.add_options()(kOperands, po::value<std::vector<std::string>>());
  po::positional_options_description positional;
  positional.add(kOperands, -1);
  const int style = po::command_line_style::allow_long | po::command_line_style::long_allow_adjacent |
                    po::command_line_style::long_allow_next;
  po::parsed_options parsed(&with_operands);
  try {
    parsed = po::command_line_parser(args).options(with_operands).positional(positional).style(style).run();
  } catch (const po::invalid_command_line_syntax& e) {
    const std::string name = BoostErrorFields::name(e);
    const po::option_description* option = find_option(table, name);
    if (e.kind() == po::invalid_syntax::missing_parameter && option)
      throw UsageError("--" + name + ": a value is missing (" + option->description() + ")");
    throw UsageError(option_error_text(e, &table));
  } catch (const po::error& e) {
    throw UsageError(option_error_text(e, &table));
  }
  for (const po::option& option : parsed.options)
    if (option.string_key == kOperands && !option.original_tokens.empty() && option.original_tokens.front().starts_with("--"))
      throw UsageError(option_error_text(po::unknown_option(option.original_tokens.front()), &table));
  // A value of the wrong type (--cluster-delta abc) is the caller's mistake, named with what
  // the option accepts.
  try {
    po::store(parsed, vm);
    po::notify(vm);
  } catch (const po::validation_error& e) {
    const po::option_description* option = find_option(table, BoostErrorFields::name(e));
    throw UsageError(option_error_text(e, &table) +
                     (option ? " (expected " + option->description() + ")" : ""));
  } catch (const po::error& e) {
    throw UsageError(option_error_text(e, &table));
  }
  return vm.count(kOperands) ? vm[kOperands].as<std::vector<std::string>>() : std::vector<std::string>{};
}

po::options_description run_options(RunConfig& c) {
  po::options_description model("Model");
  model.add_options()("n", bound(c.n), "active tokens, >= 1")(
      "d", bound(c.d), "ambient dimension, >= 2")("beta", bound(c.beta),
                                                  "inverse temperature, finite; negative repels")(
      "kernel", bound(c.kernel), kKernelOption.help().c_str());
  add_numbers<SinkhornParameters>(model, c);
  model.add_options()
      ("time-scale", bound(c.time_scale), kTimeScaleOption.help().c_str())
      ("q", bound(c.q), kQueryOption.help().c_str())
      ("k", bound(c.k), kKeyOption.help().c_str())
      ("v", bound(c.v), kValueOption.help().c_str())
      ("matrices", bound(c.matrices), kMatrixSharingOption.help().c_str())
      ("regen-period", bound(c.regen_period),
       "new random Q, K, V every this many time units (a new layer), >= 0 (0: never)");
  add_numbers<LayerShape>(model, c);
  model.add_options()
      ("mlp-activation", bound(c.mlp_activation), kActivationOption.help().c_str())
      ("weights", bound(c.weights, "none"),
       "FILE.h5 of a layer's weights (/attention/query, key, value, output; /mlp/w1, b1, w2, b2), "
       "as mfattn.export_torch writes them")
      ("layer-time", bound(c.layer_time),
       "with a --weights file of L layers: layer l acts on [l T, (l + 1) T), > 0 (0: one layer)")
      ("normalization", bound(c.normalization), kPlacementOption.help().c_str())
      ("ngpt-alpha", bound(c.ngpt_alpha), "alpha of --normalization ngpt, > 0")
      ("geometry", bound(c.geometry), kGeometryOption.help().c_str())
      ("rope-base", bound(c.rope_base), "RoPE base: omega_b = base^(-2(b-1)/d), > 1")
      ("rope-freqs", bound(c.rope_freqs, "from base"),
       "explicit RoPE frequencies, floor(d/2) numbers (comma separated, or several words)")
      ("generators", bound(c.generators, "none"),
       "FILE of k skew-symmetric d x d generators (blocks of d rows): G(xi) = exp(sum xi_a Omega_a)")
      ("positions", bound(c.positions), kPositionsOption.help().c_str())
      ("pos-scale", bound(c.pos_scale), "scale of index, random and grid positions, > 0")
      ("values", bound(c.values), kValuesOption.help().c_str())
      ("aux-factor", bound(c.aux_factor), kAuxFactorOption.help().c_str());
  add_numbers<PairTermParameters>(model, c);
  model.add_options()("toeplitz-coefficients", bound(c.toeplitz_coefficients, "1"),
                      "toeplitz factor coefficients a_1,...,a_K (1 to 16 finite numbers)")(
      "toeplitz-frequencies", bound(c.toeplitz_frequencies, "1"),
      "toeplitz factor frequencies omega_1,...,omega_K, as many as the coefficients")(
      "mask", bound(c.mask), kMaskOption.help().c_str())(
      "usa-denominator", bound(c.usa_denominator), kUsaDenominatorOption.help().c_str())(
      "prefix", bound(c.prefix),
      "frozen prefix tokens per prompt, >= 0 (they act as sources, never move)")(
      "prompts", bound(c.prompts),
      "prompts K >= 1: active token i belongs to prompt floor(i K / n), each prompt has --prefix tokens")(
      "prefix-init", bound(c.prefix_init), kPrefixInitOption.help().c_str())(
      "prefix-weight", bound(c.prefix_weight),
      "presence (mass weight) of every prefix token, > 0 (> 1 counts one as several tokens)")(
      "prefix-spread", bound(c.prefix_spread),
      "clustered prefix: spread around each prompt's centre, in [0, 1e6]")(
      "amplitudes", bound(c.amplitudes, "all 1"),
      "carrier amplitudes a_i in [0, 1.3e154] (one number, a list of n numbers, or a FILE); "
      "presence p_i = a_i^2 / (tau + a_i^2)")("tau", bound(c.tau), "presence scale tau > 0")(
      "eps-den", bound(c.eps_den, "auto"),
      "SA denominator epsilon >= 0, or auto (0 without presence weights, 1e-12 with)")(
      "null-tokens", bound(c.null_tokens),
      "append this many null tokens (amplitude 0) after the n active ones, >= 0")(
      "noise-kappa", bound(c.noise_kappa),
      "each token's noise: dx += sqrt(2/kappa) P_x dW, >= 0 (0 = none; needs --integrator euler-maruyama or "
      "stochastic-heun)")(
      "common-noise", bound(c.common_noise),
      "noise every token of a replica shares: dx += sigma P_x(dB x) (Stratonovich), sigma >= 0 (0 = none; "
      "needs --integrator stochastic-heun)")("common-noise-kind", bound(c.common_noise_kind),
                                             kCommonNoiseKindOption.help().c_str());
  po::options_description stepping("Time stepping");
  stepping.add_options()
      ("integrator", bound(c.integrator), joined(integrator_names(), " | ").c_str())
      ("dt", bound(c.dt), "step (fixed methods) or first step (dopri5), > 0")
      ("rtol", bound(c.rtol), "dopri5 relative tolerance, > 0")
      ("atol", bound(c.atol), "dopri5 absolute tolerance, > 0")
      ("horizon", bound(c.horizon), "final time T, > 0")
      ("save-every", bound(c.save_every, "horizon/100"), "frame every this many time units, > 0 (at most 10^7 frames)")
      ("save-times", bound(c.save_times, "none"), "explicit frame times in [0, horizon], comma separated (or several words)")
      ("save-log", bound(c.save_log), "N >= 2 log-spaced frame times in [dt, horizon] (plus t = 0), at most 10^7");
  po::options_description initial("Initial state");
  initial.add_options()
      ("init", bound(c.init), kInitOption.help().c_str())
      ("init-file", bound(c.init_file, "none"),
       "text rows of d numbers, or an mfattn .h5 file (its last frame)")
      ("init-rho", bound(c.init_rho), "equiangular: common inner product in [-1/(n-1), 1)")
      ("init-radius", bound(c.init_radius),
       "--normalization pre, peri or none (states in R^d): the initial contents times this, > 0")
      ("init-clusters", bound(c.init_clusters), "clustered: number of centres, >= 1")
      ("init-spread", bound(c.init_spread), "clustered: spread around each centre, in [0, 1e6]")
      ("normalize-init", po::bool_switch(&c.normalize_init), "normalise the rows of --init-file and of a --prefix-init file")
      ("replicas", bound(c.replicas), "independent initial conditions, >= 1")
      ("seed", bound(c.seed), "random seed, >= 0");
  po::options_description execution("Execution and output");
  execution.add_options()(
      "threads", bound(c.threads, "auto"),
      "worker threads in [0, 4096] (0 = auto: OMP_NUM_THREADS, SLURM_CPUS_PER_TASK, all cores)")(
      "backend", bound(c.backend), backend_help().c_str())("precision", bound(c.precision),
                                                           kPrecisionOption.help().c_str())(
      "evaluation", bound(c.evaluation), kPairEvaluationOption.help().c_str())(
      "evaluation-tol", bound(c.evaluation_tol),
      "--evaluation fourier: every weight within this fraction of the kernel's largest value, in [1e-16, 1e-3]")(
      "out", bound(c.out, "required"), "output H5MD file (its folder must exist)")(
      "overwrite", po::bool_switch(&c.overwrite), "replace an existing output file")(
      "resume", po::bool_switch(&c.resume),
      "continue the run in --out from its last frame (same options; the horizon may grow)")(
      "deflate", po::bool_switch(&c.deflate),
      "compress positions (deflate level 4 + shuffle); with --save-positions ends or none also the observables")(
      "fletcher32", po::bool_switch(&c.fletcher32), "checksum every growing dataset")(
      "save-velocity", po::bool_switch(&c.save_velocity),
      "also write dx/dt of every frame whose positions are written (particles/tokens/velocity)")(
      "save-positions", bound(c.save_positions), kSavePositionsOption.help().c_str())(
      "pair-delta", bound(c.pair_delta),
      "clustered_pair_fraction counts pairs with <x_i, x_j> > 1 - pair-delta, in (0, 2)")(
      "cluster-delta", bound(c.cluster_delta),
      "n_clusters: connected components of the graph <x_i, x_j> > 1 - cluster-delta, in (0, 2)")(
      "observables", bound(c.observables), kObservablesOption.help().c_str())(
      "flush-interval", bound(c.flush_interval),
      "wall seconds between flushes of the output, in [0, 86400]: frames made meanwhile are "
      "written together (0: flush every frame; frame 0 and the last frame are flushed at once)")(
      "quiet", po::bool_switch(&c.quiet), "no progress output")(
      "config", bound(c.config, "none"), "INI file of options (the command line wins)");
  po::options_description all("mfattn run options");
  all.add(model).add(stepping).add(initial).add(execution);
  return all;
}

void store_run_arguments(const std::vector<std::string>& args, const po::options_description& table,
                         po::variables_map& vm, RunConfig& cfg) {
  try {
    store_command_line(args, table, vm);
    // The config file is named on the command line, so look it up before notify().
    if (vm.count("config") && !vm["config"].defaulted()) {
      const std::string path = vm["config"].as<std::string>();
      cfg.config_text = read_config_text(path);
      // The command line was stored first, so its values win over the file's. Each line is
      // stored on its own, so that an error names it.
      for (auto& entry : parse_config_text(cfg.config_text, path, table)) {
        const std::string where = path + ":" + std::to_string(entry.line) + ": ";
        po::parsed_options one(&table);
        try {
          prepare_value(entry.key, entry.value);
        } catch (const UsageError& e) {
          throw UsageError(where + e.what());
        }
        po::option option(entry.key, {entry.value});
        option.original_tokens = {entry.key, entry.value};
        one.options.push_back(option);
        store_checked(one, table, vm, where);
      }
    }
    po::notify(vm);
    cfg.given.clear();
    for (const auto& [name, value] : vm)
      if (!value.defaulted()) cfg.given.push_back(name);
  } catch (const UsageError&) {
    throw;
  } catch (const po::error& e) {
    throw UsageError(option_error_text(e, &table));
  }
}

RunConfig parse_run_arguments(const std::vector<std::string>& args) { return parse_run_arguments(args, nullptr); }

RunConfig parse_run_arguments(const std::vector<std::string>& args, std::shared_ptr<const WeightsFile> weights_in_memory) {
  RunConfig cfg;
  const auto table = run_options(cfg);
  po::variables_map vm;
  store_run_arguments(args, table, vm, cfg);
  cfg.weights_in_memory = std::move(weights_in_memory);
  cfg.choices = validate(cfg);
  std::ostringstream command_line;
  command_line << "mfattn run";
  for (const auto& arg : args) command_line << ' ' << arg;
  cfg.command_line = command_line.str();
  cfg.parameters = table_parameters(table, vm);
  return cfg;
}

std::vector<Parameter> table_parameters(const po::options_description& table, const po::variables_map& vm) {
  std::vector<Parameter> parameters;
  for (const auto& option : table.options()) {
    const std::string& name = option->long_name();
    if (vm.count(name)) parameters.push_back({name, to_parameter(vm[name].value())});
  }
  return parameters;
}

}  // namespace mfattn
