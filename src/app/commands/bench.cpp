#include "mfattn/app/bench.hpp"

#include <omp.h>

#include <chrono>
#include <iomanip>
#include <iostream>

#include "mfattn/backends/backend.hpp"
#include "mfattn/app/config.hpp"
#include "mfattn/core/number_text.hpp"
#include "mfattn/integrators/integrator.hpp"
#include "mfattn/app/run.hpp"
#include "mfattn/app/run_choices.hpp"
#include "mfattn/app/run_resources.hpp"
#include "mfattn/app/validate.hpp"

namespace mfattn {
namespace po = boost::program_options;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// The longest --min-time: a day, far beyond any measurement, and finite.
constexpr double kMaxBenchSeconds = 86400.0;

}  // namespace

int bench_command(const std::vector<std::string>& args, std::ostream& out) {
  RunConfig cfg;
  cfg.n = 4096;
  double min_seconds = 1.0;
  bool roofline = false;
  po::options_description table = run_options(cfg);
  po::options_description extra("Bench options");
  extra.add_options()("min-time", po::value(&min_seconds)->default_value(1.0),
                      "measure for at least this many seconds")(
      "roofline", po::bool_switch(&roofline), "also print the vectorised exp rate");
  table.add(extra);
  po::options_description help_table("mfattn bench [run options] [--min-time S] [--roofline]");
  help_table.add(extra);
  po::variables_map vm;
  store_run_arguments(args, table, vm, cfg);
  if (cfg.out.empty()) cfg.out = "(bench: no output)";
  cfg.choices = validate(cfg);
  // A finite bound: the measurement loop runs until it has passed.
  if (!(min_seconds > 0) || !(min_seconds <= kMaxBenchSeconds))
    throw UsageError("--min-time " + format_number(min_seconds) + ": must be a number of seconds in (0, " +
                     format_number(kMaxBenchSeconds) + "]");
  const int threads = resolve_threads(cfg.threads);
  const Model model = build_model(cfg);
  const State state = build_initial_state(cfg, model);
  auto backend = make_backend(cfg.backend, model, backend_options(cfg, threads));
  std::vector<double> velocity(state.size());
  // A placement other than post (docs/model.md section 2c) is the backend's evaluation and
  // the per-token formula of Dynamics, whose remembered evaluation is dropped each time.
  Dynamics dynamics(model, *backend, state.replicas);
  auto evaluate = [&] {
    if (model.placement == Placement::Post) {
      backend->velocity(state.replicas, state.x.data(), velocity.data(), nullptr);
      return;
    }
    dynamics.matrices_changed();
    dynamics.velocity(state.x.data(), velocity.data());
  };
  evaluate();  // warm up
  std::int64_t evaluations = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0.0;
  while (elapsed < min_seconds) {
    evaluate();
    ++evaluations;
    elapsed = seconds_since(start);
  }
  const double pairs = double(state.replicas) * double(model.n) * double(model.n);
  out << std::setprecision(4) << "backend " << backend->name() << " n " << model.n << " d "
      << model.d << " kernel " << cfg.kernel
      << (model.placement == Placement::Post ? "" : " normalization " + cfg.normalization) << " threads "
      << threads << " evaluations "
      << evaluations << " seconds_per_evaluation " << elapsed / double(evaluations)
      << " pairs_per_second " << pairs * double(evaluations) / elapsed << " "
      << backend->describe() << '\n';
  if (roofline)
    out << std::setprecision(4) << "exp_per_second " << cpu_exp_rate(threads, min_seconds)
        << " threads " << threads << '\n';
  return kExitOk;
}

}  // namespace mfattn
