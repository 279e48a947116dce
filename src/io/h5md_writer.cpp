/// \file h5md_writer.cpp
/// H5MD 1.1 output through the HDF5 C API (h5md_writer.hpp; layout: docs/output.md): the
/// writer's frames and its end. The file's groups and datasets are made or reopened in
/// h5md_layout.cpp, its storage policy (disk reservation, output locks, publishing,
/// checkpoint slots) is h5md_storage.cpp's.
///
/// Choices made here:
/// - HDF5's automatic error printing is switched off for the duration of every call into this
///   file, and each failed HDF5 call becomes an IoError naming the file and the operation.
/// - append_frame copies a frame into staged rows; flush() writes them, one block per
///   dataset, and calls H5Fflush. The caller chooses how many frames a flush carries (run:
///   --flush-interval).
#include "mfattn/io/h5md.hpp"

#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/h5md_writer.hpp"

#include "io/h5md_objects.hpp"

namespace mfattn {
namespace h5md_internal {

/// Flushes frames still staged in a published file (as a stream's destructor does; an
/// unpublished one is removed, as ever), then closes every object, then the file, with
/// error printing still off: a failing flush or close (disk full) has nobody to report to
/// from a destructor, and the file keeps its last flushed frames.
Hdf5H5mdWriter::~Hdf5H5mdWriter() {
  QuietHdf5Errors quiet;
  if (storage_.published() && frames_ > flushed_frames_ && !write_failed_ && !flush_failed_) {
    try {
      flush();
    } catch (...) {
      roll_back_quietly();
    }
  }
  storage_.release(file_.valid() ? file_.get() : -1);
  observable_values_.clear();
  positions_.clear();
  velocities_.clear();
  particle_groups_.clear();
  checkpoint_.close();
  position_step_.reset();
  position_time_.reset();
  step_.reset();
  time_.reset();
  step_size_.reset();
  run_.reset();
  file_.reset();
}

void Hdf5H5mdWriter::append_frame(std::int64_t step, double time, const double* positions,
                                  const std::vector<std::vector<double>>& observables,
                                  double step_size, const double* velocities, FrameRole role) {
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

std::size_t Hdf5H5mdWriter::staged_bytes() const {
  std::size_t bytes = 0;
  for (const StagedRows& rows : staged_) bytes += rows.bytes.size();
  return bytes;
}

void Hdf5H5mdWriter::write_run_info(const std::string& status, double wall_seconds,
                                    std::int64_t steps, std::int64_t rejected_steps) {
  QuietHdf5Errors quiet;
  if (write_failed_ || flush_failed_) roll_back_to_flushed_frames();
  write_string_attribute(check_, run_.get(), "status", status);
  write_run_progress(wall_seconds, steps, rejected_steps);
}

void Hdf5H5mdWriter::write_run_progress(double wall_seconds, std::int64_t steps,
                                        std::int64_t rejected_steps) {
  QuietHdf5Errors quiet;
  const hid_t run = run_.get();
  write_attribute(check_, run, "wall_time_s", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {},
                  &wall_seconds);
  write_attribute(check_, run, "steps", H5T_STD_I64LE, H5T_NATIVE_INT64, {}, &steps);
  write_attribute(check_, run, "rejected_steps", H5T_STD_I64LE, H5T_NATIVE_INT64, {},
                  &rejected_steps);
}

void Hdf5H5mdWriter::flush() {
  if (frames_ > flushed_frames_) write_staged_frames();
  try {
    flush_file();
    // Only now is the slot's data in the file: its mark goes after it, in a second flush.
    if (checkpoint_.pending() && !flush_failed_) {
      checkpoint_.mark(check_, static_cast<std::int64_t>(frames_ - 1));
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
  if (!storage_.published() && frames_ > 0 && !flush_failed_) storage_.publish();
}

void Hdf5H5mdWriter::flush_file() {
  QuietHdf5Errors quiet;
  check_(H5Fflush(file_.get(), H5F_SCOPE_GLOBAL), "flushing the file");
}

/// Copies one row of `dataset` (row number `row`, the next after its staged ones) into
/// its staged block.
void Hdf5H5mdWriter::stage(hid_t dataset, hsize_t row, hid_t memory_type, const void* data,
                           std::size_t row_bytes, const char* what, bool per_frame) {
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
std::size_t Hdf5H5mdWriter::staged_space_needed(hsize_t frames) const {
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
void Hdf5H5mdWriter::write_staged(hsize_t frames) {
  QuietHdf5Errors quiet;
  const hsize_t staged_frames = frames_ - flushed_frames_;
  for (StagedRows& rows : staged_) {
    const hsize_t count = rows.rows_of(frames, staged_frames);
    if (count > 0)
      write_rows(check_, rows.dataset, rows.first_row, count, rows.memory_type, rows.bytes.data(),
                 rows.what);
    rows.bytes.clear();
  }
  if (keeps_checkpoint() && frames == staged_frames) write_checkpoint_slot();
}

/// The latest appended frame's state into the checkpoint's free slot.
void Hdf5H5mdWriter::write_checkpoint_slot() {
  checkpoint_.write(check_, latest_.step, latest_.time, latest_.step_size, latest_.x.data());
}

/// After the final frame's slot is marked: the same state into the other slot too, so that
/// a finished file's /run/checkpoint holds the final frame twice whatever the flushes were
/// (the older slot would otherwise hold the frame of the flush before, which --flush-interval
/// decides). The marked slot stays complete while the other is written.
void Hdf5H5mdWriter::settle_checkpoint() {
  write_checkpoint_slot();
  flush_file();
  checkpoint_.mark(check_, static_cast<std::int64_t>(frames_ - 1));
  flush_file();
}

/// Writes the staged frames. The disk space for them is reserved first, so a disk that
/// fills fails before any byte of them is written; then the largest number of whole frames
/// that still fits is written and flushed (without a new checkpoint slot: --resume then
/// continues from the last one), the rest dropped, and the IoError passed on.
void Hdf5H5mdWriter::write_staged_frames() {
  const hsize_t staged_frames = frames_ - flushed_frames_;
  // A write that fails half-way leaves rows that write_run_info takes back.
  write_failed_ = true;
  try {
    storage_.reserve(file_.get(), staged_space_needed(staged_frames));
  } catch (const IoError&) {
    hsize_t fits = 0, fails = staged_frames;
    while (fits + 1 < fails) {
      const hsize_t middle = fits + (fails - fits) / 2;
      try {
        storage_.reserve(file_.get(), staged_space_needed(middle));
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
void Hdf5H5mdWriter::roll_back_quietly() noexcept {
  try {
    roll_back_to_flushed_frames();
  } catch (...) {
  }
}

/// After a failed write or flush (where no reservation protected it: a filesystem without
/// fallocate), shrinks every growing dataset back to the frames of the last successful
/// flush, so that a partly written frame does not stay in the file as a frame of zeros, and
/// drops the rows still staged.
void Hdf5H5mdWriter::roll_back_to_flushed_frames() {
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
  checkpoint_.forget_pending();
  write_failed_ = flush_failed_ = false;
}

/// Every dataset that append_frame extends by a row per frame.
std::vector<hid_t> Hdf5H5mdWriter::growing_datasets() const {
  std::vector<hid_t> all{step_.get(), time_.get(), step_size_.get()};
  if (keeps_every_position()) {
    for (const Handle& h : positions_) all.push_back(h.get());
    for (const Handle& h : velocities_) all.push_back(h.get());
  }
  for (const Handle& h : observable_values_) all.push_back(h.get());
  return all;
}

/// Ends: the datasets that grow by a row per kept frame.
std::vector<hid_t> Hdf5H5mdWriter::position_row_datasets() const {
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
ChunkPlan Hdf5H5mdWriter::plan_of(hid_t dataset) const {
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

}  // namespace h5md_internal

using h5md_internal::Hdf5H5mdWriter;

std::unique_ptr<H5mdWriter> H5mdWriter::create(const WriterSetup& setup) {
  return std::make_unique<Hdf5H5mdWriter>(setup);
}

std::unique_ptr<H5mdWriter> H5mdWriter::open_for_resume(const WriterSetup& setup,
                                                        ResumePoint& point) {
  if (!is_mfattn_file(setup.path))
    throw IoError("--resume " + setup.path + ": not an existing mfattn file");
  return std::make_unique<Hdf5H5mdWriter>(setup, point);
}

}  // namespace mfattn
