// EvaluationWatch and EvaluationPass (include/mfattn/core/evaluation_watch.hpp).
#include "mfattn/core/evaluation_watch.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>

namespace mfattn {
namespace {

/// Passes smaller than this are neither counted nor stopped inside: they take milliseconds,
/// and a step of many of them (n = 64, millions of steps) should not pay for a clock.
constexpr double kWatchedPairs = 1e8;

/// The watch in force: its settings (shared with the passes it watches, which may outlive it
/// by the time a pass takes to end) and the thread that installed it.
struct InstalledWatch {
  std::shared_ptr<const EvaluationWatch::Settings> settings;
  std::thread::id owner;
};
std::mutex watch_mutex;
InstalledWatch installed;  // guarded by watch_mutex

thread_local const EvaluationPass* current_pass = nullptr;

}  // namespace

/// What a watched pass keeps: the watch's settings, its thread, its clock and counts. Worker
/// threads write skipped and pairs_done; only the opening thread reads the clock and reports.
struct EvaluationPass::Watched {
  std::shared_ptr<const EvaluationWatch::Settings> settings;
  std::thread::id owner;
  double pairs = 0.0;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  std::atomic<bool> skipped{false};
  std::atomic<std::uint64_t> pairs_done{0};
  double next_report = 0.0;  // seconds into the pass; the opening thread's only
};

EvaluationWatch::EvaluationWatch(Settings settings) {
  const std::lock_guard<std::mutex> lock(watch_mutex);
  if (installed.settings) return;  // another watch is in force: it stays the one
  owner_ = true;
  installed.settings = std::make_shared<const Settings>(std::move(settings));
  installed.owner = std::this_thread::get_id();
}

EvaluationWatch::~EvaluationWatch() {
  if (!owner_) return;
  const std::lock_guard<std::mutex> lock(watch_mutex);
  installed = InstalledWatch{};
}

EvaluationPass::EvaluationPass(double pairs) : previous_(current_pass) {
  if (pairs >= kWatchedPairs) {
    std::shared_ptr<const EvaluationWatch::Settings> settings;
    {
      const std::lock_guard<std::mutex> lock(watch_mutex);
      if (installed.settings && installed.owner == std::this_thread::get_id())
        settings = installed.settings;
    }
    if (settings) {
      watched_ = std::make_unique<Watched>();
      watched_->next_report = settings->first_report_after;
      watched_->settings = std::move(settings);
      watched_->owner = std::this_thread::get_id();
      watched_->pairs = pairs;
    }
  }
  current_pass = this;  // last: a constructor that throws leaves the thread's pass as it was
}

EvaluationPass::~EvaluationPass() { current_pass = previous_; }

EvaluationPass::Scope::Scope(const EvaluationPass* pass) noexcept : previous_(current_pass) {
  current_pass = pass;
}

EvaluationPass::Scope::~Scope() { current_pass = previous_; }

const EvaluationPass* EvaluationPass::current() noexcept { return current_pass; }

bool EvaluationPass::stopping(const EvaluationPass* pass) noexcept {
  if (!pass || !pass->watched_) return false;
  Watched& watched = *pass->watched_;
  // Latched: a pass that skipped a unit skips every later one, whatever the flag does next
  // (the symmetric loop's threads must all leave their rounds).
  if (watched.skipped.load(std::memory_order_relaxed)) return true;
  const std::atomic<int>* stop = watched.settings->stop;
  if (!stop || stop->load(std::memory_order_relaxed) == 0) return false;
  watched.skipped.store(true, std::memory_order_relaxed);
  return true;
}

void EvaluationPass::done(const EvaluationPass* pass, double pairs) noexcept {
  if (!pass || !pass->watched_) return;
  Watched& watched = *pass->watched_;
  const std::uint64_t total = watched.pairs_done.fetch_add(static_cast<std::uint64_t>(pairs),
                                                           std::memory_order_relaxed) +
                              static_cast<std::uint64_t>(pairs);
  // Only the opening thread reports: it is the command's own thread, the one that writes its
  // other lines, so no two lines interleave and the report touches nothing of another thread.
  if (std::this_thread::get_id() != watched.owner || !watched.settings->report) return;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - watched.start).count();
  if (seconds < watched.next_report) return;
  watched.next_report = seconds + watched.settings->report_every;
  EvaluationReport report;
  report.fraction = watched.pairs > 0.0 ? std::min(1.0, double(total) / watched.pairs) : 1.0;
  report.seconds = seconds;
  report.pairs = watched.pairs;
  try {
    watched.settings->report(report);
  } catch (...) {
    // A report that cannot be written (a closed stderr) must not end the pass.
  }
}

void EvaluationPass::finish() const {
  if (watched_ && watched_->skipped.load(std::memory_order_relaxed)) throw EvaluationStopped();
}

}  // namespace mfattn
