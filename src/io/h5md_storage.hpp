#pragma once
/// \file h5md_storage.hpp
/// The storage policy of the H5MD writer (private to src/io; definitions in h5md_storage.cpp):
/// where a file's bytes go and when they count. OutputStorage owns the output's name: the
/// locks it takes and respects, the temporary name it publishes, and the disk it reserves
/// before a frame is written. CheckpointSlots owns /run/checkpoint: the state of the last
/// flushed frame, in two slots used in turn, for --resume of a file that does not keep every
/// frame's positions. Neither knows the layout of the file beyond its own objects.
#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/h5md_objects.hpp"
#include "io/path_lock.hpp"
#include "mfattn/io/h5md.hpp"

namespace mfattn::h5md_internal {

/// The output file's name and the disk under it, for the writer's whole life.
///
/// A new file (Create, Replace): the output's own lock is taken (another writer of the same
/// output is refused), an existing file is refused without --overwrite and, with it,
/// refused unless it is a regular file no other process writes; with atomic_publish the
/// file is written under temporary_output_path and publish() renames it. A resumed file
/// (Resume): the lock, and an exclusive probe (no reader or writer may hold the file).
class OutputStorage {
 public:
  /// What the writer is about to do with its output: the refusal when another writer holds
  /// it says what to do.
  enum class Purpose { Create, Replace, Resume };

  OutputStorage(const WriterSetup& setup, Purpose purpose);
  OutputStorage(const OutputStorage&) = delete;
  OutputStorage& operator=(const OutputStorage&) = delete;

  /// The name the file is created under (the temporary one until it is published).
  const std::string& write_path() const { return write_path_; }
  /// The name the file has now.
  const std::string& current_path() const { return published_ ? path_ : write_path_; }
  bool published() const { return published_; }
  /// Renames the temporary file to its final name: without --overwrite only when that name
  /// is still free, with --overwrite only when no other process writes the file it replaces.
  void publish();

  /// Allocates disk blocks up to `bytes` past HDF5's end of allocation of `file`, without
  /// changing the file's size, so that the writes of the next frame cannot meet a full disk.
  /// A full disk fails here, with nothing of the frame written (IoError). Filesystems that
  /// do not support fallocate switch the reservation off.
  void reserve(hid_t file, std::size_t bytes);
  /// Gives back the blocks reserved past the end of `file` (a failed or finished run must
  /// not keep a disk full for others).
  void release(hid_t file) noexcept;

 private:
  static std::unique_ptr<PathLock> lock_output(const std::string& path, Purpose purpose);
  static void refuse_unless_replaceable(const std::string& path);
  static int lock_unless_busy(const std::string& path, bool reopen_in_place = false);
  static void refuse_if_busy(const std::string& path, bool reopen_in_place = false);

  /// Removes the temporary file of a writer that never published it (declared after the
  /// lock, so it runs before the lock is let go; the writer closes the file before this).
  struct PendingFile {
    std::string path;
    ~PendingFile() {
      if (!path.empty()) ::unlink(path.c_str());
    }
  };

  /// The output's own lock (lock_output), declared first so that it is let go last.
  std::unique_ptr<PathLock> lock_;
  std::string path_;
  bool overwrite_ = false;
  std::string write_path_;
  PendingFile pending_;
  bool published_ = true;
  bool reserving_ = true;
  off_t reserved_end_ = 0;
};

/// /run/checkpoint of a file written with PositionFrames Ends or None: x [2, R, n, d], step,
/// time, step_size and frame [2]. frame[s] is the frame slot s holds (kEmptyCheckpointSlot
/// while it holds none), written only after the slot's data has been flushed, so a writer
/// killed at any moment leaves the other slot, or both, complete.
class CheckpointSlots {
 public:
  /// Creates the datasets in `run` (space allocated at once: the slots are rewritten in place
  /// every frame, so they never ask the disk for more), both slots empty.
  void create(const Checker& check, hid_t run, const std::vector<hsize_t>& state_shape);
  /// Opens the datasets of a file being resumed and reads its latest complete slot below
  /// `frames` (the frames every growing dataset holds) into point.x and point.step_size;
  /// step and time receive the slot's clock. Returns that slot's frame number; the next
  /// frame goes to the other slot. IoError when no slot is complete or the shape differs.
  std::int64_t open_latest(const Checker& check, hid_t file, const std::vector<hsize_t>& state_shape,
                           hsize_t frames, ResumePoint& point, std::int64_t& step, double& time);
  /// The state of the frame being appended, into the slot that does not hold the latest
  /// complete frame; its mark follows.
  void write(const Checker& check, std::int64_t step, double time, double step_size, const double* x);
  /// Marks the slot last written as holding frame `frame`; the next frame goes to the other.
  void mark(const Checker& check, std::int64_t frame);
  /// A slot was written whose mark is still to be written.
  bool pending() const { return pending_; }
  /// An unmarked slot stays unmarked (after a failed write): its older mark keeps it from
  /// being taken.
  void forget_pending() { pending_ = false; }
  void close();

 private:
  Handle x_, step_, time_, step_size_, frame_;
  int slot_ = 0;
  bool pending_ = false;
};

}  // namespace mfattn::h5md_internal
