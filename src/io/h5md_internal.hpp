#pragma once
/// \file h5md_internal.hpp
/// Private to the H5MD files of src/io (h5md_objects.cpp, h5md_writer.cpp, h5md_layout.cpp,
/// h5md_storage.cpp, h5md_reader.cpp; layout: docs/output.md): the HDF5 calls they share,
/// the layout's constants, and the writer class, whose members those files define by job.
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/hdf5_support.hpp"
#include "io/path_lock.hpp"
#include "mfattn/io/h5md.hpp"

namespace mfattn::h5md_internal {

using hdf5::Handle;
using hdf5::QuietHdf5Errors;

// ---- HDF5 calls (h5md_objects.cpp) -------------------------------------------------------------

/// Turns failed HDF5 calls into IoError "<path>: <operation> <object> failed (<reason>)".
class Checker {
 public:
  explicit Checker(std::string path) : path_(std::move(path)) {}
  [[noreturn]] void fail(std::string_view operation, std::string_view object = {}) const;
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

/// A variable-length UTF-8 string type.
Handle utf8_string_type(const Checker& check);

/// A simple dataspace; no dimensions means a scalar. Empty max_dims means fixed size.
Handle dataspace(const Checker& check, const std::vector<hsize_t>& dims,
                 const std::vector<hsize_t>& max_dims = {});

/// Elements in a dataspace of extents `dims` (1 for a scalar).
hsize_t element_count(const std::vector<hsize_t>& dims);

Handle create_group(const Checker& check, hid_t parent, const std::string& name);

/// Writes attribute `name`, replacing any earlier one (whose type or shape may differ). An
/// earlier one of the same type and shape is written in place: the object header keeps its
/// size (a run rewrites /run's counts with every frame).
void write_attribute(const Checker& check, hid_t object, const std::string& name, hid_t file_type,
                     hid_t memory_type, const std::vector<hsize_t>& dims, const void* data);

void write_string_attribute(const Checker& check, hid_t object, const std::string& name,
                            const std::string& value);

void write_strings_attribute(const Checker& check, hid_t object, const std::string& name,
                             const std::vector<std::string>& values);

void write_int32_array_attribute(const Checker& check, hid_t object, const std::string& name,
                                 const std::vector<std::int32_t>& values);

/// Rows of `row_bytes` per chunk so that a chunk holds about `target_bytes` (at least one row).
hsize_t rows_per_chunk(std::size_t row_bytes, std::size_t target_bytes);

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
                              ChunkPlan& plan);

/// The extents of a dataset's dataspace.
std::vector<hsize_t> dataset_dims(const Checker& check, hid_t dataset, const char* what);

struct RowSelection {
  Handle file_space, memory_space;
};

/// Selects rows [first, first + rows) of `dataset` (elements of a 1-D dataset) and a memory
/// space to match.
RowSelection select_rows(const Checker& check, hid_t dataset, hsize_t first, hsize_t rows,
                         const char* what);

RowSelection select_row(const Checker& check, hid_t dataset, hsize_t row, const char* what);

/// Sets the length of `dataset` to `first + rows` rows and writes those rows from `data`.
void write_rows(const Checker& check, hid_t dataset, hsize_t first, hsize_t rows,
                hid_t memory_type, const void* data, const char* what);

/// Writes row `row` of `dataset` in place (the dataset keeps its extent).
void overwrite_row(const Checker& check, hid_t dataset, hsize_t row, hid_t memory_type,
                   const void* data, const char* what);

void read_row(const Checker& check, hid_t dataset, hsize_t row, hid_t memory_type, void* out,
              const char* what);

/// Writes a fixed-size dataset, replacing an earlier one of the same name. One of more than
/// kCompressedFixedBytes is stored in chunks of about that size, shuffled and deflated (level
/// 1): the identity Q, K and V of attention_matrices at d = 4096 were 400 MB of zeros.
inline constexpr std::size_t kCompressedFixedBytes = std::size_t{1} << 20;
/// The largest d whose file keeps HDF5's oldest format: the box's boundary attribute (d
/// variable-length strings, 16 bytes each) must stay within its 64 KiB header message. Larger
/// d take the 1.8 format (h5md_writer.cpp).
inline constexpr std::size_t kOldestFormatLargestD = 2048;
void write_fixed_dataset(const Checker& check, hid_t parent, const std::string& name,
                         hid_t file_type, hid_t memory_type, const std::vector<hsize_t>& dims,
                         const void* data);

// ---- The layout's constants ------------------------------------------------------------------

inline std::string particle_group_name(std::size_t replica) {
  return replica == 0 ? "tokens" : "tokens_r" + std::to_string(replica);
}

/// Replica 0's position group: the frame clock of a file that keeps every frame's positions,
/// and the kept frames' step and time of one that keeps the ends.
inline const std::string kPositionClockGroup = "/particles/tokens/position/";
inline const std::string kFieldGroup = "/fields/density/";
inline constexpr std::size_t kPositionChunkBytes = 256 * 1024;
inline constexpr std::size_t kSeriesChunkBytes = 64 * 1024;  // step, time and observables
/// PositionFrames::Ends keeps two position rows (t = 0 and the horizon); a run resumed to a
/// longer horizon adds one more, in a chunk of its own.
inline constexpr std::size_t kEndsPositionRows = 2;
/// The chunk B-tree's K (H5Pset_istore_k) of files written with Ends or None.
inline constexpr unsigned kSmallFileChunkIndexK = 4;
/// Slots of /run/checkpoint: the one being written and the last complete one.
inline constexpr hsize_t kCheckpointSlots = 2;
/// The frame number a checkpoint slot holds until it holds one.
inline constexpr std::int64_t kEmptyCheckpointSlot = -1;

/// The slot of /run/checkpoint whose complete frame is the latest one below `frames` (the
/// frames every growing dataset holds), or -1. `marks` are the slots' frame numbers.
/// (h5md_storage.cpp)
int latest_usable_checkpoint(const std::int64_t (&marks)[kCheckpointSlots], hsize_t frames);

// ---- The writer --------------------------------------------------------------------------------

/// The H5mdWriter of mfattn's files. Its members are defined by job: the frames and the
/// writer's life in h5md_writer.cpp, the groups, datasets and labels in h5md_layout.cpp, the
/// disk reservation, output locks, publishing and checkpoint slots in h5md_storage.cpp, and
/// the reopening for --resume in h5md_reader.cpp.
class Hdf5H5mdWriter final : public H5mdWriter {
 public:
  explicit Hdf5H5mdWriter(const WriterSetup& setup);             // h5md_writer.cpp
  Hdf5H5mdWriter(const WriterSetup& setup, ResumePoint& point);  // h5md_reader.cpp
  ~Hdf5H5mdWriter() override;                                    // h5md_writer.cpp
  Hdf5H5mdWriter(const Hdf5H5mdWriter&) = delete;
  Hdf5H5mdWriter& operator=(const Hdf5H5mdWriter&) = delete;

