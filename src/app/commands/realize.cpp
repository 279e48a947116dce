// `mfattn realize` (include/mfattn/app/realize.hpp, docs/realization.md): a target law, the
// positions (or gauges) that realize it, one ordinary `mfattn run`, and the distance between
// the realized marginal and the target beside the target's own sampling noise.
#include "mfattn/app/realize.hpp"

#include <stdlib.h>

#include <boost/program_options.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <numbers>
#include <ostream>
#include <sstream>

#include "app/scratch_files.hpp"
#include "io/json_text.hpp"
#include "mfattn/app/config.hpp"
#include "mfattn/core/gauge.hpp"
#include "mfattn/io/h5md.hpp"
#include "mfattn/core/init.hpp"
#include "mfattn/core/input_file.hpp"
#include "mfattn/core/number_text.hpp"
#include "mfattn/core/rng.hpp"
#include "mfattn/app/run.hpp"

namespace mfattn {

constexpr double kTwoPi = 2.0 * std::numbers::pi;

namespace {

double wrap_angle(double angle) {
  const double wrapped = std::fmod(angle, kTwoPi);
  return wrapped < 0.0 ? wrapped + kTwoPi : wrapped;
}

}  // namespace

double circle_w1(const std::vector<double>& a, const std::vector<double>& b) {
  // Breakpoints of F_a - F_b on [0, 2 pi): the sorted angles of both, with +1/|a| and -1/|b|.
  std::vector<std::pair<double, double>> steps;
  steps.reserve(a.size() + b.size());
  for (double t : a) steps.emplace_back(wrap_angle(t), 1.0 / double(a.size()));
  for (double t : b) steps.emplace_back(wrap_angle(t), -1.0 / double(b.size()));
  std::sort(steps.begin(), steps.end());
  // D on each interval [t_k, t_{k+1}) (and [0, t_0) with D = 0, joined with the last).
  std::vector<std::pair<double, double>> pieces;  // (D, length)
  double level = 0.0, previous = 0.0;
  for (const auto& [t, jump] : steps) {
    pieces.emplace_back(level, t - previous);
    level += jump;
    previous = t;
  }
  pieces.emplace_back(level, kTwoPi - previous);
  // min_c sum |D - c| length: c is the length-weighted median of D.
  std::vector<std::pair<double, double>> sorted = pieces;
  std::sort(sorted.begin(), sorted.end());
  double half = 0.0, median = 0.0;
  for (const auto& piece : sorted) half += piece.second;
  half /= 2.0;
  for (const auto& [value, length] : sorted) {
    half -= length;
    median = value;
    if (half <= 0.0) break;
  }
  double total = 0.0;
  for (const auto& [value, length] : pieces) total += std::fabs(value - median) * length;
  return total;
}

double circle_w1_over_rotations(const std::vector<double>& a, const std::vector<double>& b,
                                double* best_rotation) {
  auto at = [&](double alpha) {
    std::vector<double> rotated(b);
    for (double& t : rotated) t += alpha;
    return circle_w1(a, rotated);
  };
  constexpr int kGrid = 2048;
  double best = at(0.0), best_alpha = 0.0;
  for (int k = 1; k < kGrid; ++k) {
    const double alpha = kTwoPi * k / kGrid, value = at(alpha);
    if (value < best) best = value, best_alpha = alpha;
  }
  // Golden-section search within one grid cell on either side.
  double lo = best_alpha - kTwoPi / kGrid, hi = best_alpha + kTwoPi / kGrid;
  const double ratio = (std::sqrt(5.0) - 1.0) / 2.0;
  for (int iteration = 0; iteration < 40; ++iteration) {
    const double left = hi - ratio * (hi - lo), right = lo + ratio * (hi - lo);
    if (at(left) < at(right)) hi = right;
    else lo = left;
  }
  const double refined = 0.5 * (lo + hi), value = at(refined);
  if (value < best) best = value, best_alpha = refined;
  if (best_rotation) *best_rotation = wrap_angle(best_alpha);
  return best;
}

double energy_distance(const std::vector<double>& a, const std::vector<double>& b, std::size_t dim) {
  const std::size_t na = a.size() / dim, nb = b.size() / dim;
  auto mean_distance = [dim](const std::vector<double>& p, std::size_t np, const std::vector<double>& q,
                             std::size_t nq) {
    double sum = 0.0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
    for (std::size_t i = 0; i < np; ++i)
      for (std::size_t j = 0; j < nq; ++j) {
        double d2 = 0.0;
        for (std::size_t c = 0; c < dim; ++c) {
          const double e = p[i * dim + c] - q[j * dim + c];
          d2 += e * e;
        }
        sum += std::sqrt(d2);
      }
    return sum / (double(np) * double(nq));
  };
  const double squared = 2.0 * mean_distance(a, na, b, nb) - mean_distance(a, na, a, na) - mean_distance(b, nb, b, nb);
  return std::sqrt(std::max(squared, 0.0));
}

namespace {

enum class Mechanism { Rope, RopeMixed, PrefixGauge };
enum class Space { Circle, Torus, Sphere };
/// The named target laws (docs/realization.md); a --target naming none is a file of samples.
enum class TargetKind { VmfMixture, Band, Cap, Uniform };
/// What a contrast run changes: nothing, the gauge for a distance bias, or plain values.
enum class Contrast { None, DistanceBias, PlainValues };

// The choice options of realize, each one table that parsing, messages and the code read.
constexpr Choice<Mechanism> kMechanismChoices[] = {
    {"rope", Mechanism::Rope}, {"rope-mixed", Mechanism::RopeMixed}, {"prefix-gauge", Mechanism::PrefixGauge}};
constexpr ChoiceOption<Mechanism> kMechanismOption{.option = "mechanism", .choices = kMechanismChoices};
constexpr Choice<TargetKind> kTargetChoices[] = {{"vmf-mixture", TargetKind::VmfMixture},
                                                 {"band", TargetKind::Band},
                                                 {"cap", TargetKind::Cap},
                                                 {"uniform", TargetKind::Uniform}};
constexpr ChoiceOption<TargetKind> kTargetOption{.option = "target", .choices = kTargetChoices, .file_help = "FILE"};
constexpr Choice<Contrast> kContrastChoices[] = {
    {"none", Contrast::None}, {"distance-bias", Contrast::DistanceBias}, {"plain-values", Contrast::PlainValues}};
constexpr ChoiceOption<Contrast> kContrastOption{.option = "contrast", .choices = kContrastChoices};

/// The largest --beta accepted (see parse_options).
constexpr double kMaxRealizeBeta = 3.0;
/// The largest max |x_i - G_i^T u| of a realization: below the sampling noise (about
/// n^(-1/2) >= 1e-3 for n <= 10^6) of every distance realize reports. A converged run is at
/// rounding level (1e-14); values split into clusters, or far from collapsed, are at 0.1 to 2.
constexpr double kRealizedDeviation = 1e-3;

struct Options {
  std::string target, mechanism_name, out, contrast = "none";
  Mechanism mechanism = Mechanism::Rope;
  std::optional<TargetKind> target_kind;  ///< none: --target names a file of samples
  Contrast contrast_kind = Contrast::None;
  std::int64_t n = 256, d = 0, seed = 0, threads = 0;
  double horizon = 30.0, beta = 1.0, dt = 0.1;
  bool pin = true, json = false, overwrite = false;
};

Space space_of(Mechanism mechanism) {
  return mechanism == Mechanism::Rope ? Space::Circle : mechanism == Mechanism::RopeMixed ? Space::Torus : Space::Sphere;
}
std::size_t columns_of(Space space, std::size_t d) {
  return space == Space::Circle ? 1 : space == Space::Torus ? 2 : d;
}

[[noreturn]] void reject(const std::string& option, const std::string& value, const std::string& accepted) {
  throw UsageError("--" + option + " " + value + ": " + accepted);
}

double number_option(const std::string& option, const std::string& text) {
  std::size_t used = 0;
  double value = 0.0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !std::isfinite(value)) reject(option, text, "not a finite number");
  return value;
}

std::int64_t integer_option(const std::string& option, const std::string& text, std::int64_t least) {
  const double value = number_option(option, text);
  if (value != std::floor(value) || value < double(least) || value > 1e9)
    reject(option, text, "must be an integer from " + std::to_string(least) + " to 1e9");
  return std::int64_t(value);
}

Options parse_options(const std::vector<std::string>& args) {
  namespace po = boost::program_options;
  Options o;
  // Numbers as given, read below with each one's rule (an integer may be written 256.0).
  std::string n, d, seed, threads, horizon, beta, dt;
  bool no_pin = false;
  po::options_description table("mfattn realize");
  const std::string integer = "an integer from 2 to 1e9";
  table.add_options()("target", po::value(&o.target), "a named law or a FILE of samples")(
      "mechanism", po::value(&o.mechanism_name), kMechanismOption.accepted().c_str())(
      "n", po::value(&n), integer.c_str())("d", po::value(&d), integer.c_str())(
      "horizon", po::value(&horizon), "a number > 0")("seed", po::value(&seed), "an integer from 0 to 1e9")(
      "out", po::value(&o.out), "the run's H5MD file")("beta", po::value(&beta), "a number in (0, 3]")(
      "dt", po::value(&dt), "a number > 0, at most --horizon")("threads", po::value(&threads), "an integer from 1 to 1e9")(
      "contrast", po::value(&o.contrast), kContrastOption.accepted().c_str())(
      "no-pin", po::bool_switch(&no_pin), "leave u free")("json", po::bool_switch(&o.json), "one JSON object")(
      "overwrite", po::bool_switch(&o.overwrite), "replace --out");
  po::variables_map vm;
  const std::vector<std::string> operands = parse_command_options(args, table, vm);
  if (!operands.empty()) throw UsageError("unexpected word '" + operands.front() + "' (realize takes options only)");
  o.pin = !no_pin;
  if (vm.count("n")) o.n = integer_option("n", n, 2);
  if (vm.count("d")) o.d = integer_option("d", d, 2);
  if (vm.count("seed")) o.seed = integer_option("seed", seed, 0);
  if (vm.count("threads")) o.threads = integer_option("threads", threads, 1);
  if (vm.count("horizon")) o.horizon = number_option("horizon", horizon);
  if (vm.count("beta")) o.beta = number_option("beta", beta);
  if (vm.count("dt")) o.dt = number_option("dt", dt);
  if (o.mechanism_name.empty()) throw UsageError("--mechanism: required (" + kMechanismOption.accepted() + ")");
  const Choice<Mechanism>* mechanism = kMechanismOption.find(o.mechanism_name);
  if (!mechanism) reject("mechanism", o.mechanism_name, kMechanismOption.accepted());
  o.mechanism = mechanism->value;
  const std::int64_t natural_d = o.mechanism == Mechanism::Rope ? 3 : o.mechanism == Mechanism::RopeMixed ? 4 : 3;
  if (o.d == 0) o.d = natural_d;
  if (o.mechanism == Mechanism::Rope && o.d != 3)
    reject("d", std::to_string(o.d), "--mechanism rope realizes laws on the latitude circles of d = 3 (accepted: 3)");
  if (o.mechanism == Mechanism::RopeMixed && o.d != 4)
    reject("d", std::to_string(o.d), "--mechanism rope-mixed realizes laws on the torus orbits of d = 4 (accepted: 4)");
  if (o.mechanism == Mechanism::PrefixGauge && o.d > 16)
    reject("d", std::to_string(o.d), "--mechanism prefix-gauge takes d from 2 to 16");
  const std::string targets = "accepted: " + kTargetOption.names(", ") + ", or a FILE of samples";
  if (o.target.empty()) throw UsageError("--target: required (" + targets + ")");
  o.target_kind = kTargetOption.preset(o.target);
  if (!o.target_kind) require_input_file("target", o.target, targets);
  if (o.out.empty()) throw UsageError("--out: required (the run's H5MD file)");
  if (!(o.horizon > 0.0)) reject("horizon", format_number(o.horizon), "must be > 0");
  if (!(o.dt > 0.0) || o.dt > o.horizon) reject("dt", format_number(o.dt), "must be > 0 and at most --horizon");
  // Beyond beta = 3 the transported values split into metastable clusters instead of
  // collapsing to one u within any practical horizon (and natural time's steps overflow):
  // measured at the defaults for every mechanism (docs/realization.md).
  if (!(o.beta > 0.0) || o.beta > kMaxRealizeBeta)
    reject("beta", format_number(o.beta),
           "must be in (0, " + format_number(kMaxRealizeBeta) +
               "]: beyond it the values do not collapse to one u within a practical --horizon");
  const Choice<Contrast>* contrast = kContrastOption.find(o.contrast);
  if (!contrast) reject("contrast", o.contrast, kContrastOption.accepted());
  o.contrast_kind = contrast->value;
  if (!o.pin && o.mechanism != Mechanism::PrefixGauge)
    throw UsageError("--no-pin: only with --mechanism prefix-gauge (the prefix token pins u there)");
  return o;
}

/// Draws from a target law in the coordinates of its space: an angle (circle), two angles
/// (torus) or a unit vector of R^d (sphere). The named laws are docs/realization.md's.
class TargetLaw {
 public:
  /// kind: the named law, or none for the file name names.
  TargetLaw(std::optional<TargetKind> kind, const std::string& name, Space space, std::size_t d)
      : kind_(kind.value_or(TargetKind::Uniform)), space_(space), d_(d) {
    if (kind) return;
    std::istringstream file(read_small_text_file("target", name, kMaxNumbersFileBytes));
    std::string line;
    const std::size_t columns = columns_of(space, d);
    std::size_t line_number = 0;
    std::vector<double> row;
    while (std::getline(file, line)) {
      ++line_number;
      const std::string where = "line " + std::to_string(line_number) + ": ";
      // The run's own number rule: a word, nan or inf is refused, never dropped.
      if (const std::string error = parse_number_line(line, row); !error.empty()) reject("target", name, where + error);
      if (row.empty()) continue;
      if (row.size() != columns)
        reject("target", name, where + "each line must hold " + std::to_string(columns) + " finite numbers (" +
                                   (space == Space::Sphere ? "a point of R^d, normalised here" : "angles in radians") +
                                   "), found " + std::to_string(row.size()));
      if (space == Space::Sphere) {
        const double norm = row_norm(row.data(), row.size());
        if (norm == 0.0) reject("target", name, where + "a zero row is no point of the sphere");
        for (double& v : row) v /= norm;
      }
      rows_.insert(rows_.end(), row.begin(), row.end());
    }
    if (rows_.empty()) reject("target", name, "the file holds no samples");
  }

