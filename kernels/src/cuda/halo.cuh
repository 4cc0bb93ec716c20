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

// Rows added to rows in a fixed order: entry k (a row index, first_entry + k) goes to row
// targets[k]; targets may repeat. add() does out[targets[k]] += in[first_entry + k] over all
// k, each target's entries in the order of k, one thread per (target, column): bitwise
// reproducible, without atomics.
class RowGroups {
 public:
  // targets: count values in [0, bound) (host memory).
  void build(const int32_t* targets, int64_t count, int64_t bound, int64_t first_entry,
             cudaStream_t stream);
  template <class T>
  void add(int width, const T* in, T* out, cudaStream_t stream) const;
  int64_t num_groups = 0;  // distinct targets

 private:
  DeviceArray<int32_t> targets_, offsets_, entries_;
  std::vector<int32_t> host_targets_, host_offsets_, host_entries_;
};

// The GPU side of a HaloExchange: border rows are gathered (pack) and added to (reverse
// unpack, per node in entry order: border nodes may repeat) by kernels; only those rows and the
// exchanged ghost rows cross PCIe, in the model's precision, through pinned buffers; the exchange
// between ranks is the front end's. Self images never leave the GPU: copied from their sources by a
// kernel in forward, their adjoints summed into the sources in a fixed order (per source, in node
// order) in reverse.
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
  cudaStream_t stream_ = nullptr;
  DeviceArray<int32_t> border_;
  DeviceArray<int32_t> image_sources_;  // the source of node num_nodes_ - num_images_ + k
  RowGroups border_groups_;             // border entry r -> border_[r] (border nodes may repeat)
  RowGroups image_groups_;              // self image -> its source
  std::vector<int32_t> kept_border_, kept_sources_;  // the lists the device arrays hold
  DeviceArray<double> border_rows_;
  DeviceArray<float> border_rows_f_;
  PinnedBuffer host_border_, host_ghost_;
};

}  // namespace e3fuse::cuda
