#pragma once
// Device memory of the CUDA backend's engines (device_sums.cu, device_resident.cu): a growing
// device array and the check that turns a CUDA error into DeviceFailure. CUDA sources only.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <string>

#include "mfattn/backends/backend_errors.hpp"

namespace mfattn::cuda {

inline void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  throw DeviceFailure(std::string("CUDA: ") + what + ": " + cudaGetErrorString(status));
}

/// A device allocation that grows when asked for more and is freed with its owner.
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    if (data_) cudaFree(data_);
  }
  T* reserve(std::size_t count) {
    if (count <= capacity_) return data_;
    if (data_) check(cudaFree(data_), "cudaFree");
    data_ = nullptr;
    capacity_ = 0;
    const cudaError_t status = cudaMalloc(reinterpret_cast<void**>(&data_), std::max<std::size_t>(count, 1) * sizeof(T));
    if (status != cudaSuccess)
      throw DeviceFailure("CUDA: cudaMalloc of " + std::to_string(count * sizeof(T)) +
                          " bytes: " + cudaGetErrorString(status));
    capacity_ = count;
    return data_;
  }
  /// Copies count numbers from the host (growing the array first).
  T* upload(const T* host, std::size_t count) {
    T* device = reserve(count);
    if (count) check(cudaMemcpy(device, host, count * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy to the device");
    return device;
  }
  void download(T* host, std::size_t count) const {
    if (count) check(cudaMemcpy(host, data_, count * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy from the device");
  }
  T* get() const { return data_; }

 private:
  T* data_ = nullptr;
  std::size_t capacity_ = 0;
};

}  // namespace mfattn::cuda
