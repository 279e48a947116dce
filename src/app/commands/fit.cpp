// mfattn fit (include/mfattn/app/fit.hpp, docs/cli.md "fit"): the numbers that --fit names are
// moved by Adam or L-BFGS along the gradient of the loss of the run they make, each gradient
// by gradient_of_run (the discrete adjoint of the run's own steps). Every run of the fit is the
// run `mfattn run --weights` makes from a weights file: the weights are handed over as such a
// file held in memory, so the file the fit writes replays its best run to the bit.
#include "mfattn/app/fit.hpp"

#include <boost/program_options.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <memory>
#include <ostream>
#include <set>
#include <sstream>

#include "app/scratch_files.hpp"
#include "io/path_lock.hpp"
#include "kernels/fixed_steps.hpp"
#include "mfattn/app/command_errors.hpp"
#include "mfattn/app/config.hpp"
#include "mfattn/app/model_builder.hpp"
#include "mfattn/app/run.hpp"
#include "mfattn/app/run_resources.hpp"
#include "mfattn/app/stop_signals.hpp"
#include "mfattn/app/validate.hpp"
#include "mfattn/backends/backend_errors.hpp"
#include "mfattn/backends/derivatives.hpp"
#include "mfattn/core/init.hpp"
#include "mfattn/core/input_file.hpp"
#include "mfattn/core/number_text.hpp"
#include "mfattn/integrators/adjoint.hpp"
#include "mfattn/io/h5md.hpp"
#include "mfattn/io/weights_file.hpp"

