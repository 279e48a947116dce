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
#include "mfattn/io/h5md.hpp"

namespace mfattn {

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
