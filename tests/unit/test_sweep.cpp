// mfattn sweep: grid expansion, case ids, refusal of bad sweep files, skipping done cases,
// recovery from a SIGKILL, shards, concurrent sweeps, the manifest and MPI ranks.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "mfattn/io/h5md.hpp"
#include "mfattn/sweep/sweep.hpp"
#include "test_support.hpp"

namespace mfattn {
namespace {

namespace fs = std::filesystem;
using testing::run_mfattn;
using testing::scratch_dir;

void write_text(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

/// (verb, case id) of every case line of a sweep's output: "mfattn sweep: run <id> ...",
/// "mfattn sweep[rank 1]: skip <id> ...".
std::vector<std::pair<std::string, std::string>> case_events(const std::string& output) {
  std::vector<std::pair<std::string, std::string>> events;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("mfattn sweep", 0) != 0) continue;
    const auto colon = line.find(": ");
    if (colon == std::string::npos) continue;
    std::istringstream words(line.substr(colon + 2));
    std::string verb, id;
    words >> verb >> id;
    if (id.size() == 16 && id.find_first_not_of("0123456789abcdef") == std::string::npos) events.emplace_back(verb, id);
  }
  return events;
}

std::map<std::string, int> count_of(const std::string& output, const std::string& verb) {
  std::map<std::string, int> counts;
  for (const auto& [v, id] : case_events(output))
    if (v == verb) ++counts[id];
  return counts;
}

/// Rows of a manifest.csv (fields split at commas: the tests' values hold none).
std::vector<std::vector<std::string>> read_csv(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::vector<std::string>> rows;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::vector<std::string> fields;
    std::istringstream cells(line);
    for (std::string cell; std::getline(cells, cell, ',');) fields.push_back(cell);
    rows.push_back(fields);
  }
  return rows;
}

std::size_t column(const std::vector<std::string>& header, const std::string& name) {
  const auto at = std::find(header.begin(), header.end(), name);
  return at == header.end() ? header.size() : static_cast<std::size_t>(at - header.begin());
}

/// Modification time (ns) and inode of a file: both stay when the file is not touched.
std::pair<long long, unsigned long long> stamp(const fs::path& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return {-1, 0};
  return {static_cast<long long>(info.st_mtim.tv_sec) * 1000000000LL + info.st_mtim.tv_nsec,
          static_cast<unsigned long long>(info.st_ino)};
}

std::string status_of(const fs::path& file) {
  for (const auto& [key, value] : describe_file(file.string()).run)
    if (key == "status") return value;
  return "<none>";
}

std::size_t count_files(const fs::path& dir, const std::string& suffix) {
  std::size_t count = 0;
  std::error_code ignored;
  for (const auto& entry : fs::directory_iterator(dir, ignored)) {
    const std::string name = entry.path().filename().string();
    count += name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  }
  return count;
}


constexpr const char* kTinyBase =
    "# tiny cases\n"
    "[base]\n"
    "d = 3\n"
    "horizon = 0.2\n"
    "save-every = 0.05\n"
    "threads = 1\n";

