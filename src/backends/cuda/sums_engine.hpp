#pragma once
// Where the CUDA backend's receiver sums (receiver_sums.hpp) run: on a CUDA device
// (device_sums.cu, in builds with the CUDA toolkit), or on the host in the device's order of
// summation (host_sums.cpp, every build), which lets the tests check the backend's formulas,
// fallbacks and finish on a machine without a GPU.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cuda/receiver_sums.hpp"
#include "backends/cuda/resident_steps.hpp"

namespace mfattn::cuda {

/// What the bench and the file record of the device.
struct DeviceProperties {
  std::string name;
  int multiprocessors = 0;
  double clock_hz = 0.0;
  int major = 0, minor = 0;
};
template <class Real>
class SumsEngine {
 public:
  virtual ~SumsEngine() = default;
  /// The device's name, or "host emulation".
  virtual std::string device_name() const = 0;
  /// The device's SM count and clock (null for the emulation).
  virtual const DeviceProperties* properties() const { return nullptr; }
  /// a holds host arrays (replicas of them where SumsArgs says so). Every receiver's S_i and
  /// A_i, with the offsets already in a.neg_offsets, into a.sums and a.acc. a.bias,
  /// a.positions and a.prompts are the model's labels: an engine may keep them from the
  /// first call that passes the same a.bias array.
  virtual void bounded_sums(const SumsArgs<Real>& a, std::size_t replicas) = 0;
  /// The exact pass (exact_receiver) for the rows replica * n + i listed: their offsets, S_i
  /// and A_i written into a's host arrays at those rows, every other row untouched.
  virtual void exact_sums(const SumsArgs<Real>& a, std::size_t replicas,
                          const std::vector<std::int64_t>& rows) = 0;
};

/// Where the resident kernel (resident_steps.hpp) runs: a CUDA device, or the host's
/// emulation of its blocks.
template <class Real>
class ResidentEngine {
 public:
  virtual ~ResidentEngine() = default;
  /// a holds host arrays: the model's labels, matrices and prefix, a.x (advanced in place) and
  /// the failure arrays (written); its stage, slopes and queries are ignored (each engine has
  /// its own). Runs every replica's block for `steps` steps of size h.
  virtual void advance(const ResidentArgs<Real>& a, long long steps_before, long long steps, double h) = 0;
  /// The most shared memory one block may take, in bytes.
  virtual std::size_t shared_limit() const = 0;
};

/// The host's emulation of the device loops (same formulas, same order of summation).
template <class Real>
std::unique_ptr<SumsEngine<Real>> make_host_engine();

/// The host's emulation of the resident kernel's blocks (the same phases, thread after thread),
/// with the shared memory of an sm_90 block (227 KiB), so that it takes the device's cases.
template <class Real>
std::unique_ptr<ResidentEngine<Real>> make_host_resident_engine();

/// The resident kernel on the current device (builds with CUDA only).
template <class Real>
std::unique_ptr<ResidentEngine<Real>> make_device_resident_engine();

/// The CUDA device's engine on the current device (builds with CUDA only; throws
/// BackendUnavailable where no device is usable).
template <class Real>
std::unique_ptr<SumsEngine<Real>> make_device_engine();

/// The current device (builds with CUDA only; throws BackendUnavailable where none is usable).
DeviceProperties device_properties();

/// The pair rate the device's arithmetic allows, from its SM count and clock (docs/cuda.md):
/// per SM and clock an sm_90 SM issues 128 fp32 lanes, 64 fp64 lanes and 16 exponentials.
/// A pair costs 2d + 3 fp32 lane operations and one exponential in fp32, 2d + 19 fp64
/// operations in fp64 (the polynomial exp included); the ceiling is the smaller rate.
double pair_rate_ceiling(const DeviceProperties& device, bool fp32, std::size_t d);

/// Calls body(std::integral_constant<int, kDim>{}, std::bool_constant<kExactDim>{}): the
/// compiled dimensions d = 2 and 3 exactly, larger d in padded buckets of 4 to kMaxDim.
template <class Body>
void visit_dimension(int d, Body&& body) {
  switch (d) {
    case 2: return body(std::integral_constant<int, 2>{}, std::true_type{});
    case 3: return body(std::integral_constant<int, 3>{}, std::true_type{});
    default: break;
  }
  if (d <= 4) return body(std::integral_constant<int, 4>{}, std::false_type{});
  if (d <= 8) return body(std::integral_constant<int, 8>{}, std::false_type{});
  if (d <= 16) return body(std::integral_constant<int, 16>{}, std::false_type{});
  if (d <= 32) return body(std::integral_constant<int, 32>{}, std::false_type{});
  return body(std::integral_constant<int, kMaxDim>{}, std::false_type{});
}

}  // namespace mfattn::cuda
