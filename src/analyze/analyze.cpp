#include "mfattn/analyze/analyze.hpp"

#include "io/json_text.hpp"

#include <boost/program_options.hpp>

#include <algorithm>
#include <cmath>
#include <charconv>
#include <map>
#include <iomanip>
#include <limits>
#include <ostream>

#include "mfattn/app/config.hpp"
#include "mfattn/core/number_text.hpp"
#include "mfattn/io/h5md.hpp"
#include "mfattn/observers/observables.hpp"
#include "mfattn/app/run.hpp"
#include "mfattn/io/series.hpp"

namespace mfattn {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// decades of a plateau: log10(t_end / t_start), undefined (NaN) unless t_start > 0.
double plateau_decades(double t_start, double t_end) {
  return t_start > 0.0 ? std::log10(t_end / t_start) : kNaN;
}

}  // namespace

Analysis analyze_series(const AnalysisSeries& series, const AnalysisSettings& settings) {
  Analysis a;
  const std::size_t frames = series.time.size();
  if (frames == 0 || series.clusters.size() != frames || series.min_inner.size() != frames ||
      (!series.energy.empty() && series.energy.size() != frames))
    throw std::invalid_argument("analyze_series: every series needs the same, positive length");
  auto energy = [&](std::size_t f) { return series.energy.empty() ? kNaN : series.energy[f]; };
  a.frames = frames;
  a.t_first = series.time.front();
  a.t_last = series.time.back();
  a.cluster_delta = settings.cluster_delta;
  a.collapse_delta = settings.collapse_delta;

  // Collapse: the last frame, then back to the first frame of the final collapsed run.
  const double collapsed_above = 1.0 - settings.collapse_delta;
  auto collapsed_at = [&](std::size_t f) { return series.min_inner[f] >= collapsed_above; };
  a.final_clusters = series.clusters.back();
  a.min_inner_final = series.min_inner.back();
  a.collapsed = collapsed_at(frames - 1);
  if (a.collapsed) {
    std::size_t k = frames - 1;
    while (k > 0 && collapsed_at(k - 1)) --k;
    a.collapse_time = series.time[k];
  }

  // Plateaus and the changes between them.
  for (std::size_t first = 0; first < frames;) {
    std::size_t last = first;
    while (last + 1 < frames && series.clusters[last + 1] == series.clusters[first]) ++last;
    Plateau p;
    p.clusters = series.clusters[first];
    p.first_frame = first;
    p.last_frame = last;
    p.t_start = series.time[first];
    p.t_end = series.time[last];
    p.dwell = p.t_end - p.t_start;
    p.decades = plateau_decades(p.t_start, p.t_end);
    p.energy_end = energy(last);
    p.final = last + 1 == frames;
    p.metastable = !p.final && p.decades >= settings.metastable_decades;
    a.plateaus.push_back(p);
    a.energy_staircase.push_back(p.energy_end);
    if (last + 1 < frames) {
      const ClusterChange change{last + 1, series.time[last + 1], series.clusters[last],
                                 series.clusters[last + 1]};
      (change.to < change.from ? a.merges : a.splits).push_back(change);
    }
    first = last + 1;
  }

  // Energy: monotone unless some frame drops by more than the relative tolerance.
  a.energy_final = energy(frames - 1);
  bool finite = !series.energy.empty();
  for (std::size_t f = 0; f < frames && finite; ++f) finite = std::isfinite(energy(f));
  if (finite) {
    bool monotone = true;
    for (std::size_t f = 1; f < frames; ++f) {
      const double before = series.energy[f - 1], after = series.energy[f];
      const double scale = std::max(std::fabs(before), std::fabs(after));
      const double drop = before - after;
      if (drop > 0.0 && scale > 0.0) a.energy_largest_drop = std::max(a.energy_largest_drop, drop / scale);
      if (drop > settings.energy_tolerance * scale) monotone = false;
    }
    a.energy_monotone = monotone;
  }
  return a;
}

