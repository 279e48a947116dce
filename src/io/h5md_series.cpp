/// \file h5md_series.cpp
/// SeriesFile: the read-only time-series reader of series.hpp, through the HDF5 C API.
/// HDF5's automatic error printing is off during every call here; failures become IoError
/// "<path>: <what> (<HDF5's innermost reason>)".
#include "mfattn/io/series.hpp"

#include <hdf5.h>

#include "io/hdf5_support.hpp"
#include "mfattn/core/input_file.hpp"
#include "mfattn/core/number_text.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <utility>

namespace mfattn {
namespace {

using hdf5::Handle;
using hdf5::QuietHdf5Errors;
using hdf5::innermost_hdf5_error;


std::vector<hsize_t> extents(hid_t space) {
  const int rank = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> dims(static_cast<std::size_t>(std::max(rank, 0)));
  if (rank > 0) H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  return dims;
}

std::string group_of_replica(std::size_t replica) {
  return replica == 0 ? "/particles/tokens" : "/particles/tokens_r" + std::to_string(replica);
}

/// How a stored datatype reads in a message: "int32", "float32", "a compound type", ...
std::string type_text(hid_t type) {
  const std::string bits = std::to_string(8 * H5Tget_size(type));
  switch (H5Tget_class(type)) {
    case H5T_INTEGER: return (H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + bits;
    case H5T_FLOAT: return "float" + bits;
    case H5T_STRING: return "strings";
    case H5T_COMPOUND: return "a compound type (complex numbers?)";
    default: return "a type that is neither integer nor floating-point";
  }
}

}  // namespace

struct SeriesFile::Impl {
  std::string path;
  Handle file;
  std::size_t n = 0, d = 0, replicas = 1, frames = 0, position_frames = 0;
  std::string clock;  ///< the frame clock's group (hdf5::frame_clock_group)
  std::string save_positions;

  [[noreturn]] void fail(const std::string& what) const {
    std::string message = path + ": " + what;
    if (const std::string reason = innermost_hdf5_error(); !reason.empty())
      message += " (" + reason + ")";
    throw IoError(message);
  }
  [[noreturn]] void foreign(const std::string& why) const {
    throw NotMfattnFile(path + " is not an mfattn H5MD file: " + why);
  }

  bool exists(const std::string& object) const {
    // H5Lexists needs every parent to exist: check the path one component at a time.
    std::string prefix;
    std::size_t start = 1;
    while (start <= object.size()) {
      const std::size_t end = std::min(object.find('/', start), object.size());
      prefix = object.substr(0, end);
      if (H5Lexists(file.get(), prefix.c_str(), H5P_DEFAULT) <= 0) return false;
      start = end + 1;
    }
    return true;
  }

  /// The element type of dataset `name` is `kind` of 8 bytes (what the writer stores): a
  /// file that holds anything else was not written by mfattn, and reading it would convert
  /// (int32, float32), fail inside HDF5 (compound) or resume onto rows of another type.
  void require_type(const std::string& name, H5T_class_t kind) const {
    Handle set = dataset(name);
    Handle type(H5Dget_type(set.get()), H5Tclose);
    if (!type.valid()) fail("getting the type of " + name + " failed");
    if (H5Tget_class(type.get()) != kind || H5Tget_size(type.get()) != 8)
      foreign(name + " holds " + type_text(type.get()) + ", mfattn writes " +
              (kind == H5T_FLOAT ? "float64" : "int64"));
  }

