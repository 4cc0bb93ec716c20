// cuda/halo.cuh: the GPU side of a HaloExchange (e3fuse/engine.h), the per-layer exchange of
// node rows of pair_style e3fuse comm exchange (cuda/halo.cu), and the page-locked host
// buffers it and the backend stage their copies in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cuda/common.cuh"
#include "e3fuse/engine.h"

namespace e3fuse::cuda {

// Page-locked host memory (fast, truly asynchronous copies), grown on demand.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (ptr_) cudaFreeHost(ptr_);
  }
  // Room for `count` values of T (double or float).
  template <class T = double>
  T* reserve(size_t count) {
    const size_t doubles = (count * sizeof(T) + sizeof(double) - 1) / sizeof(double);
    if (doubles > capacity_) {
      if (ptr_) cudaFreeHost(ptr_);
      ptr_ = nullptr;
      capacity_ = 0;
      check(cudaMallocHost(&ptr_, doubles * sizeof(double)), "cudaMallocHost (halo staging)");
      capacity_ = doubles;
    }
    return reinterpret_cast<T*>(ptr_);
  }

 private:
  double* ptr_ = nullptr;
  size_t capacity_ = 0;
};

// The GPU side of a HaloExchange: border rows are gathered (pack) and added to (reverse
// unpack) by kernels; only those rows and the ghost rows cross PCIe, in the model's
// precision, through pinned buffers; the exchange between ranks is the front end's.
class DeviceHalo {
 public:
  // For one compute call; exchange null: no halo.
  void bind(HaloExchange* exchange, int64_t num_nodes, int64_t num_owned, cudaStream_t stream);
  bool active() const { return exchange_ != nullptr; }
  // Ghost rows of x (device, num_nodes x width) <- their owners' rows. The ghost rows
  // (num_owned .. num_nodes) are contiguous: they cross PCIe as they are, in T.
  template <class T>
  void forward(int width, T* x);
  // Border rows of grad (device, num_nodes x width) += the adjoints of their ghost copies.
  template <class T>
  void reverse(int width, T* grad);

 private:
  template <class T>
  DeviceArray<T>& rows() {
    if constexpr (std::is_same_v<T, float>)
      return border_rows_f_;
    else
      return border_rows_;
  }
  HaloExchange* exchange_ = nullptr;
  int64_t num_nodes_ = 0, num_owned_ = 0, num_border_ = 0;
  cudaStream_t stream_ = nullptr;
  DeviceArray<int32_t> border_;
  DeviceArray<double> border_rows_;
  DeviceArray<float> border_rows_f_;
  PinnedBuffer host_border_, host_ghost_;
};

}  // namespace e3fuse::cuda