  // h5md_layout.cpp
  void write_parameters(const std::vector<Parameter>& parameters) override;
  void write_labels(const TokenLabels& labels) override;
  void write_field_dataset(const std::string& name, const std::vector<std::size_t>& shape,
                           const std::vector<double>& values) override;

  // h5md_writer.cpp
  void append_frame(std::int64_t step, double time, const double* positions,
                    const std::vector<std::vector<double>>& observables,
                    double step_size, const double* velocities, FrameRole role) override;
  std::size_t staged_bytes() const override;
  void write_run_info(const std::string& status, double wall_seconds, std::int64_t steps,
                      std::int64_t rejected_steps) override;
  void write_run_progress(double wall_seconds, std::int64_t steps,
                          std::int64_t rejected_steps) override;
  void flush() override;
  std::string current_path() const override { return published_ ? setup_.path : write_path_; }
  std::size_t flushed_frames() const override { return flushed_frames_; }

 private:
  /// Room for the metadata that a frame, a status or a close may add (B-tree nodes, object
  /// header continuations, heap blocks), beyond the chunks a frame starts.
  static constexpr std::size_t kMetadataMargin = 256 * 1024;

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

  /// What a writer is about to do with its output: the refusal when another writer holds it
  /// says what to do.
  enum class LockPurpose { Create, Replace, Resume };

  bool keeps_every_position() const { return setup_.position_frames == PositionFrames::All; }

  /// Ends and None: the positions of the last flushed frame are not in the position element,
  /// so /run/checkpoint holds them for --resume.
  bool keeps_checkpoint() const { return !keeps_every_position(); }

  // h5md_writer.cpp
  void flush_file();
  void stage(hid_t dataset, hsize_t row, hid_t memory_type, const void* data, std::size_t row_bytes,
             const char* what, bool per_frame = true);
  void write_staged(hsize_t frames);
  void write_staged_frames();
  void roll_back_quietly() noexcept;
  void roll_back_to_flushed_frames();
  std::vector<hid_t> growing_datasets() const;
  std::vector<hid_t> position_row_datasets() const;
  ChunkPlan plan_of(hid_t dataset) const;

  // h5md_layout.cpp
  Handle grow(hid_t parent, const std::string& name, hid_t file_type,
              const std::vector<hsize_t>& row_shape, std::size_t target_chunk_bytes,
              Filters filters);
  Handle position_dataset(hid_t parent, const std::string& name, hid_t file_type,
                          const std::vector<hsize_t>& row_shape, std::size_t target_chunk_bytes,
                          Filters filters);
  void write_h5md_group();
  void create_particle_groups();
  /// A density file's /fields/density/{step, time, value} (WriterSetup::field_shape).
  void create_field_group();
  bool is_field_file() const { return !setup_.field_shape.empty(); }
  void write_prefix(const TokenLabels& labels);
  void write_attention_matrices(const TokenLabels& labels);
  void write_label_datasets(hid_t g, std::size_t count, std::size_t k, const double* aux_position,
                            const std::int32_t* prompt_id, const double* presence,
                            const std::int64_t* id);
  void create_observables();
  void link_step_and_time(hid_t group, const std::string& source_group);
  void link_labels_of_replica_0(hid_t group, bool gauge);
  void link_group_of_replica_0(hid_t group, const char* name);
  static std::string frame_clock_path(const WriterSetup& setup);

  // h5md_storage.cpp
  std::size_t staged_space_needed(hsize_t frames) const;
  int file_descriptor() const;
  void reserve_space(std::size_t bytes);
  void release_reserved_space() noexcept;
  static std::unique_ptr<PathLock> lock_output(const std::string& path, LockPurpose purpose);
  static void refuse_unless_replaceable(const std::string& path);
  static int lock_unless_busy(const std::string& path, bool reopen_in_place = false);
  static void refuse_if_busy(const std::string& path, bool reopen_in_place = false);
  void publish();
  Handle allocated_dataset(hid_t parent, const char* name, hid_t file_type,
                           const std::vector<hsize_t>& dims);
  void create_checkpoint();
  void write_checkpoint_slot(std::int64_t step, double time, double step_size, const double* x);
  void mark_checkpoint_slot();
  void settle_checkpoint();

  // h5md_reader.cpp
  hsize_t resume_from_checkpoint(hsize_t frames, ResumePoint& point);

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

}  // namespace mfattn::h5md_internal
