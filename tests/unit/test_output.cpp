// Run reliability of the output: resume, SIGKILL, config files, info.
#include <hdf5.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <type_traits>

#include "mfattn/core/gauge.hpp"
#include "mfattn/io/h5md.hpp"
#include "test_support.hpp"

namespace mfattn {
namespace {

using testing::run_mfattn;
using testing::scratch_dir;

/// The raw bytes of a dataset (empty if it does not exist).
std::string dataset_bytes(const std::string& path, const std::string& name) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) return {};
  std::string bytes;
  const hid_t set = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  if (set >= 0) {
    const hid_t type = H5Dget_type(set);
    const hid_t space = H5Dget_space(set);
    bytes.resize(static_cast<std::size_t>(H5Sget_simple_extent_npoints(space)) * H5Tget_size(type));
    if (!bytes.empty()) H5Dread(set, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data());
    H5Sclose(space);
    H5Tclose(type);
    H5Dclose(set);
  }
  H5Fclose(file);
  return bytes;
}

const std::vector<std::string> kTrajectoryDatasets = {
    "/particles/tokens/position/value", "/particles/tokens/position/time",
    "/particles/tokens/position/step",  "/particles/tokens_r1/position/value",
    "/observables/energy/value",        "/observables/min_inner/value",
    "/run/step_size"};

void expect_same_trajectories(const std::string& a, const std::string& b) {
  for (const auto& name : kTrajectoryDatasets) {
    const std::string bytes = dataset_bytes(a, name);
    EXPECT_FALSE(bytes.empty()) << name;
    EXPECT_EQ(bytes, dataset_bytes(b, name)) << name << " differs between " << a << " and " << b;
  }
}

std::string read_status(const std::string& path) {
  for (const auto& [name, value] : describe_file(path).run)
    if (name == "status") return value;
  return "";
}

TEST(Resume, ContinuedRunEqualsUninterruptedRunByteForByte) {
  const auto dir = scratch_dir("resume");
  for (const std::string integrator : {"rk4", "dopri5", "euler-maruyama"}) {
    const std::string options = "--n 40 --replicas 2 --kernel sa --save-every 0.25 --quiet --integrator " +
                                integrator + (integrator == "euler-maruyama" ? " --noise-kappa 20" : "");
    const std::string full = (dir / (integrator + "_full.h5")).string();
    const std::string part = (dir / (integrator + "_part.h5")).string();
    ASSERT_EQ(run_mfattn("run " + options + " --horizon 3 --out " + full).exit_code, 0);
    ASSERT_EQ(run_mfattn("run " + options + " --horizon 1.5 --out " + part).exit_code, 0);
    const auto resumed = run_mfattn("run " + options + " --horizon 3 --resume --out " + part);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    expect_same_trajectories(full, part);
    EXPECT_EQ(read_status(part), "complete");
  }
}

TEST(Resume, RefusesChangedOptionsAndMissingFiles) {
  const auto dir = scratch_dir("resume_refuse");
  const std::string out = (dir / "run.h5").string();
  ASSERT_EQ(run_mfattn("run --n 8 --horizon 1 --quiet --out " + out).exit_code, 0);
  const auto changed = run_mfattn("run --n 8 --beta 2 --horizon 2 --quiet --resume --out " + out);
  EXPECT_EQ(changed.exit_code, 2);
  EXPECT_NE(changed.output.find("--beta"), std::string::npos) << changed.output;
  const auto missing = run_mfattn("run --n 8 --horizon 2 --quiet --resume --out " +
                                  (dir / "none.h5").string());
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_FALSE(std::filesystem::exists(dir / "none.h5"));
}

