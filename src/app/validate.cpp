// validate(): every option of `mfattn run` checked once, before anything is written, with one
// message naming the option, the value and what is accepted (UsageError, exit 2); the choice
// names looked up once and returned as RunChoices. The sizes (tokens, frames, memory) are
// checked against the limits of config.hpp and the machine (run_resources.cpp).
#include "mfattn/app/config.hpp"

#include <omp.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>

#include "app/option_rules.hpp"
#include "mfattn/backends/backend.hpp"
#include "mfattn/core/gauge.hpp"
#include "mfattn/core/input_file.hpp"
#include "mfattn/integrators/integrator.hpp"
#include "mfattn/io/weights_file.hpp"
#include "mfattn/app/run_choices.hpp"
#include "mfattn/app/run_resources.hpp"
#include "mfattn/app/validate.hpp"

namespace mfattn {

using namespace option_rules;

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

std::optional<MaskSelection> parse_mask(const std::string& mask) {
  const auto parts = mask_parts(mask);
  MaskSelection selection;
  int kinds = 0;
  for (const std::string& name : parts) {
    const Choice<MaskPart>* part = kMaskOption.find(name);
    if (!part) return std::nullopt;
    if (part->value.per_prompt) {
      selection.per_prompt = true;
      continue;
    }
    // "full" is no mask at all, so joining it to a part would say two things at once.
    if (part->value.kind == MaskKind::Full && parts.size() > 1) return std::nullopt;
    if (++kinds > 1) return std::nullopt;  // one kind of mask: causal+window means nothing
    selection.kind = part->value.kind;
  }
  return selection;
}

namespace {

/// --out must name a file (each name at most NAME_MAX bytes) in a folder that exists.
void validate_output_path(const std::string& out) {
  namespace fs = std::filesystem;
  const fs::path path(out);
  constexpr std::size_t kNameMax = 255;
  if (out.size() >= 4096) reject("out", out, "the path is " + std::to_string(out.size()) + " bytes, longer than the 4095 accepted");
  for (const auto& part : path)
    if (part.native().size() > kNameMax)
      reject("out", out, "the name '" + shown(part.native()) + "' is " + std::to_string(part.native().size()) +
                             " bytes, longer than the " + std::to_string(kNameMax) + " a file name may have");
  const std::string name = path.filename().native();
  if (name.empty() || name == "." || name == "..") reject("out", out, "must name a file (e.g. run.h5)");
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (fs::is_directory(status)) reject("out", out, "is a folder; name a file in it (e.g. run.h5)");
  // A device node or FIFO would be replaced by a file (--overwrite) or written into.
  if (fs::exists(status) && !fs::is_regular_file(status))
    reject("out", out, "is not a regular file (a device, FIFO or socket); --out names a regular file, "
                       "and --overwrite replaces regular files only");
  const fs::path folder = path.has_parent_path() ? path.parent_path() : fs::path(".");
  // Missing is not the only reason: a folder above may not be searchable (permission denied).
  const fs::file_status folder_status = fs::status(folder, error);
  if (!fs::is_directory(folder_status))
    reject("out", out, "the folder " + shown(folder.native()) +
                           (error && folder_status.type() != fs::file_type::not_found
                                ? " cannot be reached: " + error.message()
                                : " does not exist (create it first)"));
}

/// Token counts, frame counts and memory, before anything is allocated. Every product is
/// taken in double (exact far beyond any accepted size) or after bounds that keep int64 exact.
void validate_sizes(const RunConfig& c, const RunChoices& choices) {
  const std::string limit = std::to_string(kMaxRunTokens);
  if (c.n > kMaxRunTokens) reject("n", std::to_string(c.n), "must be an integer in [1, " + limit + "]");
  if (c.d > kMaxRunTokens) reject("d", std::to_string(c.d), "must be an integer in [2, " + limit + "]");
  if (c.replicas > kMaxRunTokens)
    reject("replicas", std::to_string(c.replicas), "must be an integer in [1, " + limit + "]");
  if (c.null_tokens > kMaxRunTokens - c.n)
    reject("null-tokens", std::to_string(c.null_tokens),
           "n + null tokens = " + format_number(double(c.n) + double(c.null_tokens)) + " is more than the " +
               limit + " tokens accepted");
  const double prefix_count = double(c.prefix) * double(c.prompts);
  if (prefix_count > double(kMaxRunTokens - c.n - c.null_tokens))
    reject("prefix", std::to_string(c.prefix),
           "prompts * prefix = " + std::to_string(c.prompts) + " * " + std::to_string(c.prefix) + " = " +
               format_number(prefix_count) + " prefix tokens, with n + null tokens more than the " + limit +
               " tokens accepted");
  // Frames.
  if (c.save_log > kMaxFrames)
    reject("save-log", std::to_string(c.save_log), "must be an integer in [2, 10^7] (frames written)");
  if (c.save_times.empty() && c.save_log == 0) {
    const double every = c.save_every > 0 ? c.save_every : c.horizon / 100.0;
    const double frames = std::floor(c.horizon / every);
    if (!(frames <= double(kMaxFrames)))
      reject(c.save_every > 0 ? "save-every" : "horizon",
             format_number(c.save_every > 0 ? c.save_every : c.horizon),
             "gives " + format_number(frames) + " frames over the horizon " + format_number(c.horizon) +
                 ", more than the 10^7 accepted");
  }
  const double needed = estimated_memory_bytes(c, choices);
  std::string source;
  const double available = available_memory_bytes(&source);
  if (needed > available)
    throw UsageError("--n " + std::to_string(c.n) + " --d " + std::to_string(c.d) + " --replicas " +
                     std::to_string(c.replicas) + " --null-tokens " + std::to_string(c.null_tokens) +
                     " --prefix " + std::to_string(c.prefix) + " --prompts " + std::to_string(c.prompts) +
                     ": the run needs about " + format_bytes(needed) + " of memory, more than the " +
                     format_bytes(available) + " available (" + source + "); make it smaller");
}

/// "[4, 4, 16]"
std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string text = "[";
  for (std::size_t a = 0; a < shape.size(); ++a) text += (a ? ", " : "") + std::to_string(shape[a]);
  return text + "]";
}

/// The layer's options (docs/model.md section 2b): the shape's integers, the activation, and
/// a --weights file's datasets against --d, --heads, --head-dim and --mlp; returns the file's
/// layer count (0 without a file).
std::size_t validate_layer(const RunConfig& c, RunChoices& choices) {
  choices.mlp_activation = require_choice(kActivationOption, c.mlp_activation);
  if (c.layer.mlp_width == 0 && (c.was_given("mlp-activation") ||
                                 choices.mlp_activation != require_choice(kActivationOption, RunConfig{}.mlp_activation)))
    reject("mlp-activation", c.mlp_activation, "there is no feed-forward term to act in (give --mlp W)");
  const std::int64_t d = c.d, heads = c.layer.heads, r = c.layer.head_dim ? c.layer.head_dim : d;
  const bool several = heads > 1 || r < d;
  if (several)
    for (const auto& [option, value] : {std::pair{"q", &c.q}, std::pair{"k", &c.k}, std::pair{"v", &c.v}})
      if (!kQueryOption.find(*value) && !kValueOption.find(*value))
        reject(option, *value, "a file gives one d x d matrix, not the r x d matrices of --heads " +
                                   std::to_string(heads) + " --head-dim " + std::to_string(r) +
                                   " (give the heads in a --weights file)");
  if (r < d && !c.generators.empty())
    reject("generators", c.generators, "d x d generators cannot gauge the r = " + std::to_string(r) +
                                           " dimensional heads of --head-dim (use a block family)");
  if (r < 2 && choices.geometry != GeometryKind::None)
    reject("head-dim", std::to_string(r), "a --geometry needs heads of r >= 2");
  require_finite("layer-time", c.layer_time);
  if (c.layer_time < 0) reject("layer-time", format_number(c.layer_time), "must be >= 0");
  require_resolved_span("layer-time", c.layer_time, c.horizon, /*zero_is_off=*/true);
  if (c.weights.empty()) {
    if (c.layer_time > 0)
      reject("layer-time", format_number(c.layer_time), "needs a --weights file with a leading layer axis");
    return 0;
  }
  if (!c.weights_in_memory) require_input_file("weights", c.weights);
  if (c.regen_period > 0)
    reject("regen-period", format_number(c.regen_period),
           "redraws random matrices; a --weights file gives its own layers (use --layer-time)");
  WeightsFile file;
  try {
    file = c.weights_in_memory ? *c.weights_in_memory : read_weights_file(c.weights);
  } catch (const std::exception& e) {
    reject("weights", c.weights, e.what());
  }
  const auto D = static_cast<std::size_t>(d), H = static_cast<std::size_t>(heads), R = static_cast<std::size_t>(r),
             W = static_cast<std::size_t>(c.layer.mlp_width);
  // The value space rv may differ from r (a head keeping a d x d value has rv = d): the
  // file's /attention/value says it, and /attention/output must agree.
  const std::size_t RV = value_dim_of(file, R);
  std::size_t layers = 0;  // 0: not known yet
  // Each dataset's shape is `expected`, or `expected` after a leading layer axis.
  auto check = [&](const char* name, const WeightArray& array, std::vector<std::size_t> expected,
                   const std::string& from) {
    std::vector<std::size_t> shape = array.shape;
    std::size_t file_layers = 1;
    if (shape.size() == expected.size() + 1) {
      file_layers = shape.front();
      shape.erase(shape.begin());
    }
    if (shape != expected || (layers && file_layers != layers)) {
      const std::string axis = layers ? std::to_string(layers) : "L";
      reject("weights", c.weights,
             std::string(name) + " is " + shape_text(array.shape) + "; expected " + shape_text(expected) +
                 " or [" + axis + ", " + shape_text(expected).substr(1) + " from " + from);
    }
    layers = file_layers;
  };
  const std::string head_options = "--heads " + std::to_string(H) + " --head-dim " + std::to_string(R) +
                                   " --d " + std::to_string(D);
  const WeightArray* attention[] = {&file.query, &file.key, &file.value, &file.output};
  const bool any_attention = std::any_of(std::begin(attention), std::end(attention), [](auto* a) { return a->present(); });
  if (any_attention) {
    const char* names[] = {"/attention/query", "/attention/key", "/attention/value", "/attention/output"};
    for (std::size_t a = 0; a < 4; ++a)
      if (!attention[a]->present())
        reject("weights", c.weights, std::string(names[a]) + " is missing (a file with /attention has query, key, value and output)");
    for (const auto& [option, value, preset] : {std::tuple{"q", &c.q, choices.q}, std::tuple{"k", &c.k, choices.k},
                                                std::tuple{"v", &c.v, choices.v}})
      if (preset != MatrixPreset::Identity)
        reject(option, *value, "not taken with --weights " + shown(c.weights) + ", whose /attention gives Q, K and V");
    check("/attention/query", file.query, {H, R, D}, head_options);
    check("/attention/key", file.key, {H, R, D}, head_options);
    check("/attention/value", file.value, {H, RV, D}, head_options + " (rv = " + std::to_string(RV) + ")");
    check("/attention/output", file.output, {D, H * RV}, head_options + " (rv = " + std::to_string(RV) + ")");
  }
  const WeightArray* mlp[] = {&file.w1, &file.b1, &file.w2, &file.b2};
  const bool any_mlp = std::any_of(std::begin(mlp), std::end(mlp), [](auto* a) { return a->present(); });
  if (any_mlp) {
    const char* names[] = {"/mlp/w1", "/mlp/b1", "/mlp/w2", "/mlp/b2"};
    for (std::size_t a = 0; a < 4; ++a)
      if (!mlp[a]->present()) reject("weights", c.weights, std::string(names[a]) + " is missing (/mlp has w1, b1, w2 and b2)");
    const std::string mlp_options = "--mlp " + std::to_string(W) + " --d " + std::to_string(D);
    check("/mlp/w1", file.w1, {W, D}, mlp_options);
    check("/mlp/b1", file.b1, {W}, mlp_options);
    check("/mlp/w2", file.w2, {D, W}, mlp_options);
    check("/mlp/b2", file.b2, {D}, mlp_options);
    if (file.activation.empty())
      reject("weights", c.weights,
             "/mlp has no activation attribute (" + kActivationOption.accepted() +
                 "; analysis/export_torch.py writes it, h5py: f[\"mlp\"].attrs[\"activation\"] = \"gelu\")");
    if (file.activation != c.mlp_activation)
      reject("mlp-activation", c.mlp_activation,
             "the --weights file's /mlp says activation " + shown(file.activation) + " (give --mlp-activation " +
                 shown(file.activation) + ")");
  }
  if (!any_attention && !any_mlp)
    reject("weights", c.weights, "holds neither /attention nor /mlp (see docs/model.md, section 2b)");
  if (layers > 1 && !(c.layer_time > 0))
    reject("weights", c.weights,
           "holds " + std::to_string(layers) + " layers: give --layer-time T (layer l acts on [l T, (l + 1) T))");
  if (layers > 1 && c.horizon > double(layers) * c.layer_time * (1.0 + 1e-12))
    reject("horizon", format_number(c.horizon),
           "the --weights file's " + std::to_string(layers) + " layers of --layer-time " + format_number(c.layer_time) +
               " end at t = " + format_number(double(layers) * c.layer_time));
  if (layers == 1 && c.layer_time > 0)
    reject("layer-time", format_number(c.layer_time), "the --weights file holds one layer (no leading layer axis, or one of length 1): --layer-time "
                                                      "spreads L >= 2 layers over time; leave it out");
  choices.weights = std::make_shared<const WeightsFile>(std::move(file));
  return layers;
}

}  // namespace

