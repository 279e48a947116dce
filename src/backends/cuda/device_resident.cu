// The CUDA backend's resident kernel on the device (resident_steps.hpp, docs/cuda.md
// "Ensembles"): one block per replica, its sources in shared memory, `steps` fixed steps per
// launch. The state stays on the device between launches unless the host changed it; each
// launch returns the positions and the replicas' failures.
//
// Instantiated deliberately: d = 2, 3 and 4-8 (padded to 8), with and without pair terms,
// in fp64 and fp32 (12 kernels); the method is chosen at run time inside the kernel.
#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <vector>

#include "backends/cuda/device_memory.hpp"
#include "backends/cuda/sums_engine.hpp"
#include "mfattn/backends/backend_errors.hpp"

namespace mfattn::cuda {
namespace {

/// The device's team: each thread runs its share of a phase, then the block waits.
struct DeviceTeam {
  int size;
  template <class Phase>
  MFATTN_HOST_DEVICE void each(Phase&& phase) const {
#if defined(__CUDA_ARCH__)
    phase(int(threadIdx.x));
    __syncthreads();
#else
    (void)phase;
#endif
  }
};

template <class Real, int kDim, bool kExactDim, bool kTerms>
__global__ void __launch_bounds__(kResidentMaxThreads)
    resident_steps_kernel(const ResidentArgs<Real> a, long long steps_before, long long steps, double h) {
  extern __shared__ __align__(16) unsigned char shared[];
  const ResidentShared<Real> mem = carve_resident_shared(shared, a);
  const DeviceTeam team{int(blockDim.x)};
  ResidentReplica<Real, kDim, kExactDim, kTerms>{a, mem, std::size_t(blockIdx.x)}.advance(team, steps_before,
                                                                                          steps, h);
}

template <class Real>
class DeviceResident final : public ResidentEngine<Real> {
 public:
  DeviceResident() {
    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    int optin = 0;
    check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
          "cudaDeviceGetAttribute");
    shared_limit_ = std::size_t(optin);
  }
  std::size_t shared_limit() const override { return shared_limit_; }

  void advance(const ResidentArgs<Real>& host, long long steps_before, long long steps, double h) override {
    ResidentArgs<Real> a = host;
    const std::size_t replicas = a.replicas, n = std::size_t(a.n), d = std::size_t(a.d);
    const std::size_t sources = std::size_t(a.sources), rows = replicas * n * d;
    // The model's labels, gauges and prefix: fixed for the stepper's life, copied once.
    if (host.presence != labels_of_) {
      presence_.upload(host.presence, n);
      bias_.upload(host.bias, sources);
      if (host.has_terms) {
        positions_.upload(host.positions, sources * std::size_t(a.position_dim));
        prompts_.upload(host.prompts, sources);
      }
      prefix_.upload(host.prefix, (sources - n) * d);
      if (host.gauges) gauges_.upload(host.gauges, sources * d * d);
      labels_of_ = host.presence;
    }
    a.presence = presence_.get();
    a.bias = bias_.get();
    a.positions = host.has_terms ? positions_.get() : nullptr;
    a.prompts = host.has_terms ? prompts_.get() : nullptr;
    a.prefix = prefix_.get();
    a.gauges = host.gauges ? gauges_.get() : nullptr;
    // Q, K, V: small, and a new layer may change them.
    const std::size_t matrices = (a.matrix_stride ? replicas : 1) * d * d;
    a.q = host.q ? q_.upload(host.q, matrices) : nullptr;
    a.k = host.k ? k_.upload(host.k, matrices) : nullptr;
    a.v = host.v ? v_.upload(host.v, matrices) : nullptr;
    // The state stays on the device: copied there only when the host's differs from what the
    // last launch returned (a first call, a resume, another backend's steps in between).
    if (resident_.size() != rows || std::memcmp(resident_.data(), host.x, rows * sizeof(double)) != 0)
      x_.upload(host.x, rows);
    a.x = x_.get();
    a.stage = stage_.reserve(rows);
    a.slopes = slopes_.reserve(rows * kernels::FixedTableau::kMaxStages);
    a.queries = queries_.reserve(rows);
    a.failed_step = failed_step_.reserve(replicas);
    a.failure = failure_.reserve(replicas);
    a.failure_value = failure_value_.reserve(replicas);
    a.failure_order = failure_order_.reserve(replicas);
    if (replicas > 2147483647u) throw DeviceFailure("CUDA: more than 2^31 - 1 replicas");
    const std::size_t shared =
        resident_shared_bytes(a.sources, a.d, a.position_dim, a.threads, a.has_terms, sizeof(Real));
    visit_resident_dimension(a.d, [&](auto dim, auto exact) {
      constexpr int kDim = decltype(dim)::value;
      constexpr bool kExact = decltype(exact)::value;
      auto launch = [&](auto kernel) {
        check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)),
              "cudaFuncSetAttribute");
        kernel<<<unsigned(replicas), unsigned(a.threads), shared>>>(a, steps_before, steps, h);
      };
      if (a.has_terms)
        launch(resident_steps_kernel<Real, kDim, kExact, true>);
      else
        launch(resident_steps_kernel<Real, kDim, kExact, false>);
    });
    check(cudaGetLastError(), "launching the resident kernel");
    x_.download(host.x, rows);
    failed_step_.download(host.failed_step, replicas);
    failure_.download(host.failure, replicas);
    failure_value_.download(host.failure_value, replicas);
    failure_order_.download(host.failure_order, replicas);
    resident_.assign(host.x, host.x + rows);
  }

 private:
  std::size_t shared_limit_ = 0;
  DeviceArray<double> presence_, positions_, prefix_, gauges_, q_, k_, v_, x_, stage_, slopes_, failure_value_;
  DeviceArray<Real> bias_, queries_;
  DeviceArray<int> prompts_, failure_, failure_order_;
  DeviceArray<long long> failed_step_;
  std::vector<double> resident_;  // the positions the device holds (as last returned)
  const double* labels_of_ = nullptr;  // the host presence array whose labels are on the device
};

}  // namespace

template <class Real>
std::unique_ptr<ResidentEngine<Real>> make_device_resident_engine() {
  return std::make_unique<DeviceResident<Real>>();
}
template std::unique_ptr<ResidentEngine<double>> make_device_resident_engine<double>();
template std::unique_ptr<ResidentEngine<float>> make_device_resident_engine<float>();

}  // namespace mfattn::cuda