// A run killed with SIGKILL leaves a file that opens with every flushed frame, and --resume
// completes it into exactly the uninterrupted trajectory.
TEST(Resume, KilledRunKeepsFlushedFramesAndResumesExactly) {
  const auto dir = scratch_dir("sigkill");
  const std::string killed = (dir / "killed.h5").string(), full = (dir / "full.h5").string();
  const std::vector<std::string> options = {"run", "--n", "400", "--d", "3", "--replicas", "2",
                                            "--horizon", "20", "--save-every", "0.25", "--dt",
                                            "0.004", "--threads", "1"};
  // The child's progress lines (stderr is a pipe, so one line per tenth of the horizon) come
  // after the frame is flushed: kill it as soon as the line for t = 4 arrives.
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::dup2(pipe_fds[1], STDERR_FILENO);
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    std::vector<std::string> args = options;
    args.insert(args.end(), {"--out", killed});
    std::vector<char*> argv{const_cast<char*>(MFATTN_BINARY)};
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(MFATTN_BINARY, argv.data());
    ::_exit(127);
  }
  ::close(pipe_fds[1]);
  FILE* progress = ::fdopen(pipe_fds[0], "r");
  char line[512];
  int lines = 0;
  while (std::fgets(line, sizeof line, progress))
    if (++lines == 3) break;  // t = 0, t = 2, t = 4
  ::kill(child, SIGKILL);
  std::fclose(progress);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the run finished before it could be killed";
  const FileSummary summary = describe_file(killed);
  EXPECT_GE(summary.frames, 17u);  // every flushed frame up to t = 4
  EXPECT_LT(summary.last_time, 20.0);
  EXPECT_EQ(read_status(killed), "running");
  const Frame last = read_last_frame(killed);
  EXPECT_EQ(last.n, 400u);

  std::string joined;
  for (const auto& o : options) joined += o + " ";
  joined += "--quiet ";
  const auto resumed = run_mfattn(joined + "--resume --out " + killed);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  ASSERT_EQ(run_mfattn(joined + "--out " + full).exit_code, 0);
  expect_same_trajectories(full, killed);
}

// A value matrix of 1e308 makes the first step diverge (huge stage states, then overflowing
// weights or a non-finite state): the run stops with exit 3 naming the step and time, keeps
// frame 0 and records the reason.
TEST(Failure, NonFiniteStateStopsTheRunAndKeepsEarlierFrames) {
  const auto dir = scratch_dir("nonfinite");
  const std::string v = (dir / "v.txt").string(), out = (dir / "run.h5").string();
  std::ofstream(v) << "1e308 1e308 1e308\n1e308 1e308 1e308\n1e308 1e308 1e308\n";
  const auto result = run_mfattn("run --n 8 --v " + v + " --horizon 1 --quiet --out " + out);
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_NE(result.output.find("step 1, t = 0.01"), std::string::npos) << result.output;
  const FileSummary summary = describe_file(out);
  EXPECT_EQ(summary.frames, 1u);
  EXPECT_EQ(read_status(out).rfind("failed: ", 0), 0u) << read_status(out);
  // The explicit Euler step leaves the reals instead: the non-finite state itself is named.
  const auto euler = run_mfattn("run --n 8 --v " + v + " --integrator euler --horizon 1 --quiet --overwrite --out " + out);
  EXPECT_EQ(euler.exit_code, 3);
  EXPECT_NE(euler.output.find("non-finite state at step"), std::string::npos) << euler.output;
}

TEST(Velocity, SavedVelocityIsTheFieldAtEachFrame) {
  const auto dir = scratch_dir("velocity");
  const std::string out = (dir / "v.h5").string();
  const std::string options = "--n 30 --d 4 --kernel sa --replicas 2 --horizon 1 --save-every 0.5";
  ASSERT_EQ(run_mfattn("run " + options + " --save-velocity --quiet --out " + out).exit_code, 0);
  const std::string positions = dataset_bytes(out, "/particles/tokens_r1/position/value");
  const std::string velocities = dataset_bytes(out, "/particles/tokens_r1/velocity/value");
  ASSERT_EQ(positions.size(), velocities.size());
  ASSERT_EQ(positions.size(), 3 * 30 * 4 * sizeof(double));
  EXPECT_EQ(dataset_bytes(out, "/particles/tokens/velocity/time"),
            dataset_bytes(out, "/particles/tokens/position/time"));
  // Recompute the field at the last frame of replica 1 in process.
  const auto cfg = testing::config({"--n", "30", "--d", "4", "--kernel", "sa"});
  const Model model = build_model(cfg);
  auto backend = make_backend("cpu", model, BackendOptions{1});
  std::vector<double> x(30 * 4), v(30 * 4), stored(30 * 4);
  std::memcpy(x.data(), positions.data() + 2 * x.size() * sizeof(double), x.size() * sizeof(double));
  std::memcpy(stored.data(), velocities.data() + 2 * x.size() * sizeof(double), x.size() * sizeof(double));
  backend->velocity(1, x.data(), v.data(), nullptr);
  EXPECT_TRUE(testing::bitwise_equal(v.data(), stored.data(), v.size()));
}

