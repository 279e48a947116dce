// The compiled part of the Python package `mfattn` (docs/python.md), its module mfattn._core:
// the engine inside a notebook, NumPy arrays in and out, the same option table and the same
// code paths as the command line. The package's __init__.py (analysis/mfattn/) gives these
// names as mfattn.Model, mfattn.run, ... beside its pure-Python modules (mfattn.io, ...).
//
//   mfattn.Model(**options)      options of `mfattn run` by name, '-' written '_'
//     .velocity(x, threads=None) dx/dt = p_i P_{x_i}(u_i) for x of shape (n, d) or (R, n, d)
//     .energy(x)                 E = 1 / (2 beta M^2) sum_{i,j} p_i p_j m_ij c_ij exp(s_ij)
//     .initial_state()           the run's initial positions
//     .vjp(x, cotangent)         J^T w: dict of x's and every number's gradient (field_numbers.hpp)
//     .jvp(x, tangent, weight_tangents=None)   J t
//     .weights(layer=None)       the weights in the --weights file's layout
//   mfattn.run(out=None, progress=None, **options)
//                                `mfattn run` (run_simulation, the CLI's own function) into
//                                out or a temporary file, loaded as a Trajectory
//   mfattn.meanfield(out=None, progress=None, **options)
//                                `mfattn meanfield` (run_meanfield, the CLI's own function) into
//                                out or a temporary file, loaded as a Density
//   (mfattn.load, Trajectory and Density are mfattn.io's, the package's loader, which run and
//   meanfield import to read the file they wrote)
//
// Options are turned into command-line words (an array of two dimensions or more into a text
// file of its rows, for q=, init_file=, ...) and parsed by parse_run_arguments, so a bad
// value raises ValueError with the CLI's own message. Evaluations release the GIL; each
// concurrent call takes a backend of its own from the model's pool.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "mfattn/backends/backend.hpp"
#include "mfattn/app/config.hpp"
#include "mfattn/app/import_states.hpp"
#include "mfattn/app/stop_signals.hpp"
#include "mfattn/core/evaluation_watch.hpp"
#include "mfattn/analyze/analyze.hpp"
#include "mfattn/app/meanfield.hpp"
#include "mfattn/app/run.hpp"
#include "mfattn/app/run_choices.hpp"
#include "mfattn/core/number_text.hpp"
#include "mfattn/core/rng.hpp"
#include "mfattn/core/version.hpp"
#include "mfattn/integrators/integrator.hpp"
#include "mfattn/app/run_resources.hpp"
#include "mfattn/app/model_builder.hpp"
#include "mfattn/backends/derivatives.hpp"
#include "field_numbers.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace mfattn::python {
namespace {

/// mfattn.NumericalError (an ArithmeticError): a weight overflowed or the state diverged.
PyObject* numerical_error_type = nullptr;

[[noreturn]] void raise_python(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw py::error_already_set();
}

/// Whether the last evaluation ran without the GIL (PyGILState_Check inside it): the tests
/// ask, since whether two threads overlap is a matter of timing.
std::atomic<bool> last_call_released_gil{false};

/// The command line's words of a call's keywords, and the folder of the text files that its
/// array values were written to (removed with this object: it lives as long as what reads
/// them, the call or the Model).
struct OptionWords {
  std::vector<std::string> words;
  std::filesystem::path array_folder;
  OptionWords() = default;
  OptionWords(OptionWords&& other) noexcept
      : words(std::move(other.words)), array_folder(std::exchange(other.array_folder, {})) {}
  OptionWords& operator=(OptionWords&& other) noexcept {
    std::swap(words, other.words);
    std::swap(array_folder, other.array_folder);
    return *this;
  }
  OptionWords(const OptionWords&) = delete;
  OptionWords& operator=(const OptionWords&) = delete;
  ~OptionWords() {
    std::error_code ignored;
    if (!array_folder.empty()) std::filesystem::remove_all(array_folder, ignored);
  }

  /// A matrix or table (an array of two dimensions or more; one dimension: a column) as the text
  /// file the option takes: rows of the last axis's length, every number in 17 significant
  /// digits (exact for float64).
  std::string file_of(const std::string& option, const py::handle& array) {
    if (array_folder.empty()) {
      py::module_ tempfile = py::module_::import("tempfile");
      array_folder = tempfile.attr("mkdtemp")("prefix"_a = "mfattn-arrays-").cast<std::string>();
    }
    const std::filesystem::path path = array_folder / (option + ".txt");
    py::module_ numpy = py::module_::import("numpy");
    py::object values = numpy.attr("asarray")(array, "dtype"_a = "float64");
    const int columns = py::len(values.attr("shape")) >= 2 ? values.attr("shape")[py::int_(-1)].cast<int>() : 1;
    numpy.attr("savetxt")(path.string(), values.attr("reshape")(-1, columns), "fmt"_a = "%.17g");
    return path.string();
  }
};

/// A keyword's value as the command line's words: True a switch, False and None nothing,
/// lists and one-dimensional arrays joined by commas, an array of two dimensions or more (a
/// matrix for q=, k=, v=, rows for init_file=, blocks for generators=) a text file of its rows,
/// floats in Python's shortest round-trip form.
/// Whether the run option --name takes a value (it is not a switch such as --overwrite).
/// Options outside the run table (meanfield's own) are not known here and pass.
bool takes_a_value(const std::string& name) {
  static RunConfig unused;
  static const boost::program_options::options_description table = run_options(unused);
  const boost::program_options::option_description* option = table.find_nothrow(name, false);
  return option != nullptr && option->semantic()->max_tokens() > 0;
}

void option_words(const std::string& key, const py::handle& value, OptionWords& out) {
  std::vector<std::string>& words = out.words;
  std::string name = key;
  for (char& c : name)
    if (c == '_') c = '-';
  if (value.is_none()) return;
  // NumPy scalars (numpy.bool_, numpy.float64, ...) as their Python values.
  if (py::hasattr(value, "tolist") && py::hasattr(value, "ndim") && value.attr("ndim").cast<int>() == 0)
    return option_words(key, value.attr("tolist")(), out);
  // A matrix or table goes to a file, and so does a 1-D array for an option that reads a
  // column of numbers from a file (any other 1-D array is a list: perturbation=np.array([k,
  // eps]) is "k,eps").
  if (py::hasattr(value, "ndim") && py::hasattr(value, "shape") &&
      (value.attr("ndim").cast<int>() >= 2 ||
       (value.attr("ndim").cast<int>() == 1 && (name == "positions" || name == "init-density")))) {
    words.push_back("--" + name);
    words.push_back(out.file_of(name, value));
    return;
  }
  if (py::isinstance<py::bool_>(value)) {
    // True is a switch's "given"; an option that takes a value would otherwise swallow the
    // next option as its value (heads=True read the call's own out= as heads' value).
    if (takes_a_value(name))
      throw py::value_error(key + "=" + (value.cast<bool>() ? "True" : "False") +
                            ": takes a value, not True or False (those are for switches such as overwrite=True)");
    if (value.cast<bool>()) words.push_back("--" + name);
    return;
  }
  words.push_back("--" + name);
  if (py::isinstance<py::str>(value)) {
    words.push_back(value.cast<std::string>());
  } else if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value) ||
             py::hasattr(value, "tolist")) {
    // An array (0-d ones were taken above) or a sequence: its items comma-joined.
    py::object items = py::hasattr(value, "tolist") ? value.attr("tolist")() : py::reinterpret_borrow<py::object>(value);
    std::string joined;
    for (const py::handle item : items) joined += (joined.empty() ? "" : ",") + py::str(item).cast<std::string>();
    words.push_back(joined);
  } else if (py::isinstance<py::float_>(value)) {
    // The shortest text that reads back as the same double (Python's repr writes the same).
    words.push_back(format_number(value.cast<double>()));
  } else {
    words.push_back(py::str(value).cast<std::string>());
  }
}

OptionWords words_of(const py::kwargs& options) {
  OptionWords words;
  for (const auto& [key, value] : options) option_words(key.cast<std::string>(), value, words);
  return words;
}

