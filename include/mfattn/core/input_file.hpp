#pragma once
/// \file input_file.hpp
/// How mfattn opens every file it reads (docs/cli.md, "Rules of every command"): a regular file only,
/// checked without blocking, and read with a size bound. Opening a FIFO that has no writer
/// waits for ever, and a device such as /dev/zero never ends, so both are refused before a
/// byte is read.
#include <cstddef>
#include <stdexcept>
#include <string>

namespace mfattn {

/// Most bytes of a text file of numbers (--init-file, --q, --k, --v, --positions,
/// --amplitudes, --generators, --prefix-init, realize --target): 1 GiB, some 40 million
/// numbers. A larger initial state is given as an mfattn .h5 file.
inline constexpr std::size_t kMaxNumbersFileBytes = std::size_t{1} << 30;

/// An input file refused (a usage error, exit 2). what() is the reason alone ("no such
/// file", "permission denied", "is a directory, not a file", "is not a regular file (a
/// FIFO ...)", "is N bytes, more than the M accepted"): the caller names the option and path.
class InputFileRefused : public std::invalid_argument {
 public:
  InputFileRefused(const std::string& reason, bool missing)
      : std::invalid_argument(reason), missing_(missing) {}
  /// Nothing is at the path (a preset name mistyped, more likely than a missing file).
  bool missing() const noexcept { return missing_; }

 private:
  bool missing_;
};

/// Checks that path is a regular file this process may open for reading, without blocking:
/// its type from stat(), then an open with O_NONBLOCK and fstat() of what was opened. A file
/// that a library opens by name (HDF5) is checked with this first. Throws InputFileRefused.
void check_input_file(const std::string& path);

/// The contents of the input file path (check_input_file's rules), at most limit bytes: a
/// larger file is refused before it is read. Throws InputFileRefused.
std::string read_input_file(const std::string& path, std::size_t limit);

}  // namespace mfattn