namespace mfattn {

namespace {

namespace po = boost::program_options;
namespace fs = std::filesystem;

/// The numbers --fit can move, one kind at a time.
enum class Part { Query, Key, Value, Output, W1, B1, W2, B2, X0, Beta };

/// --fit's words and the parts each names.
const std::vector<std::pair<std::string, std::vector<Part>>>& part_words() {
  static const std::vector<std::pair<std::string, std::vector<Part>>> words = {
      {"attention", {Part::Query, Part::Key, Part::Value, Part::Output}},
      {"query", {Part::Query}},
      {"key", {Part::Key}},
      {"value", {Part::Value}},
      {"output", {Part::Output}},
      {"mlp", {Part::W1, Part::B1, Part::W2, Part::B2}},
      {"w1", {Part::W1}},
      {"b1", {Part::B1}},
      {"w2", {Part::W2}},
      {"b2", {Part::B2}},
      {"x0", {Part::X0}},
      {"beta", {Part::Beta}}};
  return words;
}

std::string accepted_parts() {
  std::string text;
  for (const auto& [word, parts] : part_words()) text += (text.empty() ? "" : ", ") + word;
  return text;
}

/// Everything a fit may move: each layer's matrix set (the weights file's layout), the
/// initial state's rows before they are put on the sphere (y; x(0) = y / |y| per row on the
/// sphere, x(0) = y in R^d), and beta. A gradient has the same shape.
struct FitNumbers {
  std::vector<LayerNumbers> layers;
  std::vector<double> y0;
  double beta = 0.0;
};

/// fn(first number, count) for every block of `numbers` that `parts` names, in one order
/// (layer by layer, head by head): the order of the optimiser's flat vector.
template <class Numbers, class Fn>
void each_block(Numbers& numbers, const std::set<Part>& parts, Fn&& fn) {
  auto take = [&](Part part, auto& array) {
    if (parts.count(part) && array.size() > 0) fn(array.data(), std::size_t(array.size()));
  };
  for (auto& layer : numbers.layers) {
    for (auto& head : layer.heads) {
      take(Part::Query, head.query);
      take(Part::Key, head.key);
      take(Part::Value, head.value);
      take(Part::Output, head.output);
    }
    take(Part::W1, layer.w1);
    take(Part::B1, layer.b1);
    take(Part::W2, layer.w2);
    take(Part::B2, layer.b2);
  }
  take(Part::X0, numbers.y0);
  if (parts.count(Part::Beta)) fn(&numbers.beta, std::size_t{1});
}

std::vector<double> flattened(const FitNumbers& numbers, const std::set<Part>& parts) {
  std::vector<double> flat;
  each_block(numbers, parts, [&](const double* first, std::size_t count) {
    flat.insert(flat.end(), first, first + count);
  });
  return flat;
}

void unflatten(const std::vector<double>& flat, FitNumbers& numbers, const std::set<Part>& parts) {
  std::size_t at = 0;
  each_block(numbers, parts, [&](double* first, std::size_t count) {
    std::copy(flat.begin() + std::ptrdiff_t(at), flat.begin() + std::ptrdiff_t(at + count), first);
    at += count;
  });
}

/// The layers' matrices as a --weights file: with a leading layer axis where there are
/// several, the heads' output maps side by side ([d, H rv]).
WeightsFile weights_file_of(const std::vector<LayerNumbers>& layers,
                            const std::string& activation) {
  WeightsFile file;
  const LayerNumbers& first = layers.front();
  const std::size_t count = layers.size(), heads = first.heads.size();
  auto leading = [&](std::vector<std::size_t> shape) {
    if (count > 1) shape.insert(shape.begin(), count);
    return shape;
  };
  auto append = [](WeightArray& array, const auto& m) {
    array.values.insert(array.values.end(), m.data(), m.data() + m.size());
  };
  if (heads > 0) {
    const HeadNumbers& head = first.heads.front();
    const auto r = std::size_t(head.query.rows()), d = std::size_t(head.query.cols()),
               rv = std::size_t(head.value.rows());
    file.query.shape = leading({heads, r, d});
    file.key.shape = leading({heads, r, d});
    file.value.shape = leading({heads, rv, d});
    file.output.shape = leading({d, heads * rv});
    for (const LayerNumbers& layer : layers) {
      Matrix output(Eigen::Index(d), Eigen::Index(heads * rv));
      for (std::size_t h = 0; h < heads; ++h) {
        append(file.query, layer.heads[h].query);
        append(file.key, layer.heads[h].key);
        append(file.value, layer.heads[h].value);
        output.middleCols(Eigen::Index(h * rv), Eigen::Index(rv)) = layer.heads[h].output;
      }
      append(file.output, output);
    }
  }
  if (first.w1.size() > 0) {
    const auto width = std::size_t(first.w1.rows()), d = std::size_t(first.w1.cols());
    file.w1.shape = leading({width, d});
    file.b1.shape = leading({width});
    file.w2.shape = leading({d, width});
    file.b2.shape = leading({d});
    for (const LayerNumbers& layer : layers) {
      append(file.w1, layer.w1);
      append(file.b1, layer.b1);
      append(file.w2, layer.w2);
      append(file.b2, layer.b2);
    }
    file.activation = activation;
  }
  return file;
}

/// The options of fit beside the run's.
struct FitOptions {
  std::string target;
  std::string fit;
  std::int64_t layers = 0;  ///< 0: the starting weights' layers (1 unless a layered --weights file)
  std::string loss = "tokens";
  double loss_gamma = 1.0;
  double loss_epsilon = 0.1;
  std::string loss_times;
  std::string optimizer = "adam";
  std::int64_t iterations = 100;
  double learning_rate = 0.0;  ///< 0: the optimiser's default
  std::int64_t checkpoints = 0;
};

constexpr std::int64_t kMaxIterations = 10'000'000;
constexpr std::int64_t kMaxFitLayers = 4096;
/// L-BFGS: the curvature pairs kept, Armijo's constant and the halvings of one line search.
constexpr std::size_t kLbfgsMemory = 10;
constexpr double kArmijo = 1e-4;
constexpr int kLineSearchHalvings = 40;
/// The best weights are written at most this often while the fit runs (and at its end).
constexpr double kWriteIntervalSeconds = 2.0;

po::options_description fit_own_options(FitOptions& o) {
  po::options_description table("Fit options");
  table.add_options()(
      "target", po::value(&o.target),
      "FILE: an mfattn H5MD run (its last frame) or a text file of points, rows of d")(
      "fit", po::value(&o.fit),
      "LIST of what to fit: attention, query, key, value, output, mlp, w1, b1, w2, b2, x0, beta")(
      "layers", po::value(&o.layers),
      "L >= 1 piecewise-constant layers of --layer-time each (default: the starting weights')")(
      "loss", po::value(&o.loss)->default_value("tokens"), "tokens | mmd | w2 | energy | sinkhorn")(
      "loss-gamma", po::value(&o.loss_gamma)->default_value(1.0), "mmd's kernel exp(gamma <x, y>)")(
      "loss-epsilon", po::value(&o.loss_epsilon)->default_value(0.1),
      "sinkhorn's blur, > 0 (cost |x - y|^2)")(
      "loss-times", po::value(&o.loss_times),
      "LIST of frame times: the loss summed over them (default: the horizon)")(
      "optimizer", po::value(&o.optimizer)->default_value("adam"), "adam | lbfgs")(
      "iterations", po::value(&o.iterations)->default_value(100),
      "optimiser iterations, 1 to 10^7")("learning-rate", po::value(&o.learning_rate),
                                         "> 0: Adam's step (0.01); L-BFGS's first step length (1)")(
      "checkpoints", po::value(&o.checkpoints)->default_value(0),
      "states stored per gradient (0: the default)");
  return table;
}

/// Adam (Kingma and Ba): p -= lr m_hat / (sqrt(v_hat) + 1e-8), beta1 0.9, beta2 0.999.
struct Adam {
  double rate;
  std::vector<double> m, v;
  std::int64_t t = 0;
  void step(std::vector<double>& p, const std::vector<double>& g) {
    m.resize(p.size(), 0.0);
    v.resize(p.size(), 0.0);
    ++t;
    const double c1 = 1.0 - std::pow(0.9, double(t)), c2 = 1.0 - std::pow(0.999, double(t));
    for (std::size_t e = 0; e < p.size(); ++e) {
      m[e] = 0.9 * m[e] + 0.1 * g[e];
      v[e] = 0.999 * v[e] + 0.001 * g[e] * g[e];
      p[e] -= rate * (m[e] / c1) / (std::sqrt(v[e] / c2) + 1e-8);
    }
  }
};

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0.0;
  for (std::size_t e = 0; e < a.size(); ++e) sum += a[e] * b[e];
  return sum;
}

/// L-BFGS's direction -H g by the two-loop recursion over the kept pairs (s, y), H_0 = gamma
/// I with gamma = <s, y> / <y, y> of the newest pair (`first_scale` before any).
std::vector<double> lbfgs_direction(const std::vector<double>& g,
                                    const std::vector<std::vector<double>>& s,
                                    const std::vector<std::vector<double>>& y, double first_scale) {
  std::vector<double> q = g, alpha(s.size());
  for (std::size_t k = s.size(); k-- > 0;) {
    alpha[k] = dot(s[k], q) / dot(y[k], s[k]);
    for (std::size_t e = 0; e < q.size(); ++e) q[e] -= alpha[k] * y[k][e];
  }
  const double gamma = s.empty() ? first_scale : dot(s.back(), y.back()) / dot(y.back(), y.back());
  for (double& e : q) e *= gamma;
  for (std::size_t k = 0; k < s.size(); ++k) {
    const double beta = dot(y[k], q) / dot(y[k], s[k]);
    for (std::size_t e = 0; e < q.size(); ++e) q[e] += (alpha[k] - beta) * s[k][e];
  }
  for (double& e : q) e = -e;
  return q;
}

/// The fit's problem: the run options (with the weights, beta and x(0) it moves put in), the
/// loss and the map from the optimiser's flat vector to a gradient run and back.
class FitProblem {
 public:
  FitProblem(const RunConfig& base, const FitOptions& options, std::set<Part> parts,
             double layer_time, std::size_t layers, const RunLoss& loss,
             std::vector<double> loss_times)
      : base_(base), options_(options), parts_(std::move(parts)), layer_time_(layer_time),
        loss_(loss), loss_times_(std::move(loss_times)), scratch_("mfattn-fit-") {
    const Model model = build_model(base_);
    on_sphere_ = model.on_sphere();
    d_ = model.d;
    // The starting weights: each layer's set (the last one of a file repeated up to L).
    for (std::size_t l = 0; l < layers; ++l)
      start_.layers.push_back(layer_numbers(layer_matrices(base_, l).front()));
    start_.y0 = build_initial_state(base_, model).x;
    start_.beta = base_.beta;
  }

