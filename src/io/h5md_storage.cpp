/// \file h5md_storage.cpp
/// The storage policy of the H5MD writer (h5md_storage.hpp): OutputStorage, the disk it
/// reserves, the locks it takes and respects and the temporary name it publishes, and
/// CheckpointSlots, the checkpoint slots that survive a kill.
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
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "io/h5md_storage.hpp"

#include "io/h5md_objects.hpp"
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

OutputStorage::OutputStorage(const WriterSetup& setup, Purpose purpose)
    : lock_(lock_output(setup.path, purpose)),
      path_(setup.path),
      overwrite_(setup.overwrite),
      write_path_(setup.atomic_publish && purpose != Purpose::Resume ? temporary_output_path(setup.path)
                                                                     : setup.path) {
  if (purpose == Purpose::Resume) {
    refuse_if_busy(path_, /*reopen_in_place=*/true);
    return;
  }
  std::error_code ignored;
  // symlink_status: a symbolic link is something at the path even when its target is missing
  // (the publishing rename would find it and not replace it).
  if (!overwrite_ && std::filesystem::exists(std::filesystem::symlink_status(path_, ignored))) {
    const bool dangling = std::filesystem::is_symlink(std::filesystem::symlink_status(path_, ignored)) &&
                          !std::filesystem::exists(path_, ignored);
    throw OutputExists("output file " + path_ + (dangling ? " is a symbolic link to a missing file" : " exists") +
                       " (use --overwrite to replace it)");
  }
  if (overwrite_) {
    refuse_unless_replaceable(path_);
    refuse_if_busy(path_);
  }
  if (setup.atomic_publish) {
    // A leftover of this process id and call number (a killed run long ago) is ours to
    // replace.
    ::unlink(write_path_.c_str());
    pending_.path = write_path_;
    published_ = false;
  }
}

namespace {

/// The file's descriptor (sec2 driver), or -1.
int file_descriptor(hid_t file) {
  void* handle = nullptr;
  if (H5Fget_vfd_handle(file, H5P_DEFAULT, &handle) < 0 || handle == nullptr) return -1;
  return *static_cast<int*>(handle);
}

}  // namespace

