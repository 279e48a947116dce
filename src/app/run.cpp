#include "mfattn/run.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <numbers>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "mfattn/gauge.hpp"
#include "mfattn/h5md.hpp"
#include "mfattn/init.hpp"
#include "mfattn/input_file.hpp"
#include "mfattn/integrator.hpp"
#include "mfattn/number_text.hpp"
#include "mfattn/observables.hpp"
#include "mfattn/rng.hpp"
#include "mfattn/run_choices.hpp"
#include "mfattn/stop_signals.hpp"
#include "mfattn/version.hpp"

namespace mfattn {
namespace {

/// A d x d matrix of independent N(0, 1) entries, row by row, from stream.
Matrix standard_gaussian(RandomStream& stream, std::size_t d) {
  Matrix a(d, d);
  for (std::size_t r = 0; r < d; ++r)
    for (std::size_t c = 0; c < d; ++c) a(r, c) = stream.normal();
  return a;
}

/// A random preset's matrix from stream (docs/model.md, "Random matrices").
Matrix random_matrix(MatrixPreset kind, std::size_t d, RandomStream& stream) {
  const double size = double(d);
  const Matrix a = standard_gaussian(stream, d);
  switch (kind) {
    case MatrixPreset::Gaussian: return a / std::sqrt(size);  // entries N(0, 1/d)
    // GOE: symmetric, off-diagonal variance 1/d, diagonal variance 2/d.
    case MatrixPreset::Goe: return (a + a.transpose()) / std::sqrt(2.0 * size);
    case MatrixPreset::GaussianProduct: {
      const Matrix b = standard_gaussian(stream, d);
      return a * b / std::sqrt(size);
    }
    case MatrixPreset::WignerUnit: {
      // (G + G^T) / sqrt(2) off the diagonal, G_aa on it: every entry has variance 1.
      Matrix w = (a + a.transpose()) / std::sqrt(2.0);
      for (std::size_t r = 0; r < d; ++r) w(r, r) = a(r, r);
      return w;
    }
    case MatrixPreset::GoeUnit: return (a + a.transpose()) / std::sqrt(2.0);
    case MatrixPreset::Wishart: return a * a.transpose() / std::sqrt(size);
    default: throw std::logic_error("random_matrix: not a random preset");
  }
}

/// The stream of matrix `which` (0: Q, 1: K, 2: V) of one layer and matrix set: layer 0 of
/// the shared set is the stream (seed, Matrices, which) that runs without these options
/// have always used.
RandomStream matrix_stream(std::uint64_t seed, std::uint64_t which, std::uint64_t layer,
                           std::uint64_t set_key) {
  return RandomStream(seed, static_cast<std::uint64_t>(StreamTag::Matrices), which + 4 * layer, set_key);
}

/// Q, K or V (option "q", "k" or "v") from identity, a random preset or, without one, the
/// file value names; V's products of Q and K are made by the caller.
Matrix matrix_option(const std::string& option, std::optional<MatrixPreset> preset, const std::string& value,
                     std::size_t d, RandomStream stream, bool& identity) {
  identity = preset == MatrixPreset::Identity;
  if (identity) return Matrix::Identity(d, d);
  if (preset) return random_matrix(*preset, d, stream);
  std::size_t rows = 0;
  std::vector<double> numbers;
  try {
    numbers = read_text_rows(value, d, rows);
  } catch (const std::exception& e) {
    throw UsageError("--" + option + " " + value + ": " + e.what());
  }
  if (rows != d)
    throw UsageError("--" + option + " " + value + ": needs d = " + std::to_string(d) +
                     " rows of d numbers, found " + std::to_string(rows) + " rows");
  Matrix m(d, d);
  std::copy(numbers.begin(), numbers.end(), m.data());
  return m;
}

/// The Q, K, V of one layer and matrix set (set_key 0: the shared set, r + 1: replica r's).
AttentionMatrices draw_matrices(const RunConfig& cfg, std::uint64_t layer, std::uint64_t set_key) {
  const auto d = static_cast<std::size_t>(cfg.d);
  const auto seed = static_cast<std::uint64_t>(cfg.seed);
  AttentionMatrices m;
  m.q = matrix_option("q", cfg.choices.q, cfg.q, d, matrix_stream(seed, 0, layer, set_key), m.q_identity);
  m.k = matrix_option("k", cfg.choices.k, cfg.k, d, matrix_stream(seed, 1, layer, set_key), m.k_identity);
  const std::optional<MatrixPreset> v = cfg.choices.v;
  if (v == MatrixPreset::PlusQk || v == MatrixPreset::MinusQk) {
    m.v = m.q.transpose() * m.k;
    if (v == MatrixPreset::MinusQk) m.v = -m.v;
    m.v_identity = false;
  } else if (v == MatrixPreset::PlusForm || v == MatrixPreset::MinusForm) {
    // The reference code's V = +-B / c applied to row vectors, B = K^T Q its bilinear form:
    // as a matrix acting on columns, V = +-B^T / c = +-(Q^T K)^T / c, with c = 1 for the
    // identity form, sqrt(d + 1) for goe-unit, sqrt(d) otherwise.
    const double c = m.q_identity && m.k_identity ? 1.0
                     : cfg.choices.k == MatrixPreset::GoeUnit ? std::sqrt(double(d) + 1.0)
                                                                         : std::sqrt(double(d));
    m.v = (m.q.transpose() * m.k).transpose() / c;
    if (v == MatrixPreset::MinusForm) m.v = -m.v;
    m.v_identity = false;
  } else {
    m.v = matrix_option("v", v, cfg.v, d, matrix_stream(seed, 2, layer, set_key), m.v_identity);
  }
  return m;
}

std::vector<double> amplitudes_option(const RunConfig& cfg) {
  const std::size_t n = static_cast<std::size_t>(cfg.n);
  std::vector<double> values;
  if (!parse_number_list(cfg.amplitudes, values)) {
    std::size_t rows = 0;
    try {
      values = read_text_rows(cfg.amplitudes, 1, rows);
    } catch (const std::exception& e) {
      throw UsageError("--amplitudes " + cfg.amplitudes +
                       ": neither a list of numbers nor a readable file (" + e.what() + ")");
    }
  }
  if (values.size() == 1) values.assign(n, values[0]);
  if (values.size() != n)
    throw UsageError("--amplitudes " + cfg.amplitudes + ": needs 1 or n = " + std::to_string(n) +
                     " numbers, found " + std::to_string(values.size()));
  // presence a^2 / (tau + a^2) needs a finite square.
  for (double a : values)
    if (!(a >= 0.0) || !std::isfinite(a * a))
      throw UsageError("--amplitudes " + cfg.amplitudes +
                       ": amplitudes must lie in [0, 1.3e154] (their square must be a finite number)");
  return values;
}

/// Progress on stderr: a bar with elapsed time, step rate and ETA when it is a terminal,
/// redrawn after steps (at most five times a second), so a run with many steps between
/// frames still moves; a plain line every tenth of the horizon otherwise; nothing with
/// --quiet. The fraction is that of the time span, which is also what dopri5 advances.
class Progress {
 public:
  Progress(bool quiet, double start_time, double horizon, std::int64_t start_step, std::ostream& log)
      : quiet_(quiet),
        terminal_(::isatty(STDERR_FILENO) == 1),
        start_time_(start_time),
        horizon_(horizon),
        start_step_(start_step),
        log_(log),
        next_line_(start_time) {}

