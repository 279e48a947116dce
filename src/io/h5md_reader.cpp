/// \file h5md_reader.cpp
/// Reading an mfattn H5MD file back: the last frame for --init-file, the layout check, and
/// the summary of its /parameters and /run that --resume and `mfattn info` compare and print.
/// (The writer's reopening for --resume is the layout writer's, h5md_layout.cpp.)
#include "mfattn/io/h5md.hpp"

#include <hdf5.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "io/h5md_objects.hpp"
#include "io/hdf5_support.hpp"
#include "mfattn/core/number_text.hpp"
#include "mfattn/io/series.hpp"

namespace mfattn {
namespace h5md_internal {

}  // namespace h5md_internal

using namespace h5md_internal;

Frame read_last_frame(const std::string& path) {
  QuietHdf5Errors quiet;
  const Checker check(path);
  const std::string foreign = path + " is not an mfattn H5MD file: ";
  std::error_code ignored;
  if (!std::filesystem::exists(path, ignored)) {
    throw IoError("cannot read " + path + ": no such file");
  }
  if (H5Fis_hdf5(path.c_str()) <= 0) throw IoError(foreign + "not an HDF5 file");
  Handle file = hdf5::open_read_only(path);
  if (!file.valid()) check.fail("opening the file");
  auto open = [&](const std::string& name) {
    Handle dataset = hdf5::open_dataset(file.get(), name);
    if (!dataset.valid()) throw IoError(foreign + "it has no dataset " + name);
    return dataset;
  };
  Handle value = open("/particles/tokens/position/value");
  Handle step = open("/particles/tokens/position/step");
  Handle time = open("/particles/tokens/position/time");
  const auto value_dims = dataset_dims(check, value.get(), "position/value");
  const auto step_dims = dataset_dims(check, step.get(), "position/step");
  const auto time_dims = dataset_dims(check, time.get(), "position/time");
  if (value_dims.size() != 3 || step_dims.size() != 1 || time_dims.size() != 1) {
    throw IoError(foreign + "position/{step, time, value} are not [T], [T], [T, n, d]");
  }
  // A writer killed between flushes may leave the three lengths unequal; the shortest one
  // bounds the frames that are complete.
  const hsize_t frames = std::min({value_dims[0], step_dims[0], time_dims[0]});

  Frame frame;
  frame.n = value_dims[1];
  frame.d = value_dims[2];
  frame.x.resize(frame.n * frame.d);
  bool found = frames > 0;
  if (found) {
    read_row(check, step.get(), frames - 1, H5T_NATIVE_INT64, &frame.step, "position/step");
    read_row(check, time.get(), frames - 1, H5T_NATIVE_DOUBLE, &frame.time, "position/time");
    read_row(check, value.get(), frames - 1, H5T_NATIVE_DOUBLE, frame.x.data(), "position/value");
  }
  // --save-positions ends or none: the checkpoint holds the last flushed frame, which is at
  // least as late as the last kept positions.
  if (H5Lexists(file.get(), "/run", H5P_DEFAULT) > 0 &&
      H5Lexists(file.get(), "/run/checkpoint", H5P_DEFAULT) > 0) {
    const std::string clock = hdf5::frame_clock_group(file.get());
    if (clock.empty()) throw IoError(foreign + "it has /run/checkpoint but no observable with step and time");
    Handle clock_step = open(clock + "step"), clock_time = open(clock + "time");
    const hsize_t clock_frames = std::min(dataset_dims(check, clock_step.get(), "frame step").at(0),
                                          dataset_dims(check, clock_time.get(), "frame time").at(0));
    Handle x = open("/run/checkpoint/x"), marks_set = open("/run/checkpoint/frame");
    const auto x_dims = dataset_dims(check, x.get(), "run/checkpoint/x");
    if (x_dims.size() != 4 || x_dims[0] != kCheckpointSlots || x_dims[2] != frame.n || x_dims[3] != frame.d)
      throw IoError(foreign + "run/checkpoint/x is not [2, R, n, d]");
    std::int64_t marks[kCheckpointSlots];
    if (dataset_dims(check, marks_set.get(), "run/checkpoint/frame") != std::vector<hsize_t>{kCheckpointSlots})
      throw IoError(foreign + "run/checkpoint/frame is not [2]");
    check(H5Dread(marks_set.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, marks),
          "reading", "run/checkpoint/frame");
    if (const int slot = latest_usable_checkpoint(marks, clock_frames); slot >= 0) {
      const auto s = static_cast<hsize_t>(slot);
      std::int64_t checkpoint_step = 0;
      Handle steps = open("/run/checkpoint/step"), times = open("/run/checkpoint/time");
      read_row(check, steps.get(), s, H5T_NATIVE_INT64, &checkpoint_step, "run/checkpoint/step");
      if (!found || checkpoint_step >= frame.step) {
        frame.step = checkpoint_step;
        read_row(check, times.get(), s, H5T_NATIVE_DOUBLE, &frame.time, "run/checkpoint/time");
        // Replica 0 of slot s: the first n * d numbers of row s.
        Handle space = check.own(H5Dget_space(x.get()), H5Sclose, "getting the space of", "run/checkpoint/x");
        const hsize_t start[4] = {s, 0, 0, 0}, count[4] = {1, 1, frame.n, frame.d};
        check(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr),
              "selecting replica 0 of", "run/checkpoint/x");
        Handle memory = dataspace(check, {1, 1, frame.n, frame.d});
        check(H5Dread(x.get(), H5T_NATIVE_DOUBLE, memory.get(), space.get(), H5P_DEFAULT, frame.x.data()),
              "reading", "run/checkpoint/x");
        found = true;
      }
    }
  }
  if (!found) throw IoError(path + " holds no frames");
  return frame;
}

