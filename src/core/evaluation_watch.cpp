// EvaluationWatch and EvaluationPass (include/mfattn/core/evaluation_watch.hpp).
#include "mfattn/core/evaluation_watch.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <utility>

namespace mfattn {
namespace {

/// Passes smaller than this are neither counted nor stopped inside: they take milliseconds,
/// and a step of many of them (n = 64, millions of steps) should not pay for a clock.
constexpr double kWatchedPairs = 1e8;

std::mutex watch_mutex;
EvaluationWatch::Settings* installed = nullptr;  // guarded by watch_mutex for install/remove
std::atomic<EvaluationWatch::Settings*> active{nullptr};
// The pass being watched: opened with depth 0 -> 1 (a pass inside a pass adds to its counts).
std::atomic<int> depth{0};
std::atomic<bool> watched{false};
std::atomic<std::uint64_t> pairs_done{0};
double pass_pairs = 0.0;
std::chrono::steady_clock::time_point pass_start;
double next_report = 0.0;  // seconds into the pass; read and written by the pass's thread only

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

EvaluationWatch::EvaluationWatch(Settings settings) {
  const std::lock_guard<std::mutex> lock(watch_mutex);
  if (installed) return;  // another watch is in force: it stays the one
  owner_ = true;
  installed = new Settings(std::move(settings));
  active.store(installed, std::memory_order_release);
}

EvaluationWatch::~EvaluationWatch() {
  if (!owner_) return;
  const std::lock_guard<std::mutex> lock(watch_mutex);
  active.store(nullptr, std::memory_order_release);
  delete installed;
  installed = nullptr;
}

EvaluationPass::EvaluationPass(double pairs) noexcept {
  if (depth.fetch_add(1, std::memory_order_acq_rel) != 0) return;
  EvaluationWatch::Settings* watch = active.load(std::memory_order_acquire);
  const bool watch_it = watch && pairs >= kWatchedPairs;
  if (watch_it) {
    pairs_done.store(0, std::memory_order_relaxed);
    pass_pairs = pairs;
    pass_start = std::chrono::steady_clock::now();
    next_report = watch->first_report_after;
  }
  watched.store(watch_it, std::memory_order_release);
}

EvaluationPass::~EvaluationPass() {
  if (depth.fetch_sub(1, std::memory_order_acq_rel) == 1)
    watched.store(false, std::memory_order_release);
}

bool EvaluationPass::stopping() noexcept {
  if (!watched.load(std::memory_order_relaxed)) return false;
  const EvaluationWatch::Settings* watch = active.load(std::memory_order_relaxed);
  return watch && watch->stop && watch->stop->load(std::memory_order_relaxed) != 0;
}

void EvaluationPass::done(double pairs) noexcept {
  if (!watched.load(std::memory_order_relaxed)) return;
  const std::uint64_t total = pairs_done.fetch_add(static_cast<std::uint64_t>(pairs),
                                                   std::memory_order_relaxed) +
                              static_cast<std::uint64_t>(pairs);
  // Only the pass's own thread reports: it is the command's thread, the one that writes its
  // other lines, so no two lines interleave.
  if (omp_get_thread_num() != 0) return;
  const EvaluationWatch::Settings* watch = active.load(std::memory_order_acquire);
  if (!watch || !watch->report) return;
  const double seconds = seconds_since(pass_start);
  if (seconds < next_report) return;
  next_report = seconds + watch->report_every;
  EvaluationReport report;
  report.fraction = pass_pairs > 0.0 ? std::min(1.0, double(total) / pass_pairs) : 1.0;
  report.seconds = seconds;
  report.pairs = pass_pairs;
  try {
    watch->report(report);
  } catch (...) {
    // A report that cannot be written (a closed stderr) must not end the pass.
  }
}

void EvaluationPass::finish() const {
  if (stopping()) throw EvaluationStopped();
}

}  // namespace mfattn