  const FitNumbers& start() const { return start_; }
  const std::set<Part>& parts() const { return parts_; }
  std::size_t layers() const { return start_.layers.size(); }

  /// The run options of the run at `numbers`: its weights held in memory as a --weights file
  /// named `weights_name`, its layer time, beta, and x(0) from `init_file` where x0 is fitted.
  RunConfig config_at(const FitNumbers& numbers, const std::string& weights_name,
                      const std::string& init_file) const {
    RunConfig cfg = base_;
    auto given = [&](const std::string& name, bool is_given) {
      std::erase(cfg.given, name);
      if (is_given) cfg.given.push_back(name);
    };
    cfg.weights = weights_name;
    cfg.weights_in_memory = std::make_shared<const WeightsFile>(
        weights_file_of(numbers.layers, base_.mlp_activation));
    cfg.q = cfg.k = cfg.v = "identity";
    for (const char* preset : {"q", "k", "v"}) given(preset, false);
    given("weights", true);
    cfg.layer_time = layers() > 1 ? layer_time_ : 0.0;
    given("layer-time", layers() > 1);
    cfg.beta = numbers.beta;
    if (parts_.count(Part::X0)) {
      cfg.init = "file";
      cfg.init_file = init_file;
      cfg.normalize_init = false;
      given("init", true);
      given("init-file", true);
      given("normalize-init", false);
    }
    cfg.choices = validate(cfg);
    return cfg;
  }