Analysis analyze_file(const std::string& path, std::size_t replica, AnalysisSettings settings) {
  const SeriesFile file(path);
  if (replica >= file.replicas())
    throw UsageError("--replica " + std::to_string(replica) + ": " + path + " has " +
                     std::to_string(file.replicas()) + " replica" +
                     (file.replicas() == 1 ? "" : "s") + " (0.." +
                     std::to_string(file.replicas() - 1) + ")");
  if (const auto delta = file.parameter_number("cluster-delta"); delta && *delta > 0.0)
    settings.cluster_delta = settings.collapse_delta = *delta;

  AnalysisSeries series;
  series.time = file.times();
  std::size_t frames = series.time.size();
  auto scalar_series = [&](const std::string& name) {
    std::vector<double> values;
    if (!file.has_observable(name)) return values;
    std::size_t components = 0;
    values = file.observable(name, replica, &components);
    if (components != 1) throw IoError(path + ": observable " + name + " is not a scalar");
    frames = std::min(frames, values.size());
    return values;
  };
  std::vector<double> clusters = scalar_series("n_clusters");
  std::vector<double> min_inner = scalar_series("min_inner");
  std::vector<double> energy = scalar_series("energy");
  std::vector<double> marginal = scalar_series("marginal_spread");
  std::vector<double> conditional = scalar_series("conditional_spread");
  if (frames == 0) throw IoError(path + " holds no complete frame");

  // The moving tokens, for whatever has to be recomputed from the positions.
  std::vector<double> presence = file.presence(replica);
  std::vector<std::size_t> moving;
  for (std::size_t i = 0; i < file.n(); ++i)
    if (presence.empty() || presence[i] > 0.0) moving.push_back(i);
  const bool recompute = clusters.empty() || min_inner.empty();
  // Imported states off the sphere are analysed on their directions (docs/import.md).
  const bool euclidean = file.parameter_string("state_space").value_or("sphere") != "sphere";
  auto stored_points = [&](std::size_t row) {
    std::vector<double> x = file.positions(row, replica);
    if (euclidean)
      for (std::size_t i = 0; i < file.n(); ++i) {
        double* point = x.data() + i * file.d();
        double norm2 = 0.0;
        for (std::size_t c = 0; c < file.d(); ++c) norm2 += point[c] * point[c];
        if (norm2 > 0.0)
          for (std::size_t c = 0; c < file.d(); ++c) point[c] /= std::sqrt(norm2);
      }
    return x;
  };
  // Only files that keep every frame's positions can stand in for a missing observable.
  auto need_positions = [&](const char* what) {
    if (file.position_frames() < frames)
      throw IoError(path + ": " + what + " is not in the file and cannot be recomputed: it keeps the "
                    "positions of " + std::to_string(file.position_frames()) + " of its " +
                    std::to_string(frames) + " frames (--save-positions " + file.save_positions() + ")");
  };
  if (recompute) {
    need_positions(clusters.empty() ? "n_clusters" : "min_inner");
    ObservableSettings observable_settings;
    observable_settings.cluster_delta = settings.cluster_delta;
    std::vector<double> counted(frames), lowest(frames);
    for (std::size_t f = 0; f < frames; ++f) {
      const std::vector<double> x = stored_points(f);
      const PairStatistics stats = pair_statistics(x.data(), file.d(), moving, observable_settings);
      counted[f] = double(stats.clusters);
      lowest[f] = stats.min_inner;
    }
    if (clusters.empty()) clusters = counted;
    if (min_inner.empty()) min_inner = lowest;
  }
  series.time.resize(frames);
  series.min_inner.assign(min_inner.begin(), min_inner.begin() + static_cast<std::ptrdiff_t>(frames));
  for (std::size_t f = 0; f < frames; ++f) {
    if (!(clusters[f] >= 0.0)) throw IoError(path + ": n_clusters holds a value that is not a count");
    series.clusters.push_back(static_cast<std::size_t>(std::llround(clusters[f])));
  }
  if (!energy.empty()) series.energy.assign(energy.begin(), energy.begin() + static_cast<std::ptrdiff_t>(frames));

  Analysis a = analyze_series(series, settings);
  a.file = path;
  a.status = file.run_status();
  a.replica = replica;
  a.replicas = file.replicas();
  a.n = file.n();
  a.d = file.d();
  a.clusters_from_positions = !file.has_observable("n_clusters");
  if (!marginal.empty()) {
    a.marginal_spread_final = marginal[frames - 1];
  } else {
    // Older files: 1 - largest eigenvalue of the second moment of the last frame.
    need_positions("marginal_spread");
    const std::vector<double> x = stored_points(frames - 1);
    std::vector<double> rows;
    for (std::size_t i : moving) rows.insert(rows.end(), x.begin() + static_cast<std::ptrdiff_t>(i * file.d()),
                                             x.begin() + static_cast<std::ptrdiff_t>((i + 1) * file.d()));
    a.marginal_spread_final = 1.0 - second_moment_eigenvalues(rows.data(), moving.size(), file.d()).front();
  }
  if (!conditional.empty()) a.conditional_spread_final = conditional[frames - 1];
  if (const auto flow = file.parameter_number("gradient_flow")) a.gradient_flow = *flow != 0.0;
  a.energy_in_file = !energy.empty();
  if (const auto space = file.parameter_string("state_space")) a.state_space = *space;
  return a;
}

