#pragma once
/// \file run_choices.hpp
/// The choice options of `mfattn run` (docs/cli.md): each option's accepted names and what
/// each one selects, in one table (choice_table.hpp) that run_options' --help and validate()
/// read. validate() looks every name up once and returns the values as RunChoices, which
/// RunConfig::choices holds and everything after validation reads (the model builder, the
/// initial state, the run); RunConfig keeps the names as given, because they are what
/// /parameters records and what sweep case ids are made of. Adding a choice is one entry in
/// its array (and, for a new enum value, the code that acts on it).
///
/// The integrator and backend names are registries of their own (kIntegrators,
/// kBackendNames): there a name selects a factory and its properties, not an enum value. The
/// tables of the model's own kinds (kernel, placement, auxiliary factor), which capability
/// messages below the app layer name values from too, are in core/model_choices.hpp.
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "mfattn/backends/backend.hpp"
#include "mfattn/core/choice_table.hpp"
#include "mfattn/io/h5md.hpp"
#include "mfattn/io/weights_file.hpp"
#include "mfattn/integrators/integrator.hpp"
#include "mfattn/core/pair_kinds.hpp"
#include "mfattn/core/gauge.hpp"
#include "mfattn/core/init.hpp"
#include "mfattn/core/model.hpp"
#include "mfattn/core/model_choices.hpp"