  /// x(0) of the initial rows y (on the sphere: each row over its norm).
  std::vector<double> initial_state(const std::vector<double>& y) const {
    std::vector<double> x = y;
    if (!on_sphere_) return x;
    for (std::size_t row = 0; row < x.size() / d_; ++row)
      kernels::normalize_token(x.data() + row * d_, int(d_));
    return x;
  }

  /// The loss of the run at the flat numbers `p` and its gradient (flat, the same order).
  double evaluate(const std::vector<double>& p, std::vector<double>& gradient) {
    FitNumbers numbers = start_;
    unflatten(p, numbers, parts_);
    const std::string init_file = scratch_.file("x0.txt");
    const std::vector<double> x0 = initial_state(numbers.y0);
    if (parts_.count(Part::X0)) write_rows(init_file, x0, d_);
    const RunConfig cfg = config_at(numbers, "(the fit's weights)", init_file);
    const RunLoss loss = loss_;
    const RunGradient result = gradient_of_run(
        cfg, [&](const Dynamics& field) { return final_loss(loss, field); },
        std::size_t(options_.checkpoints), loss_times_);
    FitNumbers slope = numbers;
    for (std::size_t l = 0; l < slope.layers.size(); ++l)
      slope.layers[l] = result.layer_sets.empty() ? result.numbers.sets.front()
                                                  : result.layer_sets[l].front();
    slope.beta = result.numbers.beta;
    // dL/dy = (I - x x^T) dL/dx / |y| per row on the sphere.
    slope.y0 = result.x0;
    if (on_sphere_)
      for (std::size_t row = 0; row < x0.size() / d_; ++row) {
        double along = 0.0, norm = 0.0;
        for (std::size_t c = 0; c < d_; ++c) {
          along += slope.y0[row * d_ + c] * x0[row * d_ + c];
          norm += numbers.y0[row * d_ + c] * numbers.y0[row * d_ + c];
        }
        norm = std::sqrt(norm);
        for (std::size_t c = 0; c < d_; ++c)
          slope.y0[row * d_ + c] = (slope.y0[row * d_ + c] - along * x0[row * d_ + c]) / norm;
      }
    gradient = flattened(slope, parts_);
    return result.loss;
  }