namespace {

/// Minimal JSON writer: strings escaped per RFC 8259, non-finite numbers as null.
class Json {
 public:
  explicit Json(std::ostream& out) : out_(out) {}
  static std::string quoted(const std::string& text) { return json::quoted(text); }
  static std::string number(double value) { return json::number(value); }
  static std::string number(std::optional<double> value) { return value ? number(*value) : "null"; }
  static std::string integer(std::size_t value) { return std::to_string(value); }
  static std::string boolean(bool value) { return value ? "true" : "false"; }
  static std::string boolean(std::optional<bool> value) { return value ? boolean(*value) : "null"; }
  static std::string text(const std::optional<std::string>& value) { return value ? quoted(*value) : "null"; }

  /// Opens an object or array member list.
  void open(char bracket) {
    out_ << bracket;
    first_.push_back(true);
  }
  void close(char bracket) {
    out_ << bracket;
    first_.pop_back();
  }
  void key(const std::string& name) {
    separator();
    out_ << quoted(name) << ':';
  }
  void field(const std::string& name, const std::string& raw) {
    key(name);
    out_ << raw;
  }
  void element(const std::string& raw) {
    separator();
    out_ << raw;
  }
  /// Before an element of an array (when opening a nested object).
  void separator() {
    if (!first_.back()) out_ << ',';
    first_.back() = false;
  }

 private:
  std::ostream& out_;
  std::vector<bool> first_;
};

/// Whether the text lists change c exactly (not folded into a net step): both plateaus it
/// joins, the one that ends at frame c.frame - 1 and the one that starts at c.frame, are listed.
bool change_listed(const Analysis& a, const ClusterChange& c, double min_decades) {
  bool before = false, after = false;
  for (const Plateau& p : a.plateaus) {
    if (p.last_frame + 1 == c.frame) before = plateau_listed(p, min_decades);
    if (p.first_frame == c.frame) after = plateau_listed(p, min_decades);
  }
  return before && after;
}

void write_changes(Json& json, const std::string& name, const Analysis& a,
                   const std::vector<ClusterChange>& changes, double min_decades) {
  json.key(name);
  json.open('[');
  for (const ClusterChange& c : changes) {
    json.separator();
    json.open('{');
    json.field("time", Json::number(c.time));
    json.field("frame", Json::integer(c.frame));
    json.field("from", Json::integer(c.from));
    json.field("to", Json::integer(c.to));
    json.field("listed", Json::boolean(change_listed(a, c, min_decades)));
    json.close('}');
  }
  json.close(']');
}

std::string yes_no(bool value) { return value ? "yes" : "no"; }

}  // namespace

