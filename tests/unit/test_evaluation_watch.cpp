// EvaluationWatch and EvaluationPass (core/evaluation_watch.hpp): a watched pass over the pairs
// changes no bit, reports its progress, and stops between its units once the stop flag is set;
// small passes and passes without a watch never stop inside.
#include <atomic>
#include <thread>

#include "test_support.hpp"
#include "mfattn/core/evaluation_watch.hpp"
#include "mfattn/observers/observables.hpp"

namespace mfattn {
namespace {

using testing::bitwise_equal;
using testing::config;
using testing::evaluate_velocity;

// n = 10^4: 10^8 pairs, the smallest pass a watch follows.
struct LargePass {
  RunConfig cfg = config({"--n", "10000", "--d", "3", "--seed", "5", "--beta", "4"});
  Model model = build_model(cfg);
  State state = build_initial_state(cfg, model);
};

TEST(EvaluationWatch, AWatchedPassChangesNoBitAndReportsItsProgress) {
  const LargePass pass;
  const std::vector<double> plain = evaluate_velocity(pass.model, pass.state, "cpu", 2);
  std::atomic<int> stop{0};
  std::vector<EvaluationReport> reports;
  {
    EvaluationWatch::Settings settings;
    settings.stop = &stop;
    settings.first_report_after = 0.0;
    settings.report_every = 0.0;
    settings.report = [&](const EvaluationReport& report) { reports.push_back(report); };
    const EvaluationWatch watch(std::move(settings));
    for (int threads : {1, 2}) {
      const std::vector<double> watched = evaluate_velocity(pass.model, pass.state, "cpu", threads);
      EXPECT_TRUE(bitwise_equal(watched.data(), plain.data(), plain.size()))
          << threads << " threads";
    }
  }
  ASSERT_FALSE(reports.empty());
  for (const EvaluationReport& report : reports) {
    EXPECT_GT(report.fraction, 0.0);
    EXPECT_LE(report.fraction, 1.0);
    EXPECT_EQ(report.pairs, 1e8);
    EXPECT_GE(report.seconds, 0.0);
  }
  // Reports come from within the pass, not only at its end.
  EXPECT_LT(reports.front().fraction, 0.5);
}

TEST(EvaluationWatch, AStopEndsAWatchedPassWithoutAResult) {
  const LargePass pass;
  std::atomic<int> stop{2};  // as if SIGINT had come
  EvaluationWatch::Settings settings;
  settings.stop = &stop;
  const EvaluationWatch watch(std::move(settings));
  // The symmetric loop's threads wait on each other's blocks: a stop must end every thread's
  // rounds, one thread, two (which share each round's blocks) or more.
  for (int threads : {1, 2, 3})
    EXPECT_THROW(evaluate_velocity(pass.model, pass.state, "cpu", threads), EvaluationStopped)
        << threads;
  // The frames' pair statistics stop alike.
  const std::size_t m = 15000;  // 1.1e8 pairs i < j
  std::vector<double> x(m * 3);
  for (std::size_t i = 0; i < m; ++i) x[3 * i + i % 3] = 1.0;
  std::vector<std::size_t> all(m);
  for (std::size_t i = 0; i < m; ++i) all[i] = i;
  EXPECT_THROW(pair_statistics(x.data(), 3, all), EvaluationStopped);
  // A small pass is not watched: it ends with its result, as between two steps.
  const RunConfig small_cfg = config({"--n", "100", "--d", "3", "--seed", "5"});
  const Model small = build_model(small_cfg);
  EXPECT_NO_THROW(evaluate_velocity(small, build_initial_state(small_cfg, small), "cpu", 2));
  // Without a stop the watched pass is whole.
  stop = 0;
  EXPECT_NO_THROW(evaluate_velocity(pass.model, pass.state, "cpu", 2));
}

// A watch is its thread's: a pass on another thread (the Python module's Model beside a run)
// neither stops nor reports, and its result is whole, while the watch's thread is stopped.
TEST(EvaluationWatch, APassOfAnotherThreadIsNeverWatched) {
  const LargePass pass;
  const std::vector<double> plain = evaluate_velocity(pass.model, pass.state, "cpu", 2);
  std::atomic<int> stop{2};
  int reports = 0;
  EvaluationWatch::Settings settings;
  settings.stop = &stop;
  settings.first_report_after = 0.0;
  settings.report = [&](const EvaluationReport&) { ++reports; };
  const EvaluationWatch watch(std::move(settings));
  std::vector<double> elsewhere;
  bool stopped = false;
  std::thread other([&] {
    try {
      elsewhere = evaluate_velocity(pass.model, pass.state, "cpu", 2);
    } catch (const EvaluationStopped&) {
      stopped = true;
    }
  });
  other.join();
  EXPECT_FALSE(stopped);
  ASSERT_EQ(elsewhere.size(), plain.size());
  EXPECT_TRUE(bitwise_equal(elsewhere.data(), plain.data(), plain.size()));
  EXPECT_EQ(reports, 0);
  // On the watch's own thread the same pass stops.
  EXPECT_THROW(evaluate_velocity(pass.model, pass.state, "cpu", 2), EvaluationStopped);
}

TEST(EvaluationWatch, WithoutAWatchAPassNeverStops) {
  const LargePass pass;
  EXPECT_FALSE(EvaluationPass::stopping());
  EXPECT_NO_THROW(evaluate_velocity(pass.model, pass.state, "cpu", 2));
}

}  // namespace
}  // namespace mfattn