/// parse_run_arguments with UsageError as ValueError (the CLI's message, without "mfattn run: ").
/// A message of the command line's as Python says it: an option "--aux-factor" is the keyword
/// "aux_factor" ("--kernel softmax" is "kernel=softmax"), and "--help lists every option" is
/// "mfattn.options() lists every option".
std::string in_keywords(std::string message) {
  const std::string help = "--help lists every option";
  for (std::size_t at = 0; (at = message.find(help, at)) != std::string::npos;)
    message.replace(at, help.size(), "mfattn.options() lists every option");
  std::string said;
  for (std::size_t k = 0; k < message.size(); ++k) {
    const bool starts = message.compare(k, 2, "--") == 0 && k + 2 < message.size() &&
                        std::islower(static_cast<unsigned char>(message[k + 2])) &&
                        (k == 0 || !std::isalnum(static_cast<unsigned char>(message[k - 1])));
    if (!starts) {
      said += message[k];
      continue;
    }
    std::size_t end = k + 2;
    while (end < message.size() && (std::islower(static_cast<unsigned char>(message[end])) ||
                                    std::isdigit(static_cast<unsigned char>(message[end])) || message[end] == '-'))
      ++end;
    std::string keyword = message.substr(k + 2, end - k - 2);
    for (char& c : keyword)
      if (c == '-') c = '_';
    said += keyword;
    // "--kernel softmax: ..." reads "kernel=softmax: ..."; "--heads: ..." reads "heads: ...".
    if (end + 1 < message.size() && message[end] == ' ' && message[end + 1] != '(') {
      said += "=";
      ++end;
    }
    k = end - 1;
  }
  return said;
}

RunConfig parse(const std::vector<std::string>& words, std::shared_ptr<const WeightsFile> weights = nullptr) {
  try {
    return parse_run_arguments(words, std::move(weights));
  } catch (const UsageError& error) {
    throw py::value_error(in_keywords(error.what()));
  }
}

/// mfattn.options(): every option of `mfattn run` from its one table, in the --help order.
py::dict run_option_table() {
  RunConfig unused;
  const boost::program_options::options_description table = run_options(unused);
  py::dict options;
  for (const auto& option : table.options()) {
    std::string keyword = option->long_name();
    for (char& c : keyword)
      if (c == '-') c = '_';
    // format_parameter() is "arg (=64)" for a value with a default, "arg" without one, ""
    // for a switch.
    const std::string shown = option->format_parameter();
    py::object value = py::none();
    if (const auto at = shown.find("(="); at != std::string::npos)
      value = py::str(shown.substr(at + 2, shown.size() - at - 3));
    else if (shown.empty())
      value = py::str("off (a switch: True turns it on)");
    options[py::str(keyword)] =
        py::dict("option"_a = "--" + option->long_name(), "default"_a = value, "help"_a = option->description());
  }
  return options;
}

/// "Keywords:" and one line per option of the run's table ("  beta=1: inverse temperature ..."),
/// appended to help(mfattn.run) and help(mfattn.Model) from the same table as --help, so that
/// the docstrings never list an option the parser lacks.
std::string keyword_listing() {
  RunConfig unused;
  const boost::program_options::options_description table = run_options(unused);
  std::string text =
      "\n\nKeywords (each option of `mfattn run`, - written _; mfattn.options() has them as a dict):\n";
  for (const auto& option : table.options()) {
    std::string keyword = option->long_name();
    for (char& c : keyword)
      if (c == '-') c = '_';
    const std::string shown = option->format_parameter();
    std::string value;
    if (const auto at = shown.find("(="); at != std::string::npos)
      value = "=" + shown.substr(at + 2, shown.size() - at - 3);
    else if (shown.empty()) value = "=False";
    text += "  " + keyword + value + ": " + option->description() + "\n";
  }
  return text;
}

/// How far from 1 a row's norm may be for a placement on the sphere (a row normalised in
/// float32 is within 1e-7 of it).
constexpr double kUnitNormTolerance = 1e-6;

/// x as a C-contiguous float64 array of shape (n, d) or (R, n, d) for this model: copied once
/// if it is not; ValueError for another shape, a non-numeric dtype, a non-finite number or,
/// for the placements on the sphere (post, ngpt), a row whose norm is not 1 within
/// kUnitNormTolerance.
py::array_t<double, py::array::c_style> checked_positions(const py::handle& x, const Model& model,
                                                          std::size_t& replicas) {
  py::array array = py::array::ensure(x);
  if (!array) throw py::type_error("x: expected an array of numbers of shape (n, d) or (R, n, d)");
  if (array.dtype().kind() != 'f' && array.dtype().kind() != 'i' && array.dtype().kind() != 'u')
    throw py::type_error("x: dtype " + py::str(array.dtype()).cast<std::string>() +
                         " is not a real number type (float64 expected)");
  auto values = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(array);
  const std::string expected = "(" + std::to_string(model.n) + ", " + std::to_string(model.d) + ") or (R, " +
                               std::to_string(model.n) + ", " + std::to_string(model.d) + ")";
  std::string shape = "(";
  for (py::ssize_t a = 0; a < values.ndim(); ++a) shape += (a ? ", " : "") + std::to_string(values.shape(a));
  shape += values.ndim() == 1 ? ",)" : ")";
  if (values.ndim() != 2 && values.ndim() != 3)
    throw py::value_error("x: shape " + shape + "; expected " + expected);
  const py::ssize_t rows = values.shape(values.ndim() - 2), columns = values.shape(values.ndim() - 1);
  if (std::size_t(rows) != model.n || std::size_t(columns) != model.d)
    throw py::value_error("x: shape " + shape + "; expected " + expected);
  replicas = values.ndim() == 3 ? std::size_t(values.shape(0)) : 1;
  if (model.matrices.size() > 1 && replicas != model.matrices.size())
    throw py::value_error("x: " + std::to_string(replicas) + " replicas, but --matrices per-replica drew " +
                          std::to_string(model.matrices.size()) + " sets of Q, K, V");
  const double* data = values.data();
  for (py::ssize_t e = 0; e < values.size(); ++e)
    if (!std::isfinite(data[e]))
      throw py::value_error("x: element " + std::to_string(e) + " is " + std::to_string(data[e]) +
                            " (every position must be finite)");
  // The states of post and ngpt are on the unit sphere: a row off it would give a field of no
  // state the model has, so it is refused rather than normalised behind the caller's back.
  // pre, peri and none (docs/model.md section 2c) live in R^d.
  if (placement_on_sphere(model.placement))
    for (std::size_t row = 0; row < replicas * model.n; ++row) {
      double norm2 = 0.0;
      for (std::size_t c = 0; c < model.d; ++c) norm2 += data[row * model.d + c] * data[row * model.d + c];
      if (std::abs(std::sqrt(norm2) - 1.0) > kUnitNormTolerance) {
        std::ostringstream where;
        where.precision(17);
        where << "x: row " << row % model.n;
        if (values.ndim() == 3) where << " of replica " << row / model.n;
        where << " has norm " << std::sqrt(norm2) << std::setprecision(3)
              << "; the state is on the unit sphere (within " << kUnitNormTolerance
              << " of norm 1): pass x / numpy.linalg.norm(x, axis=-1, keepdims=True)";
        throw py::value_error(where.str());
      }
    }
  return values;
}

/// A call's `threads`: a Python int in [1, kMaxThreads] (the CLI's --threads bound), else
/// TypeError (2.5, "2", True) or ValueError (0, 10**6), as Python's own functions do.
int thread_count(const py::object& threads) {
  // Integers are what operator.index accepts (int, numpy.int64); bool is one only by accident.
  if (!PyIndex_Check(threads.ptr()) || py::isinstance<py::bool_>(threads))
    throw py::type_error("threads: expected an int, got " + py::str(py::type::of(threads).attr("__name__")).cast<std::string>() +
                         " " + py::repr(threads).cast<std::string>());
  const py::int_ value = py::reinterpret_steal<py::int_>(PyNumber_Index(threads.ptr()));
  if (!value) throw py::error_already_set();
  const long long count = PyLong_AsLongLong(value.ptr());
  if (PyErr_Occurred()) PyErr_Clear();  // beyond long long: out of range below
  if (count < 1 || count > kMaxThreads || value > py::int_(kMaxThreads))
    throw py::value_error("threads: " + py::repr(threads).cast<std::string>() + " (must be an integer in [1, " +
                          std::to_string(kMaxThreads) + "])");
  return static_cast<int>(count);
}

