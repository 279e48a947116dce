#include "mfattn/config.hpp"

#include "mfattn/gauge.hpp"
#include "mfattn/integrator.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

namespace mfattn {
namespace po = boost::program_options;

namespace {

template <class T>
po::typed_value<T>* bound(T& field) {
  return po::value<T>(&field)->default_value(field);
}
template <class T>
po::typed_value<T>* bound(T& field, const std::string& shown) {
  return po::value<T>(&field)->default_value(field, shown);
}

std::string format_number(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

[[noreturn]] void reject(const std::string& option, const std::string& value,
                         const std::string& accepted) {
  throw UsageError("--" + option + " " + value + ": " + accepted);
}

void require_choice(const std::string& option, const std::string& value,
                    const std::vector<std::string>& choices) {
  for (const auto& c : choices)
    if (value == c) return;
  std::string accepted = "accepted: ";
  for (std::size_t i = 0; i < choices.size(); ++i) accepted += (i ? ", " : "") + choices[i];
  reject(option, value, accepted);
}

void require_finite(const std::string& option, double value) {
  if (!std::isfinite(value)) reject(option, format_number(value), "must be a finite number");
}

bool is_preset_or_file(const std::string& value, const std::vector<std::string>& presets) {
  for (const auto& p : presets)
    if (value == p) return true;
  return std::ifstream(value).good();
}

/// Converts one stored option value to a typed /parameters attribute.
ParameterValue to_parameter(const boost::any& value) {
  if (const auto* v = boost::any_cast<std::int64_t>(&value)) return *v;
  if (const auto* v = boost::any_cast<double>(&value)) return *v;
  if (const auto* v = boost::any_cast<bool>(&value)) return *v;
  if (const auto* v = boost::any_cast<std::string>(&value)) return *v;
  return std::string("<unprintable>");
}

}  // namespace

po::parsed_options read_config_file(const std::string& path, const po::options_description& table,
                                    std::string& text) {
  std::ifstream file(path);
  if (!file) reject("config", path, "file cannot be read");
  std::ostringstream contents;
  contents << file.rdbuf();
  text = contents.str();
  std::istringstream in(text);
  // Sections are prefixes ("[model] n = 8" is "model.n"): a key is its last dotted part, and
  // a key that names no option is an error.
  po::parsed_options parsed = po::parse_config_file(in, table, /*allow_unregistered=*/true);
  for (auto& option : parsed.options) {
    const auto dot = option.string_key.rfind('.');
    const std::string key = dot == std::string::npos ? option.string_key : option.string_key.substr(dot + 1);
    if (!table.find_nothrow(key, false))
      reject("config", path, "unknown key '" + option.string_key + "'");
    option.string_key = key;
    option.unregistered = false;
  }
  return parsed;
}

po::options_description run_options(RunConfig& c) {
  po::options_description model("Model");
  model.add_options()
      ("n", bound(c.n), "active tokens, >= 1")
      ("d", bound(c.d), "ambient dimension, >= 2")
      ("beta", bound(c.beta), "inverse temperature, >= 0")
      ("kernel", bound(c.kernel), "usa (unnormalised) | sa (softmax)")
      ("time-scale", bound(c.time_scale),
       "natural | rescaled (weights times exp(-beta); needed for large beta)")
      ("q", bound(c.q), "query matrix: identity | gaussian | goe | FILE (d rows of d numbers)")
      ("k", bound(c.k), "key matrix: identity | gaussian | goe | FILE")
      ("v", bound(c.v), "value matrix: identity | gaussian | goe | plus-qk | minus-qk | FILE")
      ("geometry", bound(c.geometry),
       "positional gauge G(xi): none | rope | rope-axial | rope-mixed | rope-conjugated | lie")
      ("rope-base", bound(c.rope_base), "RoPE base: omega_b = base^(-2(b-1)/d), > 1")
      ("rope-freqs", bound(c.rope_freqs, "from base"),
       "explicit RoPE frequencies, floor(d/2) numbers (comma separated)")
      ("generators", bound(c.generators, "none"),
       "FILE of k skew-symmetric d x d generators (blocks of d rows): G(xi) = exp(sum xi_a Omega_a)")
      ("positions", bound(c.positions),
       "token positions xi: index (i * pos-scale) | uniform (2 pi i / n) | random (seeded) | "
       "grid (k = 2; the default for rope-axial and rope-mixed) | FILE (n rows of k numbers)")
      ("pos-scale", bound(c.pos_scale), "scale of index, random and grid positions, > 0")
      ("values", bound(c.values),
       "transported (v_ij = V G_i^T G_j x_j, gradient flow) | plain (v_ij = V x_j, practical RoPE)")
      ("aux-factor", bound(c.aux_factor),
       "none | distance (exp(-lambda |dxi|)) | gaussian (exp(-|dxi|^2/(2 sigma^2))) | "
       "cosine (cos(omega dxi), k = 1, USA only)")
      ("aux-lambda", bound(c.aux_lambda), "distance factor lambda >= 0")
      ("aux-sigma", bound(c.aux_sigma), "gaussian factor sigma > 0")
      ("aux-omega", bound(c.aux_omega), "cosine factor omega")
      ("mask", bound(c.mask),
       "full | causal (xi_j <= xi_i) | window (|xi_i - xi_j| <= window) | per-prompt (prefix "
       "tokens seen only within their prompt); combine with +, e.g. causal+per-prompt")
      ("window", bound(c.window), "window half-width for --mask window, > 0")
      ("prefix", bound(c.prefix), "frozen prefix tokens per prompt, >= 0 (they act as sources, never move)")
      ("prompts", bound(c.prompts),
       "prompts K >= 1: active token i belongs to prompt floor(i K / n), each prompt has --prefix tokens")
      ("prefix-init", bound(c.prefix_init),
       "prefix placement: random | clustered (one cluster per prompt) | FILE (K * prefix rows of d numbers)")
      ("prefix-weight", bound(c.prefix_weight),
       "presence (mass weight) of every prefix token, > 0 (> 1 counts one as several tokens)")
      ("prefix-spread", bound(c.prefix_spread), "clustered prefix: spread around each prompt's centre, >= 0")
      ("amplitudes", bound(c.amplitudes, "all 1"),
       "carrier amplitudes a_i >= 0 (one number, a list of n numbers, or a FILE); "
       "presence p_i = a_i^2 / (tau + a_i^2)")
      ("tau", bound(c.tau), "presence scale tau > 0")
      ("eps-den", bound(c.eps_den, "auto"),
       "SA denominator epsilon >= 0 (auto: 0 without presence weights, 1e-12 with)")
      ("null-tokens", bound(c.null_tokens),
       "append this many null tokens (amplitude 0) after the n active ones")
      ("noise-kappa", bound(c.noise_kappa),
       "noise: dx += sqrt(2/kappa) P_x dW (0 = deterministic; needs --integrator euler-maruyama)");
  po::options_description stepping("Time stepping");
  stepping.add_options()
      ("integrator", bound(c.integrator),
       "euler | heun | rk4 | lie-euler | lie-rk4 | dopri5 | euler-maruyama")
      ("dt", bound(c.dt), "step (fixed methods) or first step (dopri5), > 0")
      ("rtol", bound(c.rtol), "dopri5 relative tolerance, > 0")
      ("atol", bound(c.atol), "dopri5 absolute tolerance, > 0")
      ("horizon", bound(c.horizon), "final time T, > 0")
      ("save-every", bound(c.save_every, "horizon/100"), "frame every this many time units")
      ("save-times", bound(c.save_times, "none"), "explicit frame times, comma separated")
      ("save-log", bound(c.save_log), "N log-spaced frame times in [dt, horizon] (plus t = 0)");
  po::options_description initial("Initial state");
  initial.add_options()
      ("init", bound(c.init), "uniform | hemisphere | clustered | equiangular | file")
      ("init-file", bound(c.init_file, "none"),
       "text rows of d numbers, or an mfattn .h5 file (its last frame)")
      ("init-rho", bound(c.init_rho), "equiangular: common inner product in [-1/(n-1), 1)")
      ("init-clusters", bound(c.init_clusters), "clustered: number of centres, >= 1")
      ("init-spread", bound(c.init_spread), "clustered: spread around each centre, >= 0")
      ("normalize-init", po::bool_switch(&c.normalize_init), "normalise the rows of --init-file and of a --prefix-init file")
      ("replicas", bound(c.replicas), "independent initial conditions, >= 1")
      ("seed", bound(c.seed), "random seed, >= 0");
  po::options_description execution("Execution and output");
  execution.add_options()
      ("threads", bound(c.threads, "auto"),
       "worker threads (auto: OMP_NUM_THREADS, SLURM_CPUS_PER_TASK, all cores)")
      ("backend", bound(c.backend), "cpu | reference | cuda")
      ("out", bound(c.out, "required"), "output H5MD file")
      ("overwrite", po::bool_switch(&c.overwrite), "replace an existing output file")
      ("resume", po::bool_switch(&c.resume),
       "continue the run in --out from its last frame (same options; the horizon may grow)")
      ("deflate", po::bool_switch(&c.deflate), "compress positions (deflate level 4 + shuffle)")
      ("fletcher32", po::bool_switch(&c.fletcher32), "checksum every growing dataset")
      ("save-velocity", po::bool_switch(&c.save_velocity),
       "also write dx/dt of every frame (particles/tokens/velocity)")
      ("pair-delta", bound(c.pair_delta),
       "clustered_pair_fraction counts pairs with <x_i, x_j> > 1 - pair-delta, in (0, 2)")
      ("cluster-delta", bound(c.cluster_delta),
       "n_clusters: connected components of the graph <x_i, x_j> > 1 - cluster-delta, in (0, 2)")
      ("quiet", po::bool_switch(&c.quiet), "no progress output")
      ("config", bound(c.config, "none"), "INI file of options (the command line wins)");
  po::options_description all("mfattn run options");
  all.add(model).add(stepping).add(initial).add(execution);
  return all;
}

int resolve_threads(std::int64_t requested) {
  int threads = omp_get_num_procs();
  if (requested > 0) {
    threads = static_cast<int>(requested);
  } else {
    for (const char* name : {"SLURM_CPUS_PER_TASK", "OMP_NUM_THREADS"})
      if (const char* value = std::getenv(name); value && std::atoi(value) > 0)
        threads = std::atoi(value);  // OMP_NUM_THREADS, read last, wins over Slurm's count
  }
  // Every OpenMP region of the process (backend, observables) uses this team size, so that
  // --threads 1 really means one busy core.
  omp_set_num_threads(threads);
  return threads;
}

std::vector<std::string> mask_parts(const std::string& mask) {
  std::vector<std::string> parts;
  std::size_t begin = 0;
  while (begin <= mask.size()) {
    const std::size_t end = std::min(mask.find('+', begin), mask.size());
    parts.push_back(mask.substr(begin, end - begin));
    begin = end + 1;
  }
  return parts;
}

void validate(const RunConfig& c) {
  if (c.n < 1) reject("n", std::to_string(c.n), "must be an integer >= 1");
  if (c.d < 2) reject("d", std::to_string(c.d), "must be an integer >= 2");
  require_finite("beta", c.beta);
  if (c.beta < 0) reject("beta", format_number(c.beta), "must be >= 0");
  require_choice("kernel", c.kernel, {"usa", "sa"});
  require_choice("time-scale", c.time_scale, {"natural", "rescaled"});
  const std::vector<std::string> matrix_presets = {"identity", "gaussian", "goe"};
  if (!is_preset_or_file(c.q, matrix_presets))
    reject("q", c.q, "accepted: identity, gaussian, goe or a readable file");
  if (!is_preset_or_file(c.k, matrix_presets))
    reject("k", c.k, "accepted: identity, gaussian, goe or a readable file");
  if (!is_preset_or_file(c.v, {"identity", "gaussian", "goe", "plus-qk", "minus-qk"}))
    reject("v", c.v, "accepted: identity, gaussian, goe, plus-qk, minus-qk or a readable file");
  require_choice("geometry", c.geometry, geometry_names());
  require_finite("rope-base", c.rope_base);
  if (c.rope_base <= 1.0) reject("rope-base", format_number(c.rope_base), "must be > 1");
  if (!c.generators.empty() && !std::ifstream(c.generators).good())
    reject("generators", c.generators, "file cannot be read");
  if (!c.generators.empty() && c.geometry != "lie")
    reject("generators", c.generators, "needs --geometry lie (got " + c.geometry + ")");
  if (!is_preset_or_file(c.positions, {"index", "uniform", "random", "grid"}))
    reject("positions", c.positions, "accepted: index, uniform, random, grid or a readable file");
  require_choice("values", c.values, {"transported", "plain"});
  require_choice("aux-factor", c.aux_factor, {"none", "distance", "gaussian", "cosine"});
  require_finite("aux-lambda", c.aux_lambda);
  if (c.aux_lambda < 0) reject("aux-lambda", format_number(c.aux_lambda), "must be >= 0");
  require_finite("aux-sigma", c.aux_sigma);
  if (c.aux_sigma <= 0) reject("aux-sigma", format_number(c.aux_sigma), "must be > 0");
  require_finite("aux-omega", c.aux_omega);
  if (c.aux_factor == "cosine" && c.kernel == "sa")
    reject("aux-factor", c.aux_factor,
           "the cosine factor changes sign, so the SA denominator can vanish: use --kernel usa");
  require_finite("pos-scale", c.pos_scale);
  if (c.pos_scale <= 0) reject("pos-scale", format_number(c.pos_scale), "must be > 0");
  {
    const auto parts = mask_parts(c.mask);
    const std::string accepted =
        "accepted: full, causal, window, per-prompt, or causal / window joined with per-prompt by + "
        "(e.g. causal+per-prompt)";
    int positional = 0;
    for (const auto& part : parts) {
      if (part != "full" && part != "causal" && part != "window" && part != "per-prompt")
        reject("mask", c.mask, accepted);
      positional += part == "causal" || part == "window";
      if (part == "full" && parts.size() > 1) reject("mask", c.mask, accepted);
    }
    if (parts.empty() || positional > 1) reject("mask", c.mask, accepted);
    if (std::find(parts.begin(), parts.end(), "per-prompt") != parts.end() && c.prefix == 0)
      reject("mask", c.mask, "per-prompt needs prefix tokens (--prefix >= 1)");
  }
  require_finite("window", c.window);
  if (c.window <= 0) reject("window", format_number(c.window), "must be > 0");
  if (c.prefix < 0) reject("prefix", std::to_string(c.prefix), "must be an integer >= 0");
  if (c.prompts < 1) reject("prompts", std::to_string(c.prompts), "must be an integer >= 1");
  if (c.prompts > c.n)
    reject("prompts", std::to_string(c.prompts),
           "must be <= n = " + std::to_string(c.n) + " (every prompt needs an active token)");
  if (!is_preset_or_file(c.prefix_init, {"random", "clustered"}))
    reject("prefix-init", c.prefix_init, "accepted: random, clustered or a readable file");
  require_finite("prefix-weight", c.prefix_weight);
  if (c.prefix_weight <= 0) reject("prefix-weight", format_number(c.prefix_weight), "must be > 0");
  require_finite("prefix-spread", c.prefix_spread);
  if (c.prefix_spread < 0) reject("prefix-spread", format_number(c.prefix_spread), "must be >= 0");
  require_finite("tau", c.tau);
  if (c.tau <= 0) reject("tau", format_number(c.tau), "must be > 0");
  if (!std::isfinite(c.eps_den) || (c.eps_den < 0 && c.eps_den != -1.0))
    reject("eps-den", format_number(c.eps_den), "must be a finite number >= 0");
  if (c.null_tokens < 0) reject("null-tokens", std::to_string(c.null_tokens), "must be >= 0");
  require_finite("noise-kappa", c.noise_kappa);
  if (c.noise_kappa < 0) reject("noise-kappa", format_number(c.noise_kappa), "must be >= 0");
  require_choice("integrator", c.integrator, integrator_names());
  if (c.noise_kappa > 0 && c.integrator != "euler-maruyama")
    reject("noise-kappa", format_number(c.noise_kappa),
           "noise needs --integrator euler-maruyama (got " + c.integrator + ")");
  if (c.integrator == "euler-maruyama" && c.noise_kappa == 0)
    reject("integrator", c.integrator, "euler-maruyama needs --noise-kappa > 0");
  for (auto [name, value] : {std::pair{"dt", c.dt}, {"rtol", c.rtol}, {"atol", c.atol},
                             {"horizon", c.horizon}}) {
    require_finite(name, value);
    if (value <= 0) reject(name, format_number(value), "must be > 0");
  }
  require_finite("save-every", c.save_every);
  if (c.save_every < 0) reject("save-every", format_number(c.save_every), "must be > 0");
  if (c.save_log < 0 || c.save_log == 1)
    reject("save-log", std::to_string(c.save_log), "must be an integer >= 2");
  const int schedules = (c.save_every > 0) + !c.save_times.empty() + (c.save_log > 0);
  if (schedules > 1)
    reject("save-every", format_number(c.save_every),
           "give only one of --save-every, --save-times, --save-log");
  require_choice("init", c.init, {"uniform", "hemisphere", "clustered", "equiangular", "file"});
  if (c.init == "file" && c.init_file.empty())
    reject("init", c.init, "--init file needs --init-file FILE");
  if (!c.init_file.empty() && c.init != "file")
    reject("init-file", c.init_file, "needs --init file (got --init " + c.init + ")");
  if (!c.init_file.empty() && !std::ifstream(c.init_file).good())
    reject("init-file", c.init_file, "file cannot be read");
  require_finite("init-rho", c.init_rho);
  if (c.init == "equiangular") {
    const double lowest = c.n > 1 ? -1.0 / double(c.n - 1) : -1.0;
    if (c.init_rho < lowest || c.init_rho >= 1.0)
      reject("init-rho", format_number(c.init_rho),
             "must lie in [-1/(n-1), 1) = [" + format_number(lowest) + ", 1)");
    if (c.d < c.n + c.null_tokens)
      reject("init", c.init, "equiangular needs --d >= number of tokens (d = " +
                                 std::to_string(c.d) + ", tokens = " +
                                 std::to_string(c.n + c.null_tokens) + ")");
  }
  if (c.init_clusters < 1)
    reject("init-clusters", std::to_string(c.init_clusters), "must be an integer >= 1");
  require_finite("init-spread", c.init_spread);
  if (c.init_spread < 0) reject("init-spread", format_number(c.init_spread), "must be >= 0");
  if (c.replicas < 1) reject("replicas", std::to_string(c.replicas), "must be an integer >= 1");
  if (c.seed < 0) reject("seed", std::to_string(c.seed), "must be an integer >= 0");
  if (c.threads < 0) reject("threads", std::to_string(c.threads), "must be an integer >= 1");
  require_choice("backend", c.backend, {"cpu", "reference", "cuda"});
  for (auto [name, value] : {std::pair{"pair-delta", c.pair_delta}, {"cluster-delta", c.cluster_delta}}) {
    require_finite(name, value);
    if (!(value > 0.0 && value < 2.0)) reject(name, format_number(value), "must lie in (0, 2)");
  }
  if (c.out.empty()) throw UsageError("--out: missing (the output .h5 file is required)");
}

RunConfig parse_run_arguments(const std::vector<std::string>& args) {
  RunConfig cfg;
  const auto table = run_options(cfg);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(table).run(), vm);
    // The config file is named on the command line, so look it up before notify().
    if (vm.count("config") && !vm["config"].defaulted()) {
      const std::string path = vm["config"].as<std::string>();
      // The command line was stored first, so its values win over the file's.
      po::store(read_config_file(path, table, cfg.config_text), vm);
    }
    po::notify(vm);
  } catch (const UsageError&) {
    throw;
  } catch (const po::invalid_option_value& e) {
    throw UsageError(std::string(e.what()) + " (a number of the right kind is expected)");
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }
  validate(cfg);
  std::ostringstream command_line;
  command_line << "mfattn run";
  for (const auto& arg : args) command_line << ' ' << arg;
  cfg.command_line = command_line.str();
  for (const auto& option : table.options()) {
    const std::string& name = option->long_name();
    if (vm.count(name)) cfg.parameters.push_back({name, to_parameter(vm[name].value())});
  }
  return cfg;
}

}  // namespace mfattn