  void update(double time, std::int64_t step) {
    if (quiet_) return;
    const double span = horizon_ - start_time_;
    const double fraction = span > 0 ? std::clamp((time - start_time_) / span, 0.0, 1.0) : 1.0;
    if (terminal_) {
      // Reading the clock costs more than a small step: look at it every 16th call.
      if ((++calls_ & 15) != 0 && fraction < 1.0) return;
      const double elapsed = seconds_since_start();
      if (elapsed - last_draw_ < 0.2 && fraction < 1.0) return;
      last_draw_ = elapsed;
      constexpr int kWidth = 30;
      const int filled = static_cast<int>(fraction * kWidth);
      std::ostringstream line;
      line << "\r[" << std::string(filled, '#') << std::string(kWidth - filled, '.') << "] "
           << std::fixed << std::setprecision(1) << 100.0 * fraction << "%  t = "
           << std::setprecision(4) << std::defaultfloat << time << "  step " << step;
      if (elapsed > 0) line << " (" << std::setprecision(3) << double(step - start_step_) / elapsed << " steps/s)";
      line << "  " << format_seconds(elapsed) << " elapsed";
      if (fraction > 0.0 && fraction < 1.0)
        line << ", ETA " << format_seconds(elapsed * (1.0 - fraction) / fraction);
      log_ << line.str() << "   " << std::flush;
      drawn_ = true;
    } else if (time >= next_line_ || fraction >= 1.0) {
      if (fraction >= 1.0 && printed_end_) return;
      printed_end_ = fraction >= 1.0;
      log_ << "mfattn run: t = " << time << " / " << horizon_ << ", step " << step << ", "
           << format_seconds(seconds_since_start()) << " elapsed\n";
      next_line_ = time + horizon_ / 10.0;
    }
  }

  /// Whether update(time) prints a plain line (stderr not a terminal): the run flushes its
  /// frames first, so that a line reports only frames that survive a SIGKILL.
  bool line_due(double time) const {
    if (quiet_ || terminal_) return false;
    const double fraction = horizon_ - start_time_ > 0 ? (time - start_time_) / (horizon_ - start_time_) : 1.0;
    return fraction >= 1.0 ? !printed_end_ : time >= next_line_;
  }

  void finish() {
    if (drawn_) log_ << '\n';
    drawn_ = false;
  }

 private:
  double seconds_since_start() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