/// Starts an OpenMP team of `threads` the first time a call asks for more threads than any
/// before it (start_thread_team): libgomp ends the whole process, interpreter included, when
/// it cannot create a thread, so a process limit is met here, as RuntimeError (what Python's
/// own threading raises when it cannot start a thread).
void ensure_thread_team(int threads) {
  static std::mutex mutex;
  static int largest_started = 1;
  const std::lock_guard<std::mutex> lock(mutex);
  if (threads <= largest_started) return;
  try {
    start_thread_team(threads);
  } catch (const UsageError& error) {
    // The message names the command line's --threads; here the keyword is threads=.
    std::string message = error.what();
    if (message.rfind("--threads ", 0) == 0) message.replace(0, 10, "threads=");
    raise_python(PyExc_RuntimeError, message);
  }
  largest_started = threads;
}

/// What a call that ran without the GIL threw, raised as Python's exception once it holds the
/// GIL again: a refusal (UsageError, BackendUnavailable) as ValueError in keywords, a numerical
/// failure as mfattn.NumericalError, anything else as RuntimeError.
struct CallFailure {
  PyObject* type = nullptr;
  std::string message;
  template <class Body>
  static CallFailure of(Body&& body) {
    try {
      body();
    } catch (const UsageError& error) {
      return {PyExc_ValueError, in_keywords(error.what())};
    } catch (const BackendUnavailable& error) {
      return {PyExc_ValueError, in_keywords(error.what())};
    } catch (const NumericalError& error) {
      return {numerical_error_type, error.what()};
    } catch (const std::exception& error) {
      return {PyExc_RuntimeError, error.what()};
    }
    return {};
  }
  void raise() const {
    if (type) raise_python(type, message);
  }
};

/// weights= a dict (model.weights()'s layout), held in memory rather than written to a file
/// (null where weights= is not a dict); `rest` gets the other options.
std::shared_ptr<const WeightsFile> weights_in(const py::kwargs& options, py::kwargs& rest) {
  rest = options;
  if (!options.contains("weights") || !py::isinstance<py::dict>(options["weights"])) return nullptr;
  rest = py::kwargs();
  for (const auto& [key, value] : options)
    if (key.cast<std::string>() != "weights") rest[key] = value;
  return weights_from_dict(options["weights"],
                           options.contains("mlp_activation")
                               ? py::str(options["mlp_activation"]).cast<std::string>()
                               : "relu");
}

/// The words of a call's options, with "--weights <dict>" where weights= was a dict (the
/// parser then takes the weights held in memory).
std::vector<std::string> weights_words(const OptionWords& given,
                                       const std::shared_ptr<const WeightsFile>& weights) {
  std::vector<std::string> words = given.words;
  if (weights) {
    words.push_back("--weights");
    words.push_back("<dict>");
  }
  return words;
}

/// The most numbers Model.attention returns in one call: 2^27 (1 GiB of doubles).
constexpr double kMaxPlanNumbers = 134217728.0;

class PyModel {
 public:
  explicit PyModel(const py::kwargs& options) {
    // A Model writes no file: the options that name or treat its output belong to run().
    for (const char* output_option : {"out", "resume", "overwrite"})
      if (options.contains(output_option))
        throw py::value_error(std::string(output_option) + ": a Model writes no file; this option belongs to mfattn.run()");
    for (const auto& [key, value] : options) {
      const bool array = py::hasattr(value, "shape") && py::hasattr(value, "ndim") && value.attr("ndim").cast<int>() >= 1;
      given_ += (given_.empty() ? "" : ", ") + key.cast<std::string>() + "=" +
                (array                        ? "<array " + py::str(value.attr("shape")).cast<std::string>() + ">"
                 : py::isinstance<py::dict>(value) ? "<dict of " + std::to_string(py::len(value)) + ">"
                                                   : py::repr(value).cast<std::string>());
    }
    py::kwargs rest;
    const std::shared_ptr<const WeightsFile> weights = weights_in(options, rest);
    options_ = py::dict(options);
    arrays_ = words_of(rest);  // kept: initial_state() may read an init_file= array's file
    std::vector<std::string> words = weights_words(arrays_, weights);
    words.push_back("--out");
    words.push_back("mfattn-model.h5");  // parse_run_arguments wants one; nothing is written
    cfg_ = parse(words, weights);
    try {
      model_ = build_model(cfg_);
    } catch (const UsageError& error) {
      throw py::value_error(error.what());
    }
    threads_ = resolve_threads(cfg_.threads);
    // The backend is made once here, so that an unavailable one raises at construction.
    release(acquire(threads_));
  }

  std::size_t n() const { return model_.n; }
  std::size_t d() const { return model_.d; }
  std::size_t replicas() const { return std::size_t(cfg_.replicas); }
  double beta() const { return model_.beta; }
  /// mfattn.Model(<the keywords given>) and, as a comment, the model it resolved to.
  std::string repr() const {
    std::ostringstream text;
    text << "mfattn.Model(" << given_ << ")  # " << cfg_.kernel << ", n = " << model_.n << ", d = " << model_.d
         << ", beta = " << model_.beta << ", " << cfg_.replicas << " replica" << (cfg_.replicas == 1 ? "" : "s")
         << ", backend " << cfg_.backend << "; every option: mfattn.options()";
    return text.str();
  }
  std::string backend_name() const { return cfg_.backend; }
  /// The keywords the model was made with (a copy): mfattn.Model(**model.options) makes it again.
  py::dict options() const { return py::dict(options_); }

  py::array_t<double> initial_state() const {
    State state;
    try {
      state = build_initial_state(cfg_, model_);
    } catch (const UsageError& error) {
      throw py::value_error(error.what());
    }
    return shaped(state.x, state.replicas, cfg_.replicas > 1);
  }

  py::array_t<double> velocity(const py::handle& x, py::object threads) {
    std::size_t replicas = 1;
    const auto values = checked_positions(x, model_, replicas);
    std::vector<double> velocity(values.size());
    evaluate(values.data(), replicas, velocity.data(), nullptr, threads);
    return shaped(velocity, replicas, values.ndim() == 3);
  }

  /// The VJP of the field at x (docs/model.md section 2e): {"x": x's cotangent, then every
  /// number's gradient under its key}.
  py::dict vjp(const py::handle& x, const py::handle& cotangent, py::object threads, const py::object& layer) {
    std::size_t replicas = 1;
    const auto values = checked_positions(x, model_, replicas);
    const auto weights = checked_like("cotangent", cotangent, values);
    std::optional<Model> layered;
    if (!layer.is_none()) layered = layer_model(layer);
    const Model& model = layered ? *layered : model_;
    FieldNumbers gradient = zero_numbers(model);
    std::vector<double> x_bar(values.size());
    differentiate(model, replicas, threads, [&](Dynamics& field) {
      field.vjp(values.data(), weights.data(), x_bar.data(), gradient);
    });
    py::dict out;
    out["x"] = shaped(x_bar, replicas, values.ndim() == 3);
    for (const auto& [key, value] : numbers_dict(model, gradient)) out[key] = value;
    return out;
  }

  /// The JVP of the field at x along tangent (x's shape) and weight_tangents (some of vjp's
  /// keys; the others 0).
  py::array_t<double> jvp(const py::handle& x, const py::handle& tangent, const py::object& weight_tangents,
                          const py::object& layer) {
    std::size_t replicas = 1;
    const auto values = checked_positions(x, model_, replicas);
    const auto direction = checked_like("tangent", tangent, values);
    std::optional<Model> layered;
    if (!layer.is_none()) layered = layer_model(layer);
    const Model& model = layered ? *layered : model_;
    FieldNumbers numbers;
    const bool with_numbers = !weight_tangents.is_none();
    if (with_numbers) numbers = numbers_from_dict(model, weight_tangents, "weight_tangents");
    std::vector<double> v_dot(values.size());
    differentiate(model, replicas, py::none(), [&](Dynamics& field) {
      field.jvp(values.data(), direction.data(), with_numbers ? &numbers : nullptr, v_dot.data());
    });
    return shaped(v_dot, replicas, values.ndim() == 3);
  }

  /// The weights ("attention/...", "mlp/...") of one layer, or of every layer (a leading
  /// layer axis where the model has several).
  py::dict weights(const py::object& layer) const {
    const std::size_t layers = layer_count();
    if (!layer.is_none() || layers == 1) {
      const Model model = layer_model(layer);
      return weight_arrays(model);
    }
    py::dict stacked;
    std::vector<py::dict> each;
    for (std::size_t l = 0; l < layers; ++l) each.push_back(weight_arrays(layer_model(py::int_(l))));
    const py::module_ numpy = py::module_::import("numpy");
    for (const auto& [key, value] : each.front()) {
      py::list parts;
      for (const py::dict& one : each) parts.append(one[key]);
      stacked[key] = numpy.attr("stack")(parts);
    }
    return stacked;
  }

