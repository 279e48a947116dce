/// \file h5md_objects.cpp
/// The HDF5 calls that the H5MD writer and readers share (declared in h5md_internal.hpp):
/// attributes, datasets, rows and the checker that turns a failed call into an IoError.
#include <hdf5.h>

#include <algorithm>
#include <string>
#include <vector>

#include "io/h5md_objects.hpp"

namespace mfattn::h5md_internal {
namespace {

/// HDF5's description of a failed system call spans lines ("file write failed: time = ...,
/// errno = 28, error message = 'No space left on device', buf = ..."): keep the system's
/// message, which is what a user can act on.
std::string readable_reason(const std::string& reason) {
  const std::string marker = "error message = '";
  const auto begin = reason.find(marker);
  if (begin != std::string::npos) {
    const auto end = reason.find('\'', begin + marker.size());
    if (end != std::string::npos) return reason.substr(begin + marker.size(), end - begin - marker.size());
  }
  std::string line = reason.substr(0, reason.find('\n'));
  return line;
}

}  // namespace

void Checker::fail(std::string_view operation, std::string_view object) const {
  std::string message = path_;
  message += ": ";
  message += operation;
  if (!object.empty()) {
    message += ' ';
    message += object;
  }
  message += " failed";
  if (const std::string reason = readable_reason(hdf5::innermost_hdf5_error()); !reason.empty()) {
    message += " (";
    message += reason;
    message += ')';
  }
  throw IoError(message);
}

Handle utf8_string_type(const Checker& check) {
  Handle type = check.own(H5Tcopy(H5T_C_S1), H5Tclose, "copying the string type");
  check(H5Tset_size(type.get(), H5T_VARIABLE), "making strings variable-length");
  check(H5Tset_cset(type.get(), H5T_CSET_UTF8), "making strings UTF-8");
  return type;
}

Handle dataspace(const Checker& check, const std::vector<hsize_t>& dims,
                 const std::vector<hsize_t>& max_dims) {
  if (dims.empty()) return check.own(H5Screate(H5S_SCALAR), H5Sclose, "creating a scalar space");
  return check.own(H5Screate_simple(static_cast<int>(dims.size()), dims.data(),
                                    max_dims.empty() ? nullptr : max_dims.data()),
                   H5Sclose, "creating a dataspace");
}

hsize_t element_count(const std::vector<hsize_t>& dims) {
  hsize_t count = 1;
  for (hsize_t extent : dims) count *= extent;
  return count;
}

Handle create_group(const Checker& check, hid_t parent, const std::string& name) {
  return check.own(H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                   H5Gclose, "creating group", name);
}

void write_attribute(const Checker& check, hid_t object, const std::string& name, hid_t file_type,
                     hid_t memory_type, const std::vector<hsize_t>& dims, const void* data) {
  const htri_t exists = H5Aexists(object, name.c_str());
  check(exists, "looking up attribute", name);
  if (exists > 0 && element_count(dims) > 0) {
    Handle existing = check.own(H5Aopen(object, name.c_str(), H5P_DEFAULT), H5Aclose,
                                "opening attribute", name);
    Handle type = check.own(H5Aget_type(existing.get()), H5Tclose, "reading the type of", name);
    Handle space = check.own(H5Aget_space(existing.get()), H5Sclose, "reading the shape of", name);
    const int rank = H5Sget_simple_extent_ndims(space.get());
    std::vector<hsize_t> stored(static_cast<std::size_t>(std::max(rank, 0)));
    if (rank >= 0 && H5Sget_simple_extent_dims(space.get(), stored.data(), nullptr) >= 0 &&
        stored == dims && H5Tequal(type.get(), file_type) > 0) {
      check(H5Awrite(existing.get(), memory_type, data), "writing attribute", name);
      return;
    }
  }
  if (exists > 0) check(H5Adelete(object, name.c_str()), "deleting attribute", name);
  Handle space = dataspace(check, dims);
  Handle attribute =
      check.own(H5Acreate2(object, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                H5Aclose, "creating attribute", name);
  // HDF5 rejects a null buffer even for zero elements, and an empty vector's data() is null.
  if (element_count(dims) == 0) return;
  check(H5Awrite(attribute.get(), memory_type, data), "writing attribute", name);
}

void write_string_attribute(const Checker& check, hid_t object, const std::string& name,
                            const std::string& value) {
  Handle type = utf8_string_type(check);
  const char* text = value.c_str();
  write_attribute(check, object, name, type.get(), type.get(), {}, &text);
}

void write_strings_attribute(const Checker& check, hid_t object, const std::string& name,
                             const std::vector<std::string>& values) {
  Handle type = utf8_string_type(check);
  std::vector<const char*> texts;
  for (const auto& value : values) texts.push_back(value.c_str());
  write_attribute(check, object, name, type.get(), type.get(), {texts.size()}, texts.data());
}

void write_int32_array_attribute(const Checker& check, hid_t object, const std::string& name,
                                 const std::vector<std::int32_t>& values) {
  write_attribute(check, object, name, H5T_STD_I32LE, H5T_NATIVE_INT32, {values.size()},
                  values.data());
}

hsize_t rows_per_chunk(std::size_t row_bytes, std::size_t target_bytes) {
  return std::max<hsize_t>(1, target_bytes / std::max<std::size_t>(1, row_bytes));
}

Handle create_growing_dataset(const Checker& check, hid_t parent, const std::string& name,
                              hid_t file_type, const std::vector<hsize_t>& row_shape,
                              std::size_t target_chunk_bytes, Filters filters, std::size_t max_rows,
                              ChunkPlan& plan) {
  std::size_t row_bytes = H5Tget_size(file_type);
  for (hsize_t extent : row_shape) row_bytes *= extent;
  std::vector<hsize_t> dims{0}, max_dims{H5S_UNLIMITED};
  hsize_t rows = rows_per_chunk(row_bytes, target_chunk_bytes);
  if (max_rows > 0) rows = std::min<hsize_t>(rows, max_rows);
  plan = {rows, static_cast<std::size_t>(rows) * row_bytes, filters.deflate || filters.fletcher32};
  std::vector<hsize_t> chunk{rows};
  for (hsize_t extent : row_shape) {
    dims.push_back(extent);
    max_dims.push_back(extent);
    chunk.push_back(extent);
  }
  Handle space = dataspace(check, dims, max_dims);
  Handle properties = check.own(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "creating properties");
  check(H5Pset_chunk(properties.get(), static_cast<int>(chunk.size()), chunk.data()),
        "setting chunks of", name);
  if (filters.deflate) {
    check(H5Pset_shuffle(properties.get()), "setting shuffle on", name);
    check(H5Pset_deflate(properties.get(), 4), "setting deflate on", name);
  }
  // Last in the pipeline, so the checksum covers the bytes as stored.
  if (filters.fletcher32) check(H5Pset_fletcher32(properties.get()), "setting fletcher32 on", name);
  return check.own(H5Dcreate2(parent, name.c_str(), file_type, space.get(), H5P_DEFAULT,
                              properties.get(), H5P_DEFAULT),
                   H5Dclose, "creating dataset", name);
}

std::vector<hsize_t> dataset_dims(const Checker& check, hid_t dataset, const char* what) {
  Handle space = check.own(H5Dget_space(dataset), H5Sclose, "getting the space of", what);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  check(rank, "getting the rank of", what);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  check(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), "sizing", what);
  return dims;
}

RowSelection select_rows(const Checker& check, hid_t dataset, hsize_t first, hsize_t rows,
                         const char* what) {
  std::vector<hsize_t> count = dataset_dims(check, dataset, what);
  std::vector<hsize_t> start(count.size(), 0);
  start[0] = first;
  count[0] = rows;
  RowSelection selection{check.own(H5Dget_space(dataset), H5Sclose, "getting the space of", what),
                         {}};
  check(H5Sselect_hyperslab(selection.file_space.get(), H5S_SELECT_SET, start.data(), nullptr,
                            count.data(), nullptr),
        "selecting a row of", what);
  selection.memory_space = dataspace(check, count);
  return selection;
}

RowSelection select_row(const Checker& check, hid_t dataset, hsize_t row, const char* what) {
  return select_rows(check, dataset, row, 1, what);
}

void write_rows(const Checker& check, hid_t dataset, hsize_t first, hsize_t rows,
                hid_t memory_type, const void* data, const char* what) {
  std::vector<hsize_t> dims = dataset_dims(check, dataset, what);
  dims[0] = first + rows;
  check(H5Dset_extent(dataset, dims.data()), "extending", what);
  const RowSelection selection = select_rows(check, dataset, first, rows, what);
  check(H5Dwrite(dataset, memory_type, selection.memory_space.get(), selection.file_space.get(),
                 H5P_DEFAULT, data),
        "writing", what);
}

void overwrite_row(const Checker& check, hid_t dataset, hsize_t row, hid_t memory_type,
                   const void* data, const char* what) {
  const RowSelection selection = select_row(check, dataset, row, what);
  check(H5Dwrite(dataset, memory_type, selection.memory_space.get(), selection.file_space.get(),
                 H5P_DEFAULT, data),
        "writing", what);
}

void read_row(const Checker& check, hid_t dataset, hsize_t row, hid_t memory_type, void* out,
              const char* what) {
  const RowSelection selection = select_row(check, dataset, row, what);
  check(H5Dread(dataset, memory_type, selection.memory_space.get(), selection.file_space.get(),
                H5P_DEFAULT, out),
        "reading", what);
}

void write_fixed_dataset(const Checker& check, hid_t parent, const std::string& name,
                         hid_t file_type, hid_t memory_type, const std::vector<hsize_t>& dims,
                         const void* data) {
  const htri_t exists = H5Lexists(parent, name.c_str(), H5P_DEFAULT);
  check(exists, "looking up", name);
  if (exists > 0) check(H5Ldelete(parent, name.c_str(), H5P_DEFAULT), "deleting", name);
  Handle space = dataspace(check, dims);
  Handle properties = check.own(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "creating properties");
  const std::size_t bytes = element_count(dims) * H5Tget_size(file_type);
  if (bytes > kCompressedFixedBytes && !dims.empty()) {
    // Chunks of whole trailing rows: every axis but the last two taken one index at a time,
    // then as many rows of the last axis as make about kCompressedFixedBytes.
    std::vector<hsize_t> chunk(dims.size(), 1);
    chunk.back() = dims.back();
    if (dims.size() >= 2)
      chunk[dims.size() - 2] = std::min(dims[dims.size() - 2],
                                        rows_per_chunk(dims.back() * H5Tget_size(file_type), kCompressedFixedBytes));
    else
      chunk.back() = std::min(dims.back(), rows_per_chunk(H5Tget_size(file_type), kCompressedFixedBytes));
    check(H5Pset_chunk(properties.get(), static_cast<int>(chunk.size()), chunk.data()), "setting chunks of", name);
    check(H5Pset_shuffle(properties.get()), "setting shuffle on", name);
    check(H5Pset_deflate(properties.get(), 1), "setting deflate on", name);
  }
  Handle dataset = check.own(H5Dcreate2(parent, name.c_str(), file_type, space.get(), H5P_DEFAULT,
                                        properties.get(), H5P_DEFAULT),
                             H5Dclose, "creating dataset", name);
  if (element_count(dims) == 0) return;  // as in write_attribute
  check(H5Dwrite(dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "writing", name);
}

}  // namespace mfattn::h5md_internal