  bool quiet_, terminal_;
  double start_time_, horizon_;
  std::int64_t start_step_;
  std::ostream& log_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  double last_draw_ = -1.0, next_line_;
  unsigned calls_ = 0;
  bool drawn_ = false, printed_end_ = false;
};

/// One thing a run records: a name that says what, when, and the code that computes and
/// writes it.
struct RunObserver {
  std::string name;
  ObserverSchedule when;
  std::function<void(const State&)> record;
};

/// Thrown from the step hook when a stop was requested; the run ends between two steps.
struct Interrupted {
  int signal;
};

/// The status word of an interruption: the signal's name, or the caller's stop (signal 0).
std::string interruption_name(int signal) { return signal ? signal_name(signal) : "stopped by the caller"; }

/// Fixed-step methods may take at most this many steps: beyond it a run cannot finish (at
/// 0.1 us per step, 10^12 steps take 28 hours) and the step stops moving the clock once
/// dt < horizon * 2^-52.
constexpr double kMaxFixedSteps = 1e12;

/// The spacing of --save-every frames (0 with --save-times or --save-log).
double resolved_save_every(const RunConfig& cfg) {
  if (!cfg.save_times.empty() || cfg.save_log > 0) return 0.0;
  return cfg.save_every > 0 ? cfg.save_every : cfg.horizon / 100.0;
}

}  // namespace

std::string option_difference(const RunConfig& cfg, const FileSummary& stored, std::initializer_list<OptionRole> roles) {
  auto stored_value = [&](const std::string& name) -> const std::string* {
    for (const auto& [key, value] : stored.parameters)
      if (key == name) return &value;
    return nullptr;
  };
  // A file from a build that lacked an option was made with that option's default (the
  // option did not exist, so nothing else could be meant): it matches while the option is
  // still at its default. The defaults are parsed only when a file lacks an option.
  std::optional<RunConfig> defaults;
  auto default_text = [&](const std::string& name) -> std::string {
    if (!defaults) defaults = parse_run_arguments({"--out", cfg.out});
    for (const auto& [key, value] : defaults->parameters)
      if (key == name) return parameter_text(value);
    return "";
  };
  for (const auto& [name, value] : cfg.parameters) {
    if (std::find(roles.begin(), roles.end(), option_role(name)) == roles.end()) continue;
    const auto* before = stored_value(name);
    const std::string now = parameter_text(value);
    if (!before && now == default_text(name)) continue;
    if (!before || *before != now)
      return "--" + name + " is " + now + " but the file was made with " + (before ? *before : std::string("no such option"));
  }
  return "";
}

namespace {

/// --resume: the file must exist and have been made with the same options, except those
/// that do not change the trajectory (the horizon may grow). A run that left --save-every at
/// its default keeps the file's frame spacing.
void check_resumable(RunConfig& cfg) {
  if (cfg.overwrite) throw UsageError("--resume: cannot be combined with --overwrite");
  FileSummary stored;
  try {
    // describe_file checks the layout as every reader does: a file that is not a readable
    // mfattn file is refused here, before anything is opened for writing.
    stored = describe_file(cfg.out);
  } catch (const NotMfattnFile& e) {
    throw UsageError(std::string("--resume: ") + e.what());
  }
  auto stored_value = [&](const std::string& name) -> const std::string* {
    for (const auto& [key, value] : stored.parameters)
      if (key == name) return &value;
    return nullptr;
  };
  if (cfg.save_every == 0.0 && cfg.save_times.empty() && cfg.save_log == 0)
    if (const auto* spacing = stored_value("save_every_used")) cfg.save_every = std::stod(*spacing);
  // Extent options may change on a resume (the horizon may grow: below), Execution ones too.
  if (const std::string difference = option_difference(cfg, stored, {OptionRole::Trajectory}); !difference.empty())
    throw UsageError("--resume " + cfg.out + ": " + difference);
  if (const auto* horizon = stored_value("horizon"); horizon && cfg.horizon < std::stod(*horizon))
    throw UsageError("--resume: --horizon " + parameter_text(cfg.horizon) +
                     " is shorter than the file's " + *horizon);
}

}  // namespace

std::string signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGKILL: return "SIGKILL";
    case SIGHUP: return "SIGHUP";
    case SIGQUIT: return "SIGQUIT";
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    default: return "signal " + std::to_string(signal);
  }
}

std::vector<AttentionMatrices> layer_matrices(const RunConfig& cfg, std::size_t layer) {
  if (cfg.choices.matrices == MatrixSharing::Shared) return {draw_matrices(cfg, layer, 0)};
  std::vector<AttentionMatrices> sets;
  for (std::int64_t r = 0; r < cfg.replicas; ++r)
    sets.push_back(draw_matrices(cfg, layer, static_cast<std::uint64_t>(r) + 1));
  return sets;
}

namespace {
/// The number of layers: the l >= 0 with l T <= horizon (1 without --regen-period), from
/// floor(horizon / T) + 1 corrected for its rounding.
std::size_t layer_count(const RunConfig& cfg) {
  const double period = cfg.regen_period;
  if (!(period > 0)) return 1;
  // Every layer whose start the run reaches, one at the horizon included (within the rounding
  // of layer_at): the final frame there is recorded with that layer's matrices, as a longer
  // run records the same frame, so a run resumed from it continues bit-identically.
  const double reached = cfg.horizon + 1e-12 * std::max(1.0, cfg.horizon);
  auto layers = static_cast<std::size_t>(std::max(1.0, std::floor(reached / period) + 1.0));
  while (layers > 1 && double(layers - 1) * period > reached) --layers;
  while (double(layers) * period <= reached) ++layers;
  return layers;
}
}  // namespace

std::vector<double> layer_start_times(const RunConfig& cfg) {
  std::vector<double> starts;
  for (std::size_t l = 0, layers = layer_count(cfg); l < layers; ++l)
    starts.push_back(double(l) * cfg.regen_period);
  return starts;
}

std::size_t layer_at(const RunConfig& cfg, double time) {
  if (!(cfg.regen_period > 0)) return 0;
  // The last layer whose start l T is <= time, a start within rounding (the tolerance at
  // which output_times merges frames) counting as reached: the run lands on a frame time
  // there. The quotient is a first guess; the starts themselves decide (O(1) per call).
  const double reached = time + 1e-12 * std::max(1.0, cfg.horizon), period = cfg.regen_period;
  const std::size_t layers = layer_count(cfg);
  auto l = static_cast<std::size_t>(std::clamp(std::floor(reached / period), 0.0, double(layers - 1)));
  while (l + 1 < layers && double(l + 1) * period <= reached) ++l;
  while (l > 0 && double(l) * period > reached) --l;
  return l;
}

void record_attention_matrices(const RunConfig& cfg, TokenLabels& labels) {
  labels.layer_start = layer_start_times(cfg);
  labels.matrix_layers = labels.layer_start.size();
  std::vector<std::vector<AttentionMatrices>> layers;
  for (std::size_t l = 0; l < labels.matrix_layers; ++l) layers.push_back(layer_matrices(cfg, l));
  labels.matrix_sets = layers.front().size();
  const auto d = static_cast<std::size_t>(cfg.d);
  for (std::size_t set = 0; set < labels.matrix_sets; ++set)
    for (const auto& layer : layers) {
      const AttentionMatrices& m = layer[set];
      auto append = [d](std::vector<double>& to, const Matrix& matrix) {
        // Row-major d x d (Matrix is row-major).
        to.insert(to.end(), matrix.data(), matrix.data() + d * d);
      };
      append(labels.query_matrices, m.q);
      append(labels.key_matrices, m.k);
      append(labels.value_matrices, m.v);
    }
}