/// The names of the integrators whose table entry keep accepts, in the table's order.
template <class Keep>
std::string integrators_where(Keep&& keep) {
  std::vector<std::string> names;
  for (const std::string& name : integrator_names())
    if (keep(*find_integrator(name))) names.push_back(name);
  return joined(names, ", ");
}

/// --kernel sinkhorn (docs/model.md section 2d): its numbers, and the options whose matrices
/// have no scaling of the kind.
void validate_sinkhorn(const RunConfig& c, Normalization kernel, const AuxFactorChoice& aux_factor,
                       const MaskSelection& mask) {
  if (kernel != Normalization::Sinkhorn) return;
  // The accepted values, from the tables (a new mask kind or factor is listed by its entry).
  if (is_causal(mask.kind))
    reject(
        "mask", c.mask,
        "with --kernel sinkhorn: a causal matrix has no doubly stochastic scaling (the first token sees only "
        "itself, or nothing with causal-strict, so its column is full and every later row must leave it: the "
        "sweeps tend to the identity); accepted: " +
            kMaskOption.names(", ", [](const MaskPart& part) { return !is_causal(part.kind); }) +
            " and their combinations");
  if (aux_factor.changes_sign)
    reject("aux-factor", c.aux_factor,
           "the " + c.aux_factor + " factor changes sign, and --kernel sinkhorn scales nonnegative weights: "
           "accepted: " + kAuxFactorOption.names(", ", [](const AuxFactorChoice& factor) { return !factor.changes_sign; }));
  if (c.eps_den > 0)
    reject("eps-den", format_number(c.eps_den),
           "is SA's denominator term, and --kernel sinkhorn's rows sum to 1 by construction: leave it auto");
}

