// cuda/halo.cuh: the GPU side of a HaloExchange (e3fuse/engine.h), the per-layer exchange of
// node rows of pair_style e3fuse comm exchange (cuda/halo.cu), and the page-locked host
// buffers it and the backend stage their copies in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

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
// unpack) by kernels; only those rows and the exchanged ghost rows cross PCIe, in the
// model's precision, through pinned buffers; the exchange between ranks is the front end's.
// Self images never leave the GPU: copied from their sources by a kernel in forward, their
// adjoints summed into the sources in a fixed order (per source, in node order) in reverse.
class DeviceHalo {
 public:
  // For one compute call; exchange null: no halo.
  void bind(HaloExchange* exchange, int64_t num_nodes, int64_t num_owned, cudaStream_t stream);
  bool active() const { return exchange_ != nullptr; }
  // Ghost rows of x (device, num_nodes x width) <- their owners' rows. The exchanged ghost
  // rows (num_owned .. num_nodes - self images) are contiguous: they cross PCIe as they are,
  // in T.
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
  // num_images_: the self images, nodes [num_nodes_ - num_images_, num_nodes_) (HaloExchange)
  int64_t num_nodes_ = 0, num_owned_ = 0, num_border_ = 0, num_images_ = 0;
  int64_t num_image_sources_ = 0;  // distinct sources of the self images
  cudaStream_t stream_ = nullptr;
  DeviceArray<int32_t> border_;
  // self images: image_sources_[k], the source of node num_nodes_ - num_images_ + k; for the
  // deterministic reverse the same pairs grouped by source (CSR): source_nodes_[s] has the
  // images source_images_[source_offsets_[s] .. source_offsets_[s + 1]), in node order
  DeviceArray<int32_t> image_sources_, source_nodes_, source_offsets_, source_images_;
  std::vector<int32_t> host_source_nodes_, host_source_offsets_, host_source_images_;
  DeviceArray<double> border_rows_;
  DeviceArray<float> border_rows_f_;
  PinnedBuffer host_border_, host_ghost_;
};

}  // namespace e3fuse::cuda
