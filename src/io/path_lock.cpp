#include "io/path_lock.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

namespace mfattn {

std::unique_ptr<PathLock> PathLock::try_acquire(const std::filesystem::path& path) {
  // A holder removes the file before it lets go, so a few rounds can meet a vanished name;
  // a hundred without success means something keeps replacing it.
  constexpr int kAttempts = 100;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    // O_NONBLOCK: a FIFO planted under the lock's name does not hang the open.
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW, 0644);
    if (fd < 0) throw IoError("cannot create the lock file " + path.string() + ": " + std::strerror(errno));
    struct stat held {};
    if (::fstat(fd, &held) != 0 || !S_ISREG(held.st_mode)) {
      ::close(fd);
      throw IoError("cannot lock " + path.string() + ": it is not a regular file");
    }
    struct flock lock {};
    lock.l_type = F_WRLCK;
    lock.l_whence = SEEK_SET;
    if (::fcntl(fd, F_OFD_SETLK, &lock) != 0) {
      const int error = errno;
      ::close(fd);
      if (error == EAGAIN || error == EACCES) return nullptr;
      if (error == ENOLCK || error == ENOSYS || error == EOPNOTSUPP || error == EINVAL)
        throw LockingUnsupported("cannot lock " + path.string() + ": " + std::strerror(error));
      throw IoError("cannot lock " + path.string() + ": " + std::strerror(error));
    }
    // If the name no longer points at the file we locked, its holder finished and removed
    // it meanwhile: lock the file the name points at now.
    struct stat named {};
    if (::stat(path.c_str(), &named) == 0 && held.st_ino == named.st_ino && held.st_dev == named.st_dev)
      return std::unique_ptr<PathLock>(new PathLock(path, fd));
    ::close(fd);
  }
  throw IoError("cannot lock " + path.string() + ": it keeps being replaced");
}

PathLock::~PathLock() {
  std::error_code ignored;
  std::filesystem::remove(path_, ignored);
  ::close(fd_);
}

std::filesystem::path hidden_sibling(const std::string& path, const std::string& suffix) {
  const std::filesystem::path target(path);
  std::string name = target.filename().string();
  // NAME_MAX is 255 bytes on every filesystem mfattn is used on; keep the front of the name.
  constexpr std::size_t kNameMax = 255;
  if (name.size() + 1 + suffix.size() > kNameMax) name.resize(kNameMax - 1 - suffix.size());
  return target.parent_path() / ("." + name + suffix);
}

std::filesystem::path output_lock_path(const std::string& path) { return hidden_sibling(path, ".lock"); }

void write_text_atomically(const std::filesystem::path& path, const std::string& text) {
  char host[256] = "host";
  ::gethostname(host, sizeof host - 1);
  std::string name(1, '.');  // appended piece by piece: GCC 12 -Wrestrict misfires on "." + string
  name.append(path.filename().string()).append(1, '.').append(host).append(1, '.');
  name.append(std::to_string(::getpid())).append(".tmp");
  const std::filesystem::path temporary = path.parent_path() / name;
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
      throw IoError("cannot write " + temporary.string());
    }
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    if (std::filesystem::is_directory(path, ignored))
      throw IoError("cannot write " + path.string() + ": it is a directory");
    throw IoError("cannot rename " + temporary.string() + " to " + path.string() + ": " +
                  error.message());
  }
}

}  // namespace mfattn
