// `mfattn meanfield --compare`: W1 between a particle run and a density file at their common
// frames (the metrics and their formulas: include/mfattn/app/meanfield_compare.hpp).
#include "mfattn/app/meanfield_compare.hpp"

#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <optional>
#include <sstream>
#include <ostream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "io/hdf5_support.hpp"
#include "io/json_text.hpp"
#include "io/path_lock.hpp"
#include "mfattn/app/run.hpp"
#include "mfattn/core/input_file.hpp"
#include "mfattn/core/number_text.hpp"
#include "mfattn/io/h5md.hpp"
#include "mfattn/io/series.hpp"

namespace mfattn {

namespace {

constexpr double kPi = std::numbers::pi;
constexpr std::size_t kSlicingDirections = 64;

/// The two files do not belong together (a usage error, exit 2).
struct FilesDoNotMatch : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---------------------------------------------------------------------------------------
// One-dimensional W1 through the difference of two CDFs.

/// Where G = F_particles - F_density is linear: its length and its values at both ends.
struct LinearPiece {
  double length = 0.0;
  double start = 0.0;
  double end = 0.0;
};

/// The pieces of G on [edges.front(), edges.back()] for atoms of mass atom_mass each (sorted)
/// against cells: cell k spreads cell_mass[k] uniformly over [edges[k], edges[k+1]). G has a
/// jump at every atom and the slope -cell_mass[k] / width within cell k, so the breakpoints
/// are the edges and the atoms.
std::vector<LinearPiece> cdf_difference(const std::vector<double>& edges, const std::vector<double>& cell_mass,
                                        const std::vector<double>& sorted_atoms, double atom_mass) {
  std::vector<LinearPiece> pieces;
  pieces.reserve(edges.size() + sorted_atoms.size());
  std::size_t atoms_passed = 0;
  double t = edges.front();
  while (atoms_passed < sorted_atoms.size() && sorted_atoms[atoms_passed] <= t) ++atoms_passed;
  double mass_before_cell = 0.0;
  for (std::size_t cell = 0; cell + 1 < edges.size(); ++cell) {
    const double left = edges[cell], right = edges[cell + 1];
    const double density = right > left ? cell_mass[cell] / (right - left) : 0.0;
    // F_density from the cell's own start, so that rounding does not drift along the cells.
    auto density_cdf = [&](double x) { return mass_before_cell + density * (x - left); };
    while (t < right) {
      const double next = atoms_passed < sorted_atoms.size() ? std::min(right, sorted_atoms[atoms_passed]) : right;
      const double particle_cdf = static_cast<double>(atoms_passed) * atom_mass;
      if (next > t) pieces.push_back({next - t, particle_cdf - density_cdf(t), particle_cdf - density_cdf(next)});
      t = next;
      while (atoms_passed < sorted_atoms.size() && sorted_atoms[atoms_passed] <= t) ++atoms_passed;
    }
    mass_before_cell += cell_mass[cell];
  }
  return pieces;
}

/// The Lebesgue measure of {G < c} (strict) or {G <= c} (inclusive) over the pieces. On a
/// piece with start != end the set {G = c} has measure 0, so both agree there.
double measure_below(const std::vector<LinearPiece>& pieces, double c, bool inclusive) {
  double measure = 0.0;
  for (const LinearPiece& piece : pieces) {
    const double low = std::min(piece.start, piece.end), high = std::max(piece.start, piece.end);
    if (low == high) {
      if (inclusive ? low <= c : low < c) measure += piece.length;
    } else if (c >= high) {
      measure += piece.length;
    } else if (c > low) {
      measure += piece.length * (c - low) / (high - low);
    }
  }
  return measure;
}

/// A median of G(t) under dt: a c with |{G < c}| <= half and |{G <= c}| >= half, half being
/// half the total length. Between two consecutive end values of the pieces, |{G < c}| is
/// linear in c, so a binary search over the sorted end values brackets c and a linear solve
/// finds it exactly.
double lebesgue_median(const std::vector<LinearPiece>& pieces) {
  std::vector<double> values;
  values.reserve(2 * pieces.size());
  double total = 0.0;
  for (const LinearPiece& piece : pieces) {
    values.push_back(piece.start);
    values.push_back(piece.end);
    total += piece.length;
  }
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  const double half = 0.5 * total;
  // The first value v_j with |{G <= v_j}| >= half (the last value has all of it).
  std::size_t low = 0, high = values.size() - 1;
  while (low < high) {
    const std::size_t middle = low + (high - low) / 2;
    if (measure_below(pieces, values[middle], true) >= half)
      high = middle;
    else
      low = middle + 1;
  }
  const double below_at = measure_below(pieces, values[low], false);
  if (below_at <= half || low == 0) return values[low];
  // |{G <= v_{j-1}}| < half < |{G < v_j}|: the crossing lies strictly between, where the
  // measure is linear (no end value in between).
  const double previous = values[low - 1];
  const double below_previous = measure_below(pieces, previous, true);
  return previous + (half - below_previous) * (values[low] - previous) / (below_at - below_previous);
}

/// int |G - c| over the pieces, exact for linear pieces.
double integral_of_distance(const std::vector<LinearPiece>& pieces, double c) {
  double integral = 0.0;
  for (const LinearPiece& piece : pieces) {
    const double a = piece.start - c, b = piece.end - c;
    if ((a >= 0.0) == (b >= 0.0) || a == 0.0 || b == 0.0)
      integral += 0.5 * piece.length * std::abs(a + b);
    else  // a sign change inside: two triangles
      integral += 0.5 * piece.length * (a * a + b * b) / (std::abs(a) + std::abs(b));
  }
  return integral;
}

/// Exact W1 on the line between two discrete measures (masses of the first positive, of the
/// second entered negative): int |F_1 - F_2| by a sweep over the sorted points.
double line_w1(std::vector<std::pair<double, double>>& signed_atoms) {
  std::sort(signed_atoms.begin(), signed_atoms.end(),
            [](const auto& x, const auto& y) { return x.first < y.first; });
  double difference = 0.0, integral = 0.0;
  for (std::size_t i = 0; i + 1 < signed_atoms.size(); ++i) {
    difference += signed_atoms[i].second;
    integral += std::abs(difference) * (signed_atoms[i + 1].first - signed_atoms[i].first);
  }
  return integral;
}

// ---------------------------------------------------------------------------------------
// The metrics.

/// The angles in [0, 2 pi).
double circle_w1(const std::vector<double>& cell_mass, std::vector<double> angles) {
  const std::size_t cells = cell_mass.size();
  const double width = 2.0 * kPi / static_cast<double>(cells);
  // Cell a covers [(a - 1/2) h, (a + 1/2) h): cut at 0, cell 0 is two halves, at both ends.
  std::vector<double> edges{0.0};
  std::vector<double> masses{0.5 * cell_mass[0]};
  for (std::size_t a = 0; a < cells; ++a) {
    edges.push_back((static_cast<double>(a) + 0.5) * width);
    masses.push_back(a + 1 < cells ? cell_mass[a + 1] : 0.5 * cell_mass[0]);
  }
  edges.push_back(2.0 * kPi);
  std::sort(angles.begin(), angles.end());
  const auto pieces = cdf_difference(edges, masses, angles, 1.0 / static_cast<double>(angles.size()));
  return integral_of_distance(pieces, lebesgue_median(pieces));
}

/// The polar angles in [0, pi].
double zonal_w1(const std::vector<double>& cell_mass, std::vector<double> polar_angles) {
  const std::size_t cells = cell_mass.size();
  std::vector<double> edges(cells + 1);
  for (std::size_t a = 0; a <= cells; ++a) edges[a] = kPi * static_cast<double>(a) / static_cast<double>(cells);
  std::sort(polar_angles.begin(), polar_angles.end());
  const auto pieces = cdf_difference(edges, cell_mass, polar_angles, 1.0 / static_cast<double>(polar_angles.size()));
  return integral_of_distance(pieces, 0.0);
}

/// The K = 64 directions of the header (a Fibonacci sphere), 3 numbers each.
std::vector<double> slicing_directions() {
  std::vector<double> directions;
  const double golden_angle = kPi * (3.0 - std::sqrt(5.0));
  const double count = static_cast<double>(kSlicingDirections);
  for (std::size_t k = 0; k < kSlicingDirections; ++k) {
    const double z = 1.0 - (2.0 * static_cast<double>(k) + 1.0) / count;
    const double r = std::sqrt(1.0 - z * z);
    const double azimuth = golden_angle * static_cast<double>(k);
    directions.insert(directions.end(), {r * std::cos(azimuth), r * std::sin(azimuth), z});
  }
  return directions;
}

/// points: particles (n rows of 3, mass 1/n each); grid_points (rows of 3) with grid_mass.
double sliced_w1(const std::vector<double>& grid_points, const std::vector<double>& grid_mass,
                 const std::vector<double>& points) {
  static const std::vector<double> directions = slicing_directions();
  const std::size_t n = points.size() / 3, grid_size = grid_mass.size();
  const double particle_mass = 1.0 / static_cast<double>(n);
  std::vector<std::pair<double, double>> atoms(n + grid_size);
  double sum = 0.0;
  for (std::size_t k = 0; k < kSlicingDirections; ++k) {
    const double* u = &directions[3 * k];
    auto project = [u](const double* x) { return x[0] * u[0] + x[1] * u[1] + x[2] * u[2]; };
    for (std::size_t i = 0; i < n; ++i) atoms[i] = {project(&points[3 * i]), particle_mass};
    for (std::size_t a = 0; a < grid_size; ++a) atoms[n + a] = {project(&grid_points[3 * a]), -grid_mass[a]};
    sum += line_w1(atoms);
  }
  return sum / static_cast<double>(kSlicingDirections);
}

// ---------------------------------------------------------------------------------------
// The density file.

enum class DensityKind { Circle, Zonal, Sphere };

const char* metric_name(DensityKind kind) {
  switch (kind) {
    case DensityKind::Circle: return "circle-w1";
    case DensityKind::Zonal: return "zonal-polar-w1";
    case DensityKind::Sphere: return "sliced-w1-64";
  }
  return "";
}

/// A density file of `mfattn meanfield`, read-only: its grid at once, its values frame by
/// frame (a fine sphere grid times many frames would not fit in memory at once). Layout
/// problems throw NotMfattnFile (exit 2), failed reads IoError (exit 4).
class DensityFile {
 public:
  explicit DensityFile(const std::string& path) : path_(path) {
    hdf5::QuietHdf5Errors quiet;
    try {
      check_input_file(path);
    } catch (const InputFileRefused& e) {
      throw NotMfattnFile("cannot read the density file " + path + ": " + e.what());
    }
    if (!is_mfattn_file(path)) foreign("is not an mfattn H5MD file");
    file_ = hdf5::open_read_only(path);
    if (!file_.valid()) fail("opening it failed");
    if (!exists("/fields/density/value"))
      foreign("is not a density file of mfattn meanfield (it has no /fields/density/value)");

    const auto value_dims = dims("/fields/density/value");
    std::vector<double> times = read_all("time");
    if (value_dims.size() < 2) foreign("/fields/density/value is not [T, grid shape...]");
    shape_.assign(value_dims.begin() + 1, value_dims.end());
    grid_size_ = 1;
    for (std::size_t extent : shape_) grid_size_ *= extent;
    if (grid_size_ == 0) foreign("/fields/density/value has an empty grid");
    frames_ = std::min<std::size_t>(value_dims[0], times.size());
    times.resize(frames_);
    times_ = std::move(times);

    const auto d = parameter_number("d");
    if (!d || !(*d >= 2.0) || *d != std::floor(*d)) foreign("has no integer /parameters d >= 2");
    d_ = static_cast<std::size_t>(*d);
    const bool zonal = parameter_number("zonal").value_or(0.0) != 0.0;
    theta_ = read_all("theta");
    weights_ = read_all("weights");
    if (weights_.size() != grid_size_) foreign("/fields/density/weights does not have the grid's shape");
    if (exists("/fields/density/phi")) {
      kind_ = DensityKind::Sphere;
      phi_ = read_all("phi");
      const bool labelled = exists("/fields/density/labels");
      if (d_ != 3 || shape_.size() != (labelled ? 3u : 2u) || shape_[shape_.size() - 2] != theta_.size() ||
          shape_.back() != phi_.size())
        foreign("is not an S^2 density file (d = 3, value [T, n_theta, n_phi] or with labels [T, M_xi, n_theta, "
                "n_phi], theta and phi of those lengths)");
    } else if (zonal) {
      kind_ = DensityKind::Zonal;
      if (shape_.size() != 1 || shape_[0] != theta_.size())
        foreign("is not a zonal density file (value [T, n_theta], theta of that length)");
      expect_grid(0.5, kPi, "the zonal cell centres (a + 1/2) pi / n_theta");
    } else {
      kind_ = DensityKind::Circle;
      const bool labelled = exists("/fields/density/labels");
      const std::size_t columns = shape_.back();
      if (d_ != 2 || shape_.size() != (labelled ? 2u : 1u) || columns != theta_.size())
        foreign("is not a circle density file (d = 2, value [T, M] or with labels [T, M_xi, M], theta of length M)");
      expect_grid(0.0, 2.0 * kPi, "the circle's cell centres 2 pi a / M");
    }
  }

