// `mfattn meanfield`: the options, the choice of solver, the initial density and the solve
// loop with its density file (docs/meanfield.md; failure model as for runs).
#include "mfattn/app/meanfield.hpp"
#include "mfattn/app/command_errors.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numbers>
#include <ostream>
#include <sstream>

#include "app/option_rules.hpp"
#include "app/kept_frames.hpp"
#include "app/progress.hpp"
#include "mfattn/app/meanfield_compare.hpp"
#include "mfattn/app/model_builder.hpp"
#include "mfattn/app/run.hpp"
#include "mfattn/app/stop_signals.hpp"
#include "mfattn/core/input_file.hpp"
#include "mfattn/core/number_text.hpp"
#include "mfattn/core/version.hpp"
#include "mfattn/io/series.hpp"
#include "mfattn/meanfield/solvers.hpp"
#include "mfattn/app/run_resources.hpp"
#include "mfattn/app/validate.hpp"

namespace mfattn {
namespace po = boost::program_options;

namespace {

/// --rtol and --atol when not given (the run's are dopri5's).
constexpr double kMeanfieldDefaultRtol = 1e-6;
constexpr double kMeanfieldDefaultAtol = 1e-9;

/// The run options that mean the same for densities; every other run option is refused
/// when given (it has no meaning for a density, or the solver chooses it: --dt).
const std::vector<std::string> kMeanfieldRunOptions = {
    "d", "beta", "kernel", "time-scale", "q", "k", "v", "geometry", "rope-base", "rope-freqs", "generators",
    "positions", "values", "aux-factor", "aux-lambda", "aux-sigma", "aux-omega", "aux-power",
    "toeplitz-coefficients", "toeplitz-frequencies", "mask", "window", "eps-den", "noise-kappa", "rtol", "atol",
    "horizon", "save-every", "save-times", "seed", "threads", "backend", "out", "overwrite", "resume", "deflate",
    "fletcher32", "flush-interval", "quiet", "config", "evaluation"};

po::options_description meanfield_options(MeanfieldConfig& c) {
  po::options_description own("Mean-field options");
  own.add_options()
      ("grid", po::value(&c.grid)->default_value(0, "256, 32 or 256"),
       "circle cells M (d = 2) or polar cells (--zonal), in [4, 4194304]; the maximal degree L (d = 3), in [4, 1024]")
      ("label-points", po::value(&c.label_points)->default_value(0),
       "label nodes M_xi (d = 2, or d = 3 with rope about e_3; --positions uniform): one conditional density per "
       "node; 0 = no labels")
      ("init-density", po::value(&c.init_density)->default_value("uniform"), kInitDensityOption.help().c_str())
      ("init-kappa", po::value(&c.init_kappa)->default_value(1.0), "vmf concentration, finite")
      ("perturbation", po::value(&c.perturbation)->default_value("", "none"),
       "k,eps: adds eps cos(k theta) (circle), eps Y_k0 (S^2) or eps P_k (zonal), then renormalises")
      ("perturbation-coordinate", po::value(&c.perturbation_coordinate)->default_value("theta"),
       kPerturbationCoordinateOption.help().c_str())
      ("zonal", po::bool_switch(&c.zonal), "densities of <x, e_1> only, any d (Q^T K and V multiples of I)")
      ("compare", po::value(&c.compare)->default_value("", "none"),
       "RUN.h5: print W1 between that particle run's empirical measure and the density at common frames");
  return own;
}

[[noreturn]] void refuse(const std::string& option, const std::string& value, const std::string& rule) {
  throw UsageError("--" + option + " " + value + ": " + rule);
}

/// Q^T K = a I and V = b I of the label model's matrices (rotation-invariant on S^{d-1}).
bool isotropic(const Model& model, double& a, double& b) {
  const AttentionHead& m = model.matrices_of(0).heads.front();
  const std::size_t d = model.d;
  const Matrix q = m.query_identity ? Matrix::Identity(d, d) : m.query;
  const Matrix k = m.key_identity ? Matrix::Identity(d, d) : m.key;
  const Matrix v = m.full_value_identity ? Matrix::Identity(d, d) : m.full_value;
  const Matrix form = q.transpose() * k;
  a = form(0, 0);
  b = v(0, 0);
  const double tolerance = 1e-12 * (1.0 + std::abs(a) + std::abs(b));
  return (form - a * Matrix::Identity(d, d)).cwiseAbs().maxCoeff() <= tolerance &&
         (v - b * Matrix::Identity(d, d)).cwiseAbs().maxCoeff() <= tolerance;
}

enum class Solver { Circle, Sphere, Zonal };

struct Problem {
  Solver solver = Solver::Circle;
  Model label_model;
  std::unique_ptr<meanfield::DensitySolver> density;
};

Problem make_problem(const MeanfieldConfig& cfg, int threads) {
  const RunConfig& run = cfg.run;
  Problem problem;
  problem.label_model = build_model(run);
  Model& model = problem.label_model;
  model.noise_kappa = run.noise_kappa;
  const bool labelled = cfg.label_points > 0;
  problem.solver = cfg.zonal ? Solver::Zonal : (run.d == 2 ? Solver::Circle : Solver::Sphere);
  if (problem.solver == Solver::Circle) {
    meanfield::CircleOptions options;
    options.angles = static_cast<std::size_t>(cfg.grid > 0 ? cfg.grid : 256);
    options.labelled = labelled;
    options.evaluation = cfg.choices.evaluation;
    options.tolerance = {run.rtol, run.atol};
    options.threads = threads;
    if (options.evaluation == meanfield::CircleEvaluation::Fourier && !meanfield::circle_kernels_commute(model))
      refuse("evaluation", "fourier", "the kernel does not commute with rotations (Q, K, V and the gauge's rotations "
                                      "must be multiples of rotations); accepted: auto or quadrature");
    problem.density = meanfield::make_circle_solver(model, options);
    return problem;
  }
  meanfield::IsotropicInteraction interaction;
  interaction.d = model.d;
  interaction.beta = model.beta;
  interaction.usa = model.normalization == Normalization::Usa;
  interaction.exponent_shift = model.exponent_shift();
  interaction.eps_den = model.eps_den;
  interaction.noise_kappa = run.noise_kappa;
  if (!isotropic(model, interaction.score_scale, interaction.value_scale))
    throw UsageError(std::string(cfg.zonal ? "--zonal" : "--d 3") +
                     ": the density solver needs Q^T K and V multiples of the identity (--q, --k, --v); "
                     "other kernels are solved on the circle (--d 2)");
  if (problem.solver == Solver::Zonal) {
    problem.density = meanfield::make_zonal_solver(
        interaction, static_cast<std::size_t>(cfg.grid > 0 ? cfg.grid : 256), {run.rtol, run.atol});
  } else {
    const std::size_t degree = static_cast<std::size_t>(cfg.grid > 0 ? cfg.grid : 32);
    try {
      problem.density = meanfield::make_sphere_solver(interaction, degree, {run.rtol, run.atol},
                                                      labelled ? &model : nullptr);
    } catch (const meanfield::UnsupportedLabelGauge& e) {
      throw UsageError("--geometry " + run.geometry + ": " + e.what() +
                       "; S^2 with --label-points takes none or rope with one rotating block (rotations about e_3)");
    }
  }
  return problem;
}

/// The rotation angle alpha_c of G(xi_c) at each label node (d = 2; 0 without a gauge): the
/// gauge coordinate of a token at theta is theta + alpha_c.
std::vector<double> label_gauge_angles(const Model& label_model) {
  std::vector<double> angles(label_model.n, 0.0);
  if (!label_model.gauge || label_model.d != 2) return angles;
  for (std::size_t c = 0; c < label_model.n; ++c) {
    const double unit[2] = {1.0, 0.0};
    double moved[2];
    label_model.gauge->apply(c, unit, moved);
    angles[c] = std::atan2(moved[1], moved[0]);
  }
  return angles;
}

/// The perturbation's shape on the grid: cos(k (theta + alpha_c)) (circle, in the gauge
/// coordinate of label row c), Y_k0 (S^2, orthonormal), P_k(cos theta) (zonal, the Gegenbauer
/// polynomial with P_k(1) = 1).
double perturbation_shape(const meanfield::DensityGrid& grid, std::size_t d, int k, std::size_t point,
                          const std::vector<double>& gauge_angles) {
  // Circle rows are label nodes and columns angles; S^2 rows are rings (theta) and columns
  // azimuths, after the label node (a block of rings) with labels.
  const bool sphere = grid.kind == meanfield::GridKind::Sphere;
  const std::size_t columns = sphere ? grid.phi.size() : grid.theta.size();
  const std::size_t row = (sphere ? point % (grid.theta.size() * columns) : point) / columns, column = point % columns;
  if (grid.kind == meanfield::GridKind::Circle) return std::cos(k * (grid.theta[column] + gauge_angles[row]));
  std::vector<double> polynomials(std::size_t(k) + 1);
  meanfield::gegenbauer_polynomials(sphere ? 3 : d, std::cos(grid.theta[sphere ? row : column]), polynomials.data(),
                         polynomials.size());
  return sphere ? std::sqrt((2.0 * k + 1.0) / (4.0 * std::numbers::pi)) * polynomials[k] : polynomials[k];
}

/// <x, e_1> at a grid point.
double first_coordinate(const meanfield::DensityGrid& grid, std::size_t point) {
  switch (grid.kind) {
    case meanfield::GridKind::Circle: return std::cos(grid.theta[point % grid.theta.size()]);
    case meanfield::GridKind::Zonal: return std::cos(grid.theta[point]);
    case meanfield::GridKind::Sphere: {
      const std::size_t columns = grid.phi.size();
      return std::sin(grid.theta[(point / columns) % grid.theta.size()]) * std::cos(grid.phi[point % columns]);
    }
  }
  return 0.0;
}

/// The highest mode k of --perturbation the grid resolves: M / 2 on the circle (Nyquist), L on
/// S^2 (degree <= L), n_theta / 2 zonal (two cells per oscillation of P_k across [0, pi]).
int highest_resolved_mode(const MeanfieldConfig& cfg, const meanfield::DensityGrid& grid) {
  switch (grid.kind) {
    case meanfield::GridKind::Circle: return int(grid.theta.size() / 2);
    case meanfield::GridKind::Zonal: return int(grid.theta.size() / 2);
    case meanfield::GridKind::Sphere: return int(cfg.grid > 0 ? cfg.grid : 32);
  }
  return 0;
}

/// "[64, 256]": a grid shape as a message shows it.
std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string text = "[";
  for (std::size_t a = 0; a < shape.size(); ++a) text += (a ? ", " : "") + std::to_string(shape[a]);
  return text + "]";
}

std::vector<double> initial_density(const MeanfieldConfig& cfg, const meanfield::DensityGrid& grid,
                                    const std::vector<double>& gauge_angles) {
  const std::size_t size = grid.size();
  // Each label row (or the whole grid) is one probability density.
  const std::size_t rows = grid.labels.empty() ? 1 : grid.shape[0];
  const std::size_t row_size = size / rows;
  std::vector<double> density(size, 1.0);
  if (cfg.choices.init_density == InitDensity::Vmf) {
    for (std::size_t i = 0; i < size; ++i) density[i] = std::exp(cfg.init_kappa * (first_coordinate(grid, i) - 1.0));
  } else if (cfg.choices.init_density == InitDensity::File) {
    const std::string layout = std::to_string(size) + " numbers, the grid's values of shape " + shape_text(grid.shape) +
                               " in row-major order (one per line, all on one line, or rows of equal width such as "
                               "NumPy's savetxt of the 2-D array)";
    std::size_t found = 0;
    try {
      density = read_text_rows(cfg.init_density, kRowsOfAnyWidth, found);
    } catch (const std::exception& e) {
      refuse("init-density", cfg.init_density, std::string(e.what()) + " (" + kInitDensityOption.accepted() + " of " + layout + ")");
    }
    if (density.size() != size)
      refuse("init-density", cfg.init_density, "holds " + std::to_string(density.size()) + " numbers; needs " + layout);
    // Rows of a width that is a trailing part of the shape (1, the last axis, the last two,
    // ..., all): a transposed table (rows of another width) would be read scrambled.
    const std::size_t width = size / found;
    bool trailing = width == 1;
    for (std::size_t axis = grid.shape.size(), part = 1; axis-- > 0 && !trailing;)
      trailing = (part *= grid.shape[axis]) == width;
    if (!trailing)
      refuse("init-density", cfg.init_density,
             "has rows of " + std::to_string(width) + " numbers, which is no trailing part of the grid's shape " +
                 shape_text(grid.shape) + " (one number per row, rows of the last axis, ..., or all on one line)");
    double largest = 0.0;
    for (double value : density) {
      if (!(value >= 0.0) || !std::isfinite(value))
        refuse("init-density", cfg.init_density, "values must be finite and >= 0");
      largest = std::max(largest, value);
    }
    // The file's scale is free (it is normalised below): dividing by the largest value first
    // keeps the mass finite for values near the largest double.
    if (largest > 0.0)
      for (double& value : density) value /= largest;
  }
  // The mass of row r on the grid; a row without it is refused, naming the label node.
  auto row_mass = [&](std::size_t r) {
    double mass = 0.0;
    for (std::size_t i = r * row_size; i < (r + 1) * row_size; ++i) mass += grid.weights[i] * density[i];
    if (!(mass > 0.0) || !std::isfinite(mass))
      refuse("init-density", cfg.init_density,
             rows > 1 ? "has no mass in row " + std::to_string(r) + " (label node xi = " +
                            format_number(grid.labels[r]) + "): each label node's row is a probability density"
                      : std::string("has no mass on the grid"));
    return mass;
  };
  if (!cfg.perturbation.empty()) {
    std::vector<double> numbers;
    const int highest = highest_resolved_mode(cfg, grid);
    if (!parse_number_list(cfg.perturbation, numbers) || numbers.size() != 2 || numbers[0] < 1 ||
        numbers[0] != std::floor(numbers[0]) || numbers[0] > highest || !std::isfinite(numbers[1]))
      refuse("perturbation", cfg.perturbation,
             "needs k,eps with an integer k in [1, " + std::to_string(highest) +
                 "] (the highest mode this grid resolves) and a finite eps");
    // The perturbation is relative to the density's mean value on each row.
    for (std::size_t r = 0; r < rows; ++r) {
      const double mass = row_mass(r);
      for (std::size_t i = r * row_size; i < (r + 1) * row_size; ++i)
        density[i] = density[i] / mass + numbers[1] * perturbation_shape(grid, cfg.run.d, int(numbers[0]), i, gauge_angles);
    }
  }
  for (std::size_t r = 0; r < rows; ++r) {
    const double mass = row_mass(r);
    for (std::size_t i = r * row_size; i < (r + 1) * row_size; ++i) {
      density[i] /= mass;
      if (density[i] < 0.0)
        refuse("perturbation", cfg.perturbation, "makes the density negative (take a smaller eps)");
    }
  }
  return density;
}

std::vector<std::pair<std::string, std::size_t>> observable_layout(bool labelled) {
  std::vector<std::pair<std::string, std::size_t>> layout = {
      {"mass", 1}, {"energy", 1}, {"free_energy", 1}, {"min_density", 1},
      {"order_parameter", 1}, {"mode_amplitudes", meanfield::kRecordedModes}};
  if (labelled) {
    layout.push_back({"conditional_circular_variance", 1});
    layout.push_back({"marginal_circular_variance", 1});
  }
  return layout;
}

std::vector<std::vector<double>> observable_values(const meanfield::DensityObservables& o, bool labelled) {
  std::vector<std::vector<double>> values = {{o.mass}, {o.energy}, {o.free_energy}, {o.min_density},
                                             {o.order_parameter}, std::vector<double>(o.modes.begin(), o.modes.end())};
  if (labelled) {
    values.push_back({o.conditional_variance});
    values.push_back({o.marginal_variance});
  }
  return values;
}

/// --resume: the file must hold a solve of the same options (the horizon may grow), as for runs.
void check_resumable(const MeanfieldConfig& cfg) {
  RunConfig all = cfg.run;
  all.parameters = cfg.parameters;
  refuse_another_trajectory(all, resumable_file(all));
}

/// Roughly the bytes a solve needs at its peak: the circle's kernel spectra (3 per label offset)
/// and work rows, the pair loop's grid tokens; the zonal solver's four dense n_theta^2
/// matrices (kernels, heat eigenvectors); the sphere's grid and coefficients.
double meanfield_memory_bytes(const MeanfieldConfig& cfg, double grid) {
  const double labels = double(std::max<std::int64_t>(cfg.label_points, 1));
  if (cfg.zonal) return 4.0 * 8.0 * grid * grid;
  // S^2: the grid's fields, and per label node about 20 rows of coefficients (L^2 / 2 complex)
  // and grid values (4.5 L^2).
  if (cfg.run.d == 3) return 200.0 * (3.0 * grid + 2.0) * (3.0 * grid + 2.0) + labels * 400.0 * grid * grid;
  const double spectra = 3.0 * 16.0 * (2.0 * labels - 1.0) * (grid / 2.0 + 1.0);
  return spectra + 16.0 * 8.0 * labels * grid + 400.0 * labels * grid;
}

void refuse_beyond_memory(const MeanfieldConfig& cfg) {
  const double grid = double(cfg.grid > 0 ? cfg.grid : (cfg.run.d == 3 && !cfg.zonal ? 32 : 256));
  const double needed = meanfield_memory_bytes(cfg, grid);
  std::string source;
  const double available = available_memory_bytes(&source);
  if (needed > available)
    throw UsageError("--grid " + std::to_string(static_cast<std::int64_t>(grid)) + " --label-points " + std::to_string(cfg.label_points) +
                     ": the solve needs about " + option_rules::format_bytes(needed) + " of memory, more than the " +
                     option_rules::format_bytes(available) + " available (" + source + "); make the grid smaller");
}

}  // namespace

