#pragma once
// Internal pieces of the HDF5 readers and writer (src/io/): an owning identifier, a scope
// that silences HDF5's error printing, the innermost message of its error stack, and the
// read-only open that every reader uses.
#include <hdf5.h>

#include <string>
#include <utility>

namespace mfattn::hdf5 {

/// Owns one HDF5 identifier and releases it with the matching H5*close function.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer close) noexcept : id_(id), close_(close) {}
  Handle(Handle&& other) noexcept
      : id_(std::exchange(other.id_, H5I_INVALID_HID)), close_(other.close_) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = std::exchange(other.id_, H5I_INVALID_HID);
      close_ = other.close_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  hid_t get() const noexcept { return id_; }
  bool valid() const noexcept { return id_ >= 0; }
  void reset() noexcept {
    if (id_ >= 0 && close_ != nullptr) close_(id_);  // a failed close has nobody to tell
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer close_ = nullptr;
};

/// Silences HDF5's automatic error printing for one scope. The error stack is per thread in
/// the thread-safe Debian build, so the previous handler is restored rather than left off.
class QuietHdf5Errors {
 public:
  QuietHdf5Errors() {
    H5Eget_auto2(H5E_DEFAULT, &handler_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietHdf5Errors() { H5Eset_auto2(H5E_DEFAULT, handler_, data_); }
  QuietHdf5Errors(const QuietHdf5Errors&) = delete;
  QuietHdf5Errors& operator=(const QuietHdf5Errors&) = delete;

 private:
  H5E_auto2_t handler_ = nullptr;
  void* data_ = nullptr;
};

/// The most specific message on HDF5's error stack (e.g. the errno text of a failed open).
inline std::string innermost_hdf5_error() {
  std::string message;
  auto keep_first = [](unsigned, const H5E_error2_t* error, void* out) -> herr_t {
    auto& text = *static_cast<std::string*>(out);
    if (text.empty() && error->desc != nullptr) text = error->desc;
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, keep_first, &message);
  return message;
}

/// Opens a file read-only without file locking (as HDF5_USE_FILE_LOCKING=FALSE): a running
/// writer holds its lock for the whole run, and a reader only needs what it has flushed.
/// An invalid handle on failure (the error stack says why).
inline Handle open_read_only(const std::string& path) {
  Handle access(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (!access.valid()) return {};
#if H5_VERSION_GE(1, 10, 7)
  if (H5Pset_file_locking(access.get(), false, true) < 0) return {};
#endif
  return Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, access.get()), H5Fclose);
}

/// The group that holds a file's frame clock, the step and time of every frame, with a
/// trailing '/': "/particles/tokens/position/" for a file that keeps the positions of every
/// frame (--save-positions all, and every file from before the option), or, for a file with
/// /run/checkpoint (ends or none), "/observables/<name>/" of its first observable in name
/// order (every observable's step and time are hard links to the same two datasets there).
/// "" when a checkpointed file has no observable with step and time.
inline std::string frame_clock_group(hid_t file) {
  if (H5Lexists(file, "/run", H5P_DEFAULT) <= 0 ||
      H5Lexists(file, "/run/checkpoint", H5P_DEFAULT) <= 0)
    return "/particles/tokens/position/";
  if (H5Lexists(file, "/observables", H5P_DEFAULT) <= 0) return "";
  Handle observables(H5Gopen2(file, "/observables", H5P_DEFAULT), H5Gclose);
  if (!observables.valid()) return "";
  struct Search {
    hid_t group;
    std::string found;
  } search{observables.get(), {}};
  auto visit = [](hid_t group, const char* name, const H5L_info_t*, void* data) -> herr_t {
    auto& s = *static_cast<Search*>(data);
    const std::string step = std::string(name) + "/step", time = std::string(name) + "/time";
    if (H5Lexists(group, step.c_str(), H5P_DEFAULT) > 0 &&
        H5Lexists(group, time.c_str(), H5P_DEFAULT) > 0) {
      s.found = "/observables/" + std::string(name) + "/";
      return 1;  // stop: the first in name order
    }
    return 0;
  };
  // H5Lexists on "name/step" fails (no error printed under QuietHdf5Errors) when name is a
  // dataset; that is a "no".
  H5Literate(observables.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, visit, &search);
  return search.found;
}

}  // namespace mfattn::hdf5
