// mfattn: the thin command-line entry point. Each subcommand lives in src/app/.
#include <filesystem>
#include <functional>
#include <algorithm>
#include <iostream>
#include <new>
#include <string>
#include <vector>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <hdf5.h>

#include "mfattn/analyze/analyze.hpp"
#include "mfattn/backends/backend.hpp"
#include "mfattn/app/bench.hpp"
#include "mfattn/app/config.hpp"
#include "mfattn/app/info.hpp"
#include "mfattn/app/meanfield.hpp"
#include "mfattn/app/oclosure_command.hpp"
#include "mfattn/app/realize.hpp"
#include "mfattn/app/run.hpp"
#include "mfattn/sweep/sweep.hpp"
#include "mfattn/core/version.hpp"

namespace {

constexpr const char* kUsage =
    "usage: mfattn <command> [options]\n"
    "  run    simulate attention dynamics and write an H5MD file (mfattn run --help)\n"
    "  sweep  a grid of runs from a sweep file, resumable, sharded (mfattn sweep --help)\n"
    "  bench  interaction throughput in pairs per second (mfattn bench --help)\n"
    "  info   what an mfattn file holds: mfattn info FILE.h5\n"
    "  analyze  collapse and metastability summary: mfattn analyze FILE.h5 [--json] [--replica R|all]\n"
    "  oclosure  zero-token insertion ablation and OAttention precision (mfattn oclosure --help)\n"
    "  realize  exact realization of a target law by RoPE orbits or prefix gauges (mfattn realize --help)\n"
    "  meanfield  the density (mean-field) equation of the same model (mfattn meanfield --help)\n"
    "  mfattn --help | help <command> | --version | -V\n";

constexpr int kExitInternal = 1;

/// Every command, in the order the usage lists them.
const std::vector<std::string> kCommands = {"run", "sweep", "bench", "info", "analyze", "oclosure", "realize", "meanfield"};

std::string accepted_commands() {
  std::string text;
  for (const auto& name : kCommands) text += (text.empty() ? "" : ", ") + name;
  return text;
}

/// The help of run and bench: a usage line, its own options, then the run option table.
int print_run_option_help(const std::string& usage) {
  mfattn::RunConfig defaults;
  std::cout << usage << mfattn::run_options(defaults);
  return mfattn::kExitOk;
}

bool wants_help(const std::vector<std::string>& args) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

bool wants_version(const std::vector<std::string>& args) {
  for (const auto& a : args)
    if (a == "--version" || a == "-V") return true;
  return false;
}

/// Runs one command; nothing escapes as an exception. Running out of memory (past the
/// up-front estimate) is a resource failure, exit 4; anything else unexpected is an internal
/// error, exit 1. Messages are one line.
int guarded(const std::string& command, const std::function<int()>& body) {
  try {
    return body();
  } catch (const mfattn::UsageError& e) {
    std::cerr << "mfattn " << command << ": " << e.what() << '\n';
    return mfattn::kExitUsage;
  } catch (const std::bad_alloc&) {
    std::cerr << "mfattn " << command << ": out of memory (an allocation failed; make the run smaller)\n";
    return mfattn::kExitIo;
  } catch (const std::filesystem::filesystem_error& e) {
    std::cerr << "mfattn " << command << ": " << mfattn::one_line(e.what()) << '\n';
    return mfattn::kExitIo;
  } catch (const std::exception& e) {
    std::cerr << "mfattn " << command << ": internal error: " << mfattn::one_line(e.what()) << '\n';
    return kExitInternal;
  } catch (...) {
    std::cerr << "mfattn " << command << ": internal error: unknown exception\n";
    return kExitInternal;
  }
}

int print_help(const std::string& command) {
  if (command == "run")
    return print_run_option_help(
        "usage: mfattn run [--config FILE] [options] --out FILE.h5\n"
        "  option names in full; one value each, except the lists --save-times, --rope-freqs,\n"
        "  --amplitudes (comma separated, or several words)\n");
  if (command == "sweep") {
    std::cout << mfattn::sweep_usage();
    return mfattn::kExitOk;
  }
  if (command == "bench")
    return print_run_option_help(
        "usage: mfattn bench [run options] [--min-time S] [--roofline]\n"
        "  --min-time S   measure for at least S seconds (1)\n"
        "  --roofline     also print the vectorised exp rate\n");
  if (command == "info") {
    std::cout << "usage: mfattn info FILE.h5\n  sizes, frames, time span, status and parameters of an mfattn file\n";
    return mfattn::kExitOk;
  }
  if (command == "analyze") {
    std::cout << "usage: mfattn analyze FILE.h5 [--json] [--replica R|all] [--min-decades D]\n"
              << "  collapse time, cluster plateaus over log time, merge times, energy staircase\n"
              << "  --json           one JSON object instead of text (every plateau)\n"
              << "  --replica R      which replica (0); all: every replica, summed up\n"
              << "  --min-decades D  the text lists plateaus of at least D decades (0.05), the final one\n"
              << "                   and a first one of several frames; 0 lists every plateau\n";
    return mfattn::kExitOk;
  }
  if (command == "oclosure") {
    std::cout << mfattn::oclosure_usage();
    return mfattn::kExitOk;
  }
  if (command == "realize") {
    std::cout << mfattn::realize_usage();
    return mfattn::kExitOk;
  }
  if (command == "meanfield") {
    std::cout << mfattn::meanfield_usage();
    return mfattn::kExitOk;
  }
  std::cerr << "mfattn help: unknown command '" << command << "' (accepted: " << accepted_commands()
            << ")\n";
  return mfattn::kExitUsage;
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
  // Every command closes what it opens before it returns (the writers flush and close their
  // files in their destructors). HDF5's own exit handler would only add noise: after reading
  // a damaged file, state it keeps internally makes it print "infinite loop closing library"
  // and a list of its interfaces on stderr. It has to be declined before the first HDF5 call.
  H5dont_atexit();
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::cerr << kUsage;
    return mfattn::kExitUsage;
  }
  if (wants_version(args)) {
    try {
      const std::string kernels = mfattn::cpu_kernels_description();
      std::cout << "mfattn " << mfattn::kVersion << " (" << mfattn::kSourceRevision << ")\n"
                << "cpu kernels: " << kernels << '\n'
                << "cpu kernels this CPU runs: " << mfattn::cpu_kernels_runnable() << '\n';
    } catch (const mfattn::BackendUnavailable& e) {
      std::cerr << "mfattn: " << e.what() << '\n';
      return mfattn::kExitUsage;
    }
    return mfattn::kExitOk;
  }
  const std::string command = args.front();
  args.erase(args.begin());
  if (command == "--help" || command == "-h") {
    std::cout << kUsage;
    return mfattn::kExitOk;
  }
  if (command == "help") {
    if (args.empty()) {
      std::cout << kUsage;
      return mfattn::kExitOk;
    }
    if (args.size() > 1) {
      std::cerr << "mfattn help: one command at a time (got " << args.size() << ")\n";
      return mfattn::kExitUsage;
    }
    return guarded("help", [&] { return print_help(args.front()); });
  }
  if (std::find(kCommands.begin(), kCommands.end(), command) == kCommands.end()) {
    std::cerr << "mfattn: unknown command '" << command << "' (accepted: " << accepted_commands()
              << ", help)\n" << kUsage;
    return mfattn::kExitUsage;
  }
  // One rule for every command: Boost's parser (run, bench, sweep) would end the options at a
  // bare "--" and take what follows as stray words, the others would call it unknown.
  if (std::find(args.begin(), args.end(), "--") != args.end()) {
    std::cerr << "mfattn " << command
              << ": '--' is not accepted (mfattn has no end-of-options marker: every argument is an "
                 "option, its value or a file name)\n";
    return mfattn::kExitUsage;
  }
  if (wants_help(args)) return guarded(command, [&] { return print_help(command); });
  return guarded(command, [&]() -> int {
    if (command == "run") return mfattn::run_simulation(mfattn::parse_run_arguments(args), std::cerr);
    if (command == "sweep") return mfattn::sweep_command(args, std::cout, std::cerr);
    if (command == "bench") return mfattn::bench_command(args, std::cout, std::cerr);
    if (command == "info") return mfattn::info_command(args, std::cout, std::cerr);
    if (command == "analyze") return mfattn::analyze_command(args, std::cout, std::cerr);
    if (command == "realize") return mfattn::realize_command(args, std::cout, std::cerr);
    if (command == "meanfield") return mfattn::meanfield_command(args, std::cout, std::cerr);
    return mfattn::oclosure_command(args, std::cout, std::cerr);
  });
}