MeanfieldConfig parse_meanfield_arguments(const std::vector<std::string>& args) {
  MeanfieldConfig cfg;
  po::options_description table = run_options(cfg.run);
  table.add(meanfield_options(cfg));
  po::variables_map vm;
  store_run_arguments(args, table, vm, cfg.run);
  RunConfig defaults;
  const po::options_description run_table = run_options(defaults);
  for (const auto& option : run_table.options()) {
    const std::string& name = option->long_name();
    if (vm.count(name) && !vm[name].defaulted() &&
        std::find(kMeanfieldRunOptions.begin(), kMeanfieldRunOptions.end(), name) == kMeanfieldRunOptions.end())
      throw UsageError("--" + name + ": not taken by mfattn meanfield (a density has no such option; "
                       "see mfattn meanfield --help for those it takes)");
  }
  RunConfig& run = cfg.run;
  // --evaluation is the run's option (one name for both commands); the density's default is
  // auto, and its values are the density's table's (direct is quadrature there).
  cfg.evaluation = vm["evaluation"].defaulted() ? std::string("auto") : run.evaluation;
  // The step control of a second-order scheme: the run's dopri5 defaults (1e-8, 1e-10) would
  // take ~60 times the steps for a time error far below the grid's (docs/meanfield.md).
  if (vm["rtol"].defaulted()) run.rtol = kMeanfieldDefaultRtol;
  if (vm["atol"].defaulted()) run.atol = kMeanfieldDefaultAtol;
  // Repulsive attention is checked for particles only (docs/model.md section 2).
  if (run.beta < 0)
    refuse("beta", format_number(run.beta),
           "mfattn meanfield takes beta >= 0 (a repulsive beta < 0 runs as particles: mfattn run)");
  if (cfg.label_points < 0 || cfg.label_points > 4096)
    refuse("label-points", std::to_string(cfg.label_points), "must be in [0, 4096]");
  // (0 is the default's sentinel, "256, 32 or 256"; given, it is refused as any other value.)
  const bool sphere_degree = run.d == 3 && !cfg.zonal;
  if ((!vm["grid"].defaulted() || cfg.grid != 0) && (cfg.grid < 4 || cfg.grid > (sphere_degree ? 1024 : 1 << 22)))
    refuse("grid", std::to_string(cfg.grid),
           sphere_degree ? "must be an integer in [4, 1024] (the maximal degree L on S^2)"
                         : std::string("must be an integer in [4, 4194304] (") + (cfg.zonal ? "polar cells)" : "circle cells)"));
  if (!std::isfinite(cfg.init_kappa)) refuse("init-kappa", format_number(cfg.init_kappa), "must be finite");
  // The run options are validated as a run of the label nodes would be (the noise needs no
  // integrator here: the solver's diffusion takes it); then what the solver takes is checked on
  // their typed values (RunChoices), as its own choices are on MeanfieldChoices.
  RunConfig as_run = run;
  as_run.n = std::max<std::int64_t>(cfg.label_points, 1);
  as_run.integrator = run.noise_kappa > 0 ? "euler-maruyama" : "rk4";
  run.choices = validate(as_run);
  run.n = as_run.n;
  run.integrator = as_run.integrator;
  const RunChoices& chosen = run.choices;
  cfg.choices.evaluation = option_rules::require_choice(kEvaluationOption, cfg.evaluation);
  if (const auto init = kInitDensityOption.preset(cfg.init_density)) {
    cfg.choices.init_density = *init;
  } else {
    cfg.choices.init_density = InitDensity::File;
    require_input_file("init-density", cfg.init_density, kInitDensityOption.accepted());
  }
  cfg.choices.perturbation_coordinate =
      option_rules::require_choice(kPerturbationCoordinateOption, cfg.perturbation_coordinate);
  if (!chosen.backend->evaluates_densities) {
    std::string takes;
    for (const BackendName& entry : kBackendNames)
      if (entry.evaluates_densities) takes += (takes.empty() ? "" : ", ") + std::string(entry.name);
    refuse("backend", run.backend, "mfattn meanfield runs on the cpu (accepted: " + takes + ")");
  }
  const ModelKinds kinds{chosen.kernel, chosen.placement, chosen.aux_factor.factor, is_whole_layer(run), false};
  if (const std::string refusal = capability_refusal("mfattn meanfield", kMeanfieldTakes, kinds); !refusal.empty())
    throw UsageError(refusal);
  if (cfg.zonal && cfg.label_points > 0) refuse("label-points", std::to_string(cfg.label_points), "not with --zonal");
  if (run.d > 3 && !cfg.zonal) refuse("d", std::to_string(run.d), "d > 3 needs --zonal (densities of <x, e_1>)");
  if (cfg.choices.evaluation != meanfield::CircleEvaluation::Automatic && (run.d != 2 || cfg.zonal))
    refuse("evaluation", cfg.evaluation, "chooses the circle's evaluation (--d 2 without --zonal)");
  if (cfg.label_points > 0 && chosen.positions != PositionLayout::Uniform)
    refuse("positions", run.positions, "label nodes sit at xi_c = 2 pi c / M_xi: --label-points needs --positions uniform");
  if (cfg.label_points == 0 && chosen.positions != PositionLayout::Index)
    refuse("positions", run.positions, "positions are label nodes: give --label-points");
  if (cfg.label_points == 0) {
    // A gauge, a factor or a mask acts on labels.
    const char* needs_labels = "acts on labels: give --label-points and --positions uniform";
    if (chosen.geometry != GeometryKind::None) refuse("geometry", run.geometry, needs_labels);
    if (chosen.aux_factor.factor != AuxFactor::None) refuse("aux-factor", run.aux_factor, needs_labels);
    if (chosen.mask.kind != MaskKind::Full || chosen.mask.per_prompt) refuse("mask", run.mask, needs_labels);
  }
  if (!cfg.compare.empty()) {
    // The particle run is checked before the solve (a file it would refuse afterwards would
    // leave a density file behind a usage error).
    require_input_file("compare", cfg.compare);
    try {
      const SeriesFile run_file(cfg.compare);
    } catch (const NotMfattnFile& e) {
      refuse("compare", cfg.compare, e.what());
    }
  }
  refuse_beyond_memory(cfg);
  if (cfg.choices.perturbation_coordinate == PerturbationCoordinate::Gauge &&
      (cfg.label_points == 0 || run.d != 2 || cfg.zonal))
    refuse("perturbation-coordinate", cfg.perturbation_coordinate,
           "the gauge coordinate is a label node's (the circle with --label-points); accepted here: " +
               std::string(kPerturbationCoordinateOption.name_of(PerturbationCoordinate::Theta)));
  std::ostringstream command_line;
  command_line << "mfattn meanfield";
  for (const auto& arg : args) command_line << ' ' << arg;
  cfg.command_line = command_line.str();
  // /parameters records the options a solve takes (the run table's others have no meaning
  // for a density: info would list them).
  const po::options_description own = meanfield_options(cfg);
  cfg.parameters.clear();
  for (const Parameter& parameter : table_parameters(table, vm))
    if (std::find(kMeanfieldRunOptions.begin(), kMeanfieldRunOptions.end(), parameter.name) != kMeanfieldRunOptions.end() ||
        own.find_nothrow(parameter.name, false) != nullptr)
      cfg.parameters.push_back(parameter);
  for (Parameter& parameter : cfg.parameters) {
    if (parameter.name == "rtol") parameter.value = run.rtol;
    if (parameter.name == "atol") parameter.value = run.atol;
    if (parameter.name == "evaluation") parameter.value = cfg.evaluation;  // the density's default: auto
  }
  return cfg;
}

