#pragma once
/// \file run.hpp
/// `mfattn run`: resolved options -> Model and initial State (model_builder.hpp), backend,
/// integrator, H5MD output.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <string>
#include <vector>

#include "mfattn/app/config.hpp"
#include "mfattn/io/h5md.hpp"
#include "mfattn/core/model.hpp"
#include "mfattn/app/model_builder.hpp"
#include "mfattn/core/state.hpp"
#include "mfattn/integrators/adjoint.hpp"
#include "mfattn/integrators/integrator.hpp"

namespace mfattn {

/// Exit codes of docs/cli.md.
enum ExitCode : int { kExitOk = 0, kExitUsage = 2, kExitNumerical = 3, kExitIo = 4 };

/// Frame times: 0, then every --save-every (default horizon/100), --save-times or
/// --save-log N log-spaced times in [dt, horizon]; the horizon is always the last frame.
std::vector<double> output_times(const RunConfig& cfg);

/// The integrator's settings from the options (--integrator, --rtol, --atol, the noise, --seed).
IntegratorSettings integrator_settings(const RunConfig& cfg);

/// When a run observer records: at every frame (counted from the one at t = 0, across
/// --resume), or once after the last frame of a run that completes.
struct ObserverSchedule {
  enum class Kind { EveryFrame, AtEnd };
  Kind kind = Kind::EveryFrame;

  static ObserverSchedule every_frame() { return {Kind::EveryFrame}; }
  static ObserverSchedule at_end() { return {Kind::AtEnd}; }
  /// Whether it records at frame `frame` (0: the frame at t = 0).
  bool at_frame(std::size_t) const { return kind == Kind::EveryFrame; }
  bool at_end_of_run() const { return kind == Kind::AtEnd; }
};

/// The first option of `roles` whose value in `cfg` differs from the one `stored` (a file's
/// /parameters) records, as "--NAME is NOW but the file was made with THEN"; "" when none
/// does. Values compare as the shortest text that reads back as the same double; an option
/// the file lacks (made before it existed) matches its default. --resume compares the
/// Trajectory options, a sweep's complete case file the Trajectory and Extent ones.
std::string option_difference(const RunConfig& cfg, const FileSummary& stored, std::initializer_list<OptionRole> roles);

/// --resume's file (describe_file): UsageError with --overwrite, or when it is missing or not an
/// mfattn file.
FileSummary resumable_file(const RunConfig& cfg);
/// --resume's rule: the file was made with the same Trajectory options (cfg.parameters against
/// its /parameters) and a horizon no longer than cfg's. Throws UsageError naming the option.
void refuse_another_trajectory(const RunConfig& cfg, const FileSummary& stored);

/// "SIGTERM", "SIGINT", ... for the signals runs and sweeps report ("signal N" otherwise).
std::string signal_name(int signal);

/// What a caller in the same process (the Python module) hears of a run as it goes.
struct RunHooks {
  /// Called with (time, step) after every frame, and between frames at most every
  /// kHookIntervalSeconds of wall time (after a step or a resident chunk). Returning false stops the run between two steps as a signal does: the file keeps
  /// its frames, /run/status says "interrupted: stopped by the caller", and run_simulation
  /// returns kExitStoppedByCaller. Called from the thread that runs the simulation.
  std::function<bool(double time, std::int64_t step)> progress;
  /// What the messages of a run that did not complete advise, in parentheses after "keeps
  /// every frame up to t = T" (empty: "continue it with --resume"). A command that cannot
  /// be resumed (realize) names what can be done instead.
  std::string unfinished_advice;
};
inline constexpr double kHookIntervalSeconds = 0.1;
/// run_simulation's status when RunHooks::progress stopped it (as SIGINT would: 128 + 2).
inline constexpr int kExitStoppedByCaller = 130;

/// Runs the whole simulation and writes the output file; returns an ExitCode.
/// Messages go to `log` (stderr in the CLI). SIGTERM, SIGINT and SIGHUP end it between two
/// steps while it runs (the previous handlers are restored when the last concurrent run
/// ends, so a Python interpreter keeps its own).
int run_simulation(const RunConfig& cfg, std::ostream& log, const RunHooks& hooks = {});

/// The gradient of a loss of x(T) (loss_of makes it for the run's field: linear_loss of a
/// cotangent, or final_loss), or of its sum over the frame times `loss_times`, of the run
/// `cfg` describes (docs/model.md section 5b): the run set up as run_simulation sets it up
/// (its refusals), stepped with its frames' times and layer starts landed on, each layer's
/// matrices in force on its interval, and its discrete adjoint from `checkpoints` stored
/// states (0: the default). No file is written. Throws UsageError for what it does not
/// differentiate (an integrator whose steps have no adjoint, --resume) and a loss time that is
/// no frame's, NumericalError for a diverging run, BackendUnavailable where the backend has no
/// derivatives for the model.
RunGradient gradient_of_run(const RunConfig& cfg,
                            const std::function<FinalLoss(const Dynamics&)>& loss_of,
                            std::size_t checkpoints, const std::vector<double>& loss_times = {});

}  // namespace mfattn
