// mfattn analyze: constructed trajectories with known plateaus (written with H5mdWriter), files
// without the cluster observables, replicas, error exits, JSON validity, a file that a live
// writer holds open, and real runs (USA collapse, RoPE).
#include <hdf5.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <numbers>
#include <numeric>
#include <sstream>

#include "mfattn/analyze/analyze.hpp"
#include "mfattn/io/h5md.hpp"
#include "mfattn/observers/observables.hpp"
#include "mfattn/io/series.hpp"
#include "test_support.hpp"

namespace mfattn {
namespace {

using testing::run_mfattn;
using testing::scratch_dir;

constexpr std::size_t kActive = 12, kTokens = 13, kFrames = 41;  // token 12 is a null token
constexpr double kPi = std::numbers::pi;

/// Frame k is at t = 10^(k/10) (1 .. 10^4). Replica 0: 4 clusters of 3 for t < 10, 2 clusters of
/// 6 for 10 <= t < 1000, one cluster from t = 1000. Replica 1 keeps its 4 clusters. The null
/// token sits apart at angle 2 (it would be a cluster of its own if it counted).
double frame_time(std::size_t k) { return std::pow(10.0, double(k) / 10.0); }
std::size_t expected_clusters(std::size_t k, std::size_t replica) {
  if (replica == 1 || k < 10) return 4;
  return k < 30 ? 2 : 1;
}
double angle(std::size_t k, std::size_t i, std::size_t replica) {
  if (i == kActive) return 2.0;
  const double wobble = 1e-4 * (double((i * 7 + k) % 5) - 2.0) / 2.0;  // within +-1e-4 rad
  const std::size_t clusters = expected_clusters(k, replica);
  if (clusters == 1) return 0.3 + wobble;
  return double(i % clusters) * 2.0 * kPi / double(clusters) + wobble;
}
std::vector<double> frame_positions(std::size_t k, std::size_t replicas) {
  std::vector<double> x;
  for (std::size_t r = 0; r < replicas; ++r)
    for (std::size_t i = 0; i < kTokens; ++i) {
      x.push_back(std::cos(angle(k, i, r)));
      x.push_back(std::sin(angle(k, i, r)));
    }
  return x;
}
double plain_min_inner(const double* x) {
  double lowest = 1.0;
  for (std::size_t i = 0; i < kActive; ++i)
    for (std::size_t j = i + 1; j < kActive; ++j)
      lowest = std::min(lowest, x[2 * i] * x[2 * j] + x[2 * i + 1] * x[2 * j + 1]);
  return lowest;
}
double energy_at(std::size_t k, std::size_t replica) { return 1.0 + 0.01 * double(k) + 0.5 * double(replica); }

/// Writes the constructed trajectory. with_clusters = false writes the older layout
/// (energy, mean_inner, min_inner, max_speed), so analyze counts clusters from positions.
void write_constructed(const std::string& path, bool with_clusters, std::size_t replicas = 1,
                       std::size_t frames = kFrames, const std::string& status = "complete",
                       double energy_dip_at = -1.0) {
  WriterSetup setup;
  setup.path = path;
  setup.overwrite = true;
  setup.n = kTokens;
  setup.d = 2;
  setup.replicas = replicas;
  setup.creator_version = "test";
  setup.observables = {{"energy", 1}, {"mean_inner", 1}, {"min_inner", 1}, {"max_speed", 1}};
  if (with_clusters) setup.observables.push_back({"n_clusters", 1});
  auto writer = H5mdWriter::create(setup);
  writer->write_parameters({{"gradient_flow", true}, {"beta", 1.0}});
  TokenLabels labels;
  labels.aux_position.assign(kTokens, 0.0);
  labels.prompt_id.assign(kTokens, 0);
  labels.presence.assign(kTokens, 1.0);
  labels.presence[kActive] = 0.0;
  for (std::size_t i = 0; i < kTokens; ++i) labels.id.push_back(std::int64_t(i));
  writer->write_labels(labels);
  for (std::size_t k = 0; k < frames; ++k) {
    const auto x = frame_positions(k, replicas);
    std::vector<std::vector<double>> values(setup.observables.size());
    for (std::size_t r = 0; r < replicas; ++r) {
      double energy = energy_at(k, r);
      if (double(k) == energy_dip_at) energy -= 0.02;
      values[0].push_back(energy);
      values[1].push_back(0.0);
      values[2].push_back(plain_min_inner(x.data() + r * kTokens * 2));
      values[3].push_back(0.0);
      if (with_clusters) values[4].push_back(double(expected_clusters(k, r)));
    }
    writer->append_frame(std::int64_t(k), frame_time(k), x.data(), values);
  }
  writer->write_run_info(status, 1.0, std::int64_t(frames), 0);
  writer->flush();
}

void expect_constructed_analysis(const Analysis& a, const std::string& where) {
  EXPECT_EQ(a.frames, kFrames) << where;
  EXPECT_EQ(a.final_clusters, 1u) << where;
  EXPECT_TRUE(a.collapsed) << where;
  ASSERT_TRUE(a.collapse_time.has_value()) << where;
  EXPECT_EQ(*a.collapse_time, frame_time(30)) << where;
  ASSERT_EQ(a.plateaus.size(), 3u) << where;
  const std::size_t clusters[3] = {4, 2, 1}, first[3] = {0, 10, 30}, last[3] = {9, 29, 40};
  for (std::size_t p = 0; p < 3; ++p) {
    const Plateau& plateau = a.plateaus[p];
    EXPECT_EQ(plateau.clusters, clusters[p]) << where << " plateau " << p;
    EXPECT_EQ(plateau.first_frame, first[p]) << where;
    EXPECT_EQ(plateau.last_frame, last[p]) << where;
    EXPECT_EQ(plateau.t_start, frame_time(first[p])) << where;
    EXPECT_EQ(plateau.t_end, frame_time(last[p])) << where;
    EXPECT_NEAR(plateau.decades, double(last[p] - first[p]) / 10.0, 1e-12) << where;
    EXPECT_EQ(plateau.energy_end, energy_at(last[p], 0)) << where;
    EXPECT_EQ(a.energy_staircase.at(p), energy_at(last[p], 0)) << where;
  }
  // 0.9 decades (not metastable), 1.9 decades (metastable), the final one (1 decade, final).
  EXPECT_FALSE(a.plateaus[0].metastable);
  EXPECT_TRUE(a.plateaus[1].metastable);
  EXPECT_FALSE(a.plateaus[2].metastable);
  EXPECT_TRUE(a.plateaus[2].final);
  ASSERT_EQ(a.merges.size(), 2u) << where;
  EXPECT_EQ(a.merges[0].time, 10.0);
  EXPECT_EQ(a.merges[0].from, 4u);
  EXPECT_EQ(a.merges[0].to, 2u);
  EXPECT_EQ(a.merges[1].time, 1000.0);
  EXPECT_EQ(a.merges[1].from, 2u);
  EXPECT_EQ(a.merges[1].to, 1u);
  EXPECT_TRUE(a.splits.empty());
  ASSERT_TRUE(a.energy_monotone.has_value());
  EXPECT_TRUE(*a.energy_monotone);
  ASSERT_TRUE(a.gradient_flow.has_value());
  EXPECT_TRUE(*a.gradient_flow);
  EXPECT_EQ(a.status, std::optional<std::string>("complete"));
  EXPECT_GT(a.min_inner_final, 1.0 - 1e-7);
  EXPECT_NEAR(a.marginal_spread_final, 0.0, 1e-7);
  EXPECT_FALSE(a.conditional_spread_final.has_value());
}

/// Runs a shell command; stdout and stderr together.
testing::CommandResult run_shell(const std::string& command) {
  testing::CommandResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  char buffer[4096];
  while (pipe && std::fgets(buffer, sizeof buffer, pipe)) result.output += buffer;
  const int status = pipe ? ::pclose(pipe) : -1;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

/// Runs a python3 check on the JSON that `mfattn analyze ARGS --json` prints; the script gets
/// the parsed object as `d` and fails with an assertion.
testing::CommandResult check_json(const std::string& arguments, const std::string& checks) {
  const auto dir = scratch_dir("analyze_json_check");
  const std::string script = (dir / "check.py").string();
  std::ofstream(script) << "import json, math, sys\n"
                        << "text = sys.stdin.read()\n"
                        << "d = json.loads(text)\n"
                        << "assert isinstance(d, dict)\n"
                        << "assert text.count('\\n') == 1 and text.endswith('\\n')\n"
                        << checks << "\nprint('ok')\n";
  return run_shell(std::string(MFATTN_BINARY) + " analyze " + arguments +
                   " --json 2>/dev/null | /usr/bin/python3 " + script);
}

TEST(Analyze, ConstructedTrajectoryGivesItsPlateausMergesAndCollapse) {
  const auto dir = scratch_dir("analyze_constructed");
  const std::string path = (dir / "constructed.h5").string();
  write_constructed(path, true);
  const Analysis a = analyze_file(path);
  expect_constructed_analysis(a, "stored n_clusters");
  EXPECT_FALSE(a.clusters_from_positions);

  const auto text = run_mfattn("analyze " + path);
  ASSERT_EQ(text.exit_code, 0) << text.output;
  for (const std::string item : {"final_clusters            1\n", "collapse_time             1000\n",
                                 "merge                     t = 10: 4 -> 2\n",
                                 "merge                     t = 1000: 2 -> 1\n",
                                 "2 clusters, t = 10 .. 794.328, 1.9 decades, energy 1.29, metastable\n",
                                 "1 cluster, t = 1000 .. 10000, 1 decades, energy 1.4, final\n",
                                 "energy_monotone           yes; gradient flow"})
    EXPECT_NE(text.output.find(item), std::string::npos) << item << "\n" << text.output;

  const auto json = check_json(path,
                               "assert d['final_clusters'] == 1 and d['collapsed'] is True\n"
                               "assert d['collapse_time'] == 1000.0\n"
                               "assert [p['clusters'] for p in d['plateaus']] == [4, 2, 1]\n"
                               "assert [p['metastable'] for p in d['plateaus']] == [False, True, False]\n"
                               "assert abs(d['plateaus'][1]['decades'] - 1.9) < 1e-12\n"
                               "assert d['plateaus'][2]['final'] is True\n"
                               "assert [(m['time'], m['from'], m['to']) for m in d['merge_times']] == "
                               "[(10.0, 4, 2), (1000.0, 2, 1)]\n"
                               "assert d['split_times'] == []\n"
                               "assert all(abs(a - b) < 1e-12 for a, b in zip(d['energy_staircase'], [1.09, 1.29, 1.4]))\n"
                               "assert len(d['energy_staircase']) == 3\n"
                               "assert d['energy_monotone'] is True and d['gradient_flow'] is True\n"
                               "assert d['status'] == 'complete' and d['frames_read'] == 41\n"
                               "assert d['conditional_spread_final'] is None\n"
                               "assert d['clusters_source'] == 'file' and d['metastable_plateaus'] == 1");
  EXPECT_EQ(json.exit_code, 0) << json.output;
  EXPECT_EQ(json.output, "ok\n");
}

// An older file (no n_clusters): the counts come from the stored positions of the tokens with
// p > 0 and give the same analysis.
TEST(Analyze, FilesWithoutClusterCountsAreCountedFromPositions) {
  const auto dir = scratch_dir("analyze_old");
  const std::string path = (dir / "old.h5").string();
  write_constructed(path, false);
  const Analysis a = analyze_file(path);
  expect_constructed_analysis(a, "recomputed n_clusters");
  EXPECT_TRUE(a.clusters_from_positions);
  const auto json = check_json(path, "assert d['clusters_source'] == 'positions'");
  EXPECT_EQ(json.exit_code, 0) << json.output;
}

TEST(Analyze, ReplicaOptionSelectsTheReplica) {
  const auto dir = scratch_dir("analyze_replicas");
  const std::string path = (dir / "two.h5").string();
  write_constructed(path, true, 2);
  expect_constructed_analysis(analyze_file(path, 0), "replica 0");
  const Analysis one = analyze_file(path, 1);
  EXPECT_EQ(one.final_clusters, 4u);
  EXPECT_FALSE(one.collapsed);
  EXPECT_FALSE(one.collapse_time.has_value());
  ASSERT_EQ(one.plateaus.size(), 1u);
  EXPECT_TRUE(one.plateaus[0].final);
  EXPECT_TRUE(one.merges.empty());
  EXPECT_EQ(one.energy_final, energy_at(kFrames - 1, 1));
  const auto json = check_json(path + " --replica 1",
                               "assert d['replica'] == 1 and d['replicas'] == 2\n"
                               "assert d['collapsed'] is False and d['collapse_time'] is None\n"
                               "assert d['final_clusters'] == 4 and d['merge_times'] == []");
  EXPECT_EQ(json.exit_code, 0) << json.output;
  const auto beyond = run_mfattn("analyze " + path + " --replica 2");
  EXPECT_EQ(beyond.exit_code, kExitUsage) << beyond.output;
  EXPECT_NE(beyond.output.find(path), std::string::npos) << beyond.output;
  EXPECT_EQ(std::count(beyond.output.begin(), beyond.output.end(), '\n'), 1) << beyond.output;
}

// --replica all sums up every replica: replica 0 collapses at t = 1000 after a metastable
// 2-cluster plateau, replica 1 stays at 4 clusters.
TEST(Analyze, EveryReplicaIsSummedUp) {
  const auto dir = scratch_dir("analyze_all");
  const std::string path = (dir / "two.h5").string();
  write_constructed(path, true, 2);
  const auto text = run_mfattn("analyze " + path + " --replica all");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  for (const std::string item : {"replicas                  2 (every one analysed)\n",
                                 "collapsed                 1 of 2 (criterion: final min_inner >= 1 - 0.0001)\n",
                                 "collapse_time             min 1000, median 1000, max 1000 (the collapsed replicas)\n",
                                 "final_clusters            1: 1, 4: 1 (clusters: replicas)\n",
                                 "metastable_plateaus       0: 1, 1: 1 (plateaus: replicas)\n",
                                 "metastable_clusters       2: 1 (clusters: metastable plateaus)\n"})
    EXPECT_NE(text.output.find(item), std::string::npos) << item << "\n" << text.output;
  const auto json = check_json(path + " --replica all",
                               "assert d['replicas'] == 2 and d['collapsed'] == 1\n"
                               "assert d['collapse_time'] == {'min': 1000.0, 'median': 1000.0, 'max': 1000.0}\n"
                               "assert d['final_clusters'] == {'1': 1, '4': 1}\n"
                               "assert d['metastable_clusters'] == {'2': 1}\n"
                               "assert [r['final_clusters'] for r in d['per_replica']] == [1, 4]\n"
                               "assert [r['collapsed'] for r in d['per_replica']] == [True, False]");
  EXPECT_EQ(json.exit_code, 0) << json.output;
}

// The text leaves out plateaus shorter than --min-decades (0.05 by default: the one-frame
// plateaus of a cascade), says how many, and sums up the metastable ones in one line; the
// JSON keeps every plateau.
TEST(Analyze, ShortPlateausAreLeftOutOfTheTextAndCounted) {
  const auto dir = scratch_dir("analyze_min_decades");
  const std::string path = (dir / "circle.h5").string();
  ASSERT_EQ(run_mfattn("run --n 24 --d 2 --beta 9 --time-scale rescaled --horizon 10000 --save-log 200 "
                       "--integrator dopri5 --seed 1 --threads 1 --quiet --out " + path)
                .exit_code,
            0);
  const Analysis a = analyze_file(path);
  std::size_t listed = 0, metastable = 0;
  for (const Plateau& p : a.plateaus) {
    listed += plateau_listed(p, kDefaultListedDecades);
    metastable += p.metastable;
  }
  ASSERT_LT(listed, a.plateaus.size());  // this run has one-frame plateaus
  ASSERT_GE(metastable, 1u);
  auto count = [](const std::string& text, const std::string& item) {
    std::size_t found = 0;
    for (std::size_t at = 0; (at = text.find(item, at)) != std::string::npos; ++at) ++found;
    return found;
  };
  const auto shown = run_mfattn("analyze " + path);
  ASSERT_EQ(shown.exit_code, 0) << shown.output;
  EXPECT_EQ(count(shown.output, "\nplateau "), listed) << shown.output;
  EXPECT_NE(shown.output.find("plateaus_not_listed       " + std::to_string(a.plateaus.size() - listed) +
                              " shorter than 0.05 decades"),
            std::string::npos)
      << shown.output;
  // One summary line, naming each metastable plateau once.
  const std::size_t at = shown.output.find("\nmetastable                ");
  ASSERT_NE(at, std::string::npos) << shown.output;
  const std::string summary = shown.output.substr(at + 1, shown.output.find('\n', at + 1) - at - 1);
  EXPECT_EQ(count(summary, " decades (t = "), metastable) << summary;
  const auto every = run_mfattn("analyze " + path + " --min-decades 0");
  EXPECT_EQ(count(every.output, "\nplateau "), a.plateaus.size()) << every.output;
  EXPECT_EQ(every.output.find("plateaus_not_listed"), std::string::npos) << every.output;
  const auto json = check_json(path, "assert len(d['plateaus']) == " + std::to_string(a.plateaus.size()));
  EXPECT_EQ(json.exit_code, 0) << json.output;
  for (const std::string bad : {"-1", "many", "nan"}) {
    const auto refused = run_mfattn("analyze " + path + " --min-decades " + bad);
    EXPECT_EQ(refused.exit_code, kExitUsage) << bad;
    EXPECT_NE(refused.output.find("--min-decades " + bad + ": expected a number of decades >= 0"), std::string::npos)
        << refused.output;
  }
}

TEST(Analyze, EnergyDecreaseAndInterruptedRunAreReported) {
  const auto dir = scratch_dir("analyze_energy");
  const std::string path = (dir / "dip.h5").string();
  write_constructed(path, true, 1, 25, "running", 20.0);
  const Analysis a = analyze_file(path);
  ASSERT_TRUE(a.energy_monotone.has_value());
  EXPECT_FALSE(*a.energy_monotone);
  EXPECT_NEAR(a.energy_largest_drop, 0.01 / energy_at(19, 0), 1e-12);
  EXPECT_EQ(a.status, std::optional<std::string>("running"));
  EXPECT_EQ(a.frames, 25u);
  EXPECT_EQ(a.final_clusters, 2u);
  EXPECT_FALSE(a.collapsed);
  EXPECT_TRUE(a.plateaus.back().final);
  const auto text = run_mfattn("analyze " + path);
  EXPECT_NE(text.output.find("energy_monotone           no (largest relative drop"), std::string::npos)
      << text.output;
  EXPECT_NE(text.output.find("collapse_time             never"), std::string::npos) << text.output;
}

// --min-decades filters the changes and the staircase with the plateaus: a cascade through
// one-frame plateaus is one net merge line, a split back and forth through a short plateau is
// none, and the staircase holds the listed plateaus' energies; 0 lists every change.
TEST(Analyze, TheChangesAndTheStaircaseFollowTheListedPlateaus) {
  // Clusters 9 (t = 0 .. 1, initial), 8 and 7 for one frame each, 5 for two decades, 6 for one
  // frame, 5 again (final).
  const AnalysisSeries series{{0, 1, 2, 3, 4, 400, 401, 402, 4000},
                              {9, 9, 8, 7, 5, 5, 6, 5, 5},
                              {0, 0, 0, 0, 0, 0, 0, 0, 0},
                              {1, 1, 2, 3, 4, 4.5, 5, 6, 7}};
  const Analysis a = analyze_series(series);
  ASSERT_EQ(a.merges.size(), 4u);
  ASSERT_EQ(a.splits.size(), 1u);
  std::ostringstream text;
  write_analysis_text(a, text);
  const std::string out = text.str();
  EXPECT_NE(
      out.find(
          "9 clusters, t = 0 .. 1, decades undefined, energy 1, initial (before clustering starts)"),
      std::string::npos)
      << out;
  EXPECT_NE(out.find("merge                     t = 4: 9 -> 5 (through 2 shorter plateaus)\n"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("\nsplit"), std::string::npos) << out;  // 5 -> 6 -> 5 nets to nothing
  EXPECT_NE(out.find("changes_not_listed        5 of the 5 merges and splits"), std::string::npos)
      << out;
  EXPECT_NE(out.find("energy_staircase          1 4.5 7\n"), std::string::npos) << out;
  std::ostringstream every;
  write_analysis_text(a, every, 0.0);
  EXPECT_NE(every.str().find("merge                     t = 2: 9 -> 8\n"), std::string::npos)
      << every.str();
  EXPECT_NE(every.str().find("split                     t = 401: 5 -> 6\n"), std::string::npos)
      << every.str();
  EXPECT_EQ(every.str().find("changes_not_listed"), std::string::npos) << every.str();
  EXPECT_NE(every.str().find("energy_staircase          1 2 3 4.5 5 7\n"), std::string::npos)
      << every.str();
}

TEST(Analyze, SeriesEdgeCases) {
  // One frame; energies that are not finite make monotonicity unknown (JSON null).
  AnalysisSeries one{{0.0}, {5}, {0.2}, {std::nan("")}};
  Analysis a = analyze_series(one);
  EXPECT_EQ(a.plateaus.size(), 1u);
  EXPECT_TRUE(std::isnan(a.plateaus[0].decades));  // starts at t = 0
  EXPECT_FALSE(a.energy_monotone.has_value());
  std::ostringstream json;
  write_analysis_json(a, json);
  EXPECT_NE(json.str().find("\"energy_monotone\":null"), std::string::npos) << json.str();
  EXPECT_NE(json.str().find("\"decades\":null"), std::string::npos) << json.str();
  EXPECT_NE(json.str().find("\"energy_final\":null"), std::string::npos) << json.str();
  // A split, then a merge back; collapse that is lost again is no collapse.
  AnalysisSeries wobble{{0, 1, 2, 3}, {1, 2, 1, 2}, {1, 1, 1, 0.5}, {}};
  a = analyze_series(wobble);
  EXPECT_EQ(a.merges.size(), 1u);
  EXPECT_EQ(a.splits.size(), 2u);
  EXPECT_FALSE(a.collapsed);
  EXPECT_FALSE(a.collapse_time.has_value());
  EXPECT_THROW(analyze_series(AnalysisSeries{}), std::invalid_argument);
}

TEST(Analyze, ErrorsNameTheFileAndExitWithTheDocumentedCodes) {
  const auto dir = scratch_dir("analyze_errors");
  const std::string missing = (dir / "missing.h5").string();
  const std::string text_file = (dir / "notes.txt").string();
  std::ofstream(text_file) << "not hdf5\n";
  const std::string foreign = (dir / "foreign.h5").string();
  H5Fclose(H5Fcreate(foreign.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  for (const std::string& path : {missing, text_file, foreign, dir.string()}) {
    for (const std::string mode : {"", " --json"}) {
      const auto result = run_mfattn("analyze " + path + mode);
      // Missing or not an mfattn file: the caller's mistake.
      EXPECT_EQ(result.exit_code, kExitUsage) << path << result.output;
      EXPECT_NE(result.output.find(path), std::string::npos) << result.output;
      EXPECT_EQ(std::count(result.output.begin(), result.output.end(), '\n'), 1) << result.output;
    }
  }
  EXPECT_NE(run_mfattn("analyze " + foreign).output.find("not an mfattn"), std::string::npos);
  EXPECT_NE(run_mfattn("analyze " + missing).output.find("no such file"), std::string::npos);
  const std::string empty = (dir / "empty.h5").string();
  {
    WriterSetup setup;
    setup.path = empty;
    setup.n = 2;
    setup.d = 2;
    H5mdWriter::create(setup);
  }
  const auto no_frames = run_mfattn("analyze " + empty);
  EXPECT_EQ(no_frames.exit_code, kExitIo) << no_frames.output;
  EXPECT_NE(no_frames.output.find("no complete frame"), std::string::npos) << no_frames.output;
  for (const std::string& usage : std::vector<std::string>{"", "--json", "--bogus " + foreign, foreign + " " + foreign,
                                  foreign + " --replica", foreign + " --replica -1",
                                  foreign + " --replica x"}) {
    const auto result = run_mfattn("analyze " + usage);
    EXPECT_EQ(result.exit_code, kExitUsage) << usage << ": " << result.output;
    EXPECT_EQ(std::count(result.output.begin(), result.output.end(), '\n'), 1) << result.output;
  }
  EXPECT_EQ(run_mfattn("analyze --help").exit_code, kExitOk);
}

// Strings are escaped: a file name with a quote, a backslash and a tab stays valid JSON.
TEST(Analyze, JsonEscapesStrings) {
  const auto dir = scratch_dir("analyze_escape");
  const std::string path = (dir / "we\"ird\\na\tme.h5").string();
  write_constructed(path, true);
  std::ostringstream out, err;
  ASSERT_EQ(analyze_command({path, "--json"}, out, err), kExitOk) << err.str();
  const std::string json_path = (dir / "out.json").string(), expect_path = (dir / "name.txt").string();
  std::ofstream(json_path) << out.str();
  std::ofstream(expect_path) << path;
  const auto result = run_shell("/usr/bin/python3 -c \"import json; d = json.load(open('" + json_path +
                                "')); assert d['file'] == open('" + expect_path + "').read(); print('ok')\"");
  EXPECT_EQ(result.exit_code, 0) << result.output << out.str();
  EXPECT_EQ(result.output, "ok\n");
}

// A file that a live writer holds open (and locked) is read up to its last flushed frame.
TEST(Analyze, ReadsAFileThatAWriterHoldsOpen) {
  const auto dir = scratch_dir("analyze_live");
  const std::string path = (dir / "live.h5").string();
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      WriterSetup setup;
      setup.path = path;
      setup.n = kTokens;
      setup.d = 2;
      setup.observables = {{"energy", 1}, {"min_inner", 1}, {"n_clusters", 1}};
      auto writer = H5mdWriter::create(setup);
      for (std::size_t k = 0; k < 15; ++k) {
        const auto x = frame_positions(k, 1);
        writer->append_frame(std::int64_t(k), frame_time(k), x.data(),
                             {{energy_at(k, 0)}, {plain_min_inner(x.data())},
                              {double(expected_clusters(k, 0))}});
      }
      writer->flush();
      (void)!::write(ready[1], "x", 1);
      ::pause();  // held open until killed
    } catch (...) {
    }
    _exit(3);
  }
  ::close(ready[1]);
  char byte = 0;
  const bool got = ::read(ready[0], &byte, 1) == 1;
  ::close(ready[0]);
  const auto result = got ? run_mfattn("analyze " + path) : testing::CommandResult{};
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(got) << "the writer did not start";
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("status                    running\n"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("frames_read               15 "), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("merge                     t = 10: 4 -> 2\n"), std::string::npos)
      << result.output;
}

// A real USA run collapses; analyze says so, and the stored n_clusters equal the count from
// the stored positions at every frame.
TEST(Analyze, UsaRunIsReportedCollapsed) {
  const auto dir = scratch_dir("analyze_usa");
  const std::string path = (dir / "usa.h5").string();
  const auto run = run_mfattn("run --n 32 --d 3 --kernel usa --horizon 20 --save-log 30 --quiet --out " + path);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const Analysis a = analyze_file(path);
  EXPECT_TRUE(a.collapsed);
  EXPECT_EQ(a.final_clusters, 1u);
  ASSERT_TRUE(a.collapse_time.has_value());
  EXPECT_LT(*a.collapse_time, 20.0);
  ASSERT_FALSE(a.merges.empty());
  EXPECT_EQ(a.merges.back().to, 1u);
  EXPECT_EQ(a.plateaus.front().clusters, 32u);
  EXPECT_TRUE(*a.energy_monotone);
  EXPECT_TRUE(*a.gradient_flow);
  const SeriesFile file(path);
  ASSERT_EQ(file.frames(), 31u);
  const auto stored = file.observable("n_clusters", 0);
  std::vector<std::size_t> all(32);
  std::iota(all.begin(), all.end(), 0);
  for (std::size_t f = 0; f < file.frames(); ++f) {
    const auto x = file.positions(f, 0);
    EXPECT_EQ(stored[f], double(pair_statistics(x.data(), 3, all).clusters)) << "frame " << f;
  }
  const auto json = check_json(path,
                               "assert d['collapsed'] is True and d['final_clusters'] == 1\n"
                               "assert d['status'] == 'complete' and d['energy_monotone'] is True\n"
                               "assert 0 < d['collapse_time'] < 20");
  EXPECT_EQ(json.exit_code, 0) << json.output;
}

// A RoPE file carries conditional_spread and the moment eigenvalues as [T, d]; analyze reports
// the conditional spread near 0 while the marginal spread stays large.
TEST(Analyze, RopeRunCarriesTheConditionalSpread) {
  const auto dir = scratch_dir("analyze_rope");
  const std::string path = (dir / "rope.h5").string();
  const auto run = run_mfattn("run --n 64 --d 3 --geometry rope --horizon 20 --save-every 5 --quiet --out " + path);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const SeriesFile file(path);
  for (const std::string name : {"energy", "mean_inner", "min_inner", "max_speed", "clustered_pair_fraction",
                                 "n_clusters", "order_parameter", "moment_eigenvalues", "effective_rank",
                                 "marginal_spread", "conditional_spread"})
    EXPECT_TRUE(file.has_observable(name)) << name;
  std::size_t components = 0;
  const auto eigenvalues = file.observable("moment_eigenvalues", 0, &components);
  EXPECT_EQ(components, 3u);
  EXPECT_EQ(eigenvalues.size(), 3 * file.frames());
  const Analysis a = analyze_file(path);
  ASSERT_TRUE(a.conditional_spread_final.has_value());
  EXPECT_LT(*a.conditional_spread_final, 1e-6);
  EXPECT_GT(a.marginal_spread_final, 0.05);
  EXPECT_FALSE(a.collapsed);
  const auto text = run_mfattn("analyze " + path);
  EXPECT_NE(text.output.find("conditional_spread_final  "), std::string::npos) << text.output;
}

}  // namespace
}  // namespace mfattn
