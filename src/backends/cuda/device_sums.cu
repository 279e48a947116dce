// The CUDA backend's device loops (docs/cuda.md): receiver_sums.hpp's sums with one thread
// per receiver and the sources staged through shared memory a tile at a time.
//
// bounded_sums_kernel: every receiver of every replica with its Cauchy-Schwarz offset. A
// block holds kBlockThreads receivers of one replica; its threads copy each tile of
// source_tile(d) sources (keys, values, log-presences, and the positions and prompts the
// masks and factors read) into shared memory, then each thread adds the tile's sources to
// its receiver's sums in source order. No atomics: each receiver's sums are one thread's,
// so results are bitwise the same run to run and for any block size.
// exact_sums_kernel: the listed receivers whose offset was too loose, one thread each,
// reading global memory (receiver_sums.hpp's exact_receiver, as the host emulation runs it).
//
// Instantiated deliberately (compile time): d = 2 and 3 exactly, 4 to 64 in five padded
// buckets, each with and without pair terms, in fp64 and fp32; the exact pass once per
// precision, with the buckets' largest arrays.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <string>

#include "backends/cuda/device_memory.hpp"
#include "backends/cuda/sums_engine.hpp"
#include "mfattn/backends/backend_errors.hpp"

namespace mfattn::cuda {
namespace {

constexpr int kBlockThreads = 128;

/// Bytes of shared memory a tile takes (keys, values, biases; positions and prompts with terms).
std::size_t tile_bytes(int d, bool terms, int position_dim, std::size_t real_size) {
  const std::size_t tile = std::size_t(source_tile(d));
  std::size_t bytes = tile * (2 * std::size_t(d) + 1) * real_size;
  bytes = (bytes + 7) / 8 * 8;
  if (terms) bytes += tile * std::size_t(position_dim) * sizeof(double) + tile * sizeof(int);
  return bytes;
}

template <class Real, int kDim, bool kExactDim, bool kTerms>
__global__ void __launch_bounds__(kBlockThreads)
    bounded_sums_kernel(const SumsArgs<Real> a, int blocks_per_replica) {
  extern __shared__ __align__(16) unsigned char shared[];
  const int d = kExactDim ? kDim : a.d;
  const int tile = source_tile(d);
  Real* tile_keys = reinterpret_cast<Real*>(shared);
  Real* tile_values = tile_keys + tile * d;
  Real* tile_bias = tile_values + tile * d;
  const std::size_t real_bytes = std::size_t(tile) * (2 * std::size_t(d) + 1) * sizeof(Real);
  double* tile_positions = reinterpret_cast<double*>(shared + (real_bytes + 7) / 8 * 8);
  int* tile_prompts = reinterpret_cast<int*>(tile_positions + tile * a.position_dim);

  const std::size_t replica = std::size_t(blockIdx.x) / std::size_t(blocks_per_replica);
  const int i = int(blockIdx.x % unsigned(blocks_per_replica)) * kBlockThreads + int(threadIdx.x);
  const bool active = i < a.n;
  Receiver<Real, kDim> receiver;
  Real neg_offset = 0;
  if (active) {
    load_receiver<Real, kDim, kExactDim, kTerms>(a, replica, i, receiver);
    neg_offset = a.neg_offsets[replica * std::size_t(a.n) + std::size_t(i)];
  }
  const Real* keys = a.keys + replica * std::size_t(a.sources) * std::size_t(d);
  const Real* values = a.values + replica * std::size_t(a.sources) * std::size_t(d);
  ReceiverSums<Real, kDim, kExactDim> sums;
  int start = 0, count = 0;
  // The tiles in receiver_sums.hpp's order (uniform across the block: no thread leaves early).
  for (int tile_index = 0; region_tile(a.n, a.sources, tile, tile_index, start, count); ++tile_index) {
    __syncthreads();  // the previous tile is no longer read
    for (int e = int(threadIdx.x); e < count * d; e += kBlockThreads) {
      tile_keys[e] = keys[std::size_t(start) * std::size_t(d) + std::size_t(e)];
      tile_values[e] = values[std::size_t(start) * std::size_t(d) + std::size_t(e)];
    }
    for (int e = int(threadIdx.x); e < count; e += kBlockThreads) {
      tile_bias[e] = a.bias[start + e];
      if constexpr (kTerms) tile_prompts[e] = a.prompts[start + e];
    }
    if constexpr (kTerms)
      for (int e = int(threadIdx.x); e < count * a.position_dim; e += kBlockThreads)
        tile_positions[e] = a.positions[std::size_t(start) * std::size_t(a.position_dim) + std::size_t(e)];
    __syncthreads();
    if (active) {
      for (int jj = 0; jj < count; ++jj)
        add_source<Real, kDim, kExactDim, kTerms>(
            a, receiver, tile_keys + jj * d, tile_values + jj * d, tile_bias[jj] + neg_offset, start + jj,
            kTerms ? tile_positions + jj * a.position_dim : nullptr, kTerms ? tile_prompts[jj] : 0, sums);
      sums.end_tile(d);
    }
  }
  if (active) store_sums<Real, kDim, kExactDim>(a, replica, i, sums);
}

template <class Real>
__global__ void __launch_bounds__(kBlockThreads)
    exact_sums_kernel(const SumsArgs<Real> a, const std::int64_t* rows, std::int64_t count) {
  const std::int64_t k = std::int64_t(blockIdx.x) * kBlockThreads + threadIdx.x;
  if (k >= count) return;
  const std::size_t replica = std::size_t(rows[k] / a.n);
  const int i = int(rows[k] % a.n);
  if (a.has_terms)
    exact_receiver<Real, kMaxDim, false, true>(a, replica, i);
  else
    exact_receiver<Real, kMaxDim, false, false>(a, replica, i);
}

template <class Real>
class DeviceSums final : public SumsEngine<Real> {
 public:
  DeviceSums() : properties_(device_properties()) {}
  std::string device_name() const override { return properties_.name; }
  const DeviceProperties* properties() const override { return &properties_; }