void write_analysis_json(const Analysis& a, std::ostream& out, double min_decades) {
  Json json(out);
  json.open('{');
  json.field("file", Json::quoted(a.file));
  json.field("status", Json::text(a.status));
  json.field("replica", Json::integer(a.replica));
  json.field("replicas", Json::integer(a.replicas));
  json.field("n", Json::integer(a.n));
  json.field("d", Json::integer(a.d));
  json.field("frames_read", Json::integer(a.frames));
  json.field("t_first", Json::number(a.t_first));
  json.field("t_last", Json::number(a.t_last));
  json.field("cluster_delta", Json::number(a.cluster_delta));
  json.field("collapse_delta", Json::number(a.collapse_delta));
  json.field("clusters_source", Json::quoted(a.clusters_from_positions ? "positions" : "file"));
  json.field("final_clusters", Json::integer(a.final_clusters));
  json.field("collapsed", Json::boolean(a.collapsed));
  json.field("collapse_time", Json::number(a.collapse_time));
  json.field("min_inner_final", Json::number(a.min_inner_final));
  json.field("marginal_spread_final", Json::number(a.marginal_spread_final));
  json.field("conditional_spread_final", Json::number(a.conditional_spread_final));
  json.field("energy_final", Json::number(a.energy_final));
  json.field("energy_monotone", Json::boolean(a.energy_monotone));
  json.field("energy_largest_relative_drop", Json::number(a.energy_largest_drop));
  json.field("gradient_flow", Json::boolean(a.gradient_flow));
  json.field("energy_in_file", Json::boolean(a.energy_in_file));
  json.field("state_space", Json::quoted(a.state_space));
  json.key("plateaus");
  json.open('[');
  std::size_t metastable = 0;
  for (const Plateau& p : a.plateaus) {
    metastable += p.metastable;
    json.separator();
    json.open('{');
    json.field("clusters", Json::integer(p.clusters));
    json.field("t_start", Json::number(p.t_start));
    json.field("t_end", Json::number(p.t_end));
    json.field("dwell", Json::number(p.dwell));
    json.field("decades", Json::number(p.decades));
    json.field("first_frame", Json::integer(p.first_frame));
    json.field("last_frame", Json::integer(p.last_frame));
    json.field("energy_end", Json::number(p.energy_end));
    json.field("metastable", Json::boolean(p.metastable));
    json.field("final", Json::boolean(p.final));
    json.field("initial", Json::boolean(p.first_frame == 0 && !p.final));
    json.field("listed", Json::boolean(plateau_listed(p, min_decades)));
    json.close('}');
  }
  json.close(']');
  json.field("metastable_plateaus", Json::integer(metastable));
  json.field("min_decades", Json::number(min_decades));
  write_changes(json, "merge_times", a, a.merges, min_decades);
  write_changes(json, "split_times", a, a.splits, min_decades);
  json.key("energy_staircase");
  json.open('[');
  for (double e : a.energy_staircase) json.element(Json::number(e));
  json.close(']');
  json.close('}');
  out << '\n';
}

bool plateau_listed(const Plateau& p, double min_decades) {
  if (p.final) return true;
  if (std::isfinite(p.decades)) return p.decades >= min_decades;
  return p.last_frame > p.first_frame;
}

namespace {

void text_line(std::ostream& out, const std::string& key, const std::string& value) {
  out << std::left << std::setw(26) << key << value << '\n';
}

/// The lines every text report starts with: the file, its status, the sizes, the frames read.
void text_header(std::ostream& out, const Analysis& a, const std::string& replica_key, const std::string& replica_text) {
  text_line(out, "file", a.file);
  text_line(out, "status", a.status ? *a.status : "(none)");
  text_line(out, replica_key, replica_text);
  text_line(
      out, "tokens",
      "n = " + std::to_string(a.n) + ", d = " + std::to_string(a.d) +
          (a.state_space == "sphere" ? "" : " (states in R^d, analysed on their directions)"));
  text_line(out, "frames_read", std::to_string(a.frames) + " (t = " + format_significant(a.t_first) + " .. " +
                                    format_significant(a.t_last) + ")");
}

std::string plateau_span(const Plateau& p) {
  return std::to_string(p.clusters) + (p.clusters == 1 ? " cluster" : " clusters") + " for " +
         (std::isfinite(p.decades) ? format_significant(p.decades) + " decades" : "undefined decades") + " (t = " +
         format_significant(p.t_start) + " .. " + format_significant(p.t_end) + ")";
}

/// "key: count, key: count" of a histogram, keys ascending.
std::string histogram_text(const std::map<std::size_t, std::size_t>& counts) {
  std::string text;
  for (const auto& [key, count] : counts) text += (text.empty() ? "" : ", ") + std::to_string(key) + ": " + std::to_string(count);
  return text.empty() ? "none" : text;
}

}  // namespace