 private:
  RunConfig base_;
  FitOptions options_;
  std::set<Part> parts_;
  double layer_time_;
  RunLoss loss_;
  std::vector<double> loss_times_;
  ScratchFolder scratch_;
  FitNumbers start_;
  bool on_sphere_ = true;
  std::size_t d_ = 0;
};

/// What a fit writes: FILE.h5 (the weights and the record), FILE.cfg (the run options that
/// replay the fitted run) and, where x0 is fitted, FILE.x0.txt.
struct FitOutputs {
  std::string weights, config, init;
};

FitOutputs outputs_of(const std::string& out, bool with_init) {
  const fs::path path = fs::absolute(out);
  fs::path stem = path;
  stem.replace_extension();
  return {path.string(), stem.string() + ".cfg",
          with_init ? stem.string() + ".x0.txt" : std::string()};
}

/// A stored option value as a config file's value.
std::string config_value(const ParameterValue& value) {
  if (const auto* v = std::get_if<std::int64_t>(&value)) return std::to_string(*v);
  if (const auto* v = std::get_if<double>(&value)) return format_number(*v);
  if (const auto* v = std::get_if<bool>(&value)) return *v ? "true" : "false";
  if (const auto* v = std::get_if<std::vector<double>>(&value)) {
    std::string text;
    for (double e : *v) text += (text.empty() ? "" : ",") + format_number(e);
    return text;
  }
  return std::get<std::string>(value);
}

/// The config file that replays the fitted run: the run options given to fit (but its output
/// and the weights, presets and numbers the fit replaces), then the fitted weights, layer
/// time, beta and x(0).
std::string replay_config(const RunConfig& base, const FitOutputs& outputs, std::size_t layers,
                          double layer_time, double beta, bool beta_fitted,
                          const std::string& command_line) {
  const std::set<std::string> replaced = {
      "out", "overwrite", "resume",     "config", "quiet",     "weights",        "q",
      "k",   "v",         "layer-time", "init",   "init-file", "normalize-init", "beta"};
  std::ostringstream text;
  text << "# The run of the weights that `" << command_line << "` fitted:\n"
       << "# mfattn run --config " << outputs.config << " --out RUN.h5\n";
  for (const Parameter& p : base.parameters)
    if (base.was_given(p.name) && !replaced.count(p.name))
      text << p.name << " = " << config_value(p.value) << '\n';
  text << "weights = " << outputs.weights << '\n';
  if (layers > 1) text << "layer-time = " << format_number(layer_time) << '\n';
  const bool beta_given = beta_fitted || base.was_given("beta");
  if (beta_given) text << "beta = " << format_number(beta) << '\n';
  if (!outputs.init.empty()) text << "init = file\ninit-file = " << outputs.init << '\n';
  else {
    for (const char* name : {"init", "init-file", "normalize-init"})
      for (const Parameter& p : base.parameters)
        if (p.name == name && base.was_given(name))
          text << p.name << " = " << config_value(p.value) << '\n';
  }
  return text.str();
}

/// The target's points: an mfattn file's last frame, or rows of d numbers.
std::vector<double> read_target(const std::string& path, std::size_t d, std::size_t& rows) {
  try {
    check_input_file(path);
    if (is_mfattn_file(path)) {
      const Frame frame = read_last_frame(path);
      if (frame.d != d)
        throw std::invalid_argument("has d = " + std::to_string(frame.d) +
                                    ", this run d = " + std::to_string(d));
      rows = frame.n;
      return frame.x;
    }
    return read_text_rows(path, d, rows);
  } catch (const UsageError& e) {
    throw UsageError("--target " + path + ": " + e.what());
  } catch (const std::exception& e) {
    throw UsageError("--target " + path + ": " + e.what());
  }
}

/// The layers of the --weights file at path: the leading axis of /attention/query [L, H, r, d]
/// or /mlp/w1 [L, W, d], 1 without one (validate() checks the rest, and names what is wrong).
std::size_t weights_file_layers(const std::string& path) {
  WeightsFile file;
  try {
    check_input_file(path);
    file = read_weights_file(path);
  } catch (const std::exception& e) {
    throw UsageError("--weights " + path + ": " + e.what());
  }
  if (file.query.shape.size() == 4) return file.query.shape.front();
  if (file.w1.shape.size() == 3) return file.w1.shape.front();
  return 1;
}

std::string seconds_text(double seconds) {
  std::ostringstream text;
  text << std::fixed << std::setprecision(1) << seconds << " s";
  return text.str();
}

}  // namespace

std::string fit_usage() {
  FitOptions o;
  RunConfig defaults;
  std::ostringstream text;
  text
      << "usage: mfattn fit [run options] --target FILE --fit LIST [--layers L] [--layer-time T]\n"
         "                  [--loss tokens|mmd] [--optimizer adam|lbfgs] [--iterations N] --out FILE.h5\n"
         "  fits the weights (and x0, beta) of the run the run options describe so that it carries\n"
         "  the tokens to --target; writes FILE.h5 (a --weights file, the loss of every iteration\n"
         "  in /fit/loss) and FILE.cfg (mfattn run --config FILE.cfg --out RUN.h5 replays it)\n"
      << fit_own_options(o) << run_options(defaults);
  return text.str();
}

