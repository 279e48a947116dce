#pragma once
// Shared helpers of the unit tests: run a configuration in process and keep every frame.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "mfattn/app/config.hpp"
#include "mfattn/integrators/integrator.hpp"
#include "mfattn/app/run.hpp"
#include "mfattn/app/run_resources.hpp"

namespace mfattn::testing {

/// Every number of one dataset of an HDF5 file, converted to double (empty if unreadable).
inline std::vector<double> read_doubles(const std::string& path, const std::string& dataset) {
  std::vector<double> values;
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) return values;
  const hid_t set = H5Dopen2(file, dataset.c_str(), H5P_DEFAULT);
  if (set >= 0) {
    const hid_t space = H5Dget_space(set);
    values.resize(static_cast<std::size_t>(H5Sget_simple_extent_npoints(space)));
    if (!values.empty()) H5Dread(set, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
    H5Sclose(space);
    H5Dclose(set);
  }
  H5Fclose(file);
  return values;
}

/// base followed by extra (command-line arguments).
inline std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& extra) {
  base.insert(base.end(), extra.begin(), extra.end());
  return base;
}

/// A configuration from command-line style arguments (without --out).
inline RunConfig config(std::vector<std::string> args) {
  args.push_back("--out");
  args.push_back("unused.h5");
  return parse_run_arguments(args);
}

/// The UsageError message parse_run_arguments gives for args, or "(accepted)".
inline std::string usage_message(const std::vector<std::string>& args) {
  try {
    parse_run_arguments(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(accepted)";
}

struct Trajectory {
  Model model;
  std::vector<State> frames;
  IntegrationStats stats;
};

/// Integrates cfg in process with the given backend and thread count; keeps every frame.
inline Trajectory simulate(const RunConfig& cfg, int threads = 1, const std::string& backend_name = "cpu") {
  Trajectory t;
  t.model = build_model(cfg);
  State state = build_initial_state(cfg, t.model);
  auto backend = make_backend(backend_name, t.model, backend_options(cfg, threads));
  auto integrator = make_integrator(integrator_settings(cfg));
  Dynamics dynamics(t.model, *backend, state.replicas);
  double h = cfg.dt;
  t.stats = integrate(*integrator, dynamics, state, h, cfg.dt, output_times(cfg),
                      [&](const State& s) { t.frames.push_back(s); });
  return t;
}

/// Integrates cfg with the cpu backend (2 threads) and the reference backend; expects the
/// final states to agree to 1e-9 and the tokens to have moved. Returns the cpu trajectory.
inline Trajectory expect_cpu_matches_reference(const RunConfig& cfg, const std::string& label) {
  auto fast = simulate(cfg, 2, "cpu");
  const auto reference = simulate(cfg, 1, "reference");
  double worst = 0.0, moved = 0.0;
  for (std::size_t e = 0; e < fast.frames.back().x.size(); ++e) {
    worst = std::max(worst, std::fabs(fast.frames.back().x[e] - reference.frames.back().x[e]));
    moved = std::max(moved, std::fabs(fast.frames.back().x[e] - fast.frames.front().x[e]));
  }
  EXPECT_LT(worst, 1e-9) << label;
  EXPECT_GT(moved, 1e-3) << "no motion: " << label;
  return fast;
}

/// The message of the std::invalid_argument that f throws (a marker if it throws none).
template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "<no std::invalid_argument thrown>";
}

/// <a, b> over every number, in order.
inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0.0;
  for (std::size_t e = 0; e < a.size(); ++e) sum += a[e] * b[e];
  return sum;
}

inline double max_abs_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

inline bool bitwise_equal(const double* a, const double* b, std::size_t count) {
  return std::memcmp(a, b, count * sizeof(double)) == 0;
}

/// The velocity of `state` by the backend `backend_name` on `threads` threads, and the weight
/// sums D_i where weight_sums is given.
inline std::vector<double> evaluate_velocity(const Model& model, const State& state, const std::string& backend_name,
                                             int threads, std::vector<double>* weight_sums = nullptr) {
  auto backend = make_backend(backend_name, model, BackendOptions{threads});
  std::vector<double> velocity(state.size());
  if (weight_sums) weight_sums->assign(state.replicas * model.n, 0.0);
  backend->velocity(state.replicas, state.x.data(), velocity.data(), weight_sums ? weight_sums->data() : nullptr);
  return velocity;
}

/// One evaluation of the cpu backend (2 threads) against the reference: velocities within
/// 1e-13 and weight sums within 1e-12 of their largest values.
inline void expect_cpu_field_matches_reference(const RunConfig& cfg, const std::string& label) {
  const Model model = build_model(cfg);
  const State state = build_initial_state(cfg, model);
  std::vector<double> sums, expected_sums;
  const auto velocity = evaluate_velocity(model, state, "cpu", 2, &sums);
  const auto expected = evaluate_velocity(model, state, "reference", 1, &expected_sums);
  double scale = 1.0, largest_sum = 0.0;
  for (double v : expected) scale = std::max(scale, std::fabs(v));
  for (double s : expected_sums) largest_sum = std::max(largest_sum, s);
  EXPECT_LE(max_abs_difference(velocity, expected), 1e-13 * scale) << label;
  EXPECT_LE(max_abs_difference(sums, expected_sums), 1e-12 * largest_sum) << label;
}

/// Null tokens appended (37 to n = 90, d = 6 in `base`) change no bit of the others'
/// velocities on the cpu and reference backends and stay still, and 1 or 2 threads give the
/// same bits.
inline void expect_null_tokens_and_threads_change_no_bit(const std::vector<std::string>& base) {
  const RunConfig plain_cfg = config(with({"--n", "90", "--d", "6"}, base));
  const RunConfig padded_cfg = config(with({"--n", "90", "--d", "6", "--null-tokens", "37"}, base));
  const Model plain = build_model(plain_cfg), padded = build_model(padded_cfg);
  const State state = build_initial_state(plain_cfg, plain);
  State padded_state(1, padded.n, padded.d);
  std::copy(state.x.begin(), state.x.end(), padded_state.x.begin());
  for (std::size_t e = state.x.size(); e < padded_state.x.size(); e += 6) padded_state.x[e] = 1.0;
  for (const std::string backend : {"cpu", "reference"}) {
    const auto v = evaluate_velocity(plain, state, backend, 1);
    const auto v_padded = evaluate_velocity(padded, padded_state, backend, 2);
    EXPECT_TRUE(bitwise_equal(v.data(), v_padded.data(), v.size())) << backend;
    for (std::size_t e = v.size(); e < v_padded.size(); ++e) EXPECT_EQ(v_padded[e], 0.0) << backend;
  }
  const auto one = evaluate_velocity(padded, padded_state, "cpu", 1);
  const auto two = evaluate_velocity(padded, padded_state, "cpu", 2);
  EXPECT_TRUE(bitwise_equal(one.data(), two.data(), one.size()));
}

/// A fresh empty folder for files of one test.
inline std::filesystem::path scratch_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("mfattn_test_" + name + "_" +
                                                       std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

/// Runs a shell command; stdout and stderr together, and its exit code.
inline CommandResult run_shell(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return result;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe)) result.output += buffer;
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

/// Runs the mfattn binary with a shell argument string.
inline CommandResult run_mfattn(const std::string& arguments) {
  return run_shell(std::string(MFATTN_BINARY) + " " + arguments);
}

}  // namespace mfattn::testing
