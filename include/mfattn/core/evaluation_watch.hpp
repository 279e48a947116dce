#pragma once
/// \file evaluation_watch.hpp
/// Progress and stop inside one long pass over the pairs (docs/cli.md, "Large n").
///
/// At n = 10^6 one evaluation of the field takes minutes on a laptop (n^2 = 10^12 pairs at a
/// few 10^9 pairs per second), so "between two steps" is too coarse for a stop and for a sign
/// of life. A command that wants both installs an EvaluationWatch on its thread for its
/// lifetime. The pair loops (the CPU backend's one-sided and symmetric loops, the frames' pair
/// statistics) run inside an EvaluationPass, opened by the code that calls them, and per unit
/// of work (a panel of receivers, a block of pairs, a row):
///   - skip the unit once the watch's stop flag is set (every thread of the pass looks at it;
///     a unit takes milliseconds, so a stop takes effect well within a second), and
///   - count the unit's pairs; the thread that opened the pass reports the fraction done and
///     the pair rate now and then (report_every seconds, the first time after
///     first_report_after seconds).
/// A pass that skipped a unit has no result: EvaluationPass::finish() throws EvaluationStopped
/// (before anything reads the half-computed sums), and the command drops what was in
/// progress. Once a pass has skipped a unit it skips every later one.
///
/// Which passes are watched: those of 10^8 pairs or more opened on the thread that installed
/// the watch. A pass opened on any other thread (the Python module's Model in another thread,
/// a second run) is never watched: it neither stops inside nor reports, whatever the watch
/// sees. Worker threads learn their pass from the pass itself: a parallel region runs its body
/// under EvaluationPass::Scope, or hands the pass's pointer to stopping() and done().
/// One watch at a time per process: a watch made while another is in force watches nothing.
#include <atomic>
#include <functional>
#include <memory>
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
    std::function<void(const EvaluationReport&)> report;  ///< on the watch's thread; may be empty
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
/// calls the loop; while it lives it is the current pass of the thread that opened it.
class EvaluationPass {
 public:
  explicit EvaluationPass(double pairs);
  ~EvaluationPass();
  EvaluationPass(const EvaluationPass&) = delete;
  EvaluationPass& operator=(const EvaluationPass&) = delete;

  /// Makes `pass` the current pass of this thread while it lives (a parallel region's body).
  class Scope {
   public:
    explicit Scope(const EvaluationPass* pass) noexcept;
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    const EvaluationPass* previous_;
  };

  /// This thread's current pass (null outside any).
  static const EvaluationPass* current() noexcept;
  /// Whether the loops should skip their remaining units (any thread of the pass).
  static bool stopping(const EvaluationPass* pass) noexcept;
  static bool stopping() noexcept { return stopping(current()); }
  /// A unit of `pairs` pairs done (any thread); on the opening thread it may report.
  static void done(const EvaluationPass* pass, double pairs) noexcept;
  static void done(double pairs) noexcept { done(current(), pairs); }
  /// Throws EvaluationStopped when the pass skipped a unit.
  void finish() const;

 private:
  struct Watched;
  std::unique_ptr<Watched> watched_;  ///< null: the pass is not watched
  const EvaluationPass* previous_;    ///< the opening thread's current pass before this one
};

}  // namespace mfattn