  void bounded_sums(const SumsArgs<Real>& host, std::size_t replicas) override {
    const std::size_t rows = replicas * std::size_t(host.n), d = std::size_t(host.d);
    const std::size_t source_rows = replicas * std::size_t(host.sources);
    SumsArgs<Real> a = host;
    a.queries = queries_.upload(host.queries, rows * d);
    a.keys = keys_.upload(host.keys, source_rows * d);
    a.values = values_.upload(host.values, source_rows * d);
    a.neg_offsets = neg_offsets_.upload(host.neg_offsets, rows);
    // The sources' labels (log-presences, positions, prompts) are the model's, fixed for the
    // run: copied when the backend's arrays are first seen, not per evaluation.
    if (host.bias != labels_of_) {
      bias_.upload(host.bias, std::size_t(host.sources));
      if (host.has_terms) {
        positions_.upload(host.positions, std::size_t(host.sources) * std::size_t(host.position_dim));
        prompts_.upload(host.prompts, std::size_t(host.sources));
      }
      labels_of_ = host.bias;
    }
    a.bias = bias_.get();
    a.positions = host.has_terms ? positions_.get() : nullptr;
    a.prompts = host.has_terms ? prompts_.get() : nullptr;
    a.sums = sums_.reserve(rows);
    a.acc = acc_.reserve(rows * d);
    device_args_ = a;
    if (rows == 0) return;
    const int blocks_per_replica = (host.n + kBlockThreads - 1) / kBlockThreads;
    const std::size_t blocks = replicas * std::size_t(blocks_per_replica);
    if (blocks > 2147483647u) throw DeviceFailure("CUDA: more than 2^31 - 1 blocks of receivers");
    const std::size_t shared = tile_bytes(host.d, host.has_terms, host.position_dim, sizeof(Real));
    visit_dimension(host.d, [&](auto dim, auto exact) {
      constexpr int kDim = decltype(dim)::value;
      constexpr bool kExact = decltype(exact)::value;
      if (host.has_terms)
        bounded_sums_kernel<Real, kDim, kExact, true><<<unsigned(blocks), kBlockThreads, shared>>>(a, blocks_per_replica);
      else
        bounded_sums_kernel<Real, kDim, kExact, false><<<unsigned(blocks), kBlockThreads, shared>>>(a, blocks_per_replica);
    });
    check(cudaGetLastError(), "launching the pair kernel");
    sums_.download(host.sums, rows);
    acc_.download(host.acc, rows * d);
  }

  void exact_sums(const SumsArgs<Real>& host, std::size_t replicas,
                  const std::vector<std::int64_t>& rows) override {
    if (rows.empty()) return;
    const std::size_t all = replicas * std::size_t(host.n), d = std::size_t(host.d);
    const std::int64_t* device_rows = rows_.upload(rows.data(), rows.size());
    const std::size_t blocks = (rows.size() + kBlockThreads - 1) / kBlockThreads;
    exact_sums_kernel<Real><<<unsigned(blocks), kBlockThreads>>>(device_args_, device_rows,
                                                                 std::int64_t(rows.size()));
    check(cudaGetLastError(), "launching the exact pass");
    neg_offsets_.download(host.neg_offsets, all);
    sums_.download(host.sums, all);
    acc_.download(host.acc, all * d);
  }

 private:
  DeviceProperties properties_;
  DeviceArray<Real> queries_, keys_, values_, bias_, neg_offsets_;
  DeviceArray<double> positions_, sums_, acc_;
  DeviceArray<int> prompts_;
  DeviceArray<std::int64_t> rows_;
  SumsArgs<Real> device_args_;  // the arrays of the last bounded_sums, on the device
  const Real* labels_of_ = nullptr;  // the host bias array whose labels are on the device
};

}  // namespace

DeviceProperties device_properties() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess)
    throw BackendUnavailable(std::string("--backend cuda: no CUDA device is usable here (") +
                             cudaGetErrorString(status) + ")");
  if (count == 0) throw BackendUnavailable("--backend cuda: no CUDA device is usable here (none found)");
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp properties;
  check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  DeviceProperties out;
  out.name = properties.name;
  out.major = properties.major;
  out.minor = properties.minor;
  int clock_khz = 0;
  check(cudaDeviceGetAttribute(&out.multiprocessors, cudaDevAttrMultiProcessorCount, device),
        "cudaDeviceGetAttribute");
  check(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device), "cudaDeviceGetAttribute");
  out.clock_hz = double(clock_khz) * 1e3;
  return out;
}

template <class Real>
std::unique_ptr<SumsEngine<Real>> make_device_engine() {
  return std::make_unique<DeviceSums<Real>>();
}
template std::unique_ptr<SumsEngine<double>> make_device_engine<double>();
template std::unique_ptr<SumsEngine<float>> make_device_engine<float>();

}  // namespace mfattn::cuda