  /// The normalised attention plans at x (docs/python.md, "Model.attention").
  py::array_t<double> attention(const py::handle& x, const py::object& head, std::int64_t replica) {
    std::size_t replicas = 1;
    const auto values = checked_positions(x, model_, replicas);
    if (replica < 0 || std::size_t(replica) >= replicas)
      throw py::value_error("replica: " + std::to_string(replica) + ": x holds " +
                            std::to_string(replicas) + " replica" + (replicas == 1 ? "" : "s") +
                            " (accepted: 0 to " + std::to_string(replicas - 1) + ")");
    if (cfg_.choices.aux_factor.changes_sign)
      throw py::value_error(
          "aux_factor=" + cfg_.aux_factor +
          ": its weights change sign, so a row of weights is no probability: no plan to return");
    const std::size_t heads = model_.matrices_of(std::size_t(replica)).heads.size();
    std::size_t first = 0, count = heads;
    if (!head.is_none()) {
      const auto h = head.cast<std::int64_t>();
      if (h < 0 || std::size_t(h) >= heads)
        throw py::value_error("head: " + std::to_string(h) + ": the model has " +
                              std::to_string(heads) + " head" + (heads == 1 ? "" : "s") +
                              " (accepted: 0 to " + std::to_string(heads - 1) +
                              ", or None for every head)");
      first = std::size_t(h);
      count = 1;
    }
    const std::size_t n = model_.n, sources = n + model_.prefix_count();
    const double numbers = double(count) * double(n) * double(sources);
    if (numbers > kMaxPlanNumbers)
      throw py::value_error(
          "attention: " + std::to_string(count) + " x " + std::to_string(n) + " x " +
          std::to_string(sources) +
          " weights exceed the 2^27 numbers (1 GiB) a call returns; take "
          "one head (head=h), or the statistics: observables=\"default+attention\"");
    const std::size_t size = n * model_.d;
    std::vector<double> read(values.data() + std::size_t(replica) * size,
                             values.data() + (std::size_t(replica) + 1) * size);
    if (placement_reads_directions(model_.placement)) take_directions(n, model_.d, read.data());
    std::vector<double> plans(count * n * sources);
    {
      py::gil_scoped_release released;
      for (std::size_t h = 0; h < count; ++h)
        attention_plan(model_, read.data(), std::size_t(replica), first + h,
                       plans.data() + h * n * sources);
    }
    std::vector<py::ssize_t> shape = {py::ssize_t(n), py::ssize_t(sources)};
    if (head.is_none()) shape.insert(shape.begin(), py::ssize_t(count));
    return py::array_t<double>(shape, plans.data());
  }

  py::object energy(const py::handle& x, py::object threads) {
    std::size_t replicas = 1;
    const auto values = checked_positions(x, model_, replicas);
    std::vector<double> velocity(values.size()), sums(replicas * model_.n);
    evaluate(values.data(), replicas, velocity.data(), sums.data(), threads);
    std::vector<double> energies(replicas);
    // The energy of the states the layer read: the directions for pre and peri.
    std::vector<double> read(values.data(), values.data() + values.size());
    if (placement_reads_directions(model_.placement)) take_directions(replicas * model_.n, model_.d, read.data());
    for (std::size_t r = 0; r < replicas; ++r)
      energies[r] = energy_from_weight_sums(model_, read.data() + r * model_.n * model_.d,
                                            sums.data() + r * model_.n, r);
    if (values.ndim() == 2) return py::float_(energies[0]);
    return py::array_t<double>(py::ssize_t(replicas), energies.data());
  }

 private:
  struct Pooled {
    int threads;
    std::unique_ptr<Backend> backend;
    /// The derivatives' field on `backend` (made at the first VJP or JVP of the model itself):
    /// it and the backend keep their arrays from call to call.
    std::unique_ptr<Dynamics> derivatives;
  };

  /// A backend for `threads` threads that no other call is using.
  Pooled acquire(int threads) {
    {
      const std::lock_guard<std::mutex> lock(pool_mutex_);
      for (auto it = pool_.begin(); it != pool_.end(); ++it)
        if (it->threads == threads) {
          Pooled found = std::move(*it);
          pool_.erase(it);
          return found;
        }
    }
    try {
      return {threads, make_backend(cfg_.backend, model_, backend_options(cfg_, threads)), nullptr};
    } catch (const BackendUnavailable& error) {
      throw py::value_error(error.what());
    }
  }
  void release(Pooled pooled) {
    const std::lock_guard<std::mutex> lock(pool_mutex_);
    pool_.push_back(std::move(pooled));
  }

  void evaluate(const double* x, std::size_t replicas, double* velocity, double* sums, const py::object& threads) {
    const int count = threads.is_none() ? threads_ : thread_count(threads);
    ensure_thread_team(count);
    Pooled pooled = acquire(count);
    std::string failure;
    bool numerical = false;
    {
      py::gil_scoped_release released;
      last_call_released_gil = PyGILState_Check() == 0;
      try {
        if (model_.placement == Placement::Post) {
          pooled.backend->evaluate(replicas, x, FieldOutputs{velocity, sums});
        } else {
          // Another placement (docs/model.md section 2c): the run's own field, through Dynamics.
          Dynamics dynamics(model_, *pooled.backend, replicas);
          dynamics.velocity(x, velocity, sums);
        }
      } catch (const NumericalError& error) {
        failure = error.what();
        numerical = true;
      } catch (const std::exception& error) {
        failure = error.what();
      }
    }
    release(std::move(pooled));
    if (numerical) raise_python(numerical_error_type, failure);
    if (!failure.empty()) throw std::runtime_error(failure);
  }

  /// The layers of the model (a --weights file's with --layer-time, --regen-period's draws).
  std::size_t layer_count() const { return layer_start_times(cfg_).size(); }

  /// The model of layer `layer` (None or 0: the model itself), ValueError out of range.
  Model layer_model(const py::object& layer) const {
    if (layer.is_none()) return model_;
    if (!PyIndex_Check(layer.ptr()) || py::isinstance<py::bool_>(layer))
      throw py::type_error("layer: expected an int, got " + py::repr(layer).cast<std::string>());
    const long long index = layer.cast<long long>();
    const std::size_t layers = layer_count();
    if (index < 0 || std::size_t(index) >= layers)
      throw py::value_error("layer: " + std::to_string(index) + " (this model has " + std::to_string(layers) +
                            " layer" + (layers == 1 ? "" : "s") + ": 0 to " + std::to_string(layers - 1) + ")");
    Model model = model_;
    if (index > 0) model.matrices = layer_matrices(cfg_, std::size_t(index));
    return model;
  }

  /// The weight keys of numbers_dict at the model's values.
  static py::dict weight_arrays(const Model& model) {
    py::dict all = numbers_dict(model, model_numbers(model)), out;
    for (const auto& [key, value] : all) {
      const std::string name = key.cast<std::string>();
      if (name.rfind("attention/", 0) == 0 || name.rfind("mlp/", 0) == 0) out[key] = value;
    }
    return out;
  }

  /// An array of x's shape beside x (a cotangent or a tangent): TypeError for a non-real
  /// dtype, ValueError naming the shape or a non-finite element.
  static py::array_t<double, py::array::c_style> checked_like(const char* name, const py::handle& given,
                                                              const py::array_t<double, py::array::c_style>& x) {
    const auto values = real_array(given, name);
    auto text = [](const py::array& a) { return py::str(py::tuple(a.attr("shape"))).cast<std::string>(); };
    if (values.ndim() != x.ndim() || !std::equal(x.shape(), x.shape() + x.ndim(), values.shape()))
      throw py::value_error(std::string(name) + ": shape " + text(values) + "; expected x's shape " + text(x));
    for (py::ssize_t e = 0; e < values.size(); ++e)
      if (!std::isfinite(values.data()[e]))
        throw py::value_error(std::string(name) + ": element " + std::to_string(e) + " is not finite");
    return values;
  }

