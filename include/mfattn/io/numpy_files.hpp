#pragma once
/// \file numpy_files.hpp
/// A reader of NumPy's array files, for importing states written by Python (numpy.save,
/// numpy.savez, numpy.savez_compressed):
/// - .npy, format versions 1.0, 2.0 and 3.0: the magic "\x93NUMPY", the version, the header
///   length (uint16 for 1.0, uint32 for 2.0 and 3.0, little-endian) and the header, a Python
///   dict literal {'descr': ..., 'fortran_order': ..., 'shape': (...)}, then the raw data.
///   Accepted dtypes (little-endian or native byte order; the byte order of 1-byte types does
///   not matter): float64, float32, float16 ('<f8', '<f4', '<f2'), int8 to int64 ('|i1',
///   '<i2', '<i4', '<i8'), uint8 to uint64 ('|u1', '<u2', '<u4', '<u8') and bool ('|b1').
///   Refused: big-endian, complex, object, string, datetime and structured dtypes.
///   Fortran-order arrays are returned in C order.
/// - .npz: a ZIP archive of .npy members, stored (numpy.savez) or deflated
///   (numpy.savez_compressed), ZIP64 records and extra fields included; every member must be a
///   .npy file, neither encrypted nor compressed by another method, and its CRC-32 must match.
/// Which of the two a file is comes from its first bytes, not its name. Every number is
/// converted to double (64-bit integers beyond 2^53 are rounded).
#include <cstddef>
#include <string>
#include <vector>

#include "mfattn/io/h5md.hpp"

namespace mfattn {

/// A file that is not a valid .npy or .npz file, or holds an array this reader does not accept
/// (the message names the file, the member and what is accepted).
struct NumpyFormatError : IoError {
  using IoError::IoError;
};

/// One array of a NumPy file.
struct NumpyArray {
  /// A .npz member's name without its ".npy" suffix (folders kept: "a/b.npy" is "a/b"), never
  /// empty; empty for the array of a .npy file, so an empty name tells a caller that the file
  /// was a lone array.
  std::string name;
  std::vector<std::size_t> shape;  ///< empty for a scalar (shape ())
  std::vector<double> values;      ///< C order (row-major), the product of shape of them
};

/// Every array of a .npy file (one) or of a .npz archive (its members, in the order of its
/// central directory, that is the order numpy.savez wrote them). Throws IoError when the file
/// cannot be read, NumpyFormatError when its content is not accepted (an empty archive, a
/// truncated file, a refused dtype, a CRC mismatch, a member that is not .npy, ...).
std::vector<NumpyArray> read_numpy_file(const std::string& path);

}  // namespace mfattn