TEST(Sweep, ExpansionCoversTheGridOnceWithStableIds) {
  const std::string text = std::string(kTinyBase) +
                           "[axes]\n"
                           "kernel = usa sa\n"
                           "n = 8 12 16\n"
                           "seed = 0 1\n";
  const SweepPlan plan = make_sweep(text, "grid.ini");
  ASSERT_EQ(plan.axes.size(), 3u);
  ASSERT_EQ(plan.cases.size(), 12u);
  EXPECT_TRUE(plan.sets_threads);
  std::set<std::vector<std::string>> combinations;
  std::set<std::string> ids;
  for (std::size_t i = 0; i < plan.cases.size(); ++i) {
    const SweepCase& c = plan.cases[i];
    EXPECT_EQ(c.index, i);
    combinations.insert(c.values);
    ids.insert(c.id);
    EXPECT_EQ(c.id.size(), 16u);
    EXPECT_EQ(c.id.find_first_not_of("0123456789abcdef"), std::string::npos);
    // The case's arguments resolve to the values of its axes.
    auto args = c.arguments;
    args.insert(args.end(), {"--out", "x.h5"});
    const RunConfig cfg = parse_run_arguments(args);
    EXPECT_EQ(cfg.kernel, c.values[0]);
    EXPECT_EQ(std::to_string(cfg.n), c.values[1]);
    EXPECT_EQ(std::to_string(cfg.seed), c.values[2]);
    EXPECT_EQ(cfg.d, 3);
    EXPECT_EQ(cfg.horizon, 0.2);
    EXPECT_EQ(case_id(cfg), c.id);
  }
  EXPECT_EQ(combinations.size(), 12u);
  EXPECT_EQ(ids.size(), 12u);
  // Axes in file order, last axis fastest.
  EXPECT_EQ(plan.cases[0].values, (std::vector<std::string>{"usa", "8", "0"}));
  EXPECT_EQ(plan.cases[1].values, (std::vector<std::string>{"usa", "8", "1"}));
  EXPECT_EQ(plan.cases[2].values, (std::vector<std::string>{"usa", "12", "0"}));
  EXPECT_EQ(plan.cases[11].values, (std::vector<std::string>{"sa", "16", "1"}));

  // Stable: the same file again, the axes in another order, a value moved into the base, a
  // different thread count or section names all give the same ids.
  const SweepPlan again = make_sweep(text, "grid.ini");
  for (std::size_t i = 0; i < plan.cases.size(); ++i) EXPECT_EQ(again.cases[i].id, plan.cases[i].id);
  const SweepPlan reordered = make_sweep(
      "[model]\nd = 3\n[stepping]\nhorizon = 0.2\nsave-every = 0.05\n[run]\nthreads = 2\n"
      "[axes]\nseed = 0 1\nn = 8 12 16\nkernel = usa sa\n",
      "other.ini");
  std::set<std::string> reordered_ids;
  for (const auto& c : reordered.cases) reordered_ids.insert(c.id);
  EXPECT_EQ(reordered_ids, ids);
  const SweepPlan single = make_sweep(std::string(kTinyBase) + "n = 12\nseed = 1\n[axes]\nkernel = sa\n", "one.ini");
  ASSERT_EQ(single.cases.size(), 1u);
  EXPECT_TRUE(ids.count(single.cases[0].id));
  // Ids are pinned: the hash of the non-default parameters (d = 3 is the default), sorted.
  EXPECT_EQ(single.cases[0].id, plan.cases[9].id);
  char expected[17];
  std::snprintf(expected, sizeof expected, "%016llx",
                static_cast<unsigned long long>(
                    fnv1a64("horizon=0.2\nkernel=sa\nn=12\nsave-every=0.05\nseed=1\n")));
  EXPECT_EQ(single.cases[0].id, expected);

  // A file without axes is one case.
  EXPECT_EQ(make_sweep(kTinyBase, "base.ini").cases.size(), 1u);
}

TEST(Sweep, IdHashesTheNonDefaultTrajectoryParameters) {
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ULL);
  const RunConfig cfg =
      parse_run_arguments({"--n", "8", "--beta", "0.1", "--threads", "3", "--quiet", "--out", "a.h5"});
  EXPECT_EQ(id_parameters(cfg), (std::vector<std::string>{"beta=0.1", "n=8"}));
  // Execution options do not change the id; the seed, the backend and every model option do.
  const RunConfig same = parse_run_arguments({"--n", "8", "--beta", "0.1", "--threads", "1", "--out", "b.h5"});
  EXPECT_EQ(case_id(cfg), case_id(same));
  for (const auto& changed : std::vector<std::vector<std::string>>{
           {"--n", "8", "--beta", "0.1", "--seed", "1"},
           {"--n", "8", "--beta", "0.1", "--backend", "reference"},
           {"--n", "9", "--beta", "0.1"},
           {"--n", "8", "--beta", "0.10000000000000002"},
           {"--n", "8", "--beta", "0.1", "--deflate"}}) {
    auto args = changed;
    args.insert(args.end(), {"--out", "c.h5"});
    EXPECT_NE(case_id(parse_run_arguments(args)), case_id(cfg)) << changed.back();
  }
}

// option_role is the one rule for both: the case id leaves out exactly the Execution
// options, --resume lets exactly the Extent and Execution options change (docs/cli.md).
// Every option of the run table has a role; horizon and save-every are Extent: two runs to
// different horizons are different cases, and a resumed run may go further or write frames
// at another spacing.
TEST(Sweep, OptionRolesDecideCaseIdsAndResume) {
  RunConfig scratch;
  const auto table = run_options(scratch);
  std::set<std::string> extent, execution;
  for (const auto& option : table.options()) {
    const std::string name = option->long_name();
    if (option_role(name) == OptionRole::Extent) extent.insert(name);
    if (option_role(name) == OptionRole::Execution) execution.insert(name);
  }
  EXPECT_EQ(extent, (std::set<std::string>{"horizon", "save-every"}));
  EXPECT_EQ(execution, (std::set<std::string>{"threads", "out", "config", "quiet", "overwrite", "resume",
                                             "flush-interval"}));
  auto id_of = [](const std::string& horizon, const std::string& save_every,
                  std::vector<std::string> extra) {
    std::vector<std::string> args = {"--n", "8", "--horizon", horizon, "--save-every", save_every};
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {"--out", "a.h5"});
    return case_id(parse_run_arguments(args));
  };
  const std::string id = id_of("1", "0.5", {});
  EXPECT_NE(id_of("2", "0.5", {}), id);
  EXPECT_NE(id_of("1", "0.25", {}), id);
  EXPECT_EQ(id_of("1", "0.5", {"--threads", "2", "--quiet", "--overwrite"}), id);
  const auto dir = testing::scratch_dir("option_roles");
  const std::string out = (dir / "run.h5").string();
  ASSERT_EQ(testing::run_mfattn("run --n 8 --horizon 1 --save-every 0.5 --quiet --out " + out).exit_code, 0);
  const auto further = testing::run_mfattn(
      "run --n 8 --horizon 2 --save-every 0.25 --threads 1 --resume --quiet --out " + out);
  EXPECT_EQ(further.exit_code, 0) << further.output;
  const auto reseeded = testing::run_mfattn("run --n 8 --horizon 3 --seed 5 --resume --quiet --out " + out);
  EXPECT_EQ(reseeded.exit_code, 2);
  EXPECT_NE(reseeded.output.find("--seed"), std::string::npos) << reseeded.output;
}

