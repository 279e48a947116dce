#include "mfattn/app/run.hpp"
#include "mfattn/app/command_errors.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <exception>
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

#include "mfattn/core/evaluation_watch.hpp"
#include "mfattn/core/gauge.hpp"
#include "mfattn/io/h5md.hpp"
#include "mfattn/core/init.hpp"
#include "mfattn/core/input_file.hpp"
#include "mfattn/integrators/integrator.hpp"
#include "mfattn/core/number_text.hpp"
#include "mfattn/observers/observables.hpp"
#include "mfattn/core/rng.hpp"
#include "mfattn/app/run_choices.hpp"
#include "mfattn/app/stop_signals.hpp"
#include "app/kept_frames.hpp"
#include "app/progress.hpp"
#include "mfattn/core/version.hpp"
#include "mfattn/app/run_resources.hpp"

namespace mfattn {
namespace {

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
  bool inside_pass =
      false;  ///< within a pass over the pairs (evaluation_watch.hpp), not between steps
};

/// Seconds between two reports of one long pass over the pairs (the first comes 2 s in).
constexpr double kPassReportSeconds = 60.0;

/// The run's first report of a long pass: what one pass costs on this machine.
std::string pass_estimate_text(const EvaluationReport& report) {
  const double rate = report.fraction * report.pairs / report.seconds;
  std::ostringstream text;
  text
      << std::setprecision(3) << "a pass over the " << report.pairs << " pairs takes about "
      << format_seconds(report.pairs / rate) << " here (" << 100.0 * report.fraction << "% in "
      << report.seconds << " s: " << rate
      << " pairs/s); a step takes one per stage of the integrator, a frame "
      << "one more and its pair statistics. A stop signal (Ctrl-C) ends the run within a second, keeping "
      << "every frame written; sizes and faster routes: docs/performance.md, \"Large n\"";
  return text.str();
}

/// A later report of a long pass: how far it has got, in the step from the state's time.
std::string pass_progress_text(const EvaluationReport& report, const State& state) {
  std::ostringstream text;
  text << std::setprecision(3) << "pass over the pairs from t = " << state.time << " (step "
       << state.step << "): " << 100.0 * report.fraction << "% done in "
       << format_seconds(report.seconds);
  if (report.fraction > 0.0)
    text << ", about " << format_seconds(report.seconds * (1.0 - report.fraction) / report.fraction)
         << " left";
  return text.str();
}

/// After the first step of a run whose passes are long: its cost and, for fixed steps of dt
/// (0: adaptive), the run's at that rate. The steps left land on every later target (frames
/// and layer starts), each interval taking whole steps of at most dt.
std::string first_step_text(double seconds, const State& state, double dt,
                            const std::vector<double>& targets) {
  std::ostringstream text;
  text << "the first step took " << format_seconds(seconds)
       << " (with its frame, if it lands on one)";
  if (dt > 0.0) {
    double steps_left = 0.0, from = state.time;
    for (double target : targets)
      if (target > from) {
        steps_left += std::max(1.0, std::ceil((target - from) / dt - 1e-9));
        from = target;
      }
    if (steps_left > 0.0)
      text << std::setprecision(3) << "; the " << steps_left << " steps left take about "
           << format_seconds(steps_left * seconds) << " at this rate";
  }
  return text.str();
}

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

FileSummary resumable_file(const RunConfig& cfg) {
  if (cfg.overwrite) throw UsageError("--resume: cannot be combined with --overwrite");
  try {
    // describe_file checks the layout as every reader does: a file that is not a readable
    // mfattn file is refused here, before anything is opened for writing.
    return describe_file(cfg.out);
  } catch (const NotMfattnFile& e) {
    throw UsageError(std::string("--resume: ") + e.what());
  }
}

void refuse_another_trajectory(const RunConfig& cfg, const FileSummary& stored) {
  // Extent options may change on a resume (the horizon may grow: below), Execution ones too.
  if (const std::string difference = option_difference(cfg, stored, {OptionRole::Trajectory}); !difference.empty())
    throw UsageError("--resume " + cfg.out + ": " + difference);
  for (const auto& [key, value] : stored.parameters)
    if (key == "horizon" && cfg.horizon < std::stod(value))
      throw UsageError("--resume: --horizon " + parameter_text(cfg.horizon) + " is shorter than the file's " + value);
}

namespace {

/// --resume: the file must exist and have been made with the same options, except those
/// that do not change the trajectory (the horizon may grow). A run that left --save-every at
/// its default keeps the file's frame spacing.
void check_resumable(RunConfig& cfg) {
  const FileSummary stored = resumable_file(cfg);
  auto stored_value = [&](const std::string& name) -> const std::string* {
    for (const auto& [key, value] : stored.parameters)
      if (key == name) return &value;
    return nullptr;
  };
  if (cfg.save_every == 0.0 && cfg.save_times.empty() && cfg.save_log == 0)
    if (const auto* spacing = stored_value("save_every_used")) cfg.save_every = std::stod(*spacing);
  refuse_another_trajectory(cfg, stored);
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

IntegratorSettings integrator_settings(const RunConfig& cfg) {
  return IntegratorSettings{.name = cfg.integrator,
                            .rtol = cfg.rtol,
                            .atol = cfg.atol,
                            .noise_kappa = cfg.noise_kappa,
                            .seed = static_cast<std::uint64_t>(cfg.seed),
                            .common_noise = cfg.common_noise,
                            .common_noise_kind = cfg.choices.common_noise_kind};
}

std::vector<double> output_times(const RunConfig& cfg) {
  const double horizon = cfg.horizon;
  std::vector<double> times{0.0};
  if (!cfg.choices.save_times.empty()) {
    // Parsed and checked against the horizon by validate(); a longer resumed horizon keeps them.
    times.insert(times.end(), cfg.choices.save_times.begin(), cfg.choices.save_times.end());
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
  // Times closer than the time resolution are the same frame.
  std::vector<double> unique;
  for (double t : times)
    if (unique.empty() || t - unique.back() > time_resolution(horizon)) unique.push_back(t);
    else unique.back() = t;
  unique.front() = 0.0;
  unique.back() = horizon;  // within rounding of it, and the horizon is landed on exactly
  return unique;
}

namespace {

/// What a run is made of, resolved before its output file exists: everything that can be
/// refused is refused here.
struct RunParts {
  Model model;
  State state;
  std::vector<double> times;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Integrator> integrator;
};

/// The set-up of a run into `parts` (filled in place: the backend keeps a reference to the
/// model): the thread team, the --resume checks, the model, the initial state, the frame
/// times, the backend and the integrator. Throws what it refuses (command_errors.hpp).
void set_up_run(RunConfig& cfg, int threads, RunParts& parts) {
  start_thread_team(threads);
  if (cfg.resume) check_resumable(cfg);
  parts.model = build_model(cfg);
  parts.state = build_initial_state(cfg, parts.model);
  parts.times = output_times(cfg);
  parts.backend = make_backend(cfg.backend, parts.model, backend_options(cfg, threads));
  parts.integrator = cfg.choices.integrator->make(
      integrator_settings(cfg));  // the entry validation found
  if (!parts.integrator->adaptive() && cfg.horizon / cfg.dt > kMaxFixedSteps) {
    std::ostringstream count;
    count << std::setprecision(3) << cfg.horizon / cfg.dt;
    throw UsageError("--dt " + format_number(cfg.dt) + ": the horizon " +
                     format_number(cfg.horizon) + " takes " + count.str() +
                     " steps; at most 1e+12 are accepted (take a larger --dt or a shorter --horizon)");
  }
}

/// The run's output: created (published once it holds frame 0), or reopened at its last frame
/// for --resume (then `resumed` holds where the run goes on, and `times` loses the frames the
/// file has); its /parameters and token labels written. Throws what it refuses or fails.
std::unique_ptr<H5mdWriter> open_run_output(const RunConfig& cfg, RunParts& parts, Dynamics& dynamics, int threads,
                                            const ObservableSettings& observable_settings, ResumePoint& resumed) {
  const Model& model = parts.model;
  State& state = parts.state;
  std::vector<double>& times = parts.times;
  const Backend* backend = parts.backend.get();
  const Integrator* integrator = parts.integrator.get();
  std::unique_ptr<H5mdWriter> writer;
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
  return writer;
}

/// The fault report of a run that ends before its horizon (docs/failure-model.md): why it
/// ended goes to /run, if the file still takes it, with the counts of the last frame the file
/// keeps (the staged frames are flushed first unless writing failed already: the writer then
/// takes its partial rows back); the log says what the file keeps and how to continue.
/// Returns the exit code; a fault of another kind than these passes on.
int report_early_end(std::exception_ptr fault, const RunConfig& cfg, const RunHooks& hooks, H5mdWriter& writer,
                     KeptFrames& file_frames, const State& state, std::ostream& log) {
  const std::string continue_advice =
      hooks.unfinished_advice.empty() ? std::string("continue it with --resume") : hooks.unfinished_advice;
  const std::string advice_after_fault =
      hooks.unfinished_advice.empty() ? continue_advice + " once the fault is fixed" : hooks.unfinished_advice;
  auto record_status = [&](const std::string& status, bool flush_staged_first = true) {
    try {
      if (flush_staged_first) {
        writer.flush();
        file_frames.note_flushed();
      }
      const FrameCounts& kept = file_frames.kept();
      writer.write_run_info(status, kept.wall_seconds, kept.step, kept.rejected);
      writer.flush();
      return true;
    } catch (const IoError&) {
      file_frames.note_flushed();
      return false;
    }
  };
  try {
    std::rethrow_exception(fault);
  } catch (const EvaluationStopped&) {
    // A stop signal inside a long evaluation: the step in progress is dropped like any step
    // a signal ends.
    fault = std::make_exception_ptr(Interrupted{StopSignals::received(), true});
  } catch (...) {
  }
  try {
    std::rethrow_exception(fault);
  } catch (const Interrupted& stop) {
    const std::string name = interruption_name(stop.signal);
    // The status goes with the staged frames' flush.
    record_status("interrupted: " + name);
    if (writer.flushed_frames() == 0)
      // Stopped inside frame 0's evaluation (large n): the file was never published.
      log << "mfattn run: interrupted by " << name
          << " before frame 0 was complete; nothing was written\n";
    else
      log << "mfattn run: interrupted by " << name
          << (stop.inside_pass
                  ? " inside a pass over the pairs (what it was computing, the next step or this "
                    "time's frame, is dropped)"
                  : "")
          << " at t = " << state.time << " (step " << state.step << "); " << writer.current_path()
          << " keeps every frame up to t = " << file_frames.kept().time << " (" << continue_advice
          << ")\n";
    return stop.signal ? 128 + stop.signal : kExitStoppedByCaller;
  } catch (const NumericalError& e) {
    log << "mfattn run: numerical failure: " << e.what() << '\n';
    record_status(std::string("failed: ") + e.what());
    return kExitNumerical;
  } catch (const DeviceFailure& e) {
    const bool recorded = record_status(std::string("failed: device: ") + e.what());
    log << "mfattn run: device failure: " << e.what() << '\n';
    log << "mfattn run: " << writer.current_path() << " keeps every frame up to t = " << file_frames.kept().time
        << (recorded ? " and records the failure" : "") << " (" << continue_advice << ")\n";
    return kExitIo;
  } catch (const OutputExists&) {
    return report_current_exception("run", log);
  } catch (const IoError& e) {
    const std::string where = writer.current_path();
    const bool recorded = record_status(std::string("failed: I/O: ") + e.what(), /*flush_staged_first=*/false);
    log << "mfattn run: " << e.what() << '\n';
    if (where == cfg.out)
      log << "mfattn run: " << cfg.out << " keeps every frame up to t = " << file_frames.kept().time
          << (recorded ? " and records the failure" : "") << " (" << advice_after_fault << ")\n";
    return kExitIo;
  }
}

/// The times a run from `time` lands on: its frames' `times` and every later layer start
/// (one within the time resolution of a frame is that frame), increasing.
std::vector<double> landing_times(const RunConfig& cfg, const std::vector<double>& times,
                                  double time) {
  std::vector<double> targets = times;
  for (double start : layer_start_times(cfg)) {
    const double tolerance = time_resolution(cfg.horizon);
    // times is sorted: the frame nearest to start is at or just before its lower bound.
    const auto next = std::lower_bound(times.begin(), times.end(), start - tolerance);
    const bool near_frame = next != times.end() && *next <= start + tolerance;
    if (start > time + tolerance && !near_frame) targets.push_back(start);
  }
  std::sort(targets.begin(), targets.end());
  return targets;
}

/// Layer l's matrices from the run's options into the model, and the field told.
void install_layer(const RunConfig& cfg, std::size_t layer, Model& model, Dynamics& dynamics) {
  model.matrices = layer_matrices(cfg, layer);
  dynamics.matrices_changed();
}

}  // namespace

RunGradient gradient_of_run(const RunConfig& given,
                            const std::function<FinalLoss(const Dynamics&)>& loss_of,
                            std::size_t checkpoints, const std::vector<double>& loss_times) {
  RunConfig cfg = given;
  const IntegratorEntry& entry = *cfg.choices.integrator;
  if (!entry.differentiates) {
    std::string accepted;
    for (const std::string& name : integrator_names())
      if (find_integrator(name)->differentiates) accepted += (accepted.empty() ? "" : ", ") + name;
    throw UsageError("--integrator " + std::string(entry.name) + ": gradients through runs take " +
                     accepted + " (its steps have no adjoint yet)");
  }
  if (cfg.resume) throw UsageError("--resume: a gradient is taken over a whole run from its start");
  RunParts parts;
  set_up_run(cfg, resolve_threads(cfg.threads), parts);
  Dynamics dynamics(parts.model, *parts.backend, parts.state.replicas);
  FinalLoss loss;
  try {
    loss = loss_of(dynamics);
  } catch (const std::invalid_argument& error) {
    throw UsageError(error.what());
  }
  RunLayers layers;
  layers.count = layer_start_times(cfg).size();
  layers.at = [&](double time) { return layer_at(cfg, time); };
  layers.install = [&](std::size_t layer) { install_layer(cfg, layer, parts.model, dynamics); };
  const std::vector<double> targets = landing_times(cfg, parts.times, parts.state.time);
  // The loss times, each a frame's time (one within the time resolution is that frame).
  std::vector<double> at;
  for (double time : loss_times) {
    const double tolerance = time_resolution(cfg.horizon);
    const auto near = std::find_if(parts.times.begin(), parts.times.end(),
                                   [&](double t) { return std::fabs(t - time) <= tolerance; });
    if (near == parts.times.end())
      throw UsageError(
          "--loss-times: " + format_number(time) +
          " is none of the run's frame times (--save-every, --save-times, --save-log)");
    at.push_back(*near);
  }
  std::sort(at.begin(), at.end());
  at.erase(std::unique(at.begin(), at.end()), at.end());
  return run_gradient(*parts.integrator, dynamics, parts.state, cfg.dt, targets, loss, checkpoints,
                      layers, at);
}

int run_simulation(const RunConfig& given, std::ostream& log, const RunHooks& hooks) {
  RunConfig cfg = given;
  // From here on SIGTERM, SIGINT and SIGHUP end the run between two steps, with its file
  // flushed and its status saying so (exit 128 + signal).
  const StopSignals stop_signals({.keep_ignored = false, .restart_calls = true, .wake_pipe = false,
                                  .end_on_late_repeat = true});
  const int threads = resolve_threads(cfg.threads);
  // Everything that can be refused is resolved before the output file exists.
  RunParts parts;
  const int set_up = guarded("run", [&] {
    set_up_run(cfg, threads, parts);
    return int(kExitOk);
  }, log);
  if (set_up != kExitOk) return set_up;
  Model& model = parts.model;
  State& state = parts.state;
  std::vector<double>& times = parts.times;
  const std::unique_ptr<Backend>& backend = parts.backend;
  const std::unique_ptr<Integrator>& integrator = parts.integrator;
  if (const int signal = StopSignals::received()) {
    log << "mfattn run: stopped by " << signal_name(signal) << " before the output file was created\n";
    return 128 + signal;
  }

  Dynamics dynamics(model, *backend, state.replicas);
  const ObservableSettings observable_settings{cfg.pair_delta, cfg.cluster_delta,
                                               cfg.choices.attention_observables};
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::unique_ptr<H5mdWriter> writer;
  ResumePoint resumed;
  const int opened = guarded("run", [&] {
    writer = open_run_output(cfg, parts, dynamics, threads, observable_settings, resumed);
    return int(kExitOk);
  }, log);
  if (opened != kExitOk) return opened;

  // Layers (--regen-period): the run also lands on every layer start and draws that layer's
  // matrices there, before a frame at the same time is recorded. A resumed run starts in the
  // layer of its last frame.
  std::size_t layer = layer_at(cfg, state.time);
  if (layer != 0) install_layer(cfg, layer, model, dynamics);
  const std::vector<double> targets = landing_times(cfg, times, state.time);
  auto is_frame = [&](double time) { return std::binary_search(times.begin(), times.end(), time); };

  Progress progress("mfattn run", cfg.quiet, state.time, cfg.horizon, state.step, log);
  double h = cfg.resume && resumed.step_size > 0.0 ? resumed.step_size : cfg.dt;
  // Large n: a pass over the pairs takes seconds to minutes. Early in the first one the run
  // says what a pass costs here, then how far a long one has got, and a stop signal takes
  // effect between the loops' units instead of after the step (evaluation_watch.hpp).
  bool pass_estimated = false, first_step_reported = false;
  const std::int64_t first_step = state.step;
  double first_step_start = -1.0;  // when the run's first step began (after frame 0)
  EvaluationWatch::Settings watch_settings;
  watch_settings.stop = &StopSignals::received_flag();
  watch_settings.report_every = kPassReportSeconds;
  watch_settings.report = [&](const EvaluationReport& report) {
    if (!pass_estimated) {
      pass_estimated = true;
      progress.interject(pass_estimate_text(report));
    } else if (report.seconds >= kPassReportSeconds) {
      progress.interject(pass_progress_text(report, state));
    }
  };
  const EvaluationWatch evaluation_watch(std::move(watch_settings));
  std::vector<double> frame_velocity;
  IntegrationStats so_far;  // this invocation's counts, as of the last step
  double last_frame_time = resumed.time;  // the last frame appended
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
  // The last frame the file keeps, for /run and the last line (kept_frames.hpp).
  KeptFrames file_frames(*writer, {resumed.time, resumed.step, resumed.rejected_steps, resumed.wall_seconds},
                         resumed.frames);
  auto flush_frames = [&] {
    writer->write_run_progress(resumed.wall_seconds + elapsed(), frame_step, frame_rejected);
    try {
      writer->flush();
    } catch (const IoError&) {
      file_frames.note_flushed();
      throw;
    }
    last_flush_seconds = elapsed();
    file_frames.note_flushed();
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
      install_layer(cfg, layer, model, dynamics);
    }
    if (!is_frame(s.time)) return;
    for (const RunObserver& entry : observers)
      if (entry.when.at_frame(frame_index)) entry.record(s);
    last_frame_time = s.time;
    frame_step = s.step;
    frame_rejected = rejected_total();
    file_frames.appended({s.time, s.step, frame_rejected, resumed.wall_seconds + elapsed()});
    if (flush_due(frame_index) || progress.line_due(s.time)) flush_frames();
    ++frame_index;
    progress.update(s.time, s.step);
    call_hook(s, true);
  };
  auto after_step = [&](const State& s, const IntegrationStats& counts) {
    so_far = counts;
    if (const int signal = StopSignals::received()) throw Interrupted{signal};
    if (s.step == first_step && first_step_start < 0.0) first_step_start = elapsed();
    if (pass_estimated && !first_step_reported && s.step > first_step && first_step_start >= 0.0) {
      // What the first step cost says what the run will: fixed steps at least.
      first_step_reported = true;
      progress.interject(first_step_text(elapsed() - first_step_start, s,
                                         integrator->adaptive() ? 0.0 : cfg.dt, targets));
    }
    if (last_frame_time > file_frames.kept().time && progress.line_due(s.time)) flush_frames();
    progress.update(s.time, s.step);
    call_hook(s, false);
  };
  try {
    integrate(*integrator, dynamics, state, h, cfg.dt, targets, observer, after_step);
    for (const RunObserver& entry : observers)
      if (entry.when.at_end_of_run()) entry.record(state);
    writer->flush();
    progress.finish();
  } catch (...) {
    progress.finish();
    return report_early_end(std::current_exception(), cfg, hooks, *writer, file_frames, state, log);
  }
  return kExitOk;
}

}  // namespace mfattn
