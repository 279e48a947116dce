/// \file h5md_writer.cpp
/// H5MD 1.1 output through the HDF5 C API (layout: docs/output.md).
///
/// Choices made here:
/// - All growing elements are sampled together, so /particles/tokens/position/{step,time} are
///   the only step and time datasets; every other replica group and every observable holds hard
///   links to them (H5MD 1.1 allows this), and one append extends each of them once.
/// - The file uses HDF5's default (oldest compatible) format and no SWMR: after flush() a
///   writer killed with SIGKILL leaves a file that plain h5py opens.
/// - HDF5's automatic error printing is switched off for the duration of every call into this
///   file, and each failed HDF5 call becomes an IoError naming the file and the operation.
/// - append_frame copies a frame into staged rows; flush() writes them, one block per
///   dataset, and calls H5Fflush. The caller chooses how many frames a flush carries (run:
///   --flush-interval).
/// - Disk space is reserved before the staged rows are written (fallocate beyond the end of
///   the file, FALLOC_FL_KEEP_SIZE): the chunks they may start plus a margin for metadata.
///   A disk that fills therefore fails the reservation, before any byte of them is written,
///   and the margin still holds the failed status: a frame is in the file whole or not at
///   all. Filesystems without fallocate skip the reservation.
/// - With atomic_publish the file is built under a temporary name and renamed once it holds
///   frame 0 (see WriterSetup).
/// - PositionFrames Ends and None (docs/output.md, "What --save-positions writes") move the
///   frame clock to /observables, give the positions their own step and time (Ends) or empty
///   datasets (None), hard-link replica r >= 1's labels to replica 0's (every replica has the
///   same), and keep the last flushed frame's whole state in /run/checkpoint: two slots used
///   in turn, each marked complete (its frame number) only after its data has been flushed,
///   so a writer killed at any moment leaves the other slot, or both, complete.
#include "mfattn/h5md.hpp"
#include "mfattn/number_text.hpp"
#include "mfattn/series.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>

#include "io/hdf5_support.hpp"
#include "io/path_lock.hpp"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <limits>
#include <iomanip>
#include <sstream>
#include <string_view>
#include <utility>

namespace mfattn {
namespace {

using hdf5::Handle;
using hdf5::QuietHdf5Errors;
using hdf5::innermost_hdf5_error;


/// HDF5's description of a failed system call spans lines ("file write failed: time = ...,
/// errno = 28, error message = 'No space left on device', buf = ..."): keep the system's
/// message, which is what a user can act on.
std::string readable_reason(const std::string& reason) {
  const std::string marker = "error message = '";
  const auto begin = reason.find(marker);
  if (begin != std::string::npos) {
    const auto end = reason.find('\'', begin + marker.size());
    if (end != std::string::npos) return reason.substr(begin + marker.size(), end - begin - marker.size());
  }
  std::string line = reason.substr(0, reason.find('\n'));
  return line;
}

/// Turns failed HDF5 calls into IoError "<path>: <operation> <object> failed (<reason>)".
class Checker {
 public:
  explicit Checker(std::string path) : path_(std::move(path)) {}
  [[noreturn]] void fail(std::string_view operation, std::string_view object = {}) const {
    std::string message = path_;
    message += ": ";
    message += operation;
    if (!object.empty()) {
      message += ' ';
      message += object;
    }
    message += " failed";
    if (const std::string reason = readable_reason(innermost_hdf5_error()); !reason.empty()) {
      message += " (";
      message += reason;
      message += ')';
    }
    throw IoError(message);
  }
  void operator()(herr_t result, std::string_view operation, std::string_view object = {}) const {
    if (result < 0) fail(operation, object);
  }
  Handle own(hid_t id, Handle::Closer close, std::string_view operation,
             std::string_view object = {}) const {
    if (id < 0) fail(operation, object);
    return Handle(id, close);
  }

