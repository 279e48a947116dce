// mfattn import and mfattn.io.write (include/mfattn/app/import_states.hpp): another model's
// states through the run's H5MD writer, with the observables of their directions.
#include "mfattn/app/import_states.hpp"

#include <boost/program_options.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <ostream>
#include <set>
#include <stdexcept>

#include "mfattn/app/config.hpp"
#include "mfattn/app/run.hpp"
#include "mfattn/app/stop_signals.hpp"
#include "mfattn/core/evaluation_watch.hpp"
#include "mfattn/core/input_file.hpp"
#include "mfattn/core/number_text.hpp"
#include "mfattn/core/version.hpp"
#include "mfattn/io/numpy_files.hpp"
#include "mfattn/observers/observables.hpp"

namespace mfattn {

namespace {

/// A row is a point of the sphere when its norm is 1 to this (the run's own states are unit to
/// rounding: a few ulps).
constexpr double kUnitTolerance = 1e-12;

/// The names the file writes itself: a caller's parameter of one of these would be ambiguous.
const std::set<std::string>& reserved_parameters() {
  static const std::set<std::string> names = {
      "command",       "source",        "state_space",    "version",      "source_revision",
      "active_tokens", "cluster-delta", "save-positions", "command_line", "threads_used",
      "gradient_flow", "beta",          "kernel",         "integrator"};
  return names;
}

std::string token_place(const ImportedStates& s, std::size_t f, std::size_t r, std::size_t i) {
  return "frame " + std::to_string(f) + (s.replicas > 1 ? ", replica " + std::to_string(r) : "") +
         ", token " + std::to_string(i);
}

/// The norms of every row (the checks: finite, not zero), scaled by the row's largest entry so
/// that rows of 1e-200 or 1e200 have theirs.
std::vector<double> row_norms(const ImportedStates& s) {
  const std::size_t rows = s.frames * s.replicas * s.n;
  std::vector<double> norms(rows);
  for (std::size_t row = 0; row < rows; ++row) {
    const double* x = s.states.data() + row * s.d;
    const std::size_t i = row % s.n, r = (row / s.n) % s.replicas, f = row / (s.n * s.replicas);
    double largest = 0.0;
    for (std::size_t c = 0; c < s.d; ++c) {
      if (!std::isfinite(x[c]))
        throw std::invalid_argument(token_place(s, f, r, i) +
                                    ": the state holds a value that is not finite");
      largest = std::max(largest, std::fabs(x[c]));
    }
    if (largest == 0.0)
      throw std::invalid_argument(token_place(s, f, r, i) +
                                  ": the state is zero and has no direction");
    double scaled2 = 0.0;
    for (std::size_t c = 0; c < s.d; ++c) scaled2 += (x[c] / largest) * (x[c] / largest);
    norms[row] = largest * std::sqrt(scaled2);
    if (!std::isfinite(norms[row]))
      throw std::invalid_argument(token_place(s, f, r, i) +
                                  ": the state's norm exceeds the largest double");
  }
  return norms;
}

void check_shape_and_labels(const ImportedStates& s) {
  if (s.frames == 0 || s.replicas == 0 || s.n == 0 || s.d == 0)
    throw std::invalid_argument(
        "states: expected at least one frame, replica, token and dimension (got [" +
        std::to_string(s.frames) + ", " + std::to_string(s.replicas) + ", " + std::to_string(s.n) +
        ", " + std::to_string(s.d) + "])");
  if (s.d < 2) throw std::invalid_argument("states: d = 1; directions need d >= 2");
  if (s.states.size() != s.frames * s.replicas * s.n * s.d)
    throw std::invalid_argument("states: " + std::to_string(s.states.size()) +
                                " numbers for a shape of " +
                                std::to_string(s.frames * s.replicas * s.n * s.d));
  if (!s.times.empty()) {
    if (s.times.size() != s.frames)
      throw std::invalid_argument("times: " + std::to_string(s.times.size()) + " times for " +
                                  std::to_string(s.frames) + " frames");
    for (std::size_t f = 0; f < s.frames; ++f) {
      if (!std::isfinite(s.times[f]))
        throw std::invalid_argument("times: time " + std::to_string(f) + " is not finite");
      if (f > 0 && !(s.times[f] > s.times[f - 1]))
        throw std::invalid_argument("times: expected strictly increasing times; time " +
                                    std::to_string(f) + " = " + format_number(s.times[f]) +
                                    " follows " + format_number(s.times[f - 1]));
    }
  }
  auto check_length = [&](const char* name, std::size_t size) {
    if (size != 0 && size != s.n)
      throw std::invalid_argument(std::string(name) + ": " + std::to_string(size) +
                                  " values for n = " + std::to_string(s.n) + " tokens");
  };
  check_length("presence", s.presence.size());
  check_length("prompt_id", s.prompt_id.size());
  check_length("sequence_position", s.sequence_position.size());
  for (std::size_t i = 0; i < s.presence.size(); ++i)
    if (!(s.presence[i] >= 0.0) || !std::isfinite(s.presence[i]))
      throw std::invalid_argument("presence: token " + std::to_string(i) + " has " +
                                  format_number(s.presence[i]) + "; expected a finite number >= 0");
  for (std::size_t i = 0; i < s.sequence_position.size(); ++i)
    if (!std::isfinite(s.sequence_position[i]))
      throw std::invalid_argument("sequence_position: token " + std::to_string(i) +
                                  " is not finite");
  if (!(s.cluster_delta > 0.0 && s.cluster_delta < 2.0))
    throw std::invalid_argument("cluster_delta: " + format_number(s.cluster_delta) +
                                ": expected a number in (0, 2)");
  std::set<std::string> seen;
  for (const Parameter& p : s.parameters) {
    if (p.name.empty()) throw std::invalid_argument("parameters: a parameter has an empty name");
    if (p.name.find('/') != std::string::npos || p.name == ".")
      throw std::invalid_argument("parameters: '" + p.name + "': a name may not hold '/'");
    if (reserved_parameters().count(p.name))
      throw std::invalid_argument("parameters: '" + p.name +
                                  "' is written by the import itself (give it another name)");
    if (!seen.insert(p.name).second)
      throw std::invalid_argument("parameters: '" + p.name + "' given twice");
  }
}

}  // namespace

std::string write_imported_states(const ImportedStates& s, const std::string& path, bool overwrite,
                                  const std::atomic<int>* stop) {
  check_shape_and_labels(s);
  const std::vector<double> norms = row_norms(s);
  const bool on_sphere = std::all_of(norms.begin(), norms.end(), [](double norm) {
    return std::fabs(norm - 1.0) <= kUnitTolerance;
  });
  const std::string state_space = on_sphere ? "sphere" : "euclidean";

  std::vector<std::size_t> moving;
  for (std::size_t i = 0; i < s.n; ++i)
    if (s.presence.empty() || s.presence[i] > 0.0) moving.push_back(i);
  if (moving.empty())
    throw std::invalid_argument("presence: every token has presence 0 (nothing to analyse)");

  // The observables first (the long part: O(n^2 d) a frame), before the output exists, so a
  // stop here leaves nothing behind; values[o][f R + r].
  constexpr std::size_t kObservables = 4;
  std::vector<std::vector<double>> values(kObservables, std::vector<double>(s.frames * s.replicas));
  ObservableSettings settings;
  settings.cluster_delta = s.cluster_delta;
  std::vector<double> directions(s.n * s.d), rows;
  auto check_stop = [&] {
    if (stop && stop->load() != 0) throw ImportInterrupted(stop->load());
  };
  for (std::size_t f = 0; f < s.frames; ++f)
    for (std::size_t r = 0; r < s.replicas; ++r) {
      check_stop();
      const std::size_t first_row = (f * s.replicas + r) * s.n;
      for (std::size_t i = 0; i < s.n; ++i)
        for (std::size_t c = 0; c < s.d; ++c)
          directions[i * s.d + c] = s.states[(first_row + i) * s.d + c] / norms[first_row + i];
      rows.clear();
      double norm_sum = 0.0;
      for (std::size_t i : moving) {
        rows.insert(rows.end(), directions.begin() + std::ptrdiff_t(i * s.d),
                    directions.begin() + std::ptrdiff_t((i + 1) * s.d));
        norm_sum += norms[first_row + i];
      }
      PairStatistics stats;
      try {
        stats = pair_statistics(directions.data(), s.d, moving, settings);
      } catch (const EvaluationStopped&) {
        throw ImportInterrupted(stop ? stop->load() : 0);
      }
      const std::size_t at = f * s.replicas + r;
      values[0][at] = double(stats.clusters);
      values[1][at] = stats.min_inner;
      values[2][at] = 1.0 - second_moment_eigenvalues(rows.data(), moving.size(), s.d).front();
      values[3][at] = norm_sum / double(moving.size());
    }
  check_stop();

  // Then the file, in one go: a signal from here on lets the write finish (seconds at most).
  WriterSetup setup;
  setup.path = path;
  setup.overwrite = overwrite;
  // The name appears once the file holds every frame: the one flush below publishes it whole.
  setup.atomic_publish = true;
  setup.expected_frames = s.frames;
  setup.n = s.n;
  setup.d = s.d;
  setup.replicas = s.replicas;
  setup.position_dim = 1;
  setup.creator_version = kVersion;
  setup.deflate = s.deflate;
  if (const char* user = std::getenv("USER")) setup.author = user;
  setup.observables = {
      {"n_clusters", 1}, {"min_inner", 1}, {"marginal_spread", 1}, {"norm_mean", 1}};
  std::unique_ptr<H5mdWriter> writer = H5mdWriter::create(setup);

  std::vector<Parameter> parameters = s.parameters;
  parameters.push_back({"command", std::string("import")});
  parameters.push_back({"source", s.source});
  parameters.push_back({"state_space", state_space});
  parameters.push_back({"cluster-delta", s.cluster_delta});
  parameters.push_back({"active_tokens", static_cast<std::int64_t>(moving.size())});
  parameters.push_back({"version", std::string(kVersion)});
  parameters.push_back({"source_revision", std::string(kSourceRevision)});
  writer->write_parameters(parameters);

  TokenLabels labels;
  labels.presence = s.presence.empty() ? std::vector<double>(s.n, 1.0) : s.presence;
  labels.prompt_id = s.prompt_id.empty() ? std::vector<std::int32_t>(s.n, 0) : s.prompt_id;
  for (std::size_t i = 0; i < s.n; ++i) {
    labels.aux_position.push_back(s.sequence_position.empty() ? double(i) : s.sequence_position[i]);
    labels.id.push_back(static_cast<std::int64_t>(i));
  }
  writer->write_labels(labels);

  const std::size_t frame_numbers = s.replicas * s.n * s.d;
  std::vector<std::vector<double>> frame(kObservables, std::vector<double>(s.replicas));
  for (std::size_t f = 0; f < s.frames; ++f) {
    for (std::size_t o = 0; o < kObservables; ++o)
      std::copy_n(values[o].begin() + std::ptrdiff_t(f * s.replicas), s.replicas, frame[o].begin());
    const double time = s.times.empty() ? double(f) : s.times[f];
    writer->append_frame(static_cast<std::int64_t>(f), time, s.states.data() + f * frame_numbers,
                         frame);
  }
  writer->write_run_info("complete", 0.0, static_cast<std::int64_t>(s.frames - 1), 0);
  writer->flush();
  return state_space;
}

ImportSignals::ImportSignals()
    : signals_({.keep_ignored = false,
                .restart_calls = true,
                .wake_pipe = false,
                .end_on_late_repeat = true}),
      watch_([] {
        EvaluationWatch::Settings settings;
        settings.stop = &StopSignals::received_flag();
        return settings;
      }()) {}

std::string import_usage() {
  return "usage: mfattn import STATES.npy|npz --out FILE.h5 [options]\n"
         "  another model's token states as an mfattn file (docs/import.md): [T, n, d] or [T, R, n, d]\n"
         "  (frames, replicas, tokens, dimension). An .npz holds the states as `positions` or `states`\n"
         "  (or its only array of 3 or 4 axes; --array NAME picks another) and may hold `times` [T],\n"
         "  `presence` [n] and `prompt_id` [n]. Rows that are not unit vectors are stored as given and\n"
         "  analysed on their directions.\n"
         "  --out FILE.h5         the mfattn file (required)\n"
         "  --times T0,T1,...     the frames' times, strictly increasing (default: 0, 1, ..., T - 1)\n"
         "  --array NAME          the .npz member holding the states\n"
         "  --cluster-delta D     n_clusters joins directions with <u_i, u_j> > 1 - D (1e-4)\n"
         "  --deflate             compress the positions\n"
         "  --overwrite           replace an existing --out\n"
         "  --quiet               no summary line\n";
}

namespace {

/// The array of the archive named `name`, or nullptr (const or not, as the archive is).
template <class Arrays>
auto* member(Arrays& arrays, const std::string& name) {
  decltype(&arrays.front()) found = nullptr;
  for (auto& array : arrays)
    if (array.name == name && !found) found = &array;
  return found;
}

/// The states' member: --array, else `positions` or `states`, else the only one of 3 or 4 axes.
NumpyArray& states_member(std::vector<NumpyArray>& arrays, const std::string& file,
                          const std::string& asked) {
  std::string names;
  for (const NumpyArray& array : arrays) names += (names.empty() ? "" : ", ") + array.name;
  if (arrays.size() == 1 && asked.empty()) return arrays.front();
  if (!asked.empty()) {
    if (arrays.size() == 1 && arrays.front().name.empty())
      throw UsageError("--array " + asked + ": " + file +
                       " is a .npy file of one array; --array names a member of "
                       "an .npz archive");
    if (NumpyArray* found = member(arrays, asked)) return *found;
    throw UsageError("--array " + asked + ": " + file + " has no such array (it holds " + names +
                     ")");
  }
  for (const char* name : {"positions", "states"})
    if (NumpyArray* found = member(arrays, name)) return *found;
  NumpyArray* only = nullptr;
  for (NumpyArray& array : arrays)
    if (array.shape.size() == 3 || array.shape.size() == 4) {
      if (only)
        throw UsageError(file + ": several arrays of 3 or 4 axes (" + names +
                         "); name the states with --array NAME");
      only = &array;
    }
  if (!only)
    throw UsageError(file + ": no array of 3 or 4 axes ([T, n, d] or [T, R, n, d]) among " + names);
  return *only;
}

/// A label member [n] of the archive, or empty.
std::vector<double> label_member(const std::vector<NumpyArray>& arrays, const char* name,
                                 const std::string& file) {
  const NumpyArray* found = member(arrays, name);
  if (!found) return {};
  if (found->shape.size() != 1)
    throw UsageError(file + ": `" + name + "` has " + std::to_string(found->shape.size()) +
                     " axes; expected one");
  return found->values;
}

}  // namespace

int import_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  namespace po = boost::program_options;
  std::string out_path, times_text, array_name;
  double cluster_delta = 1e-4;
  bool deflate = false, overwrite = false, quiet = false;
  po::options_description table("mfattn import");
  table.add_options()("out", po::value(&out_path), "FILE.h5")(
      "times", po::value(&times_text), "T0,T1,...")("array", po::value(&array_name),
                                                    "the .npz member")(
      "cluster-delta", po::value(&cluster_delta)->default_value(1e-4), "in (0, 2)")(
      "deflate", po::bool_switch(&deflate), "compress")(
      "overwrite", po::bool_switch(&overwrite), "replace --out")("quiet", po::bool_switch(&quiet),
                                                                 "no summary");
  po::variables_map vm;
  const std::vector<std::string> operands = parse_command_options(args, table, vm);
  if (operands.size() != 1)
    throw UsageError("expected exactly one STATES.npy or STATES.npz (got " +
                     std::to_string(operands.size()) +
                     "; usage: mfattn import STATES.npy|npz --out FILE.h5)");
  const std::string& file = operands.front();
  if (out_path.empty()) throw UsageError("--out: required (FILE.h5)");
  if (!(cluster_delta > 0.0 && cluster_delta < 2.0))
    throw UsageError("--cluster-delta " + format_number(cluster_delta) +
                     ": expected a number in (0, 2)");
  namespace fs = std::filesystem;
  std::error_code ignored;
  if (fs::exists(out_path, ignored) && !overwrite)
    throw OutputExists(out_path + " exists (give --overwrite to replace it)");
  const fs::path folder = fs::path(out_path).parent_path();
  if (!folder.empty() && !fs::is_directory(folder, ignored))
    throw UsageError("--out " + out_path + ": the folder " + folder.string() + " does not exist");

