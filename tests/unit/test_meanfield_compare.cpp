// mfattn meanfield --compare (src/app/commands/meanfield_compare.cpp): W1 between a particle
// run and a density file, against values derived by hand and against independent brute-force
// optimal matchings; the files are written here with the project's writer, as the commands
// write them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "mfattn/app/meanfield_compare.hpp"
#include "mfattn/app/run.hpp"
#include "mfattn/core/number_text.hpp"
#include "mfattn/io/h5md.hpp"
#include "mfattn/meanfield/solvers.hpp"
#include "test_support.hpp"

namespace {

using namespace mfattn;
constexpr double kPi = std::numbers::pi;

/// The grid and values of a density file, as `mfattn meanfield` writes them.
struct DensitySpec {
  std::int64_t d = 2;
  bool zonal = false;
  std::vector<std::size_t> shape;
  std::vector<double> theta, phi, labels, weights;
  std::vector<double> times{0.0};
  std::vector<std::vector<double>> frames;  ///< one row of values per time
};

void write_density(const std::string& path, const DensitySpec& spec) {
  WriterSetup setup;
  setup.path = path;
  setup.overwrite = true;
  setup.field_shape = spec.shape;
  setup.n = spec.weights.size();
  setup.d = 1;
  auto writer = H5mdWriter::create(setup);
  writer->write_parameters({{"d", spec.d}, {"zonal", spec.zonal}, {"command", std::string("meanfield")}});
  writer->write_field_dataset("theta", {spec.theta.size()}, spec.theta);
  if (!spec.phi.empty()) writer->write_field_dataset("phi", {spec.phi.size()}, spec.phi);
  if (!spec.labels.empty()) writer->write_field_dataset("labels", {spec.labels.size()}, spec.labels);
  writer->write_field_dataset("weights", spec.shape, spec.weights);
  for (std::size_t f = 0; f < spec.times.size(); ++f)
    writer->append_frame(static_cast<std::int64_t>(f), spec.times[f], spec.frames[f].data(), {});
  writer->write_run_info("complete", 0.0, 0, 0);
  writer->flush();
}

/// A particle run of n tokens in R^d: one row of positions per time; presence 1 unless given.
void write_run(const std::string& path, std::size_t d, const std::vector<std::vector<double>>& rows,
               const std::vector<double>& times, std::vector<double> presence = {}) {
  const std::size_t n = rows.front().size() / d;
  if (presence.empty()) presence.assign(n, 1.0);
  WriterSetup setup;
  setup.path = path;
  setup.overwrite = true;
  setup.n = n;
  setup.d = d;
  auto writer = H5mdWriter::create(setup);
  writer->write_parameters({{"d", static_cast<std::int64_t>(d)}, {"command", std::string("run")}});
  TokenLabels labels;
  labels.aux_position.assign(n, 0.0);
  labels.prompt_id.assign(n, 0);
  labels.presence = presence;
  labels.id.resize(n);
  for (std::size_t i = 0; i < n; ++i) labels.id[i] = static_cast<std::int64_t>(i);
  writer->write_labels(labels);
  for (std::size_t f = 0; f < times.size(); ++f)
    writer->append_frame(static_cast<std::int64_t>(f), times[f], rows[f].data(), {});
  writer->write_run_info("complete", 0.0, 0, 0);
  writer->flush();
}

/// A circle density of M cells (theta_a = 2 pi a / M, weights h) with the given values.
DensitySpec circle_density(const std::vector<double>& values) {
  DensitySpec spec;
  const std::size_t m = values.size();
  spec.shape = {m};
  for (std::size_t a = 0; a < m; ++a) spec.theta.push_back(2 * kPi * double(a) / double(m));
  spec.weights.assign(m, 2 * kPi / double(m));
  spec.frames = {values};
  return spec;
}

std::vector<double> points_at_angles(const std::vector<double>& angles) {
  std::vector<double> x;
  for (double a : angles) x.insert(x.end(), {std::cos(a), std::sin(a)});
  return x;
}

struct Comparison {
  int exit_code = -1;
  std::string out, log;
  std::vector<double> w1;  ///< read back from the text lines
};

Comparison compare(const std::string& density, const std::string& run, bool json = false) {
  std::ostringstream out, log;
  Comparison c;
  c.exit_code = compare_density_with_run(density, run, json, out, log);
  c.out = out.str();
  c.log = log.str();
  if (!json) {
    std::istringstream lines(c.out);
    std::string line;
    while (std::getline(lines, line)) {
      const auto at = line.find("W1 = ");
      if (at != std::string::npos) c.w1.push_back(std::stod(line.substr(at + 5)));
    }
  }
  return c;
}

/// W1 of the density file at path against one frame of particles at t = 0.
double w1_against(const std::filesystem::path& dir, const DensitySpec& density, std::size_t d,
                  const std::vector<double>& positions) {
  const std::string density_file = (dir / "density.h5").string(), run_file = (dir / "run.h5").string();
  write_density(density_file, density);
  write_run(run_file, d, {positions}, {0.0});
  const Comparison c = compare(density_file, run_file);
  EXPECT_EQ(c.exit_code, 0) << c.log;
  EXPECT_EQ(c.w1.size(), 1u) << c.out;
  return c.w1.empty() ? -1.0 : c.w1.front();
}

double circle_distance(double a, double b) {
  const double gap = std::fmod(std::abs(a - b), 2 * kPi);
  return std::min(gap, 2 * kPi - gap);
}

/// N atoms of mass 1/N at the midpoint quantiles of a law spread uniformly over cells
/// [edges[k], edges[k+1]) with masses mass[k] (summing to 1). W1 between the law and these
/// atoms is at most sum_j (1/N) width_j / 4 = (total length) / (4 N).
std::vector<double> quantile_atoms(const std::vector<double>& edges, const std::vector<double>& mass, std::size_t count) {
  std::vector<double> atoms;
  std::size_t cell = 0;
  double below = 0.0;
  for (std::size_t j = 0; j < count; ++j) {
    const double level = (double(j) + 0.5) / double(count);
    while (cell + 1 < mass.size() && below + mass[cell] < level) below += mass[cell++];
    atoms.push_back(edges[cell] + (level - below) / mass[cell] * (edges[cell + 1] - edges[cell]));
  }
  return atoms;
}

// ---------------------------------------------------------------------------------------
// Circle

TEST(MeanfieldCompare, CircleUniformAgainstOnePointIsHalfPi) {
  // mu = delta_alpha, nu uniform: G(t) = 1[t >= alpha] - t / (2 pi) takes every value of
  // (-alpha / (2 pi), 1 - alpha / (2 pi)) once, so under dt / (2 pi) it is uniform on an
  // interval of length 1: c = its midpoint and W1 = 2 pi E|U - 1/2| = pi / 2 (U uniform on
  // [0, 1]), whatever alpha: the mean arc distance from alpha to the uniform law.
  const auto dir = mfattn::testing::scratch_dir("compare_circle_dirac");
  const DensitySpec uniform = circle_density(std::vector<double>(64, 1.0 / (2 * kPi)));
  for (double alpha : {1.0, 0.0, 2 * kPi - 1e-3, 4.0}) {
    const std::vector<double> angles(5, alpha);
    EXPECT_NEAR(w1_against(dir, uniform, 2, points_at_angles(angles)), kPi / 2, 1e-12) << "alpha " << alpha;
  }
  std::filesystem::remove_all(dir);
}

TEST(MeanfieldCompare, CircleUniformAgainstEquallySpacedPointsIsPiOver2n) {
  // n points at 2 pi a / n: on each arc between two points G falls linearly from 1/n to 0,
  // so c = 1/(2n) and int |G - c| = 2 pi (1/n) (1/4) = pi / (2n): each point carries its
  // arc's mass 1/n a mean distance (2 pi / n) / 4. Holds for any number of uniform cells.
  const auto dir = mfattn::testing::scratch_dir("compare_circle_spaced");
  for (std::size_t cells : {16u, 64u}) {
    for (std::size_t n : {16u, 8u}) {
      std::vector<double> angles;
      for (std::size_t a = 0; a < n; ++a) angles.push_back(2 * kPi * double(a) / double(n));
      const DensitySpec uniform = circle_density(std::vector<double>(cells, 1.0 / (2 * kPi)));
      EXPECT_NEAR(w1_against(dir, uniform, 2, points_at_angles(angles)), kPi / (2.0 * double(n)), 1e-12)
          << cells << " cells, n = " << n;
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(MeanfieldCompare, CircleCellAgainstItsCentreIsAQuarterCell) {
  // All the mass in one cell (it wraps around 0 for cell 0) against points at its centre:
  // the mass spread over the cell moves a mean distance h/4. The shift c matters here: a W1
  // without it (on [0, 2 pi) cut at 0) sees cell 0's two halves as far apart.
  const auto dir = mfattn::testing::scratch_dir("compare_circle_cell");
  const std::size_t cells = 32;
  const double h = 2 * kPi / double(cells);
  for (std::size_t cell : {0u, 7u, 31u}) {
    std::vector<double> values(cells, 0.0);
    values[cell] = 1.0 / h;
    const std::vector<double> angles(3, h * double(cell));
    EXPECT_NEAR(w1_against(dir, circle_density(values), 2, points_at_angles(angles)), h / 4, 1e-12) << cell;
  }
  std::filesystem::remove_all(dir);
}

TEST(MeanfieldCompare, CircleMatchesTheBestCyclicMatching) {
  // Independent reference: between two sets of N equal masses on the circle an optimal
  // transport plan is a cyclic shift of the sorted orders (Rabin, Delon, Gousseau, 2011),
  // so W1 = min_k (1/N) sum_i d(x_i, y_{i+k}). The density is replaced by N quantile atoms
  // (within pi / (2N) of it in W1) and each of the n particles by N/n copies.
  const auto dir = mfattn::testing::scratch_dir("compare_circle_random");
  std::mt19937_64 random(7);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const std::size_t cells = 12, n = 24, copies = 200, atoms = n * copies;
  const double h = 2 * kPi / double(cells);
  for (int trial = 0; trial < 3; ++trial) {
    std::vector<double> values(cells);
    for (double& v : values) v = uniform(random) * uniform(random);
    double total = 0.0;
    for (double v : values) total += v * h;
    for (double& v : values) v /= total;
    std::vector<double> angles;
    // Particles clustered near 2 pi - 1 (the cut at 0 must not matter).
    for (std::size_t i = 0; i < n; ++i) angles.push_back(std::fmod(2 * kPi - 1.0 + 2.0 * uniform(random), 2 * kPi));
    const double w1 = w1_against(dir, circle_density(values), 2, points_at_angles(angles));

    std::vector<double> edges{0.0}, mass{0.5 * values[0] * h};
    for (std::size_t a = 0; a < cells; ++a) {
      edges.push_back((double(a) + 0.5) * h);
      mass.push_back((a + 1 < cells ? values[a + 1] : 0.5 * values[0]) * h);
    }
    edges.push_back(2 * kPi);
    const std::vector<double> y = quantile_atoms(edges, mass, atoms);
    std::vector<double> x;
    for (double a : angles) x.insert(x.end(), copies, a);
    std::sort(x.begin(), x.end());
    double best = 1e300;
    for (std::size_t shift = 0; shift < atoms; ++shift) {
      double cost = 0.0;
      for (std::size_t i = 0; i < atoms; ++i) cost += circle_distance(x[i], y[(i + shift) % atoms]);
      best = std::min(best, cost / double(atoms));
    }
    EXPECT_NEAR(w1, best, kPi / (2.0 * double(atoms)) + 1e-12) << "trial " << trial;
    EXPECT_GT(w1, 0.05);
  }
  std::filesystem::remove_all(dir);
}

TEST(MeanfieldCompare, CircleWithLabelsUsesTheMeanOfTheRows) {
  // Two label rows, each all in one cell: the theta-marginal has mass 1/2 in each of the two
  // cells; particles half at each cell's centre: W1 = h/4 (as for one cell).
  const auto dir = mfattn::testing::scratch_dir("compare_circle_labels");
  const std::size_t cells = 32;
  const double h = 2 * kPi / double(cells);
  DensitySpec spec = circle_density(std::vector<double>(cells, 0.0));
  spec.shape = {2, cells};
  spec.labels = {0.0, kPi};
  spec.weights.assign(2 * cells, h);
  std::vector<double> values(2 * cells, 0.0);
  values[3] = 1.0 / h;
  values[cells + 20] = 1.0 / h;
  spec.frames = {values};
  const double a = 3 * h, b = 20 * h;
  EXPECT_NEAR(w1_against(dir, spec, 2, points_at_angles({a, b, a, b})), h / 4, 1e-12);
  std::filesystem::remove_all(dir);
}

// ---------------------------------------------------------------------------------------
// Zonal

DensitySpec zonal_density(std::size_t d, std::size_t cells, const std::vector<double>& values) {
  meanfield::IsotropicInteraction interaction;
  interaction.d = d;
  const auto solver = meanfield::make_zonal_solver(interaction, cells, {});
  const meanfield::DensityGrid& grid = solver->grid();
  DensitySpec spec;
  spec.d = static_cast<std::int64_t>(d);
  spec.zonal = true;
  spec.shape = grid.shape;
  spec.theta = grid.theta;
  spec.weights = grid.weights;
  spec.frames = {values};
  return spec;
}

TEST(MeanfieldCompare, ZonalUniformAgainstPoleAndEquator) {
  // The uniform zonal density puts the cell measure W_a (sum 1) on cell a, spread uniformly in
  // theta. Particles at theta0 with no cell straddling it (theta0 = 0, pi/2, pi for an even
  // number of cells): W1 = sum_a W_a |theta_a - theta0| exactly. For d = 3 (W_a from
  // sin(theta)/2) that is pi/2 at both poles by symmetry, and at the equator close to the
  // continuous law's int |theta - pi/2| sin(theta)/2 dtheta = pi/2 - 1.
  const auto dir = mfattn::testing::scratch_dir("compare_zonal_known");
  const std::size_t cells = 32;
  const DensitySpec spec = zonal_density(3, cells, std::vector<double>(cells, 1.0));
  auto expected = [&](double theta0) {
    double sum = 0.0, total = 0.0;
    for (std::size_t a = 0; a < cells; ++a) {
      sum += spec.weights[a] * std::abs(spec.theta[a] - theta0);
      total += spec.weights[a];
    }
    return sum / total;
  };
  const std::vector<double> pole{1, 0, 0, 1, 0, 0}, antipole{-1, 0, 0}, equator{0, 2, 0, 0, 0, -3};
  EXPECT_NEAR(w1_against(dir, spec, 3, pole), expected(0.0), 1e-12);
  EXPECT_NEAR(w1_against(dir, spec, 3, pole), kPi / 2, 1e-12);
  EXPECT_NEAR(w1_against(dir, spec, 3, antipole), kPi / 2, 1e-12);
  EXPECT_NEAR(w1_against(dir, spec, 3, equator), expected(kPi / 2), 1e-12);
  EXPECT_NEAR(w1_against(dir, spec, 3, equator), kPi / 2 - 1.0, 2e-3);
  std::filesystem::remove_all(dir);
}

TEST(MeanfieldCompare, ZonalMatchesTheSortedMatching) {
  // Independent reference on [0, pi]: between N equal masses on a line the sorted matching is
  // optimal, W1 = (1/N) sum_i |x_(i) - y_(i)|; the density as N quantile atoms (within
  // pi / (4N) in W1), each particle as N/n copies. d = 5, random density and directions.
  const auto dir = mfattn::testing::scratch_dir("compare_zonal_random");
  std::mt19937_64 random(11);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::normal_distribution<double> normal;
  const std::size_t d = 5, cells = 16, n = 30, copies = 100, atoms = n * copies;
  std::vector<double> values(cells);
  for (double& v : values) v = 0.1 + uniform(random);
  DensitySpec spec = zonal_density(d, cells, values);
  std::vector<double> positions, angles;
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<double> x(d);
    double norm = 0.0;
    for (double& c : x) {
      c = normal(random);
      norm += c * c;
    }
    x[0] += 0.8 * std::sqrt(norm);  // towards e_1, so the law differs from the density's
    norm = 0.0;
    for (double c : x) norm += c * c;
    positions.insert(positions.end(), x.begin(), x.end());
    angles.push_back(std::acos(x[0] / std::sqrt(norm)));
  }
  const double w1 = w1_against(dir, spec, d, positions);

  std::vector<double> edges, mass;
  double total = 0.0;
  for (std::size_t a = 0; a < cells; ++a) total += spec.weights[a] * values[a];
  for (std::size_t a = 0; a <= cells; ++a) edges.push_back(kPi * double(a) / double(cells));
  for (std::size_t a = 0; a < cells; ++a) mass.push_back(spec.weights[a] * values[a] / total);
  const std::vector<double> y = quantile_atoms(edges, mass, atoms);
  std::vector<double> x;
  for (double a : angles) x.insert(x.end(), copies, a);
  std::sort(x.begin(), x.end());
  double cost = 0.0;
  for (std::size_t i = 0; i < atoms; ++i) cost += std::abs(x[i] - y[i]);
  EXPECT_NEAR(w1, cost / double(atoms), kPi / (4.0 * double(atoms)) + 1e-12);
  EXPECT_GT(w1, 0.1);
  std::filesystem::remove_all(dir);
}

// ---------------------------------------------------------------------------------------
// Sphere

DensitySpec sphere_density(std::size_t max_degree) {
  const auto solver = meanfield::make_sphere_solver({}, max_degree);
  const meanfield::DensityGrid& grid = solver->grid();
  DensitySpec spec;
  spec.d = 3;
  spec.shape = grid.shape;
  spec.theta = grid.theta;
  spec.phi = grid.phi;
  spec.weights = grid.weights;
  spec.frames = {std::vector<double>(grid.size(), 1.0 / (4 * kPi))};
  return spec;
}

/// The header's 64 directions (the Fibonacci sphere), written out again.
double sliced_distance_of_two_points(const std::vector<double>& p, const std::vector<double>& q) {
  const double golden = kPi * (3.0 - std::sqrt(5.0));
  double sum = 0.0;
  for (int k = 0; k < 64; ++k) {
    const double z = 1.0 - (2.0 * k + 1.0) / 64.0, r = std::sqrt(1.0 - z * z);
    const double u[3] = {r * std::cos(golden * k), r * std::sin(golden * k), z};
    sum += std::abs((p[0] - q[0]) * u[0] + (p[1] - q[1]) * u[1] + (p[2] - q[2]) * u[2]);
  }
  return sum / 64.0;
}

TEST(MeanfieldCompare, SphereDiracAtAGridPoint) {
  // All the mass on one grid point g (theta from e_3, phi the azimuth): particles at g give
  // 0; particles at q give the mean over the directions of |<g - q, u_k>|, about |g - q| / 2
  // (the mean of |<v, u>| over uniform u is |v| / 2).
  const auto dir = mfattn::testing::scratch_dir("compare_sphere_dirac");
  DensitySpec spec = sphere_density(8);
  const std::size_t columns = spec.phi.size(), row = 2, column = 5;
  std::vector<double> values(spec.weights.size(), 0.0);
  values[row * columns + column] = 1.0 / spec.weights[row * columns + column];
  spec.frames = {values};
  const double t = spec.theta[row], p = spec.phi[column];
  const std::vector<double> g{std::sin(t) * std::cos(p), std::sin(t) * std::sin(p), std::cos(t)};
  EXPECT_NEAR(w1_against(dir, spec, 3, {g[0], g[1], g[2], 2 * g[0], 2 * g[1], 2 * g[2]}), 0.0, 1e-12);
  const std::vector<double> q{0.0, 0.0, -1.0};
  const double w1 = w1_against(dir, spec, 3, q);
  EXPECT_NEAR(w1, sliced_distance_of_two_points(g, q), 1e-12);
  double chord = 0.0;
  for (int k = 0; k < 3; ++k) chord += (g[k] - q[k]) * (g[k] - q[k]);
  EXPECT_NEAR(w1, std::sqrt(chord) / 2, 0.02 * std::sqrt(chord));
  std::filesystem::remove_all(dir);
}

TEST(MeanfieldCompare, SphereUniformAgainstThePoleIsTwoThirds) {
  // <x, u> of the uniform law on S^2 is uniform on [-1, 1] (Archimedes), so the 1-D W1 to a
  // point mass at a = <e_3, u> is E|X - a| = (1 + a^2) / 2, and the mean over uniform u is
  // 2/3; over the 64 directions, whose z_k^2 average 1/3 - 1/(3 K^2), it is 2/3 - 1/(6 K^2).
  // The grid's quadrature adds little here (1.2e-5 at L = 16, below 1e-6 at L = 32).
  const auto dir = mfattn::testing::scratch_dir("compare_sphere_uniform");
  const DensitySpec spec = sphere_density(32);
  EXPECT_NEAR(w1_against(dir, spec, 3, {0.0, 0.0, 1.0}), 2.0 / 3.0 - 1.0 / (6.0 * 64 * 64), 1e-5);
  std::filesystem::remove_all(dir);
}

// ---------------------------------------------------------------------------------------
// Frames, output and refusals

TEST(MeanfieldCompare, CommonFramesTextAndJson) {
  const auto dir = mfattn::testing::scratch_dir("compare_frames");
  const std::string density_file = (dir / "density.h5").string(), run_file = (dir / "run.h5").string();
  DensitySpec spec = circle_density(std::vector<double>(16, 1.0 / (2 * kPi)));
  spec.times = {0.0, 0.5, 1.0};
  spec.frames = {spec.frames[0], spec.frames[0], spec.frames[0]};
  write_density(density_file, spec);
  // Rows at 0.25 (no density frame), 0.5 (up to rounding) and 1: two common frames. A null
  // token (presence 0) far from the others is left out of the measure.
  const std::vector<double> one_point = points_at_angles({1.0, 1.0, 3.0});
  write_run(run_file, 2, {one_point, one_point, one_point}, {0.25, 0.5 + 1e-12, 1.0}, {1.0, 1.0, 0.0});
  const Comparison text = compare(density_file, run_file);
  ASSERT_EQ(text.exit_code, 0) << text.log;
  EXPECT_EQ(text.out, "t = 0.5  W1 = " + format_number(text.w1.at(0)) + "  (circle-w1, replica 0)\n" +
                          "t = 1  W1 = " + format_number(text.w1.at(1)) + "  (circle-w1, replica 0)\n");
  EXPECT_NEAR(text.w1[0], kPi / 2, 1e-12);
  const Comparison json = compare(density_file, run_file, true);
  ASSERT_EQ(json.exit_code, 0) << json.log;
  EXPECT_EQ(json.out, "{\"metric\": \"circle-w1\", \"replica\": 0, \"frames\": [{\"time\": 0.5, \"w1\": " +
                          format_number(text.w1[0]) + "}, {\"time\": 1, \"w1\": " + format_number(text.w1[1]) +
                          "}]}\n");
  std::filesystem::remove_all(dir);
}

TEST(MeanfieldCompare, FilesThatDoNotMatchAreUsageErrors) {
  const auto dir = mfattn::testing::scratch_dir("compare_refusals");
  const std::string density_file = (dir / "density.h5").string(), run_file = (dir / "run.h5").string(),
                    run3_file = (dir / "run3.h5").string(), text_file = (dir / "notes.txt").string();
  write_density(density_file, circle_density(std::vector<double>(16, 1.0 / (2 * kPi))));
  write_run(run_file, 2, {points_at_angles({1.0})}, {0.3});
  write_run(run3_file, 3, {{0.0, 0.0, 1.0}}, {0.0});
  std::ofstream(text_file) << "not hdf5\n";

  Comparison c = compare(density_file, run_file);
  EXPECT_EQ(c.exit_code, kExitUsage);
  EXPECT_NE(c.log.find("no common frame"), std::string::npos) << c.log;
  EXPECT_NE(c.log.find(density_file), std::string::npos) << c.log;
  EXPECT_NE(c.log.find(run_file), std::string::npos) << c.log;
  EXPECT_TRUE(c.out.empty());

  c = compare(density_file, run3_file);
  EXPECT_EQ(c.exit_code, kExitUsage);
  EXPECT_NE(c.log.find("d = 2"), std::string::npos) << c.log;
  EXPECT_NE(c.log.find("d = 3"), std::string::npos) << c.log;

  c = compare(run_file, run_file);  // a particle run given as the density
  EXPECT_EQ(c.exit_code, kExitUsage);
  EXPECT_NE(c.log.find("not a density file"), std::string::npos) << c.log;

  c = compare(density_file, density_file);  // a density given as the run
  EXPECT_EQ(c.exit_code, kExitUsage) << c.log;

  c = compare(text_file, run_file);
  EXPECT_EQ(c.exit_code, kExitUsage);
  EXPECT_NE(c.log.find("not an mfattn"), std::string::npos) << c.log;

  c = compare((dir / "missing.h5").string(), run_file);
  EXPECT_EQ(c.exit_code, kExitUsage);
  EXPECT_NE(c.log.find("missing.h5"), std::string::npos) << c.log;
  std::filesystem::remove_all(dir);
}

}  // namespace