 private:
  std::string path_;
};

Handle utf8_string_type(const Checker& check) {
  Handle type = check.own(H5Tcopy(H5T_C_S1), H5Tclose, "copying the string type");
  check(H5Tset_size(type.get(), H5T_VARIABLE), "making strings variable-length");
  check(H5Tset_cset(type.get(), H5T_CSET_UTF8), "making strings UTF-8");
  return type;
}

/// A simple dataspace; no dimensions means a scalar. Empty max_dims means fixed size.
Handle dataspace(const Checker& check, const std::vector<hsize_t>& dims,
                 const std::vector<hsize_t>& max_dims = {}) {
  if (dims.empty()) return check.own(H5Screate(H5S_SCALAR), H5Sclose, "creating a scalar space");
  return check.own(H5Screate_simple(static_cast<int>(dims.size()), dims.data(),
                                    max_dims.empty() ? nullptr : max_dims.data()),
                   H5Sclose, "creating a dataspace");
}

/// Elements in a dataspace of extents `dims` (1 for a scalar).
hsize_t element_count(const std::vector<hsize_t>& dims) {
  hsize_t count = 1;
  for (hsize_t extent : dims) count *= extent;
  return count;
}

Handle create_group(const Checker& check, hid_t parent, const std::string& name) {
  return check.own(H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                   H5Gclose, "creating group", name);
}

/// Writes attribute `name`, replacing any earlier one (whose type or shape may differ). An
/// earlier one of the same type and shape is written in place: the object header keeps its
/// size (a run rewrites /run's counts with every frame).
void write_attribute(const Checker& check, hid_t object, const std::string& name, hid_t file_type,
                     hid_t memory_type, const std::vector<hsize_t>& dims, const void* data) {
  const htri_t exists = H5Aexists(object, name.c_str());
  check(exists, "looking up attribute", name);
  if (exists > 0 && element_count(dims) > 0) {
    Handle existing = check.own(H5Aopen(object, name.c_str(), H5P_DEFAULT), H5Aclose,
                                "opening attribute", name);
    Handle type = check.own(H5Aget_type(existing.get()), H5Tclose, "reading the type of", name);
    Handle space = check.own(H5Aget_space(existing.get()), H5Sclose, "reading the shape of", name);
    const int rank = H5Sget_simple_extent_ndims(space.get());
    std::vector<hsize_t> stored(static_cast<std::size_t>(std::max(rank, 0)));
    if (rank >= 0 && H5Sget_simple_extent_dims(space.get(), stored.data(), nullptr) >= 0 &&
        stored == dims && H5Tequal(type.get(), file_type) > 0) {
      check(H5Awrite(existing.get(), memory_type, data), "writing attribute", name);
      return;
    }
  }
  if (exists > 0) check(H5Adelete(object, name.c_str()), "deleting attribute", name);
  Handle space = dataspace(check, dims);
  Handle attribute =
      check.own(H5Acreate2(object, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                H5Aclose, "creating attribute", name);
  // HDF5 rejects a null buffer even for zero elements, and an empty vector's data() is null.
  if (element_count(dims) == 0) return;
  check(H5Awrite(attribute.get(), memory_type, data), "writing attribute", name);
}

void write_string_attribute(const Checker& check, hid_t object, const std::string& name,
                            const std::string& value) {
  Handle type = utf8_string_type(check);
  const char* text = value.c_str();
  write_attribute(check, object, name, type.get(), type.get(), {}, &text);
}

void write_strings_attribute(const Checker& check, hid_t object, const std::string& name,
                             const std::vector<std::string>& values) {
  Handle type = utf8_string_type(check);
  std::vector<const char*> texts;
  for (const auto& value : values) texts.push_back(value.c_str());
  write_attribute(check, object, name, type.get(), type.get(), {texts.size()}, texts.data());
}

void write_int32_array_attribute(const Checker& check, hid_t object, const std::string& name,
                                 const std::vector<std::int32_t>& values) {
  write_attribute(check, object, name, H5T_STD_I32LE, H5T_NATIVE_INT32, {values.size()},
                  values.data());
}

/// Rows of `row_bytes` per chunk so that a chunk holds about `target_bytes` (at least one row).
hsize_t rows_per_chunk(std::size_t row_bytes, std::size_t target_bytes) {
  return std::max<hsize_t>(1, target_bytes / std::max<std::size_t>(1, row_bytes));
}

struct Filters {
  bool deflate = false;
  bool fletcher32 = false;
};

/// How a growing dataset takes disk space: a chunk of chunk_rows rows (chunk_bytes) whenever
/// a row starts a new chunk, or, when filtered, possibly a new copy of its chunk every time
/// (a compressed chunk that grows is moved).
struct ChunkPlan {
  hsize_t chunk_rows = 1;
  std::size_t chunk_bytes = 0;
  bool filtered = false;
};

/// A dataset [0, row_shape...] that grows along its first axis, chunked by whole rows (at
/// most max_rows per chunk when max_rows > 0). plan receives its chunking.
Handle create_growing_dataset(const Checker& check, hid_t parent, const std::string& name,
                              hid_t file_type, const std::vector<hsize_t>& row_shape,
                              std::size_t target_chunk_bytes, Filters filters, std::size_t max_rows,
                              ChunkPlan& plan) {
  std::size_t row_bytes = H5Tget_size(file_type);
  for (hsize_t extent : row_shape) row_bytes *= extent;
  std::vector<hsize_t> dims{0}, max_dims{H5S_UNLIMITED};
  hsize_t rows = rows_per_chunk(row_bytes, target_chunk_bytes);
  if (max_rows > 0) rows = std::min<hsize_t>(rows, max_rows);
  plan = {rows, static_cast<std::size_t>(rows) * row_bytes, filters.deflate || filters.fletcher32};
  std::vector<hsize_t> chunk{rows};
  for (hsize_t extent : row_shape) {
    dims.push_back(extent);
    max_dims.push_back(extent);
    chunk.push_back(extent);
  }
  Handle space = dataspace(check, dims, max_dims);
  Handle properties = check.own(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "creating properties");
  check(H5Pset_chunk(properties.get(), static_cast<int>(chunk.size()), chunk.data()),
        "setting chunks of", name);
  if (filters.deflate) {
    check(H5Pset_shuffle(properties.get()), "setting shuffle on", name);
    check(H5Pset_deflate(properties.get(), 4), "setting deflate on", name);
  }
  // Last in the pipeline, so the checksum covers the bytes as stored.
  if (filters.fletcher32) check(H5Pset_fletcher32(properties.get()), "setting fletcher32 on", name);
  return check.own(H5Dcreate2(parent, name.c_str(), file_type, space.get(), H5P_DEFAULT,
                              properties.get(), H5P_DEFAULT),
                   H5Dclose, "creating dataset", name);
}

/// The extents of a dataset's dataspace.
std::vector<hsize_t> dataset_dims(const Checker& check, hid_t dataset, const char* what) {
  Handle space = check.own(H5Dget_space(dataset), H5Sclose, "getting the space of", what);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  check(rank, "getting the rank of", what);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  check(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), "sizing", what);
  return dims;
}

struct RowSelection {
  Handle file_space, memory_space;
};

/// Selects rows [first, first + rows) of `dataset` (elements of a 1-D dataset) and a memory
/// space to match.
RowSelection select_rows(const Checker& check, hid_t dataset, hsize_t first, hsize_t rows,
                         const char* what) {
  std::vector<hsize_t> count = dataset_dims(check, dataset, what);
  std::vector<hsize_t> start(count.size(), 0);
  start[0] = first;
  count[0] = rows;
  RowSelection selection{check.own(H5Dget_space(dataset), H5Sclose, "getting the space of", what),
                         {}};
  check(H5Sselect_hyperslab(selection.file_space.get(), H5S_SELECT_SET, start.data(), nullptr,
                            count.data(), nullptr),
        "selecting a row of", what);
  selection.memory_space = dataspace(check, count);
  return selection;
}

RowSelection select_row(const Checker& check, hid_t dataset, hsize_t row, const char* what) {
  return select_rows(check, dataset, row, 1, what);
}

/// Sets the length of `dataset` to `first + rows` rows and writes those rows from `data`.
void write_rows(const Checker& check, hid_t dataset, hsize_t first, hsize_t rows,
                hid_t memory_type, const void* data, const char* what) {
  std::vector<hsize_t> dims = dataset_dims(check, dataset, what);
  dims[0] = first + rows;
  check(H5Dset_extent(dataset, dims.data()), "extending", what);
  const RowSelection selection = select_rows(check, dataset, first, rows, what);
  check(H5Dwrite(dataset, memory_type, selection.memory_space.get(), selection.file_space.get(),
                 H5P_DEFAULT, data),
        "writing", what);
}

/// Writes row `row` of `dataset` in place (the dataset keeps its extent).
void overwrite_row(const Checker& check, hid_t dataset, hsize_t row, hid_t memory_type,
                   const void* data, const char* what) {
  const RowSelection selection = select_row(check, dataset, row, what);
  check(H5Dwrite(dataset, memory_type, selection.memory_space.get(), selection.file_space.get(),
                 H5P_DEFAULT, data),
        "writing", what);
}

void read_row(const Checker& check, hid_t dataset, hsize_t row, hid_t memory_type, void* out,
              const char* what) {
  const RowSelection selection = select_row(check, dataset, row, what);
  check(H5Dread(dataset, memory_type, selection.memory_space.get(), selection.file_space.get(),
                H5P_DEFAULT, out),
        "reading", what);
}

/// Writes a fixed-size dataset, replacing an earlier one of the same name.
void write_fixed_dataset(const Checker& check, hid_t parent, const std::string& name,
                         hid_t file_type, hid_t memory_type, const std::vector<hsize_t>& dims,
                         const void* data) {
  const htri_t exists = H5Lexists(parent, name.c_str(), H5P_DEFAULT);
  check(exists, "looking up", name);
  if (exists > 0) check(H5Ldelete(parent, name.c_str(), H5P_DEFAULT), "deleting", name);
  Handle space = dataspace(check, dims);
  Handle dataset = check.own(H5Dcreate2(parent, name.c_str(), file_type, space.get(), H5P_DEFAULT,
                                        H5P_DEFAULT, H5P_DEFAULT),
                             H5Dclose, "creating dataset", name);
  if (element_count(dims) == 0) return;  // as in write_attribute
  check(H5Dwrite(dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "writing", name);
}

std::string particle_group_name(std::size_t replica) {
  return replica == 0 ? "tokens" : "tokens_r" + std::to_string(replica);
}

/// Replica 0's position group: the frame clock of a file that keeps every frame's positions,
/// and the kept frames' step and time of one that keeps the ends.
const std::string kPositionClockGroup = "/particles/tokens/position/";
constexpr std::size_t kPositionChunkBytes = 256 * 1024;
constexpr std::size_t kSeriesChunkBytes = 64 * 1024;  // step, time and observables
/// PositionFrames::Ends keeps two position rows (t = 0 and the horizon); a run resumed to a
/// longer horizon adds one more, in a chunk of its own.
constexpr std::size_t kEndsPositionRows = 2;
/// The chunk B-tree's K (H5Pset_istore_k) of files written with Ends or None.
constexpr unsigned kSmallFileChunkIndexK = 4;
/// Slots of /run/checkpoint: the one being written and the last complete one.
constexpr hsize_t kCheckpointSlots = 2;
/// The frame number a checkpoint slot holds until it holds one.
constexpr std::int64_t kEmptyCheckpointSlot = -1;

/// The slot of /run/checkpoint whose complete frame is the latest one below `frames` (the
/// frames every growing dataset holds), or -1. `marks` are the slots' frame numbers.
int latest_usable_checkpoint(const std::int64_t (&marks)[kCheckpointSlots], hsize_t frames) {
  int best = -1;
  for (int slot = 0; slot < static_cast<int>(kCheckpointSlots); ++slot) {
    const std::int64_t frame = marks[slot];
    if (frame < 0 || static_cast<hsize_t>(frame) >= frames) continue;
    if (best < 0 || frame > marks[best]) best = slot;
  }
  return best;
}

class Hdf5H5mdWriter final : public H5mdWriter {
 public:
  explicit Hdf5H5mdWriter(const WriterSetup& setup)
      : output_lock_(lock_output(setup.path, setup.overwrite ? LockPurpose::Replace : LockPurpose::Create)),
        setup_(setup),
        check_(setup.path),
        write_path_(setup.atomic_publish ? temporary_output_path(setup.path) : setup.path) {
    if (setup.n == 0 || setup.d == 0 || setup.replicas == 0) {
      throw std::invalid_argument("H5mdWriter: n, d and replicas must be positive");
    }
    for (const auto& [name, components] : setup.observables) {
      if (components == 0) throw std::invalid_argument("observable " + name + " has no components");
    }
    if (keeps_checkpoint() && setup.observables.empty())
      throw std::invalid_argument("H5mdWriter: without every frame's positions the frame clock "
                                  "lives in /observables, so at least one observable is needed");
    if (setup.position_frames == PositionFrames::None && setup.velocity)
      throw std::invalid_argument("H5mdWriter: velocities follow the positions' frames, and "
                                  "PositionFrames::None keeps none");
    clock_group_ = frame_clock_path(setup);
    QuietHdf5Errors quiet;
    std::error_code ignored;
    if (!setup.overwrite && std::filesystem::exists(setup.path, ignored)) {
      throw OutputExists("output file " + setup.path + " exists (use --overwrite to replace it)");
    }
    if (setup.overwrite) {
      refuse_unless_replaceable(setup.path);
      refuse_if_busy(setup.path);
    }
    if (setup.atomic_publish) {
      // A leftover of this process id and call number (a killed run long ago) is ours to
      // replace.
      ::unlink(write_path_.c_str());
      pending_.path = write_path_;
    }
    Handle creation = check_.own(H5Pcreate(H5P_FILE_CREATE), H5Pclose, "creating properties");
    // Every chunked dataset has a B-tree node of 2K entries, 3 KiB at HDF5's K = 32: more
    // than the two position rows of a replica with Ends. Files meant to be small take K = 4.
    if (keeps_checkpoint())
      check_(H5Pset_istore_k(creation.get(), kSmallFileChunkIndexK), "setting the chunk index size");
    file_ = check_.own(H5Fcreate(write_path_.c_str(),
                                 setup.atomic_publish ? H5F_ACC_EXCL : H5F_ACC_TRUNC,
                                 creation.get(), H5P_DEFAULT),
                       H5Fclose, "creating the file");
    published_ = !setup.atomic_publish;
    reserve_space(kMetadataMargin);
    write_h5md_group();
    create_particle_groups();
    create_observables();
    create_group(check_, file_.get(), "parameters");
    run_ = create_group(check_, file_.get(), "run");
    step_size_ = grow(run_.get(), "step_size", H5T_IEEE_F64LE, {}, kSeriesChunkBytes,
                      {false, setup_.fletcher32});
    if (keeps_checkpoint()) create_checkpoint();
    write_run_info("running", 0.0, 0, 0);
    flush_file();
  }

  /// Reopens a file for --resume (see H5mdWriter::open_for_resume).
  Hdf5H5mdWriter(const WriterSetup& setup, ResumePoint& point)
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
      return check_.own(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT), H5Dclose, "opening", name);
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
    for (std::size_t r = 0; r < setup.replicas; ++r) {
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

  /// Flushes frames still staged in a published file (as a stream's destructor does; an
  /// unpublished one is removed, as ever), then closes every object, then the file, with
  /// error printing still off: a failing flush or close (disk full) has nobody to report to
  /// from a destructor, and the file keeps its last flushed frames.
  ~Hdf5H5mdWriter() override {
    QuietHdf5Errors quiet;
    if (published_ && frames_ > flushed_frames_ && !write_failed_ && !flush_failed_) {
      try {
        flush();
      } catch (...) {
        roll_back_quietly();
      }
    }
    release_reserved_space();
    observable_values_.clear();
    positions_.clear();
    velocities_.clear();
    particle_groups_.clear();
    checkpoint_.clear();
    position_step_.reset();
    position_time_.reset();
    step_.reset();
    time_.reset();
    step_size_.reset();
    run_.reset();
    file_.reset();
  }
  Hdf5H5mdWriter(const Hdf5H5mdWriter&) = delete;
  Hdf5H5mdWriter& operator=(const Hdf5H5mdWriter&) = delete;

  void write_parameters(const std::vector<Parameter>& parameters) override {
    QuietHdf5Errors quiet;
    Handle group = check_.own(H5Gopen2(file_.get(), "parameters", H5P_DEFAULT), H5Gclose, "opening",
                              "/parameters");
    for (const auto& [name, value] : parameters) {
      const hid_t g = group.get();
      if (const auto* integer = std::get_if<std::int64_t>(&value)) {
        write_attribute(check_, g, name, H5T_STD_I64LE, H5T_NATIVE_INT64, {}, integer);
      } else if (const auto* real = std::get_if<double>(&value)) {
        write_attribute(check_, g, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {}, real);
      } else if (const auto* flag = std::get_if<bool>(&value)) {
        // HDF5 has no boolean type: a flag is an int8 scalar, 0 = false, 1 = true.
        const std::int8_t stored = *flag ? 1 : 0;
        write_attribute(check_, g, name, H5T_STD_I8LE, H5T_NATIVE_INT8, {}, &stored);
      } else if (const auto* text = std::get_if<std::string>(&value)) {
        write_string_attribute(check_, g, name, *text);
      } else {
        // A 1-D double array; an empty list is a 1-D attribute of size 0 (HDF5 1.10 accepts
        // it and h5py reads it as an empty array).
        const auto& list = std::get<std::vector<double>>(value);
        write_attribute(check_, g, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {list.size()},
                        list.data());
      }
    }
  }

  void write_labels(const TokenLabels& labels) override {
    const std::size_t n = setup_.n, k = setup_.position_dim;
    if (labels.aux_position.size() != n * k || labels.prompt_id.size() != n ||
        labels.presence.size() != n || labels.id.size() != n) {
      throw std::invalid_argument("write_labels: label sizes do not match n and position_dim");
    }
    QuietHdf5Errors quiet;
    for (std::size_t r = 0; r < particle_groups_.size(); ++r) {
      const hid_t g = particle_groups_[r].get();
      if (r > 0 && keeps_checkpoint()) {
        // Every replica has the same labels: one copy, as the frame clock is one copy.
        link_labels_of_replica_0(g, labels.generator_count > 0);
        continue;
      }
      write_label_datasets(g, n, k, labels.aux_position.data(), labels.prompt_id.data(),
                           labels.presence.data(), labels.id.data());
      if (labels.generator_count > 0) {
        const std::size_t d = setup_.d;
        if (labels.gauge_generators.size() != labels.generator_count * d * d)
          throw std::invalid_argument("write_labels: gauge_generators needs k * d * d numbers");
        write_fixed_dataset(check_, g, "gauge_generators", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE,
                            {labels.generator_count, d, d}, labels.gauge_generators.data());
      }
    }
    if (labels.prefix_count > 0) write_prefix(labels);
    if (labels.matrix_sets > 0) write_attention_matrices(labels);
  }

  void append_frame(std::int64_t step, double time, const double* positions,
                    const std::vector<std::vector<double>>& observables,
                    double step_size, const double* velocities, FrameRole role) override {
    if (setup_.velocity && velocities == nullptr) {
      throw std::invalid_argument("append_frame: this file records velocities; none given");
    }
    if (observables.size() != setup_.observables.size()) {
      throw std::invalid_argument("append_frame: expected one array per observable");
    }
    for (std::size_t o = 0; o < observables.size(); ++o) {
      if (observables[o].size() != setup_.replicas * setup_.observables[o].second) {
        throw std::invalid_argument("append_frame: observable " + setup_.observables[o].first +
                                    " needs replicas * components numbers");
      }
    }
    const bool ends_row = setup_.position_frames == PositionFrames::Ends &&
                          (frames_ == 0 || role == FrameRole::Final);
    // The frame is copied into the staged rows; flush() writes them (see StagedRows).
    stage(step_.get(), frames_, H5T_NATIVE_INT64, &step, sizeof step, "frame step");
    stage(time_.get(), frames_, H5T_NATIVE_DOUBLE, &time, sizeof time, "frame time");
    stage(step_size_.get(), frames_, H5T_NATIVE_DOUBLE, &step_size, sizeof step_size,
          "run/step_size");
    const std::size_t frame_bytes = setup_.n * setup_.d * sizeof(double);
    const std::size_t frame_size = setup_.n * setup_.d;
    if (keeps_every_position() || ends_row) {
      // All: the row of this frame. Ends: the next row of the positions' own step and time.
      const hsize_t row = keeps_every_position() ? frames_ : position_rows_;
      if (ends_row) {
        stage(position_step_.get(), row, H5T_NATIVE_INT64, &step, sizeof step, "position/step", false);
        stage(position_time_.get(), row, H5T_NATIVE_DOUBLE, &time, sizeof time, "position/time", false);
      }
      const bool per_frame = keeps_every_position();
      for (std::size_t r = 0; r < setup_.replicas; ++r) {
        stage(positions_[r].get(), row, H5T_NATIVE_DOUBLE, positions + r * frame_size,
              frame_bytes, "position/value", per_frame);
        if (setup_.velocity)
          stage(velocities_[r].get(), row, H5T_NATIVE_DOUBLE, velocities + r * frame_size,
                frame_bytes, "velocity/value", per_frame);
      }
      if (ends_row) ++position_rows_;
    }
    for (std::size_t o = 0; o < observables.size(); ++o) {
      stage(observable_values_[o].get(), frames_, H5T_NATIVE_DOUBLE, observables[o].data(),
            observables[o].size() * sizeof(double), setup_.observables[o].first.c_str());
    }
    if (keeps_checkpoint()) {
      // Only the latest frame's state goes to the checkpoint slot, at the flush.
      latest_.step = step;
      latest_.time = time;
      latest_.step_size = step_size;
      latest_.x.assign(positions, positions + setup_.replicas * frame_size);
      latest_.final = role == FrameRole::Final;
    }
    ++frames_;
  }

  std::size_t staged_bytes() const override {
    std::size_t bytes = 0;
    for (const StagedRows& rows : staged_) bytes += rows.bytes.size();
    return bytes;
  }

  void write_run_info(const std::string& status, double wall_seconds, std::int64_t steps,
                      std::int64_t rejected_steps) override {
    QuietHdf5Errors quiet;
    if (write_failed_ || flush_failed_) roll_back_to_flushed_frames();
    write_string_attribute(check_, run_.get(), "status", status);
    write_run_progress(wall_seconds, steps, rejected_steps);
  }

  void write_run_progress(double wall_seconds, std::int64_t steps,
                          std::int64_t rejected_steps) override {
    QuietHdf5Errors quiet;
    const hid_t run = run_.get();
    write_attribute(check_, run, "wall_time_s", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {},
                    &wall_seconds);
    write_attribute(check_, run, "steps", H5T_STD_I64LE, H5T_NATIVE_INT64, {}, &steps);
    write_attribute(check_, run, "rejected_steps", H5T_STD_I64LE, H5T_NATIVE_INT64, {},
                    &rejected_steps);
  }

  void flush() override {
    if (frames_ > flushed_frames_) write_staged_frames();
    try {
      flush_file();
      // Only now is the slot's data in the file: its mark goes after it, in a second flush.
      if (checkpoint_pending_ && !flush_failed_) {
        mark_checkpoint_slot();
        flush_file();
        if (latest_.final) settle_checkpoint();
      }
    } catch (const IoError&) {
      flush_failed_ = true;  // a file whose frame 0 may be partial is never published
      throw;
    }
    if (!flush_failed_) {
      flushed_frames_ = frames_;
      flushed_position_rows_ = position_rows_;
    }
    if (!published_ && frames_ > 0 && !flush_failed_) publish();
  }

  std::string current_path() const override { return published_ ? setup_.path : write_path_; }

  std::size_t flushed_frames() const override { return flushed_frames_; }

 private:
  /// Room for the metadata that a frame, a status or a close may add (B-tree nodes, object
  /// header continuations, heap blocks), beyond the chunks a frame starts.
  static constexpr std::size_t kMetadataMargin = 256 * 1024;

  void flush_file() {
    QuietHdf5Errors quiet;
    check_(H5Fflush(file_.get(), H5F_SCOPE_GLOBAL), "flushing the file");
  }

  /// Rows appended since the last flush, one block per growing dataset: append_frame copies
  /// a frame here and flush() writes each block with one H5Dwrite, so a frame costs a copy
  /// rather than an extent change and a write per dataset, and a flush writes the datasets'
  /// metadata once for all the frames it carries.
  struct StagedRows {
    hid_t dataset = -1;
    hid_t memory_type = -1;
    const char* what = "";
    ChunkPlan plan;             ///< the dataset's chunking, for the space reservation
    bool per_frame = true;      ///< a row per frame (false: Ends' position rows)
    hsize_t first_row = 0;      ///< the dataset's row that bytes[0] starts
    std::size_t row_bytes = 0;
    std::vector<unsigned char> bytes;
    hsize_t rows() const { return bytes.size() / row_bytes; }
    /// Rows of the first `frames` staged frames (Ends' position rows: all of them or none,
    /// as they belong to frame 0, flushed at once, or to the last frame).
    hsize_t rows_of(hsize_t frames, hsize_t staged_frames) const {
      return per_frame ? std::min(frames, rows()) : (frames == staged_frames ? rows() : 0);
    }
  };

  /// Copies one row of `dataset` (row number `row`, the next after its staged ones) into
  /// its staged block.
  void stage(hid_t dataset, hsize_t row, hid_t memory_type, const void* data, std::size_t row_bytes,
             const char* what, bool per_frame = true) {
    auto entry = std::find_if(staged_.begin(), staged_.end(),
                              [&](const StagedRows& rows) { return rows.dataset == dataset; });
    if (entry == staged_.end()) {
      staged_.push_back(
          StagedRows{dataset, memory_type, what, plan_of(dataset), per_frame, row, row_bytes, {}});
      entry = staged_.end() - 1;
    }
    if (entry->bytes.empty()) entry->first_row = row;
    const auto* first = static_cast<const unsigned char*>(data);
    entry->bytes.insert(entry->bytes.end(), first, first + row_bytes);
  }

  /// Bytes the first `frames` staged frames may allocate: every chunk their rows start (and
  /// every chunk of a filtered dataset they touch, compressed anew), plus the metadata margin.
  std::size_t staged_space_needed(hsize_t frames) const {
    const hsize_t staged_frames = frames_ - flushed_frames_;
    std::size_t bytes = kMetadataMargin;
    for (const StagedRows& rows : staged_) {
      const hsize_t count = rows.rows_of(frames, staged_frames);
      if (count == 0) continue;
      const hsize_t first = rows.first_row, last = first + count - 1;
      const hsize_t per_chunk = rows.plan.chunk_rows;
      const hsize_t chunks = rows.plan.filtered ? last / per_chunk - first / per_chunk + 1
                                                : last / per_chunk + 1 - (first + per_chunk - 1) / per_chunk;
      bytes += static_cast<std::size_t>(chunks) * (rows.plan.chunk_bytes + 4096);
    }
    return bytes;
  }

  /// Writes the rows of the first `frames` staged frames and, when that is all of them and
  /// the file has a checkpoint, the latest frame's state into its slot (its space reserved
  /// by the caller). Clears the staged rows.
  void write_staged(hsize_t frames) {
    QuietHdf5Errors quiet;
    const hsize_t staged_frames = frames_ - flushed_frames_;
    for (StagedRows& rows : staged_) {
      const hsize_t count = rows.rows_of(frames, staged_frames);
      if (count > 0)
        write_rows(check_, rows.dataset, rows.first_row, count, rows.memory_type, rows.bytes.data(),
                   rows.what);
      rows.bytes.clear();
    }
    if (keeps_checkpoint() && frames == staged_frames)
      write_checkpoint_slot(latest_.step, latest_.time, latest_.step_size, latest_.x.data());
  }

  /// Writes the staged frames. The disk space for them is reserved first, so a disk that
  /// fills fails before any byte of them is written; then the largest number of whole frames
  /// that still fits is written and flushed (without a new checkpoint slot: --resume then
  /// continues from the last one), the rest dropped, and the IoError passed on.
  void write_staged_frames() {
    const hsize_t staged_frames = frames_ - flushed_frames_;
    // A write that fails half-way leaves rows that write_run_info takes back.
    write_failed_ = true;
    try {
      reserve_space(staged_space_needed(staged_frames));
    } catch (const IoError&) {
      hsize_t fits = 0, fails = staged_frames;
      while (fits + 1 < fails) {
        const hsize_t middle = fits + (fails - fits) / 2;
        try {
          reserve_space(staged_space_needed(middle));
          fits = middle;
        } catch (const IoError&) {
          fails = middle;
        }
      }
      if (fits > 0) {
        write_staged(fits);
        flush_file();
        flushed_frames_ += fits;
        frames_ = flushed_frames_;
        position_rows_ = flushed_position_rows_;
      }
      throw;
    }
    write_staged(staged_frames);
    write_failed_ = false;
  }

  /// roll_back_to_flushed_frames for a destructor: whatever fails is left as it is.
  void roll_back_quietly() noexcept {
    try {
      roll_back_to_flushed_frames();
    } catch (...) {
    }
  }

  /// After a failed write or flush (where no reservation protected it: a filesystem without
  /// fallocate), shrinks every growing dataset back to the frames of the last successful
  /// flush, so that a partly written frame does not stay in the file as a frame of zeros, and
  /// drops the rows still staged.
  void roll_back_to_flushed_frames() {
    for (StagedRows& rows : staged_) rows.bytes.clear();
    auto shrink = [&](hid_t dataset, hsize_t rows) {
      std::vector<hsize_t> dims = dataset_dims(check_, dataset, "a growing dataset");
      if (dims.empty() || dims[0] <= rows) return;
      dims[0] = rows;
      check_(H5Dset_extent(dataset, dims.data()), "shrinking", "a growing dataset");
    };
    for (hid_t dataset : growing_datasets()) shrink(dataset, flushed_frames_);
    for (hid_t dataset : position_row_datasets()) shrink(dataset, flushed_position_rows_);
    frames_ = flushed_frames_;
    position_rows_ = flushed_position_rows_;
    // An unmarked slot stays unmarked: its older mark keeps it from being taken.
    checkpoint_pending_ = false;
    write_failed_ = flush_failed_ = false;
  }

  /// A growing dataset with a row per frame, chunked by at most expected_frames rows.
  Handle grow(hid_t parent, const std::string& name, hid_t file_type,
              const std::vector<hsize_t>& row_shape, std::size_t target_chunk_bytes,
              Filters filters) {
    ChunkPlan plan;
    Handle dataset = create_growing_dataset(check_, parent, name, file_type, row_shape,
                                            target_chunk_bytes, filters, setup_.expected_frames,
                                            plan);
    return dataset;
  }

  /// A dataset of the position element (position and velocity step, time and value): a row
  /// per frame (All, as grow), a row per kept frame (Ends: chunks of kEndsPositionRows rows,
  /// so that 512 replicas do not take 512 chunks of a whole run's frames), or none (None: a
  /// fixed, empty dataset, which keeps the element's shape [0, n, d] for readers). An invalid
  /// handle for None.
  Handle position_dataset(hid_t parent, const std::string& name, hid_t file_type,
                          const std::vector<hsize_t>& row_shape, std::size_t target_chunk_bytes,
                          Filters filters) {
    switch (setup_.position_frames) {
      case PositionFrames::All:
        return grow(parent, name, file_type, row_shape, target_chunk_bytes, filters);
      case PositionFrames::Ends: {
        ChunkPlan plan;
        Handle dataset = create_growing_dataset(check_, parent, name, file_type, row_shape,
                                                target_chunk_bytes, filters, kEndsPositionRows,
                                                plan);
        return dataset;
      }
      case PositionFrames::None:
        break;
    }
    std::vector<hsize_t> dims{0};
    dims.insert(dims.end(), row_shape.begin(), row_shape.end());
    // No element is written, so the memory type is never used.
    write_fixed_dataset(check_, parent, name, file_type, file_type, dims, nullptr);
    return {};
  }

  /// Every dataset that append_frame extends by a row per frame.
  std::vector<hid_t> growing_datasets() const {
    std::vector<hid_t> all{step_.get(), time_.get(), step_size_.get()};
    if (keeps_every_position()) {
      for (const Handle& h : positions_) all.push_back(h.get());
      for (const Handle& h : velocities_) all.push_back(h.get());
    }
    for (const Handle& h : observable_values_) all.push_back(h.get());
    return all;
  }

  /// Ends: the datasets that grow by a row per kept frame.
  std::vector<hid_t> position_row_datasets() const {
    std::vector<hid_t> all;
    if (setup_.position_frames != PositionFrames::Ends) return all;
    all = {position_step_.get(), position_time_.get()};
    for (std::size_t r = 0; r < positions_.size(); ++r) {
      all.push_back(positions_[r].get());
      if (setup_.velocity) all.push_back(velocities_[r].get());
    }
    return all;
  }

  /// The chunking of an existing growing dataset (a resumed file).
  ChunkPlan plan_of(hid_t dataset) const {
    ChunkPlan plan;
    Handle properties = check_.own(H5Dget_create_plist(dataset), H5Pclose, "reading the layout of",
                                   "a dataset");
    Handle type = check_.own(H5Dget_type(dataset), H5Tclose, "reading the type of", "a dataset");
    std::vector<hsize_t> chunk(8, 1);
    const int rank = H5Pget_chunk(properties.get(), static_cast<int>(chunk.size()), chunk.data());
    if (rank <= 0) return plan;
    plan.chunk_rows = chunk[0];
    plan.chunk_bytes = H5Tget_size(type.get());
    for (int a = 0; a < rank; ++a) plan.chunk_bytes *= chunk[static_cast<std::size_t>(a)];
    plan.filtered = H5Pget_nfilters(properties.get()) > 0;
    return plan;
  }

  /// The file's descriptor (sec2 driver), or -1.
  int file_descriptor() const {
    void* handle = nullptr;
    if (H5Fget_vfd_handle(file_.get(), H5P_DEFAULT, &handle) < 0 || handle == nullptr) return -1;
    return *static_cast<int*>(handle);
  }

  /// Allocates disk blocks up to `bytes` past HDF5's end of allocation, without changing the
  /// file's size, so that the writes of the next frame cannot meet a full disk. A full disk
  /// fails here, with nothing of the frame written (IoError). Filesystems that do not
  /// support fallocate switch the reservation off.
  void reserve_space(std::size_t bytes) {
    // MFATTN_NO_SPACE_RESERVATION=1 behaves as a filesystem without fallocate (tests use it).
    static const bool disabled = [] {
      const char* value = std::getenv("MFATTN_NO_SPACE_RESERVATION");
      return value != nullptr && std::string(value) == "1";
    }();
    if (disabled) reserving_ = false;
    if (!reserving_) return;
    const int fd = file_descriptor();
    haddr_t eoa = 0;
    if (fd < 0 || H5Fget_eoa(file_.get(), &eoa) < 0) {
      reserving_ = false;
      return;
    }
    struct stat info {};
    if (::fstat(fd, &info) != 0) {
      reserving_ = false;
      return;
    }
    const auto start = static_cast<off_t>(std::min<haddr_t>(eoa, static_cast<haddr_t>(info.st_size)));
    const auto end = static_cast<off_t>(eoa + bytes);
    if (end <= reserved_end_) return;
    int result = 0;
    do {
      result = ::fallocate(fd, FALLOC_FL_KEEP_SIZE, start, end - start);
    } while (result != 0 && errno == EINTR);
    if (result == 0) {
      reserved_end_ = end;
      return;
    }
    const int error = errno;
    if (error == EOPNOTSUPP || error == ENOSYS) {
      reserving_ = false;
      return;
    }
    throw IoError(setup_.path + ": reserving " + std::to_string(bytes) +
                  " bytes of disk space for the next frame failed (" + std::strerror(error) + ")");
  }

  /// Gives back the blocks reserved past the end of the file (a failed or finished run must
  /// not keep a disk full for others).
  void release_reserved_space() noexcept {
    if (reserved_end_ == 0 || !file_.valid()) return;
    const int fd = file_descriptor();
    struct stat info {};
    if (fd < 0 || ::fstat(fd, &info) != 0) return;
    if (reserved_end_ > info.st_size) {
      // ext4 ignores a hole punched at or past the end of the file; a truncate to the same
      // size frees the blocks reserved past it there (and on xfs and tmpfs).
      ::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, info.st_size,
                  reserved_end_ - info.st_size);
      if (::ftruncate(fd, info.st_size) != 0) {
        // Nothing to report from a destructor; the blocks go when the file is removed.
      }
    }
    reserved_end_ = 0;
  }

  /// What a writer is about to do with its output: the refusal when another writer holds it
  /// says what to do.
  enum class LockPurpose { Create, Replace, Resume };

  /// Takes the output's own lock (io/path_lock.hpp), held for the writer's life: another
  /// mfattn writer of the same output, in this process or another, is refused whatever
  /// HDF5_USE_FILE_LOCKING says. Without --overwrite that other writer is creating the file,
  /// so the refusal is that of an existing output (exit 2); with --overwrite and --resume it
  /// is OutputBusy (exit 4: retry once it ends). A filesystem without any byte-range locks
  /// gives no exclusion at all (nullptr): refusing would make mfattn unusable there, and
  /// docs/failure-model.md says so.
  static std::unique_ptr<PathLock> lock_output(const std::string& path, LockPurpose purpose) {
    std::unique_ptr<PathLock> lock;
    try {
      lock = PathLock::try_acquire(output_lock_path(path));
    } catch (const LockingUnsupported&) {
      return nullptr;
    } catch (const IoError& e) {
      throw IoError("output file " + path + ": " + e.what());
    }
    if (lock) return lock;
    if (purpose == LockPurpose::Create)
      throw OutputExists("output file " + path + " is being written by another run (use another --out, "
                         "or wait for that run and pass --overwrite to replace its file)");
    throw OutputBusy("output file " + path + " is being written by another mfattn run, in another process "
                     "or thread (its lock " + output_lock_path(path).string() + " is held); it was left untouched");
  }

  /// --overwrite replaces a regular file (or a link to one) and nothing else: renaming over a
  /// device node or a FIFO would replace it with a file (OutputNotReplaceable, exit 2).
  static void refuse_unless_replaceable(const std::string& path) {
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0 || S_ISREG(info.st_mode)) return;
    throw OutputNotReplaceable("--out " + path + ": is not a regular file (a device, FIFO, socket or folder); " +
                               "--out names a regular file, and --overwrite replaces regular files only");
  }