  const std::string& path() const { return path_; }
  DensityKind kind() const { return kind_; }
  std::size_t d() const { return d_; }
  const std::vector<double>& times() const { return times_; }
  const std::vector<double>& theta() const { return theta_; }
  const std::vector<double>& phi() const { return phi_; }

  /// The masses weights * value of one frame, per cell (circle: the theta-marginal, the mean
  /// of the label rows; sphere: row-major [n_theta, n_phi], with labels also the mean of the
  /// label rows), divided by their sum; empty when the sum is not a positive finite number.
  std::vector<double> cell_masses(std::size_t frame) const {
    const std::vector<double> values = read_frame(frame);
    const std::size_t columns = kind_ == DensityKind::Circle   ? shape_.back()
                                : kind_ == DensityKind::Sphere ? theta_.size() * phi_.size()
                                                               : grid_size_;
    std::vector<double> mass(columns, 0.0);
    for (std::size_t i = 0; i < grid_size_; ++i) mass[i % columns] += weights_[i] * values[i];
    double total = 0.0;
    for (double m : mass) total += m;
    if (!(total > 0.0) || !std::isfinite(total)) return {};
    // Dividing by the total also takes the mean over label rows (each row has mass 1).
    for (double& m : mass) m /= total;
    return mass;
  }

