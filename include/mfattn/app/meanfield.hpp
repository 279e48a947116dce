#pragma once
/// \file meanfield.hpp
/// `mfattn meanfield` (docs/meanfield.md, docs/cli.md): the mean-field equation of the model
/// that `mfattn run` simulates with particles, on a grid (circle, S^2, zonal), written as a
/// density file (docs/output.md). It takes the run options that mean the same for densities
/// (one option table: run_options) and refuses the others.
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "mfattn/app/config.hpp"
#include "mfattn/core/capabilities.hpp"
#include "mfattn/core/choice_table.hpp"
#include "mfattn/io/h5md.hpp"
#include "mfattn/meanfield/solvers.hpp"

namespace mfattn {

/// --init-density: the uniform density, the von Mises-Fisher one, or a FILE of the grid's values.
enum class InitDensity { Uniform, Vmf, File };
/// --perturbation-coordinate: cos(k theta), or with labels cos(k psi) in a node's gauge coordinate.
enum class PerturbationCoordinate { Theta, Gauge };

/// The choices of mfattn meanfield's own options, looked up once (as RunChoices for the run's).
struct MeanfieldChoices {
  meanfield::CircleEvaluation evaluation = meanfield::CircleEvaluation::Automatic;
  InitDensity init_density = InitDensity::Uniform;
  PerturbationCoordinate perturbation_coordinate = PerturbationCoordinate::Theta;
};

inline constexpr Choice<meanfield::CircleEvaluation> kEvaluationChoices[] = {
    {"auto", meanfield::CircleEvaluation::Automatic, "fourier where it applies, else quadrature"},
    {"fourier", meanfield::CircleEvaluation::Fourier, "FFT; the kernel must commute with rotations"},
    {"quadrature", meanfield::CircleEvaluation::Quadrature, "the cpu pair loop"},
    {"direct", meanfield::CircleEvaluation::Quadrature, "the same as quadrature (mfattn run's name)"},
};
inline constexpr ChoiceOption<meanfield::CircleEvaluation> kEvaluationOption{
    .option = "evaluation", .choices = kEvaluationChoices, .lead = "circle velocity"};

inline constexpr Choice<InitDensity> kInitDensityChoices[] = {
    {"uniform", InitDensity::Uniform},
    {"vmf", InitDensity::Vmf, "exp(kappa <x, e_1>)"},
};
inline constexpr ChoiceOption<InitDensity> kInitDensityOption{
    .option = "init-density", .choices = kInitDensityChoices, .file_help = "FILE of the grid's values (normalised)"};

inline constexpr Choice<PerturbationCoordinate> kPerturbationCoordinateChoices[] = {
    {"theta", PerturbationCoordinate::Theta},
    {"gauge", PerturbationCoordinate::Gauge, "cos(k psi), psi = theta + alpha(xi) the gauge coordinate of G(xi)"},
};
inline constexpr ChoiceOption<PerturbationCoordinate> kPerturbationCoordinateOption{
    .option = "perturbation-coordinate", .choices = kPerturbationCoordinateChoices, .lead = "circle with labels"};

/// What the mean-field solver takes of a model (capabilities.hpp): SA and USA (a density's
/// Sinkhorn scaling is not built), the post placement, the one head of Q, K, V.
inline constexpr Normalization kMeanfieldKernels[] = {Normalization::Usa, Normalization::Sa};
inline constexpr Placement kMeanfieldPlacements[] = {Placement::Post};
inline constexpr Capabilities kMeanfieldTakes{
    .kernels = kMeanfieldKernels, .placements = kMeanfieldPlacements, .whole_layers = false};

struct MeanfieldConfig {
  RunConfig run;  ///< the run table's options (validated as a run of the label nodes)
  /// --grid: circle cells M, the maximal degree L on S^2, or polar cells for --zonal
  /// (0: 256, 32, 256).
  std::int64_t grid = 0;
  std::int64_t label_points = 0;  ///< --label-points M_xi (0: no labels)
  std::string init_density = "uniform";  ///< uniform | vmf | FILE of grid values
  double init_kappa = 1.0;        ///< vmf: exp(kappa <x, e_1>)
  std::string perturbation;       ///< "k,eps"
  /// theta | gauge: with labels, perturb cos(k theta) or cos(k psi), psi = theta + alpha(xi_c)
  std::string perturbation_coordinate = "theta";
  bool zonal = false;
  std::string evaluation = "auto";  ///< circle: auto | fourier | quadrature
  std::string compare;            ///< a particle run to measure against the density
  MeanfieldChoices choices;       ///< the values of evaluation, init-density, perturbation-coordinate
  std::string command_line;
  std::vector<Parameter> parameters;  ///< every option, as /parameters records it
};

/// Parses, reads --config, refuses the run options that do not apply and validates.
/// Throws UsageError.
MeanfieldConfig parse_meanfield_arguments(const std::vector<std::string>& args);

std::string meanfield_usage();

/// Solves and writes the density file (or, with --compare, prints the distances to a particle
/// run). Returns an ExitCode (run.hpp); messages go to err.
int meanfield_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

/// Solves a parsed configuration (the module calls it): the same as the command.
int run_meanfield(const MeanfieldConfig& cfg, std::ostream& out, std::ostream& log);

}  // namespace mfattn