bool is_mfattn_file(const std::string& path) {
  try {
    QuietHdf5Errors quiet;
    std::error_code ignored;
    if (!std::filesystem::is_regular_file(path, ignored) || H5Fis_hdf5(path.c_str()) <= 0) {
      return false;
    }
    const Handle file = hdf5::open_read_only(path);
    if (!file.valid()) return false;
    const hid_t attribute_id =
        H5Aopen_by_name(file.get(), "/h5md/creator", "name", H5P_DEFAULT, H5P_DEFAULT);
    if (attribute_id < 0) return false;
    Handle attribute(attribute_id, H5Aclose);
    Handle type(H5Aget_type(attribute.get()), H5Tclose);
    // The writer stores variable-length strings; anything else is not its creator attribute.
    if (type.get() < 0 || H5Tis_variable_str(type.get()) <= 0) return false;
    char* text = nullptr;
    if (H5Aread(attribute.get(), type.get(), &text) < 0 || text == nullptr) return false;
    const std::string name = text;
    H5free_memory(text);
    return name == "mfattn";
  } catch (const NotMfattnFile&) {
    throw;  // a file that reaches outside itself (open_read_only) is refused, not taken as text
  } catch (...) {
    return false;
  }
}

namespace {

/// One attribute rendered as text: numbers (scalars or arrays) and strings.
std::string attribute_text(hid_t attribute) {
  Handle type(H5Aget_type(attribute), H5Tclose);
  Handle space(H5Aget_space(attribute), H5Sclose);
  const hssize_t count = H5Sget_simple_extent_npoints(space.get());
  std::ostringstream out;
  switch (H5Tget_class(type.get())) {
    case H5T_STRING: {
      if (H5Tis_variable_str(type.get()) > 0 && count == 1) {
        char* text = nullptr;
        Handle memory(H5Tcopy(H5T_C_S1), H5Tclose);
        H5Tset_size(memory.get(), H5T_VARIABLE);
        H5Tset_cset(memory.get(), H5Tget_cset(type.get()));
        if (H5Aread(attribute, memory.get(), &text) >= 0 && text) {
          out << text;
          H5free_memory(text);
        }
      } else {
        out << "<string>";
      }
      break;
    }
    case H5T_INTEGER: {
      std::vector<std::int64_t> values(static_cast<std::size_t>(std::max<hssize_t>(count, 0)));
      if (!values.empty() && H5Aread(attribute, H5T_NATIVE_INT64, values.data()) < 0) return "?";
      if (values.size() != 1) out << '[';
      for (std::size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
      if (values.size() != 1) out << ']';
      break;
    }
    case H5T_FLOAT: {
      // The shortest text that reads back as the same double, so that --resume compares
      // stored and given values exactly.
      std::vector<double> values(static_cast<std::size_t>(std::max<hssize_t>(count, 0)));
      if (!values.empty() && H5Aread(attribute, H5T_NATIVE_DOUBLE, values.data()) < 0) return "?";
      if (values.size() != 1) out << '[';
      for (std::size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << format_number(values[i]);
      if (values.size() != 1) out << ']';
      break;
    }
    default:
      out << "<unsupported type>";
  }
  return out.str();
}

std::vector<std::pair<std::string, std::string>> attributes_of(hid_t object) {
  std::vector<std::pair<std::string, std::string>> attributes;
  auto visit = [](hid_t location, const char* name, const H5A_info_t*, void* data) -> herr_t {
    Handle attribute(H5Aopen(location, name, H5P_DEFAULT), H5Aclose);
    if (attribute.get() < 0) return 0;
    static_cast<std::vector<std::pair<std::string, std::string>>*>(data)->emplace_back(
        name, attribute_text(attribute.get()));
    return 0;
  };
  H5Aiterate2(object, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, visit, &attributes);
  return attributes;
}

}  // namespace

std::string parameter_text(const ParameterValue& value) {
  std::ostringstream out;
  if (const auto* integer = std::get_if<std::int64_t>(&value)) out << *integer;
  else if (const auto* real = std::get_if<double>(&value)) out << format_number(*real);
  else if (const auto* flag = std::get_if<bool>(&value)) out << (*flag ? 1 : 0);
  else if (const auto* text = std::get_if<std::string>(&value)) out << *text;
  else {
    const auto& list = std::get<std::vector<double>>(value);
    if (list.size() != 1) out << '[';
    for (std::size_t i = 0; i < list.size(); ++i) out << (i ? ", " : "") << format_number(list[i]);
    if (list.size() != 1) out << ']';
  }
  return out.str();
}

namespace {

/// A density file's summary: its frames are those /fields/density/{time, value} both hold.
FileSummary describe_density_file(const std::string& path, hid_t file, const Checker& check) {
  FileSummary summary;
  Handle time = hdf5::open_dataset(file, kFieldGroup + "time");
  if (!time.valid()) check.fail("opening", kFieldGroup + "time");
  Handle value = hdf5::open_dataset(file, kFieldGroup + "value");
  if (!value.valid()) check.fail("opening", kFieldGroup + "value");
  const auto time_dims = dataset_dims(check, time.get(), "fields/density/time");
  const auto value_dims = dataset_dims(check, value.get(), "fields/density/value");
  if (time_dims.size() != 1 || value_dims.size() < 2)
    throw NotMfattnFile(path + " is not an mfattn density file: /fields/density/{time, value} are not [T], [T, ...]");
  summary.frames = std::min(time_dims[0], value_dims[0]);
  summary.position_frames = summary.frames;
  summary.field_shape.assign(value_dims.begin() + 1, value_dims.end());
  summary.n = 1;
  for (std::size_t extent : summary.field_shape) summary.n *= extent;
  summary.d = 1;
  summary.replicas = 1;
  if (summary.frames > 0) {
    read_row(check, time.get(), 0, H5T_NATIVE_DOUBLE, &summary.first_time, "fields/density/time");
    read_row(check, time.get(), summary.frames - 1, H5T_NATIVE_DOUBLE, &summary.last_time, "fields/density/time");
  }
  return summary;
}

}  // namespace

FileSummary describe_file(const std::string& path) {
  if (is_mfattn_file(path)) {
    QuietHdf5Errors quiet;
    const Checker check(path);
    Handle file = hdf5::open_read_only(path);
    if (file.valid() && H5Lexists(file.get(), "/fields", H5P_DEFAULT) > 0 &&
        H5Lexists(file.get(), "/particles", H5P_DEFAULT) <= 0) {
      FileSummary summary = describe_density_file(path, file.get(), check);
      Handle parameters = check.own(H5Gopen2(file.get(), "/parameters", H5P_DEFAULT), H5Gclose, "opening",
                                    "/parameters");
      summary.parameters = attributes_of(parameters.get());
      Handle run = check.own(H5Gopen2(file.get(), "/run", H5P_DEFAULT), H5Gclose, "opening", "/run");
      summary.run = attributes_of(run.get());
      return summary;
    }
  }
  // The readers' one layout check: NotMfattnFile for a missing, foreign or malformed file.
  // It also gives the frame count, replicas, n and d as every reader sees them.
  const SeriesFile series(path);
  if (!is_mfattn_file(path))
    throw NotMfattnFile(path + " is not an mfattn H5MD file (its /h5md/creator name is not the "
                        "variable-length string \"mfattn\" that mfattn writes)");
  QuietHdf5Errors quiet;
  const Checker check(path);
  Handle file = hdf5::open_read_only(path);
  if (!file.valid()) check.fail("opening the file");
  FileSummary summary;
  summary.frames = series.frames();
  summary.position_frames = series.position_frames();
  summary.n = series.n();
  summary.d = series.d();
  summary.replicas = series.replicas();
  summary.save_positions = series.save_positions();
  if (summary.frames > 0) {
    const std::vector<double> times = series.times();
    summary.first_time = times.front();
    summary.last_time = times.back();
  }
  Handle parameters = check.own(H5Gopen2(file.get(), "/parameters", H5P_DEFAULT), H5Gclose,
                                "opening", "/parameters");
  summary.parameters = attributes_of(parameters.get());
  Handle run = check.own(H5Gopen2(file.get(), "/run", H5P_DEFAULT), H5Gclose, "opening", "/run");
  summary.run = attributes_of(run.get());
  return summary;
}

}  // namespace mfattn