Model build_model(const RunConfig& cfg) {
  Model model;
  const std::size_t active = static_cast<std::size_t>(cfg.n);
  model.n = active + static_cast<std::size_t>(cfg.null_tokens);
  model.d = static_cast<std::size_t>(cfg.d);
  model.beta = cfg.beta;
  model.normalization = cfg.choices.kernel;
  model.time_scale = cfg.choices.time_scale;
  const auto seed = static_cast<std::uint64_t>(cfg.seed);
  model.matrices = layer_matrices(cfg, 0);
  const bool weighted = !cfg.amplitudes.empty() || cfg.null_tokens > 0;
  model.presence.assign(model.n, 1.0);
  if (!cfg.amplitudes.empty()) {
    const auto amplitudes = amplitudes_option(cfg);
    for (std::size_t i = 0; i < active; ++i)
      model.presence[i] = presence_from_amplitude(amplitudes[i], cfg.tau);
  }
  for (std::size_t i = active; i < model.n; ++i) model.presence[i] = 0.0;
  if (model.mass() <= 0.0)
    throw UsageError("--amplitudes " + cfg.amplitudes + ": every presence is 0 (no token moves)");
  model.eps_den = cfg.eps_den >= 0.0 ? cfg.eps_den : (weighted ? 1e-12 : 0.0);
  // Generators from a file fix k; so do 2-D geometries, grid positions and a positions file.
  std::vector<Matrix> file_generators;
  if (!cfg.generators.empty()) {
    try {
      file_generators = read_generators(cfg.generators, 0, model.d);
    } catch (const std::invalid_argument& e) {
      throw UsageError("--generators " + cfg.generators + ": " + e.what());
    }
  }
  std::size_t k = 1;
  const GeometryKind geometry = cfg.choices.geometry;
  const bool planar = is_planar(geometry);
  // No layout: the positions are read from the file --positions names.
  const std::optional<PositionLayout> layout = cfg.choices.positions;
  if (planar || layout == PositionLayout::Grid) k = 2;
  std::vector<double> position_rows;
  const bool positions_from_file = !layout;
  if (positions_from_file) {
    std::size_t rows = 0;
    // The column count is that of the first row: try k = 1, 2, ... (a wrong k fails at once,
    // on the first row).
    for (std::size_t columns = 1; columns <= kMaxPositionColumns && position_rows.empty(); ++columns) {
      try {
        position_rows = read_text_rows(cfg.positions, columns, rows);
        k = columns;
      } catch (const InputFileRefused& e) {
        throw UsageError("--positions " + cfg.positions + ": " + e.what());
      } catch (const std::invalid_argument&) {
      }
    }
    if (position_rows.empty())
      throw UsageError("--positions " + cfg.positions + ": needs n rows of 1 to " +
                       std::to_string(kMaxPositionColumns) + " numbers each");
    if (rows != model.n)
      throw UsageError("--positions " + cfg.positions + ": needs " + std::to_string(model.n) +
                       " rows (n + null tokens), found " + std::to_string(rows));
  }
  if (!file_generators.empty()) {
    if (positions_from_file && file_generators.size() != k)
      throw UsageError("--generators " + cfg.generators + ": " +
                       std::to_string(file_generators.size()) + " generators but positions have k = " +
                       std::to_string(k));
    k = file_generators.size();
  }
  if (planar && k != 2)
    throw UsageError("--geometry " + cfg.geometry + ": needs 2-D positions (k = 2), got k = " +
                     std::to_string(k));
  const AuxFactorChoice aux_factor = cfg.choices.aux_factor;
  if (aux_factor.needs_one_dimensional_positions && k != 1)
    throw UsageError("--aux-factor " + cfg.aux_factor + ": needs 1-D positions (k = 1), got k = " +
                     std::to_string(k));
  model.position_dim = k;
  model.positions.assign(model.n * k, 0.0);
  RandomStream position_stream(seed, static_cast<std::uint64_t>(StreamTag::Positions));
  const auto side = static_cast<std::size_t>(std::ceil(std::sqrt(double(active))));
  for (std::size_t i = 0; i < model.n; ++i) {
    double* xi = model.positions.data() + i * k;
    if (positions_from_file) {
      std::copy(position_rows.begin() + i * k, position_rows.begin() + (i + 1) * k, xi);
    } else if (k == 2 && (layout == PositionLayout::Index || layout == PositionLayout::Grid)) {
      // Grid positions: row-major on a side x side grid (the default for 2-D geometries).
      xi[0] = double(i % side) * cfg.pos_scale;
      xi[1] = double(i / side) * cfg.pos_scale;
    } else if (layout == PositionLayout::Uniform) {
      xi[0] = 2.0 * std::numbers::pi * double(i) / double(active);
      for (std::size_t a = 1; a < k; ++a) xi[a] = 0.0;
    } else if (layout == PositionLayout::Random) {
      for (std::size_t a = 0; a < k; ++a) xi[a] = position_stream.uniform() * double(active) * cfg.pos_scale;
    } else {
      xi[0] = double(i) * cfg.pos_scale;
      for (std::size_t a = 1; a < k; ++a) xi[a] = 0.0;
    }
  }
  for (double xi : model.positions)
    if (!std::isfinite(xi))
      throw UsageError("--pos-scale " + (std::ostringstream() << cfg.pos_scale).str() +
                       ": the token positions overflow double (a smaller scale is needed)");
  // Prompts: active token i belongs to prompt floor(i K / n) (contiguous blocks, as K prompts
  // with their texts one after the other); null tokens carry prompt 0.
  model.prompts = static_cast<std::size_t>(cfg.prompts);
  model.prompt_id.assign(model.n, 0);
  for (std::size_t i = 0; i < active; ++i)
    model.prompt_id[i] = static_cast<int>(i * model.prompts / active);
  // Prefix tokens precede their prompt's text: token t of m sits at position (t - m) times the
  // position step (pos-scale, or 2 pi / n for uniform positions) on the first axis.
  const auto per_prompt = static_cast<std::size_t>(cfg.prefix);
  const std::size_t prefix_count = per_prompt * model.prompts;
  if (prefix_count > 0) {
    PrefixSpec spec;
    spec.seed = seed;
    spec.prompts = model.prompts;
    spec.per_prompt = per_prompt;
    spec.d = model.d;
    spec.spread = cfg.prefix_spread;
    spec.normalize_file_rows = cfg.normalize_init;
    // No placement of the table: the prefix contents are read from the file it names.
    if (const std::optional<PrefixPlacement> placement = cfg.choices.prefix_init) {
      spec.placement = *placement;
    } else {
      spec.placement = PrefixPlacement::File;
      std::size_t rows = 0;
      try {
        spec.file_rows = read_text_rows(cfg.prefix_init, model.d, rows);
      } catch (const std::exception& e) {
        throw UsageError("--prefix-init " + cfg.prefix_init + ": " + e.what());
      }
      if (rows != prefix_count)
        throw UsageError("--prefix-init " + cfg.prefix_init + ": needs prompts * prefix = " +
                         std::to_string(prefix_count) + " rows of d numbers, found " +
                         std::to_string(rows));
    }
    try {
      model.prefix = place_prefix(spec);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    const double step = layout == PositionLayout::Uniform ? 2.0 * std::numbers::pi / double(active)
                                                          : cfg.pos_scale;
    model.prefix_positions.assign(prefix_count * k, 0.0);
    for (std::size_t p = 0; p < prefix_count; ++p) {
      model.prefix_prompt_id.push_back(static_cast<int>(p / per_prompt));
      model.prefix_positions[p * k] = (double(p % per_prompt) - double(per_prompt)) * step;
    }
    model.prefix_weight = cfg.prefix_weight;
  }
  if (geometry != GeometryKind::None) {
    GaugeSpec spec;
    spec.kind = geometry;
    spec.d = model.d;
    spec.position_dim = k;
    spec.base = cfg.rope_base;
    spec.seed = seed;
    spec.generators = file_generators;
    if (!cfg.rope_freqs.empty() && !parse_number_list(cfg.rope_freqs, spec.frequencies))
      throw UsageError("--rope-freqs " + cfg.rope_freqs + ": needs a list of finite numbers");
    try {
      // The gauge covers the moving tokens, then the prefix tokens (sources n .. n + P - 1).
      std::vector<double> all_positions = model.positions;
      all_positions.insert(all_positions.end(), model.prefix_positions.begin(),
                           model.prefix_positions.end());
      model.gauge = make_gauge(spec, all_positions, model.n + prefix_count);
    } catch (const std::invalid_argument& e) {
      throw UsageError("--geometry " + cfg.geometry + ": " + e.what());
    }
  }
  model.values = cfg.choices.values;
  // The option table's numbers as they are (kPairTermNumbers), then the choices and lists.
  model.pair_terms = cfg.pair_terms;
  model.pair_terms.factor = aux_factor.factor;
  // The rule validate() applies, so a RunConfig built in code meets it too.
  if (aux_factor.factor == AuxFactor::Toeplitz) model.pair_terms.toeplitz = toeplitz_series(cfg);
  model.pair_terms.mask = cfg.choices.mask.kind;
  model.pair_terms.per_prompt = cfg.choices.mask.per_prompt;
  model.pair_terms.window = cfg.window;
  model.noise_kappa = cfg.noise_kappa;
  return model;
}

TokenLabels token_labels(const Model& model) {
  TokenLabels labels;
  labels.aux_position = model.positions;
  labels.prompt_id.assign(model.prompt_id.begin(), model.prompt_id.end());
  labels.presence = model.presence;
  for (std::size_t i = 0; i < model.n; ++i) labels.id.push_back(static_cast<std::int64_t>(i));
  // Every gauge says what to record (Gauge::recorded_generators), so a new kind of gauge
  // cannot be left out of the file by a cast that does not know it.
  if (model.gauge) {
    const std::vector<Matrix> generators = model.gauge->recorded_generators();
    for (const Matrix& generator : generators) {
      if (static_cast<std::size_t>(generator.rows()) != model.d ||
          static_cast<std::size_t>(generator.cols()) != model.d)
        throw std::logic_error("Gauge::recorded_generators: a generator is " + std::to_string(generator.rows()) +
                               " x " + std::to_string(generator.cols()) + ", not d x d = " +
                               std::to_string(model.d) + " x " + std::to_string(model.d));
      labels.gauge_generators.insert(labels.gauge_generators.end(), generator.data(),
                                     generator.data() + generator.size());
    }
    labels.generator_count = generators.size();
  }
  labels.prefix_count = model.prefix_count();
  labels.prefix_position = model.prefix;
  labels.prefix_aux_position = model.prefix_positions;
  labels.prefix_prompt_id.assign(model.prefix_prompt_id.begin(), model.prefix_prompt_id.end());
  labels.prefix_presence.assign(labels.prefix_count, model.prefix_weight);
  for (std::size_t p = 0; p < labels.prefix_count; ++p)
    labels.prefix_id.push_back(static_cast<std::int64_t>(model.n + p));
  return labels;
}

State build_initial_state(const RunConfig& cfg, const Model& model) {
  State state(static_cast<std::size_t>(cfg.replicas), model.n, model.d);
  InitSpec spec;
  spec.seed = static_cast<std::uint64_t>(cfg.seed);
  spec.clusters = static_cast<std::size_t>(cfg.init_clusters);
  spec.spread = cfg.init_spread;
  spec.rho = cfg.init_rho;
  spec.normalize_file_rows = cfg.normalize_init;
  spec.kind = cfg.choices.init;
  if (spec.kind == InitKind::File) {
    std::size_t rows = 0;
    try {
      // A regular file before HDF5 opens it by name (it would wait on a FIFO).
      check_input_file(cfg.init_file);
      if (is_mfattn_file(cfg.init_file)) {
        const Frame frame = read_last_frame(cfg.init_file);
        if (frame.d != model.d)
          throw std::invalid_argument("has d = " + std::to_string(frame.d) + ", this run d = " +
                                      std::to_string(model.d));
        spec.file_rows = frame.x;
        rows = frame.n;
      } else {
        spec.file_rows = read_text_rows(cfg.init_file, model.d, rows);
      }
    } catch (const std::exception& e) {
      throw UsageError("--init-file " + cfg.init_file + ": " + e.what());
    }
    if (rows != model.n)
      throw UsageError("--init-file " + cfg.init_file + ": needs " + std::to_string(model.n) +
                       " rows (n + null tokens), found " + std::to_string(rows));
  }
  try {
    initialize_state(spec, state);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--init ") + cfg.init + ": " + e.what());
  }
  return state;
}

std::vector<double> output_times(const RunConfig& cfg) {
  const double horizon = cfg.horizon;
  std::vector<double> times{0.0};
  if (!cfg.save_times.empty()) {
    std::vector<double> listed;
    if (!parse_number_list(cfg.save_times, listed))
      throw UsageError("--save-times " + cfg.save_times + ": needs a list of finite numbers");
    for (double t : listed) {
      if (t < 0 || t > horizon)
        throw UsageError("--save-times " + cfg.save_times + ": times must lie in [0, horizon]");
      times.push_back(t);
    }
  } else if (cfg.save_log > 0) {
    const double first = std::min(cfg.dt, horizon);
    const double ratio = std::log(horizon / first);
    for (std::int64_t k = 0; k < cfg.save_log; ++k)
      times.push_back(first * std::exp(ratio * double(k) / double(cfg.save_log - 1)));
  } else {
    const double every = cfg.save_every > 0 ? cfg.save_every : horizon / 100.0;
    const auto frames = static_cast<std::int64_t>(std::floor(horizon / every * (1 + 1e-12)));
    for (std::int64_t k = 1; k <= frames; ++k) times.push_back(std::min(horizon, double(k) * every));
  }
  times.push_back(horizon);
  std::sort(times.begin(), times.end());
  // Times closer than a relative 1e-12 are the same frame.
  std::vector<double> unique;
  for (double t : times)
    if (unique.empty() || t - unique.back() > 1e-12 * std::max(1.0, horizon)) unique.push_back(t);
    else unique.back() = t;
  unique.front() = 0.0;
  unique.back() = horizon;  // within rounding of it, and the horizon is landed on exactly
  return unique;
}

int run_simulation(const RunConfig& given, std::ostream& log, const RunHooks& hooks) {
  RunConfig cfg = given;
  // From here on SIGTERM, SIGINT and SIGHUP end the run between two steps, with its file
  // flushed and its status saying so (exit 128 + signal).
  const StopSignals stop_signals({.keep_ignored = false, .restart_calls = true, .wake_pipe = false,
                                  .end_on_late_repeat = true});
  // Everything that can be refused is resolved before the output file exists.
  Model model;
  State state;
  std::vector<double> times;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Integrator> integrator;
  const int threads = resolve_threads(cfg.threads);
  try {
    start_thread_team(threads);
    if (cfg.resume) check_resumable(cfg);
    model = build_model(cfg);
    state = build_initial_state(cfg, model);
    times = output_times(cfg);
    backend = make_backend(cfg.backend, model, backend_options(cfg, threads));
    IntegratorSettings settings{cfg.integrator, cfg.rtol, cfg.atol, cfg.noise_kappa,
                                static_cast<std::uint64_t>(cfg.seed)};
    integrator = make_integrator(settings);
    if (!integrator->adaptive() && cfg.horizon / cfg.dt > kMaxFixedSteps) {
      std::ostringstream count;
      count << std::setprecision(3) << cfg.horizon / cfg.dt;
      throw UsageError("--dt " + format_number(cfg.dt) + ": the horizon " +
                       format_number(cfg.horizon) + " takes " + count.str() +
                       " steps; at most 1e+12 are accepted (take a larger --dt or a shorter --horizon)");
    }
  } catch (const UsageError& e) {
    log << "mfattn run: " << e.what() << '\n';
    return kExitUsage;
  } catch (const BackendUnavailable& e) {
    log << "mfattn run: " << e.what() << '\n';
    return kExitUsage;
  } catch (const DeviceFailure& e) {
    log << "mfattn run: device failure: " << e.what() << '\n';
    return kExitIo;
  } catch (const std::invalid_argument& e) {
    log << "mfattn run: " << e.what() << '\n';
    return kExitUsage;
  } catch (const IoError& e) {
    // A read that failed on a real mfattn file (--resume, --init-file): I/O.
    log << "mfattn run: " << e.what() << '\n';
    return kExitIo;
  }
  if (const int signal = StopSignals::received()) {
    log << "mfattn run: stopped by " << signal_name(signal) << " before the output file was created\n";
    return 128 + signal;
  }

  Dynamics dynamics(model, *backend, state.replicas);
  const ObservableSettings observable_settings{cfg.pair_delta, cfg.cluster_delta};
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::unique_ptr<H5mdWriter> writer;
  ResumePoint resumed;
  try {
    WriterSetup setup;
    setup.path = cfg.out;
    setup.overwrite = cfg.overwrite;
    // The output name appears only once the file holds frame 0 (see WriterSetup).
    setup.atomic_publish = !cfg.resume;
    setup.expected_frames = times.size();
    setup.n = model.n;
    setup.d = model.d;
    setup.replicas = state.replicas;
    setup.position_dim = model.position_dim;
    setup.creator_version = kVersion;
    setup.deflate = cfg.deflate;
    setup.fletcher32 = cfg.fletcher32;
    setup.velocity = cfg.save_velocity;
    setup.position_frames = cfg.choices.save_positions;
    if (const char* user = std::getenv("USER")) setup.author = user;
    setup.observables = observable_layout(model, observable_settings);
    if (cfg.resume) {
      writer = H5mdWriter::open_for_resume(setup, resumed);
      // The file says `running` before any new frame reaches it, so a resume killed from here
      // on never leaves `complete` beside frames that end before its horizon. /run's counts
      // stay those stored until the next flush.
      writer->write_run_info("running", resumed.wall_seconds, resumed.steps, resumed.rejected_steps);
      writer->flush();
      state.x = resumed.x;
      state.time = resumed.time;
      state.step = resumed.step;
      // Frames up to the resumed one are in the file already.
      std::erase_if(times, [&](double t) { return t <= resumed.time; });
    } else {
      writer = H5mdWriter::create(setup);
    }
    std::vector<Parameter> parameters = cfg.parameters;
    parameters.push_back({"command_line", cfg.command_line});
    parameters.push_back({"config_text", cfg.config_text});
    parameters.push_back({"seed_used", cfg.seed});
    parameters.push_back({"version", std::string(kVersion)});
    parameters.push_back({"source_revision", std::string(kSourceRevision)});
    parameters.push_back({"backend_used", backend->name()});
    if (cfg.choices.backend->uses_cpu_kernels) parameters.push_back({"cpu_kernels_used", cpu_kernels_name()});
    if (const std::string device = backend->device_name(); !device.empty()) {
      parameters.push_back({"device_used", device});
      // Whether the steps run in the device's resident kernel or one evaluation per stage.
      parameters.push_back({"device_stepping_used",
                            std::string(dynamics.resident_stepper(*integrator) ? "resident" : "per-evaluation")});
    }
    parameters.push_back({"threads_used", static_cast<std::int64_t>(threads)});
    parameters.push_back({"eps_den_used", model.eps_den});
    parameters.push_back({"gradient_flow", model.is_gradient_flow()});
    parameters.push_back({"active_tokens", cfg.n});
    parameters.push_back({"save_every_used", resolved_save_every(cfg)});
    if (cfg.resume) parameters.push_back({"resumed_from_time", resumed.time});
    writer->write_parameters(parameters);
    TokenLabels labels = token_labels(model);
    record_attention_matrices(cfg, labels);
    writer->write_labels(labels);
  } catch (const OutputExists& e) {
    log << "mfattn run: " << e.what() << '\n';
    return kExitUsage;
  } catch (const IoError& e) {
    log << "mfattn run: " << e.what() << '\n';
    return kExitIo;
  }

  // Layers (--regen-period): the run also lands on every layer start and draws that layer's
  // matrices there, before a frame at the same time is recorded. A resumed run starts in the
  // layer of its last frame.
  std::size_t layer = layer_at(cfg, state.time);
  if (layer != 0) {
    model.matrices = layer_matrices(cfg, layer);
    dynamics.matrices_changed();
  }
  std::vector<double> targets = times;
  for (double start : layer_start_times(cfg)) {
    const double tolerance = 1e-12 * std::max(1.0, cfg.horizon);
    // times is sorted: the frame nearest to start is at or just before its lower bound.
    const auto next = std::lower_bound(times.begin(), times.end(), start - tolerance);
    const bool near_frame = next != times.end() && *next <= start + tolerance;
    if (start > state.time + tolerance && !near_frame) targets.push_back(start);
  }
  std::sort(targets.begin(), targets.end());
  auto is_frame = [&](double time) { return std::binary_search(times.begin(), times.end(), time); };

  Progress progress(cfg.quiet, state.time, cfg.horizon, state.step, log);
  double h = cfg.resume && resumed.step_size > 0.0 ? resumed.step_size : cfg.dt;
  std::vector<double> frame_velocity;
  IntegrationStats so_far;  // this invocation's counts, as of the last step
  double last_frame_time = resumed.time;  // the last frame appended
  double flushed_time = resumed.time;     // the last frame in the file (flushed)
  std::size_t frame_index = resumed.frames;  // the frames before this one (0 at t = 0)
  auto rejected_total = [&] { return resumed.rejected_steps + so_far.rejected; };
  // Frames are staged in the writer and flushed together (--flush-interval): frame 0 at
  // once (it publishes the file), then whenever the interval has passed since the last
  // flush or the staged frames reach kMaxStagedBytes, and before each plain progress line;
  // the end of the run flushes the rest.
  // 8 MiB: the staging buffers are reused from one batch to the next (a run with many
  // frames does not fault in and copy ever larger ones), and a batch stays small beside the
  // memory of the model.
  constexpr std::size_t kMaxStagedBytes = std::size_t{8} << 20;
  double last_flush_seconds = 0.0;
  auto flush_due = [&](std::size_t frame) {
    return frame == 0 || elapsed() - last_flush_seconds >= cfg.flush_interval ||
           writer->staged_bytes() >= kMaxStagedBytes;
  };
  // /run's counts go with every flush, as of the last frame, so a killed run's counts match
  // its last flushed frame; the frames survive a SIGKILL from here on.
  std::int64_t frame_step = resumed.step, frame_rejected = resumed.rejected_steps;
  // The counts of every frame appended since the last flush, and those of the last frame
  // the file keeps: a flush that meets a full disk may keep some of its frames, and /run and
  // the last message then speak of the last kept one, not of the last appended.
  struct FrameCounts {
    double time;
    std::int64_t step, rejected;
    double wall_seconds;
  };
  std::vector<FrameCounts> unflushed;
  FrameCounts kept{resumed.time, resumed.step, resumed.rejected_steps, resumed.wall_seconds};
  std::size_t kept_frames = resumed.frames;
  auto note_kept_frames = [&] {
    const std::size_t now = std::min(writer->flushed_frames(), kept_frames + unflushed.size());
    if (now > kept_frames) {
      kept = unflushed[now - kept_frames - 1];
      unflushed.erase(unflushed.begin(), unflushed.begin() + static_cast<std::ptrdiff_t>(now - kept_frames));
      kept_frames = now;
    }
    flushed_time = kept.time;
  };
  auto flush_frames = [&] {
    writer->write_run_progress(resumed.wall_seconds + elapsed(), frame_step, frame_rejected);
    try {
      writer->flush();
    } catch (const IoError&) {
      note_kept_frames();
      throw;
    }
    last_flush_seconds = elapsed();
    note_kept_frames();
  };
  // Everything the run records, in the order it is recorded: one entry each, with its
  // schedule. The frame is one entry because positions and every observable of
  // observable_layout share /particles/tokens/position's step and time (hard links), so
  // they are appended together.
  const std::vector<RunObserver> observers = {
      {"frame: positions, observables, step size, velocity", ObserverSchedule::every_frame(),
       [&](const State& s) {
         const auto observables = compute_observables(dynamics, s, observable_settings,
                                                      cfg.save_velocity ? &frame_velocity : nullptr);
         // The horizon is the last output time, landed on exactly (output_times).
         const FrameRole role = s.time == times.back() ? FrameRole::Final : FrameRole::Intermediate;
         writer->append_frame(s.step, s.time, s.x.data(), observables, h,
                              cfg.save_velocity ? frame_velocity.data() : nullptr, role);
       }},
      // The final state's step counts every accepted step since t = 0, resumed parts included.
      {"/run complete", ObserverSchedule::at_end(),
       [&](const State& s) {
         writer->write_run_info("complete", resumed.wall_seconds + elapsed(), s.step, rejected_total());
       }},
  };
  // The caller's hook (RunHooks::progress): at every frame, and between frames at most every
  // kHookIntervalSeconds.
  double last_hook_seconds = -1.0;
  auto call_hook = [&](const State& s, bool always) {
    if (!hooks.progress) return;
    if (!always && last_hook_seconds >= 0.0 && elapsed() - last_hook_seconds < kHookIntervalSeconds) return;
    last_hook_seconds = elapsed();
    // At the last frame the run has nothing left to stop: it completes whatever the answer.
    if (!hooks.progress(s.time, s.step) && s.time != times.back()) throw Interrupted{0};
  };
  auto observer = [&](const State& s) {
    if (const std::size_t now = layer_at(cfg, s.time); now != layer) {
      layer = now;
      model.matrices = layer_matrices(cfg, layer);
      dynamics.matrices_changed();
    }
    if (!is_frame(s.time)) return;
    for (const RunObserver& entry : observers)
      if (entry.when.at_frame(frame_index)) entry.record(s);
    last_frame_time = s.time;
    frame_step = s.step;
    frame_rejected = rejected_total();
    unflushed.push_back({s.time, s.step, frame_rejected, resumed.wall_seconds + elapsed()});
    if (flush_due(frame_index) || progress.line_due(s.time)) flush_frames();
    ++frame_index;
    progress.update(s.time, s.step);
    call_hook(s, true);
  };
  auto after_step = [&](const State& s, const IntegrationStats& counts) {
    so_far = counts;
    if (const int signal = StopSignals::received()) throw Interrupted{signal};
    if (last_frame_time > flushed_time && progress.line_due(s.time)) flush_frames();
    progress.update(s.time, s.step);
    call_hook(s, false);
  };
  const std::string continue_advice =
      hooks.unfinished_advice.empty() ? std::string("continue it with --resume") : hooks.unfinished_advice;
  const std::string advice_after_fault =
      hooks.unfinished_advice.empty() ? continue_advice + " once the fault is fixed" : hooks.unfinished_advice;
  // Records why the run ended in /run, if the file still takes it (a full disk may not),
  // with the counts of the last frame the file keeps (docs/failure-model.md): the staged
  // frames are flushed first unless writing failed already (the writer then takes its
  // partial rows back).
  auto record_status = [&](const std::string& status, bool flush_staged_first = true) {
    try {
      if (flush_staged_first) {
        writer->flush();
        note_kept_frames();
      }
      writer->write_run_info(status, kept.wall_seconds, kept.step, kept.rejected);
      writer->flush();
      return true;
    } catch (const IoError&) {
      note_kept_frames();
      return false;
    }
  };
  try {
    integrate(*integrator, dynamics, state, h, cfg.dt, targets, observer, after_step);
    for (const RunObserver& entry : observers)
      if (entry.when.at_end_of_run()) entry.record(state);
    writer->flush();
    progress.finish();
  } catch (const Interrupted& stop) {
    progress.finish();
    const std::string name = interruption_name(stop.signal);
    // The status goes with the staged frames' flush.
    record_status("interrupted: " + name);
    log << "mfattn run: interrupted by " << name << " at t = " << state.time << " (step "
        << state.step << "); " << writer->current_path() << " keeps every frame up to t = "
        << flushed_time << " (" << continue_advice << ")\n";
    return stop.signal ? 128 + stop.signal : kExitStoppedByCaller;
  } catch (const NumericalError& e) {
    progress.finish();
    log << "mfattn run: numerical failure: " << e.what() << '\n';
    record_status(std::string("failed: ") + e.what());
    return kExitNumerical;
  } catch (const DeviceFailure& e) {
    progress.finish();
    const bool recorded = record_status(std::string("failed: device: ") + e.what());
    log << "mfattn run: device failure: " << e.what() << '\n';
    log << "mfattn run: " << writer->current_path() << " keeps every frame up to t = " << flushed_time
        << (recorded ? " and records the failure" : "") << " (" << continue_advice << ")\n";
    return kExitIo;
  } catch (const OutputExists& e) {
    progress.finish();
    log << "mfattn run: " << e.what() << '\n';
    return kExitUsage;
  } catch (const IoError& e) {
    progress.finish();
    const std::string where = writer->current_path();
    const bool recorded = record_status(std::string("failed: I/O: ") + e.what(), /*flush_staged_first=*/false);
    log << "mfattn run: " << e.what() << '\n';
    if (where == cfg.out)
      log << "mfattn run: " << cfg.out << " keeps every frame up to t = " << flushed_time
          << (recorded ? " and records the failure" : "") << " (" << advice_after_fault << ")\n";
    return kExitIo;
  }
  return kExitOk;
}

}  // namespace mfattn