std::string meanfield_usage() {
  std::ostringstream text;
  MeanfieldConfig defaults;
  po::options_description table = meanfield_options(defaults);
  text << "usage: mfattn meanfield [--config FILE] [options] --out FILE.h5\n"
          "  the mean-field (density) equation of the model mfattn run simulates (docs/meanfield.md):\n"
          "  d = 2 on the circle (any Q, K, V; labels with --label-points), d = 3 on S^2 (labels with rope\n"
          "  about e_3) and any d with --zonal (Q^T K and V multiples of I). It takes these run options\n"
          "  (mfattn run --help):\n  ";
  for (std::size_t i = 0; i < kMeanfieldRunOptions.size(); ++i)
    text << "--" << kMeanfieldRunOptions[i] << (i + 1 < kMeanfieldRunOptions.size() ? (i % 8 == 7 ? "\n  " : " ") : "\n");
  text << table;
  return text.str();
}

int run_meanfield(const MeanfieldConfig& given, std::ostream& out, std::ostream& log) {
  MeanfieldConfig cfg = given;
  const StopSignals stop_signals({.keep_ignored = false, .restart_calls = true, .wake_pipe = false,
                                  .end_on_late_repeat = true});
  const int threads = resolve_threads(cfg.run.threads);
  Problem problem;
  std::vector<double> density;
  std::vector<double> times;
  // A refusal here ends the solve before its file exists (command_errors.hpp).
  const int set_up = guarded("meanfield", [&] {
    start_thread_team(threads);
    if (cfg.run.resume) check_resumable(cfg);
    problem = make_problem(cfg, threads);
    density = initial_density(cfg, problem.density->grid(),
                              cfg.choices.perturbation_coordinate == PerturbationCoordinate::Gauge
                                  ? label_gauge_angles(problem.label_model)
                                  : std::vector<double>(problem.label_model.n, 0.0));
    times = output_times(cfg.run);
    return int(kExitOk);
  }, log);
  if (set_up != kExitOk) return set_up;
  meanfield::DensitySolver& solver = *problem.density;
  const meanfield::DensityGrid& grid = solver.grid();
  const bool labelled = !grid.labels.empty();
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  std::unique_ptr<H5mdWriter> writer;
  ResumePoint resumed;
  const int opened = guarded("meanfield", [&] {
    WriterSetup setup;
    setup.path = cfg.run.out;
    setup.overwrite = cfg.run.overwrite;
    setup.atomic_publish = !cfg.run.resume;
    setup.expected_frames = times.size();
    setup.field_shape = grid.shape;
    setup.n = grid.size();
    setup.d = 1;
    setup.creator_version = kVersion;
    setup.deflate = cfg.run.deflate;
    setup.fletcher32 = cfg.run.fletcher32;
    if (const char* user = std::getenv("USER")) setup.author = user;
    setup.observables = observable_layout(labelled);
    if (cfg.run.resume) {
      try {
        writer = H5mdWriter::open_for_resume(setup, resumed);
      } catch (const NotMfattnFile& e) {
        // A file that is not a density file to continue (data outside it, ...).
        throw UsageError(std::string("--resume: ") + e.what());
      }
      writer->write_run_info("running", resumed.wall_seconds, resumed.steps, resumed.rejected_steps);
      writer->flush();
      density = resumed.x;
      std::erase_if(times, [&](double t) { return t <= resumed.time; });
    } else {
      writer = H5mdWriter::create(setup);
    }
    std::vector<Parameter> parameters = cfg.parameters;
    parameters.push_back({"command", std::string("meanfield")});
    parameters.push_back({"command_line", cfg.command_line});
    parameters.push_back({"config_text", cfg.run.config_text});
    parameters.push_back({"version", std::string(kVersion)});
    parameters.push_back({"source_revision", std::string(kSourceRevision)});
    parameters.push_back({"scheme_used", solver.scheme()});
    parameters.push_back({"threads_used", static_cast<std::int64_t>(threads)});
    parameters.push_back({"eps_den_used", problem.label_model.eps_den});
    if (cfg.run.resume) parameters.push_back({"resumed_from_time", resumed.time});
    writer->write_parameters(parameters);
    if (!cfg.run.resume) {
      writer->write_field_dataset("theta", {grid.theta.size()}, grid.theta);
      if (!grid.phi.empty()) writer->write_field_dataset("phi", {grid.phi.size()}, grid.phi);
      if (!grid.labels.empty()) writer->write_field_dataset("labels", {grid.labels.size()}, grid.labels);
      writer->write_field_dataset("weights", grid.shape, grid.weights);
    }
    return int(kExitOk);
  }, log);
  if (opened != kExitOk) return opened;
  double t = resumed.time;
  std::int64_t steps = resumed.step;
  double last_flush = -1.0;
  Progress progress("mfattn meanfield", cfg.run.quiet, t, cfg.run.horizon, steps, log);
  // The last frame the file keeps, for /run and the last line (kept_frames.hpp): a flush that
  // meets a full disk may keep only some of the staged frames.
  KeptFrames file_frames(*writer, {resumed.time, resumed.step, 0, resumed.wall_seconds}, resumed.frames);
  auto flush_frames = [&] {
    try {
      writer->flush();
    } catch (const IoError&) {
      file_frames.note_flushed();
      throw;
    }
    file_frames.note_flushed();
  };
  // Records why the solve ended in /run, if the file still takes it (a full disk may not),
  // with the counts of the last frame it keeps; the staged frames are flushed first unless
  // writing failed already. Whether the status was recorded.
  auto record = [&](const std::string& status, bool flush_staged_first) {
    try {
      if (flush_staged_first) flush_frames();
      const FrameCounts& kept = file_frames.kept();
      writer->write_run_info(status, kept.wall_seconds, kept.step, 0);
      writer->flush();
      return true;
    } catch (const IoError&) {
      file_frames.note_flushed();
      return false;
    }
  };
  auto keeps_line = [&](bool recorded, const std::string& advice) {
    if (writer->current_path() != cfg.run.out) return;  // not published: no file is left
    log << "mfattn meanfield: " << writer->current_path() << " keeps every frame up to t = "
        << format_number(file_frames.kept().time) << (recorded ? " and records the failure" : "") << " ("
        << advice << ")\n";
  };
  try {
    auto append = [&](double time) {
      writer->append_frame(steps, time, density.data(), observable_values(solver.observe(density), labelled),
                           0.0, nullptr, time == cfg.run.horizon ? FrameRole::Final : FrameRole::Intermediate);
      file_frames.appended({time, steps, 0, resumed.wall_seconds + elapsed()});
      writer->write_run_progress(resumed.wall_seconds + elapsed(), steps, 0);
      if (last_flush < 0.0 || elapsed() - last_flush >= cfg.run.flush_interval || time == cfg.run.horizon) {
        flush_frames();
        last_flush = elapsed();
      }
    };
    if (!cfg.run.resume) append(0.0);
    for (double target : times) {
      if (target <= t) continue;
      // Each frame starts the step control afresh, so a resumed solve repeats these steps.
      solver.reset_step_control();
      while (t < target) {
        if (const int signal = StopSignals::received()) {
          progress.finish();
          record("interrupted: " + signal_name(signal), /*flush_staged_first=*/true);
          log << "mfattn meanfield: interrupted by " << signal_name(signal) << " at t = " << format_number(t) << "; "
              << writer->current_path() << " keeps every frame up to t = " << format_number(file_frames.kept().time)
              << " (continue it with --resume)\n";
          return 128 + signal;
        }
        const double remaining = target - t;
        const double dt = solver.step(density, remaining);
        // A grid that cannot resolve the solution shows it here: values that are no longer
        // finite, or steps too small to move the clock.
        if (!std::all_of(density.begin(), density.end(), [](double v) { return std::isfinite(v); }))
          throw std::runtime_error("the density is not finite after t = " + format_number(t) +
                                   " (the grid does not resolve the solution: a larger --grid, or noise)");
        // (Relative to the clock, not to the horizon: a far horizon says nothing of the step.)
        if (!(dt >= 1e-13 * std::max(1.0, t)) && dt < remaining)
          throw std::runtime_error("the step size fell to " + format_number(dt) + " at t = " + format_number(t) +
                                   " (the grid does not resolve the solution: a larger --grid, or noise)");
        t = dt >= remaining ? target : t + dt;
        ++steps;
        progress.update(t, steps);
      }
      append(target);
    }
    writer->write_run_info("complete", resumed.wall_seconds + elapsed(), steps, 0);
    writer->flush();
    progress.finish();
  } catch (const OutputExists&) {
    // The output appeared while frame 0 was being published: nothing of this solve is left.
    progress.finish();
    return report_current_exception("meanfield", log);
  } catch (const std::runtime_error& e) {
    progress.finish();
    if (dynamic_cast<const IoError*>(&e)) {
      log << "mfattn meanfield: " << e.what() << '\n';
      keeps_line(record(std::string("failed: I/O: ") + e.what(), /*flush_staged_first=*/false),
                 "continue it with --resume once the fault is fixed");
      return kExitIo;
    }
    log << "mfattn meanfield: numerical failure: " << e.what() << '\n';
    record(std::string("failed: ") + e.what(), /*flush_staged_first=*/true);
    return kExitNumerical;
  }
  if (!cfg.compare.empty()) {
    // The density file is closed before it is read back.
    writer.reset();
    return compare_density_with_run(cfg.run.out, cfg.compare, /*json=*/false, out, log);
  }
  return kExitOk;
}

int meanfield_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return run_meanfield(parse_meanfield_arguments(args), out, err);
}

}  // namespace mfattn