namespace mfattn {


inline constexpr Choice<TimeScale> kTimeScaleChoices[] = {
    {"natural", TimeScale::Natural},
    {"rescaled", TimeScale::Rescaled, "weights times exp(-beta); needed for large beta"},
};
inline constexpr ChoiceOption<TimeScale> kTimeScaleOption{.option = "time-scale",
                                                          .choices = kTimeScaleChoices};

/// The preset matrices of --q, --k and --v (any other value is a file of d rows of d numbers).
/// G, G1, G2 are d x d matrices of independent N(0, 1) entries from the replica's matrix
/// stream (docs/model.md, "Random matrices").
enum class MatrixPreset {
  Identity,
  Gaussian,
  Goe,
  GaussianProduct,
  WignerUnit,
  GoeUnit,  // Q, K or V
  Wishart,
  PlusQk,
  MinusQk,
  PlusForm,
  MinusForm,
  Zero,  // V only
};
/// Q and K take the first kQueryKeyPresets (identity and the random ones); V also takes
/// the rest: the Wishart law, and the products of Q and K, which exist once those are built.
/// The unit-variance laws are those of the field's reference code (docs/reference.md), whose
/// bilinear form K^T Q is mfattn's K with Q = I.
inline constexpr Choice<MatrixPreset> kMatrixChoices[] = {
    {"identity", MatrixPreset::Identity},
    {"gaussian", MatrixPreset::Gaussian},  // entries N(0, 1/d)
    {"goe", MatrixPreset::Goe},            // (G + G^T) / sqrt(2d): off-diagonal variance 1/d
    {"gaussian-product", MatrixPreset::GaussianProduct, "G1 G2 / sqrt(d)"},
    {"wigner-unit", MatrixPreset::WignerUnit, "symmetric, every entry variance 1"},
    {"goe-unit", MatrixPreset::GoeUnit, "(G + G^T) / sqrt(2)"},
    {"wishart", MatrixPreset::Wishart, "G G^T / sqrt(d)"},
    {"plus-qk", MatrixPreset::PlusQk},    // V = Q^T K
    {"minus-qk", MatrixPreset::MinusQk},  // V = -Q^T K
    {"plus-form", MatrixPreset::PlusForm, "K^T Q / c"},
    {"minus-form", MatrixPreset::MinusForm, "-K^T Q / c"},
    {"zero", MatrixPreset::Zero, "no attention: the noise alone moves the tokens"},
};
inline constexpr std::size_t kQueryKeyPresets = 6;
static_assert(kMatrixChoices[kQueryKeyPresets - 1].value == MatrixPreset::GoeUnit,
              "Q and K take the presets up to goe-unit");
/// Whether a preset draws random numbers (so replicas and layers may differ).
constexpr bool is_random_preset(MatrixPreset preset) {
  return preset == MatrixPreset::Gaussian || preset == MatrixPreset::Goe ||
         preset == MatrixPreset::GaussianProduct || preset == MatrixPreset::WignerUnit ||
         preset == MatrixPreset::GoeUnit || preset == MatrixPreset::Wishart;
}
inline constexpr ChoiceOption<MatrixPreset> kQueryOption{
    .option = "q",
    .choices = std::span(kMatrixChoices).first(kQueryKeyPresets),
    .file_help = "FILE (d rows of d numbers)",
    .lead = "query matrix"};
inline constexpr ChoiceOption<MatrixPreset> kKeyOption{
    .option = "k",
    .choices = std::span(kMatrixChoices).first(kQueryKeyPresets),
    .file_help = "FILE",
    .lead = "key matrix"};
inline constexpr ChoiceOption<MatrixPreset> kValueOption{
    .option = "v", .choices = kMatrixChoices, .file_help = "FILE", .lead = "value matrix"};

/// --matrices: who shares the random Q, K, V draws.
enum class MatrixSharing { Shared, PerReplica };
inline constexpr Choice<MatrixSharing> kMatrixSharingChoices[] = {
    {"shared", MatrixSharing::Shared, "one draw for every replica"},
    {"per-replica", MatrixSharing::PerReplica, "each replica its own draw"},
};
inline constexpr ChoiceOption<MatrixSharing> kMatrixSharingOption{.option = "matrices",
                                                                  .choices = kMatrixSharingChoices};

inline constexpr ChoiceOption<GeometryKind> kGeometryOption{
    .option = "geometry", .choices = kGeometryChoices, .lead = "positional gauge G(xi)"};

/// How --positions places the tokens when it names no file.
enum class PositionLayout { Index, Uniform, Random, Grid };
inline constexpr Choice<PositionLayout> kPositionChoices[] = {
    {"index", PositionLayout::Index, "i * pos-scale"},
    {"uniform", PositionLayout::Uniform, "2 pi i / n"},
    {"random", PositionLayout::Random, "seeded"},
    {"grid", PositionLayout::Grid, "k = 2; the default for rope-axial and rope-mixed"},
};
inline constexpr ChoiceOption<PositionLayout> kPositionsOption{
    .option = "positions",
    .choices = kPositionChoices,
    .file_help = "FILE (n rows of k numbers)",
    .lead = "token positions xi"};

inline constexpr Choice<ValueTransport> kValuesChoices[] = {
    {"transported", ValueTransport::Transported, "v_ij = V G_i^T G_j x_j, gradient flow"},
    {"plain", ValueTransport::Plain, "v_ij = V x_j, practical RoPE"},
};
inline constexpr ChoiceOption<ValueTransport> kValuesOption{.option = "values", .choices = kValuesChoices};


inline constexpr Choice<Activation> kActivationChoices[] = {
    {"relu", Activation::Relu},
    {"gelu", Activation::Gelu, "z (1 + erf(z / sqrt 2)) / 2, torch.nn.GELU()"},
    {"tanh", Activation::Tanh},
};
inline constexpr ChoiceOption<Activation> kActivationOption{.option = "mlp-activation",
                                                            .choices = kActivationChoices};


/// One part of --mask (parts are joined by '+'): a mask kind, or per-prompt, which adds the
/// per-prompt rule to the kind of the other part.
struct MaskPart {
  MaskKind kind;
  bool per_prompt = false;
  bool operator==(const MaskPart&) const = default;
};
inline constexpr Choice<MaskPart> kMaskChoices[] = {
    {"full", {MaskKind::Full}},
    {"causal", {MaskKind::Causal}, "xi_j <= xi_i"},
    {"causal-strict", {MaskKind::CausalStrict}, "xi_j < xi_i: no token sees itself"},
    {"window", {MaskKind::Window}, "|xi_i - xi_j| <= window"},
    {"per-prompt", {MaskKind::Full, true}, "prefix tokens seen only within their prompt"},
};
inline constexpr ChoiceOption<MaskPart> kMaskOption{
    .option = "mask", .choices = kMaskChoices, .tail = "; combine with +, e.g. causal+per-prompt"};

/// --usa-denominator: what USA's sum is divided by (docs/model.md section 2).
enum class UsaDenominator { Count, FactorRows };
inline constexpr Choice<UsaDenominator> kUsaDenominatorChoices[] = {
    {"count", UsaDenominator::Count, "M = sum_j p_j, every receiver alike"},
    {"factor-rows", UsaDenominator::FactorRows,
     "receiver i's sum_j m_ij c_ij p_j: each row's weights without exp"},
};
inline constexpr ChoiceOption<UsaDenominator> kUsaDenominatorOption{
    .option = "usa-denominator", .choices = kUsaDenominatorChoices, .lead = "USA's normaliser"};

/// What a whole --mask value selects.
struct MaskSelection {
  MaskKind kind = MaskKind::Full;
  bool per_prompt = false;
};
/// The selection of a --mask value, or nothing when a part is not in kMaskChoices, "full" is
/// joined with another part, or two parts both name a kind (causal+window).
std::optional<MaskSelection> parse_mask(const std::string& mask);

/// --observables: the named sets of per-frame series, joined with + (default always among them).
enum class ObservableSet { Default, Attention };
inline constexpr Choice<ObservableSet> kObservableSetChoices[] = {
    {"default", ObservableSet::Default, "energy, inner products, clusters, moments, ..."},
    {"attention", ObservableSet::Attention,
     "each head's plan entropy, largest weight and participation: mean, min, max over receivers"},
};
inline constexpr ChoiceOption<ObservableSet> kObservablesOption{
    .option = "observables",
    .choices = kObservableSetChoices,
    .lead = "the per-frame series",
    .tail = "; joined with +, default among them: default+attention"};

/// --common-noise-kind: the law of the increment dB that a replica's tokens share.
inline constexpr Choice<CommonNoiseKind> kCommonNoiseKindChoices[] = {
    {"symmetric", CommonNoiseKind::Symmetric, "GOE dB, dx = sigma P_x(dB x)"},
    {"rotation", CommonNoiseKind::Rotation, "skew dB: a shared Brownian rotation"},
};
inline constexpr ChoiceOption<CommonNoiseKind> kCommonNoiseKindOption{
    .option = "common-noise-kind",
    .choices = kCommonNoiseKindChoices,
    .lead = "the shared noise's law"};

/// --save-positions: which frames keep every replica's positions (observables are written at
/// every frame whatever the choice; docs/output.md, "What --save-positions writes").
inline constexpr Choice<PositionFrames> kSavePositionsChoices[] = {
    {"all", PositionFrames::All, "every frame"},
    {"ends", PositionFrames::Ends, "t = 0 and the horizon only"},
    {"none", PositionFrames::None, "observables only"},
};
inline constexpr ChoiceOption<PositionFrames> kSavePositionsOption{
    .option = "save-positions",
    .choices = kSavePositionsChoices,
    .lead = "frames whose positions are written",
    .tail = "; ends and none keep a checkpoint of the last frame for --resume"};

/// --prefix-init: a placement, or (any other value) a file of the prefix contents.
inline constexpr Choice<PrefixPlacement> kPrefixInitChoices[] = {
    {"random", PrefixPlacement::Random},
    {"clustered", PrefixPlacement::Clustered, "one cluster per prompt"},
};
inline constexpr ChoiceOption<PrefixPlacement> kPrefixInitOption{
    .option = "prefix-init",
    .choices = kPrefixInitChoices,
    .file_help = "FILE (K * prefix rows of d numbers)",
    .lead = "prefix placement"};

inline constexpr Choice<InitKind> kInitChoices[] = {
    {"uniform", InitKind::Uniform},         {"hemisphere", InitKind::Hemisphere},
    {"clustered", InitKind::Clustered},     {"equiangular", InitKind::Equiangular},
    {"file", InitKind::File},
};
inline constexpr ChoiceOption<InitKind> kInitOption{.option = "init", .choices = kInitChoices};

inline constexpr Choice<Precision> kPrecisionChoices[] = {
    {"double", Precision::Double, "fp64 throughout"},
    {"float", Precision::Float,
     "--backend cuda only: fp32 pair operands and exponentials, fp64 sums, state and integrator"},
};
inline constexpr ChoiceOption<Precision> kPrecisionOption{.option = "precision",
                                                          .choices = kPrecisionChoices};

inline constexpr Choice<PairEvaluation> kPairEvaluationChoices[] = {
    {"direct", PairEvaluation::Direct, "the backend's pair loop, n^2 pairs"},
    {"quadrature", PairEvaluation::Direct, "the same as direct (mfattn meanfield's name)"},
    {"fourier", PairEvaluation::Fourier,
     "the circle's Fourier series or S^2's harmonic one, O(n P): d = 2, or d = 3 with Q^T K = c I; SA or USA, "
     "one head, no mask or factor"},
    {"auto", PairEvaluation::Automatic,
     "fourier where it applies and n >= 2048 (d = 2) or 8192 (d = 3), else direct"},
};
inline constexpr ChoiceOption<PairEvaluation> kPairEvaluationOption{
    .option = "evaluation", .choices = kPairEvaluationChoices};

/// What validation made of every choice option (validate(), config.hpp): the value each name
/// selects, looked up once. An option that also takes a file holds nothing (nullopt) when it
/// names one. The defaults are the options' defaults.
struct RunChoices {
  Normalization kernel = Normalization::Usa;
  TimeScale time_scale = TimeScale::Natural;
  std::optional<MatrixPreset> q = MatrixPreset::Identity, k = MatrixPreset::Identity,
                              v = MatrixPreset::Identity;
  MatrixSharing matrices = MatrixSharing::Shared;
  GeometryKind geometry = GeometryKind::None;
  std::optional<PositionLayout> positions = PositionLayout::Index;
  ValueTransport values = ValueTransport::Transported;
  AuxFactorChoice aux_factor{AuxFactor::None};
  MaskSelection mask;
  UsaDenominator usa_denominator = UsaDenominator::Count;
  std::optional<PrefixPlacement> prefix_init = PrefixPlacement::Random;
  InitKind init = InitKind::Uniform;
  PositionFrames save_positions = PositionFrames::All;
  Precision precision = Precision::Double;
  PairEvaluation evaluation = PairEvaluation::Direct;
  Activation mlp_activation = Activation::Relu;
  Placement placement = Placement::Post;
  CommonNoiseKind common_noise_kind = CommonNoiseKind::Symmetric;
  bool attention_observables = false;  ///< --observables default+attention
  /// Layers of the --weights file (its leading axis; 1 without one, 0 without a file).
  std::size_t weight_layers = 0;
  /// The --weights file as validation read and checked it: the model builder slices every
  /// layer from it, so the file is read once and a change to it during the run changes nothing.
  std::shared_ptr<const WeightsFile> weights;
  const IntegratorEntry* integrator = find_integrator("rk4");
  const BackendName* backend = &kBackendNames[0];
  /// The list options, parsed once: --toeplitz-coefficients with --toeplitz-frequencies (with
  /// --aux-factor toeplitz), --rope-freqs (empty: from --rope-base), --amplitudes (n numbers;
  /// empty: none given), --save-times (empty: none given).
  ToeplitzSeries toeplitz;
  std::vector<double> rope_frequencies, amplitudes, save_times;
};

}  // namespace mfattn