TEST(Sweep, ShardsAndRanksSplitTheGrid) {
  const std::size_t cases = 10;
  std::vector<int> seen(cases, 0);
  for (std::size_t s = 0; s < 3; ++s)
    for (int rank = 0; rank < 2; ++rank)
      for (const std::size_t index : assigned_cases(cases, Shard{s, 3}, rank, 2)) {
        EXPECT_EQ(index % 3, s);
        ++seen[index];
      }
  for (std::size_t i = 0; i < cases; ++i) EXPECT_EQ(seen[i], 1) << "case " << i;
  EXPECT_EQ(assigned_cases(5, Shard{}), (std::vector<std::size_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(parse_shard("2/5").index, 2u);
  EXPECT_EQ(parse_shard("2/5").count, 5u);
  for (const char* bad : {"5/5", "1", "-1/3", "a/b", "1/0", "1/"}) EXPECT_THROW(parse_shard(bad), UsageError) << bad;

  // Slurm array tasks: --array=1-4 has MIN 1, so task 3 is shard 2 of 4; --array=0-6:2 has
  // STEP 2, so task 4 is shard 2 of 4.
  ::setenv("SLURM_ARRAY_TASK_ID", "3", 1);
  ::setenv("SLURM_ARRAY_TASK_COUNT", "4", 1);
  ::setenv("SLURM_ARRAY_TASK_MIN", "1", 1);
  auto shard = slurm_shard();
  ASSERT_TRUE(shard.has_value());
  EXPECT_EQ(shard->index, 2u);
  EXPECT_EQ(shard->count, 4u);
  ::setenv("SLURM_ARRAY_TASK_ID", "4", 1);
  ::setenv("SLURM_ARRAY_TASK_MIN", "0", 1);
  ::setenv("SLURM_ARRAY_TASK_STEP", "2", 1);
  shard = slurm_shard();
  ASSERT_TRUE(shard.has_value());
  EXPECT_EQ(shard->index, 2u);
  ::setenv("SLURM_ARRAY_TASK_ID", "9", 1);
  EXPECT_THROW(slurm_shard(), UsageError);
  // --shard wins over the Slurm variables.
  EXPECT_EQ(parse_sweep_arguments({"--config", "x.ini", "--shard", "1/2"}).shard->index, 1u);
  for (const char* name : {"SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_STEP"})
    ::unsetenv(name);
  EXPECT_FALSE(slurm_shard().has_value());
  EXPECT_EQ(parse_sweep_arguments({"--config", "dir/grid.ini"}).out_dir, "dir/grid");
}

TEST(Sweep, CsvFieldsAreQuotedPerRfc4180) {
  EXPECT_EQ(csv_field("plain"), "plain");
  EXPECT_EQ(csv_field("a,b"), "\"a,b\"");
  EXPECT_EQ(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(csv_field("two\nlines"), "\"two\nlines\"");
  EXPECT_EQ(csv_field(""), "");
}

TEST(Sweep, BadSweepFileRunsNothing) {
  const auto dir = scratch_dir("sweep_bad");
  const std::vector<std::tuple<std::string, std::string, std::vector<std::string>>> cases = {
      {"unknown_key", std::string(kTinyBase) + "[model]\nbogus = 3\n[axes]\nn = 8 12\n", {"bogus"}},
      {"unknown_axis", std::string(kTinyBase) + "[axes]\nn = 8 12\nbogus = 1 2\n", {"axis bogus"}},
      {"bad_value", std::string(kTinyBase) + "[axes]\nkernel = usa sa\nn = 8 -3 12\n", {"axis n value -3", "--n -3"}},
      {"bad_word", std::string(kTinyBase) + "[axes]\nn = 8 ten\n", {"axis n value ten"}},
      {"empty_axis", std::string(kTinyBase) + "[axes]\nkernel = usa sa\nn =\n", {"axis n", "no values"}},
      {"duplicate_axis", std::string(kTinyBase) + "[axes]\nn = 8\nn = 12\n", {"axis n", "twice"}},
      {"reserved_axis", std::string(kTinyBase) + "[axes]\nout = a.h5 b.h5\n", {"axis out"}},
      {"same_case_twice", std::string(kTinyBase) + "[axes]\nbeta = 1 1.0\n", {"axis beta value 1.0"}},
      {"combination", std::string(kTinyBase) + "[axes]\nkernel = usa sa\naux-factor = none cosine\n",
       {"axis aux-factor value cosine"}},
  };
  for (const auto& [name, text, expected] : cases) {
    const fs::path file = dir / (name + ".ini");
    write_text(file, text);
    const fs::path out = dir / ("out_" + name);
    const auto result = run_mfattn("sweep --config " + file.string() + " --out-dir " + out.string());
    EXPECT_EQ(result.exit_code, kExitUsage) << name << ": " << result.output;
    EXPECT_EQ(std::count(result.output.begin(), result.output.end(), '\n'), 1) << name << ": " << result.output;
    EXPECT_EQ(result.output.rfind("mfattn sweep: ", 0), 0u) << name << ": " << result.output;
    for (const auto& part : expected) EXPECT_NE(result.output.find(part), std::string::npos) << name << ": " << result.output;
    EXPECT_FALSE(fs::exists(out)) << name;
  }
  // Bad options of the command itself.
  write_text(dir / "ok.ini", std::string(kTinyBase) + "[axes]\nn = 8\n");
  for (const std::string args :
       {"--jobs 0", "--shard 3/3", "--shard x", "--bogus 1", "--threads 0", "--threads 5000"}) {
    const auto result = run_mfattn("sweep --config " + (dir / "ok.ini").string() + " --out-dir " +
                                   (dir / "out_opts").string() + " " + args);
    EXPECT_EQ(result.exit_code, kExitUsage) << args << ": " << result.output;
    EXPECT_FALSE(fs::exists(dir / "out_opts")) << args;
  }
  EXPECT_EQ(run_mfattn("sweep --out-dir " + (dir / "out_opts").string()).exit_code, kExitUsage);
  fs::remove_all(dir);
}

// --threads T sets each case's threads (the start line says so); a sweep file that sets threads
// itself refuses it with one line, before anything runs.
TEST(Sweep, ThreadsOptionSetsEachCasesThreads) {
  const auto dir = scratch_dir("sweep_threads");
  std::string base = kTinyBase;
  base.erase(base.find("threads = 1\n"), std::string("threads = 1\n").size());
  write_text(dir / "grid.ini", base + "[axes]\nseed = 0 1\n");
  const auto done = run_mfattn("sweep --config " + (dir / "grid.ini").string() + " --out-dir " +
                               (dir / "out").string() + " --jobs 2 --threads 1");
  ASSERT_EQ(done.exit_code, 0) << done.output;
  EXPECT_NE(done.output.find("--jobs 2, 1 thread per case"), std::string::npos) << done.output;
  write_text(dir / "own.ini",
             std::string(kTinyBase) + "[axes]\nseed = 0 1\n");  // its base sets threads
  const auto refused = run_mfattn("sweep --config " + (dir / "own.ini").string() + " --out-dir " +
                                  (dir / "own").string() + " --threads 1");
  EXPECT_EQ(refused.exit_code, kExitUsage) << refused.output;
  EXPECT_NE(
      refused.output.find("--threads 1: " + (dir / "own.ini").string() + " sets threads itself"),
      std::string::npos)
      << refused.output;
  EXPECT_EQ(std::count(refused.output.begin(), refused.output.end(), '\n'), 1) << refused.output;
  EXPECT_FALSE(fs::exists(dir / "own"));
  fs::remove_all(dir);
}

// Every case that has a file is found by its parameters too: by-parameters/<axis=value_...>.h5
// links to its hashed file; characters outside [A-Za-z0-9.,=+_-] become '-', and names that
// then coincide get the case id appended.
TEST(Sweep, CasesAreLinkedByTheirParameters) {
  const auto dir = scratch_dir("sweep_links");
  write_text(dir / "grid.ini", std::string(kTinyBase) + "[axes]\nkernel = usa sa\nseed = 0 1\n");
  ASSERT_EQ(run_mfattn("sweep --config " + (dir / "grid.ini").string() + " --out-dir " +
                       (dir / "out").string())
                .exit_code,
            0);
  const SweepPlan plan = load_sweep((dir / "grid.ini").string());
  for (const auto& c : plan.cases) {
    const fs::path link = dir / "out" / "by-parameters" /
                          ("kernel=" + c.values[0] + "_seed=" + c.values[1] + ".h5");
    ASSERT_TRUE(fs::is_symlink(link)) << link;
    EXPECT_EQ(fs::read_symlink(link), fs::path("..") / (c.id + ".h5"));
    EXPECT_TRUE(fs::equivalent(link, dir / "out" / (c.id + ".h5")));
  }
  // Two start files whose paths clean to one name ("sub/a.txt" and "sub-a.txt"): each its id.
  fs::create_directories(dir / "sub");
  write_text(dir / "sub" / "a.txt", "1 0 0\n0 1 0\n");
  write_text(dir / "sub-a.txt", "0 0 1\n0 1 0\n");
  write_text(dir / "odd.ini", std::string(kTinyBase) + "n = 2\ninit = file\n[axes]\ninit-file = " +
                                  (dir / "sub" / "a.txt").string() + " " +
                                  (dir / "sub-a.txt").string() + "\n");
  const auto odd = run_mfattn("sweep --config " + (dir / "odd.ini").string() + " --out-dir " +
                              (dir / "odd").string());
  ASSERT_EQ(odd.exit_code, 0) << odd.output;
  const SweepPlan odd_plan = load_sweep((dir / "odd.ini").string());
  ASSERT_EQ(odd_plan.cases.size(), 2u);
  for (const auto& c : odd_plan.cases) {
    std::string name = "init-file=" + (dir / "sub-a.txt").string();
    for (char& ch : name)
      if (ch == '/') ch = '-';
    const fs::path link = dir / "odd" / "by-parameters" / (name + "_" + c.id + ".h5");
    EXPECT_TRUE(fs::is_symlink(link)) << link;
  }
  fs::remove_all(dir);
}

TEST(Sweep, RerunSkipsDoneCasesWithoutTouchingThemAndWritesTheManifest) {
  const auto dir = scratch_dir("sweep_rerun");
  const fs::path file = dir / "grid.ini";
  write_text(file, std::string(kTinyBase) + "[axes]\nkernel = usa sa\nseed = 0 1\n");
  const fs::path out = dir / "out";
  const auto first = run_mfattn("sweep --config " + file.string() + " --out-dir " + out.string() + " --jobs 2");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const SweepPlan plan = load_sweep(file.string());
  ASSERT_EQ(plan.cases.size(), 4u);
  EXPECT_EQ(count_of(first.output, "run").size(), 4u) << first.output;
  std::map<std::string, std::pair<long long, unsigned long long>> stamps;
  for (const auto& c : plan.cases) {
    const fs::path h5 = out / (c.id + ".h5");
    ASSERT_TRUE(fs::exists(h5)) << first.output;
    EXPECT_EQ(status_of(h5), "complete");
    EXPECT_TRUE(fs::exists(out / (c.id + ".log")));
    stamps[c.id] = stamp(h5);
  }
  EXPECT_EQ(count_files(out, ".part"), 0u);
  EXPECT_EQ(count_files(out, ".lock"), 0u);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));

  const auto second = run_mfattn("sweep --config " + file.string() + " --out-dir " + out.string() + " --jobs 2");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("0 ran, 4 skipped (complete)"), std::string::npos) << second.output;
  EXPECT_TRUE(count_of(second.output, "run").empty()) << second.output;
  EXPECT_EQ(count_of(second.output, "skip").size(), 4u) << second.output;
  for (const auto& c : plan.cases) EXPECT_EQ(stamp(out / (c.id + ".h5")), stamps[c.id]) << c.id;

  // The manifest: one row per case, its axis values, complete, and final observables.
  const auto rows = read_csv(out / "manifest.csv");
  ASSERT_EQ(rows.size(), 5u);
  const auto& header = rows[0];
  EXPECT_EQ(std::vector<std::string>(header.begin(), header.begin() + 7),
            (std::vector<std::string>{"index", "case_id", "file", "status", "kernel", "seed", "final_time"}));
  const std::size_t min_inner = column(header, "min_inner");
  ASSERT_LT(min_inner, header.size());
  EXPECT_LT(column(header, "moment_eigenvalues[2]"), header.size());
  for (std::size_t i = 0; i < 4; ++i) {
    const auto& row = rows[i + 1];
    ASSERT_EQ(row.size(), header.size());
    EXPECT_EQ(row[1], plan.cases[i].id);
    EXPECT_EQ(row[2], plan.cases[i].id + ".h5");
    EXPECT_EQ(row[3], "complete");
    EXPECT_EQ(row[4], plan.cases[i].values[0]);
    EXPECT_EQ(row[5], plan.cases[i].values[1]);
    EXPECT_DOUBLE_EQ(std::stod(row[6]), 0.2);
    const double value = std::stod(row[min_inner]);
    EXPECT_TRUE(value >= -1.0 && value <= 1.0) << value;
  }
  std::ifstream json_file(out / "manifest.json");
  const std::string json((std::istreambuf_iterator<char>(json_file)), std::istreambuf_iterator<char>());
  for (const auto& c : plan.cases) {
    const std::string key = "\"case_id\": \"" + c.id + "\"";
    EXPECT_NE(json.find(key), std::string::npos);
    EXPECT_EQ(json.find(key), json.rfind(key));
  }
  EXPECT_NE(json.find("\"min_inner\": "), std::string::npos);
  fs::remove_all(dir);
}

