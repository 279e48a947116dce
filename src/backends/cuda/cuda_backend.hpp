#pragma once
// The CUDA backend's factory for the tests: the whole backend (operands, offsets, exact pass,
// finish) with its device loops emulated on the host, in the device's order of summation
// (host_sums.cpp). make_cuda_backend (backend.hpp) is the same with the device's engine.
#include "mfattn/backends/backend.hpp"

namespace mfattn::cuda {

std::unique_ptr<Backend> make_emulated_cuda_backend(const Model& model, const BackendOptions& options);

}  // namespace mfattn::cuda