  /// Runs body on the field of `model` (a backend of its own, the GIL released); the
  /// derivatives' refusals raise ValueError, a weight's overflow mfattn.NumericalError.
  template <class Body>
  void differentiate(const Model& model, std::size_t replicas, const py::object& threads, Body&& body) {
    const int count = threads.is_none() ? threads_ : thread_count(threads);
    ensure_thread_team(count);
    // The model itself: a pooled backend and its field, which keep their arrays between calls.
    // Another layer's: a backend of its own for this call.
    const bool pooled_model = &model == &model_;
    Pooled pooled = pooled_model ? acquire(count) : Pooled{count, nullptr, nullptr};
    CallFailure failure;
    {
      py::gil_scoped_release released;
      failure = CallFailure::of([&] {
        if (pooled_model) {
          if (!pooled.derivatives || pooled.derivatives->replicas() != replicas)
            pooled.derivatives = std::make_unique<Dynamics>(model_, *pooled.backend, replicas);
          body(*pooled.derivatives);
        } else {
          const std::unique_ptr<Backend> backend = make_backend(cfg_.backend, model,
                                                                backend_options(cfg_, count));
          Dynamics field(model, *backend, replicas);
          body(field);
        }
      });
    }
    if (pooled_model) release(std::move(pooled));
    failure.raise();
  }

  /// values as an array (R, n, d) when stacked, else (n, d).
  py::array_t<double> shaped(const std::vector<double>& values, std::size_t replicas, bool stacked) const {
    std::vector<py::ssize_t> shape;
    if (stacked) shape.push_back(py::ssize_t(replicas));
    shape.push_back(py::ssize_t(model_.n));
    shape.push_back(py::ssize_t(model_.d));
    py::array_t<double> out(shape);
    std::copy(values.begin(), values.end(), out.mutable_data());
    return out;
  }

  std::string given_;  // the keywords as given, for repr
  py::dict options_;   // the keywords as given, for Model.options
  OptionWords arrays_;
  RunConfig cfg_;
  Model model_;
  int threads_ = 1;
  std::mutex pool_mutex_;
  std::vector<Pooled> pool_;
};

/// The file at `path` as mfattn.io.load reads it (a Trajectory or a Density): the package's
/// loader, imported as any module is (the package's __init__ has imported it already).
py::object load_file(const std::filesystem::path& path) {
  return py::module_::import("mfattn.io").attr("load")(path.string());
}

/// Raises the Python error of a run's (or a meanfield solve's) exit status; `prefix` is the
/// command's own "mfattn run: " that the log's lines carry.
[[noreturn]] void raise_for(int status, const std::string& log, const std::string& prefix = "mfattn run: ") {
  std::string message = log;
  while (!message.empty() && message.back() == '\n') message.pop_back();
  for (std::size_t at = 0; (at = message.find(prefix, at)) != std::string::npos;) message.erase(at, prefix.size());
  if (status == kExitUsage) raise_python(PyExc_ValueError, in_keywords(message));
  if (status == kExitNumerical) raise_python(numerical_error_type, message);
  if (status == kExitIo) raise_python(PyExc_OSError, message);
  if (status == 128 + 2 || status == kExitStoppedByCaller) raise_python(PyExc_KeyboardInterrupt, message);
  throw std::runtime_error(message.empty() ? prefix + "exit status " + std::to_string(status) : message);
}

/// Where run() and meanfield() write: `out`, or (out None) a file in a private folder of the
/// system's temporary directory, which goes whatever ends the call (the file is loaded first).
struct OutputFile {
  std::filesystem::path directory, path;
  OutputFile(const py::object& out, const char* prefix, const char* name) {
    if (out.is_none()) {
      py::module_ tempfile = py::module_::import("tempfile");
      directory = tempfile.attr("mkdtemp")("prefix"_a = prefix).cast<std::string>();
      path = directory / name;
    } else {
      path = py::str(out).cast<std::string>();
    }
  }
  ~OutputFile() {
    std::error_code ignored;
    if (!directory.empty()) std::filesystem::remove_all(directory, ignored);
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
};

py::object run(py::object out, py::object progress, const py::kwargs& options) {
  py::kwargs rest;
  const std::shared_ptr<const WeightsFile> weights = weights_in(options, rest);
  const OptionWords given = words_of(rest);
  std::vector<std::string> words = weights_words(given, weights);
  for (const char* own : {"out", "progress"})
    if (options.contains(own)) throw py::value_error(std::string(own) + ": given twice");
  const OutputFile output(out, "mfattn-run-", "run.h5");
  const std::filesystem::path& path = output.path;
  words.push_back("--out");
  words.push_back(path.string());
  // run() is always quiet (its progress reaches Python through `progress`): quiet=True is
  // accepted, and never given twice.
  if (std::find(words.begin(), words.end(), "--quiet") == words.end()) words.push_back("--quiet");
  RunConfig cfg = parse(words, weights);
  // /parameters' command_line: the options as the command line would take them.
  cfg.command_line = "mfattn.run: mfattn run";
  for (const std::string& word : words) cfg.command_line += " " + word;
  RunHooks hooks;
  py::object raised;  // an exception the callback raised, raised again after the run
  if (!progress.is_none())
    hooks.progress = [&](double time, std::int64_t step) {
      py::gil_scoped_acquire acquired;
      try {
        const py::object answer = progress(time, step);
        return answer.is_none() || answer.cast<bool>();
      } catch (py::error_already_set& error) {
        raised = py::reinterpret_borrow<py::object>(error.value());
        return false;
      }
    };
  std::ostringstream log;
  int status = 0;
  {
    py::gil_scoped_release released;
    status = run_simulation(cfg, log, hooks);
  }
  if (raised) {
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(raised.ptr())), raised.ptr());
    throw py::error_already_set();
  }
  if (status != kExitOk) raise_for(status, log.str());
  py::object trajectory = load_file(path);
  if (!output.directory.empty()) trajectory.attr("path") = py::none();
  return trajectory;
}

/// An array argument of real, finite numbers as a flat vector (ValueError or TypeError naming
/// `what`).
std::vector<double> finite_numbers(const py::handle& value, const std::string& what) {
  const auto values = real_array(value, what);
  for (py::ssize_t e = 0; e < values.size(); ++e)
    if (!std::isfinite(values.data()[e]))
      throw py::value_error(what + ": not finite at flat index " + std::to_string(e));
  return std::vector<double>(values.data(), values.data() + values.size());
}