  std::vector<NumpyArray> arrays;
  try {
    check_input_file(file);
  } catch (const std::exception& error) {
    throw UsageError("cannot read " + file + ": " + error.what());
  }
  try {
    arrays = read_numpy_file(file);
  } catch (const NumpyFormatError& error) {
    throw UsageError(error.what());
  }
  NumpyArray& states = states_member(arrays, file, array_name);
  ImportedStates imported;
  if (states.shape.size() != 3 && states.shape.size() != 4) {
    std::string shape;
    for (std::size_t extent : states.shape)
      shape += (shape.empty() ? "" : ", ") + std::to_string(extent);
    throw UsageError(file + (states.name.empty() ? "" : ": `" + states.name + "`") +
                     " has shape [" + shape + "]; expected [T, n, d] or [T, R, n, d]");
  }
  const bool stacked = states.shape.size() == 4;
  imported.frames = states.shape[0];
  imported.replicas = stacked ? states.shape[1] : 1;
  imported.n = states.shape[stacked ? 2 : 1];
  imported.d = states.shape[stacked ? 3 : 2];
  imported.states = std::move(states.values);  // the largest array: moved, not copied
  imported.cluster_delta = cluster_delta;
  imported.deflate = deflate;
  imported.source = fs::path(file).filename().string() +
                    (states.name.empty() ? "" : ":" + states.name);
  std::vector<std::string> ignored_members;
  const bool archive = !states.name.empty();
  if (archive) {
    imported.times = label_member(arrays, "times", file);
    imported.presence = label_member(arrays, "presence", file);
    for (double id : label_member(arrays, "prompt_id", file)) {
      if (id != std::floor(id) || std::fabs(id) > 2147483647.0)
        throw UsageError(file + ": `prompt_id` holds " + format_number(id) +
                         "; expected 32-bit integers");
      imported.prompt_id.push_back(static_cast<std::int32_t>(id));
    }
    for (const NumpyArray& array : arrays)
      if (&array != &states && array.name != "times" && array.name != "presence" &&
          array.name != "prompt_id")
        ignored_members.push_back(array.name);
  }
  if (!times_text.empty()) {
    if (!imported.times.empty()) throw UsageError("--times: " + file + " holds `times` already");
    if (!parse_number_list(times_text, imported.times))
      throw UsageError("--times " + times_text + ": expected numbers, comma separated");
  }
  std::string command_line = "mfattn import";
  for (const std::string& word : args) command_line += " " + word;
  imported.parameters.push_back({"import_command_line", command_line});
  // SIGINT, SIGTERM and SIGHUP end the import while its observables are computed, before
  // the output exists (also inside a frame's pair pass); nothing is left behind.
  const ImportSignals signals;
  // A long computation says so first (10^8 pairs or more: a second and up).
  const double pairs = double(imported.frames * imported.replicas) * double(imported.n) *
                       double(imported.n) / 2.0;
  if (!quiet && pairs >= 1e8)
    err << "mfattn import: computing the observables of " << imported.frames * imported.replicas
        << " frames of " << imported.n
        << " tokens (Ctrl-C stops it; nothing is written before they are done)\n"
        << std::flush;
  std::string state_space;
  try {
    state_space = write_imported_states(imported, out_path, overwrite,
                                        &StopSignals::received_flag());
  } catch (const std::invalid_argument& error) {
    throw UsageError(file + ": " + error.what());
  } catch (const ImportInterrupted& stop) {
    err << "mfattn import: interrupted by " << signal_name(stop.signal)
        << "; nothing was written\n";
    return 128 + stop.signal;
  }
  if (!quiet) {
    out << "mfattn import: " << out_path << ": " << imported.frames << " frames, " << imported.n
        << " tokens, d = " << imported.d
        << (imported.replicas > 1 ? ", " + std::to_string(imported.replicas) + " replicas" : "")
        << ", states on "
        << (state_space == "sphere" ? "the sphere" : "R^d (analysed on their directions)") << '\n';
    if (!ignored_members.empty()) {
      out << "mfattn import: not imported:";
      for (const std::string& name : ignored_members) out << ' ' << name;
      out << " (the states, times, presence and prompt_id are)\n";
    }
  }
  out.flush();
  return kExitOk;
}

}  // namespace mfattn