  std::vector<double> sample(std::size_t count, RandomStream& stream) const {
    std::vector<double> out;
    const std::size_t columns = columns_of(space_, d_);
    for (std::size_t k = 0; k < count; ++k) {
      if (!rows_.empty()) {
        const std::size_t row = std::min(rows_.size() / columns - 1, std::size_t(stream.uniform() * double(rows_.size() / columns)));
        out.insert(out.end(), rows_.begin() + std::ptrdiff_t(row * columns), rows_.begin() + std::ptrdiff_t((row + 1) * columns));
        continue;
      }
      const std::vector<double> draw = space_ == Space::Sphere ? sphere(stream) : space_ == Space::Torus ? torus(stream) : std::vector<double>{circle(stream)};
      out.insert(out.end(), draw.begin(), draw.end());
    }
    return out;
  }

 private:
  /// A component of the von Mises mixtures: weights 0.5, 0.3, 0.2.
  static int component(RandomStream& stream) {
    const double u = stream.uniform();
    return u < 0.5 ? 0 : u < 0.8 ? 1 : 2;
  }
  /// Von Mises on the circle (Best and Fisher 1979).
  static double von_mises(double mean, double kappa, RandomStream& stream) {
    const double tau = 1.0 + std::sqrt(1.0 + 4.0 * kappa * kappa);
    const double rho = (tau - std::sqrt(2.0 * tau)) / (2.0 * kappa), r = (1.0 + rho * rho) / (2.0 * rho);
    for (;;) {
      const double z = std::cos(std::numbers::pi * stream.uniform());
      const double f = (1.0 + r * z) / (r + z), c = kappa * (r - f), u2 = stream.uniform();
      if (c * (2.0 - c) - u2 > 0.0 || std::log(c / u2) + 1.0 - c >= 0.0) {
        const double angle = std::acos(std::clamp(f, -1.0, 1.0));
        return wrap_angle(mean + (stream.uniform() < 0.5 ? -angle : angle));
      }
    }
  }
  double circle(RandomStream& stream) const {
    if (kind_ == TargetKind::Uniform) return kTwoPi * stream.uniform();
    if (kind_ == TargetKind::Band) return wrap_angle(std::numbers::pi / 2.0 * (stream.uniform() - 0.5));  // an arc of pi/2
    if (kind_ == TargetKind::Cap)  // the circle without the arc (-pi/3, pi/3): a law with a hole
      return wrap_angle(std::numbers::pi / 3.0 + (kTwoPi - 2.0 * std::numbers::pi / 3.0) * stream.uniform());
    constexpr double means[] = {0.0, 2.2, 4.1}, kappas[] = {12.0, 6.0, 25.0};
    const int c = component(stream);
    return von_mises(means[c], kappas[c], stream);
  }
  std::vector<double> torus(RandomStream& stream) const {
    if (kind_ == TargetKind::Uniform) return {kTwoPi * stream.uniform(), kTwoPi * stream.uniform()};
    if (kind_ == TargetKind::Band) return {wrap_angle(std::numbers::pi / 2.0 * (stream.uniform() - 0.5)), kTwoPi * stream.uniform()};
    if (kind_ == TargetKind::Cap)
      for (;;) {  // the torus without the disc of radius 1.2 around (0, 0)
        const double a = kTwoPi * stream.uniform(), b = kTwoPi * stream.uniform();
        const double da = std::min(a, kTwoPi - a), db = std::min(b, kTwoPi - b);
        if (da * da + db * db >= 1.44) return {a, b};
      }
    constexpr double means[3][2] = {{0.0, 0.0}, {2.2, 4.0}, {4.1, 1.5}}, kappas[] = {12.0, 6.0, 25.0};
    const int c = component(stream);
    return {von_mises(means[c][0], kappas[c], stream), von_mises(means[c][1], kappas[c], stream)};
  }
  std::vector<double> uniform_sphere(RandomStream& stream) const {
    std::vector<double> x(d_);
    double norm = 0.0;
    do {
      norm = 0.0;
      for (double& v : x) {
        v = stream.normal();
        norm += v * v;
      }
    } while (norm == 0.0);
    for (double& v : x) v /= std::sqrt(norm);
    return x;
  }
  std::vector<double> sphere(RandomStream& stream) const {
    const std::size_t d = d_, last = d - 1;
    if (kind_ == TargetKind::Uniform) return uniform_sphere(stream);
    if (kind_ == TargetKind::Band)  // the latitude band |x_{d-1}| <= 0.3
      for (;;) {
        auto x = uniform_sphere(stream);
        if (std::fabs(x[last]) <= 0.3) return x;
      }
    if (kind_ == TargetKind::Cap)  // no mass within 60 degrees of the pole e_{d-1}: a law with a hole
      for (;;) {
        auto x = uniform_sphere(stream);
        if (x[last] <= 0.5) return x;
      }
    // von Mises-Fisher mixture (Wood 1994): means e_{d-1}, e_0, (e_1 - e_{d-1}) / sqrt 2
    // ((e_0 - e_1) / sqrt 2 in d = 2).
    const int c = component(stream);
    constexpr double kappas[] = {20.0, 10.0, 40.0};
    std::vector<double> mean(d, 0.0);
    if (c == 0) mean[last] = 1.0;
    else if (c == 1) mean[0] = 1.0;
    else if (d == 2) mean[0] = std::sqrt(0.5), mean[1] = -std::sqrt(0.5);
    else mean[1] = std::sqrt(0.5), mean[last] = -std::sqrt(0.5);
    const double kappa = kappas[c], m = double(d - 1);
    const double b = (-2.0 * kappa + std::sqrt(4.0 * kappa * kappa + m * m)) / m;
    const double x0 = (1.0 - b) / (1.0 + b), cc = kappa * x0 + m * std::log(1.0 - x0 * x0);
    double w = 0.0;
    for (;;) {
      double s1 = 0.0, s2 = 0.0;  // Beta(m/2, m/2) as a ratio of chi-squares
      for (std::size_t k = 0; k < d - 1; ++k) {
        const double g1 = stream.normal(), g2 = stream.normal();
        s1 += g1 * g1;
        s2 += g2 * g2;
      }
      const double z = s1 / (s1 + s2);
      w = (1.0 - (1.0 + b) * z) / (1.0 - (1.0 - b) * z);
      if (kappa * w + m * std::log(1.0 - x0 * w) - cc >= std::log(stream.uniform())) break;
    }
    // w along the mean, the rest along a uniform direction orthogonal to it.
    std::vector<double> v = uniform_sphere(stream);
    double along = 0.0;
    for (std::size_t k = 0; k < d; ++k) along += v[k] * mean[k];
    double norm = 0.0;
    for (std::size_t k = 0; k < d; ++k) {
      v[k] -= along * mean[k];
      norm += v[k] * v[k];
    }
    norm = std::sqrt(norm);
    std::vector<double> x(d);
    for (std::size_t k = 0; k < d; ++k) x[k] = w * mean[k] + std::sqrt(std::max(0.0, 1.0 - w * w)) * v[k] / norm;
    return x;
  }

