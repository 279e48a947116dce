#include "mfattn/core/input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace mfattn {
namespace {

[[noreturn]] void refuse_type(mode_t mode) {
  if (S_ISDIR(mode)) throw InputFileRefused("is a directory, not a file", false);
  const char* kind = S_ISFIFO(mode) ? "a FIFO"
                     : S_ISCHR(mode) ? "a character device"
                     : S_ISBLK(mode) ? "a block device"
                     : S_ISSOCK(mode) ? "a socket"
                                      : "not a plain file";
  throw InputFileRefused(std::string("is not a regular file (") + kind +
                             "; mfattn reads regular files only)",
                         false);
}

[[noreturn]] void refuse_error(int error) {
  if (error == ENOENT || error == ENOTDIR) throw InputFileRefused("no such file", true);
  if (error == EACCES) throw InputFileRefused("permission denied", false);
  throw InputFileRefused(std::string("cannot be opened: ") + std::strerror(error), false);
}

/// A regular file open for reading; closed when it goes.
class InputDescriptor {
 public:
  explicit InputDescriptor(const std::string& path) {
    if (path.empty()) throw InputFileRefused("no such file (the path is empty)", true);
    // The type first, from the name: open() itself would wait on a FIFO without a writer.
    struct stat status {};
    if (::stat(path.c_str(), &status) != 0) refuse_error(errno);
    if (!S_ISREG(status.st_mode)) refuse_type(status.st_mode);
    do {
      fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    } while (fd_ < 0 && errno == EINTR);
    if (fd_ < 0) refuse_error(errno);
    // The path may name another file by now: what was opened decides.
    if (::fstat(fd_, &status_) != 0 || !S_ISREG(status_.st_mode)) {
      const mode_t mode = status_.st_mode;
      ::close(fd_);
      refuse_type(mode);
    }
  }
  InputDescriptor(const InputDescriptor&) = delete;
  InputDescriptor& operator=(const InputDescriptor&) = delete;
  ~InputDescriptor() { ::close(fd_); }

  int fd() const { return fd_; }
  std::size_t size() const { return static_cast<std::size_t>(status_.st_size); }

 private:
  int fd_ = -1;
  struct stat status_ {};
};


}  // namespace

void check_input_file(const std::string& path) { const InputDescriptor file(path); }

std::string read_input_file(const std::string& path, std::size_t limit) {
  const InputDescriptor file(path);
  if (file.size() > limit) throw InputFileRefused("is " + std::to_string(file.size()) + " bytes, more than the " +
                               std::to_string(limit) + " accepted",
                           false);
  std::string text;
  text.reserve(file.size());
  // Files such as those of /proc report size 0 and still hold text: the bound is also kept
  // while reading.
  char buffer[1 << 16];
  for (;;) {
    const ssize_t got = ::read(file.fd(), buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw InputFileRefused(std::string("cannot be read: ") + std::strerror(errno), false);
    if (got == 0) break;
    text.append(buffer, static_cast<std::size_t>(got));
    if (text.size() > limit) throw InputFileRefused("is more than the " + std::to_string(limit) + " bytes accepted", false);
  }
  return text;
}

}  // namespace mfattn
