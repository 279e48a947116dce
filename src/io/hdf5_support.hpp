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

}  // namespace mfattn::hdf5