/// --amplitudes: one number for every token, n numbers, or a file of n rows.
std::vector<double> amplitudes_option(const RunConfig& cfg) {
  const std::size_t n = static_cast<std::size_t>(cfg.n);
  std::vector<double> values;
  if (!parse_number_list(cfg.amplitudes, values)) {
    std::size_t rows = 0;
    try {
      values = read_text_rows(cfg.amplitudes, 1, rows);
    } catch (const std::exception& e) {
      throw UsageError("--amplitudes " + cfg.amplitudes +
                       ": neither a list of numbers nor a readable file (" + e.what() + ")");
    }
  }
  if (values.size() == 1) values.assign(n, values[0]);
  if (values.size() != n)
    throw UsageError("--amplitudes " + cfg.amplitudes + ": needs 1 or n = " + std::to_string(n) +
                     " numbers, found " + std::to_string(values.size()));
  // presence a^2 / (tau + a^2) needs a finite square.
  for (double a : values)
    if (!(a >= 0.0) || !std::isfinite(a * a))
      throw UsageError("--amplitudes " + cfg.amplitudes +
                       ": amplitudes must lie in [0, 1.3e154] (their square must be a finite number)");
  return values;
}

/// Every number of kNumberOptions, by its rule (one message per rule for every number).
void validate_numbers(const RunConfig& c) {
  for (const NumberOption& number : kNumberOptions)
    std::visit(
        [&](auto field) {
          using Feature = decltype(feature_of_field(field));
          const auto value = c.feature<Feature>().*field;
          if constexpr (std::is_floating_point_v<decltype(value)>) require_finite(number.option, value);
          switch (number.rule) {
            case NumberRule::Finite: break;
            case NumberRule::AtLeastZero:
              if (value < 0) reject(number.option, format_number(double(value)), "must be >= 0");
              break;
            case NumberRule::Positive:
              if (!(value > 0)) reject(number.option, format_number(double(value)), "must be > 0");
              break;
            case NumberRule::IntegerRange: {
              const std::int64_t most = number.most > 0 ? number.most : c.d;
              if (!(value >= number.least && value <= most))
                reject(number.option, format_number(double(value)),
                       "must be an integer in [" + std::to_string(number.least) + ", " + std::to_string(most) + "]" +
                           (number.most > 0 ? "" : " (d = " + std::to_string(c.d) + ")"));
              break;
            }
          }
        },
        number.field);
}