int fit_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  (void)out;
  RunConfig cfg;
  FitOptions o;
  po::options_description table = run_options(cfg);
  table.add(fit_own_options(o));
  po::variables_map vm;
  store_run_arguments(args, table, vm, cfg);
  std::string command_line = "mfattn fit";
  for (const std::string& word : args) command_line += " " + word;
  // The run options as /parameters would record them (fit's own left out).
  {
    FitOptions unused;
    const po::options_description own = fit_own_options(unused);
    for (const Parameter& p : table_parameters(table, vm))
      if (!own.find_nothrow(p.name, false)) cfg.parameters.push_back(p);
  }
  // The fitted layers' time is fit's own: a run takes --layer-time only with a weights file of
  // several layers, and fit spreads --layers L over time whatever its starting weights.
  double layer_time = cfg.layer_time;
  if (cfg.weights.empty() || weights_file_layers(cfg.weights) <= 1) {
    cfg.layer_time = 0.0;
    std::erase(cfg.given, std::string("layer-time"));
  }
  if (o.target.empty())
    throw UsageError("--target: required (the run's target: an mfattn file or rows of d numbers)");
  if (o.fit.empty()) throw UsageError("--fit: required (a list of " + accepted_parts() + ")");
  if (cfg.out.empty()) throw UsageError("--out: required (the fitted weights file, FILE.h5)");
  if (cfg.resume)
    throw UsageError("--resume: fit takes no --resume (it writes its best weights as it goes)");
  if (cfg.replicas != 1)
    throw UsageError("--replicas " + std::to_string(cfg.replicas) +
                     ": fit fits one run (1 replica)");
  if (cfg.regen_period > 0)
    throw UsageError(
        "--regen-period: fit fits fixed weights (--layers and --layer-time make layers in time)");
  const std::optional<RunLossKind> loss_kind = kRunLossOption.preset(o.loss);
  if (!loss_kind) throw UsageError("--loss " + o.loss + ": " + kRunLossOption.accepted());
  if (o.optimizer != "adam" && o.optimizer != "lbfgs")
    throw UsageError("--optimizer " + o.optimizer + ": accepted: adam, lbfgs");
  if (o.iterations < 1 || o.iterations > kMaxIterations)
    throw UsageError("--iterations " + std::to_string(o.iterations) + ": accepted: 1 to 10000000");
  if (vm.count("learning-rate") && !(o.learning_rate > 0 && std::isfinite(o.learning_rate)))
    throw UsageError("--learning-rate " + format_number(o.learning_rate) +
                     ": must be a finite number > 0");
  if (!vm.count("learning-rate")) o.learning_rate = o.optimizer == "adam" ? 0.01 : 1.0;
  if (o.checkpoints < 0)
    throw UsageError("--checkpoints " + std::to_string(o.checkpoints) + ": must be >= 0");
  if (!(o.loss_gamma > 0 && std::isfinite(o.loss_gamma)))
    throw UsageError("--loss-gamma " + format_number(o.loss_gamma) +
                     ": must be a finite number > 0");
  if (vm.count("loss-gamma") && !vm["loss-gamma"].defaulted() && *loss_kind != RunLossKind::Mmd)
    throw UsageError("--loss-gamma: the mmd loss's (--loss " + o.loss + " takes none)");
  if (!(o.loss_epsilon > 0 && std::isfinite(o.loss_epsilon)))
    throw UsageError("--loss-epsilon " + format_number(o.loss_epsilon) +
                     ": must be a finite number > 0");
  if (vm.count("loss-epsilon") && !vm["loss-epsilon"].defaulted() &&
      *loss_kind != RunLossKind::Sinkhorn)
    throw UsageError("--loss-epsilon: the sinkhorn loss's (--loss " + o.loss + " takes none)");
  std::set<Part> parts;
  {
    std::string list = o.fit;
    std::replace(list.begin(), list.end(), ',', ' ');
    std::istringstream words(list);
    for (std::string word; words >> word;) {
      const auto found = std::find_if(part_words().begin(), part_words().end(),
                                      [&](const auto& entry) { return entry.first == word; });
      if (found == part_words().end())
        throw UsageError("--fit " + o.fit + ": '" + word + "' is none of " + accepted_parts());
      parts.insert(found->second.begin(), found->second.end());
    }
    if (parts.empty()) throw UsageError("--fit: empty (a list of " + accepted_parts() + ")");
  }
  std::vector<double> loss_times;
  if (!o.loss_times.empty() && !parse_number_list(o.loss_times, loss_times))
    throw UsageError("--loss-times " + o.loss_times + ": expected a list of numbers (frame times)");
  // The starting weights: the run options' own (presets, a weights file), as many layers as
  // the file has or --layers asks for.
  cfg.choices = validate(cfg);
  const std::size_t file_layers = std::max<std::size_t>(cfg.choices.weight_layers, 1);
  std::size_t layers = file_layers;
  if (vm.count("layers")) {
    if (o.layers < 1 || o.layers > kMaxFitLayers)
      throw UsageError("--layers " + std::to_string(o.layers) + ": accepted: 1 to 4096");
    if (file_layers > 1 && std::size_t(o.layers) != file_layers)
      throw UsageError("--layers " + std::to_string(o.layers) + ": the --weights file has " +
                       std::to_string(file_layers) + " layers (give --layers " +
                       std::to_string(file_layers) + " or none)");
    layers = std::size_t(o.layers);
  }
  if (layers > 1 && !(layer_time > 0)) layer_time = cfg.horizon / double(layers);
  if (layers > 1 && double(layers - 1) * layer_time > cfg.horizon * (1.0 + 1e-12))
    throw UsageError("--layers " + std::to_string(layers) + ", --layer-time " +
                     format_number(layer_time) + ": the last layer starts after --horizon " +
                     format_number(cfg.horizon));
  const Model model = build_model(cfg);
  if (cfg.choices.matrices != MatrixSharing::Shared)
    throw UsageError("--matrices " + cfg.matrices + ": fit fits one set of weights (shared)");
  for (Part part : parts)
    if ((part == Part::W1 || part == Part::B1 || part == Part::W2 || part == Part::B2) &&
        cfg.layer.mlp_width == 0)
      throw UsageError("--fit " + o.fit + ": the model has no feed-forward term (give --mlp W)");
  // The target, read before anything is written.
  std::size_t rows = 0;
  RunLoss loss;
  loss.kind = *loss_kind;
  loss.gamma = o.loss_gamma;
  loss.epsilon = o.loss_epsilon;
  loss.target = read_target(o.target, model.d, rows);
  if (loss.kind == RunLossKind::Tokens && rows != model.n)
    throw UsageError("--target " + o.target + ": " + std::to_string(rows) +
                     " rows; the tokens loss takes one a token (" + std::to_string(model.n) + ")");
  const auto moving = std::size_t(std::count_if(model.presence.begin(), model.presence.end(),
                                                [](double p) { return p > 0.0; }));
  if (loss.kind == RunLossKind::W2 && rows != moving)
    throw UsageError("--target " + o.target + ": " + std::to_string(rows) +
                     " rows; the w2 loss takes one a moving token (" + std::to_string(moving) +
                     ")");
  const FitOutputs outputs = outputs_of(cfg.out, parts.count(Part::X0) > 0);
  for (const std::string& path : {outputs.weights, outputs.config, outputs.init}) {
    if (path.empty()) continue;
    std::error_code ignored;
    if (fs::exists(path, ignored) && !cfg.overwrite)
      throw OutputExists(path + " exists (give --overwrite to replace it)");
    if (!fs::is_directory(fs::path(path).parent_path(), ignored))
      throw UsageError("--out " + cfg.out + ": the folder " +
                       fs::path(path).parent_path().string() + " does not exist");
  }

  const StopSignals stop_signals({.keep_ignored = false,
                                  .restart_calls = true,
                                  .wake_pipe = false,
                                  .end_on_late_repeat = true});
  FitProblem problem(cfg, o, parts, layer_time, layers, loss, loss_times);
  // The first run's refusals (an integrator without an adjoint, a loss time that is no frame's)
  // come before any file is written.
  std::vector<double> p = flattened(problem.start(), parts), g;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::vector<double> losses, best = p;
  double best_loss = std::numeric_limits<double>::infinity();
  std::size_t best_iteration = 0;
  double last_write = -kWriteIntervalSeconds;
  bool written_best = false;
  std::string stopped_by;
  auto write_best = [&] {
    FitNumbers numbers = problem.start();
    unflatten(best, numbers, parts);
    if (!outputs.init.empty()) {
      std::ostringstream rows_text;
      const std::vector<double> x0 = problem.initial_state(numbers.y0);
      for (std::size_t e = 0; e < x0.size(); ++e)
        rows_text << format_number(x0[e]) << ((e + 1) % model.d ? ' ' : '\n');
      write_text_atomically(outputs.init, rows_text.str());
    }
    write_text_atomically(outputs.config,
                          replay_config(cfg, outputs, layers, layer_time, numbers.beta,
                                        parts.count(Part::Beta) > 0, command_line));
    ArrayRecord record;
    record.arrays.push_back({"/fit/loss", losses});
    record.attributes_of = "/fit";
    record.attributes = {{"optimizer", o.optimizer},
                         {"fit", o.fit},
                         {"loss", o.loss},
                         {"best_iteration", std::to_string(best_iteration)},
                         {"best_loss", format_number(best_loss)},
                         {"layers", std::to_string(layers)},
                         {"layer_time", format_number(layers > 1 ? layer_time : 0.0)},
                         {"status", stopped_by.empty() ? "running" : stopped_by},
                         {"replay", "mfattn run --config " + outputs.config + " --out RUN.h5"},
                         {"command_line", command_line}};
    write_weights_file(outputs.weights, weights_file_of(numbers.layers, cfg.mlp_activation),
                       record);
    last_write = elapsed();
    written_best = true;
  };
  auto progress = [&](std::size_t iteration, double value, double slope) {
    if (cfg.quiet) return;
    err << "mfattn fit: iteration " << iteration << "/" << o.iterations << "  loss "
        << std::setprecision(6) << value << "  |gradient| " << std::setprecision(3) << slope
        << "  best " << std::setprecision(6) << best_loss << "  " << seconds_text(elapsed())
        << '\n';
  };
  // One evaluation: the loss and gradient at p, the best kept.
  auto evaluate = [&](const std::vector<double>& at, std::vector<double>& slope) {
    const double value = problem.evaluate(at, slope);
    if (std::isfinite(value) && value < best_loss) {
      best_loss = value;
      best = at;
      best_iteration = losses.size();
    }
    return value;
  };
  auto end_with = [&](int code) {
    write_best();
    return code;
  };
  try {
    double value = evaluate(p, g);
    std::vector<std::vector<double>> s_kept, y_kept;
    Adam adam{o.learning_rate, {}, {}};
    for (std::int64_t iteration = 0;; ++iteration) {
      losses.push_back(value);
      progress(std::size_t(iteration), value, std::sqrt(dot(g, g)));
      if (iteration == o.iterations) break;
      if (const int signal = StopSignals::received()) {
        stopped_by = "interrupted: " + signal_name(signal);
        err << "mfattn fit: stopped by " << signal_name(signal) << " after iteration " << iteration
            << "; " << outputs.weights << " holds the best weights (iteration " << best_iteration
            << ", loss " << format_number(best_loss) << ")\n";
        return end_with(128 + signal);
      }
      if (elapsed() - last_write >= kWriteIntervalSeconds) write_best();
      if (o.optimizer == "adam") {
        adam.step(p, g);
        value = evaluate(p, g);
        continue;
      }
      // L-BFGS with a backtracking (Armijo) line search.
      const double slope_norm = std::sqrt(dot(g, g));
      if (slope_norm == 0.0) {
        err << "mfattn fit: the gradient is zero at iteration " << iteration << ": stopped\n";
        break;
      }
      const std::vector<double> direction = lbfgs_direction(g, s_kept, y_kept,
                                                            o.learning_rate / slope_norm);
      const double descent = dot(g, direction);
      double step = 1.0;
      bool accepted = false;
      std::vector<double> trial(p.size()), trial_slope;
      double trial_value = 0.0;
      for (int halving = 0; halving < kLineSearchHalvings && !accepted; ++halving, step *= 0.5) {
        for (std::size_t e = 0; e < p.size(); ++e) trial[e] = p[e] + step * direction[e];
        try {
          trial_value = evaluate(trial, trial_slope);
        } catch (const NumericalError&) {
          continue;  // the trial run diverged: a shorter step
        }
        // (A strict decrease as well: at the loss's floor Armijo's margin is below its rounding.)
        accepted = std::isfinite(trial_value) && trial_value < value &&
                   trial_value <= value + kArmijo * step * descent;
      }
      if (!accepted) {
        if (!cfg.quiet)
          err << "mfattn fit: no decrease along the search direction at iteration " << iteration
              << " (the loss is at its floor to rounding): stopped\n";
        break;
      }
      std::vector<double> s_new(p.size()), y_new(p.size());
      for (std::size_t e = 0; e < p.size(); ++e) {
        s_new[e] = trial[e] - p[e];
        y_new[e] = trial_slope[e] - g[e];
      }
      if (dot(s_new, y_new) > 1e-12 * std::sqrt(dot(s_new, s_new) * dot(y_new, y_new))) {
        s_kept.push_back(std::move(s_new));
        y_kept.push_back(std::move(y_new));
        if (s_kept.size() > kLbfgsMemory) {
          s_kept.erase(s_kept.begin());
          y_kept.erase(y_kept.begin());
        }
      }
      p = trial;
      g = trial_slope;
      value = trial_value;
    }
  } catch (const NumericalError& error) {
    if (!written_best && !std::isfinite(best_loss))
      throw;  // the starting weights' run failed: nothing to keep
    stopped_by = std::string("failed: ") + error.what();
    err << "mfattn fit: numerical failure after iteration " << losses.size() << ": " << error.what()
        << "; " << outputs.weights << " holds the best weights (iteration " << best_iteration
        << ", loss " << format_number(best_loss) << ")\n";
    return end_with(kExitNumerical);
  }
  stopped_by = "complete";
  write_best();
  if (!cfg.quiet)
    err << "mfattn fit: best loss " << format_number(best_loss) << " at iteration "
        << best_iteration << " of " << losses.size() - 1 << "; wrote " << outputs.weights << " and "
        << outputs.config << '\n';
  return kExitOk;
}

}  // namespace mfattn
