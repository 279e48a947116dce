// The reader of `--weights` files (include/mfattn/io/weights_file.hpp): float64 datasets at
// fixed paths, read whole; the shapes are checked by the model builder, which knows the run.
#include "mfattn/io/weights_file.hpp"

#include <cmath>
#include <stdexcept>

#include "io/hdf5_support.hpp"

namespace mfattn {
namespace {

using hdf5::Handle;

/// The dataset at path, or an absent array when the file has no such link.
WeightArray read_array(hid_t file, const std::string& path) {
  WeightArray array;
  const std::size_t slash = path.find('/', 1);
  const std::string group = path.substr(0, slash);
  if (H5Lexists(file, group.c_str(), H5P_DEFAULT) <= 0 || H5Lexists(file, path.c_str(), H5P_DEFAULT) <= 0)
    return array;
  Handle dataset = hdf5::open_dataset(file, path);
  if (!dataset.valid()) throw std::invalid_argument(path + " is not a dataset");
  Handle type(H5Dget_type(dataset.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_FLOAT || H5Tget_size(type.get()) != 8)
    throw std::invalid_argument(path + " must be float64 (numpy float64, torch.float64)");
  Handle space(H5Dget_space(dataset.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 1 || rank > 8) throw std::invalid_argument(path + " has rank " + std::to_string(rank) + ", not 1 to 8");
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  std::size_t count = 1;
  for (hsize_t extent : dims) {
    if (extent == 0 || extent > (std::size_t{1} << 28)) throw std::invalid_argument(path + " has an empty or huge axis");
    array.shape.push_back(static_cast<std::size_t>(extent));
    count *= static_cast<std::size_t>(extent);
    if (count > (std::size_t{1} << 28)) throw std::invalid_argument(path + " holds more than 2^28 numbers");
  }
  array.values.resize(count);
  if (H5Dread(dataset.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, array.values.data()) < 0)
    throw std::invalid_argument(path + ": cannot be read (" + hdf5::innermost_hdf5_error() + ")");
  for (double v : array.values)
    if (!std::isfinite(v)) throw std::invalid_argument(path + " holds a number that is not finite");
  return array;
}

/// The string attribute `name` of the object at path ("" when absent).
std::string read_text_attribute(hid_t file, const std::string& path, const std::string& name) {
  if (H5Lexists(file, path.c_str(), H5P_DEFAULT) <= 0 ||
      H5Aexists_by_name(file, path.c_str(), name.c_str(), H5P_DEFAULT) <= 0)
    return "";
  Handle attribute(H5Aopen_by_name(file, path.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  Handle type(H5Aget_type(attribute.get()), H5Tclose);
  Handle space(H5Aget_space(attribute.get()), H5Sclose);
  if (H5Tget_class(type.get()) != H5T_STRING || H5Sget_simple_extent_npoints(space.get()) != 1)
    throw std::invalid_argument(path + " attribute " + name + " must be one string");
  if (H5Tis_variable_str(type.get()) > 0) {
    char* text = nullptr;
    Handle memory(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(memory.get(), H5T_VARIABLE);
    H5Tset_cset(memory.get(), H5Tget_cset(type.get()));  // h5py writes UTF-8
    if (H5Aread(attribute.get(), memory.get(), &text) < 0 || text == nullptr)
      throw std::invalid_argument(path + " attribute " + name + " cannot be read");
    std::string result(text);
    H5free_memory(text);
    return result;
  }
  // A fixed-length string of `size` bytes may fill them all (NumPy's S4 holds "relu" with no
  // terminator, as C, MATLAB and h5py's bytes write it): read into size + 1 bytes of a
  // null-terminated type, which HDF5's conversion terminates, and drop a space padding's spaces.
  const std::size_t size = H5Tget_size(type.get());
  std::string result(size + 1, '\0');
  Handle memory(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(memory.get(), size + 1);
  H5Tset_strpad(memory.get(), H5T_STR_NULLTERM);
  H5Tset_cset(memory.get(), H5Tget_cset(type.get()));
  if (H5Aread(attribute.get(), memory.get(), result.data()) < 0)
    throw std::invalid_argument(path + " attribute " + name + " cannot be read");
  result.resize(result.find('\0') == std::string::npos ? size : result.find('\0'));
  if (H5Tget_strpad(type.get()) == H5T_STR_SPACEPAD) result.erase(result.find_last_not_of(' ') + 1);
  return result;
}

}  // namespace

WeightsFile read_weights_file(const std::string& path) {
  hdf5::QuietHdf5Errors quiet;
  Handle file = hdf5::open_read_only(path);
  if (!file.valid()) throw std::invalid_argument("not an HDF5 file (" + hdf5::innermost_hdf5_error() + ")");
  WeightsFile weights;
  const hid_t f = file.get();
  weights.query = read_array(f, "/attention/query");
  weights.key = read_array(f, "/attention/key");
  weights.value = read_array(f, "/attention/value");
  weights.output = read_array(f, "/attention/output");
  weights.w1 = read_array(f, "/mlp/w1");
  weights.b1 = read_array(f, "/mlp/b1");
  weights.w2 = read_array(f, "/mlp/w2");
  weights.b2 = read_array(f, "/mlp/b2");
  weights.activation = read_text_attribute(f, "/mlp", "activation");
  return weights;
}

}  // namespace mfattn
