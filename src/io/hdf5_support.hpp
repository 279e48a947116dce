#pragma once
// Internal pieces of the HDF5 readers and writer (src/io/): an owning identifier, a scope
// that silences HDF5's error printing, the innermost message of its error stack, and the
// read-only open and the dataset open that every reader uses, which refuse a file that
// reaches outside itself.
#include <hdf5.h>

#include <sys/types.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>

#include "mfattn/io/h5md.hpp"

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

/// The end of every refusal of data outside the file.
inline constexpr std::string_view kOutsideTheFile = "; mfattn reads no data outside the file it is given";

/// The first external (or user-defined) link anywhere in an open file, as a message, or "":
/// HDF5 would open its target, another file, which the checks of a named input
/// (check_input_file) never saw: a FIFO (HDF5 would wait on it for ever), a device, a file
/// nobody named. H5Lvisit follows hard links only and loads no object header, so the walk is
/// cheap (a 512-replica file's links in milliseconds) and opens nothing outside the file.
inline std::string link_out_of_file(hid_t file) {
  std::string found;
  auto visit = [](hid_t, const char* name, const H5L_info_t* info, void* data) -> herr_t {
    if (info->type != H5L_TYPE_EXTERNAL && info->type < H5L_TYPE_UD_MIN) return 0;
    *static_cast<std::string*>(data) = std::string("/") + name + " is an external link (to another file)";
    return 1;
  };
  if (H5Lvisit(file, H5_INDEX_NAME, H5_ITER_NATIVE, visit, &found) < 0 && found.empty())
    return "";  // a link table that cannot be read: the reads that need it say so
  return found.empty() ? "" : found + std::string(kOutsideTheFile);
}

/// The dataset `name` of `location`, opened for reading; an invalid handle when it cannot be
/// opened (the error stack says why). A virtual dataset (its sources are other files, and a
/// missing source reads silently as the fill value) or one stored in external files is
/// refused with NotMfattnFile (exit 2) naming the file and the dataset: every reader of
/// mfattn opens its datasets through here.
inline Handle open_dataset(hid_t location, const std::string& name) {
  Handle dataset(H5Dopen2(location, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dataset.valid()) return dataset;
  Handle creation(H5Dget_create_plist(dataset.get()), H5Pclose);
  if (!creation.valid()) return dataset;
  const char* outside = H5Pget_layout(creation.get()) == H5D_VIRTUAL ? " is a virtual dataset (its data lies in other files)"
                        : H5Pget_external_count(creation.get()) > 0 ? " stores its data in external files"
                                                                    : nullptr;
  if (outside == nullptr) return dataset;
  std::string file(static_cast<std::size_t>(std::max<ssize_t>(H5Fget_name(location, nullptr, 0), 0)), '\0');
  if (!file.empty()) H5Fget_name(location, file.data(), file.size() + 1);
  char path[1024] = {};
  H5Iget_name(dataset.get(), path, sizeof path);
  throw NotMfattnFile(file + ": " + path + outside + std::string(kOutsideTheFile));
}

/// Opens a file read-only without file locking (as HDF5_USE_FILE_LOCKING=FALSE): a running
/// writer holds its lock for the whole run, and a reader only needs what it has flushed.
/// An invalid handle on failure (the error stack says why). A file with an external link
/// (link_out_of_file) is refused with NotMfattnFile (exit 2) naming it, for every reader alike
/// (--weights, --init-file, --resume, info, analyze, --compare); datasets whose data lies
/// outside the file are refused where they are opened (open_dataset).
inline Handle open_read_only(const std::string& path) {
  Handle access(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (!access.valid()) return {};
#if H5_VERSION_GE(1, 10, 7)
  if (H5Pset_file_locking(access.get(), false, true) < 0) return {};
#endif
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, access.get()), H5Fclose);
  if (!file.valid()) return file;
  if (const std::string link = link_out_of_file(file.get()); !link.empty()) throw NotMfattnFile(path + ": " + link);
  return file;
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
