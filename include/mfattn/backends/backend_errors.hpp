#pragma once
/// \file backend_errors.hpp
/// What a backend throws, in a header of its own (no Eigen) that CUDA sources include too.
#include <stdexcept>

namespace mfattn {

/// Numerical failure: overflow or a non-finite state (exit code 3).
struct NumericalError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The requested backend is not part of this build, or not usable here: no CUDA device, or
/// an option it does not take (exit code 2).
struct BackendUnavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The device failed during a run: a launch, a copy or an allocation on it (exit code 4, as
/// an I/O failure: the file keeps every flushed frame and the run resumes elsewhere).
struct DeviceFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace mfattn
