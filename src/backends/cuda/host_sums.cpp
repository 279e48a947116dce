// The host's emulation of the CUDA device loops: every receiver through receiver_sums.hpp's
// bounded_receiver and exact_receiver, the functions the device's exact pass calls and whose
// per-pair steps and tiles its main kernel repeats through shared memory.
#include "backends/cuda/sums_engine.hpp"

#include <omp.h>

#include <vector>

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

/// Shared memory of an sm_90 block (cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KiB).
constexpr std::size_t kSm90SharedBytes = 227 * 1024;

template <class Real>
class HostResident final : public ResidentEngine<Real> {
 public:
  std::size_t shared_limit() const override { return kSm90SharedBytes; }

  void advance(const ResidentArgs<Real>& host, long long steps_before, long long steps, double h) override {
    ResidentArgs<Real> a = host;
    const std::size_t rows = a.replicas * std::size_t(a.n) * std::size_t(a.d);
    stage_.resize(rows);
    slopes_.resize(rows * kernels::FixedTableau::kMaxStages);
    queries_.resize(rows);
    a.stage = stage_.data();
    a.slopes = slopes_.data();
    a.queries = queries_.data();
    const std::size_t bytes =
        resident_shared_bytes(a.sources, a.d, a.position_dim, a.threads, a.has_terms, sizeof(Real));
    visit_resident_dimension(a.d, [&](auto dim, auto exact) {
      constexpr int kDim = decltype(dim)::value;
      constexpr bool kExact = decltype(exact)::value;
#pragma omp parallel
      {
        // The block's shared memory, 16-byte aligned.
        std::vector<double> shared((bytes + sizeof(double) - 1) / sizeof(double) + 1);
        const HostTeam team{a.threads};
#pragma omp for schedule(static)
        for (std::size_t r = 0; r < a.replicas; ++r) {
          const ResidentShared<Real> mem =
              carve_resident_shared(reinterpret_cast<unsigned char*>(shared.data()), a);
          if (a.has_terms)
            ResidentReplica<Real, kDim, kExact, true>{a, mem, r}.advance(team, steps_before, steps, h);
          else
            ResidentReplica<Real, kDim, kExact, false>{a, mem, r}.advance(team, steps_before, steps, h);
        }
      }
    });
  }

 private:
  std::vector<double> stage_, slopes_;
  std::vector<Real> queries_;
};

}  // namespace

template <class Real>
std::unique_ptr<ResidentEngine<Real>> make_host_resident_engine() {
  return std::make_unique<HostResident<Real>>();
}
template std::unique_ptr<ResidentEngine<double>> make_host_resident_engine<double>();
template std::unique_ptr<ResidentEngine<float>> make_host_resident_engine<float>();

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