 private:
  [[noreturn]] void foreign(const std::string& problem) const {
    throw NotMfattnFile("the density file " + path_ + " " + problem);
  }
  [[noreturn]] void fail(const std::string& what) const {
    const std::string reason = hdf5::innermost_hdf5_error();
    throw IoError("the density file " + path_ + ": " + what + (reason.empty() ? "" : " (" + reason + ")"));
  }
  bool exists(const std::string& name) const {
    // Each link of the path in turn: H5Lexists fails on a path through a missing group.
    std::size_t slash = 0;
    while ((slash = name.find('/', slash + 1)) != std::string::npos)
      if (H5Lexists(file_.get(), name.substr(0, slash).c_str(), H5P_DEFAULT) <= 0) return false;
    return H5Lexists(file_.get(), name.c_str(), H5P_DEFAULT) > 0;
  }
  hdf5::Handle open_dataset(const std::string& name) const {
    if (!exists(name)) foreign("has no " + name);
    hdf5::Handle set = hdf5::open_dataset(file_.get(), name);
    if (!set.valid()) fail("opening " + name + " failed");
    hdf5::Handle type(H5Dget_type(set.get()), H5Tclose);
    if (!type.valid() || H5Tget_class(type.get()) != H5T_FLOAT) foreign(name + " is not a floating-point dataset");
    return set;
  }
  std::vector<std::size_t> dims(const std::string& name) const {
    const hdf5::Handle set = open_dataset(name);
    hdf5::Handle space(H5Dget_space(set.get()), H5Sclose);
    const int rank = space.valid() ? H5Sget_simple_extent_ndims(space.get()) : -1;
    if (rank < 0) fail("reading the shape of " + name + " failed");
    std::vector<hsize_t> extents(static_cast<std::size_t>(rank));
    if (rank > 0 && H5Sget_simple_extent_dims(space.get(), extents.data(), nullptr) < 0)
      fail("reading the shape of " + name + " failed");
    return {extents.begin(), extents.end()};
  }
  /// Every number of /fields/density/<name>, whatever its shape.
  std::vector<double> read_all(const std::string& name) const {
    const std::string full = "/fields/density/" + name;
    const hdf5::Handle set = open_dataset(full);
    hdf5::Handle space(H5Dget_space(set.get()), H5Sclose);
    const hssize_t count = space.valid() ? H5Sget_simple_extent_npoints(space.get()) : -1;
    if (count < 0) fail("reading the shape of " + full + " failed");
    std::vector<double> values(static_cast<std::size_t>(count));
    if (count > 0 && H5Dread(set.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0)
      fail("reading " + full + " failed");
    return values;
  }
  /// Row `frame` of /fields/density/value.
  std::vector<double> read_frame(std::size_t frame) const {
    hdf5::QuietHdf5Errors quiet;
    const hdf5::Handle set = open_dataset("/fields/density/value");
    hdf5::Handle space(H5Dget_space(set.get()), H5Sclose);
    std::vector<hsize_t> start(shape_.size() + 1, 0), count(shape_.size() + 1, 1);
    start[0] = frame;
    std::copy(shape_.begin(), shape_.end(), count.begin() + 1);
    const hsize_t row_size = grid_size_;
    hdf5::Handle memory(H5Screate_simple(1, &row_size, nullptr), H5Sclose);
    std::vector<double> values(grid_size_);
    if (!space.valid() || !memory.valid() ||
        H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) < 0 ||
        H5Dread(set.get(), H5T_NATIVE_DOUBLE, memory.get(), space.get(), H5P_DEFAULT, values.data()) < 0)
      fail("reading frame " + std::to_string(frame) + " of /fields/density/value failed");
    return values;
  }
  std::optional<double> parameter_number(const std::string& name) const {
    if (!exists("/parameters")) return std::nullopt;
    hdf5::Handle group(H5Gopen2(file_.get(), "/parameters", H5P_DEFAULT), H5Gclose);
    if (!group.valid() || H5Aexists(group.get(), name.c_str()) <= 0) return std::nullopt;
    hdf5::Handle attribute(H5Aopen(group.get(), name.c_str(), H5P_DEFAULT), H5Aclose);
    hdf5::Handle type(attribute.valid() ? H5Aget_type(attribute.get()) : H5I_INVALID_HID, H5Tclose);
    hdf5::Handle space(attribute.valid() ? H5Aget_space(attribute.get()) : H5I_INVALID_HID, H5Sclose);
    if (!type.valid() || !space.valid()) fail("reading /parameters " + name + " failed");
    const H5T_class_t type_class = H5Tget_class(type.get());
    if ((type_class != H5T_INTEGER && type_class != H5T_FLOAT) || H5Sget_simple_extent_npoints(space.get()) != 1)
      foreign("/parameters " + name + " is not a number");
    double value = 0.0;
    if (H5Aread(attribute.get(), H5T_NATIVE_DOUBLE, &value) < 0) fail("reading /parameters " + name + " failed");
    return value;
  }
  /// theta_a = (a + offset) span / theta.size(): the grid the metrics' cells assume.
  void expect_grid(double offset, double span, const std::string& description) const {
    const double count = static_cast<double>(theta_.size());
    for (std::size_t a = 0; a < theta_.size(); ++a)
      if (!(std::abs(theta_[a] - (static_cast<double>(a) + offset) * span / count) <= 1e-9))
        foreign("/fields/density/theta is not " + description);
  }

