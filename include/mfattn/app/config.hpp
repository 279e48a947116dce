#pragma once
/// \file config.hpp
/// The option table of `mfattn run` (docs/cli.md). One Boost.Program_options table owns every
/// option name: the command line, config files and the /parameters group of the output all
/// go through it, so there is no second list of keys anywhere.
#include <boost/program_options.hpp>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "mfattn/io/h5md.hpp"
#include "mfattn/core/layer_kinds.hpp"
#include "mfattn/core/pair_kinds.hpp"
#include "mfattn/app/run_choices.hpp"

namespace mfattn {

/// Usage or configuration error (exit code 2): the message names the option, the value and
/// what is accepted.
/// A message as one line of stderr: control characters shown as '?', a very long one cut.
std::string one_line(const std::string& message);

/// The message is kept to one line: control characters (a newline in a value) are shown as
/// '?' and a very long message is cut.
struct UsageError : std::runtime_error {
  explicit UsageError(const std::string& message);
  explicit UsageError(const char* message) : UsageError(std::string(message)) {}
};

/// One `key = value` line of a config file.
struct ConfigEntry {
  std::string key;  ///< the option name (the last dotted part, section prefix dropped)
  std::string value;
  std::size_t line = 0;
};

/// Every resolved option of `mfattn run`. A choice option (kernel, time_scale, q, k, v,
/// matrices, geometry, positions, values, aux_factor, mask, prefix_init, init, integrator,
/// backend, precision, save_positions) keeps the name given, as /parameters records it;
/// validate() turns the names into `choices` once, and everything after it reads those.
struct RunConfig {
  // model
  std::int64_t n = 64;
  std::int64_t d = 3;
  double beta = 1.0;
  std::string kernel = "usa";
  std::string time_scale = "natural";
  std::string q = "identity", k = "identity", v = "identity";
  std::string matrices = "shared";  ///< who shares random Q, K, V: shared | per-replica
  double regen_period = 0.0;        ///< > 0: new Q, K, V every this many time units (layers)
  /// The layer's shape (kNumberOptions: --heads, --head-dim, --mlp), copied whole into the
  /// Model; its activation, weights file and layer time.
  LayerShape layer;
  std::string mlp_activation = "relu";
  std::string weights;
  /// The --weights numbers given in memory (Python's Model(weights=dict)), read in place of the
  /// file; `weights` then names them in messages. Null: read the file.
  std::shared_ptr<const WeightsFile> weights_in_memory;
  double layer_time = 0.0;  ///< > 0 with a --weights file of several layers: layer l on [l T, (l+1) T)
  std::string normalization = "post";  ///< kPlacementOption: where the layer's normalization sits
  double ngpt_alpha = 1.0;
  SinkhornParameters sinkhorn;  ///< --sinkhorn-iterations, --sinkhorn-tol (kNumberOptions), copied whole
  std::string geometry = "none";
  double rope_base = 10000.0;
  std::string rope_freqs;
  std::string generators;
  std::string positions = "index";
  double pos_scale = 1.0;
  std::string values = "transported";
  std::string aux_factor = "none";
  /// The pair terms' numbers (kNumberOptions: --aux-lambda, --aux-sigma, ...; model_choices.hpp);
  /// the model builder fills the mask, the factor and the series from the options above and below.
  PairTermParameters pair_terms;
  std::string toeplitz_coefficients = "1", toeplitz_frequencies = "1";  ///< lists, --aux-factor toeplitz
  std::string mask = "full";
  std::string usa_denominator = "count";
  std::int64_t prefix = 0;   ///< frozen prefix tokens per prompt
  std::int64_t prompts = 1;
  std::string prefix_init = "random";
  double prefix_weight = 1.0;
  double prefix_spread = 0.05;
  std::string amplitudes;
  double tau = 1.0;
  double eps_den = -1.0;  ///< < 0: automatic (0 without presence, 1e-12 with)
  std::int64_t null_tokens = 0;
  double noise_kappa = 0.0;
  double common_noise = 0.0;  ///< sigma of the noise every token of a replica shares
  std::string common_noise_kind = "symmetric";
  // time stepping
  std::string integrator = "rk4";
  double dt = 0.01;
  double rtol = 1e-8, atol = 1e-10;
  double horizon = 20.0;
  double save_every = 0.0;  ///< 0: horizon / 100
  std::string save_times;
  std::int64_t save_log = 0;
  // initial state
  std::string init = "uniform";
  std::string init_file;
  double init_rho = 0.5;
  double init_radius = 1.0;  ///< R^d placements: the initial contents times this
  std::int64_t init_clusters = 3;
  double init_spread = 0.1;
  bool normalize_init = false;
  std::int64_t replicas = 1;
  std::int64_t seed = 0;
  // execution and output
  std::int64_t threads = 0;  ///< 0: OMP_NUM_THREADS, else SLURM_CPUS_PER_TASK, else all cores
  std::string backend = "cpu";
  std::string precision = "double";  ///< kPrecisionOption: the pair loops' arithmetic
  std::string evaluation = "direct";  ///< kPairEvaluationOption: pair loop or Fourier series
  double evaluation_tol = 1e-13;      ///< the series' truncation (kernels/circle_series.hpp)
  std::string out;
  bool overwrite = false;
  bool resume = false;
  bool deflate = false;
  bool fletcher32 = false;
  bool save_velocity = false;
  std::string save_positions = "all";  ///< kSavePositionsOption: which frames keep positions
  double pair_delta = 1e-3;     ///< clustered_pair_fraction: pairs with <x_i, x_j> > 1 - delta
  double cluster_delta = 1e-4;  ///< n_clusters: components of <x_i, x_j> > 1 - delta
  /// The per-frame series: "default", or "default+attention" (the attention statistics).
  std::string observables = "default";
  /// Wall seconds between flushes: frames computed meanwhile are staged in memory and
  /// written together (0: every frame is flushed as it is made). Frame 0 and the last frame
  /// are always flushed at once; a SIGKILL loses at most this long's frames.
  double flush_interval = 1.0;
  bool quiet = false;
  std::string config;