/// mfattn._core.gradient: gradient_of_run of the run these options describe (no file), for the
/// loss sum(cotangent * x(T)) or `loss` of x(T) against `target`, as (loss, {key: gradient},
/// x(T), plan); mfattn.gradient adds the run's Trajectory.
py::tuple gradient(const py::object& cotangent, const py::object& loss, const py::object& target,
                   const py::object& loss_gamma, const py::object& loss_epsilon,
                   const py::object& wrt, const py::object& checkpoints,
                   const py::object& loss_times, const py::kwargs& options) {
  if (options.contains("out"))
    throw py::value_error(
        "out: _core.gradient writes no file (mfattn.gradient's out is the run's)");
  py::kwargs rest;
  const std::shared_ptr<const WeightsFile> weights = weights_in(options, rest);
  const OptionWords given = words_of(rest);
  std::vector<std::string> words = weights_words(given, weights);
  // The parser asks for the run's output, which the gradient never writes: a name in an
  // existing folder.
  words.push_back("--out");
  words.push_back(
      (std::filesystem::temp_directory_path() / "mfattn-gradient-unwritten.h5").string());
  const RunConfig cfg = parse(words, weights);
  // The loss: a cotangent's, or a loss of x(T) against a target.
  if (cotangent.is_none() == loss.is_none())
    throw py::value_error(
        "cotangent, loss: give one (cotangent: the loss sum(cotangent * x(T)); loss: "
        "'tokens', 'mmd', 'w2', 'energy' or 'sinkhorn' of x(T) against target)");
  std::function<FinalLoss(const Dynamics&)> loss_of;
  if (!cotangent.is_none()) {
    if (!target.is_none() || !loss_gamma.is_none() || !loss_epsilon.is_none())
      throw py::value_error(
          "target, loss_gamma, loss_epsilon: they go with loss=, not with cotangent=");
    std::vector<double> c = finite_numbers(cotangent, "cotangent");
    loss_of = [c = std::move(c)](const Dynamics& field) {
      if (c.size() != field.size())
        throw std::invalid_argument("cotangent: " + std::to_string(c.size()) +
                                    " numbers; the run's state has " +
                                    std::to_string(field.size()));
      return linear_loss(c);
    };
  } else {
    RunLoss chosen;
    const std::string name = py::str(loss).cast<std::string>();
    const std::optional<RunLossKind> kind = kRunLossOption.preset(name);
    if (!kind) throw py::value_error("loss: " + name + " (" + kRunLossOption.accepted() + ")");
    chosen.kind = *kind;
    if (target.is_none()) throw py::value_error("target: loss=" + name + " takes a target array");
    chosen.target = finite_numbers(target, "target");
    // A distance of measures: (m, d) points for every replica, or (R, m, d) a set each.
    if (chosen.kind != RunLossKind::Tokens) {
      const auto shape = real_array(target, "target");
      if (shape.ndim() == 3) chosen.target_sets = std::size_t(shape.shape(0));
      else if (shape.ndim() != 2)
        throw py::value_error("target: " + std::to_string(shape.ndim()) + " axes; the " + name +
                              " loss takes (m, d) or (R, m, d)");
    }
    if (!loss_gamma.is_none()) {
      if (chosen.kind != RunLossKind::Mmd)
        throw py::value_error("loss_gamma: the mmd loss's; loss=" + name + " takes none");
      chosen.gamma = loss_gamma.cast<double>();
      if (!std::isfinite(chosen.gamma)) throw py::value_error("loss_gamma: not finite");
    }
    if (!loss_epsilon.is_none()) {
      if (chosen.kind != RunLossKind::Sinkhorn)
        throw py::value_error("loss_epsilon: the sinkhorn loss's; loss=" + name + " takes none");
      chosen.epsilon = loss_epsilon.cast<double>();
    }
    loss_of = [chosen](const Dynamics& field) { return final_loss(chosen, field); };
  }
  std::size_t stored = 0;
  if (!checkpoints.is_none()) {
    if (!PyIndex_Check(checkpoints.ptr()) || py::isinstance<py::bool_>(checkpoints) ||
        checkpoints.cast<long long>() < 1)
      throw py::value_error("checkpoints: " + py::repr(checkpoints).cast<std::string>() +
                            " (expected a whole number >= 1, or None for the default)");
    stored = checkpoints.cast<std::size_t>();
  }
  // wrt's names, checked against the model's keys once the run is set up (before any step).
  std::vector<std::string> wanted;
  const bool all_keys = wrt.is_none();
  if (!all_keys) {
    // One key alone is a list of one (not its letters).
    const py::list names = py::isinstance<py::str>(wrt) ? py::list(py::make_tuple(wrt))
                                                        : py::list(wrt);
    for (const py::handle key : names) wanted.push_back(py::str(key).cast<std::string>());
  }
  Model model;  // the run's, as set up
  auto checked_loss_of = [&](const Dynamics& field) {
    model = field.model();
    std::vector<std::string> keys = {"x0"};
    for (const NumberKey& key : number_keys(model)) keys.push_back(key.key);
    if (all_keys) wanted = keys;
    for (const std::string& name : wanted)
      if (std::find(keys.begin(), keys.end(), name) == keys.end()) {
        std::string accepted;
        for (const std::string& k : keys) accepted += (accepted.empty() ? "" : ", ") + k;
        throw std::invalid_argument("wrt: " + name + " is none of this model's keys (" + accepted +
                                    ")");
      }
    return loss_of(field);
  };
  std::vector<double> times;
  if (!loss_times.is_none()) times = finite_numbers(loss_times, "loss_times");
  RunGradient result;
  CallFailure failure;
  {
    py::gil_scoped_release released;
    failure = CallFailure::of(
        [&] { result = gradient_of_run(cfg, checked_loss_of, stored, times); });
  }
  failure.raise();
  // The state's shape: (n, d), or (R, n, d) with replicas.
  std::vector<py::ssize_t> shape = {py::ssize_t(model.n), py::ssize_t(model.d)};
  if (cfg.replicas > 1) shape.insert(shape.begin(), py::ssize_t(cfg.replicas));
  auto shaped = [&](const std::vector<double>& numbers) {
    py::array_t<double> out(shape);
    std::copy(numbers.begin(), numbers.end(), out.mutable_data());
    return out;
  };
  py::dict all = numbers_dict(model, result.numbers);
  // Layers in time: each matrix key's gradient with a leading layer axis, as the --weights
  // file's datasets.
  if (!result.layer_sets.empty()) {
    std::vector<py::dict> layers;
    for (const std::vector<LayerNumbers>& sets : result.layer_sets) {
      FieldNumbers numbers = result.numbers;
      numbers.sets = sets;
      layers.push_back(numbers_dict(model, numbers));
    }
    const py::module_ numpy = py::module_::import("numpy");
    for (const NumberKey& key : number_keys(model)) {
      if (key.key.rfind("attention/", 0) != 0 && key.key.rfind("mlp/", 0) != 0) continue;
      py::list stacked;
      for (const py::dict& layer : layers) stacked.append(layer[py::str(key.key)]);
      all[py::str(key.key)] = numpy.attr("stack")(stacked);
    }
  }
  py::dict out;
  for (const std::string& key : wanted)
    out[py::str(key)] = key == "x0" ? py::object(shaped(result.x0)) : all[py::str(key)];
  py::dict plan;
  plan["steps"] = result.plan.steps;
  plan["stored_states"] = result.plan.stored;
  plan["recomputed_steps"] = result.recomputed_steps;
  plan["step_sizes"] = py::array_t<double>(py::ssize_t(result.step_sizes.size()),
                                           result.step_sizes.data());
  return py::make_tuple(result.loss, out, shaped(result.final_state), plan);
}

/// mfattn._core.maruyama_noise: the standard normal draws xi that euler-maruyama's step `step`
/// takes for token i of replica r (before its projection on the tangent space), [steps, R, n,
/// d]: the counter-based stream (seed, Noise, r << 32 | i, step) of kernels::maruyama_step, so
/// that the noise of a run can be replayed outside it (a PyTorch test of its adjoint).
py::array_t<double> maruyama_noise(std::uint64_t seed, std::int64_t steps, std::int64_t replicas,
                                   std::int64_t n, std::int64_t d) {
  if (steps < 0 || replicas < 1 || n < 1 || d < 1)
    throw py::value_error("maruyama_noise: steps >= 0, replicas, n and d >= 1");
  py::array_t<double> out({steps, replicas, n, d});
  double* at = out.mutable_data();
  for (std::int64_t k = 0; k < steps; ++k)
    for (std::int64_t r = 0; r < replicas; ++r)
      for (std::int64_t i = 0; i < n; ++i, at += d)
        token_noise_draws(seed, std::uint64_t(r), std::uint64_t(i), std::uint64_t(k),
                          std::size_t(d), at);
  return out;
}

/// mfattn._core.common_noise: the shared increments sigma sqrt(h) dB of stochastic-heun's steps
/// [steps, R, d, d] for --common-noise sigma and --common-noise-kind kind (a run's draws, from
/// the stream (seed, CommonNoise, r, step)).
py::array_t<double> common_noise(std::uint64_t seed, std::int64_t steps, std::int64_t replicas,
                                 std::int64_t d, double sigma, double h, const std::string& kind) {
  if (steps < 0 || replicas < 1 || d < 1 || !(sigma >= 0) || !(h > 0))
    throw py::value_error("common_noise: steps >= 0, replicas and d >= 1, sigma >= 0, h > 0");
  const std::optional<CommonNoiseKind> law = kCommonNoiseKindOption.preset(kind);
  if (!law)
    throw py::value_error("common_noise: kind " + kind +
                          ": accepted: " + kCommonNoiseKindOption.names(", "));
  py::array_t<double> out({steps, replicas, d, d});
  double* at = out.mutable_data();
  for (std::int64_t k = 0; k < steps; ++k)
    for (std::int64_t r = 0; r < replicas; ++r, at += d * d)
      common_noise_increment(*law, sigma * std::sqrt(h), seed, std::uint64_t(r), std::uint64_t(k),
                             std::size_t(d), at);
  return out;
}