void write_analysis_text(const Analysis& a, std::ostream& out, double min_decades) {
  auto line = [&](const std::string& key, const std::string& value) { text_line(out, key, value); };
  text_header(out, a, "replica", std::to_string(a.replica) + " of " + std::to_string(a.replicas));
  line("clusters", std::string(a.clusters_from_positions ? "recomputed from positions" : "from the file") +
                       ", delta_c = " + format_significant(a.cluster_delta));
  line("final_clusters", std::to_string(a.final_clusters));
  line("collapsed", yes_no(a.collapsed) + " (criterion: final min_inner >= 1 - " +
                        format_significant(a.collapse_delta) + ")");
  line("collapse_time", a.collapse_time ? format_significant(*a.collapse_time) : "never");
  line("min_inner_final", format_number(a.min_inner_final));
  line("marginal_spread_final", format_number(a.marginal_spread_final));
  if (a.conditional_spread_final) line("conditional_spread_final", format_number(*a.conditional_spread_final));
  const std::string no_energy = "none (the file has no energy)";
  line("energy_final", a.energy_in_file ? format_number(a.energy_final) : no_energy);
  std::string monotone = a.energy_monotone  ? yes_no(*a.energy_monotone)
                         : a.energy_in_file ? "unknown (energy not finite)"
                                            : "unknown (the file has no energy)";
  if (a.energy_monotone && !*a.energy_monotone)
    monotone += " (largest relative drop " + format_significant(a.energy_largest_drop) + ")";
  if (a.gradient_flow)
    monotone += *a.gradient_flow ? "; gradient flow: the energy must not decrease"
                                 : "; not a gradient flow: the energy may decrease";
  line("energy_monotone", monotone);
  std::string summary;
  std::size_t metastable = 0, hidden = 0;
  for (const Plateau& p : a.plateaus)
    if (p.metastable) summary += (summary.empty() ? "" : "; ") + plateau_span(p);
  line("metastable", summary.empty() ? "none (no plateau but the last lasts a decade)" : summary);
  for (const Plateau& p : a.plateaus) {
    metastable += p.metastable;
    if (!plateau_listed(p, min_decades)) {
      ++hidden;
      continue;
    }
    std::string text = std::to_string(p.clusters) + (p.clusters == 1 ? " cluster" : " clusters") +
                       ", t = " + format_significant(p.t_start) + " .. " +
                       format_significant(p.t_end) + ", " +
                       (std::isfinite(p.decades) ? format_significant(p.decades) + " decades"
                                                 : "decades undefined") +
                       (a.energy_in_file ? ", energy " + format_significant(p.energy_end) : "");
    if (p.metastable) text += ", metastable";
    if (p.final) text += ", final";
    // The run's first plateau, before any token has joined another: no clustering yet.
    if (p.first_frame == 0 && !p.final) text += ", initial (before clustering starts)";
    line("plateau", text);
  }
  if (hidden > 0)
    line("plateaus_not_listed", std::to_string(hidden) + " shorter than " + format_significant(min_decades) +
                                    " decades (--min-decades 0 lists them; --json has every one)");
  line("metastable_plateaus", std::to_string(metastable));
  // The changes between consecutive listed plateaus, net of the shorter ones between them (a
  // cascade through one-frame plateaus is one line), and the listed plateaus' end energies.
  struct Step {
    const Plateau *before, *after;
    std::size_t through;  // plateaus left out between them
  };
  std::vector<Step> steps;
  std::string staircase;
  const Plateau* previous = nullptr;
  std::size_t skipped = 0;
  for (const Plateau& p : a.plateaus) {
    if (!plateau_listed(p, min_decades)) {
      ++skipped;
      continue;
    }
    if (previous && previous->clusters != p.clusters) steps.push_back({previous, &p, skipped});
    if (!staircase.empty()) staircase += ' ';
    staircase += format_significant(p.energy_end);
    previous = &p;
    skipped = 0;
  }
  std::size_t exact = 0;
  for (const bool merging : {true, false})
    for (const Step& s : steps) {
      if ((s.after->clusters < s.before->clusters) != merging) continue;
      exact += s.through == 0;
      std::string text = "t = " + format_significant(s.after->t_start) + ": " +
                         std::to_string(s.before->clusters) + " -> " +
                         std::to_string(s.after->clusters);
      if (s.through > 0)
        text += " (through " + std::to_string(s.through) + " shorter plateau" +
                (s.through == 1 ? "" : "s") + ")";
      line(merging ? "merge" : "split", text);
    }
  const std::size_t changes = a.merges.size() + a.splits.size();
  if (exact < changes)
    line("changes_not_listed",
         std::to_string(changes - exact) + " of the " + std::to_string(changes) +
             " merges and splits pass through plateaus shorter than " +
             format_significant(min_decades) + " decades (--min-decades 0 lists each)");
  line("energy_staircase", a.energy_in_file ? staircase : no_energy);
}