TEST(Sweep, KilledSweepCompletesOnRerunAndRunsEachCaseOnce) {
  const auto dir = scratch_dir("sweep_kill");
  const fs::path file = dir / "kill.ini";
  // Case 0 is quick, case 1 takes a few seconds, case 2 never starts before the kill.
  write_text(file, "[base]\nd = 3\nhorizon = 20\nsave-every = 0.5\nthreads = 1\n[axes]\nn = 8 500 12\n");
  const fs::path out = dir / "out";
  const SweepPlan plan = load_sweep(file.string());
  ASSERT_EQ(plan.cases.size(), 3u);
  const std::string id0 = plan.cases[0].id, id1 = plan.cases[1].id, id2 = plan.cases[2].id;

  const std::string binary = MFATTN_BINARY, log = (dir / "killed.txt").string();
  std::vector<std::string> args = {binary, "sweep", "--config", file.string(), "--out-dir", out.string()};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setpgid(0, 0);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  // SIGKILL the sweep's process group once case 1 is writing: that is the sweep alone (its
  // cases run in process groups of their own), so case 1 has to die with it by itself.
  const fs::path part1 = out / (id1 + ".h5.part");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!(fs::exists(out / (id0 + ".h5")) && fs::exists(part1)) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(fs::exists(part1)) << "case 1 never started";
  ::kill(-pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the sweep ended before the kill; make case 1 longer";
  ASSERT_TRUE(fs::exists(out / (id0 + ".h5")));
  EXPECT_EQ(status_of(out / (id0 + ".h5")), "complete");
  EXPECT_FALSE(fs::exists(out / (id1 + ".h5"))) << "a half file under the final name";
  EXPECT_TRUE(fs::exists(part1));
  EXPECT_FALSE(fs::exists(out / (id2 + ".h5")));
  const auto before = stamp(out / (id0 + ".h5"));
  // Case 1 gets SIGTERM when its sweep dies and ends: its lock goes with it (how soon depends
  // on the load, so poll), and nothing reports the case as running.
  const auto released = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (case_status(out.string(), id1).state == CaseStatus::State::Running &&
         std::chrono::steady_clock::now() < released)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_NE(case_status(out.string(), id1).state, CaseStatus::State::Running) << "case 1 outlived its sweep";

  // The rerun completes every case in one pass (were case 1 still held, it would wait for it).
  const auto rerun = run_mfattn("sweep --config " + file.string() + " --out-dir " + out.string());
  ASSERT_EQ(rerun.exit_code, 0) << rerun.output;
  EXPECT_NE(rerun.output.find("0 failed, 0 undone"), std::string::npos) << rerun.output;
  EXPECT_EQ(count_of(rerun.output, "skip"), (std::map<std::string, int>{{id0, 1}})) << rerun.output;
  EXPECT_EQ(count_of(rerun.output, "run"), (std::map<std::string, int>{{id1, 1}, {id2, 1}})) << rerun.output;
  EXPECT_EQ(stamp(out / (id0 + ".h5")), before);
  for (const auto& c : plan.cases) EXPECT_EQ(status_of(out / (c.id + ".h5")), "complete");
  EXPECT_EQ(count_files(out, ".part"), 0u);
  EXPECT_EQ(count_files(out, ".lock"), 0u);
  const auto rows = read_csv(out / "manifest.csv");
  ASSERT_EQ(rows.size(), 4u);
  for (std::size_t i = 1; i < rows.size(); ++i) EXPECT_EQ(rows[i][3], "complete");
  fs::remove_all(dir);
}

TEST(Sweep, ResumeContinuesAnInterruptedCaseAndPlainRerunsRestartIt) {
  const auto dir = scratch_dir("sweep_resume");
  const fs::path file = dir / "resume.ini";
  write_text(file, "[base]\nn = 12\nd = 3\nhorizon = 1\nsave-every = 0.1\nthreads = 1\n[axes]\nseed = 3 4\n");
  const fs::path out = dir / "out";
  fs::create_directories(out);
  const SweepPlan plan = load_sweep(file.string());
  // An interrupted case: the same options up to t = 0.5 only.
  auto make_part = [&](const SweepCase& c) {
    std::string args;
    for (const auto& a : c.arguments)
      if (a.rfind("--horizon=", 0) != 0) args += " " + a;
    const auto made = run_mfattn("run" + args + " --horizon 0.5 --quiet --out " + (out / (c.id + ".h5.part")).string());
    ASSERT_EQ(made.exit_code, 0) << made.output;
  };
  make_part(plan.cases[0]);
  const auto resumed = run_mfattn("sweep --resume --config " + file.string() + " --out-dir " + out.string());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(count_of(resumed.output, "resume"), (std::map<std::string, int>{{plan.cases[0].id, 1}})) << resumed.output;
  EXPECT_EQ(count_of(resumed.output, "run"), (std::map<std::string, int>{{plan.cases[1].id, 1}})) << resumed.output;
  const FileSummary summary = describe_file((out / (plan.cases[0].id + ".h5")).string());
  EXPECT_EQ(summary.last_time, 1.0);
  bool continued = false;
  for (const auto& [key, value] : summary.parameters) continued = continued || (key == "resumed_from_time" && value == "0.5");
  EXPECT_TRUE(continued) << "the case was not continued from t = 0.5";

  // Without --resume a stale .part is deleted and the case starts over.
  fs::remove(out / (plan.cases[1].id + ".h5"));
  make_part(plan.cases[1]);
  const auto restarted = run_mfattn("sweep --config " + file.string() + " --out-dir " + out.string());
  ASSERT_EQ(restarted.exit_code, 0) << restarted.output;
  EXPECT_EQ(count_of(restarted.output, "run"), (std::map<std::string, int>{{plan.cases[1].id, 1}})) << restarted.output;
  for (const auto& [key, value] : describe_file((out / (plan.cases[1].id + ".h5")).string()).parameters)
    EXPECT_NE(key, "resumed_from_time");
  EXPECT_EQ(count_files(out, ".part"), 0u);
  fs::remove_all(dir);
}

TEST(Sweep, ShardsIntoOneFolderAreDisjointAndCoverTheGrid) {
  const auto dir = scratch_dir("sweep_shards");
  const fs::path file = dir / "grid.ini";
  write_text(file, std::string(kTinyBase) + "[axes]\nkernel = usa sa\nn = 8 12\nseed = 0 1\n");
  const fs::path out = dir / "out";
  const SweepPlan plan = load_sweep(file.string());
  ASSERT_EQ(plan.cases.size(), 8u);
  std::map<std::string, int> runs;
  for (int s = 0; s < 3; ++s) {
    const auto result = run_mfattn("sweep --config " + file.string() + " --out-dir " + out.string() + " --shard " +
                                   std::to_string(s) + "/3");
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const auto mine = count_of(result.output, "run");
    EXPECT_TRUE(count_of(result.output, "skip").empty()) << result.output;
    for (const auto& [id, count] : mine) {
      runs[id] += count;
      std::size_t index = plan.cases.size();
      for (const auto& c : plan.cases)
        if (c.id == id) index = c.index;
      EXPECT_EQ(index % 3, static_cast<std::size_t>(s)) << id;
    }
  }
  ASSERT_EQ(runs.size(), 8u);
  for (const auto& [id, count] : runs) EXPECT_EQ(count, 1) << id;
  const auto rows = read_csv(out / "manifest.csv");
  ASSERT_EQ(rows.size(), 9u);
  std::set<std::string> listed;
  for (std::size_t i = 1; i < rows.size(); ++i) {
    listed.insert(rows[i][1]);
    EXPECT_EQ(rows[i][3], "complete") << rows[i][1];
  }
  EXPECT_EQ(listed.size(), 8u);
  fs::remove_all(dir);
}

TEST(Sweep, ConcurrentSweepsShareTheWorkThroughLocks) {
  const auto dir = scratch_dir("sweep_concurrent");
  const fs::path file = dir / "grid.ini";
  write_text(file, "[base]\nn = 160\nd = 3\nhorizon = 4\nsave-every = 1\nthreads = 1\n[axes]\nseed = 0 1 2 3\n");
  const fs::path out = dir / "out";
  const std::string command =
      std::string(MFATTN_BINARY) + " sweep --config " + file.string() + " --out-dir " + out.string() + " 2>&1";
  FILE* a = ::popen(command.c_str(), "r");
  FILE* b = ::popen(command.c_str(), "r");
  ASSERT_TRUE(a && b);
  std::string output;
  char buffer[4096];
  for (FILE* pipe : {a, b}) {
    while (std::fgets(buffer, sizeof buffer, pipe)) output += buffer;
    EXPECT_EQ(::pclose(pipe), 0) << output;
  }
  const SweepPlan plan = load_sweep(file.string());
  const auto runs = count_of(output, "run");
  ASSERT_EQ(runs.size(), 4u) << output;
  for (const auto& [id, count] : runs) EXPECT_EQ(count, 1) << id << "\n" << output;
  for (const auto& c : plan.cases) EXPECT_EQ(status_of(out / (c.id + ".h5")), "complete");
  fs::remove_all(dir);
}

TEST(Sweep, FailedCaseIsReportedInTheManifestAndRetried) {
  const auto dir = scratch_dir("sweep_failed");
  // Three unit rows: n = 3 runs, n = 4 passes validation but the run refuses the file.
  write_text(dir / "init.txt", "1 0 0\n0 1 0\n0 0 1\n");
  const fs::path file = dir / "grid.ini";
  write_text(file, std::string(kTinyBase) + "init = file\ninit-file = " + (dir / "init.txt").string() +
                       "\n[axes]\nn = 3 4\n");
  const fs::path out = dir / "out";
  const SweepPlan plan = load_sweep(file.string());
  auto result = run_mfattn("sweep --config " + file.string() + " --out-dir " + out.string());
  EXPECT_EQ(result.exit_code, kExitUsage) << result.output;
  EXPECT_EQ(count_of(result.output, "failed"), (std::map<std::string, int>{{plan.cases[1].id, 1}})) << result.output;
  EXPECT_EQ(status_of(out / (plan.cases[0].id + ".h5")), "complete");
  EXPECT_FALSE(fs::exists(out / (plan.cases[1].id + ".h5")));
  EXPECT_EQ(count_files(out, ".part"), 0u);
  auto rows = read_csv(out / "manifest.csv");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[1][3], "complete");
  EXPECT_EQ(rows[2][3].rfind("failed: exit code 2", 0), 0u) << rows[2][3];
  // A rerun tries the failed case again (and only it).
  result = run_mfattn("sweep --config " + file.string() + " --out-dir " + out.string());
  EXPECT_EQ(result.exit_code, kExitUsage);
  EXPECT_EQ(count_of(result.output, "run"), (std::map<std::string, int>{{plan.cases[1].id, 1}})) << result.output;
  fs::remove_all(dir);
}