/// mfattn._core.write_states (mfattn.io.write is the interface): write_imported_states, the
/// command `mfattn import`'s own function. states [T, R, n, d]; parameters name -> int, float,
/// bool, str or a sequence of numbers. ValueError for what it refuses, FileExistsError for an
/// existing path without overwrite, OSError for a failed write. Returns the state space.
std::string write_states(const std::string& path, const py::handle& states, const py::object& times,
                         const py::object& presence, const py::object& prompt_id,
                         const py::object& sequence_position, const py::dict& parameters,
                         const std::string& source, double cluster_delta, bool deflate,
                         bool overwrite) {
  auto numbers = [](const py::handle& given) {
    auto array = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(given);
    if (!array) throw py::value_error("expected an array of numbers");
    return array;
  };
  auto vector_of = [&](const char* name, const py::object& given) {
    std::vector<double> values;
    if (given.is_none()) return values;
    py::array_t<double, py::array::c_style> array;
    try {
      array = numbers(given);
    } catch (const py::error_already_set&) {
      throw py::value_error(std::string(name) + ": expected a sequence of numbers");
    }
    if (array.ndim() != 1)
      throw py::value_error(std::string(name) + ": expected one axis, got " +
                            std::to_string(array.ndim()));
    values.assign(array.data(), array.data() + array.size());
    return values;
  };
  py::array_t<double, py::array::c_style> x;
  try {
    x = numbers(states);
  } catch (const py::error_already_set&) {
    throw py::value_error("positions: expected an array of numbers [T, n, d] or [T, R, n, d]");
  }
  if (x.ndim() != 4) throw py::value_error("positions: expected [T, R, n, d] here");
  ImportedStates s;
  s.frames = std::size_t(x.shape(0));
  s.replicas = std::size_t(x.shape(1));
  s.n = std::size_t(x.shape(2));
  s.d = std::size_t(x.shape(3));
  s.states.assign(x.data(), x.data() + x.size());
  s.times = vector_of("times", times);
  s.presence = vector_of("presence", presence);
  s.sequence_position = vector_of("sequence_position", sequence_position);
  for (double id : vector_of("prompt_id", prompt_id)) {
    if (id != std::floor(id) || std::fabs(id) > 2147483647.0)
      throw py::value_error("prompt_id: " + format_number(id) + " is not a 32-bit integer");
    s.prompt_id.push_back(static_cast<std::int32_t>(id));
  }
  for (const auto& [key, value] : parameters) {
    const std::string name = py::str(key).cast<std::string>();
    if (py::isinstance<py::bool_>(value)) {
      s.parameters.push_back({name, value.cast<bool>()});
    } else if (py::isinstance<py::int_>(value) ||
               py::isinstance(value, py::module_::import("numpy").attr("integer"))) {
      s.parameters.push_back({name, value.cast<std::int64_t>()});
    } else if (py::isinstance<py::float_>(value) ||
               py::isinstance(value, py::module_::import("numpy").attr("floating"))) {
      s.parameters.push_back({name, value.cast<double>()});
    } else if (py::isinstance<py::str>(value)) {
      s.parameters.push_back({name, value.cast<std::string>()});
    } else {
      std::vector<double> list;
      try {
        list = vector_of(name.c_str(), py::reinterpret_borrow<py::object>(value));
      } catch (const py::value_error&) {
        throw py::value_error(
            "parameters: '" + name +
            "': expected an int, a float, a bool, a str or a sequence of numbers");
      }
      s.parameters.push_back({name, list});
    }
  }
  s.source = source;
  s.cluster_delta = cluster_delta;
  s.deflate = deflate;
  try {
    py::gil_scoped_release released;
    // Ctrl-C ends the import as it ends mfattn.run: while the observables are computed, before
    // the file exists (KeyboardInterrupt); the interpreter's own handler is back afterwards.
    const ImportSignals signals;
    return write_imported_states(s, path, overwrite, signals.stop());
  } catch (const ImportInterrupted& stop) {
    raise_python(PyExc_KeyboardInterrupt,
                 "interrupted by " + signal_name(stop.signal) + "; nothing was written");
  } catch (const std::invalid_argument& error) {
    throw py::value_error(error.what());
  } catch (const OutputNotReplaceable& error) {
    throw py::value_error(error.what());
  } catch (const OutputExists& error) {
    raise_python(PyExc_FileExistsError, error.what());
  } catch (const IoError& error) {
    raise_python(PyExc_OSError, error.what());
  }
}

/// mfattn._core.analyze_json: `mfattn analyze FILE --json --replica R --min-decades D` (the
/// command's own functions), the JSON text; ValueError for a bad file or replica.
std::string analyze_json(const std::string& path, std::int64_t replica, double min_decades) {
  if (replica < 0) throw py::value_error("replica: " + std::to_string(replica) + ": must be >= 0");
  if (!(min_decades >= 0.0) || !std::isfinite(min_decades))
    throw py::value_error("min_decades: " + format_number(min_decades) +
                          ": expected a number of decades >= 0");
  std::ostringstream text;
  try {
    const Analysis analysis = analyze_file(path, std::size_t(replica));
    write_analysis_json(analysis, text, min_decades);
  } catch (const UsageError& error) {
    throw py::value_error(error.what());
  } catch (const IoError& error) {
    throw py::value_error(std::string(error.what()));
  }
  return text.str();
}

/// mfattn.meanfield: `mfattn meanfield` through run_meanfield (the CLI's own function) into out
/// or a temporary file, loaded as a Density. run_meanfield has no progress hook: `progress`
/// is accepted as None only. --compare (which prints distances instead of returning a
/// density) belongs to the command line.
py::object meanfield(py::object out, py::object progress, const py::kwargs& options) {
  for (const char* own : {"out", "progress"})
    if (options.contains(own)) throw py::value_error(std::string(own) + ": given twice");
  if (!progress.is_none())
    throw py::value_error("progress: mfattn.meanfield takes no progress callback (the solver has no hook "
                          "for one); leave it None");
  if (options.contains("compare") && !options["compare"].is_none())
    throw py::value_error("compare: mfattn.meanfield returns the density; the distances to a particle run "
                          "are the command line's (mfattn meanfield --compare RUN.h5)");
  const OptionWords given = words_of(options);
  std::vector<std::string> words = given.words;
  const OutputFile output(out, "mfattn-meanfield-", "density.h5");
  const std::filesystem::path& path = output.path;
  words.push_back("--out");
  words.push_back(path.string());
  if (std::find(words.begin(), words.end(), "--quiet") == words.end()) words.push_back("--quiet");
  MeanfieldConfig cfg;
  try {
    cfg = parse_meanfield_arguments(words);
  } catch (const UsageError& error) {
    throw py::value_error(in_keywords(error.what()));
  }
  cfg.command_line = "mfattn.meanfield: mfattn meanfield";
  for (const std::string& word : words) cfg.command_line += " " + word;
  std::ostringstream printed, log;
  int status = 0;
  {
    py::gil_scoped_release released;
    status = run_meanfield(cfg, printed, log);
  }
  if (status != kExitOk) raise_for(status, log.str(), "mfattn meanfield: ");
  py::object density = load_file(path);
  if (!output.directory.empty()) density.attr("path") = py::none();
  return density;
}

}  // namespace
}  // namespace mfattn::python