  /// Opens `path` and takes a non-blocking flock on it, held until the returned descriptor is
  /// closed (-1: no such file). HDF5 takes an exclusive flock on every file it writes and
  /// readers that lock take a shared one, so a shared probe fails only against a writer.
  /// For --resume (reopen_in_place) the probe is exclusive, as HDF5's own lock for writing
  /// will be: a reader holding a shared lock (plain h5py) then blocks it too, and says so.
  /// Throws OutputBusy when the lock is held elsewhere. O_NONBLOCK: a FIFO does not hang.
  static int lock_unless_busy(const std::string& path, bool reopen_in_place = false) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return -1;
    if (::flock(fd, (reopen_in_place ? LOCK_EX : LOCK_SH) | LOCK_NB) == 0 || errno != EWOULDBLOCK)
      return fd;
    ::close(fd);
    if (reopen_in_place)
      throw OutputBusy(path + " is open in another process (a running mfattn, or a reader that "
                       "locks the file, such as h5py without locking=False); it was left untouched");
    throw OutputBusy("output file " + path +
                     " is open for writing in another process (a running mfattn?); it was "
                     "left untouched");
  }

  /// Refuses (OutputBusy) a path that another process holds open (see lock_unless_busy).
  static void refuse_if_busy(const std::string& path, bool reopen_in_place = false) {
    if (const int fd = lock_unless_busy(path, reopen_in_place); fd >= 0) ::close(fd);
  }