  /// The file's layout as mfattn writes it, beyond the shapes the constructor checks: n and
  /// d positive and d as /parameters records it, every number of the kind and width the
  /// writer stores, and a frame clock whose times are finite and increasing. Every reader
  /// (info, analyze, --resume through describe_file) opens the file through here.
  void check_layout() const {
    if (n == 0 || d == 0)
      foreign("/particles/tokens/position/value is [T, " + std::to_string(n) + ", " +
              std::to_string(d) + "]: n and d must be positive");
    // /parameters n is the option, without null tokens; d is the positions' d.
    if (Handle attr = attribute("/parameters", "d"); attr.valid()) {  // files from before it lack it
      double recorded = 0.0;
      if (H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &recorded) < 0 || recorded != static_cast<double>(d))
        foreign("its positions have d = " + std::to_string(d) + " but /parameters records d = " +
                format_number(recorded));
    }
    for (std::size_t r = 0; r < replicas; ++r)
      require_type(group_of_replica(r) + "/position/value", H5T_FLOAT);
    for (const std::string& group : {std::string("/particles/tokens/position/"), clock}) {
      require_type(group + "step", H5T_INTEGER);
      require_type(group + "time", H5T_FLOAT);
    }
    for (const char* name : {"/run/step_size", "/run/checkpoint/x", "/run/checkpoint/time",
                             "/run/checkpoint/step_size"})
      if (exists(name)) require_type(name, H5T_FLOAT);
    for (const char* name : {"/run/checkpoint/step", "/run/checkpoint/frame"})
      if (exists(name)) require_type(name, H5T_INTEGER);
    if (exists("/observables")) {
      Handle group(H5Gopen2(file.get(), "/observables", H5P_DEFAULT), H5Gclose);
      std::vector<std::string> names;
      auto visit = [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
        static_cast<std::vector<std::string>*>(out)->emplace_back(name);
        return 0;
      };
      if (!group.valid() || H5Literate(group.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, visit, &names) < 0)
        fail("listing /observables failed");
      for (const std::string& name : names)
        if (exists("/observables/" + name + "/value")) require_type("/observables/" + name + "/value", H5T_FLOAT);
    }
    // A resumed run continues after the last frame's time, and the analyses take the times
    // as a clock: NaN or a step back in time is a damaged file, not a run.
    std::vector<double> clock_times = read_all<double>(clock + "time", H5T_NATIVE_DOUBLE);
    clock_times.resize(std::min(clock_times.size(), frames));
    for (std::size_t t = 0; t < clock_times.size(); ++t) {
      if (!std::isfinite(clock_times[t]))
        foreign(clock + "time of frame " + std::to_string(t) + " is " + format_number(clock_times[t]));
      if (t > 0 && !(clock_times[t] > clock_times[t - 1]))
        foreign(clock + "time decreases from " + format_number(clock_times[t - 1]) + " to " +
                format_number(clock_times[t]) + " at frame " + std::to_string(t));
    }
  }

  Handle dataset(const std::string& name) const {
    if (!exists(name)) foreign("it has no dataset " + name);
    Handle handle = hdf5::open_dataset(file.get(), name);
    if (!handle.valid()) fail("opening " + name + " failed");
    return handle;
  }

  std::vector<hsize_t> dims(const std::string& name) const {
    Handle set = dataset(name);
    Handle space(H5Dget_space(set.get()), H5Sclose);
    if (!space.valid()) fail("getting the space of " + name + " failed");
    return extents(space.get());
  }

