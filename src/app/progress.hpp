#pragma once
// The progress display of the commands that advance a time span (run, meanfield).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>

#include "mfattn/core/number_text.hpp"

namespace mfattn {

/// Progress on stderr: a bar with elapsed time, step rate and ETA when it is a terminal,
/// redrawn after steps (at most five times a second), so a run with many steps between
/// frames still moves; a plain line every tenth of the horizon otherwise; nothing with
/// --quiet. The fraction is that of the time span, which is also what dopri5 advances.
/// `mfattn run` and `mfattn meanfield` print it; command names the lines.
class Progress {
 public:
  Progress(std::string command, bool quiet, double start_time, double horizon, std::int64_t start_step,
           std::ostream& log)
      : command_(std::move(command)),
        quiet_(quiet),
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
      log_ << command_ << ": t = " << time << " / " << horizon_ << ", step " << step << ", "
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

  /// A line of its own (a long evaluation's report): the bar, if drawn, is ended first and
  /// drawn again by the next update.
  void interject(const std::string& line) {
    if (quiet_) return;
    finish();
    log_ << command_ << ": " << line << '\n' << std::flush;
  }

  void finish() {
    if (drawn_) log_ << '\n';
    drawn_ = false;
  }

 private:
  double seconds_since_start() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

  std::string command_;
  bool quiet_, terminal_;
  double start_time_, horizon_;
  std::int64_t start_step_;
  std::ostream& log_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  double last_draw_ = -1.0, next_line_;
  unsigned calls_ = 0;
  bool drawn_ = false, printed_end_ = false;
};

}  // namespace mfattn