  /// Renames the temporary file to its final name: without --overwrite only when that name
  /// is still free (renameat2 RENAME_NOREPLACE, or link + unlink where it is not supported),
  /// with --overwrite only when no other process writes the file it replaces.
  void publish() {
    const std::string& target = setup_.path;
    if (setup_.overwrite) {
      // Checked again here: the name may have been given to a device or FIFO meanwhile.
      refuse_unless_replaceable(target);
      // The lock is held across the rename, so no writer can open the old file meanwhile.
      const int fd = lock_unless_busy(target);
      const int result = ::rename(write_path_.c_str(), target.c_str());
      const int error = errno;
      if (fd >= 0) ::close(fd);
      if (result != 0)
        throw IoError("renaming " + write_path_ + " to " + target + " failed (" +
                      std::strerror(error) + ")");
    } else {
      int result = ::renameat2(AT_FDCWD, write_path_.c_str(), AT_FDCWD, target.c_str(),
                               RENAME_NOREPLACE);
      if (result != 0 && (errno == EINVAL || errno == ENOSYS)) {
        result = ::link(write_path_.c_str(), target.c_str());
        if (result == 0) ::unlink(write_path_.c_str());
      }
      if (result != 0) {
        const int error = errno;
        if (error == EEXIST)
          throw OutputExists("output file " + target +
                             " appeared while this run started (use --overwrite to replace it)");
        throw IoError("renaming " + write_path_ + " to " + target + " failed (" +
                      std::strerror(error) + ")");
      }
    }
    published_ = true;
    pending_.path.clear();
  }

