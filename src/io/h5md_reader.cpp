/// \file h5md_reader.cpp
/// Reading an mfattn H5MD file back: the writer's reopening for --resume (its last complete
/// frame or checkpoint slot), the last frame for --init-file, the layout check, and the
/// summary of its /parameters and /run that --resume and `mfattn info` compare and print.
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

#include "io/h5md_internal.hpp"
#include "io/hdf5_support.hpp"
#include "mfattn/core/number_text.hpp"
#include "mfattn/io/series.hpp"

namespace mfattn {
namespace h5md_internal {

/// Reopens a file for --resume (see H5mdWriter::open_for_resume).
Hdf5H5mdWriter::Hdf5H5mdWriter(const WriterSetup& setup, ResumePoint& point)
    : output_lock_(lock_output(setup.path, LockPurpose::Resume)), setup_(setup), check_(setup.path) {
  QuietHdf5Errors quiet;
  refuse_if_busy(setup.path, /*reopen_in_place=*/true);
  file_ = check_.own(H5Fopen(setup.path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose,
                     "opening the file for --resume");
  if (keeps_checkpoint() && setup.observables.empty())
    throw std::invalid_argument("H5mdWriter: a file without every frame's positions keeps its "
                                "frame clock in /observables, so at least one observable is needed");
  clock_group_ = frame_clock_path(setup);
  // A file written with another --save-positions has its clock elsewhere (check_resumable
  // refuses that first; a file edited by hand meets this).
  if (H5Lexists(file_.get(), "/run", H5P_DEFAULT) > 0 &&
      (H5Lexists(file_.get(), "/run/checkpoint", H5P_DEFAULT) > 0) != keeps_checkpoint())
    throw IoError(setup.path + ": --resume needs the --save-positions the file was written with");
  auto open = [&](const std::string& name) {
    Handle dataset = hdf5::open_dataset(file_.get(), name);
    if (!dataset.valid()) check_.fail("opening", name);
    return dataset;
  };
  step_ = open(clock_group_ + "step");
  time_ = open(clock_group_ + "time");
  run_ = check_.own(H5Gopen2(file_.get(), "/run", H5P_DEFAULT), H5Gclose, "opening", "/run");
  step_size_ = open("/run/step_size");
  auto length = [&](hid_t dataset, const char* what, std::size_t rank) {
    const auto dims = dataset_dims(check_, dataset, what);
    if (dims.size() != rank)
      throw IoError(setup.path + ": " + what + " has rank " + std::to_string(dims.size()) +
                    ", an mfattn file has " + std::to_string(rank));
    return dims[0];
  };
  hsize_t frames = std::min(length(step_.get(), "frame step", 1),
                            length(time_.get(), "frame time", 1));
  frames = std::min(frames, length(step_size_.get(), "run/step_size", 1));
  // Rows of the position element that every position dataset holds (Ends).
  hsize_t position_rows = std::numeric_limits<hsize_t>::max();
  const bool ends = setup.position_frames == PositionFrames::Ends;
  if (ends) {
    position_step_ = open("/particles/tokens/position/step");
    position_time_ = open("/particles/tokens/position/time");
    position_rows = std::min(length(position_step_.get(), "position/step", 1),
                             length(position_time_.get(), "position/time", 1));
  }
  if (is_field_file()) {
    Handle value = open(kFieldGroup + "value");
    const auto dims = dataset_dims(check_, value.get(), "fields/density/value");
    if (std::vector<std::size_t>(dims.begin() + std::min<std::size_t>(dims.size(), 1), dims.end()) != setup.field_shape)
      throw IoError(setup.path + ": --resume needs the same grid as the file");
    frames = std::min(frames, dims[0]);
    positions_.push_back(std::move(value));
  }
  for (std::size_t r = 0; r < setup.replicas && !is_field_file(); ++r) {
    const std::string group = "/particles/" + particle_group_name(r);
    particle_groups_.push_back(check_.own(H5Gopen2(file_.get(), group.c_str(), H5P_DEFAULT),
                                          H5Gclose, "opening", group));
    Handle value = open(group + "/position/value");
    const auto dims = dataset_dims(check_, value.get(), "position/value");
    if (dims.size() != 3 || dims[1] != setup.n || dims[2] != setup.d)
      throw IoError(setup.path + ": --resume needs the same n and d as the file");
    if (setup.position_frames == PositionFrames::None) continue;  // empty, never written
    hsize_t& rows = ends ? position_rows : frames;
    rows = std::min(rows, dims[0]);
    positions_.push_back(std::move(value));
    if (setup.velocity) {
      velocities_.push_back(open(group + "/velocity/value"));
      rows = std::min(rows, length(velocities_.back().get(), "velocity/value", 3));
    }
  }
  for (const auto& [name, components] : setup.observables) {
    observable_values_.push_back(open("/observables/" + name + "/value"));
    const std::size_t rank = 1 + (setup.replicas > 1) + (components > 1);
    frames = std::min(frames, length(observable_values_.back().get(), name.c_str(), rank));
  }
  if (frames == 0) throw IoError(setup.path + ": --resume found no complete frame");
  const std::size_t frame_size = setup.n * setup.d;
  point.x.resize(setup.replicas * frame_size);
  if (keeps_checkpoint()) {
    // The state comes from the checkpoint's latest complete slot; frames after it are
    // rewritten (a writer killed after a frame's rows but before its mark leaves them).
    frames = resume_from_checkpoint(frames, point);
  } else {
    read_row(check_, step_size_.get(), frames - 1, H5T_NATIVE_DOUBLE, &point.step_size, "step_size");
    for (std::size_t r = 0; r < setup.replicas; ++r)
      read_row(check_, positions_[r].get(), frames - 1, H5T_NATIVE_DOUBLE,
               point.x.data() + r * frame_size, "position/value");
  }
  frames_ = frames;
  flushed_frames_ = frames;
  point.frames = frames;
  read_row(check_, step_.get(), frames - 1, H5T_NATIVE_INT64, &point.step, "step");
  read_row(check_, time_.get(), frames - 1, H5T_NATIVE_DOUBLE, &point.time, "time");
  if (ends) {
    // Position rows up to the resumed frame stay; one of a frame after it (the final frame
    // of a part killed before its checkpoint was marked) is rewritten.
    std::vector<std::int64_t> steps(position_rows);
    if (position_rows > 0)
      check_(H5Dread(position_step_.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                     steps.data()),
             "reading", "position/step");
    position_rows_ = static_cast<hsize_t>(
        std::count_if(steps.begin(), steps.end(), [&](std::int64_t s) { return s <= point.step; }));
    flushed_position_rows_ = position_rows_;
  }
  reserve_space(kMetadataMargin);
  auto read_attribute = [&](const char* name, hid_t type, void* out) {
    if (H5Aexists(run_.get(), name) > 0) {
      Handle attribute(H5Aopen(run_.get(), name, H5P_DEFAULT), H5Aclose);
      H5Aread(attribute.get(), type, out);
    }
  };
  read_attribute("steps", H5T_NATIVE_INT64, &point.steps);
  read_attribute("rejected_steps", H5T_NATIVE_INT64, &point.rejected_steps);
  read_attribute("wall_time_s", H5T_NATIVE_DOUBLE, &point.wall_seconds);
}

/// --resume of a file with a checkpoint: the state of its latest complete slot below
/// `frames` goes to point (x, step size); returns the frames up to and including that
/// slot's, which the run continues after.
hsize_t Hdf5H5mdWriter::resume_from_checkpoint(hsize_t frames, ResumePoint& point) {
  auto open = [&](const char* name) {
    const std::string path = std::string("/run/checkpoint/") + name;
    Handle dataset = hdf5::open_dataset(file_.get(), path);
    if (!dataset.valid()) check_.fail("opening", path);
    return dataset;
  };
  checkpoint_.x = open("x");
  checkpoint_.step = open("step");
  checkpoint_.time = open("time");
  checkpoint_.step_size = open("step_size");
  checkpoint_.frame = open("frame");
  const auto dims = dataset_dims(check_, checkpoint_.x.get(), "run/checkpoint/x");
  if (dims != std::vector<hsize_t>{kCheckpointSlots, setup_.replicas, setup_.n, setup_.d})
    throw IoError(setup_.path + ": run/checkpoint/x is not [2, R, n, d] of this run");
  std::int64_t marks[kCheckpointSlots];
  check_(H5Dread(checkpoint_.frame.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, marks),
         "reading", "run/checkpoint/frame");
  const int slot = latest_usable_checkpoint(marks, frames);
  if (slot < 0)
    throw IoError(setup_.path + ": --resume found no complete slot in /run/checkpoint");
  const auto s = static_cast<hsize_t>(slot);
  const hsize_t resumed = static_cast<hsize_t>(marks[slot]) + 1;
  std::int64_t step = 0, clock_step = 0;
  double time = 0.0, clock_time = 0.0;
  read_row(check_, checkpoint_.x.get(), s, H5T_NATIVE_DOUBLE, point.x.data(), "run/checkpoint/x");
  read_row(check_, checkpoint_.step.get(), s, H5T_NATIVE_INT64, &step, "run/checkpoint/step");
  read_row(check_, checkpoint_.time.get(), s, H5T_NATIVE_DOUBLE, &time, "run/checkpoint/time");
  read_row(check_, checkpoint_.step_size.get(), s, H5T_NATIVE_DOUBLE, &point.step_size,
           "run/checkpoint/step_size");
  read_row(check_, step_.get(), resumed - 1, H5T_NATIVE_INT64, &clock_step, "frame step");
  read_row(check_, time_.get(), resumed - 1, H5T_NATIVE_DOUBLE, &clock_time, "frame time");
  if (step != clock_step || time != clock_time)
    throw IoError(setup_.path + ": /run/checkpoint slot " + std::to_string(slot) + " holds step " +
                  std::to_string(step) + " but frame " + std::to_string(resumed - 1) +
                  " has step " + std::to_string(clock_step) + " (the file was changed by hand?)");
  checkpoint_slot_ = 1 - slot;
  return resumed;
}

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