void OutputStorage::reserve(hid_t file, std::size_t bytes) {
  // MFATTN_NO_SPACE_RESERVATION=1 behaves as a filesystem without fallocate (tests use it).
  static const bool disabled = [] {
    const char* value = std::getenv("MFATTN_NO_SPACE_RESERVATION");
    return value != nullptr && std::string(value) == "1";
  }();
  if (disabled) reserving_ = false;
  if (!reserving_) return;
  const int fd = file_descriptor(file);
  haddr_t eoa = 0;
  if (fd < 0 || H5Fget_eoa(file, &eoa) < 0) {
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
  throw IoError(path_ + ": reserving " + std::to_string(bytes) +
                " bytes of disk space for the next frame failed (" + std::strerror(error) + ")");
}

void OutputStorage::release(hid_t file) noexcept {
  if (reserved_end_ == 0 || file < 0) return;
  const int fd = file_descriptor(file);
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
std::unique_ptr<PathLock> OutputStorage::lock_output(const std::string& path, Purpose purpose) {
  std::unique_ptr<PathLock> lock;
  try {
    lock = PathLock::try_acquire(output_lock_path(path));
  } catch (const LockingUnsupported&) {
    return nullptr;
  } catch (const IoError& e) {
    throw IoError("output file " + path + ": " + e.what());
  }
  if (lock) return lock;
  if (purpose == Purpose::Create)
    throw OutputExists("output file " + path + " is being written by another run (use another --out, "
                       "or wait for that run and pass --overwrite to replace its file)");
  throw OutputBusy("output file " + path + " is being written by another mfattn run, in another process "
                   "or thread (its lock " + output_lock_path(path).string() + " is held); it was left untouched");
}

/// --overwrite replaces a regular file (or a link to one) and nothing else: renaming over a
/// device node or a FIFO would replace it with a file (OutputNotReplaceable, exit 2).
void OutputStorage::refuse_unless_replaceable(const std::string& path) {
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
int OutputStorage::lock_unless_busy(const std::string& path, bool reopen_in_place) {
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
void OutputStorage::refuse_if_busy(const std::string& path, bool reopen_in_place) {
  if (const int fd = lock_unless_busy(path, reopen_in_place); fd >= 0) ::close(fd);
}

/// Without --overwrite: renameat2 RENAME_NOREPLACE, or link + unlink where it is not
/// supported.
void OutputStorage::publish() {
  const std::string& target = path_;
  if (overwrite_) {
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

namespace {

/// A fixed-size dataset whose space is allocated when it is created.
Handle allocated_dataset(const Checker& check, hid_t parent, const char* name, hid_t file_type,
                         const std::vector<hsize_t>& dims) {
  Handle space = dataspace(check, dims);
  Handle properties = check.own(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "creating properties");
  check(H5Pset_alloc_time(properties.get(), H5D_ALLOC_TIME_EARLY), "allocating", name);
  return check.own(H5Dcreate2(parent, name, file_type, space.get(), H5P_DEFAULT, properties.get(), H5P_DEFAULT),
                   H5Dclose, "creating dataset", name);
}

}  // namespace

void CheckpointSlots::create(const Checker& check, hid_t run, const std::vector<hsize_t>& state_shape) {
  Handle group = create_group(check, run, "checkpoint");
  const hid_t g = group.get();
  std::vector<hsize_t> x_dims{kCheckpointSlots};
  x_dims.insert(x_dims.end(), state_shape.begin(), state_shape.end());
  x_ = allocated_dataset(check, g, "x", H5T_IEEE_F64LE, x_dims);
  step_ = allocated_dataset(check, g, "step", H5T_STD_I64LE, {kCheckpointSlots});
  time_ = allocated_dataset(check, g, "time", H5T_IEEE_F64LE, {kCheckpointSlots});
  step_size_ = allocated_dataset(check, g, "step_size", H5T_IEEE_F64LE, {kCheckpointSlots});
  frame_ = allocated_dataset(check, g, "frame", H5T_STD_I64LE, {kCheckpointSlots});
  const std::int64_t empty[kCheckpointSlots] = {kEmptyCheckpointSlot, kEmptyCheckpointSlot};
  check(H5Dwrite(frame_.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, empty), "writing",
        "run/checkpoint/frame");
}

std::int64_t CheckpointSlots::open_latest(const Checker& check, hid_t file, const std::vector<hsize_t>& state_shape,
                                          hsize_t frames, ResumePoint& point, std::int64_t& step, double& time) {
  auto open = [&](const char* name) {
    const std::string path = std::string("/run/checkpoint/") + name;
    Handle dataset = hdf5::open_dataset(file, path);
    if (!dataset.valid()) check.fail("opening", path);
    return dataset;
  };
  x_ = open("x");
  step_ = open("step");
  time_ = open("time");
  step_size_ = open("step_size");
  frame_ = open("frame");
  std::vector<hsize_t> x_dims{kCheckpointSlots};
  x_dims.insert(x_dims.end(), state_shape.begin(), state_shape.end());
  if (dataset_dims(check, x_.get(), "run/checkpoint/x") != x_dims)
    throw IoError(check.path() + ": run/checkpoint/x is not [2, R, n, d] of this run");
  std::int64_t marks[kCheckpointSlots];
  check(H5Dread(frame_.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, marks), "reading",
        "run/checkpoint/frame");
  const int slot = latest_usable_checkpoint(marks, frames);
  if (slot < 0) throw IoError(check.path() + ": --resume found no complete slot in /run/checkpoint");
  const auto s = static_cast<hsize_t>(slot);
  read_row(check, x_.get(), s, H5T_NATIVE_DOUBLE, point.x.data(), "run/checkpoint/x");
  read_row(check, step_.get(), s, H5T_NATIVE_INT64, &step, "run/checkpoint/step");
  read_row(check, time_.get(), s, H5T_NATIVE_DOUBLE, &time, "run/checkpoint/time");
  read_row(check, step_size_.get(), s, H5T_NATIVE_DOUBLE, &point.step_size, "run/checkpoint/step_size");
  slot_ = 1 - slot;
  return marks[slot];
}

void CheckpointSlots::write(const Checker& check, std::int64_t step, double time, double step_size,
                            const double* x) {
  const auto slot = static_cast<hsize_t>(slot_);
  overwrite_row(check, x_.get(), slot, H5T_NATIVE_DOUBLE, x, "run/checkpoint/x");
  overwrite_row(check, step_.get(), slot, H5T_NATIVE_INT64, &step, "run/checkpoint/step");
  overwrite_row(check, time_.get(), slot, H5T_NATIVE_DOUBLE, &time, "run/checkpoint/time");
  overwrite_row(check, step_size_.get(), slot, H5T_NATIVE_DOUBLE, &step_size, "run/checkpoint/step_size");
  pending_ = true;
}

void CheckpointSlots::mark(const Checker& check, std::int64_t frame) {
  overwrite_row(check, frame_.get(), static_cast<hsize_t>(slot_), H5T_NATIVE_INT64, &frame,
                "run/checkpoint/frame");
  slot_ = 1 - slot_;
  pending_ = false;
}

void CheckpointSlots::close() {
  frame_.reset();
  step_size_.reset();
  time_.reset();
  step_.reset();
  x_.reset();
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
