// The /realization group that `mfattn realize` adds to a finished run's file (docs/output.md,
// docs/realization.md): the target's samples, the realized marginal in the same coordinates,
// the collapse point u, and the distances as attributes.
#include <hdf5.h>

#include "io/hdf5_support.hpp"
#include "mfattn/h5md.hpp"

namespace mfattn {
namespace {

void write_matrix(hid_t group, const char* name, const std::vector<double>& values, std::size_t columns) {
  const hsize_t dims[2] = {columns ? values.size() / columns : 0, columns};
  const hdf5::Handle space(H5Screate_simple(columns > 1 ? 2 : 1, dims, nullptr), H5Sclose);
  const hdf5::Handle set(H5Dcreate2(group, name, H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                                    H5P_DEFAULT),
                         H5Dclose);
  if (!set.valid() || H5Dwrite(set.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0)
    throw IoError(std::string("writing /realization/") + name + ": " + hdf5::innermost_hdf5_error());
}

void write_attribute(hid_t group, const std::string& name, double value) {
  const hdf5::Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  const hdf5::Handle attribute(
      H5Acreate2(group, name.c_str(), H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attribute.valid() || H5Awrite(attribute.get(), H5T_NATIVE_DOUBLE, &value) < 0)
    throw IoError("writing /realization@" + name + ": " + hdf5::innermost_hdf5_error());
}

void write_attribute(hid_t group, const std::string& name, const std::string& value) {
  // A variable-length UTF-8 string, as the writer stores its text attributes (h5py reads str).
  const hdf5::Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  const hdf5::Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  const hdf5::Handle attribute(
      H5Acreate2(group, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  const char* text = value.c_str();
  if (!attribute.valid() || H5Awrite(attribute.get(), type.get(), &text) < 0)
    throw IoError("writing /realization@" + name + ": " + hdf5::innermost_hdf5_error());
}

}  // namespace

void write_realization(const std::string& path, const RealizationRecord& record) {
  const hdf5::QuietHdf5Errors quiet;
  const hdf5::Handle file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) throw IoError("cannot open " + path + " to add /realization: " + hdf5::innermost_hdf5_error());
  const hdf5::Handle group(H5Gcreate2(file.get(), "realization", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  if (!group.valid()) throw IoError("cannot create /realization in " + path + ": " + hdf5::innermost_hdf5_error());
  write_matrix(group.get(), "target", record.target, record.columns);
  write_matrix(group.get(), "realized", record.realized, record.columns);
  write_matrix(group.get(), "u", record.u, 1);
  for (const auto& [name, value] : record.texts) write_attribute(group.get(), name, value);
  for (const auto& [name, value] : record.numbers) write_attribute(group.get(), name, value);
  if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0)
    throw IoError("flushing /realization to " + path + ": " + hdf5::innermost_hdf5_error());
}

}  // namespace mfattn
