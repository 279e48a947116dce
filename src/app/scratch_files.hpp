#pragma once
/// \file scratch_files.hpp
/// Private to the commands of src/app that hand a run its inputs as files (realize, fit): a
/// folder of their own for them, and rows of numbers written so that they read back exactly.
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iomanip>
#include <string>
#include <system_error>
#include <vector>

#include "mfattn/io/h5md.hpp"

namespace mfattn {

/// A folder of its own under the system's temporary directory (`prefix` + six characters),
/// removed with its owner.
class ScratchFolder {
 public:
  explicit ScratchFolder(const std::string& prefix) {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
    if (!::mkdtemp(pattern.data())) throw IoError("cannot create a temporary folder " + pattern);
    path_ = pattern;
  }
  ~ScratchFolder() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchFolder(const ScratchFolder&) = delete;
  ScratchFolder& operator=(const ScratchFolder&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

/// `values` as rows of `columns` numbers, 17 significant digits (each reads back as the same
/// double).
inline void write_rows(const std::string& path, const std::vector<double>& values,
                       std::size_t columns) {
  std::ofstream file(path);
  file << std::setprecision(17);
  for (std::size_t k = 0; k < values.size(); ++k)
    file << values[k] << ((k + 1) % columns ? ' ' : '\n');
  if (!file) throw IoError("cannot write " + path);
}

}  // namespace mfattn
