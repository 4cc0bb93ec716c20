// cuda/halo.cuh: the GPU side of a HaloExchange (e3fuse/engine.h), the per-layer exchange of
// node rows of pair_style e3fuse comm exchange (cuda/halo.cu), and the page-locked host
// buffers it and the backend stage their copies in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/conv.cuh"
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
  // targets: count values in [0, bound) (host memory). Only the targets in
  // [target_begin, target_end) become groups (target_end -1: bound).
  void build(const int32_t* targets, int64_t count, int64_t bound, int64_t first_entry,
             cudaStream_t stream, int64_t target_begin = 0, int64_t target_end = -1);
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
//
// Overlap (the order every layer's exchange takes; forward() and reverse() in one piece serve
// a rank without atoms, which only takes part in the exchanges): nodes "need the exchange" when
// they are exchanged ghosts or self images of one. A layer's receivers are split into interior rows
// (no neighbor in the list needs the exchange) and boundary rows, its senders into those that need
// it and the others (flag kernels and a scan on the GPU, once per graph and exchange lists).
// Forward: begin_forward() packs the border rows and starts their copy to the host; the caller runs
// the convolution of the interior rows; finish_forward() exchanges on the host meanwhile and copies
// the ghost rows in; the caller runs the boundary rows. Backward: the caller runs the senders that
// need the exchange; begin_reverse() starts the copy of their adjoints to the host; the caller runs
// the other senders (and anything else that does not touch those rows); finish_reverse()
// exchanges and adds the border sums. Every row's arithmetic and every sum's order are those
// of an exchange in one piece before (after) the whole convolution: the same bits (measured
// against that order at fae69af; benchmarks/results/lammps_overlap_h200x4).
class DeviceHalo {
 public:
  DeviceHalo() = default;
  ~DeviceHalo();
  DeviceHalo(const DeviceHalo&) = delete;
  DeviceHalo& operator=(const DeviceHalo&) = delete;
  // For one compute call; exchange null: no halo.
  void bind(HaloExchange* exchange, int64_t num_nodes, int64_t num_owned, cudaStream_t stream);
  bool active() const { return exchange_ != nullptr; }
  // The device graph of this call (after bind); same_edges: the caller knows its edges are
  // those of the previous call's graph (the split of the rows is then kept).
  void set_graph(const GraphView& g, bool same_edges);
  template <class T>
  void begin_forward(int width, T* x);
  template <class T>
  void finish_forward(int width, T* x);
  template <class T>
  void begin_reverse(int width, T* grad);
  template <class T>
  void finish_reverse(int width, T* grad);
  // The rows of the convolution calls around the exchange (active() only).
  ConvRows interior_receivers();
  ConvRows boundary_receivers();
  ConvRows exchanged_senders();
  ConvRows other_senders();
  // After the call's stream was synchronized: tells the exchange how long the device
  // waited for it (HaloExchange::add_device_wait).
  void collect();
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
  // the steps of forward() and reverse() (see halo.cu)
  void begin_copies(bool overlapped);
  void join_copies();
  void record_packed();
  template <class T>
  void pack_border(int width, const T* x, bool overlapped);
  template <class T>
  void exchange_forward(int width, T* x);
  template <class T>
  void pack_ghosts(int width, T* grad, bool overlapped);
  template <class T>
  void exchange_reverse(int width, T* grad);
  void ensure_split();
  // self images <- their sources: those of exchanged ghosts (of_exchanged) or of owned nodes
  template <class T>
  void copy_images(bool of_exchanged, int width, T* x);
  // Records an event on the compute stream into waits_, which holds (stop, resume) pairs of
  // one exchange: the device stopped (packed rows copied out, or the last work before the
  // host's exchange) and resumed (the host's next work enqueued).
  void record_wait_event();
  cudaEvent_t pooled_event();
  HaloExchange* exchange_ = nullptr;
  bool device_rows_ = false;  // HaloExchange::takes_device_rows
  // the split of the rows (overlap): for which graph and lists it was made
  bool split_valid_ = false;
  GraphView graph_{};
  DeviceArray<int32_t> node_flags_, row_flags_, scan_, scan_temp_;
  DeviceArray<int32_t> interior_, boundary_, exchanged_senders_, other_senders_;
  int64_t num_interior_ = 0, num_boundary_ = 0, num_exchanged_senders_ = 0, num_other_senders_ = 0;
  // self images split by their source: owned (copied before the exchange, their adjoints
  // added after the other senders) or exchanged (after / before the exchange); forward() and
  // reverse() take both lists at once
  DeviceArray<int32_t> local_images_, local_image_sources_, remote_images_, remote_image_sources_;
  int64_t num_local_images_ = 0, num_remote_images_ = 0;
  RowGroups local_image_groups_, remote_image_groups_;
  // the PCIe copies' stream (copy_stream_ or stream_), their events: the compute stream's
  // work before them done, the rows copied in
  cudaStream_t copies_ = nullptr, copy_stream_ = nullptr;
  cudaEvent_t computed_ = nullptr, copied_in_ = nullptr;
  cudaEvent_t packed_ = nullptr;                 // the packed rows reached the host
  std::vector<cudaEvent_t> event_pool_, waits_;  // waits_: stop, resume pairs of this call
  size_t events_used_ = 0;
  // num_images_: the self images, nodes [num_nodes_ - num_images_, num_nodes_) (HaloExchange)
  int64_t num_nodes_ = 0, num_owned_ = 0, num_border_ = 0, num_images_ = 0;
  cudaStream_t stream_ = nullptr;
  DeviceArray<int32_t> border_;
  DeviceArray<int32_t> image_sources_;  // the source of node num_nodes_ - num_images_ + k
  RowGroups border_groups_;             // border entry r -> border_[r] (border nodes may repeat)
  std::vector<int32_t> kept_border_, kept_sources_;  // the lists the device arrays hold
  DeviceArray<double> border_rows_;
  DeviceArray<float> border_rows_f_;
  PinnedBuffer host_border_, host_ghost_;
};

}  // namespace e3fuse::cuda
