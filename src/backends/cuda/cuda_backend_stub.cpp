// Linked into builds without CUDA: the entry point exists and says so clearly.
#include "mfattn/backend.hpp"

namespace mfattn {

std::unique_ptr<Backend> make_cuda_backend(const Model&, const BackendOptions&) {
  throw BackendUnavailable("--backend cuda: this build of mfattn has no CUDA support (accepted here: " +
                           backend_names_text(", ", "cuda") + ")");
}

}  // namespace mfattn