// The generators actually used are stored, so a reader can rebuild G(xi) without the source.
TEST(Gauges, OutputRecordsGeneratorsAndPositions) {
  const auto dir = scratch_dir("generators");
  const std::string out = (dir / "rope.h5").string();
  ASSERT_EQ(run_mfattn("run --n 10 --d 5 --geometry rope-axial --horizon 0.1 --quiet --out " + out).exit_code, 0);
  EXPECT_EQ(dataset_bytes(out, "/particles/tokens/gauge_generators").size(), 2 * 5 * 5 * sizeof(double));
  EXPECT_EQ(dataset_bytes(out, "/particles/tokens/aux_position").size(), 10 * 2 * sizeof(double));
  const auto cfg = testing::config({"--n", "10", "--d", "5", "--geometry", "rope-axial"});
  const Model model = build_model(cfg);
  const auto& gauge = dynamic_cast<const PositionalGauge&>(*model.gauge);
  std::string expected;
  for (const Matrix& generator : gauge.generators())
    expected.append(reinterpret_cast<const char*>(generator.data()), generator.size() * sizeof(double));
  EXPECT_EQ(dataset_bytes(out, "/particles/tokens/gauge_generators"), expected);
}

// A gauge made to the recipe of docs/architecture.md must say what the output records:
// recorded_generators is pure in Gauge, so a gauge that only applies itself is abstract.
struct AppliesOnly : Gauge {
  void apply(std::size_t, const double* in, double* out) const override { std::copy(in, in + 3, out); }
  void apply_transpose(std::size_t, const double* in, double* out) const override { std::copy(in, in + 3, out); }
};
static_assert(std::is_abstract_v<AppliesOnly>, "every gauge must say what the output records");

/// A test-only gauge that is no PositionalGauge: G(xi_i) turns the plane of coordinates 0
/// and 1 by omega xi_i, and it records whatever it is given.
class PlaneTurn final : public Gauge {
 public:
  PlaneTurn(const Model& model, double omega, std::vector<Matrix> recorded)
      : d_(model.d), positions_(model.positions), omega_(omega), recorded_(std::move(recorded)) {}
  void apply(std::size_t token, const double* in, double* out) const override { turn(token, in, out, 1.0); }
  void apply_transpose(std::size_t token, const double* in, double* out) const override {
    turn(token, in, out, -1.0);
  }
  std::vector<Matrix> recorded_generators() const override { return recorded_; }

 private:
  void turn(std::size_t token, const double* in, double* out, double sense) const {
    const double angle = sense * omega_ * positions_[token];
    out[0] = std::cos(angle) * in[0] - std::sin(angle) * in[1];
    out[1] = std::sin(angle) * in[0] + std::cos(angle) * in[1];
    std::copy(in + 2, in + d_, out + 2);
  }
  std::size_t d_;
  std::vector<double> positions_;
  double omega_;
  std::vector<Matrix> recorded_;
};

// The labels a run writes hold exactly what the gauge returns, whatever its class, and the
// writer puts them into /particles/tokens/gauge_generators.
TEST(Gauges, OutputRecordsWhatAnyGaugeSaysToRecord) {
  Model model = build_model(testing::config({"--n", "6", "--d", "3"}));
  Matrix generator = Matrix::Zero(3, 3);
  generator(0, 1) = -0.3;
  generator(1, 0) = 0.3;
  model.gauge = std::make_shared<PlaneTurn>(model, 0.3, std::vector<Matrix>{generator});
  const TokenLabels labels = token_labels(model);
  ASSERT_EQ(labels.generator_count, 1u);
  EXPECT_EQ(labels.gauge_generators, std::vector<double>(generator.data(), generator.data() + generator.size()));
  const std::string out = (scratch_dir("recorded_generators") / "g.h5").string();
  {
    WriterSetup setup;
    setup.path = out;
    setup.overwrite = true;
    setup.n = model.n;
    setup.d = model.d;
    setup.position_dim = model.position_dim;
    setup.creator_version = "test";
    setup.observables = {{"energy", 1}};
    H5mdWriter::create(setup)->write_labels(labels);
  }
  EXPECT_EQ(dataset_bytes(out, "/particles/tokens/gauge_generators"),
            std::string(reinterpret_cast<const char*>(generator.data()), generator.size() * sizeof(double)));
  // A gauge with nothing to record says so, and the file gets no generators.
  model.gauge = std::make_shared<PlaneTurn>(model, 0.3, std::vector<Matrix>{});
  EXPECT_EQ(token_labels(model).generator_count, 0u);
  EXPECT_TRUE(token_labels(model).gauge_generators.empty());
  // A generator of the wrong shape is a mistake of the gauge, refused before the writer.
  model.gauge = std::make_shared<PlaneTurn>(model, 0.3, std::vector<Matrix>{Matrix::Zero(2, 2)});
  EXPECT_THROW(token_labels(model), std::logic_error);
}

