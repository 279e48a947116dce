#pragma once
/// \file evaluation_watch.hpp
/// Progress and stop inside one long pass over the pairs (docs/cli.md, "Large n").
///
/// At n = 10^6 one evaluation of the field takes minutes on a laptop (n^2 = 10^12 pairs at a
/// few 10^9 pairs per second), so "between two steps" is too coarse for a stop and for a sign
/// of life. A command that wants both installs an EvaluationWatch for its lifetime; the pair
/// loops (the CPU backend's one-sided and symmetric loops, the frames' pair statistics) open
/// an EvaluationPass for each pass and, per unit of work (a panel of receivers, a block of
/// pairs, a row):
///   - skip the unit once the watch's stop flag is set (every thread looks at it; a unit takes
///     milliseconds, so a stop takes effect well within a second), and
///   - count the unit's pairs; the thread that called the pass (OpenMP thread 0) reports
///     the fraction done and the pair rate now and then (report_every seconds, the first
///     time after first_report_after seconds).
/// A pass that skipped work has no result: EvaluationPass::finish() throws EvaluationStopped
/// (before anything looks at the half-computed sums), and the command drops the step in
/// progress. Without a watch (tests, the library, the Python module's Model) a pass costs one
/// relaxed load per unit and never stops.
///
/// One watch at a time per process: a watch made while another is in force watches nothing
/// (two runs of the Python module in two threads: the first one's reports and stop hold).
#include <atomic>
#include <cstdint>
#include <functional>
#include <stdexcept>

namespace mfattn {

/// A pass over the pairs left unfinished because a stop was asked for.
struct EvaluationStopped : std::runtime_error {
  EvaluationStopped() : std::runtime_error("the evaluation in progress was stopped") {}
};

/// What the report of a pass in progress says.
struct EvaluationReport {
  double fraction = 0.0;  ///< of the pass's pairs done, 0..1
  double seconds = 0.0;   ///< since the pass began
  double pairs = 0.0;     ///< the pass's pairs (i, j), both orders counted
};

class EvaluationWatch {
 public:
  struct Settings {
    const std::atomic<int>* stop = nullptr;  ///< a pass stops once it holds a value != 0
    std::function<void(const EvaluationReport&)>
        report;                       ///< on the pass's calling thread; may be empty
    double first_report_after = 2.0;  ///< seconds into a pass
    double report_every = 30.0;       ///< seconds between two reports of one pass
  };
  explicit EvaluationWatch(Settings settings);
  ~EvaluationWatch();
  EvaluationWatch(const EvaluationWatch&) = delete;
  EvaluationWatch& operator=(const EvaluationWatch&) = delete;

 private:
  bool owner_ = false;
};

/// One pass over `pairs` pairs (i, j), opened outside any parallel region by the code that
/// calls the loop.
class EvaluationPass {
 public:
  explicit EvaluationPass(double pairs) noexcept;
  ~EvaluationPass();
  EvaluationPass(const EvaluationPass&) = delete;
  EvaluationPass& operator=(const EvaluationPass&) = delete;
  /// Whether the loops should skip their remaining units (any thread).
  static bool stopping() noexcept;
  /// A unit of `pairs` pairs done (any thread); on OpenMP thread 0 it may call the report.
  static void done(double pairs) noexcept;
  /// Throws EvaluationStopped when the pass skipped work (a stop came while it ran).
  void finish() const;
};

}  // namespace mfattn
