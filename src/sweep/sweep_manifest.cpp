// mfattn sweep, part 2: the status of a case in DIR and the manifest (CSV and JSON).
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <map>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "io/json_text.hpp"
#include "io/path_lock.hpp"
#include "mfattn/io/h5md.hpp"
#include "mfattn/core/number_text.hpp"
#include "mfattn/io/series.hpp"
#include "mfattn/sweep/sweep.hpp"

namespace mfattn {
namespace fs = std::filesystem;

namespace {


std::string lookup(const std::vector<std::pair<std::string, std::string>>& pairs, const std::string& key) {
  for (const auto& [name, value] : pairs)
    if (name == key) return value;
  return {};
}

/// Final values of one case file: the last frame's time and the last row of every
/// /observables/<name>/value for replica 0 (one number, or one per component).
struct FinalRow {
  bool has_time = false;
  double time = 0.0;
  std::vector<std::pair<std::string, std::vector<double>>> observables;
};

FinalRow read_final_row(const std::string& path, const FileSummary& summary) {
  FinalRow row;
  if (summary.frames > 0) {
    row.has_time = true;
    row.time = summary.last_time;
  }
  try {
    const SeriesFile series(path);
    for (const auto& name : series.observable_names()) {
      if (!series.has_observable(name)) continue;
      try {
        std::size_t components = 1;
        const auto values = series.observable(name, 0, &components);
        if (components == 0 || values.size() < components) continue;
        row.observables.emplace_back(name, std::vector<double>(values.end() - components, values.end()));
      } catch (const IoError&) {
        // A malformed observable leaves its column empty; the others are still reported.
      }
    }
  } catch (const IoError&) {
    // Unreadable: the manifest row keeps its status and time, without observables.
  }
  return row;
}

/// A manifest.csv cell: exact, a NaN without its sign.
std::string number_text(double value) { return format_number(value, NanSign::Dropped); }

using json::quoted;
using json::number;

}  // namespace

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (const char c : text) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return quoted + "\"";
}

namespace {

/// case_status, keeping the summary of the case file when there is one.
CaseStatus status_and_summary(const std::string& dir, const std::string& id, std::optional<FileSummary>& summary) {
  using State = CaseStatus::State;
  summary.reset();
  if (case_locked(dir, id)) return {State::Running, "running"};
  const fs::path file = fs::path(dir) / (id + ".h5");
  std::error_code ignored;
  if (fs::exists(file, ignored)) {
    try {
      summary = describe_file(file.string());
      const std::string status = lookup(summary->run, "status");
      if (status == "complete") return {State::Complete, status};
      if (status.rfind("failed", 0) == 0) return {State::Failed, status};
      return {State::Failed, "failed: the file's status is '" + status + "'"};
    } catch (const IoError& e) {
      return {State::Failed, std::string("failed: ") + e.what()};
    }
  }
  // No file: a case whose run ended with a usage or I/O error, or that died, has the exit
  // recorded by the sweep as the last line of its log.
  std::ifstream log(fs::path(dir) / (id + ".log"));
  std::string line, last;
  while (std::getline(log, line))
    if (!line.empty()) last = line;
  const std::string marker = "mfattn sweep: ", stopped = "mfattn sweep: interrupted: ";
  if (last.rfind(stopped, 0) == 0) {
    // "mfattn sweep: interrupted: SIGTERM (exit code 143 ...)": the sweep stopped it on a signal.
    const std::string rest = last.substr(stopped.size());
    return {State::Interrupted, "interrupted: " + rest.substr(0, rest.find(' '))};
  }
  if (last.rfind(marker, 0) == 0) return {State::Failed, "failed: " + last.substr(marker.size())};
  return {State::Missing, "missing"};
}

}  // namespace

CaseStatus case_status(const std::string& dir, const std::string& id) {
  std::optional<FileSummary> unused;
  return status_and_summary(dir, id, unused);
}

namespace {

/// A file name from a case's axis values: "beta=3_seed=0.h5" (characters other than letters,
/// digits and . , = + - made '-'); empty when it would exceed 200 bytes or the plan has no axis.
std::string parameter_name(const SweepPlan& plan, const SweepCase& c) {
  std::string name;
  for (std::size_t a = 0; a < plan.axes.size() && a < c.values.size(); ++a)
    name += (name.empty() ? "" : "_") + plan.axes[a].name + "=" + c.values[a];
  for (char& ch : name) {
    const bool kept = std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == ',' ||
                      ch == '=' || ch == '+' || ch == '-' || ch == '_';
    if (!kept) ch = '-';
  }
  if (name.empty() || name.size() > 200) return "";
  return name + ".h5";
}

/// DIR/by-parameters/<axis values>.h5 -> ../<case id>.h5 for every case whose file exists, so
/// that a case is found by its parameters; each link made under a temporary name and renamed
/// over the old one (a reader never sees a missing link). Two cases whose names coincide once
/// cleaned get their id appended. A file system that takes no symbolic links gets none: the
/// links are a convenience, the manifest is the record.
void link_cases_by_parameters(const SweepPlan& plan, const std::string& dir,
                              const std::vector<bool>& present) {
  const fs::path folder = fs::path(dir) / "by-parameters";
  std::map<std::string, std::size_t> uses;
  for (const SweepCase& c : plan.cases) ++uses[parameter_name(plan, c)];
  std::error_code error;
  for (std::size_t i = 0; i < plan.cases.size(); ++i) {
    if (!present[i]) continue;
    const SweepCase& c = plan.cases[i];
    std::string name = parameter_name(plan, c);
    if (name.empty()) continue;
    if (uses[name] > 1) name = name.substr(0, name.size() - 3) + "_" + c.id + ".h5";
    fs::create_directories(folder, error);
    if (error) return;
    const fs::path link = folder / name, temporary = folder / ("." + name + ".link");
    fs::remove(temporary, error);
    fs::create_symlink(fs::path("..") / (c.id + ".h5"), temporary, error);
    if (error) return;
    fs::rename(temporary, link, error);
    if (error) fs::remove(temporary, error);
  }
}

}  // namespace

