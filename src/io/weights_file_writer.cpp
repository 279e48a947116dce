// The writer of `--weights` files (include/mfattn/io/weights_file.hpp), `mfattn fit`'s output:
// apart from the reader, which the option fuzzer links alone.
#include <unistd.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <utility>

#include "io/h5md_objects.hpp"
#include "io/hdf5_support.hpp"
#include "io/path_lock.hpp"
#include "mfattn/io/weights_file.hpp"

namespace mfattn {

using hdf5::Handle;

namespace {

/// The groups on the way to `path` ("/a/b/c": /a and /a/b), made where missing.
void make_parents(const h5md_internal::Checker& check, hid_t file, const std::string& path) {
  for (std::size_t slash = path.find('/', 1); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    const std::string group = path.substr(0, slash);
    const htri_t exists = H5Lexists(file, group.c_str(), H5P_DEFAULT);
    check(exists, "looking up", group);
    if (exists == 0) h5md_internal::create_group(check, file, group);
  }
}

void write_array(const h5md_internal::Checker& check, hid_t file, const std::string& path,
                 const std::vector<std::size_t>& shape, const std::vector<double>& values) {
  std::size_t count = 1;
  for (std::size_t extent : shape) count *= extent;
  if (count != values.size())  // HDF5 would read past the values
    throw std::logic_error("write_weights_file: " + path + "'s shape holds " +
                           std::to_string(count) + " numbers, not " +
                           std::to_string(values.size()));
  make_parents(check, file, path);
  const std::vector<hsize_t> dims(shape.begin(), shape.end());
  h5md_internal::write_fixed_dataset(check, file, path, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, dims,
                                     values.data());
}

}  // namespace

void write_weights_file(const std::string& path, const WeightsFile& weights,
                        const ArrayRecord& record) {
  namespace fs = std::filesystem;
  std::string suffix(1,
                     '.');  // appended piece by piece: GCC 12 -Wrestrict misfires on "." + string
  suffix.append(std::to_string(::getpid())).append(".tmp");
  const fs::path temporary = hidden_sibling(path, suffix);
  std::error_code ignored;
  try {
    hdf5::QuietHdf5Errors quiet;
    const h5md_internal::Checker check(temporary.string());
    {
      Handle file = check.own(H5Fcreate(temporary.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                              H5Fclose, "creating the file");
      const hid_t f = file.get();
      const std::pair<const char*, const WeightArray*> arrays[] = {
          {"/attention/query", &weights.query},
          {"/attention/key", &weights.key},
          {"/attention/value", &weights.value},
          {"/attention/output", &weights.output},
          {"/mlp/w1", &weights.w1},
          {"/mlp/b1", &weights.b1},
          {"/mlp/w2", &weights.w2},
          {"/mlp/b2", &weights.b2}};
      for (const auto& [name, array] : arrays)
        if (array->present()) write_array(check, f, name, array->shape, array->values);
      if (weights.w1.present()) {
        Handle mlp = check.own(H5Gopen2(f, "/mlp", H5P_DEFAULT), H5Gclose, "opening", "/mlp");
        h5md_internal::write_string_attribute(check, mlp.get(), "activation", weights.activation);
      }
      for (const ArrayRecord::Array& array : record.arrays)
        write_array(
            check, f, array.path,
            array.shape.empty() ? std::vector<std::size_t>{array.values.size()} : array.shape,
            array.values);
      if (!record.attributes.empty()) {
        make_parents(check, f, record.attributes_of + "/");
        Handle group = check.own(H5Gopen2(f, record.attributes_of.c_str(), H5P_DEFAULT), H5Gclose,
                                 "opening", record.attributes_of);
        for (const auto& [name, value] : record.attributes)
          h5md_internal::write_string_attribute(check, group.get(), name, value);
      }
      check(H5Fflush(f, H5F_SCOPE_GLOBAL), "flushing the file");
    }
    fs::rename(temporary, path);
  } catch (const fs::filesystem_error& error) {
    fs::remove(temporary, ignored);
    throw IoError("cannot write " + path + ": " + error.code().message());
  } catch (...) {
    fs::remove(temporary, ignored);
    throw;
  }
}

}  // namespace mfattn