  void write_h5md_group() {
    Handle h5md = create_group(check_, file_.get(), "h5md");
    write_int32_array_attribute(check_, h5md.get(), "version", {1, 1});
    Handle author = create_group(check_, h5md.get(), "author");
    write_string_attribute(check_, author.get(), "name", setup_.author);
    Handle creator = create_group(check_, h5md.get(), "creator");
    write_string_attribute(check_, creator.get(), "name", "mfattn");
    write_string_attribute(check_, creator.get(), "version", setup_.creator_version);
    Handle modules = create_group(check_, h5md.get(), "modules");
    Handle attention = create_group(check_, modules.get(), "attention");
    write_int32_array_attribute(check_, attention.get(), "version", {1, 0});
  }

  void create_particle_groups() {
    Handle particles = create_group(check_, file_.get(), "particles");
    const std::vector<hsize_t> frame_shape{setup_.n, setup_.d};
    const auto dimension = static_cast<std::int32_t>(setup_.d);
    for (std::size_t r = 0; r < setup_.replicas; ++r) {
      Handle group = create_group(check_, particles.get(), particle_group_name(r));
      if (r > 0 && keeps_checkpoint()) {
        // Files meant to be small share what is the same in every replica group: the box, and
        // with None the (empty) position element. A group costs about 1 KiB of metadata.
        link_group_of_replica_0(group.get(), "box");
        if (setup_.position_frames == PositionFrames::None) {
          link_group_of_replica_0(group.get(), "position");
          particle_groups_.push_back(std::move(group));
          continue;
        }
      } else {
        Handle box = create_group(check_, group.get(), "box");
        write_attribute(check_, box.get(), "dimension", H5T_STD_I32LE, H5T_NATIVE_INT32, {},
                        &dimension);
        write_strings_attribute(check_, box.get(), "boundary",
                                std::vector<std::string>(setup_.d, "none"));
      }
      Handle position = create_group(check_, group.get(), "position");
      if (r == 0) {
        // All: the frame clock. Ends: the kept frames' own step and time. None: empty.
        Handle step = position_dataset(position.get(), "step", H5T_STD_I64LE, {},
                                       kSeriesChunkBytes, {false, setup_.fletcher32});
        Handle time = position_dataset(position.get(), "time", H5T_IEEE_F64LE, {},
                                       kSeriesChunkBytes, {false, setup_.fletcher32});
        if (keeps_every_position()) {
          step_ = std::move(step);
          time_ = std::move(time);
        } else {
          position_step_ = std::move(step);
          position_time_ = std::move(time);
        }
      } else {
        link_step_and_time(position.get(), kPositionClockGroup);
      }
      Handle value = position_dataset(position.get(), "value", H5T_IEEE_F64LE, frame_shape,
                                      kPositionChunkBytes, {setup_.deflate, setup_.fletcher32});
      if (value.valid()) positions_.push_back(std::move(value));
      if (setup_.velocity) {
        Handle velocity = create_group(check_, group.get(), "velocity");
        link_step_and_time(velocity.get(), kPositionClockGroup);
        velocities_.push_back(position_dataset(velocity.get(), "value", H5T_IEEE_F64LE,
                                               frame_shape, kPositionChunkBytes,
                                               {setup_.deflate, setup_.fletcher32}));
      }
      particle_groups_.push_back(std::move(group));
    }
  }

