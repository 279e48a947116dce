#pragma once
/// \file h5md_writer.hpp
/// The H5mdWriter of mfattn's files (private to src/io; layout: docs/output.md): the layout
/// writer. It makes the file's groups and datasets, or opens them again for --resume
/// (h5md_layout.cpp), and stages and writes the frames (h5md_writer.cpp). Where the bytes
/// go and when they count is its storage policy's (OutputStorage, CheckpointSlots:
/// h5md_storage.hpp); reading a finished file back is the readers' (h5md_reader.cpp).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "io/h5md_objects.hpp"
#include "io/h5md_storage.hpp"
#include "mfattn/io/h5md.hpp"

namespace mfattn::h5md_internal {

class Hdf5H5mdWriter final : public H5mdWriter {
 public:
  explicit Hdf5H5mdWriter(const WriterSetup& setup);             // h5md_layout.cpp
  Hdf5H5mdWriter(const WriterSetup& setup, ResumePoint& point);  // h5md_layout.cpp
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
  std::string current_path() const override { return storage_.current_path(); }
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

  bool keeps_every_position() const { return setup_.position_frames == PositionFrames::All; }

  /// Ends and None: the positions of the last flushed frame are not in the position element,
  /// so /run/checkpoint holds them for --resume.
  bool keeps_checkpoint() const { return !keeps_every_position(); }

  /// The shape of one frame's state, [R, n, d] (a checkpoint slot).
  std::vector<hsize_t> state_shape() const { return {setup_.replicas, setup_.n, setup_.d}; }

  // h5md_writer.cpp
  void flush_file();
  void stage(hid_t dataset, hsize_t row, hid_t memory_type, const void* data, std::size_t row_bytes,
             const char* what, bool per_frame = true);
  std::size_t staged_space_needed(hsize_t frames) const;
  void write_staged(hsize_t frames);
  void write_staged_frames();
  void write_checkpoint_slot();
  void settle_checkpoint();
  void roll_back_quietly() noexcept;
  void roll_back_to_flushed_frames();
  std::vector<hid_t> growing_datasets() const;
  std::vector<hid_t> position_row_datasets() const;
  ChunkPlan plan_of(hid_t dataset) const;

  // h5md_layout.cpp
  void check_setup() const;
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
  hsize_t resume_from_checkpoint(hsize_t frames, ResumePoint& point);

  /// The output's name, locks and disk: declared before file_, so that the file is closed
  /// before its temporary name is removed and its lock let go.
  OutputStorage storage_;
  WriterSetup setup_;
  Checker check_;
  bool flush_failed_ = false;
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
  /// Ends and None: /run/checkpoint.
  CheckpointSlots checkpoint_;
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