  /// The whole dataset as doubles (or int64 through `memory_type`), element count returned.
  template <class T>
  std::vector<T> read_all(const std::string& name, hid_t memory_type) const {
    Handle set = dataset(name);
    hsize_t count = 1;
    for (hsize_t extent : dims(name)) count *= extent;
    std::vector<T> values(static_cast<std::size_t>(count));
    if (count > 0 && H5Dread(set.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0)
      fail("reading " + name + " failed");
    return values;
  }

  /// The attribute `name` of object `object`, or an invalid handle.
  Handle attribute(const std::string& object, const std::string& name) const {
    if (!exists(object)) return {};
    if (H5Aexists_by_name(file.get(), object.c_str(), name.c_str(), H5P_DEFAULT) <= 0) return {};
    return Handle(H5Aopen_by_name(file.get(), object.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT),
                  H5Aclose);
  }

  std::optional<std::string> string_attribute(const std::string& object, const std::string& name) const {
    Handle attr = attribute(object, name);
    if (!attr.valid()) return std::nullopt;
    Handle type(H5Aget_type(attr.get()), H5Tclose);
    if (!type.valid() || H5Tget_class(type.get()) != H5T_STRING) return std::nullopt;
    Handle space(H5Aget_space(attr.get()), H5Sclose);
    if (H5Sget_simple_extent_npoints(space.get()) != 1) return std::nullopt;
    if (H5Tis_variable_str(type.get()) > 0) {
      Handle memory(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(memory.get(), H5T_VARIABLE);
      H5Tset_cset(memory.get(), H5Tget_cset(type.get()));
      char* text = nullptr;
      if (H5Aread(attr.get(), memory.get(), &text) < 0 || text == nullptr) return std::nullopt;
      std::string value = text;
      H5free_memory(text);
      return value;
    }
    const std::size_t size = H5Tget_size(type.get());
    std::string value(size, '\0');
    Handle memory(H5Tcopy(type.get()), H5Tclose);
    if (H5Aread(attr.get(), memory.get(), value.data()) < 0) return std::nullopt;
    value.resize(std::min(value.find('\0'), value.size()));
    return value;
  }
};

SeriesFile::SeriesFile(const std::string& path) : impl_(std::make_unique<Impl>()) {
  Impl& f = *impl_;
  f.path = path;
  QuietHdf5Errors quiet;
  // A regular file before HDF5 opens it by name (it would wait on a FIFO, read a device).
  try {
    check_input_file(path);
  } catch (const InputFileRefused& e) {
    throw NotMfattnFile("cannot read " + path + ": " + e.what());
  }
  const htri_t hdf5 = H5Fis_hdf5(path.c_str());
  if (hdf5 < 0) {
    if (::access(path.c_str(), R_OK) != 0)
      throw NotMfattnFile("cannot read " + path + ": " + std::strerror(errno));
    f.fail("cannot read the file");
  }
  if (hdf5 == 0) f.foreign("not an HDF5 file");
  f.file = hdf5::open_read_only(path);
  if (!f.file.valid()) {
    const std::string reason = innermost_hdf5_error();
    f.foreign("HDF5 finds its signature but cannot open it (truncated or damaged?" +
              (reason.empty() ? std::string() : ": " + reason) + ")");
  }
  if (f.string_attribute("/h5md/creator", "name") != std::optional<std::string>("mfattn"))
    f.foreign("no /h5md/creator with name \"mfattn\"");
  if (H5Lexists(f.file.get(), "/fields", H5P_DEFAULT) > 0 && H5Lexists(f.file.get(), "/particles", H5P_DEFAULT) <= 0)
    throw NotMfattnFile(path + " is a density file of mfattn meanfield, and this reads particle runs (mfattn info " +
                        "describes a density file, analysis/plot_meanfield.py draws it)");
  const auto value = f.dims("/particles/tokens/position/value");
  const auto step = f.dims("/particles/tokens/position/step");
  const auto time = f.dims("/particles/tokens/position/time");
  if (value.size() != 3 || step.size() != 1 || time.size() != 1)
    f.foreign("position/{step, time, value} are not [T], [T], [T, n, d]");
  f.n = value[1];
  f.d = value[2];
  hsize_t position_rows = std::min({value[0], step[0], time[0]});
  while (f.exists(group_of_replica(f.replicas))) {
    const auto other = f.dims(group_of_replica(f.replicas) + "/position/value");
    if (other.size() != 3 || other[1] != f.n || other[2] != f.d)
      f.foreign(group_of_replica(f.replicas) + "/position/value is not [T, n, d]");
    position_rows = std::min(position_rows, other[0]);
    ++f.replicas;
  }
  f.position_frames = position_rows;
  f.clock = hdf5::frame_clock_group(f.file.get());
  if (f.clock.empty()) f.foreign("it has /run/checkpoint but no observable with step and time");
  const bool every_frame = f.clock == "/particles/tokens/position/";
  if (every_frame) {
    f.frames = position_rows;
  } else {
    const auto clock_step = f.dims(f.clock + "step"), clock_time = f.dims(f.clock + "time");
    if (clock_step.size() != 1 || clock_time.size() != 1)
      f.foreign(f.clock + "{step, time} are not [T], [T]");
    f.frames = std::min(clock_step[0], clock_time[0]);
  }
  // Files from before --save-positions kept every frame's positions.
  const auto recorded = f.string_attribute("/parameters", "save-positions");
  f.save_positions = recorded ? *recorded : every_frame ? "all" : position_rows > 0 ? "ends" : "none";
  f.check_layout();
}

SeriesFile::~SeriesFile() {
  if (!impl_) return;
  QuietHdf5Errors quiet;
  impl_->file.reset();
}

const std::string& SeriesFile::path() const { return impl_->path; }
std::size_t SeriesFile::n() const { return impl_->n; }
std::size_t SeriesFile::d() const { return impl_->d; }
std::size_t SeriesFile::replicas() const { return impl_->replicas; }
std::size_t SeriesFile::frames() const { return impl_->frames; }
std::size_t SeriesFile::position_frames() const { return impl_->position_frames; }
const std::string& SeriesFile::save_positions() const { return impl_->save_positions; }

std::vector<double> SeriesFile::times() const {
  QuietHdf5Errors quiet;
  auto values = impl_->read_all<double>(impl_->clock + "time", H5T_NATIVE_DOUBLE);
  values.resize(impl_->frames);
  return values;
}

std::vector<std::int64_t> SeriesFile::steps() const {
  QuietHdf5Errors quiet;
  auto values = impl_->read_all<std::int64_t>(impl_->clock + "step", H5T_NATIVE_INT64);
  values.resize(impl_->frames);
  return values;
}

std::vector<double> SeriesFile::position_times() const {
  QuietHdf5Errors quiet;
  auto values = impl_->read_all<double>("/particles/tokens/position/time", H5T_NATIVE_DOUBLE);
  values.resize(impl_->position_frames);
  return values;
}

std::vector<std::string> SeriesFile::observable_names() const {
  QuietHdf5Errors quiet;
  std::vector<std::string> names;
  if (!impl_->exists("/observables")) return names;
  Handle group(H5Gopen2(impl_->file.get(), "/observables", H5P_DEFAULT), H5Gclose);
  if (!group.valid()) impl_->fail("opening /observables failed");
  auto visit = [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
    static_cast<std::vector<std::string>*>(out)->emplace_back(name);
    return 0;
  };
  if (H5Literate(group.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, visit, &names) < 0)
    impl_->fail("listing /observables failed");
  return names;
}

bool SeriesFile::has_observable(const std::string& name) const {
  QuietHdf5Errors quiet;
  return impl_->exists("/observables/" + name + "/value");
}

std::vector<double> SeriesFile::observable(const std::string& name, std::size_t replica,
                                           std::size_t* components) const {
  QuietHdf5Errors quiet;
  const Impl& f = *impl_;
  const std::string dataset = "/observables/" + name + "/value";
  if (replica >= f.replicas)
    throw IoError(f.path + ": replica " + std::to_string(replica) + " requested, the file has " +
                  std::to_string(f.replicas));
  const auto dims = f.dims(dataset);
  std::size_t width = 1, stride_replica = 0;
  const std::size_t R = f.replicas;
  if (R == 1 && dims.size() == 1) {
    width = 1;
  } else if (R == 1 && dims.size() == 2) {
    width = dims[1];
  } else if (R > 1 && dims.size() == 2 && dims[1] == R) {
    stride_replica = 1;
  } else if (R > 1 && dims.size() == 3 && dims[1] == R) {
    width = stride_replica = dims[2];
  } else {
    f.foreign(dataset + " has an unexpected shape");
  }
  const std::vector<double> all = f.read_all<double>(dataset, H5T_NATIVE_DOUBLE);
  const std::size_t rows = std::min<std::size_t>(dims[0], f.frames);
  const std::size_t row_size = R > 1 ? R * width : width;
  std::vector<double> values(rows * width);
  for (std::size_t t = 0; t < rows; ++t)
    for (std::size_t c = 0; c < width; ++c)
      values[t * width + c] = all[t * row_size + replica * stride_replica + c];
  if (components) *components = width;
  return values;
}

std::vector<double> SeriesFile::positions(std::size_t row, std::size_t replica) const {
  QuietHdf5Errors quiet;
  const Impl& f = *impl_;
  if (row >= f.position_frames || replica >= f.replicas)
    throw IoError(f.path + ": position row " + std::to_string(row) + " of replica " +
                  std::to_string(replica) + " is not in the file (it holds " +
                  std::to_string(f.position_frames) + ", --save-positions " + f.save_positions + ")");
  const std::string name = group_of_replica(replica) + "/position/value";
  Handle set = f.dataset(name);
  Handle space(H5Dget_space(set.get()), H5Sclose);
  const hsize_t start[3] = {row, 0, 0}, count[3] = {1, f.n, f.d};
  if (!space.valid() ||
      H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr) < 0)
    f.fail("selecting row " + std::to_string(row) + " of " + name + " failed");
  Handle memory(H5Screate_simple(3, count, nullptr), H5Sclose);
  std::vector<double> x(f.n * f.d);
  if (H5Dread(set.get(), H5T_NATIVE_DOUBLE, memory.get(), space.get(), H5P_DEFAULT, x.data()) < 0)
    f.fail("reading row " + std::to_string(row) + " of " + name + " failed");
  return x;
}

std::vector<double> SeriesFile::presence(std::size_t replica) const {
  QuietHdf5Errors quiet;
  const std::string name = group_of_replica(replica) + "/presence";
  if (!impl_->exists(name)) return {};
  auto values = impl_->read_all<double>(name, H5T_NATIVE_DOUBLE);
  if (values.size() != impl_->n) impl_->foreign(name + " does not hold n numbers");
  return values;
}

std::optional<std::string> SeriesFile::run_status() const {
  QuietHdf5Errors quiet;
  return impl_->string_attribute("/run", "status");
}

std::optional<double> SeriesFile::parameter_number(const std::string& name) const {
  QuietHdf5Errors quiet;
  Handle attr = impl_->attribute("/parameters", name);
  if (!attr.valid()) return std::nullopt;
  Handle type(H5Aget_type(attr.get()), H5Tclose);
  const H5T_class_t kind = H5Tget_class(type.get());
  if (kind != H5T_INTEGER && kind != H5T_FLOAT) return std::nullopt;
  Handle space(H5Aget_space(attr.get()), H5Sclose);
  if (H5Sget_simple_extent_npoints(space.get()) != 1) return std::nullopt;
  double value = 0.0;
  if (H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &value) < 0) return std::nullopt;
  return value;
}

std::optional<std::string> SeriesFile::parameter_string(const std::string& name) const {
  QuietHdf5Errors quiet;
  return impl_->string_attribute("/parameters", name);
}

}  // namespace mfattn
