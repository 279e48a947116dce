#pragma once
/// \file h5md_objects.hpp
/// Private to the H5MD files of src/io (layout: docs/output.md): the HDF5 calls the writer,
/// its storage policy and the readers share (defined in h5md_objects.cpp) and the layout's
/// constants.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/hdf5_support.hpp"
#include "mfattn/io/h5md.hpp"

namespace mfattn::h5md_internal {

using hdf5::Handle;
using hdf5::QuietHdf5Errors;

// ---- HDF5 calls (h5md_objects.cpp) -------------------------------------------------------------

/// Turns failed HDF5 calls into IoError "<path>: <operation> <object> failed (<reason>)".
class Checker {
 public:
  explicit Checker(std::string path) : path_(std::move(path)) {}
  /// The file's path, which every message names first.
  const std::string& path() const { return path_; }
  [[noreturn]] void fail(std::string_view operation, std::string_view object = {}) const;
  void operator()(herr_t result, std::string_view operation, std::string_view object = {}) const {
    if (result < 0) fail(operation, object);
  }
  Handle own(hid_t id, Handle::Closer close, std::string_view operation,
             std::string_view object = {}) const {
    if (id < 0) fail(operation, object);
    return Handle(id, close);
  }

 private:
  std::string path_;
};

/// A variable-length UTF-8 string type.
Handle utf8_string_type(const Checker& check);

/// A simple dataspace; no dimensions means a scalar. Empty max_dims means fixed size.
Handle dataspace(const Checker& check, const std::vector<hsize_t>& dims,
                 const std::vector<hsize_t>& max_dims = {});

/// Elements in a dataspace of extents `dims` (1 for a scalar).
hsize_t element_count(const std::vector<hsize_t>& dims);

Handle create_group(const Checker& check, hid_t parent, const std::string& name);

/// Writes attribute `name`, replacing any earlier one (whose type or shape may differ). An
/// earlier one of the same type and shape is written in place: the object header keeps its
/// size (a run rewrites /run's counts with every frame).
void write_attribute(const Checker& check, hid_t object, const std::string& name, hid_t file_type,
                     hid_t memory_type, const std::vector<hsize_t>& dims, const void* data);

void write_string_attribute(const Checker& check, hid_t object, const std::string& name,
                            const std::string& value);

void write_strings_attribute(const Checker& check, hid_t object, const std::string& name,
                             const std::vector<std::string>& values);

void write_int32_array_attribute(const Checker& check, hid_t object, const std::string& name,
                                 const std::vector<std::int32_t>& values);

/// Rows of `row_bytes` per chunk so that a chunk holds about `target_bytes` (at least one row).
hsize_t rows_per_chunk(std::size_t row_bytes, std::size_t target_bytes);

struct Filters {
  bool deflate = false;
  bool fletcher32 = false;
};

/// How a growing dataset takes disk space: a chunk of chunk_rows rows (chunk_bytes) whenever
/// a row starts a new chunk, or, when filtered, possibly a new copy of its chunk every time
/// (a compressed chunk that grows is moved).
struct ChunkPlan {
  hsize_t chunk_rows = 1;
  std::size_t chunk_bytes = 0;
  bool filtered = false;
};

/// A dataset [0, row_shape...] that grows along its first axis, chunked by whole rows (at
/// most max_rows per chunk when max_rows > 0). plan receives its chunking.
Handle create_growing_dataset(const Checker& check, hid_t parent, const std::string& name,
                              hid_t file_type, const std::vector<hsize_t>& row_shape,
                              std::size_t target_chunk_bytes, Filters filters, std::size_t max_rows,
                              ChunkPlan& plan);

/// The extents of a dataset's dataspace.
std::vector<hsize_t> dataset_dims(const Checker& check, hid_t dataset, const char* what);

struct RowSelection {
  Handle file_space, memory_space;
};

/// Selects rows [first, first + rows) of `dataset` (elements of a 1-D dataset) and a memory
/// space to match.
RowSelection select_rows(const Checker& check, hid_t dataset, hsize_t first, hsize_t rows,
                         const char* what);

RowSelection select_row(const Checker& check, hid_t dataset, hsize_t row, const char* what);

/// Sets the length of `dataset` to `first + rows` rows and writes those rows from `data`.
void write_rows(const Checker& check, hid_t dataset, hsize_t first, hsize_t rows,
                hid_t memory_type, const void* data, const char* what);

/// Writes row `row` of `dataset` in place (the dataset keeps its extent).
void overwrite_row(const Checker& check, hid_t dataset, hsize_t row, hid_t memory_type,
                   const void* data, const char* what);

void read_row(const Checker& check, hid_t dataset, hsize_t row, hid_t memory_type, void* out,
              const char* what);

/// Writes a fixed-size dataset, replacing an earlier one of the same name. One of more than
/// kCompressedFixedBytes is stored in chunks of about that size, shuffled and deflated (level
/// 1): the identity Q, K and V of attention_matrices at d = 4096 were 400 MB of zeros.
inline constexpr std::size_t kCompressedFixedBytes = std::size_t{1} << 20;
/// The largest d whose file keeps HDF5's oldest format: the box's boundary attribute (d
/// variable-length strings, 16 bytes each) must stay within its 64 KiB header message. Larger
/// d take the 1.8 format (h5md_writer.cpp).
inline constexpr std::size_t kOldestFormatLargestD = 2048;
void write_fixed_dataset(const Checker& check, hid_t parent, const std::string& name,
                         hid_t file_type, hid_t memory_type, const std::vector<hsize_t>& dims,
                         const void* data);

// ---- The layout's constants ------------------------------------------------------------------

inline std::string particle_group_name(std::size_t replica) {
  return replica == 0 ? "tokens" : "tokens_r" + std::to_string(replica);
}

/// Replica 0's position group: the frame clock of a file that keeps every frame's positions,
/// and the kept frames' step and time of one that keeps the ends.
inline const std::string kPositionClockGroup = "/particles/tokens/position/";
inline const std::string kFieldGroup = "/fields/density/";
inline constexpr std::size_t kPositionChunkBytes = 256 * 1024;
inline constexpr std::size_t kSeriesChunkBytes = 64 * 1024;  // step, time and observables
/// PositionFrames::Ends keeps two position rows (t = 0 and the horizon); a run resumed to a
/// longer horizon adds one more, in a chunk of its own.
inline constexpr std::size_t kEndsPositionRows = 2;
/// The chunk B-tree's K (H5Pset_istore_k) of files written with Ends or None.
inline constexpr unsigned kSmallFileChunkIndexK = 4;
/// Slots of /run/checkpoint: the one being written and the last complete one.
inline constexpr hsize_t kCheckpointSlots = 2;
/// The frame number a checkpoint slot holds until it holds one.
inline constexpr std::int64_t kEmptyCheckpointSlot = -1;

/// The slot of /run/checkpoint whose complete frame is the latest one below `frames` (the
/// frames every growing dataset holds), or -1. `marks` are the slots' frame numbers.
/// (h5md_storage.cpp)
int latest_usable_checkpoint(const std::int64_t (&marks)[kCheckpointSlots], hsize_t frames);

}  // namespace mfattn::h5md_internal
