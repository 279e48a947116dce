// mfattn: the thin command-line entry point. Each subcommand lives in src/app/.
#include <iostream>
#include <string>
#include <vector>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "mfattn/analyze.hpp"
#include "mfattn/bench.hpp"
#include "mfattn/config.hpp"
#include "mfattn/info.hpp"
#include "mfattn/oclosure_command.hpp"
#include "mfattn/run.hpp"
#include "mfattn/sweep.hpp"
#include "mfattn/version.hpp"

namespace {

constexpr const char* kUsage =
    "usage: mfattn <command> [options]\n"
    "  run    simulate attention dynamics and write an H5MD file (mfattn run --help)\n"
    "  sweep  a grid of runs from a sweep file, resumable, sharded (mfattn sweep --help)\n"
    "  bench  interaction throughput in pairs per second (mfattn bench --help)\n"
    "  info   what an mfattn file holds: mfattn info FILE.h5\n"
    "  analyze  collapse and metastability summary: mfattn analyze FILE.h5 [--json] [--replica R]\n"
    "  oclosure  zero-token insertion ablation and OAttention precision (mfattn oclosure --help)\n"
    "  mfattn --help | --version\n";

bool wants_help(const std::vector<std::string>& args) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
#if defined(__GLIBC__)
  // Buffers of a few MiB are allocated per frame and per evaluation (observables, Gram blocks,
  // HDF5 chunks). glibc would map each from fresh pages and unmap it on free, so every frame
  // paid its page faults again (a VM makes them dear); taken from the heap and kept there
  // (up to 128 MiB of free memory per heap), they are reused. Peak memory measured at
  // n = 50000: 51 MB either way.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 128 << 20);
#endif
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::cerr << kUsage;
    return mfattn::kExitUsage;
  }
  const std::string command = args.front();
  args.erase(args.begin());
  if (command == "--help" || command == "-h") {
    std::cout << kUsage;
    return mfattn::kExitOk;
  }
  if (command == "--version") {
    std::cout << "mfattn " << mfattn::kVersion << " (" << mfattn::kSourceRevision << ")\n";
    return mfattn::kExitOk;
  }
  if (command == "run") {
    if (wants_help(args)) {
      mfattn::RunConfig defaults;
      std::cout << "usage: mfattn run [--config FILE] [options] --out FILE.h5\n"
                << mfattn::run_options(defaults);
      return mfattn::kExitOk;
    }
    try {
      const mfattn::RunConfig cfg = mfattn::parse_run_arguments(args);
      return mfattn::run_simulation(cfg, std::cerr);
    } catch (const mfattn::UsageError& e) {
      std::cerr << "mfattn run: " << e.what() << '\n';
      return mfattn::kExitUsage;
    }
  }
  if (command == "sweep") {
    if (wants_help(args)) {
      std::cout << mfattn::sweep_usage();
      return mfattn::kExitOk;
    }
    return mfattn::sweep_command(args, std::cout, std::cerr);
  }
  if (command == "bench") {
    if (wants_help(args)) {
      mfattn::RunConfig defaults;
      std::cout << "usage: mfattn bench [run options] [--min-time S] [--roofline]\n"
                << "  --min-time S   measure for at least S seconds (1)\n"
                << "  --roofline     also print the vectorised exp rate\n"
                << mfattn::run_options(defaults);
      return mfattn::kExitOk;
    }
    return mfattn::bench_command(args, std::cout, std::cerr);
  }
  if (command == "info") {
    if (wants_help(args)) {
      std::cout << "usage: mfattn info FILE.h5\n  sizes, frames, time span, status and parameters of an mfattn file\n";
      return mfattn::kExitOk;
    }
    return mfattn::info_command(args, std::cout, std::cerr);
  }
  if (command == "analyze") {
    if (wants_help(args)) {
      std::cout << "usage: mfattn analyze FILE.h5 [--json] [--replica R]\n"
                << "  collapse time, cluster plateaus over log time, merge times, energy staircase\n"
                << "  --json         one JSON object instead of text\n"
                << "  --replica R    which replica (0)\n";
      return mfattn::kExitOk;
    }
    return mfattn::analyze_command(args, std::cout, std::cerr);
  }
  if (command == "oclosure") {
    if (wants_help(args)) {
      std::cout << mfattn::oclosure_usage();
      return mfattn::kExitOk;
    }
    return mfattn::oclosure_command(args, std::cout, std::cerr);
  }
  std::cerr << "mfattn: unknown command '" << command << "' (accepted: run, sweep, bench, info, analyze, oclosure)\n" << kUsage;
  return mfattn::kExitUsage;
}