namespace {

/// The sizes, the numbers of kNumberOptions, beta, the kernel and the time scale.
void validate_model_numbers(const RunConfig& c, RunChoices& choices) {
  if (c.n < 1) reject("n", std::to_string(c.n), "must be an integer >= 1");
  if (c.d < 2) reject("d", std::to_string(c.d), "must be an integer >= 2");
  validate_numbers(c);
  require_finite("beta", c.beta);
  const Normalization kernel = choices.kernel = require_choice(kKernelOption, c.kernel);
  const TimeScale time_scale = choices.time_scale = require_choice(kTimeScaleOption, c.time_scale);
  // USA in natural time weighs the token itself by exp(beta <Q x, K x>) = exp(beta) for
  // Q = K = I, and an antipodal pair by exp(-beta): beyond log(DBL_MAX) either overflows, and
  // the backends stop. Rescaled time multiplies by exp(-beta): exp(beta (s - 1)) <= 1 for
  // beta >= 0, but up to exp(2 |beta|) for beta < 0 (s = -1).
  const double overflow = std::log(DBL_MAX);
  if (kernel == Normalization::Usa && time_scale == TimeScale::Natural &&
      std::fabs(c.beta) > overflow)
    reject("beta", format_number(c.beta),
           "with --kernel usa and --time-scale natural the weights exp(|beta|) overflow double for "
           "|beta| > 709.78: use --time-scale rescaled for beta > 0 (or --kernel sa)");
  if (kernel == Normalization::Usa && time_scale == TimeScale::Rescaled && c.beta < -overflow / 2)
    reject(
        "beta", format_number(c.beta),
        "with --kernel usa, --time-scale rescaled and beta < 0 the weights exp(beta (s - 1)) reach "
        "exp(2 |beta|), which overflows double for beta < -354.89: use --time-scale natural "
        "(|beta| <= 709.78)");
}

/// Q, K, V (presets or files), who shares their draws, and the layers of --regen-period.
void validate_matrices(const RunConfig& c, RunChoices& choices) {
  choices.q = require_preset_or_file(kQueryOption, c.q);
  choices.k = require_preset_or_file(kKeyOption, c.k);
  choices.v = require_preset_or_file(kValueOption, c.v);
  const std::optional<MatrixPreset> presets[] = {choices.q, choices.k, choices.v};
  // A feed-forward term's preset is random too (a file's /mlp, checked later, replaces it).
  const bool random = c.layer.mlp_width > 0 ||
                      std::any_of(std::begin(presets), std::end(presets), [](const auto& preset) {
                        return preset && is_random_preset(*preset);
                      });
  const std::string named = "--q " + shown(c.q) + " --k " + shown(c.k) + " --v " + shown(c.v);
  choices.matrices = require_choice(kMatrixSharingOption, c.matrices);
  if (choices.matrices == MatrixSharing::PerReplica && !random)
    reject("matrices", c.matrices,
           "per-replica draws only change random presets, and " + named + " has none");
  require_finite("regen-period", c.regen_period);
  if (c.regen_period < 0) reject("regen-period", format_number(c.regen_period), "must be >= 0");
  require_resolved_span("regen-period", c.regen_period, c.horizon, /*zero_is_off=*/true);
  if (c.regen_period > 0 && !random)
    reject("regen-period", format_number(c.regen_period),
           "a new layer redraws random presets only, and " + named + " has none");
  if (c.regen_period > 0 && c.horizon / c.regen_period > double(kMaxLayers))
    reject("regen-period", format_number(c.regen_period),
           "the horizon " + format_number(c.horizon) + " would take more than " +
               std::to_string(kMaxLayers) + " layers");
}

/// The positional gauge, the positions, the auxiliary factor, the mask, the prefix tokens, the presences and Sinkhorn's numbers.
void validate_pair_terms(const RunConfig& c, RunChoices& choices) {
  const Normalization kernel = choices.kernel;
  const GeometryKind geometry = choices.geometry = require_choice(kGeometryOption, c.geometry);
  require_finite("rope-base", c.rope_base);
  if (c.rope_base <= 1.0) reject("rope-base", format_number(c.rope_base), "must be > 1");
  if (!c.generators.empty()) require_input_file("generators", c.generators);
  if (!c.generators.empty() && !takes_generators(geometry))
    reject("generators", c.generators, "needs --geometry lie (got " + c.geometry + ")");
  choices.positions = require_preset_or_file(kPositionsOption, c.positions);
  choices.values = require_choice(kValuesOption, c.values);
  const AuxFactorChoice aux_factor = choices.aux_factor = require_choice(kAuxFactorOption, c.aux_factor);
  if (aux_factor.factor == AuxFactor::Toeplitz) choices.toeplitz = toeplitz_series(c);
  if (!c.rope_freqs.empty() && !parse_number_list(c.rope_freqs, choices.rope_frequencies))
    reject("rope-freqs", c.rope_freqs, "needs a list of finite numbers");
  if (!c.amplitudes.empty()) choices.amplitudes = amplitudes_option(c);
  if (aux_factor.changes_sign && kernel == Normalization::Sa)
    reject("aux-factor", c.aux_factor,
           "the " + c.aux_factor + " factor changes sign, so the SA denominator can vanish: use --kernel usa");
  choices.usa_denominator = require_choice(kUsaDenominatorOption, c.usa_denominator);
  if (choices.usa_denominator == UsaDenominator::FactorRows) {
    if (kernel != Normalization::Usa)
      reject("usa-denominator", c.usa_denominator,
             "divides USA's sums; --kernel " + c.kernel + " has its own (take --kernel usa)");
    if (aux_factor.changes_sign)
      reject("usa-denominator", c.usa_denominator,
             "with --aux-factor " + c.aux_factor +
                 ": its weights change sign, so a row's sum can vanish (accepted: " +
                 kAuxFactorOption.names(
                     ", ", [](const AuxFactorChoice& factor) { return !factor.changes_sign; }) +
                 ")");
    if (is_whole_layer(c))
      reject(
          "usa-denominator", c.usa_denominator,
          "scales each receiver's attention, and a whole layer (--heads, --head-dim, --mlp, --weights) adds terms "
          "it would scale too: take the one head of --q, --k, --v");
  }
  require_finite("pos-scale", c.pos_scale);
  if (c.pos_scale <= 0) reject("pos-scale", format_number(c.pos_scale), "must be > 0");
  {
    const auto mask = parse_mask(c.mask);
    if (!mask)
      reject("mask", c.mask,
             "accepted: " + kMaskOption.names(", ") +
                 ", or causal / window joined with per-prompt by + (e.g. causal+per-prompt)");
    if (mask->per_prompt && c.prefix == 0)
      reject("mask", c.mask, "per-prompt needs prefix tokens (--prefix >= 1)");
    choices.mask = *mask;
  }
  if (c.prefix < 0) reject("prefix", std::to_string(c.prefix), "must be an integer >= 0");
  if (c.prompts < 1) reject("prompts", std::to_string(c.prompts), "must be an integer >= 1");
  if (c.prompts > c.n)
    reject("prompts", std::to_string(c.prompts),
           "must be <= n = " + std::to_string(c.n) + " (every prompt needs an active token)");
  choices.prefix_init = require_preset_or_file(kPrefixInitOption, c.prefix_init);
  require_finite("prefix-weight", c.prefix_weight);
  if (c.prefix_weight <= 0) reject("prefix-weight", format_number(c.prefix_weight), "must be > 0");
  require_finite("prefix-spread", c.prefix_spread);
  if (!(c.prefix_spread >= 0 && c.prefix_spread <= 1e6))
    reject("prefix-spread", format_number(c.prefix_spread),
           "must lie in [0, 1e6] (points spread by a few units are uniform on the sphere already)");
  require_finite("tau", c.tau);
  if (c.tau <= 0) reject("tau", format_number(c.tau), "must be > 0");
  if (!std::isfinite(c.eps_den) || (c.eps_den < 0 && c.eps_den != -1.0))
    reject("eps-den", format_number(c.eps_den), "must be a finite number >= 0, or auto");
  validate_sinkhorn(c, kernel, aux_factor, choices.mask);
}

/// Null tokens, noise, the integrator and the placement it must suit, and the frame schedule.
void validate_integration(const RunConfig& c, RunChoices& choices) {
  if (c.null_tokens < 0) reject("null-tokens", std::to_string(c.null_tokens), "must be >= 0");
  require_finite("noise-kappa", c.noise_kappa);
  if (c.noise_kappa < 0) reject("noise-kappa", format_number(c.noise_kappa), "must be >= 0");
  if (c.noise_kappa > 0 && !std::isfinite(std::sqrt(2.0 / c.noise_kappa)))
    reject("noise-kappa", format_number(c.noise_kappa), "must be 0 or large enough that sqrt(2/kappa) is finite");
  choices.integrator = find_integrator(c.integrator);
  if (!choices.integrator) reject("integrator", c.integrator, "accepted: " + joined(integrator_names(), ", "));
  // Where the layer's normalization sits (docs/model.md section 2c).
  choices.placement = require_choice(kPlacementOption, c.normalization);
  require_finite("ngpt-alpha", c.ngpt_alpha);
  if (!(c.ngpt_alpha > 0)) reject("ngpt-alpha", format_number(c.ngpt_alpha), "must be > 0");
  require_finite("init-radius", c.init_radius);
  if (!(c.init_radius > 0)) reject("init-radius", format_number(c.init_radius), "must be > 0");
  if (placement_on_sphere(choices.placement)) {
    if (c.init_radius != 1.0)
      reject("init-radius", format_number(c.init_radius),
             "scales states in R^d, and --normalization " + c.normalization + " keeps them on the sphere");
    if (choices.placement == Placement::Ngpt && choices.integrator->steps_unprojected_output) {
      reject("integrator", c.integrator, "steps the post field x <- N(x + h p u); --normalization ngpt takes " +
                                             integrators_where([](const IntegratorEntry& entry) {
                                               return !entry.steps_unprojected_output;
                                             }));
    }
  } else if (!choices.integrator->takes_euclidean) {
    reject("integrator", c.integrator,
           "moves on the sphere, and --normalization " + c.normalization + " keeps the states in R^d (accepted: " +
               integrators_where([](const IntegratorEntry& entry) { return entry.takes_euclidean; }) + ")");
  }
  choices.save_positions = require_choice(kSavePositionsOption, c.save_positions);
  if (choices.save_positions == PositionFrames::None && c.save_velocity)
    reject("save-positions", c.save_positions,
           "writes no positions, and --save-velocity writes dx/dt at the frames that have them: "
           "drop --save-velocity or take --save-positions ends or all");
  choices.common_noise_kind = require_choice(kCommonNoiseKindOption, c.common_noise_kind);
  require_finite("common-noise", c.common_noise);
  if (!(c.common_noise >= 0 && c.common_noise <= 1e6))
    reject("common-noise", format_number(c.common_noise), "must lie in [0, 1e6]");
  auto stochastic = [](const IntegratorEntry& entry) { return entry.stochastic; };
  auto stratonovich = [](const IntegratorEntry& entry) { return entry.stratonovich; };
  if (c.noise_kappa > 0 && !choices.integrator->stochastic)
    reject("noise-kappa", format_number(c.noise_kappa),
           "noise needs a stochastic --integrator (" + integrators_where(stochastic) + "; got " +
               c.integrator + ")");
  if (c.common_noise > 0 && !choices.integrator->stratonovich)
    reject("common-noise", format_number(c.common_noise),
           "is Stratonovich noise (its Ito form needs a correction drift), which --integrator " +
               c.integrator + " does not take (accepted: " + integrators_where(stratonovich) + ")");
  if (choices.integrator->stochastic && c.noise_kappa == 0 && c.common_noise == 0)
    reject("integrator", c.integrator,
           c.integrator + (choices.integrator->stratonovich
                               ? " needs --noise-kappa > 0 or --common-noise > 0"
                               : " needs --noise-kappa > 0"));
  for (auto [name, value] : {std::pair{"dt", c.dt}, {"rtol", c.rtol}, {"atol", c.atol},
                             {"horizon", c.horizon}}) {
    require_finite(name, value);
    if (value <= 0) reject(name, format_number(value), "must be > 0");
  }
  require_resolved_span("horizon", c.horizon, c.horizon, /*zero_is_off=*/false);
  require_finite("save-every", c.save_every);
  if (c.save_every < 0) reject("save-every", format_number(c.save_every), "must be > 0");
  if (c.save_log < 0 || c.save_log == 1)
    reject("save-log", std::to_string(c.save_log), "must be an integer >= 2");
  if (!c.save_times.empty()) {
    if (!parse_number_list(c.save_times, choices.save_times))
      reject("save-times", c.save_times, "needs a list of finite numbers");
    for (double t : choices.save_times)
      if (t < 0 || t > c.horizon) reject("save-times", c.save_times, "times must lie in [0, horizon]");
  }
  const int schedules = (c.save_every > 0) + !c.save_times.empty() + (c.save_log > 0);
  if (schedules > 1)
    reject("save-every", format_number(c.save_every),
           "give only one of --save-every, --save-times, --save-log");
}

/// The initial state, the replicas and the seed.
void validate_initial_state(const RunConfig& c, RunChoices& choices) {
  const InitKind init = choices.init = require_choice(kInitOption, c.init);
  if (init == InitKind::File && c.init_file.empty())
    reject("init", c.init, "--init file needs --init-file FILE");
  if (!c.init_file.empty() && init != InitKind::File)
    reject("init-file", c.init_file, "needs --init file (got --init " + c.init + ")");
  if (!c.init_file.empty()) require_input_file("init-file", c.init_file);
  require_finite("init-rho", c.init_rho);
  if (init == InitKind::Equiangular) {
    const double lowest = c.n > 1 ? -1.0 / double(c.n - 1) : -1.0;
    if (c.init_rho < lowest || c.init_rho >= 1.0)
      reject("init-rho", format_number(c.init_rho),
             "must lie in [-1/(n-1), 1) = [" + format_number(lowest) + ", 1)");
    if (double(c.d) < double(c.n) + double(c.null_tokens))
      reject("init", c.init, "equiangular needs --d >= number of tokens (d = " +
                                 std::to_string(c.d) + ", tokens = " +
                                 format_number(double(c.n) + double(c.null_tokens)) + ")");
  }
  if (c.init_clusters < 1)
    reject("init-clusters", std::to_string(c.init_clusters), "must be an integer >= 1");
  require_finite("init-spread", c.init_spread);
  if (!(c.init_spread >= 0 && c.init_spread <= 1e6))
    reject("init-spread", format_number(c.init_spread),
           "must lie in [0, 1e6] (points spread by a few units are uniform on the sphere already)");
  if (c.replicas < 1) reject("replicas", std::to_string(c.replicas), "must be an integer >= 1");
  if (c.seed < 0) reject("seed", std::to_string(c.seed), "must be an integer >= 0");
}

/// Threads, the backend and what its registry entry takes, precision, the observables' thresholds, flushes, the layer's weights, the output and the run's sizes.
void validate_execution(const RunConfig& c, RunChoices& choices) {
  if (c.threads < 0 || c.threads > kMaxThreads)
    reject("threads", std::to_string(c.threads),
           "must be an integer in [0, " + std::to_string(kMaxThreads) + "] (0: automatic)");
  choices.backend = find_backend(c.backend);
  if (!choices.backend) reject("backend", c.backend, "accepted: " + backend_names_text(", "));
  choices.precision = require_choice(kPrecisionOption, c.precision);
  choices.evaluation = require_choice(kPairEvaluationOption, c.evaluation);
  require_finite("evaluation-tol", c.evaluation_tol);
  if (!(c.evaluation_tol >= 1e-16 && c.evaluation_tol <= 1e-3))
    reject("evaluation-tol", format_number(c.evaluation_tol), "must lie in [1e-16, 1e-3]");
  if (choices.evaluation == PairEvaluation::Fourier && !choices.backend->takes_series) {
    std::string takes;
    for (const BackendName& entry : kBackendNames)
      if (entry.takes_series) takes += (takes.empty() ? "" : ", ") + std::string(entry.name);
    reject("evaluation", c.evaluation,
           "the series runs on the host: give --backend " + takes + " (got " + c.backend + ")");
  }
  if (choices.precision == Precision::Float && !choices.backend->takes_float)
    reject("precision", c.precision,
           "needs --backend cuda (the " + c.backend + " backend computes in double; accepted here: double)");
  for (auto [name, value] : {std::pair{"pair-delta", c.pair_delta}, {"cluster-delta", c.cluster_delta}}) {
    require_finite(name, value);
    if (!(value > 0.0 && value < 2.0)) reject(name, format_number(value), "must lie in (0, 2)");
  }
  {
    // --observables: named sets joined with '+' (as --mask's parts), default among them, each once.
    bool seen[std::size(kObservableSetChoices)] = {};
    for (const std::string& name : mask_parts(c.observables)) {
      const Choice<ObservableSet>* set = kObservablesOption.find(name);
      if (!set || seen[std::size_t(set->value)])
        reject("observables", c.observables,
               "accepted: " + kObservablesOption.names(", ") +
                   ", joined with + and each once (default+attention)");
      seen[std::size_t(set->value)] = true;
    }
    if (!seen[std::size_t(ObservableSet::Default)])
      reject("observables", c.observables, "needs default among its sets (default+attention)");
    choices.attention_observables = seen[std::size_t(ObservableSet::Attention)];
    if (choices.attention_observables && choices.aux_factor.changes_sign)
      reject("observables", c.observables,
             "with --aux-factor " + c.aux_factor +
                 ": its weights change sign, so a row is no probability (accepted: default)");
    if (choices.attention_observables && choices.evaluation == PairEvaluation::Fourier)
      reject("observables", c.observables,
             "with --evaluation fourier: the plans' statistics take every pair, which the series avoids "
             "(accepted: default)");
  }
  require_finite("flush-interval", c.flush_interval);
  if (!(c.flush_interval >= 0.0 && c.flush_interval <= 86400.0))
    reject("flush-interval", format_number(c.flush_interval),
           "must lie in [0, 86400] seconds (0: flush every frame)");
  choices.weight_layers = validate_layer(c, choices);
  // What the backend's registry entry declares it takes (capabilities.hpp).
  const ModelKinds kinds{choices.kernel,
                         choices.placement,
                         choices.aux_factor.factor,
                         is_whole_layer(c),
                         false,
                         choices.usa_denominator == UsaDenominator::FactorRows};
  if (const std::string refusal = capability_refusal("--backend " + c.backend, choices.backend->takes, kinds);
      !refusal.empty())
    throw UsageError(refusal);
  if (c.out.empty()) throw UsageError("--out: missing (the output .h5 file is required)");
  validate_output_path(c.out);
  validate_sizes(c, choices);
}

}  // namespace

RunChoices validate(const RunConfig& c) {
  RunChoices choices;
  validate_model_numbers(c, choices);
  validate_matrices(c, choices);
  validate_pair_terms(c, choices);
  validate_integration(c, choices);
  validate_initial_state(c, choices);
  validate_execution(c, choices);
  return choices;
}

}  // namespace mfattn
