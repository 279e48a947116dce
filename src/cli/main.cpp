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
#include "mfattn/app/command_errors.hpp"
#include "mfattn/app/config.hpp"
#include "mfattn/app/fit.hpp"
#include "mfattn/app/import_states.hpp"
#include "mfattn/app/info.hpp"
#include "mfattn/app/keys.hpp"
#include "mfattn/app/meanfield.hpp"
#include "mfattn/app/meanfield_compare.hpp"
#include "mfattn/app/oclosure_command.hpp"
#include "mfattn/app/realize.hpp"
#include "mfattn/app/run.hpp"
#include "mfattn/sweep/sweep.hpp"
#include "mfattn/core/version.hpp"

namespace {

/// The help of run and bench: a usage line, its own options, then the run option table.
void print_run_option_help(const std::string& usage) {
  mfattn::RunConfig defaults;
  std::cout << usage << mfattn::run_options(defaults);
}

/// One entry per command: its name, its line in the usage, its help and what runs it. A new
/// command is one entry here.
struct Command {
  const char* name;
  const char* summary;  ///< the usage line after the name
  std::function<void()> help;
  std::function<int(const std::vector<std::string>& args)> run;
};

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {"run", "simulate attention dynamics and write an H5MD file (mfattn run --help)",
       [] {
         print_run_option_help(
             "usage: mfattn run [--config FILE] [options] --out FILE.h5\n"
             "  option names in full; one value each, except the lists --save-times, --rope-freqs,\n"
             "  --amplitudes (comma separated, or several words)\n");
       },
       [](const auto& args) {
         return mfattn::run_simulation(mfattn::parse_run_arguments(args), std::cerr);
       }},
      {"sweep", "a grid of runs from a sweep file, resumable, sharded (mfattn sweep --help)",
       [] { std::cout << mfattn::sweep_usage(); },
       [](const auto& args) { return mfattn::sweep_command(args, std::cout, std::cerr); }},
      {"bench", "interaction throughput in pairs per second (mfattn bench --help)",
       [] {
         print_run_option_help(
             "usage: mfattn bench [run options] [--min-time S] [--roofline]\n"
             "  --min-time S   measure for at least S seconds (1)\n"
             "  --roofline     also print the vectorised exp rate\n");
       },
       [](const auto& args) { return mfattn::bench_command(args, std::cout); }},
      {"info", "what an mfattn file holds: mfattn info FILE.h5",
       [] {
         std::cout
             << "usage: mfattn info FILE.h5\n  sizes, frames, time span, status and parameters of an mfattn file\n";
       },
       [](const auto& args) { return mfattn::info_command(args, std::cout, std::cerr); }},
      {"import",
       "another model's token states (.npy/.npz) as an mfattn file (mfattn import --help)",
       [] { std::cout << mfattn::import_usage(); },
       [](const auto& args) { return mfattn::import_command(args, std::cout, std::cerr); }},
      {"analyze",
       "collapse and metastability summary: mfattn analyze FILE.h5 [--json] [--replica R|all]",
       [] {
         std::cout << "usage: mfattn analyze FILE.h5 [--json] [--replica R|all] [--min-decades D]\n"
                   << "  collapse time, cluster plateaus over log time, merge times, energy staircase\n"
                   << "  --json           one JSON object instead of text (every plateau)\n"
                   << "  --replica R      which replica (0); all: every replica, summed up\n"
                   << "  --min-decades D  the text lists plateaus of at least D decades (0.05), the final one\n"
                   << "                   and a first one of several frames; 0 lists every plateau\n";
       },
       [](const auto& args) { return mfattn::analyze_command(args, std::cout, std::cerr); }},
      {"oclosure",
       "zero-token insertion ablation and OAttention precision (mfattn oclosure --help)",
       [] { std::cout << mfattn::oclosure_usage(); },
       [](const auto& args) { return mfattn::oclosure_command(args, std::cout, std::cerr); }},
      {"realize",
       "exact realization of a target law by RoPE orbits or prefix gauges (mfattn realize --help)",
       [] { std::cout << mfattn::realize_usage(); },
       [](const auto& args) { return mfattn::realize_command(args, std::cout, std::cerr); }},
      {"fit",
       "fit weights (and x0, beta) so that a run reaches a target, by gradients through runs (mfattn fit --help)",
       [] { std::cout << mfattn::fit_usage(); },
       [](const auto& args) { return mfattn::fit_command(args, std::cout, std::cerr); }},
      {"keys",
       "one query against n keys: the attention plan's statistics over samples (mfattn keys --help)",
       [] { std::cout << mfattn::keys_usage(); },
       [](const auto& args) { return mfattn::keys_command(args, std::cout, std::cerr); }},
      {"compare",
       "W1 between a particle run and a density file at their common frames (mfattn compare --help)",
       [] { std::cout << mfattn::compare_usage(); },
       [](const auto& args) { return mfattn::compare_command(args, std::cout, std::cerr); }},
      {"meanfield", "the density (mean-field) equation of the same model (mfattn meanfield --help)",
       [] { std::cout << mfattn::meanfield_usage(); },
       [](const auto& args) { return mfattn::meanfield_command(args, std::cout, std::cerr); }},
  };
  return table;
}

const Command* find_command(const std::string& name) {
  for (const Command& command : commands())
    if (name == command.name) return &command;
  return nullptr;
}

std::string usage() {
  std::string text = "usage: mfattn <command> [options]\n";
  for (const Command& command : commands()) {
    std::string name = command.name;
    name.resize(std::max<std::size_t>(name.size() + 2, 7), ' ');
    text += "  " + name + command.summary + "\n";
  }
  return text + "  mfattn --help | help <command> | --version | -V\n";
}

std::string accepted_commands() {
  std::string text;
  for (const Command& command : commands()) text += (text.empty() ? "" : ", ") + std::string(command.name);
  return text;
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
    std::cerr << usage();
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
    std::cout << usage();
    return mfattn::kExitOk;
  }
  if (command == "help") {
    if (args.empty()) {
      std::cout << usage();
      return mfattn::kExitOk;
    }
    if (args.size() > 1) {
      std::cerr << "mfattn help: one command at a time (got " << args.size() << ")\n";
      return mfattn::kExitUsage;
    }
    const Command* asked = find_command(args.front());
    if (!asked) {
      std::cerr << "mfattn help: unknown command '" << args.front() << "' (accepted: " << accepted_commands()
                << ")\n";
      return mfattn::kExitUsage;
    }
    return mfattn::guarded("help", [&] { return asked->help(), int(mfattn::kExitOk); }, std::cerr);
  }
  const Command* chosen = find_command(command);
  if (!chosen) {
    std::cerr << "mfattn: unknown command '" << command << "' (accepted: " << accepted_commands()
              << ", help)\n" << usage();
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
  if (wants_help(args)) return mfattn::guarded(command, [&] { return chosen->help(), int(mfattn::kExitOk); }, std::cerr);
  return mfattn::guarded(command, [&] { return chosen->run(args); }, std::cerr);
}
