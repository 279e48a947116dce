#pragma once
/// \file fit.hpp
/// `mfattn fit` (docs/cli.md, "fit"; docs/model.md section 5b): the weights of a run, its
/// initial tokens and beta fitted so that the run carries the tokens to a target, by the
/// gradients of whole runs (gradient_of_run) and Adam or L-BFGS. The weights are taken as
/// L piecewise-constant layers in time (layer l on [l T, (l + 1) T)); the result is a
/// --weights file that `mfattn run` replays exactly, with the loss of every iteration in it.
#include <iosfwd>
#include <string>
#include <vector>

namespace mfattn {

/// The usage text of `mfattn fit --help` (its own options, then the run option table).
std::string fit_usage();

/// Runs `mfattn fit` with these words; returns the exit code (0, 2 usage, 3 numerical, 4 I/O,
/// 128 + s stopped by signal s with the best weights written). Progress lines go to `err`
/// unless --quiet.
int fit_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace mfattn