namespace {

std::size_t metastable_count(const Analysis& a) {
  return std::size_t(std::count_if(a.plateaus.begin(), a.plateaus.end(), [](const Plateau& p) { return p.metastable; }));
}

struct ReplicaSummary {
  std::size_t collapsed = 0;
  std::map<std::size_t, std::size_t> final_clusters, metastable_counts, metastable_clusters;
  std::vector<double> collapse_times;  // sorted
};

ReplicaSummary summarise(const std::vector<Analysis>& analyses) {
  ReplicaSummary s;
  for (const Analysis& a : analyses) {
    s.collapsed += a.collapsed;
    ++s.final_clusters[a.final_clusters];
    if (a.collapse_time) s.collapse_times.push_back(*a.collapse_time);
    for (const Plateau& p : a.plateaus)
      if (p.metastable) ++s.metastable_clusters[p.clusters];
    ++s.metastable_counts[metastable_count(a)];
  }
  std::sort(s.collapse_times.begin(), s.collapse_times.end());
  return s;
}

/// The median of sorted values (the mean of the middle two for an even count).
double median(const std::vector<double>& sorted) {
  const std::size_t m = sorted.size() / 2;
  return sorted.size() % 2 ? sorted[m] : 0.5 * (sorted[m - 1] + sorted[m]);
}

}  // namespace

void write_replicas_text(const std::vector<Analysis>& analyses, std::ostream& out) {
  auto line = [&](const std::string& key, const std::string& value) { text_line(out, key, value); };
  const Analysis& first = analyses.front();
  const ReplicaSummary s = summarise(analyses);
  text_header(out, first, "replicas", std::to_string(analyses.size()) + " (every one analysed)");
  line("collapsed", std::to_string(s.collapsed) + " of " + std::to_string(analyses.size()) +
                        " (criterion: final min_inner >= 1 - " + format_significant(first.collapse_delta) + ")");
  line("collapse_time", s.collapse_times.empty()
                            ? "never"
                            : "min " + format_significant(s.collapse_times.front()) + ", median " +
                                  format_significant(median(s.collapse_times)) + ", max " +
                                  format_significant(s.collapse_times.back()) + " (the collapsed replicas)");
  line("final_clusters", histogram_text(s.final_clusters) + " (clusters: replicas)");
  line("metastable_plateaus", histogram_text(s.metastable_counts) + " (plateaus: replicas)");
  line("metastable_clusters", histogram_text(s.metastable_clusters) + " (clusters: metastable plateaus)");
}

