// Linked into builds without CUDA: the entry point exists and says so clearly.
#include "mfattn/backend.hpp"

namespace mfattn {

std::unique_ptr<Backend> make_cuda_backend(const Model&) {
  throw BackendUnavailable(
      "--backend cuda: this build of mfattn has no CUDA support (accepted here: cpu, reference)");
}

}  // namespace mfattn