  TargetKind kind_;  // unread when the samples come from a file (rows_)
  Space space_;
  std::size_t d_;
  std::vector<double> rows_;
};

/// The angle of coordinates (a, b).
double angle_of(double a, double b) { return wrap_angle(std::atan2(b, a)); }

/// The realized marginal in the target's coordinates: x_i's angle in (x_0, x_1) (circle), the
/// two blocks' angles (torus), or x_i itself (sphere).
std::vector<double> realized_coordinates(const std::vector<double>& x, std::size_t n, std::size_t d, Space space) {
  std::vector<double> out;
  for (std::size_t i = 0; i < n; ++i) {
    const double* row = x.data() + i * d;
    if (space == Space::Circle) out.push_back(angle_of(row[0], row[1]));
    else if (space == Space::Torus) out.push_back(angle_of(row[0], row[1])), out.push_back(angle_of(row[2], row[3]));
    else out.insert(out.end(), row, row + d);
  }
  return out;
}

/// The distance of docs/realization.md for the space; rotations: the circle's optimal
/// rotation (circle) or the two marginals' (torus), else nothing.
double space_distance(Space space, const std::vector<double>& a, const std::vector<double>& b, std::size_t d,
                      std::vector<double>* rotations = nullptr) {
  if (space == Space::Circle) {
    double alpha = 0.0;
    const double value = circle_w1_over_rotations(a, b, &alpha);
    if (rotations) *rotations = {alpha};
    return value;
  }
  if (space == Space::Sphere) return energy_distance(a, b, d);
  // Torus: align each angle by its marginal's optimal rotation, then the energy distance of
  // the embeddings (cos, sin, cos, sin).
  const std::size_t n = a.size() / 2, m = b.size() / 2;
  double shift[2];
  for (int k = 0; k < 2; ++k) {
    std::vector<double> ak(n), bk(m);
    for (std::size_t i = 0; i < n; ++i) ak[i] = a[2 * i + std::size_t(k)];
    for (std::size_t i = 0; i < m; ++i) bk[i] = b[2 * i + std::size_t(k)];
    circle_w1_over_rotations(ak, bk, &shift[k]);
  }
  auto embed = [](const std::vector<double>& angles, const double* offset) {
    std::vector<double> out;
    for (std::size_t i = 0; i < angles.size() / 2; ++i)
      for (int k = 0; k < 2; ++k) {
        const double t = angles[2 * i + std::size_t(k)] + offset[k];
        out.push_back(std::cos(t));
        out.push_back(std::sin(t));
      }
    return out;
  };
  const double none[2] = {0.0, 0.0};
  if (rotations) *rotations = {shift[0], shift[1]};
  return energy_distance(embed(a, none), embed(b, shift), 4);
}

std::string metric_name(Space space) {
  if (space == Space::Circle) return "wasserstein-1 on the circle, minimised over rotations";
  if (space == Space::Torus)
    return "energy distance on the torus embedded as (cos, sin, cos, sin) in R^4, each angle rotated by its "
           "marginal's optimal circle-W1 rotation";
  return "energy distance, Euclidean norm in R^d (V-statistics)";
}

/// The plane rotation's generator A (so exp(A) z = u): A = theta (w z^T - z w^T),
/// w the unit direction of u's part orthogonal to z, theta = acos <z, u>.
std::vector<double> plane_rotation_generator(const double* z, const double* u, std::size_t d) {
  double along = 0.0;
  for (std::size_t k = 0; k < d; ++k) along += z[k] * u[k];
  std::vector<double> w(d), generator(d * d, 0.0);
  double norm = 0.0;
  for (std::size_t k = 0; k < d; ++k) {
    w[k] = u[k] - along * z[k];
    norm += w[k] * w[k];
  }
  if (norm < 1e-24) {
    if (along > 0.0) return generator;  // z = u: no rotation
    // z = -u: any plane through z; take the coordinate least aligned with z.
    std::size_t axis = 0;
    for (std::size_t k = 1; k < d; ++k)
      if (std::fabs(z[k]) < std::fabs(z[axis])) axis = k;
    for (std::size_t k = 0; k < d; ++k) w[k] = (k == axis) - z[axis] * z[k];
    norm = 0.0;
    for (double v : w) norm += v * v;
  }
  norm = std::sqrt(norm);
  const double theta = std::acos(std::clamp(along, -1.0, 1.0));
  for (std::size_t a = 0; a < d; ++a)
    for (std::size_t b = 0; b < d; ++b) generator[a * d + b] = theta * (w[a] * z[b] - z[a] * w[b]) / norm;
  return generator;
}

int realize(const Options& o, std::ostream& out, std::ostream& err) {
  const std::size_t n = std::size_t(o.n), d = std::size_t(o.d);
  const Space space = space_of(o.mechanism);
  const std::size_t columns = columns_of(space, d);
  const TargetLaw law(o.target_kind, o.target, space, d);
  // Three independent samples: the one realized through the positions, the target sample the
  // file records, and a second one for the noise floor.
  RandomStream realize_stream(std::uint64_t(o.seed), std::uint64_t(StreamTag::Positions), 0x5EA1, 0);
  RandomStream target_stream(std::uint64_t(o.seed), std::uint64_t(StreamTag::Positions), 0x5EA1, 1);
  RandomStream floor_stream(std::uint64_t(o.seed), std::uint64_t(StreamTag::Positions), 0x5EA1, 2);
  const std::vector<double> realized_draws = law.sample(n, realize_stream);
  const std::vector<double> target = law.sample(n, target_stream);
  const std::vector<double> second = law.sample(n, floor_stream);

  const ScratchFolder scratch("mfattn-realize-");
  std::vector<std::string> args = {"--n", std::to_string(n), "--d", std::to_string(d), "--kernel", "usa", "--beta",
                                   format_number(o.beta), "--integrator", "rk4", "--dt", format_number(o.dt),
                                   "--horizon", format_number(o.horizon), "--seed", std::to_string(o.seed),
                                   "--out", o.out, "--quiet"};
  if (o.threads > 0) args.insert(args.end(), {"--threads", std::to_string(o.threads)});
  if (o.overwrite) args.push_back("--overwrite");
  const std::string geometry = o.mechanism == Mechanism::Rope ? "rope" : o.mechanism == Mechanism::RopeMixed ? "rope-mixed" : "lie";
  if (o.contrast_kind == Contrast::DistanceBias)
    args.insert(args.end(), {"--geometry", "none", "--aux-factor", "distance", "--aux-lambda", "1"});
  else
    args.insert(args.end(), {"--geometry", geometry});
  if (o.contrast_kind == Contrast::PlainValues) args.insert(args.end(), {"--values", "plain"});
  const std::string positions_file = scratch.file("positions.txt");
  std::vector<double> positions;
  const std::vector<double> pin = [&] {
    std::vector<double> u(d, 0.0);
    u[d - 1] = 1.0;
    return u;
  }();
  if (o.mechanism == Mechanism::Rope) {
    for (double psi : realized_draws) positions.push_back(-psi);  // x's angle: a - xi = a + psi
  } else if (o.mechanism == Mechanism::RopeMixed) {
    // W from the model's gauge (drawn from the seed, independent of the positions).
    write_rows(positions_file, std::vector<double>(2 * n, 0.0), 2);
    const RunConfig probe = parse_run_arguments(
        {"--n", std::to_string(n), "--d", "4", "--geometry", "rope-mixed", "--positions", positions_file, "--seed",
         std::to_string(o.seed), "--out", o.out});
    const Model model = build_model(probe);
    const auto* gauge = dynamic_cast<const PositionalGauge*>(model.gauge.get());
    const Matrix& w = gauge->frequency_table();  // 2 x 2
    const double det = w(0, 0) * w(1, 1) - w(0, 1) * w(1, 0);
    for (std::size_t i = 0; i < n; ++i) {
      const double t0 = -realized_draws[2 * i], t1 = -realized_draws[2 * i + 1];
      positions.push_back((w(1, 1) * t0 - w(0, 1) * t1) / det);
      positions.push_back((-w(1, 0) * t0 + w(0, 0) * t1) / det);
    }
  } else {
    // The gauges: the basis E_ab (a < b) of so(d) as generators, position = A_i(a, b).
    std::vector<double> generators;
    for (std::size_t a = 0; a < d; ++a)
      for (std::size_t b = a + 1; b < d; ++b)
        for (std::size_t r = 0; r < d; ++r)
          for (std::size_t c = 0; c < d; ++c) generators.push_back(double(r == a && c == b) - double(r == b && c == a));
    write_rows(scratch.file("generators.txt"), generators, d);
    for (std::size_t i = 0; i < n; ++i) {
      const std::vector<double> a = plane_rotation_generator(realized_draws.data() + i * d, pin.data(), d);
      for (std::size_t r = 0; r < d; ++r)
        for (std::size_t c = r + 1; c < d; ++c) positions.push_back(a[r * d + c]);
    }
    if (o.contrast_kind != Contrast::DistanceBias) args.insert(args.end(), {"--generators", scratch.file("generators.txt")});
  }
  const std::size_t k = positions.size() / n;
  write_rows(positions_file, positions, k);
  args.insert(args.end(), {"--positions", positions_file});
  if (o.mechanism == Mechanism::PrefixGauge && o.pin) {
    // One frozen prefix token of weight n at the pin in y-space: its content is G_p^T u*,
    // G_p the gauge at its position (build_model places it).
    write_rows(scratch.file("prefix.txt"), pin, d);
    std::vector<std::string> probe_args = args;
    probe_args.insert(probe_args.end(), {"--prefix", "1", "--prefix-init", scratch.file("prefix.txt")});
    const Model probe = build_model(parse_run_arguments(probe_args));
    std::vector<double> content(d, 0.0);
    if (probe.gauge) probe.gauge->apply_transpose(n, pin.data(), content.data());
    else content = pin;
    write_rows(scratch.file("prefix.txt"), content, d);
    args.insert(args.end(), {"--prefix", "1", "--prefix-init", scratch.file("prefix.txt"), "--prefix-weight",
                             std::to_string(n)});
  }
  const RunConfig cfg = parse_run_arguments(args);
  const Model model = build_model(cfg);
  RunHooks hooks;
  hooks.unfinished_advice = "realize does not resume: run the same realize command again with --overwrite";
  const int status = run_simulation(cfg, err, hooks);
  if (status == kExitNumerical)
    err << "mfattn realize: realize runs USA in natural time (it takes no --time-scale): take a smaller --dt or --beta\n";
  if (status != kExitOk) return status;

  // The realized marginal, and u: where y_i = G_i x_i collapsed (the pin when pinned).
  const Frame last = read_last_frame(o.out);
  std::vector<double> u(d, 0.0), y(d);
  for (std::size_t i = 0; i < n; ++i) {
    const double* x = last.x.data() + i * d;
    if (model.gauge && o.contrast_kind != Contrast::DistanceBias) model.gauge->apply(i, x, y.data());
    else y.assign(x, x + d);
    for (std::size_t c = 0; c < d; ++c) u[c] += y[c];
  }
  double norm = 0.0;
  for (double v : u) norm += v * v;
  for (double& v : u) v /= std::sqrt(norm);
  // How far x_i is from the push-forward G_i^T u.
  double deviation = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    if (model.gauge && o.contrast_kind != Contrast::DistanceBias) model.gauge->apply_transpose(i, u.data(), y.data());
    else y = u;
    double gap = 0.0;
    for (std::size_t c = 0; c < d; ++c) gap += (last.x[i * d + c] - y[c]) * (last.x[i * d + c] - y[c]);
    deviation = std::max(deviation, std::sqrt(gap));
  }
  const std::vector<double> realized = realized_coordinates(last.x, n, d, space);
  std::vector<double> rotation;
  const double distance = space_distance(space, realized, target, d, &rotation);
  const double noise_floor = space_distance(space, second, target, d);

