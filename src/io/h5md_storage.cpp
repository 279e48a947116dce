/// \file h5md_storage.cpp
/// The storage rules of the H5MD writer: the disk it reserves, the locks it takes and
/// respects, the temporary name it publishes, and the checkpoint slots that survive a kill.
///
/// Choices made here:
/// - Disk space is reserved before the staged rows are written (fallocate beyond the end of
///   the file, FALLOC_FL_KEEP_SIZE): the chunks they may start plus a margin for metadata.
///   A disk that fills therefore fails the reservation, before any byte of them is written,
///   and the margin still holds the failed status: a frame is in the file whole or not at
///   all. Filesystems without fallocate skip the reservation.
/// - With atomic_publish the file is built under a temporary name and renamed once it holds
///   frame 0 (see WriterSetup).
/// - PositionFrames Ends and None keep the last flushed frame's whole state in
///   /run/checkpoint: two slots used in turn, each marked complete (its frame number) only
///   after its data has been flushed, so a writer killed at any moment leaves the other slot,
///   or both, complete.
#include "mfattn/io/h5md.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "io/h5md_internal.hpp"
#include "io/path_lock.hpp"

namespace mfattn {
namespace h5md_internal {

int latest_usable_checkpoint(const std::int64_t (&marks)[kCheckpointSlots], hsize_t frames) {
  int best = -1;
  for (int slot = 0; slot < static_cast<int>(kCheckpointSlots); ++slot) {
    const std::int64_t frame = marks[slot];
    if (frame < 0 || static_cast<hsize_t>(frame) >= frames) continue;
    if (best < 0 || frame > marks[best]) best = slot;
  }
  return best;
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

/// The file's descriptor (sec2 driver), or -1.
int Hdf5H5mdWriter::file_descriptor() const {
  void* handle = nullptr;
  if (H5Fget_vfd_handle(file_.get(), H5P_DEFAULT, &handle) < 0 || handle == nullptr) return -1;
  return *static_cast<int*>(handle);
}

/// Allocates disk blocks up to `bytes` past HDF5's end of allocation, without changing the
/// file's size, so that the writes of the next frame cannot meet a full disk. A full disk
/// fails here, with nothing of the frame written (IoError). Filesystems that do not
/// support fallocate switch the reservation off.
void Hdf5H5mdWriter::reserve_space(std::size_t bytes) {
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
void Hdf5H5mdWriter::release_reserved_space() noexcept {
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

/// Takes the output's own lock (io/path_lock.hpp), held for the writer's life: another
/// mfattn writer of the same output, in this process or another, is refused whatever
/// HDF5_USE_FILE_LOCKING says. Without --overwrite that other writer is creating the file,
/// so the refusal is that of an existing output (exit 2); with --overwrite and --resume it
/// is OutputBusy (exit 4: retry once it ends). A filesystem without any byte-range locks
/// gives no exclusion at all (nullptr): refusing would make mfattn unusable there, and
/// docs/failure-model.md says so.
std::unique_ptr<PathLock> Hdf5H5mdWriter::lock_output(const std::string& path,
                                                      LockPurpose purpose) {
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
void Hdf5H5mdWriter::refuse_unless_replaceable(const std::string& path) {
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
int Hdf5H5mdWriter::lock_unless_busy(const std::string& path, bool reopen_in_place) {
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
void Hdf5H5mdWriter::refuse_if_busy(const std::string& path, bool reopen_in_place) {
  if (const int fd = lock_unless_busy(path, reopen_in_place); fd >= 0) ::close(fd);
}

/// Renames the temporary file to its final name: without --overwrite only when that name
/// is still free (renameat2 RENAME_NOREPLACE, or link + unlink where it is not supported),
/// with --overwrite only when no other process writes the file it replaces.
void Hdf5H5mdWriter::publish() {
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

/// A fixed-size dataset whose space is allocated when it is created: the checkpoint is
/// rewritten in place every frame, so it never asks the disk for more.
Handle Hdf5H5mdWriter::allocated_dataset(hid_t parent, const char* name, hid_t file_type,
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
void Hdf5H5mdWriter::create_checkpoint() {
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
void Hdf5H5mdWriter::write_checkpoint_slot(std::int64_t step, double time, double step_size,
                                           const double* x) {
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
void Hdf5H5mdWriter::mark_checkpoint_slot() {
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
void Hdf5H5mdWriter::settle_checkpoint() {
  write_checkpoint_slot(latest_.step, latest_.time, latest_.step_size, latest_.x.data());
  flush_file();
  mark_checkpoint_slot();
  flush_file();
}

}  // namespace h5md_internal

std::string temporary_output_path(const std::string& path) {
  // The process id and a call number: two writers in one process (Python threads) never share
  // a temporary file, whatever their outputs.
  // Appended piece by piece: GCC 12 -Wrestrict misfires on "." + string.
  static std::atomic<std::uint64_t> calls{0};
  std::string suffix(1, '.');
  suffix.append(std::to_string(::getpid())).append(1, '.').append(std::to_string(calls++)).append(".tmp");
  return hidden_sibling(path, suffix).string();
}

}  // namespace mfattn