  std::string path_;
  hdf5::Handle file_;
  DensityKind kind_ = DensityKind::Circle;
  std::size_t d_ = 0, frames_ = 0, grid_size_ = 0;
  std::vector<std::size_t> shape_;
  std::vector<double> times_, theta_, phi_, weights_;
};

/// The grid points of an S^2 density file, row-major [n_theta, n_phi], 3 numbers each.
std::vector<double> sphere_points(const DensityFile& density) {
  std::vector<double> points;
  points.reserve(3 * density.theta().size() * density.phi().size());
  for (double theta : density.theta())
    for (double phi : density.phi())
      points.insert(points.end(), {std::sin(theta) * std::cos(phi), std::sin(theta) * std::sin(phi), std::cos(theta)});
  return points;
}

// ---------------------------------------------------------------------------------------
// The particles.

/// The tokens that make the empirical measure: presence > 0 (every token when the file
/// records no presence).
std::vector<bool> measured_tokens(const SeriesFile& run) {
  std::vector<bool> measured(run.n(), true);
  const std::vector<double> presence = run.presence(0);
  if (presence.size() == run.n())
    for (std::size_t i = 0; i < run.n(); ++i) measured[i] = presence[i] > 0.0;
  return measured;
}

/// What the metric of `kind` reads of each measured token of one row: its angle in [0, 2 pi)
/// (circle), its polar angle from e_1 in [0, pi] (zonal), or its unit vector (sphere).
std::vector<double> particle_coordinates(DensityKind kind, const std::vector<double>& x, std::size_t d,
                                         const std::vector<bool>& measured) {
  std::vector<double> coordinates;
  for (std::size_t i = 0; i < measured.size(); ++i) {
    if (!measured[i]) continue;
    const double* row = &x[i * d];
    double norm = 0.0;
    for (std::size_t k = 0; k < d; ++k) norm += row[k] * row[k];
    norm = std::sqrt(norm);
    switch (kind) {
      case DensityKind::Circle: {
        double angle = std::atan2(row[1], row[0]);
        if (angle < 0.0) angle += 2.0 * kPi;
        if (angle >= 2.0 * kPi) angle = 0.0;  // -tiny + 2 pi rounds to 2 pi
        coordinates.push_back(angle);
        break;
      }
      case DensityKind::Zonal:
        coordinates.push_back(std::acos(std::clamp(row[0] / norm, -1.0, 1.0)));
        break;
      case DensityKind::Sphere:
        coordinates.insert(coordinates.end(), {row[0] / norm, row[1] / norm, row[2] / norm});
        break;
    }
  }
  return coordinates;
}

struct CommonFrame {
  std::size_t density_frame = 0, run_row = 0;
  double time = 0.0;
};

/// Density frames and run rows whose times agree within 1e-9 max(1, |t|) (both increasing).
std::vector<CommonFrame> common_frames(const std::vector<double>& density_times, const std::vector<double>& run_times) {
  std::vector<CommonFrame> common;
  std::size_t row = 0;
  for (std::size_t frame = 0; frame < density_times.size(); ++frame) {
    const double t = density_times[frame], tolerance = 1e-9 * std::max(1.0, std::abs(t));
    while (row < run_times.size() && run_times[row] < t - tolerance) ++row;
    if (row < run_times.size() && std::abs(run_times[row] - t) <= tolerance) common.push_back({frame, row, t});
  }
  return common;
}

}  // namespace

int compare_density_with_run(const std::string& density_file, const std::string& run_file,
                             bool json, std::ostream& out, std::ostream& log,
                             const std::string& who, const std::string& stored) {
  const std::string prefix = who + ": ";
  DensityKind kind = DensityKind::Circle;
  std::vector<std::pair<double, double>> results;  // (time, W1)
  try {
    const DensityFile density(density_file);
    kind = density.kind();
    const SeriesFile run(run_file);
    if (run.d() != density.d())
      throw FilesDoNotMatch("the density file " + density_file + " has d = " + std::to_string(density.d()) +
                            " but the run " + run_file + " has d = " + std::to_string(run.d()));
    const std::vector<CommonFrame> common = common_frames(density.times(), run.position_times());
    if (common.empty())
      throw FilesDoNotMatch("the density file " + density_file + " and the run " + run_file +
                            " have no common frame (times equal within 1e-9 max(1, |t|); the run keeps positions at " +
                            std::to_string(run.position_frames()) + " frames, --save-positions " +
                            run.save_positions() + ")");
    const std::vector<bool> measured = measured_tokens(run);
    if (std::find(measured.begin(), measured.end(), true) == measured.end())
      throw FilesDoNotMatch("the run " + run_file + " has no token of presence > 0");
    const std::vector<double> grid_points = kind == DensityKind::Sphere ? sphere_points(density) : std::vector<double>{};
    for (const CommonFrame& frame : common) {
      const std::vector<double> mass = density.cell_masses(frame.density_frame);
      double w1 = std::numeric_limits<double>::quiet_NaN();
      if (mass.empty()) {
        log << prefix << "the density of " << density_file
            << " at t = " << format_number(frame.time)
            << " has no positive finite mass; its W1 is not defined\n";
      } else {
        const auto coordinates = particle_coordinates(kind, run.positions(frame.run_row, 0), run.d(), measured);
        switch (kind) {
          case DensityKind::Circle: w1 = circle_w1(mass, coordinates); break;
          case DensityKind::Zonal: w1 = zonal_w1(mass, coordinates); break;
          case DensityKind::Sphere: w1 = sliced_w1(grid_points, mass, coordinates); break;
        }
      }
      results.emplace_back(frame.time, w1);
    }
  } catch (const FilesDoNotMatch& e) {
    log << prefix << e.what() << '\n';
    return kExitUsage;
  } catch (const NotMfattnFile& e) {
    log << prefix << e.what() << '\n';
    return kExitUsage;
  } catch (const IoError& e) {
    log << prefix << e.what() << '\n';
    return kExitIo;
  }
  const char* metric = metric_name(kind);
  std::ostringstream object;
  object << "{\"metric\": " << json::quoted(metric) << ", \"replica\": 0, \"frames\": [";
  for (std::size_t i = 0; i < results.size(); ++i)
    object << (i ? ", " : "") << "{\"time\": " << json::number(results[i].first)
           << ", \"w1\": " << json::number(results[i].second) << '}';
  object << "]}\n";
  if (!stored.empty()) {
    try {
      write_text_atomically(stored, object.str());
    } catch (const IoError& e) {
      log << prefix << e.what() << '\n';
      return kExitIo;
    }
  }
  if (json) {
    out << object.str();
  } else {
    for (const auto& [time, w1] : results)
      out << "t = " << format_number(time) << "  W1 = " << format_number(w1, NanSign::Dropped) << "  (" << metric
          << ", replica 0)\n";
  }
  return kExitOk;
}

std::string compare_usage() {
  return "usage: mfattn compare PARTICLES.h5 DENSITY.h5 [--json] [--out FILE.json]\n"
         "  W1 between replica 0 of a particle run (null tokens left out) and a density file of\n"
         "  mfattn meanfield at every frame they share (times within 1e-9 max(1, t)): exact on the\n"
         "  circle and for zonal densities, sliced over 64 directions on S^2 (docs/meanfield.md)\n"
         "  --json          one JSON object {\"metric\", \"replica\", \"frames\": [{\"time\", \"w1\"}]}\n"
         "  --out FILE.json that object also written to FILE, whole or not at all\n"
         "  Exit codes: 0, 2 files that do not belong together or bad options, 4 I/O.\n";
}

int compare_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::vector<std::string> files;
  bool json = false;
  std::string stored;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--json") {
      json = true;
    } else if (args[i] == "--out") {
      if (i + 1 >= args.size() || args[i + 1].empty()) {
        err << "mfattn compare: --out: needs a file name (FILE.json)\n";
        return kExitUsage;
      }
      stored = args[++i];
    } else if (args[i].rfind("--", 0) == 0) {
      err << "mfattn compare: " << args[i]
          << ": no such option (accepted: --json, --out FILE.json)\n";
      return kExitUsage;
    } else {
      files.push_back(args[i]);
    }
  }
  if (files.size() != 2) {
    err << "mfattn compare: needs two files, PARTICLES.h5 DENSITY.h5 (got " << files.size()
        << ")\n";
    return kExitUsage;
  }
  return compare_density_with_run(files[1], files[0], json, out, err, "mfattn compare", stored);
}

}  // namespace mfattn