PYBIND11_MODULE(_core, module) {
  using namespace mfattn::python;
  using namespace pybind11::literals;
  module.doc() = "mfattn._core: the compiled engine of the package mfattn (docs/python.md)";
  module.attr("__version__") = mfattn::kVersion;
  numerical_error_type = PyErr_NewExceptionWithDoc(
      "mfattn.NumericalError", "a weight overflowed or the state diverged (the CLI's exit 3)",
      PyExc_ArithmeticError, nullptr);
  module.attr("NumericalError") = py::handle(numerical_error_type);
  py::class_<PyModel>(module, "Model",
                      R"doc(Model(**options): the field of `mfattn run` with these options.

Keywords are the options of `mfattn run` with '-' written '_' (aux_factor="distance"); every one,
with its default and what it accepts: mfattn.options(). True is a switch, a list or 1-D array a
comma list, an array of 2 or more dimensions a matrix or table (q=, k=, v=, init_file=, ...).
A bad value raises ValueError naming the keyword, the value and what is accepted.

    model = mfattn.Model(n=64, d=3, kernel="sa", beta=4, geometry="rope")
    x = model.initial_state()        # (n, d); (R, n, d) with replicas=R
    v = model.velocity(x)            # dx/dt
    e = model.energy(x)

docs/python.md has the whole surface.)doc")
      .def(py::init<const py::kwargs&>())
      .def("__repr__", &PyModel::repr)
      .def_property_readonly("n", &PyModel::n, "tokens that move (null tokens included)")
      .def_property_readonly("d", &PyModel::d, "the dimension of the space (tokens on S^{d-1})")
      .def_property_readonly("replicas", &PyModel::replicas, "replicas= (the initial state's)")
      .def_property_readonly("beta", &PyModel::beta, "the inverse temperature beta")
      .def_property_readonly("backend", &PyModel::backend_name,
                             "the backend that evaluates the field (backend=)")
      .def_property_readonly(
          "options", &PyModel::options,
          "the keywords the model was made with: mfattn.Model(**model.options) makes it again")
      .def(
          "initial_state", &PyModel::initial_state,
          "initial_state() -> array: the run's initial positions (init=, seed=, ...): (n, d), or (R, n, d) "
          "for replicas=R > 1")
      .def("velocity", &PyModel::velocity, "x"_a, "threads"_a = py::none(),
           R"doc(velocity(x, threads=None) -> array

dx/dt of the model at x, a new array of x's shape: x is (n, d) or (R, n, d), any real dtype.
For the placements on the sphere (normalization="post", the default, and "ngpt") every row
must have norm 1 within 1e-6, else ValueError naming the row and its norm; pre, peri and none
take states in R^d. threads: OpenMP threads of this call (default: the model's threads=).
Releases the GIL. Raises mfattn.NumericalError where a weight overflows.)doc")
      .def("vjp", &PyModel::vjp, "x"_a, "cotangent"_a, "threads"_a = py::none(),
           "layer"_a = py::none(),
           R"doc(vjp(x, cotangent, threads=None, layer=None) -> dict

The vector-Jacobian product of the field at x (docs/model.md section 2e): for the cotangent w
(x's shape) the gradient of <w, velocity(x)> with respect to x ("x") and to every number of
the model: "attention/query" [H, r, d], "attention/key", "attention/value" [H, rv, d],
"attention/output" [d, H rv] (the --weights file's layout; a leading replica axis for
matrices="per-replica"), "mlp/w1", "mlp/b1", "mlp/w2", "mlp/b2" (with a feed-forward term),
"beta", "prefix_init" [P, d] (with prefix tokens), "presence" [n] (0 for null tokens), and the
factor's numbers ("aux_lambda", ...). Replicas' gradients are summed. On the sphere the
x-gradient is the ambient one of the formula. layer: the layer whose weights act (default:
the first). Raises ValueError for a model the derivatives do not take.)doc")
      .def("jvp", &PyModel::jvp, "x"_a, "tangent"_a, "weight_tangents"_a = py::none(),
           "layer"_a = py::none(),
           R"doc(jvp(x, tangent, weight_tangents=None, layer=None) -> array

The Jacobian-vector product of the field at x along tangent (x's shape) and weight_tangents (a
dict with some of vjp's keys, the same shapes; the others are 0): an array of x's shape.)doc")
      .def("weights", &PyModel::weights, "layer"_a = py::none(), R"doc(weights(layer=None) -> dict

The weights in the --weights file's layout ("attention/query", ..., "mlp/b2"): of one layer,
or of every layer (a leading layer axis where the model has several).)doc")
      .def("attention", &PyModel::attention, "x"_a, "head"_a = py::none(), "replica"_a = 0,
           R"doc(attention(x, head=None, replica=0) -> array

The normalised attention plans at x, the plans whose entropy, largest weight and participation
observables="default+attention" records (docs/model.md section 6): P_ij = w_ij / sum_j w_ij
(SA's weights, USA's weights over their sum, Sinkhorn's plan of section 2d), receivers i the n
tokens, sources j the n tokens then the P prefix tokens. (H, n, n + P) for head=None, (n, n + P)
for one head; of replica `replica` of x ((n, d) or (R, n, d), the same checks as velocity),
through the model's first layer. Rows of zeros for null receivers and receivers that see no
source. Refused for a sign-changing factor, and above 2^27 numbers (1 GiB; take one head).
Releases the GIL.)doc")
      .def("energy", &PyModel::energy, "x"_a, "threads"_a = py::none(),
           R"doc(energy(x, threads=None)

E = 1 / (2 beta M^2) sum_ij p_i p_j m_ij c_ij exp(s_ij) of x (docs/model.md section 4), the
run's `energy` observable: a float for x of shape (n, d), an array of R floats for (R, n, d).
The same checks of x as velocity.)doc");
  // The docstring lives as long as the module (pybind11 keeps the pointer).
  static const std::string run_doc = std::string(
                                         R"doc(run(out=None, progress=None, **options) -> Trajectory

`mfattn run` with these options (the same keywords as Model; mfattn.options() lists them),
written to out (a path) or to a temporary file, and loaded as a Trajectory (times, positions,
observables, parameters; docs/python.md). The defaults are the command line's: rk4 at
dt=0.01, a frame every 0.1. progress(t, step) is called now and then; returning False stops
the run (KeyboardInterrupt). Bad options raise ValueError naming the keyword; a numerical
failure mfattn.NumericalError; a failed write OSError. Releases the GIL.)doc") +
                                     keyword_listing();
  module.def("run", &run, "out"_a = py::none(), "progress"_a = py::none(), run_doc.c_str());
  module.def(
      "maruyama_noise", &maruyama_noise, "seed"_a, "steps"_a, "replicas"_a, "n"_a, "d"_a,
      "maruyama_noise(seed, steps, replicas, n, d) -> array [steps, replicas, n, d]: the normal draws of "
      "euler-maruyama's steps (before their projection), as a run of that seed takes them.");
  module.def(
      "analyze_json", &analyze_json, "path"_a, "replica"_a = 0,
      "min_decades"_a = mfattn::kDefaultListedDecades,
      "analyze_json(path, replica=0, min_decades=0.05) -> str: `mfattn analyze PATH --json` of that replica "
      "(mfattn.analyze parses it).");
  module.def(
      "write_states", &write_states, "path"_a, "states"_a, "times"_a, "presence"_a, "prompt_id"_a,
      "sequence_position"_a, "parameters"_a, "source"_a, "cluster_delta"_a, "deflate"_a,
      "overwrite"_a,
      "write_states(...) -> str: mfattn.io.write's writer (write_imported_states); the state space.");
  module.def(
      "common_noise", &common_noise, "seed"_a, "steps"_a, "replicas"_a, "d"_a, "sigma"_a, "h"_a,
      "kind"_a = "symmetric",
      "common_noise(seed, steps, replicas, d, sigma, h, kind='symmetric') -> array [steps, replicas, d, d]: "
      "the shared increments sigma sqrt(h) dB of stochastic-heun's steps, as a run of that seed takes them.");
  module.def(
      "gradient", &gradient, "cotangent"_a = py::none(), "loss"_a = py::none(),
      "target"_a = py::none(), "loss_gamma"_a = py::none(), "loss_epsilon"_a = py::none(),
      "wrt"_a = py::none(), "checkpoints"_a = py::none(), "loss_times"_a = py::none(),
      R"doc(gradient(cotangent=None, loss=None, target=None, loss_gamma=None, loss_epsilon=None, wrt=None, checkpoints=None, loss_times=None, **options) -> (loss, dict, x_T, plan)

The discrete adjoint of the run these options describe (docs/model.md section 5b; mfattn.gradient
is the interface): the loss (sum(cotangent * x(T)), or loss='tokens', 'mmd', 'w2', 'energy' or 'sinkhorn' of x(T) against
target; summed over the frame times loss_times where given), the gradients of the keys in wrt
(None: "x0" and every number of Model.vjp's dict; the matrices' with a leading layer axis in a
run of layers in time), the final state and the checkpoint plan.)doc");
  module.def("meanfield", &meanfield, "out"_a = py::none(), "progress"_a = py::none(),
             R"doc(meanfield(out=None, progress=None, **options) -> Density

`mfattn meanfield` (the density equation of the same model; docs/meanfield.md) with these
options ('-' written '_'), to out or a temporary file, loaded as a Density. progress: None
only (the solver has no hook). Bad options raise ValueError naming the keyword.)doc");
  module.def("options", &run_option_table, R"doc(options() -> dict

Every option of `mfattn run` (and of Model and run), from the one option table behind the
command line's --help: keyword -> {"option": "--name", "default": the default as text (None
where there is none), "help": what it accepts}.

    for keyword, about in mfattn.options().items(): print(keyword, about["default"], about["help"]))doc");
  module.def("_last_call_released_gil", [] { return last_call_released_gil.load(); });
}
