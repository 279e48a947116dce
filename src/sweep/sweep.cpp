// mfattn sweep, part 1: the sweep file, its cases, case ids, shards and the command's options.
#include "mfattn/sweep.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

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

std::string format_double(double value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

/// Exact text of a parameter value (shortest round-trip for doubles).
std::string exact_text(const ParameterValue& value) {
  if (const auto* integer = std::get_if<std::int64_t>(&value)) return std::to_string(*integer);
  if (const auto* real = std::get_if<double>(&value)) return format_double(*real);
  if (const auto* flag = std::get_if<bool>(&value)) return *flag ? "true" : "false";
  if (const auto* text = std::get_if<std::string>(&value)) return *text;
  std::string joined;
  for (double x : std::get<std::vector<double>>(value)) {
    if (!joined.empty()) joined += ',';
    joined += format_double(x);
  }
  return joined;
}

/// The resolved parameters of `run` with nothing given: the reference the id is taken against.
const std::map<std::string, std::string>& default_parameters() {
  static const std::map<std::string, std::string> defaults = [] {
    std::map<std::string, std::string> values;
    for (const auto& p : parse_run_arguments({"--out", "default.h5"}).parameters)
      values[p.name] = exact_text(p.value);
    return values;
  }();
  return defaults;
}

std::size_t parse_count(const std::string& option, const std::string& text, std::size_t lowest) {
  std::size_t value = 0;
  const auto result = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || result.ec != std::errc() || result.ptr != text.data() + text.size() || value < lowest)
    throw UsageError(option + " " + text + ": must be an integer >= " + std::to_string(lowest));
  return value;
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

SweepPlan make_sweep(const std::string& text, const std::string& origin, const SweepCountHook& counted) {
  RunConfig scratch;
  const auto table = run_options(scratch);
  SweepPlan plan;
  plan.path = origin;
  std::istringstream in(text);
  po::parsed_options parsed(nullptr);
  try {
    parsed = po::parse_config_file(in, po::options_description(), /*allow_unregistered=*/true);
  } catch (const po::error& e) {
    throw UsageError(origin + ": " + option_error_text(e));
  }
  std::set<std::string> base_keys;
  std::vector<std::pair<std::string, std::string>> base;  // option name, value
  for (const auto& option : parsed.options) {
    const std::string& key = option.string_key;
    const std::string name = last_part(key);
    const std::string value = option.value.empty() ? std::string() : option.value.front();
    const bool is_axis = key.find('.') != std::string::npos && key.substr(0, key.find('.')) == "axes";
    if (is_axis) {
      if (!table.find_nothrow(name, false))
        throw UsageError("axis " + name + ": not an option of mfattn run (" + origin +
                         ": unknown key '" + key + "')");
      if (kSweepOwned.count(name) || kAlwaysPassed.count(name))
        throw UsageError("axis " + name + ": not allowed (the sweep sets --" + name + " itself)");
      for (const auto& axis : plan.axes)
        if (axis.name == name) throw UsageError("axis " + name + ": given twice");
      SweepAxis axis{name, split_words(value)};
      if (axis.values.empty()) throw UsageError("axis " + name + ": no values");
      plan.axes.push_back(axis);
    } else {
      if (!table.find_nothrow(name, false))
        throw UsageError(origin + ": unknown key '" + key + "' (not an option of mfattn run)");
      if (kSweepOwned.count(name))
        throw UsageError(origin + ": key '" + key + "' is not allowed in a sweep file (the sweep sets --" +
                         name + " itself)");
      if (kAlwaysPassed.count(name)) continue;
      base_keys.insert(name);
      base.emplace_back(name, value);
    }
  }
  for (const auto& axis : plan.axes)
    if (base_keys.count(axis.name))
      throw UsageError("axis " + axis.name + ": also set in the base config (keep one)");
  plan.sets_threads = base_keys.count("threads") > 0;
  for (const auto& axis : plan.axes) plan.sets_threads = plan.sets_threads || axis.name == "threads";
  for (const auto& [name, value] : base) {
    const auto tokens = option_tokens(table, name, value, origin + ": ");
    plan.base_arguments.insert(plan.base_arguments.end(), tokens.begin(), tokens.end());
  }

  // The grid: mixed radix over the axes, last axis fastest.
  std::size_t total = 1;
  for (const auto& axis : plan.axes) {
    if (total > 100000000 / axis.values.size())
      throw UsageError(origin + ": more than 10^8 cases");
    total *= axis.values.size();
  }
  if (counted) counted(plan, total);
  // Each axis value's tokens once (a bad switch value is named with its axis).
  std::vector<std::vector<std::vector<std::string>>> axis_tokens;
  for (const auto& axis : plan.axes) {
    auto& per_value = axis_tokens.emplace_back();
    for (const auto& value : axis.values)
      per_value.push_back(option_tokens(table, axis.name, value, "axis " + axis.name + " value " + value + ": "));
  }
  std::map<std::string, std::size_t> seen;
  plan.cases.reserve(total);
  for (std::size_t index = 0; index < total; ++index) {
    SweepCase c;
    c.index = index;
    c.arguments = plan.base_arguments;
    std::vector<std::size_t> digit(plan.axes.size());
    std::size_t rest = index;
    for (std::size_t a = plan.axes.size(); a-- > 0;) {
      digit[a] = rest % plan.axes[a].values.size();
      rest /= plan.axes[a].values.size();
    }
    for (std::size_t a = 0; a < plan.axes.size(); ++a) {
      c.values.push_back(plan.axes[a].values[digit[a]]);
      const auto& tokens = axis_tokens[a][digit[a]];
      c.arguments.insert(c.arguments.end(), tokens.begin(), tokens.end());
    }
    std::vector<std::string> args = c.arguments;
    args.insert(args.end(), {"--out", "sweep-case.h5"});
    RunConfig cfg;
    try {
      cfg = parse_run_arguments(args);
    } catch (const UsageError& e) {
      const std::string message = e.what();
      const std::string named = option_named_in(message);
      for (std::size_t a = 0; a < plan.axes.size(); ++a)
        if (plan.axes[a].name == named)
          throw UsageError("axis " + named + " value " + c.values[a] + ": " + message);
      std::string where;
      for (std::size_t a = 0; a < plan.axes.size(); ++a)
        where += (a ? ", " : "") + plan.axes[a].name + "=" + c.values[a];
      if (plan.axes.empty()) throw UsageError(origin + ": " + message);
      throw UsageError("case " + std::to_string(index) + " of " + std::to_string(total) + " (" + where +
                       "): " + message);
    }
    c.id = case_id(cfg);
    if (const auto [at, fresh] = seen.emplace(c.id, index); !fresh) {
      const SweepCase& first = plan.cases[at->second];
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
  return plan;
}

SweepPlan load_sweep(const std::string& path, const SweepCountHook& counted) {
  return make_sweep(read_small_text_file("config", path, kMaxConfigBytes), path, counted);
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
  return "usage: mfattn sweep --config SWEEP.ini [--out-dir DIR] [--jobs N] [--shard I/N] [--resume] [--dry-run]\n"
         "  Runs every case of a sweep file (a base config plus an [axes] section of run options,\n"
         "  each with a whitespace-separated list of values; cases = Cartesian product, last axis\n"
         "  fastest) as `mfattn run` into DIR/<case id>.h5, skipping complete cases, and writes\n"
         "  DIR/manifest.csv and DIR/manifest.json. See docs/sweeps.md.\n"
         "  --config SWEEP.ini  the sweep file (required)\n"
         "  --out-dir DIR       case files and manifest (default: the sweep file's stem next to it)\n"
         "  --jobs N            cases at once on this machine (1); threads per case = max(1, cores / N)\n"
         "                      unless the sweep file sets threads\n"
         "  --shard I/N         only cases with index % N == I (default: the Slurm array task, from\n"
         "                      SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN and SLURM_ARRAY_TASK_COUNT)\n"
         "  --resume            continue interrupted cases from their last frame (run --resume)\n"
         "                      instead of restarting them\n"
         "  --dry-run           print the number of cases, then list the cases of this share, their\n"
         "                      ids and status; write nothing\n"
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
  std::string shard, jobs = "1";
  po::options_description table("mfattn sweep options");
  table.add_options()
      ("config", po::value(&options.config), "sweep file")
      ("out-dir", po::value(&options.out_dir), "output folder")
      ("jobs", po::value(&jobs), "cases at once")
      ("shard", po::value(&shard), "I/N")
      ("resume", po::bool_switch(&options.resume), "continue interrupted cases")
      ("dry-run", po::bool_switch(&options.dry_run), "list cases only");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(table).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(option_error_text(e));
  }
  if (options.config.empty()) throw UsageError("--config: missing (the sweep file is required)");
  const std::size_t job_count = parse_count("--jobs", jobs, 1);
  if (job_count > 4096) throw UsageError("--jobs " + jobs + ": must be an integer in [1, 4096]");
  options.jobs = static_cast<int>(job_count);
  if (vm.count("shard")) options.shard = parse_shard(shard);
  else options.shard = slurm_shard();
  if (options.out_dir.empty()) options.out_dir = default_out_dir(options.config);
  return options;
}

}  // namespace mfattn
