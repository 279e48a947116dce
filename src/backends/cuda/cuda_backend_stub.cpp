// Linked into builds without CUDA: the entry point exists and says so clearly.
#include "mfattn/backend.hpp"

namespace mfattn {

std::unique_ptr<Backend> make_cuda_backend(const Model&, const BackendOptions&) {
  std::string accepted;
  for (const BackendName& entry : kBackendNames)
    if (std::string(entry.name) != "cuda") accepted += (accepted.empty() ? "" : ", ") + std::string(entry.name);
  throw BackendUnavailable("--backend cuda: this build of mfattn has no CUDA support (accepted here: " +
                           accepted + ")");
}

}  // namespace mfattn
