#pragma once
/// \file stop_signals.hpp
/// The signals that ask mfattn to stop early, and the one handler that records them.
///
/// SIGTERM (a scheduler's notice, `kill`), SIGINT (Ctrl-C) and SIGHUP (a closed terminal or
/// ssh session) all mean "stop, keeping what is done": `mfattn run` (and the Python module's
/// run) ends between two steps with its file flushed and `/run/status` saying which signal;
/// `mfattn sweep` forwards the signal to its running cases, starts no other, writes its
/// manifest and says what is left undone. Both exit 128 + signal (docs/failure-model.md,
/// docs/sweeps.md). SIGQUIT and the rest keep their default actions.
///
/// The handler is async-signal-safe: it touches lock-free atomics only and calls
/// clock_gettime, write, signal and raise, and it keeps errno. It may run on any thread
/// (OpenMP workers included). What it does beyond recording the first signal is chosen by
/// the Options of whoever installs it, because a run and a sweep need different things:
///
/// | option             | run  | sweep | why                                                   |
/// |--------------------|------|-------|-------------------------------------------------------|
/// | keep_ignored       | no   | yes   | a sweep under nohup (or a script's background job,    |
/// |                    |      |       | whose SIGINT is ignored) keeps ignoring what its user |
/// |                    |      |       | chose to ignore; a run takes all three whatever it    |
/// |                    |      |       | inherited, as it always has (a sweep's case inherits  |
/// |                    |      |       | the sweep's ignored signals through exec)             |
/// | restart_calls      | yes  | no    | a run's reads and HDF5 writes must not fail with      |
/// |                    |      |       | EINTR; any blocking wait of a sweep returns at once   |
/// |                    |      |       | to look at the signal (poll() and sleeps do so with   |
/// |                    |      |       | either setting)                                       |
/// | wake_pipe          | no   | yes   | a sweep sleeps in poll() on its cases and wakes on    |
/// |                    |      |       | the pipe; a run looks at received() after each step   |
/// | end_on_late_repeat | yes  | no    | see below                                             |
///
/// A second signal: with end_on_late_repeat, one that comes a second or more after the first
/// ends the process at once with the signal's default action (an impatient Ctrl-C), and one
/// within the second is the same request delivered twice and is ignored (a scheduler that
/// signals every process of a job reaches a sweep's case directly and through the sweep, and
/// the case must still flush). Without it a repeat is only counted (count()): the sweep
/// answers it by sending SIGKILL to its cases, and itself still writes the manifest.
#include <array>
#include <atomic>
#include <csignal>

namespace mfattn {

/// SIGTERM, SIGINT and SIGHUP, in the order their handlers are installed.
inline constexpr std::array<int, 3> kStopSignals{SIGTERM, SIGINT, SIGHUP};

/// Installs the stop handler for kStopSignals for as long as it lives, and restores the
/// handlers it found when it goes. Lifetimes may overlap in one process (two runs in the
/// Python module's threads): the first installs the handler and clears what an earlier stop
/// recorded, the last restores; overlapping users must ask for the same Options
/// (std::logic_error otherwise).
class StopSignals {
 public:
  struct Options {
    bool keep_ignored = false;        ///< leave a signal that is ignored (SIG_IGN) ignored
    bool restart_calls = true;        ///< SA_RESTART: interrupted system calls resume
    bool wake_pipe = false;           ///< the handler writes a byte to wake_fd()'s pipe
    bool end_on_late_repeat = true;   ///< a repeat >= 1 s after the first ends the process
    bool operator==(const Options&) const = default;
  };

  explicit StopSignals(Options options);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  /// The first stop signal received since the handler was installed; 0 while none has come.
  static int received() noexcept;
  /// The flag received() reads, for code that must look at it without calling in here (the
  /// pair loops, through EvaluationWatch: core/evaluation_watch.hpp).
  static const std::atomic<int>& received_flag() noexcept;
  /// How many stop signals have come since the handler was installed.
  static int count() noexcept;
  /// The read end of the wake pipe (readable after a signal), or -1 (no pipe was asked for,
  /// or it could not be made: then poll with a short timeout instead).
  static int wake_fd() noexcept;
  /// Reads the wake pipe empty.
  static void drain_wake() noexcept;
  /// For a child between fork and exec (async-signal-safe): the default action for every
  /// signal whose handler was installed here, so that a signal arriving before exec ends the
  /// child instead of running the parent's handler (which would write to the parent's wake
  /// pipe). A signal that was left ignored stays ignored.
  static void reset_in_child() noexcept;
};

}  // namespace mfattn