  /// /particles/prefix: the frozen prefix tokens, shared by every replica. Their position is
  /// a time-independent H5MD element (a dataset, not a step/time/value group).
  void write_prefix(const TokenLabels& labels) {
    const std::size_t count = labels.prefix_count, d = setup_.d, k = setup_.position_dim;
    if (labels.prefix_position.size() != count * d || labels.prefix_aux_position.size() != count * k ||
        labels.prefix_prompt_id.size() != count || labels.prefix_presence.size() != count ||
        labels.prefix_id.size() != count)
      throw std::invalid_argument("write_labels: prefix label sizes do not match P, d and k");
    Handle particles = check_.own(H5Gopen2(file_.get(), "particles", H5P_DEFAULT), H5Gclose,
                                  "opening group", "particles");
    const htri_t exists = H5Lexists(particles.get(), "prefix", H5P_DEFAULT);
    check_(exists, "looking up", "particles/prefix");
    Handle group = exists > 0 ? check_.own(H5Gopen2(particles.get(), "prefix", H5P_DEFAULT),
                                           H5Gclose, "opening group", "particles/prefix")
                              : create_group(check_, particles.get(), "prefix");
    if (exists == 0) {
      Handle box = create_group(check_, group.get(), "box");
      const auto dimension = static_cast<std::int32_t>(d);
      write_attribute(check_, box.get(), "dimension", H5T_STD_I32LE, H5T_NATIVE_INT32, {},
                      &dimension);
      write_strings_attribute(check_, box.get(), "boundary", std::vector<std::string>(d, "none"));
    }
    const hid_t g = group.get();
    write_fixed_dataset(check_, g, "position", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {count, d},
                        labels.prefix_position.data());
    write_label_datasets(g, count, k, labels.prefix_aux_position.data(),
                         labels.prefix_prompt_id.data(), labels.prefix_presence.data(),
                         labels.prefix_id.data());
  }