// A run's observers record on their schedule: every frame, or once at the end of the run.
TEST(Observers, SchedulesRecordAtEveryFrameOrAtTheEnd) {
  const ObserverSchedule every = ObserverSchedule::every_frame(), end = ObserverSchedule::at_end();
  std::vector<std::size_t> every_at, end_at;
  for (std::size_t frame = 0; frame < 8; ++frame) {
    if (every.at_frame(frame)) every_at.push_back(frame);
    if (end.at_frame(frame)) end_at.push_back(frame);
  }
  EXPECT_EQ(every_at, (std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_TRUE(end_at.empty());
  EXPECT_TRUE(end.at_end_of_run());
  EXPECT_FALSE(every.at_end_of_run());
}

TEST(Config, ConfigFileGivesTheSameBytesAsTheCommandLine) {
  const auto dir = scratch_dir("config");
  const std::string ini = (dir / "run.ini").string();
  std::ofstream(ini) << "# a config file\n"
                        "[model]\n"
                        "n = 24\nkernel = sa\nbeta = 2.5\n"
                        "[stepping]\n"
                        "integrator = dopri5\nhorizon = 3\nsave-every = 0.5\n"
                        "[initial]\n"
                        "init = clustered\nseed = 7\n";
  const std::string from_file = (dir / "file.h5").string(), from_cli = (dir / "cli.h5").string();
  ASSERT_EQ(run_mfattn("run --config " + ini + " --quiet --out " + from_file).exit_code, 0);
  ASSERT_EQ(run_mfattn("run --n 24 --kernel sa --beta 2.5 --integrator dopri5 --horizon 3 "
                       "--save-every 0.5 --init clustered --seed 7 --quiet --out " + from_cli)
                .exit_code,
            0);
  for (const auto& name : {"/particles/tokens/position/value", "/observables/energy/value"})
    EXPECT_EQ(dataset_bytes(from_file, name), dataset_bytes(from_cli, name)) << name;
  // The command line wins over the file.
  const std::string override_out = (dir / "override.h5").string();
  ASSERT_EQ(run_mfattn("run --config " + ini + " --n 10 --quiet --out " + override_out).exit_code, 0);
  EXPECT_EQ(describe_file(override_out).n, 10u);
}

TEST(Config, UnknownKeysAndBadValuesAreRefused) {
  const auto dir = scratch_dir("config_bad");
  const std::string unknown = (dir / "unknown.ini").string(), bad = (dir / "bad.ini").string();
  std::ofstream(unknown) << "[model]\nn = 8\nbetta = 2\n";
  std::ofstream(bad) << "n = 8\nkernel = softmax\n";
  const std::string out = (dir / "o.h5").string();
  for (const auto& [ini, named] : {std::pair{unknown, std::string("betta")}, {bad, std::string("--kernel")}}) {
    const auto result = run_mfattn("run --config " + ini + " --quiet --out " + out);
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find(named), std::string::npos) << result.output;
    EXPECT_FALSE(std::filesystem::exists(out));
  }
  const auto missing = run_mfattn("run --config " + (dir / "none.ini").string() + " --quiet --out " + out);
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.output.find("--config"), std::string::npos);
}

TEST(Info, DescribesAFileAndRejectsForeignOnes) {
  const auto dir = scratch_dir("info");
  const std::string out = (dir / "run.h5").string();
  ASSERT_EQ(run_mfattn("run --n 12 --d 4 --replicas 2 --horizon 2 --save-every 0.5 --quiet --out " + out).exit_code, 0);
  const auto info = run_mfattn("info " + out);
  EXPECT_EQ(info.exit_code, 0);
  for (const char* expected : {"n = 12", "d = 4", "replicas = 2", "frames     5", "t = 0 .. 2", "complete", "beta = 1",
                               "\n  eps-den = auto\n", "\n  eps_den_used = 0\n"})
    EXPECT_NE(info.output.find(expected), std::string::npos) << expected << "\n" << info.output;
  // A value given is shown as given.
  ASSERT_EQ(run_mfattn("run --n 4 --horizon 0.1 --eps-den 0.5 --quiet --overwrite --out " + out).exit_code, 0);
  EXPECT_NE(run_mfattn("info " + out).output.find("\n  eps-den = 0.5\n"), std::string::npos);
  // Missing or not an mfattn file: a usage error, as for analyze and run --resume.
  EXPECT_EQ(run_mfattn("info " + (dir / "missing.h5").string()).exit_code, 2);
  std::ofstream(dir / "foreign.h5") << "not hdf5";
  const auto foreign = run_mfattn("info " + (dir / "foreign.h5").string());
  EXPECT_EQ(foreign.exit_code, 2);
  EXPECT_NE(foreign.output.find("not an mfattn"), std::string::npos) << foreign.output;
}

}  // namespace
}  // namespace mfattn