  RealizationRecord record;
  record.columns = columns;
  record.target = target;
  record.realized = realized;
  record.u = u;
  const std::string metric = metric_name(space);
  record.texts = {{"mechanism", o.mechanism_name}, {"target", o.target}, {"metric", metric},
                  {"contrast", o.contrast}, {"pinned", o.mechanism == Mechanism::PrefixGauge && o.pin ? "yes" : "no"}};
  record.numbers = {{"distance", distance}, {"noise_floor", noise_floor}, {"max_deviation", deviation},
                    {"time", last.time}};
  for (std::size_t r = 0; r < rotation.size(); ++r) record.numbers.push_back({"rotation_" + std::to_string(r), rotation[r]});
  write_realization(o.out, record);

  if (o.json) {
    out << "{" << json::quoted("metric") << ": " << json::quoted(metric) << ", " << json::quoted("distance") << ": "
        << json::number(distance) << ", " << json::quoted("noise_floor") << ": " << json::number(noise_floor) << ", "
        << json::quoted("max_deviation") << ": " << json::number(deviation) << ", " << json::quoted("mechanism")
        << ": " << json::quoted(o.mechanism_name) << ", " << json::quoted("target") << ": " << json::quoted(o.target)
        << ", " << json::quoted("contrast") << ": " << json::quoted(o.contrast) << ", " << json::quoted("pinned")
        << ": " << (o.mechanism == Mechanism::PrefixGauge && o.pin ? "true" : "false") << ", " << json::quoted("n")
        << ": " << n << ", " << json::quoted("u") << ": [";
    for (std::size_t c = 0; c < d; ++c) out << (c ? ", " : "") << json::number(u[c]);
    out << "]}\n";
  } else {
    out << std::setprecision(4) << o.mechanism_name << " " << o.target << " n " << n << ": " << metric << " "
        << distance << " (noise floor " << noise_floor << ", ratio " << distance / noise_floor
        << "); max |x_i - G_i^T u| " << deviation << "; " << o.out << " /realization\n";
  }
  // The distance means something only when every x_i is the push-forward of one u.
  if (o.contrast_kind == Contrast::None && !(deviation <= kRealizedDeviation)) {
    err << std::setprecision(4) << "mfattn realize: not realized: max |x_i - G_i^T u| = " << deviation << " > "
        << kRealizedDeviation << " at t = " << last.time
        << ", the values did not collapse to one u (take a longer --horizon, a smaller --beta or a smaller --dt)\n";
    return kExitNumerical;
  }
  return kExitOk;
}

}  // namespace

std::string realize_usage() {
  return "usage: mfattn realize --target vmf-mixture|band|cap|uniform|FILE --mechanism rope|rope-mixed|prefix-gauge\n"
         "                      [--no-pin] [--n N] [--d D] [--horizon T] [--seed S] [--beta B] [--dt DT]\n"
         "                      [--threads K] [--contrast none|distance-bias|plain-values] --out F.h5 [--overwrite]\n"
         "                      [--json]\n"
         "  realizes a target law as the final marginal of USA with transported values (docs/realization.md):\n"
         "  rope (d = 3, laws on a latitude circle), rope-mixed (d = 4, laws on a torus orbit), prefix-gauge\n"
         "  (laws on S^{d-1}, gauges from the target and a prefix token pinning u; --no-pin leaves u free).\n"
         "  Prints the distance to an independent target sample beside the noise floor; --json as one object\n"
         "  (metric, distance, noise_floor, max_deviation, ...). Defaults: n 256, horizon 30, beta 1, dt 0.1.\n"
         "  FILE: one sample per line (an angle; two angles for rope-mixed; a point of R^d for prefix-gauge).\n";
}

int realize_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return realize(parse_options(args), out, err);
}

}  // namespace mfattn
