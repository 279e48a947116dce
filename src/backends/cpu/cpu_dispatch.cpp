// Picks the CPU kernels once per process (cpu_kernels.hpp). Compiled with the build's own
// flags: it must run on every CPU the binary is meant for.
#include <cstdlib>
#include <sstream>
#include <string>

#include "backends/cpu/cpu_kernels.hpp"
#include "mfattn/core/evaluation_watch.hpp"

namespace mfattn::cpu {

// The sets compiled into this build (CMake defines MFATTN_CPU_HAVE_<TARGET> for each
// pragma-selected target; the build's own flags always give one).
#if defined(MFATTN_CPU_HAVE_AVX512)
inline namespace avx512 {
extern const KernelSet kernel_set;
}
#endif
#if defined(MFATTN_CPU_HAVE_AVX2)
inline namespace avx2 {
extern const KernelSet kernel_set;
}
#endif
inline namespace build_flags {
extern const KernelSet kernel_set;
}

namespace {

/// Fills GCC's CPU feature table (x86 only; elsewhere the build's own set is the only one).
void initialise_cpu_features() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
#endif
}

constexpr const char* kVariable = "MFATTN_CPU_KERNELS";

const char* requested() {
  const char* value = std::getenv(kVariable);
  return value && *value && std::string(value) != "auto" ? value : nullptr;
}

/// The names of the compiled sets (only those this CPU runs, with only_supported), best first.
std::string names(bool only_supported, const char* separator) {
  std::string out;
  for (const KernelSet* set : compiled_kernel_sets())
    if (!only_supported || set->supported()) {
      if (!out.empty()) out += separator;
      out += set->name;
    }
  return out;
}

const KernelSet& choose() {
  initialise_cpu_features();
  const char* wanted = requested();
  if (!wanted) {
    for (const KernelSet* set : compiled_kernel_sets())
      if (set->supported()) return *set;
    return build_flags::kernel_set;  // the build's own set always runs
  }
  for (const KernelSet* set : compiled_kernel_sets()) {
    if (std::string(wanted) != set->name) continue;
    if (set->supported()) return *set;
    throw BackendUnavailable(std::string(kVariable) + "=" + wanted +
                             ": this CPU cannot run those kernels (accepted here: auto, " +
                             names(true, ", ") + ")");
  }
  throw BackendUnavailable(std::string(kVariable) + "=" + wanted +
                           ": not compiled into this build (accepted here: auto, " +
                           names(true, ", ") + ")");
}

}  // namespace

const std::vector<const KernelSet*>& compiled_kernel_sets() {
  static const std::vector<const KernelSet*> sets = {
#if defined(MFATTN_CPU_HAVE_AVX512)
      &avx512::kernel_set,
#endif
#if defined(MFATTN_CPU_HAVE_AVX2)
      &avx2::kernel_set,
#endif
      &build_flags::kernel_set};
  return sets;
}

const KernelSet& kernels() {
  static const KernelSet& chosen = choose();
  return chosen;
}

std::string describe_kernels() {
  const KernelSet& set = kernels();
  std::ostringstream out;
  out << set.name << " (" << set.register_lanes << " doubles per register; compiled: "
      << names(false, " ") << "; " << (requested() ? std::string("set by ") + kVariable : "the best this CPU runs")
      << ")";
  return out.str();
}

}  // namespace mfattn::cpu

namespace mfattn {

std::unique_ptr<Backend> make_cpu_backend(const Model& model, const BackendOptions& options) {
  return cpu::kernels().make_backend(model, options.threads);
}

std::string cpu_kernels_name() { return cpu::kernels().name; }
std::string cpu_kernels_description() { return cpu::describe_kernels(); }
double cpu_exp_rate(int threads, double min_seconds) {
  return cpu::kernels().exp_rate(threads, min_seconds);
}
PairStatistics cpu_pair_statistics(const double* x, std::size_t d, const std::vector<std::size_t>& tokens,
                                   double close_above, double edge_above, bool with_stats) {
  // A frame's pair pass at large n takes as long as an evaluation: it reports and stops alike.
  const double m = double(tokens.size());
  const EvaluationPass pass(m * (m - 1.0) / 2.0);
  const PairStatistics stats = cpu::kernels().pair_statistics(x, d, tokens, close_above, edge_above,
                                                              with_stats);
  pass.finish();
  return stats;
}
std::string cpu_kernels_runnable() {
  cpu::initialise_cpu_features();
  return cpu::names(true, " ");
}

}  // namespace mfattn