std::vector<CaseStatus> write_manifest(const SweepPlan& plan, const std::string& dir) {
  struct Row {
    CaseStatus status;
    FinalRow final;
  };
  std::vector<Row> rows;
  rows.reserve(plan.cases.size());
  std::vector<std::string> columns;  // observable columns, in order of first appearance
  std::vector<std::pair<std::string, std::size_t>> seen;  // observable name, components
  for (const auto& c : plan.cases) {
    Row row;
    std::optional<FileSummary> summary;
    row.status = status_and_summary(dir, c.id, summary);
    if (summary) row.final = read_final_row((fs::path(dir) / (c.id + ".h5")).string(), *summary);
    for (const auto& [name, values] : row.final.observables) {
      bool known = false;
      for (const auto& [seen_name, count] : seen) known = known || (seen_name == name && count == values.size());
      if (known) continue;
      seen.emplace_back(name, values.size());
      if (values.size() == 1) columns.push_back(name);
      else
        for (std::size_t k = 0; k < values.size(); ++k) columns.push_back(name + "[" + std::to_string(k) + "]");
    }
    rows.push_back(std::move(row));
  }

  std::ostringstream csv;
  csv << "index,case_id,file,status";
  for (const auto& axis : plan.axes) csv << ',' << csv_field(axis.name);
  for (const auto& derived : plan.derived) csv << ',' << csv_field(derived.name);
  csv << ",final_time";
  for (const auto& column : columns) csv << ',' << csv_field(column);
  csv << "\r\n";
  std::ostringstream json;
  json << "{\n  \"sweep\": " << quoted(plan.path) << ",\n  \"out_dir\": " << quoted(dir)
       << ",\n  \"axes\": {";
  for (std::size_t a = 0; a < plan.axes.size(); ++a) {
    json << (a ? ", " : "") << quoted(plan.axes[a].name) << ": [";
    for (std::size_t v = 0; v < plan.axes[a].values.size(); ++v)
      json << (v ? ", " : "") << quoted(plan.axes[a].values[v]);
    json << ']';
  }
  json << '}';
  // Only a sweep with [derived] has these keys, so older manifests stay as they were.
  if (!plan.derived.empty()) {
    json << ",\n  \"derived\": {";
    for (std::size_t k = 0; k < plan.derived.size(); ++k)
      json << (k ? ", " : "") << quoted(plan.derived[k].name) << ": " << quoted(plan.derived[k].expression);
    json << '}';
  }
  json << ",\n  \"cases\": [";
  for (std::size_t i = 0; i < plan.cases.size(); ++i) {
    const SweepCase& c = plan.cases[i];
    const Row& row = rows[i];
    const std::string file = c.id + ".h5";
    csv << c.index << ',' << c.id << ',' << csv_field(file) << ',' << csv_field(row.status.text);
    for (const auto& value : c.values) csv << ',' << csv_field(value);
    for (const auto& value : c.derived) csv << ',' << csv_field(value);
    csv << ',' << (row.final.has_time ? number_text(row.final.time) : "");
    for (const auto& [name, count] : seen) {
      const std::vector<double>* values = nullptr;
      for (const auto& [row_name, row_values] : row.final.observables)
        if (row_name == name && row_values.size() == count) values = &row_values;
      for (std::size_t k = 0; k < count; ++k) csv << ',' << (values ? number_text((*values)[k]) : "");
    }
    csv << "\r\n";

    json << (i ? "," : "") << "\n    {\"index\": " << c.index << ", \"case_id\": " << quoted(c.id)
         << ", \"file\": " << quoted(file) << ", \"status\": " << quoted(row.status.text)
         << ", \"axes\": {";
    for (std::size_t a = 0; a < plan.axes.size(); ++a)
      json << (a ? ", " : "") << quoted(plan.axes[a].name) << ": " << quoted(c.values[a]);
    json << '}';
    if (!plan.derived.empty()) {
      json << ", \"derived\": {";
      for (std::size_t k = 0; k < plan.derived.size(); ++k)
        json << (k ? ", " : "") << quoted(plan.derived[k].name) << ": " << quoted(c.derived[k]);
      json << '}';
    }
    json << ", \"final_time\": " << (row.final.has_time ? number(row.final.time) : "null")
         << ", \"final_observables\": {";
    for (std::size_t k = 0; k < row.final.observables.size(); ++k) {
      const auto& [name, values] = row.final.observables[k];
      json << (k ? ", " : "") << quoted(name) << ": ";
      if (values.size() == 1) {
        json << number(values[0]);
      } else {
        json << '[';
        for (std::size_t j = 0; j < values.size(); ++j) json << (j ? ", " : "") << number(values[j]);
        json << ']';
      }
    }
    json << "}}";
  }
  json << "\n  ]\n}\n";
  write_text_atomically(fs::path(dir) / "manifest.csv", csv.str());
  write_text_atomically(fs::path(dir) / "manifest.json", json.str());
  std::vector<bool> present(plan.cases.size());
  for (std::size_t i = 0; i < plan.cases.size(); ++i) {
    std::error_code error;
    present[i] = fs::is_regular_file(fs::path(dir) / (plan.cases[i].id + ".h5"), error);
  }
  link_cases_by_parameters(plan, dir, present);
  std::vector<CaseStatus> statuses;
  for (auto& row : rows) statuses.push_back(std::move(row.status));
  return statuses;
}

}  // namespace mfattn
