// The host's emulation of the CUDA device loops: every receiver through receiver_sums.hpp's
// bounded_receiver and exact_receiver, the functions the device's exact pass calls and whose
// per-pair steps and tiles its main kernel repeats through shared memory.
#include "backends/cuda/sums_engine.hpp"

#include <omp.h>

namespace mfattn::cuda {
namespace {

template <class Real>
class HostSums final : public SumsEngine<Real> {
 public:
  std::string device_name() const override { return "host emulation"; }

  void bounded_sums(const SumsArgs<Real>& a, std::size_t replicas) override {
    const std::int64_t rows = std::int64_t(replicas) * a.n;
    visit_dimension(a.d, [&](auto dim, auto exact) {
      constexpr int kDim = decltype(dim)::value;
      constexpr bool kExact = decltype(exact)::value;
#pragma omp parallel for schedule(static)
      for (std::int64_t row = 0; row < rows; ++row) {
        const std::size_t replica = std::size_t(row / a.n);
        const int i = int(row % a.n);
        if (a.has_terms)
          bounded_receiver<Real, kDim, kExact, true>(a, replica, i);
        else
          bounded_receiver<Real, kDim, kExact, false>(a, replica, i);
      }
    });
  }

  void exact_sums(const SumsArgs<Real>& a, std::size_t, const std::vector<std::int64_t>& rows) override {
    visit_dimension(a.d, [&](auto dim, auto exact) {
      constexpr int kDim = decltype(dim)::value;
      constexpr bool kExact = decltype(exact)::value;
#pragma omp parallel for schedule(static)
      for (std::size_t k = 0; k < rows.size(); ++k) {
        const std::size_t replica = std::size_t(rows[k] / a.n);
        const int i = int(rows[k] % a.n);
        if (a.has_terms)
          exact_receiver<Real, kDim, kExact, true>(a, replica, i);
        else
          exact_receiver<Real, kDim, kExact, false>(a, replica, i);
      }
    });
  }
};

}  // namespace

template <class Real>
std::unique_ptr<SumsEngine<Real>> make_host_engine() {
  return std::make_unique<HostSums<Real>>();
}
template std::unique_ptr<SumsEngine<double>> make_host_engine<double>();
template std::unique_ptr<SumsEngine<float>> make_host_engine<float>();

double pair_rate_ceiling(const DeviceProperties& device, bool fp32, std::size_t d) {
  const double clocks = double(device.multiprocessors) * device.clock_hz;
  const double lane_ops = fp32 ? 2.0 * double(d) + 3.0 : 2.0 * double(d) + 19.0;
  const double lanes = fp32 ? 128.0 : 64.0;
  double per_clock = lanes / lane_ops;
  if (fp32 && per_clock > 16.0) per_clock = 16.0;  // the exponential unit
  return clocks * per_clock;
}

}  // namespace mfattn::cuda