  /// aux_position [count, k], prompt_id, presence and id [count] of a particle group.
  /// Each matrix set's Q, K, V [L, d, d] and the layers' start times, in its particle group
  /// (a shared set in /particles/tokens only).
  void write_attention_matrices(const TokenLabels& labels) {
    const std::size_t d = setup_.d, layers = labels.matrix_layers, sets = labels.matrix_sets;
    const std::size_t per_set = layers * d * d;
    if ((sets != 1 && sets != particle_groups_.size()) || labels.layer_start.size() != layers ||
        labels.query_matrices.size() != sets * per_set || labels.key_matrices.size() != sets * per_set ||
        labels.value_matrices.size() != sets * per_set)
      throw std::invalid_argument("write_labels: attention matrices need 1 or R sets of L x d x d");
    for (std::size_t set = 0; set < sets; ++set) {
      // A resumed run rewrites them (a longer horizon may add layers).
      const hid_t parent = particle_groups_[set].get();
      const htri_t exists = H5Lexists(parent, "attention_matrices", H5P_DEFAULT);
      check_(exists, "looking up", "attention_matrices");
      Handle group = exists > 0 ? check_.own(H5Gopen2(parent, "attention_matrices", H5P_DEFAULT),
                                             H5Gclose, "opening group", "attention_matrices")
                                : create_group(check_, parent, "attention_matrices");
      const hid_t g = group.get();
      write_fixed_dataset(check_, g, "layer_start", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {layers},
                          labels.layer_start.data());
      for (const auto& [name, values] : {std::pair{"query", &labels.query_matrices},
                                         std::pair{"key", &labels.key_matrices},
                                         std::pair{"value", &labels.value_matrices}})
        write_fixed_dataset(check_, g, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {layers, d, d},
                            values->data() + set * per_set);
    }
  }

  void write_label_datasets(hid_t g, std::size_t count, std::size_t k, const double* aux_position,
                            const std::int32_t* prompt_id, const double* presence,
                            const std::int64_t* id) {
    write_fixed_dataset(check_, g, "aux_position", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {count, k},
                        aux_position);
    write_fixed_dataset(check_, g, "prompt_id", H5T_STD_I32LE, H5T_NATIVE_INT32, {count}, prompt_id);
    write_fixed_dataset(check_, g, "presence", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {count}, presence);
    write_fixed_dataset(check_, g, "id", H5T_STD_I64LE, H5T_NATIVE_INT64, {count}, id);
  }

  void create_observables() {
    Handle observables = create_group(check_, file_.get(), "observables");
    const hsize_t replicas = setup_.replicas;
    for (const auto& [name, components] : setup_.observables) {
      Handle group = create_group(check_, observables.get(), name);
      if (keeps_every_position() || step_.valid()) {
        link_step_and_time(group.get(), clock_group_);
      } else {
        // The first observable holds the frame clock that every other one links to.
        step_ = grow(group.get(), "step", H5T_STD_I64LE, {}, kSeriesChunkBytes,
                     {false, setup_.fletcher32});
        time_ = grow(group.get(), "time", H5T_IEEE_F64LE, {}, kSeriesChunkBytes,
                     {false, setup_.fletcher32});
      }
      std::vector<hsize_t> row_shape;
      // Without every frame's positions the observables are the bulk of the file, so
      // --deflate compresses them too. Not by default: a compressed chunk is compressed again
      // at every flush, which costs more than a small run's steps.
      if (replicas > 1) row_shape.push_back(replicas);
      if (components > 1) row_shape.push_back(components);
      observable_values_.push_back(
          grow(group.get(), "value", H5T_IEEE_F64LE, row_shape, kSeriesChunkBytes,
               {setup_.deflate && keeps_checkpoint(), setup_.fletcher32}));
    }
  }

  /// Hard links `step` and `time` in `group` to those in `source_group` (a path ending in '/').
  void link_step_and_time(hid_t group, const std::string& source_group) {
    for (const char* name : {"step", "time"}) {
      const std::string source = source_group + name;
      check_(H5Lcreate_hard(file_.get(), source.c_str(), group, name, H5P_DEFAULT, H5P_DEFAULT),
             "linking", source);
    }
  }

  /// Replaces the labels of a replica group r >= 1 by hard links to replica 0's (which
  /// write_labels has just written); gauge_generators too when the run has a gauge.
  void link_labels_of_replica_0(hid_t group, bool gauge) {
    std::vector<const char*> names{"aux_position", "prompt_id", "presence", "id"};
    if (gauge) names.push_back("gauge_generators");
    for (const char* name : names) {
      const htri_t exists = H5Lexists(group, name, H5P_DEFAULT);
      check_(exists, "looking up", name);
      if (exists > 0) check_(H5Ldelete(group, name, H5P_DEFAULT), "deleting", name);
      const std::string source = std::string("/particles/tokens/") + name;
      check_(H5Lcreate_hard(file_.get(), source.c_str(), group, name, H5P_DEFAULT, H5P_DEFAULT),
             "linking", source);
    }
  }

  /// Hard links `name` in a replica group r >= 1 to /particles/tokens/<name>.
  void link_group_of_replica_0(hid_t group, const char* name) {
    const std::string source = std::string("/particles/tokens/") + name;
    check_(H5Lcreate_hard(file_.get(), source.c_str(), group, name, H5P_DEFAULT, H5P_DEFAULT),
           "linking", source);
  }

  bool keeps_every_position() const { return setup_.position_frames == PositionFrames::All; }
  /// Ends and None: the positions of the last flushed frame are not in the position element,
  /// so /run/checkpoint holds them for --resume.
  bool keeps_checkpoint() const { return !keeps_every_position(); }

  /// The group of the frame clock a writer with this setup uses (see frame_clock_group).
  static std::string frame_clock_path(const WriterSetup& setup) {
    if (setup.position_frames == PositionFrames::All) return kPositionClockGroup;
    return "/observables/" + setup.observables.front().first + "/";
  }

  /// A fixed-size dataset whose space is allocated when it is created: the checkpoint is
  /// rewritten in place every frame, so it never asks the disk for more.
  Handle allocated_dataset(hid_t parent, const char* name, hid_t file_type,
                           const std::vector<hsize_t>& dims) {
    Handle space = dataspace(check_, dims);
    Handle properties = check_.own(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "creating properties");
    check_(H5Pset_alloc_time(properties.get(), H5D_ALLOC_TIME_EARLY), "allocating", name);
    return check_.own(H5Dcreate2(parent, name, file_type, space.get(), H5P_DEFAULT,
                                 properties.get(), H5P_DEFAULT),
                      H5Dclose, "creating dataset", name);
  }