TEST(Sweep, MpiRanksRunEveryCaseOnce) {
  const char* required = std::getenv("MFATTN_REQUIRE_MPI");
  const bool require = required && std::string(required) == "1";
  if (!sweep_built_with_mpi()) {
    if (require)
      FAIL() << "MFATTN_REQUIRE_MPI=1 but this build has no MPI: install openmpi-bin and libopenmpi-dev and "
                "configure again with MFATTN_MPI=ON (the default; it turns itself off when CMake finds no MPI)";
    GTEST_SKIP() << "built without MPI (CMake option MFATTN_MPI off, or no MPI found); set MFATTN_REQUIRE_MPI=1 to make this a failure";
  }
  if (testing::run_shell("command -v mpirun").exit_code != 0) {
    if (require) FAIL() << "MFATTN_REQUIRE_MPI=1 but mpirun is not on PATH (install openmpi-bin)";
    GTEST_SKIP() << "mpirun is not on PATH";
  }
  const auto dir = scratch_dir("sweep_mpi");
  const fs::path file = dir / "grid.ini";
  write_text(file, std::string(kTinyBase) + "[axes]\nkernel = usa sa\nseed = 0 1 2\n");
  const fs::path out = dir / "out";
  const SweepPlan plan = load_sweep(file.string());
  const std::string sweep =
      std::string(MFATTN_BINARY) + " sweep --config " + file.string() + " --out-dir " + out.string();
  const auto result = testing::run_shell("mpirun --allow-run-as-root --oversubscribe -n 2 " + sweep);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto runs = count_of(result.output, "run");
  ASSERT_EQ(runs.size(), plan.cases.size()) << result.output;
  for (const auto& [id, count] : runs) EXPECT_EQ(count, 1) << id << "\n" << result.output;
  EXPECT_NE(result.output.find("mfattn sweep[rank 0]: run"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("mfattn sweep[rank 1]: run"), std::string::npos) << result.output;
  // Rank 0 alone wrote the manifest, after every rank finished.
  EXPECT_NE(result.output.find("mfattn sweep[rank 0]: manifest"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("mfattn sweep[rank 1]: manifest"), std::string::npos) << result.output;
  const auto rows = read_csv(out / "manifest.csv");
  ASSERT_EQ(rows.size(), plan.cases.size() + 1);
  for (std::size_t i = 1; i < rows.size(); ++i) EXPECT_EQ(rows[i][3], "complete");
  // Without a launcher the MPI build still runs as one process (here forced to initialise
  // MPI as a singleton): everything is done, so everything is skipped.
  const auto single = testing::run_shell("MFATTN_SWEEP_MPI=1 " + sweep);
  EXPECT_EQ(single.exit_code, 0) << single.output;
  EXPECT_EQ(count_of(single.output, "skip").size(), plan.cases.size()) << single.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mfattn