  /// Derived after parsing: the choice options' values (validate()), the command line as
  /// given, the config file's text, and every option as a typed parameter.
  RunChoices choices;
  std::string command_line;
  std::string config_text;
  std::vector<Parameter> parameters;
  /// The options given (on the command line or in the config file), by name without dashes:
  /// an option left at its default and one given its default's value are told apart where a
  /// rule needs it (--mlp-activation without --mlp).
  std::vector<std::string> given;
  bool was_given(const std::string& name) const {
    for (const std::string& option : given)
      if (option == name) return true;
    return false;
  }

  /// The struct of a feature whose numbers kNumberOptions binds (PairTermParameters,
  /// LayerShape, SinkhornParameters): the option table reads and writes them through here.
  template <class Feature>
  Feature& feature();
  template <class Feature>
  const Feature& feature() const {
    return const_cast<RunConfig*>(this)->feature<Feature>();
  }
};

template <>
inline PairTermParameters& RunConfig::feature<PairTermParameters>() {
  return pair_terms;
}
template <>
inline LayerShape& RunConfig::feature<LayerShape>() {
  return layer;
}
template <>
inline SinkhornParameters& RunConfig::feature<SinkhornParameters>() {
  return sinkhorn;
}

/// The feature struct that a member pointer of kNumberOptions points into.
template <class Member, class Feature>
Feature feature_of_field(Member Feature::*);

/// True when the options make a whole layer (docs/model.md section 2b): several heads, heads
/// of r < d, a feed-forward term or a weights file. Otherwise the Model's attention is the one
/// head of Q, K, V (square_head).
inline bool is_whole_layer(const RunConfig& cfg) {
  return cfg.layer.heads > 1 || (cfg.layer.head_dim != 0 && cfg.layer.head_dim != cfg.d) ||
         cfg.layer.mlp_width > 0 || !cfg.weights.empty();
}

/// The table of `run` options bound to the fields of cfg.
boost::program_options::options_description run_options(RunConfig& cfg);

/// What an option of the run table is to the trajectory, the one place that says it:
///   Trajectory: changes the positions (every option not listed below). A case id of
///     `mfattn sweep` includes it; `--resume` requires the file's value.
///   Extent: how far the run goes and which frames it writes (horizon, save-every): the
///     positions at a time t do not depend on it, but the file does, so a case id includes
///     it; `--resume` may change it (the horizon may only grow).
///   Execution: how and where the run executes (threads, out, config, quiet, overwrite,
///     resume): never in a case id, free on `--resume`.
enum class OptionRole { Trajectory, Extent, Execution };
OptionRole option_role(const std::string& name);

/// Parses `mfattn run` arguments (without the subcommand), reads --config if given (the
/// command line wins), validates every option and resolves defaults. Throws UsageError.
RunConfig parse_run_arguments(const std::vector<std::string>& args);
/// The same with the --weights numbers given in memory (RunConfig::weights_in_memory); args
/// name them with --weights (any text: the name messages give them).
RunConfig parse_run_arguments(const std::vector<std::string>& args, std::shared_ptr<const WeightsFile> weights_in_memory);

/// Reads an INI config file through the option table: sections are prefixes ("[model]
/// n = 8" sets --n), unknown keys are UsageErrors. text receives the file's contents. The
/// file must be a regular file of at most kMaxConfigBytes; errors say "FILE:LINE: ...".
boost::program_options::parsed_options read_config_file(
    const std::string& path, const boost::program_options::options_description& table,
    std::string& text);

/// The message for an option given twice (note, if any, follows the rule in the brackets).
std::string repeated_option_message(const std::string& option, const std::string& note = "");

/// The entries of config text (origin names it in messages): '#' starts a comment, "[name]"
/// a section, every other non-blank line is "key = value" with a key of the table, each key
/// once. Throws UsageError "ORIGIN:LINE: ...".
std::vector<ConfigEntry> parse_config_text(const std::string& text, const std::string& origin,
                                           const boost::program_options::options_description& table);

/// The text of a regular file named by --option (read_input_file, input_file.hpp):
/// refuses a missing or unreadable file, folders, devices, FIFOs and sockets, and files over
/// limit bytes (UsageError "--option PATH: reason").
std::string read_small_text_file(const std::string& option, const std::string& path,
                                 std::size_t limit);

/// The text of the config file path (read_small_text_file, at most kMaxConfigBytes),
/// without a leading UTF-8 byte order mark.
std::string read_config_text(const std::string& path);

/// Refuses, as read_small_text_file does, a file named by --option that cannot be read
/// (check_input_file, input_file.hpp): for files read later, or by HDF5. For an option that
/// also takes names, names is what it accepts ("accepted: a, b or a readable file"): the
/// message gives it, first when nothing is at path.
void require_input_file(const std::string& option, const std::string& path, const std::string& names = "");

inline constexpr std::size_t kMaxConfigBytes = std::size_t{1} << 20;
/// Most tokens in all (n + null tokens + prompts * prefix): token and prompt ids are int.
inline constexpr std::int64_t kMaxRunTokens = 2147483647;
/// Most layers of one run (--horizon / --regen-period).
inline constexpr std::int64_t kMaxLayers = 1000000;
/// Times closer than this are one time: frames (output_times) and layer starts merge within
/// it. 1e-12 of the horizon's scale, max(1, horizon).
inline double time_resolution(double horizon) { return 1e-12 * (horizon > 1.0 ? horizon : 1.0); }
/// The shortest horizon, --layer-time and --regen-period, in time resolutions: frames and
/// layer starts closer than this could not be told apart (a layer time of 1e-200 was a
/// loop over 1e188 layer starts before frame 0).
inline constexpr double kShortestSpanResolutions = 1000.0;
/// Most frames of one run (--save-every, --save-log, --save-times).
inline constexpr std::int64_t kMaxFrames = 10000000;
/// Most columns of a --positions file (k): the d (d - 1) / 2 coordinates of so(16), the
/// largest gauge group `mfattn realize --mechanism prefix-gauge` builds.
inline constexpr std::size_t kMaxPositionColumns = 120;

/// Parses words of a command line strictly through table: full option names only, one value
/// per option except the lists (--save-times, --rope-freqs, --amplitudes take several words,
/// joined by commas), no stray words, --eps-den auto. Stores into vm; type errors name the
/// option, the value and the accepted range from the option's description. Throws UsageError.
void store_command_line(const std::vector<std::string>& args,
                        const boost::program_options::options_description& table,
                        boost::program_options::variables_map& vm);

/// The options of a command other than run (analyze, realize, oclosure) through its own
/// table, with run's rules: full names, each option once ("--NAME: given more than once (give
/// each option once)"), an unknown option named with the closest ones, a missing value named
/// with what the option accepts. Stores and notifies vm; returns the operands (the words that
/// are no option, in order). Throws UsageError.
std::vector<std::string> parse_command_options(const std::vector<std::string>& args,
                                               const boost::program_options::options_description& table,
                                               boost::program_options::variables_map& vm);

/// A stored /parameters value as the user wrote the option: the sentinel the option table
/// stores for a word is that word again (eps-den -1 is "auto"); any other value as stored.
std::string stored_value_text(const std::string& key, const std::string& stored);

/// A one-line message for a Boost option error, made without its what() (which never
/// returns for a value holding a placeholder such as "%value%"). With the option `table`, an
/// unknown option's message names the closest options of the table (closest_option_names).
std::string option_error_text(const boost::program_options::error& error,
                              const boost::program_options::options_description* table = nullptr);

/// Up to three names of `table` (with their "--") close to `name` (given without dashes):
/// within a Levenshtein distance of max(1, |name| / 3), or begun by a name of three letters
/// or more; the stems first, then by distance and name.
std::vector<std::string> closest_option_names(const boost::program_options::options_description& table,
                                              const std::string& name);

/// "; the closest: --a, --b" for an unknown `name` (closest_option_names), or "" when none is
/// close: the tail of the messages for an unknown key of a config or sweep file.
std::string closest_options_note(const boost::program_options::options_description& table, const std::string& name);

/// Stores the command line `args`, then the --config file it names (the command line wins;
/// cfg.config_text receives the file's text), into `vm` through `table` (run_options(cfg),
/// with a command's own options added), and notifies. The one way every command that takes
/// run options reads them (run, bench). Throws UsageError.
void store_run_arguments(const std::vector<std::string>& args, const boost::program_options::options_description& table,
                         boost::program_options::variables_map& vm, RunConfig& cfg);

/// Every option of `table` that `vm` holds (given or defaulted), typed, in the table's order:
/// what /parameters records.
std::vector<Parameter> table_parameters(const boost::program_options::options_description& table,
                                        const boost::program_options::variables_map& vm);

/// The Toeplitz factor's a_k and omega_k from --toeplitz-coefficients and
/// --toeplitz-frequencies; UsageError unless each is 1 to 16 finite numbers, of equal length.
ToeplitzSeries toeplitz_series(const RunConfig& cfg);

/// Splits "1, 2 3" into numbers; false if any item is not a finite number or there is none.
bool parse_number_list(const std::string& text, std::vector<double>& out);

}  // namespace mfattn