void write_replicas_json(const std::vector<Analysis>& analyses, std::ostream& out) {
  const Analysis& first = analyses.front();
  const ReplicaSummary s = summarise(analyses);
  Json json(out);
  auto histogram = [&](const std::string& name, const std::map<std::size_t, std::size_t>& counts) {
    json.key(name);
    json.open('{');
    for (const auto& [key, count] : counts) json.field(std::to_string(key), Json::integer(count));
    json.close('}');
  };
  json.open('{');
  json.field("file", Json::quoted(first.file));
  json.field("status", Json::text(first.status));
  json.field("replicas", Json::integer(analyses.size()));
  json.field("n", Json::integer(first.n));
  json.field("d", Json::integer(first.d));
  json.field("frames_read", Json::integer(first.frames));
  json.field("t_last", Json::number(first.t_last));
  json.field("collapse_delta", Json::number(first.collapse_delta));
  json.field("collapsed", Json::integer(s.collapsed));
  if (s.collapse_times.empty()) {
    json.field("collapse_time", "null");
  } else {
    json.key("collapse_time");
    json.open('{');
    json.field("min", Json::number(s.collapse_times.front()));
    json.field("median", Json::number(median(s.collapse_times)));
    json.field("max", Json::number(s.collapse_times.back()));
    json.close('}');
  }
  histogram("final_clusters", s.final_clusters);
  histogram("metastable_plateaus", s.metastable_counts);
  histogram("metastable_clusters", s.metastable_clusters);
  json.key("per_replica");
  json.open('[');
  for (const Analysis& a : analyses) {
    json.separator();
    json.open('{');
    json.field("replica", Json::integer(a.replica));
    json.field("final_clusters", Json::integer(a.final_clusters));
    json.field("collapsed", Json::boolean(a.collapsed));
    json.field("collapse_time", Json::number(a.collapse_time));
    json.field("min_inner_final", Json::number(a.min_inner_final));
    json.field("metastable_plateaus", Json::integer(metastable_count(a)));
    json.close('}');
  }
  json.close(']');
  json.close('}');
  out << '\n';
}

int analyze_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& /*err*/) {
  constexpr const char* kUsageLine = "usage: mfattn analyze FILE.h5 [--json] [--replica R|all] [--min-decades D]";
  namespace po = boost::program_options;
  bool json = false, every_replica = false;
  std::string replica_text = "0", decades_text;
  po::options_description table("mfattn analyze");
  table.add_options()("json", po::bool_switch(&json), "one JSON object instead of text")(
      "replica", po::value(&replica_text), "a replica index >= 0, or all")(
      "min-decades", po::value(&decades_text), "a number of decades >= 0");
  po::variables_map vm;
  const std::vector<std::string> operands = parse_command_options(args, table, vm);
  if (operands.size() != 1 || operands.front().empty())
    throw UsageError(operands.size() > 1 ? "expected one FILE.h5, got " + operands[0] + " and " + operands[1] + "; " + kUsageLine
                                         : std::string("expected one FILE.h5; ") + kUsageLine);
  const std::string& path = operands.front();
  double min_decades = kDefaultListedDecades;
  if (vm.count("min-decades")) {
    const auto result = std::from_chars(decades_text.data(), decades_text.data() + decades_text.size(), min_decades);
    if (result.ec != std::errc() || result.ptr != decades_text.data() + decades_text.size() || !(min_decades >= 0.0) ||
        !std::isfinite(min_decades))
      throw UsageError("--min-decades " + decades_text + ": expected a number of decades >= 0");
  }
  std::size_t replica = 0;
  every_replica = replica_text == "all";
  if (!every_replica) {
    const auto result = std::from_chars(replica_text.data(), replica_text.data() + replica_text.size(), replica);
    if (result.ec != std::errc() || result.ptr != replica_text.data() + replica_text.size() || replica_text.empty())
      throw UsageError("--replica " + replica_text + ": expected a replica index >= 0, or all");
  }
  std::vector<Analysis> analyses;
  analyses.push_back(analyze_file(path, replica));
  if (every_replica)
    for (std::size_t r = 1; r < analyses.front().replicas; ++r) analyses.push_back(analyze_file(path, r));
  if (every_replica) {
    if (json) write_replicas_json(analyses, out);
    else write_replicas_text(analyses, out);
  } else if (json) {
    write_analysis_json(analyses.front(), out, min_decades);
  } else {
    write_analysis_text(analyses.front(), out, min_decades);
  }
  out.flush();
  return kExitOk;
}

}  // namespace mfattn
