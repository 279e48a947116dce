#pragma once
/// \file meanfield_compare.hpp
/// `mfattn meanfield --compare RUN.h5`: the Wasserstein-1 distance between a particle run's
/// empirical measure and a density file of `mfattn meanfield` (docs/meanfield.md), frame by
/// frame.
///
/// The two measures.
/// - Particles: replica 0 of the run only (a run with R > 1 replicas has R independent
///   empirical measures; pooling them would measure a different, smoother measure), each
///   token of presence p > 0 with mass 1/n' (n' such tokens). Null tokens (p = 0) never move
///   and are no sources, so they are left out; `mfattn meanfield` refuses the options that
///   would make presences other than 0 and 1 (--amplitudes), so no other weighting arises.
///   Positions are used as stored (directions: atan2 and arccos of x / |x|).
/// - Density: the grid masses m_a = weights_a * value_a of one frame, divided by their sum
///   (the solvers keep the sum 1 to rounding; the division makes both measures probabilities).
///   With labels (circle, shape [M_xi, M]) the theta-marginal is the mean of the rows (the
///   label marginal is uniform). A slightly negative value is kept: the formulas below are
///   then the Kantorovich-Rubinstein norm of the difference, which is W1 for measures.
///
/// The metrics, by the kind of density file.
/// - "circle-w1" (d = 2, with or without labels): exact W1 on the circle (arc length) between
///   the angles t_i = atan2(x_2, x_1) in [0, 2 pi) and the theta-marginal, piecewise constant
///   on the cells [theta_a - h/2, theta_a + h/2), theta_a = a h, h = 2 pi / M (cell 0 wraps
///   around 0):
///       W1 = min_c int_0^{2 pi} |G(t) - c| dt,   G = F_particles - F_density,
///   F the CDFs from 0. G is linear between the breakpoints (cell edges and particle angles),
///   so it is a list of linear pieces; the minimising c is a median of G(t) under dt, found
///   exactly (the measure of {G < c} is linear in c between the pieces' end values: a binary
///   search over those values, then a linear solve), and the integral of |G - c| is exact on
///   each piece. Exact up to rounding.
/// - "zonal-polar-w1" (a zonal file, any d): exact W1 on [0, pi] between the polar angles
///   arccos(<x, e_1>) of the particles and the density's polar law, each cell mass m_a spread
///   uniformly in theta over its cell [a h, (a + 1) h], h = pi / n_theta:
///       W1 = int_0^pi |F_particles(t) - F_density(t)| dt   (the same linear pieces, c = 0).
///   The spreading is the file's own resolution: within a cell the true polar law has the
///   weight sin^{d-2} theta, which a finer grid resolves.
/// - "sliced-w1-64" (S^2, d = 3): the sliced W1, the mean over K = 64 fixed directions
///       u_k = (r_k cos(k g), r_k sin(k g), z_k),  z_k = 1 - (2k + 1)/K,  r_k = sqrt(1 - z_k^2),
///       g = pi (3 - sqrt 5) (the Fibonacci sphere), k = 0..K-1,
///   of the exact 1-D W1 (int |F - G|) between the projections <x, u_k> of the particles and
///   of the density, the density taken as the discrete measure of its grid points
///   x = (sin t cos p, sin t sin p, cos t) with masses m_a. Two approximations: the directions
///   are a quadrature of the mean over the sphere (the sliced W1 proper), and the grid points
///   are a quadrature of the density, so a density equal to the particles' limit still shows
///   a floor set by the grid: against the continuous uniform density (100000 Fibonacci points
///   standing in for it) the grid's sliced W1 is 7.6e-3 at L = 8, 2.7e-3 at L = 16, 9.5e-4
///   at the default L = 32 and 3.8e-4 at L = 64; differences below the floor mean nothing. The
///   sliced W1 is at most W1 on the sphere's chordal metric, not equal to it.
///
/// Frames: a density frame and a run's position row are common when their times agree within
/// 1e-9 max(1, |t|); the run's rows are its position_times() (every frame, or the two ends
/// of --save-positions ends).
#include <iosfwd>
#include <string>
#include <vector>

namespace mfattn {

/// W1 between a particle run's empirical measure and a density file, at their common frames.
/// Prints one line per common frame, "t = T  W1 = W  (METRIC, replica 0)", to out, or with json
/// one JSON object {"metric": ..., "replica": 0, "frames": [{"time": t, "w1": w}, ...]} (exact
/// numbers; a frame whose density has no mass gives null). Nothing is printed unless every
/// frame is measured. Returns an ExitCode of include/mfattn/app/run.hpp: 2 for files that do
/// not match (missing, not an mfattn file, not a density file or not a particle run, a
/// different d, no common frame), 4 for I/O failures; messages go to log.
/// who: the messages' prefix ("mfattn meanfield --compare"); stored: where not empty, the JSON
/// object is also written to that file, whole or not at all (write_text_atomically).
int compare_density_with_run(const std::string& density_file, const std::string& run_file,
                             bool json, std::ostream& out, std::ostream& log,
                             const std::string& who = "mfattn meanfield --compare",
                             const std::string& stored = "");

/// `mfattn compare PARTICLES.h5 DENSITY.h5 [--json] [--out FILE.json]`: the same W1 for two
/// existing files (docs/meanfield.md section 7). Returns the exit code.
int compare_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
std::string compare_usage();

}  // namespace mfattn
