// cuda/common.cuh: error checking and owning device arrays for the CUDA backend.
// Every CUDA call is checked; failures become e3fuse::Error (never abort).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "e3fuse/error.h"

namespace e3fuse::cuda {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(status));
  }
}

// After a kernel launch: catches launch-configuration errors at once.
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

inline int64_t blocks_for(int64_t work, int threads) { return (work + threads - 1) / threads; }

// One warp per node (edge-walking kernels with few edges per lane): kWarp lanes.
constexpr int kWarp = 32;

// The four cubic coefficients of one radial-table entry (ops/radial_table.h), 16- or 32-byte
// aligned: one vector load (float) or two (double).
template <class T>
__device__ __forceinline__ void load_table_entry(const T* p, T c[4]) {
  if constexpr (std::is_same_v<T, float>) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(p));
    c[0] = v.x;
    c[1] = v.y;
    c[2] = v.z;
    c[3] = v.w;
  } else {
    const double2 a = __ldg(reinterpret_cast<const double2*>(p));
    const double2 b = __ldg(reinterpret_cast<const double2*>(p) + 1);
    c[0] = a.x;
    c[1] = a.y;
    c[2] = b.x;
    c[3] = b.y;
  }
}

// Sum over the warp; lane 0 holds the result (same tree every call).
__device__ inline double warp_sum(double x) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    x += __shfl_down_sync(0xffffffffu, x, offset);
  return x;
}

// The node of this thread's warp (uniform across the warp) and its lane.
__device__ inline int64_t warp_node(int& lane) {
  lane = static_cast<int>(threadIdx.x % kWarp);
  return (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
}

// An integer setting from the environment (the E3FUSE_* switches kept to time variants),
// or `fallback` when the variable is unset or not a number.
inline int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long long value = std::strtoll(v, &end, 10);
  return *end == '\0' ? value : fallback;
}

// The streaming multiprocessors of the current device.
inline int device_multiprocessors() {
  int device = 0, count = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device),
        "multiprocessor count");
  return count;
}

// Calls f(std::integral_constant<int, V>{}) for the first V of the list equal to v, or
// for the last one otherwise (callers check the range first), so that loops over v
// unroll over a compile-time size.
template <int First, int... Rest, class F>
__host__ __device__ __forceinline__ void with_int_constant(int v, F&& f) {
  if constexpr (sizeof...(Rest) == 0) {
    f(std::integral_constant<int, First>{});
  } else if (v == First) {
    f(std::integral_constant<int, First>{});
  } else {
    with_int_constant<Rest...>(v, static_cast<F&&>(f));
  }
}

// Raises `kernel`'s limit of dynamic shared memory on the current device to `bytes` when it is
// lower; never lowers it, so a kernel launched with several sizes (one per layer) sets its
// attribute once per size increase instead of at every launch.
inline void raise_dynamic_shared_limit(const void* kernel, size_t bytes, const char* what) {
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, size_t> limits;
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mutex);
  size_t& limit = limits[{device, kernel}];
  if (bytes <= limit) return;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(bytes)),
        what);
  limit = bytes;
}

// Bytes held in DeviceArrays by this process, and the peak since the last reset
// (what the memory-scaling benchmark reports besides the driver's own count).
struct DeviceBytes {
  static std::atomic<size_t>& in_use() {
    static std::atomic<size_t> value{0};
    return value;
  }
  static std::atomic<size_t>& peak() {
    static std::atomic<size_t> value{0};
    return value;
  }
  // Allocations and frees so far (a CUDA graph of a step holds the addresses it was captured
  // with: StepGraph replays it only while this count is unchanged).
  static std::atomic<uint64_t>& changes() {
    static std::atomic<uint64_t> value{0};
    return value;
  }
  static void add(size_t bytes) {
    ++changes();
    const size_t now = in_use() += bytes;
    size_t p = peak().load();
    while (now > p && !peak().compare_exchange_weak(p, now)) {
    }
  }
  static void remove(size_t bytes) {
    ++changes();
    in_use() -= bytes;
  }
};

// A device array that grows and never shrinks (capacity reused between steps).
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(const std::vector<T>& host) { upload(host); }
  ~DeviceArray() { release(); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : ptr_(o.ptr_), size_(o.size_), capacity_(o.capacity_) {
    o.ptr_ = nullptr;
    o.size_ = o.capacity_ = 0;
  }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = o.ptr_;
      size_ = o.size_;
      capacity_ = o.capacity_;
      o.ptr_ = nullptr;
      o.size_ = o.capacity_ = 0;
    }
    return *this;
  }

  // Resizes without keeping the contents.
  void resize(size_t n) {
    if (n > capacity_) {
      release();
      if (n > 0) {
        const cudaError_t status = cudaMalloc(&ptr_, n * sizeof(T));
        if (status != cudaSuccess) {
          cudaGetLastError();  // clear the sticky-free allocation error
          ptr_ = nullptr;
          throw Error("out of GPU memory: could not allocate " + std::to_string(n * sizeof(T)) +
                      " bytes (" + cudaGetErrorString(status) + "); " +
                      std::to_string(DeviceBytes::in_use().load()) +
                      " bytes already held by e3fuse");
        }
        DeviceBytes::add(n * sizeof(T));
      }
      capacity_ = n;
    }
    size_ = n;
  }
  void upload(const std::vector<T>& host) { upload(host.data(), host.size()); }
  void upload(const T* host, size_t n, cudaStream_t stream = nullptr) {
    resize(n);
    if (n)
      check(cudaMemcpyAsync(ptr_, host, n * sizeof(T), cudaMemcpyHostToDevice, stream), "upload");
  }
  void download(T* host, size_t n, cudaStream_t stream = nullptr) const {
    if (n)
      check(cudaMemcpyAsync(host, ptr_, n * sizeof(T), cudaMemcpyDeviceToHost, stream), "download");
  }
  void zero(cudaStream_t stream = nullptr) {
    if (size_) check(cudaMemsetAsync(ptr_, 0, size_ * sizeof(T), stream), "memset");
  }
  T* data() { return ptr_; }
  const T* data() const { return ptr_; }
  size_t size() const { return size_; }
  size_t bytes() const { return capacity_ * sizeof(T); }

 private:
  void release() {
    if (ptr_) {
      cudaFree(ptr_);
      DeviceBytes::remove(capacity_ * sizeof(T));
    }
    ptr_ = nullptr;
    size_ = capacity_ = 0;
  }
  T* ptr_ = nullptr;
  size_t size_ = 0, capacity_ = 0;
};

}  // namespace e3fuse::cuda
