#pragma once
/// \file choice_table.hpp
/// A choice option's accepted names, as one table that its --help text, its validation and
/// the code that acts on it all read (so a name cannot be accepted by one and unknown to
/// another). Header-only: the option parser reads tables without linking what they choose.
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace mfattn {

/// One accepted value: the name given on the command line (and written to /parameters), what
/// it selects, and an optional help line that --help shows in parentheses after the name.
template <class Value>
struct Choice {
  std::string_view name;
  Value value;
  std::string_view help{};
};

/// A choice option: its name, its choices in the order --help lists them and, for options
/// that also take a file (--q FILE, --positions FILE), the --help text of that form. The
/// choices are a span over a constexpr array, so adding one is one entry in that array.
template <class Value>
struct ChoiceOption {
  std::string_view option;                 ///< without dashes: "kernel"
  std::span<const Choice<Value>> choices;
  std::string_view file_help{};            ///< non-empty: a value naming no choice is a FILE
  std::string_view lead{};                 ///< --help before the choices: "query matrix"
  std::string_view tail{};                 ///< --help after them: "; combine with +, ..."

  bool takes_files() const { return !file_help.empty(); }

  /// The choice of that name, or nullptr.
  constexpr const Choice<Value>* find(std::string_view name) const {
    for (const Choice<Value>& choice : choices)
      if (choice.name == name) return &choice;
    return nullptr;
  }

  /// The value of that name, or nothing (for an option that takes files: a file name).
  constexpr std::optional<Value> preset(std::string_view name) const {
    const Choice<Value>* found = find(name);
    return found ? std::optional<Value>(found->value) : std::nullopt;
  }

  /// The name of that value (the first choice that selects it), or "" when none does.
  constexpr std::string_view name_of(Value value) const {
    for (const Choice<Value>& choice : choices)
      if (choice.value == value) return choice.name;
    return {};
  }

  /// The names of the values that keep(value) accepts, joined by separator, in the table's
  /// order.
  template <class Keep>
  std::string names(std::string_view separator, Keep&& keep) const {
    std::string text;
    for (const Choice<Value>& choice : choices)
      if (keep(choice.value)) {
        if (!text.empty()) text += separator;
        text += choice.name;
      }
    return text;
  }

  /// The names joined by separator: "usa, sa".
  std::string names(std::string_view separator) const {
    std::string text;
    for (const Choice<Value>& choice : choices) {
      if (!text.empty()) text += separator;
      text += choice.name;
    }
    return text;
  }

  /// What a refused value is told: "accepted: usa, sa", or "accepted: identity, gaussian,
  /// goe or a readable file" for an option that takes files.
  std::string accepted() const {
    return "accepted: " + names(", ") + (takes_files() ? " or a readable file" : "");
  }

  /// The --help line: "LEAD: name (help) | name | FILE (...)TAIL".
  std::string help() const {
    std::string text = lead.empty() ? std::string() : std::string(lead) + ": ";
    for (std::size_t i = 0; i < choices.size(); ++i) {
      if (i) text += " | ";
      text += choices[i].name;
      if (!choices[i].help.empty()) text += " (" + std::string(choices[i].help) + ")";
    }
    if (takes_files()) text += " | " + std::string(file_help);
    return text + std::string(tail);
  }
};

}  // namespace mfattn