  /// /run/checkpoint: x [2, R, n, d], step, time, step_size and frame [2]; frame[s] is the
  /// frame slot s holds (kEmptyCheckpointSlot while it holds none), written after the rest.
  void create_checkpoint() {
    Handle group = create_group(check_, run_.get(), "checkpoint");
    const hid_t g = group.get();
    checkpoint_.x = allocated_dataset(g, "x", H5T_IEEE_F64LE,
                                      {kCheckpointSlots, setup_.replicas, setup_.n, setup_.d});
    checkpoint_.step = allocated_dataset(g, "step", H5T_STD_I64LE, {kCheckpointSlots});
    checkpoint_.time = allocated_dataset(g, "time", H5T_IEEE_F64LE, {kCheckpointSlots});
    checkpoint_.step_size = allocated_dataset(g, "step_size", H5T_IEEE_F64LE, {kCheckpointSlots});
    checkpoint_.frame = allocated_dataset(g, "frame", H5T_STD_I64LE, {kCheckpointSlots});
    const std::int64_t empty[kCheckpointSlots] = {kEmptyCheckpointSlot, kEmptyCheckpointSlot};
    check_(H5Dwrite(checkpoint_.frame.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, empty),
           "writing", "run/checkpoint/frame");
  }

  /// The state of the frame being appended, into the slot that does not hold the latest
  /// complete frame; its mark follows in flush().
  void write_checkpoint_slot(std::int64_t step, double time, double step_size, const double* x) {
    const hsize_t slot = checkpoint_slot_;
    overwrite_row(check_, checkpoint_.x.get(), slot, H5T_NATIVE_DOUBLE, x, "run/checkpoint/x");
    overwrite_row(check_, checkpoint_.step.get(), slot, H5T_NATIVE_INT64, &step, "run/checkpoint/step");
    overwrite_row(check_, checkpoint_.time.get(), slot, H5T_NATIVE_DOUBLE, &time, "run/checkpoint/time");
    overwrite_row(check_, checkpoint_.step_size.get(), slot, H5T_NATIVE_DOUBLE, &step_size,
                  "run/checkpoint/step_size");
    checkpoint_pending_ = true;
  }

  /// Marks the slot written by write_checkpoint_slot as holding the last appended frame;
  /// the next frame goes to the other slot.
  void mark_checkpoint_slot() {
    const auto frame = static_cast<std::int64_t>(frames_ - 1);
    overwrite_row(check_, checkpoint_.frame.get(), checkpoint_slot_, H5T_NATIVE_INT64, &frame,
                  "run/checkpoint/frame");
    checkpoint_slot_ = 1 - checkpoint_slot_;
    checkpoint_pending_ = false;
  }

  /// After the final frame's slot is marked: the same state into the other slot too, so that
  /// a finished file's /run/checkpoint holds the final frame twice whatever the flushes were
  /// (the older slot would otherwise hold the frame of the flush before, which --flush-interval
  /// decides). The marked slot stays complete while the other is written.
  void settle_checkpoint() {
    write_checkpoint_slot(latest_.step, latest_.time, latest_.step_size, latest_.x.data());
    flush_file();
    mark_checkpoint_slot();
    flush_file();
  }

  /// --resume of a file with a checkpoint: the state of its latest complete slot below
  /// `frames` goes to point (x, step size); returns the frames up to and including that
  /// slot's, which the run continues after.
  hsize_t resume_from_checkpoint(hsize_t frames, ResumePoint& point) {
    auto open = [&](const char* name) {
      const std::string path = std::string("/run/checkpoint/") + name;
      return check_.own(H5Dopen2(file_.get(), path.c_str(), H5P_DEFAULT), H5Dclose, "opening", path);
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

  /// Removes the temporary file of a writer that never published it (declared before file_,
  /// so it runs after the file is closed).
  struct PendingFile {
    std::string path;
    ~PendingFile() {
      if (!path.empty()) ::unlink(path.c_str());
    }
  };

  /// The output's own lock (lock_output), declared first so that it is let go last, after
  /// the file is closed.
  std::unique_ptr<PathLock> output_lock_;
  WriterSetup setup_;
  Checker check_;
  std::string write_path_;
  PendingFile pending_;
  bool published_ = true;
  bool flush_failed_ = false;
  bool reserving_ = true;
  off_t reserved_end_ = 0;
  Handle file_;  // declared first of the handles, so a member-wise destruction closes it last
  Handle run_;
  /// The frame clock: every frame's step and time (in /particles/tokens/position with All,
  /// else in the first observable's group), and the group that holds it.
  Handle step_, time_;
  std::string clock_group_;
  Handle step_size_;  ///< /run/step_size [T], the integrator's next step at each frame
  /// Ends: the step and time of the kept position rows, position_rows_ of them so far (and
  /// flushed_position_rows_ at the last successful flush).
  Handle position_step_, position_time_;
  hsize_t position_rows_ = 0, flushed_position_rows_ = 0;
  /// Ends and None: /run/checkpoint's datasets, the slot the next frame goes to, and whether
  /// a frame has been written to it whose mark flush() has yet to write.
  struct Checkpoint {
    Handle x, step, time, step_size, frame;
    void clear() {
      frame.reset();
      step_size.reset();
      time.reset();
      step.reset();
      x.reset();
    }
  } checkpoint_;
  int checkpoint_slot_ = 0;
  bool checkpoint_pending_ = false;
  std::vector<Handle> particle_groups_;    ///< one per replica
  std::vector<Handle> positions_;          ///< position/value, one per replica
  std::vector<Handle> velocities_;         ///< velocity/value, one per replica (when asked)
  std::vector<Handle> observable_values_;  ///< in setup order
  hsize_t frames_ = 0;          ///< frames appended (flushed and staged)
  hsize_t flushed_frames_ = 0;  ///< frames_ at the last successful flush
  bool write_failed_ = false;   ///< a flush stopped part-way through its rows
  std::vector<StagedRows> staged_;
  /// Ends and None: the state of the latest appended frame, for the checkpoint slot.
  struct LatestFrame {
    std::int64_t step = 0;
    double time = 0.0, step_size = 0.0;
    std::vector<double> x;
    bool final = false;  ///< the run's final frame (FrameRole::Final)
  } latest_;
};

}  // namespace

std::string temporary_output_path(const std::string& path) {
  // The process id and a call number: two writers in one process (Python threads) never share
  // a temporary file, whatever their outputs.
  static std::atomic<std::uint64_t> calls{0};
  return hidden_sibling(path, "." + std::to_string(::getpid()) + "." + std::to_string(calls++) + ".tmp").string();
}

std::unique_ptr<H5mdWriter> H5mdWriter::create(const WriterSetup& setup) {
  return std::make_unique<Hdf5H5mdWriter>(setup);
}

std::unique_ptr<H5mdWriter> H5mdWriter::open_for_resume(const WriterSetup& setup,
                                                        ResumePoint& point) {
  if (!is_mfattn_file(setup.path))
    throw IoError("--resume " + setup.path + ": not an existing mfattn file");
  return std::make_unique<Hdf5H5mdWriter>(setup, point);
}

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
    const hid_t dataset = H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT);
    if (dataset < 0) throw IoError(foreign + "it has no dataset " + name);
    return Handle(dataset, H5Dclose);
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
  } catch (...) {
    return false;
  }
}

}  // namespace mfattn

namespace mfattn {
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

FileSummary describe_file(const std::string& path) {
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

namespace mfattn {

void write_realization(const std::string& path, const RealizationRecord& record) {
  const QuietHdf5Errors quiet;
  const Checker check(path);
  const Handle file = check.own(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose, "opening");
  const Handle group = create_group(check, file.get(), "realization");
  const hsize_t columns = record.columns;
  auto dims = [&](const std::vector<double>& values) {
    return columns > 1 ? std::vector<hsize_t>{values.size() / columns, columns} : std::vector<hsize_t>{values.size()};
  };
  write_fixed_dataset(check, group.get(), "target", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, dims(record.target),
                      record.target.data());
  write_fixed_dataset(check, group.get(), "realized", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, dims(record.realized),
                      record.realized.data());
  write_fixed_dataset(check, group.get(), "u", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {record.u.size()},
                      record.u.data());
  for (const auto& [name, value] : record.texts) write_string_attribute(check, group.get(), name, value);
  for (const auto& [name, value] : record.numbers)
    write_attribute(check, group.get(), name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {}, &value);
  check(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), "flushing /realization");
}

}  // namespace mfattn
