/// \file path_lock.hpp
/// Mutual exclusion of mfattn's own writers, independent of HDF5's file locking.
///
/// A PathLock is an exclusive open-file-description lock (fcntl F_OFD_SETLK) on a small lock
/// file of its own. Why this form:
/// - it belongs to the open file, not to the process or the thread, so two holders in one
///   process (two `mfattn.run` calls in threads) exclude each other, a child that inherits
///   the descriptor keeps it (a sweep's case), and it goes when the last holder exits, however
///   it exits (a SIGKILL leaves the file behind but never a held lock);
/// - it is taken whatever HDF5 is told (HDF5_USE_FILE_LOCKING=FALSE switches off only HDF5's
///   own flock), and being on another file than the HDF5 file it never meets HDF5's flock,
///   which on NFS is emulated by the same byte-range locks.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "mfattn/io/h5md.hpp"

namespace mfattn {

/// The filesystem refuses byte-range locks altogether (ENOLCK, ENOSYS, EOPNOTSUPP: an NFS
/// mount without a lock daemon, Lustre with -o noflock). No exclusion is possible there.
struct LockingUnsupported : IoError {
  using IoError::IoError;
};

class PathLock {
 public:
  /// Creates `path` if needed and locks it; nullptr when another open file holds the lock.
  /// Throws LockingUnsupported (see above) or IoError (the file cannot be created).
  static std::unique_ptr<PathLock> try_acquire(const std::filesystem::path& path);
  /// Removes the lock file, then lets go of the lock: a process that opened the file
  /// meanwhile sees that the name no longer points at what it locked and starts again.
  ~PathLock();
  PathLock(const PathLock&) = delete;
  PathLock& operator=(const PathLock&) = delete;
  int fd() const { return fd_; }

 private:
  PathLock(std::filesystem::path path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::filesystem::path path_;
  int fd_;
};

/// ".<name><suffix>" in the folder of `path`, the name shortened where the whole would
/// exceed the 255 bytes a file name may have: the hidden files that go beside an output
/// (its temporary name while frame 0 is written, its writer's lock file).
std::filesystem::path hidden_sibling(const std::string& path, const std::string& suffix);

/// Writes `text` to `path` whole or not at all: a hidden temporary file in the same folder
/// (named with the host and process), renamed over `path`. Throws IoError (the temporary file
/// removed) when the write or the rename fails.
void write_text_atomically(const std::filesystem::path& path, const std::string& text);

/// The lock file that every writer of the output `path` holds while it writes: `.<name>.lock`
/// beside it (removed when the writer ends; a killed writer leaves it, unlocked).
std::filesystem::path output_lock_path(const std::string& path);

}  // namespace mfattn
