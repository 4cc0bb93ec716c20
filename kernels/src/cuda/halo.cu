// cuda/halo.cu: DeviceHalo (cuda/halo.cuh), the pack and unpack kernels of the halo rows and
// the copies and sums of the self images.
#include <algorithm>
#include <cstring>
#include <cub/cub.cuh>
#include <limits>

#include "cuda/halo.cuh"
#include "e3fuse/error.h"

namespace e3fuse::cuda {

namespace {

constexpr int kThreads = 256;
int grid(int64_t work) { return static_cast<int>(blocks_for(work, kThreads)); }

// out[r][c] = x[rows[r]][c] (halo pack: border rows).
template <class T>
__global__ void gather_rows_kernel(int64_t count, int width, const int32_t* rows, const T* x,
                                   T* out) {
  const int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (q >= count * width) return;
  const int64_t r = q / width;
  out[q] = x[static_cast<int64_t>(rows[r]) * width + (q - r * width)];
}

// out[targets[g]][c] += in[entries[j]][c] for j over group g's entries, in their order: one
// thread per (group, column), a fixed order of additions (bitwise reproducible, no atomics).
// in and out may be the same array (self images: entries and targets are distinct rows).
template <class T>
__global__ void add_groups_kernel(int64_t num_groups, int width, const int32_t* targets,
                                  const int32_t* offsets, const int32_t* entries, const T* in,
                                  T* out) {
  const int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (q >= num_groups * width) return;
  const int64_t g = q / width, c = q - g * width;
  T* row = out + static_cast<int64_t>(targets[g]) * width + c;
  T sum = *row;
  for (int32_t j = offsets[g]; j < offsets[g + 1]; ++j)
    sum += in[static_cast<int64_t>(entries[j]) * width + c];
  *row = sum;
}

// x[to[k]][c] = x[from[k]][c] (self images of one kind of source).
template <class T>
__global__ void copy_rows_kernel(int64_t count, int width, const int32_t* to, const int32_t* from,
                                 T* x) {
  const int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (q >= count * width) return;
  const int64_t k = q / width, c = q - k * width;
  x[static_cast<int64_t>(to[k]) * width + c] = x[static_cast<int64_t>(from[k]) * width + c];
}

// flags[u] = 1 when node u needs the exchange: an exchanged ghost (owned <= u < first_image),
// or a self image (u >= first_image) of one.
__global__ void node_flags_kernel(int64_t num_nodes, int64_t num_owned, int64_t first_image,
                                  const int32_t* image_sources, int32_t* flags) {
  const int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (u >= num_nodes) return;
  flags[u] = u < num_owned     ? 0
             : u < first_image ? 1
                               : (image_sources[u - first_image] >= num_owned ? 1 : 0);
}

// row_flags[i] = 1 when a neighbor of row i (i < rows) in the list needs the exchange.
__global__ void row_flags_kernel(int64_t rows, const int64_t* row_offsets, const int32_t* neighbors,
                                 const int32_t* node_flags, int32_t* row_flags) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows) return;
  int32_t flag = 0;
  for (int64_t e = row_offsets[i]; e < row_offsets[i + 1] && !flag; ++e)
    flag = node_flags[neighbors[e]];
  row_flags[i] = flag;
}

// A stable partition of rows [0, count) by flag from the inclusive sums of the flags:
// flagged row i goes to flagged[scan[i] - 1], the others to rest[i - scan[i]].
__global__ void partition_kernel(int64_t count, const int32_t* flags, const int32_t* scan,
                                 int32_t* flagged, int32_t* rest) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  if (flags[i])
    flagged[scan[i] - 1] = static_cast<int32_t>(i);
  else
    rest[i - scan[i]] = static_cast<int32_t>(i);
}

}  // namespace

DeviceHalo::~DeviceHalo() {
  for (cudaEvent_t e : event_pool_) cudaEventDestroy(e);
  for (cudaEvent_t e : {packed_, computed_, copied_in_})
    if (e) cudaEventDestroy(e);
  if (copy_stream_) cudaStreamDestroy(copy_stream_);
}

void DeviceHalo::bind(HaloExchange* exchange, int64_t num_nodes, int64_t num_owned,
                      cudaStream_t stream) {
  exchange_ = exchange;
  waits_.clear();
  events_used_ = 0;
  if (!exchange_) return;
  stream_ = stream;
  device_rows_ = exchange_->takes_device_rows();
  const int64_t num_border = exchange_->num_border_nodes();
  const int64_t num_images = exchange_->num_self_images();
  const int32_t* border = exchange_->border_nodes();
  const int32_t* sources = exchange_->self_image_sources();
  // the lists change when the front end chooses new ghosts (LAMMPS: at reneighboring);
  // between, only a comparison on the host
  auto same = [](const std::vector<int32_t>& kept, const int32_t* now, int64_t count) {
    return static_cast<int64_t>(kept.size()) == count &&
           (count == 0 || std::memcmp(kept.data(), now, count * sizeof(int32_t)) == 0);
  };
  if (num_nodes == num_nodes_ && num_owned == num_owned_ &&
      same(kept_border_, border, num_border) && same(kept_sources_, sources, num_images))
    return;
  split_valid_ = false;
  num_nodes_ = num_nodes;
  num_owned_ = num_owned;
  num_border_ = num_border;
  num_images_ = num_images;
  kept_border_.assign(border, border + num_border);
  kept_sources_.assign(sources, sources + num_images);
  border_.upload(kept_border_.data(), kept_border_.size(), stream);
  border_groups_.build(border, num_border_, num_owned_, 0, stream);
  image_sources_.upload(kept_sources_.data(), kept_sources_.size(), stream);
  // the self images by the kind of source (owned or exchanged ghost): sources are never
  // images, so the two kinds together are every image
  const int64_t first_image = num_nodes_ - num_images_;
  std::vector<int32_t> lists[4];  // local images, their sources, remote images, theirs
  for (int64_t k = 0; k < num_images_; ++k) {
    const int kind = sources[k] < num_owned_ ? 0 : 2;
    lists[kind].push_back(static_cast<int32_t>(first_image + k));
    lists[kind + 1].push_back(sources[k]);
  }
  num_local_images_ = static_cast<int64_t>(lists[0].size());
  num_remote_images_ = static_cast<int64_t>(lists[2].size());
  local_images_.upload(lists[0].data(), lists[0].size(), stream);
  local_image_sources_.upload(lists[1].data(), lists[1].size(), stream);
  remote_images_.upload(lists[2].data(), lists[2].size(), stream);
  remote_image_sources_.upload(lists[3].data(), lists[3].size(), stream);
  // the images' sums per source, split by the source's kind: together, one group per
  // source of [0, first_image) with its images in node order
  local_image_groups_.build(sources, num_images_, first_image, first_image, stream, 0, num_owned_);
  remote_image_groups_.build(sources, num_images_, first_image, first_image, stream, num_owned_,
                             first_image);
}

void DeviceHalo::set_graph(const GraphView& g, bool same_edges) {
  if (!active()) return;
  if (!same_edges || g.row_offsets != graph_.row_offsets || g.neighbors != graph_.neighbors ||
      g.num_nodes != graph_.num_nodes || g.num_energy_nodes != graph_.num_energy_nodes)
    split_valid_ = false;
  graph_ = g;
}

// Flags and a stable partition on the device, the four counts back to the host (one
// synchronization per new graph or exchange lists).
void DeviceHalo::ensure_split() {
  if (split_valid_) return;
  const int64_t n = num_nodes_, owned = num_owned_;
  if (graph_.num_nodes != n || graph_.num_energy_nodes != owned)
    throw Error("internal: halo overlap without the call's graph (DeviceHalo::set_graph)");
  if (n >= std::numeric_limits<int32_t>::max())
    throw Error("internal: halo overlap with 2^31 or more nodes");
  const auto count = static_cast<size_t>(std::max<int64_t>(n, 1));
  node_flags_.resize(count);
  row_flags_.resize(count);
  scan_.resize(count);
  for (auto* a : {&interior_, &boundary_, &exchanged_senders_, &other_senders_}) a->resize(count);
  node_flags_kernel<<<grid(n), kThreads, 0, stream_>>>(n, owned, n - num_images_,
                                                       image_sources_.data(), node_flags_.data());
  check_launch("node_flags_kernel");
  if (owned > 0) {
    row_flags_kernel<<<grid(owned), kThreads, 0, stream_>>>(
        owned, graph_.row_offsets, graph_.neighbors, node_flags_.data(), row_flags_.data());
    check_launch("row_flags_kernel");
  }
  int64_t counts[2] = {0, 0};  // boundary receivers, senders that need the exchange
  const int32_t* flags[2] = {row_flags_.data(), node_flags_.data()};
  const int64_t items[2] = {owned, n};
  int32_t* flagged[2] = {boundary_.data(), exchanged_senders_.data()};
  int32_t* rest[2] = {interior_.data(), other_senders_.data()};
  for (int p = 0; p < 2; ++p) {
    if (items[p] == 0) continue;
    const int num_items = static_cast<int>(items[p]);
    size_t bytes = 0;
    check(cub::DeviceScan::InclusiveSum(nullptr, bytes, flags[p], scan_.data(), num_items, stream_),
          "cub::DeviceScan::InclusiveSum");
    scan_temp_.resize((bytes + sizeof(int32_t) - 1) / sizeof(int32_t) + 1);
    check(cub::DeviceScan::InclusiveSum(scan_temp_.data(), bytes, flags[p], scan_.data(), num_items,
                                        stream_),
          "cub::DeviceScan::InclusiveSum");
    partition_kernel<<<grid(items[p]), kThreads, 0, stream_>>>(items[p], flags[p], scan_.data(),
                                                               flagged[p], rest[p]);
    check_launch("partition_kernel");
    int32_t total = 0;
    check(cudaMemcpyAsync(&total, scan_.data() + items[p] - 1, sizeof(int32_t),
                          cudaMemcpyDeviceToHost, stream_),
          "halo split count");
    check(cudaStreamSynchronize(stream_), "halo split count");
    counts[p] = total;
  }
  num_boundary_ = counts[0];
  num_interior_ = owned - counts[0];
  num_exchanged_senders_ = counts[1];
  num_other_senders_ = n - counts[1];
  split_valid_ = true;
}

ConvRows DeviceHalo::interior_receivers() {
  ensure_split();
  return {interior_.data(), num_interior_, false};
}
ConvRows DeviceHalo::boundary_receivers() {
  ensure_split();
  return {boundary_.data(), num_boundary_, true};
}
ConvRows DeviceHalo::exchanged_senders() {
  ensure_split();
  return {exchanged_senders_.data(), num_exchanged_senders_, false};
}
ConvRows DeviceHalo::other_senders() {
  ensure_split();
  return {other_senders_.data(), num_other_senders_, true};
}

cudaEvent_t DeviceHalo::pooled_event() {
  if (events_used_ == event_pool_.size()) {
    cudaEvent_t e = nullptr;
    check(cudaEventCreate(&e), "cudaEventCreate");
    event_pool_.push_back(e);
  }
  return event_pool_[events_used_++];
}

void DeviceHalo::record_wait_event() {
  cudaEvent_t e = pooled_event();
  check(cudaEventRecord(e, stream_), "cudaEventRecord");
  waits_.push_back(e);
}

void DeviceHalo::collect() {
  if (exchange_ && !waits_.empty()) {
    double ms_total = 0.0;
    for (size_t q = 0; q + 1 < waits_.size(); q += 2) {
      float ms = 0.0f;
      check(cudaEventElapsedTime(&ms, waits_[q], waits_[q + 1]), "cudaEventElapsedTime");
      ms_total += ms;
    }
    exchange_->add_device_wait(1e-3 * ms_total);
  }
  waits_.clear();
  events_used_ = 0;
}

void RowGroups::build(const int32_t* targets, int64_t count, int64_t bound, int64_t first_entry,
                      cudaStream_t stream, int64_t target_begin, int64_t target_end) {
  if (target_end < 0) target_end = bound;
  // a counting sort by target keeps the entries' order within a target
  std::vector<int32_t>& offsets = host_offsets_;
  offsets.assign(static_cast<size_t>(bound) + 1, 0);
  for (int64_t k = 0; k < count; ++k) ++offsets[targets[k] + 1];
  host_targets_.clear();
  for (int64_t u = target_begin; u < target_end; ++u)
    if (offsets[u + 1] > 0) host_targets_.push_back(static_cast<int32_t>(u));
  for (int64_t u = 0; u < bound; ++u) offsets[u + 1] += offsets[u];
  host_entries_.resize(static_cast<size_t>(count));
  std::vector<int32_t> next(offsets.begin(), offsets.end() - 1);
  for (int64_t k = 0; k < count; ++k)
    host_entries_[next[targets[k]]++] = static_cast<int32_t>(first_entry + k);
  // offsets per group (distinct target); the kept targets' entries are contiguous
  num_groups = static_cast<int64_t>(host_targets_.size());
  std::vector<int32_t> compact(static_cast<size_t>(num_groups) + 1, offsets[target_begin]);
  for (int64_t g = 0; g < num_groups; ++g) compact[g + 1] = offsets[host_targets_[g] + 1];
  offsets.swap(compact);
  targets_.upload(host_targets_.data(), host_targets_.size(), stream);
  offsets_.upload(offsets.data(), offsets.size(), stream);
  entries_.upload(host_entries_.data(), host_entries_.size(), stream);
}

template <class T>
void RowGroups::add(int width, const T* in, T* out, cudaStream_t stream) const {
  if (num_groups == 0) return;
  add_groups_kernel<T><<<grid(num_groups * width), kThreads, 0, stream>>>(
      num_groups, width, targets_.data(), offsets_.data(), entries_.data(), in, out);
  check_launch("add_groups_kernel");
}

// The exchange's rows: in pinned host memory (copied out and in around it), or, when the
// exchange takes device rows (HaloExchange::takes_device_rows), the device's own: the packed
// border rows and the ghost rows of x in place (forward), the ghosts' adjoints in place and
// the border sums in the border rows' array (reverse).
//
// The PCIe copies run on copies_: the compute stream in forward() / reverse() (a rank
// without atoms); around the convolutions a stream of their own, ordered after the compute stream's
// work so far by an event (begin_copies), so that they run beside the convolution, and the compute
// stream waits for the copies in (join_copies). Their rows are disjoint from the rows the
// convolution meanwhile reads and writes (see DeviceHalo).

void DeviceHalo::begin_copies(bool overlapped) {
  copies_ = stream_;
  if (!overlapped || device_rows_) return;
  if (!copy_stream_) {
    check(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking), "stream");
    check(cudaEventCreateWithFlags(&computed_, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&copied_in_, cudaEventDisableTiming), "cudaEventCreate");
  }
  check(cudaEventRecord(computed_, stream_), "cudaEventRecord");
  check(cudaStreamWaitEvent(copy_stream_, computed_, 0), "cudaStreamWaitEvent");
  copies_ = copy_stream_;
}

void DeviceHalo::join_copies() {
  if (copies_ == stream_) return;
  check(cudaEventRecord(copied_in_, copies_), "cudaEventRecord");
  check(cudaStreamWaitEvent(stream_, copied_in_, 0), "cudaStreamWaitEvent");
}

void DeviceHalo::record_packed() {
  if (!packed_)
    check(cudaEventCreateWithFlags(&packed_, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaEventRecord(packed_, copies_), "cudaEventRecord");
}

template <class T>
void DeviceHalo::pack_border(int width, const T* x, bool overlapped) {
  const size_t w = static_cast<size_t>(width);
  DeviceArray<T>& border_rows = rows<T>();
  border_rows.resize(num_border_ * w);
  if (num_border_ > 0) {
    gather_rows_kernel<T><<<grid(num_border_ * width), kThreads, 0, stream_>>>(
        num_border_, width, border_.data(), x, border_rows.data());
    check_launch("gather_rows_kernel");
  }
  begin_copies(overlapped);
  if (!device_rows_ && num_border_ > 0)
    border_rows.download(host_border_.reserve<T>(num_border_ * w + 1), num_border_ * w, copies_);
}

template <class T>
void DeviceHalo::exchange_forward(int width, T* x) {
  const size_t w = static_cast<size_t>(width);
  const int64_t ghosts = num_nodes_ - num_owned_ - num_images_;  // exchanged ghosts
  T* ghost_rows = x ? x + num_owned_ * width : nullptr;
  if (device_rows_) {
    exchange_->forward(width, rows<T>().data(), ghost_rows);
    record_wait_event();  // the compute stream resumes
    return;
  }
  T* host_border = host_border_.reserve<T>(num_border_ * w + 1);  // pack_border's
  T* host_ghost = host_ghost_.reserve<T>(ghosts * w + 1);
  exchange_->forward(width, host_border, host_ghost);
  if (copies_ == stream_) record_wait_event();  // the copy in is the compute stream's work
  if (ghosts > 0)
    check(cudaMemcpyAsync(ghost_rows, host_ghost, ghosts * w * sizeof(T), cudaMemcpyHostToDevice,
                          copies_),
          "halo unpack");
  if (copies_ != stream_) {  // the compute stream resumes once the ghost rows are in
    join_copies();
    record_wait_event();
  }
}

template <class T>
void DeviceHalo::pack_ghosts(int width, T* grad, bool overlapped) {
  const size_t w = static_cast<size_t>(width);
  const int64_t ghosts = num_nodes_ - num_owned_ - num_images_;  // exchanged ghosts
  rows<T>().resize(num_border_ * w);  // the border sums' array, before the exchange
  begin_copies(overlapped);
  if (!device_rows_ && ghosts > 0)
    check(cudaMemcpyAsync(host_ghost_.reserve<T>(ghosts * w + 1), grad + num_owned_ * width,
                          ghosts * w * sizeof(T), cudaMemcpyDeviceToHost, copies_),
          "halo pack");
}

template <class T>
void DeviceHalo::exchange_reverse(int width, T* grad) {
  const size_t w = static_cast<size_t>(width);
  const int64_t ghosts = num_nodes_ - num_owned_ - num_images_;  // exchanged ghosts
  DeviceArray<T>& border_rows = rows<T>();
  if (device_rows_) {
    exchange_->reverse(width, grad ? grad + num_owned_ * width : nullptr, border_rows.data());
    record_wait_event();  // the compute stream resumes
  } else {
    T* host_border = host_border_.reserve<T>(num_border_ * w + 1);
    T* host_ghost = host_ghost_.reserve<T>(ghosts * w + 1);  // pack_ghosts'
    exchange_->reverse(width, host_ghost, host_border);
    if (copies_ == stream_) record_wait_event();  // the copy in is the compute stream's work
    if (num_border_ > 0) border_rows.upload(host_border, num_border_ * w, copies_);
    if (copies_ != stream_) {  // the compute stream resumes once the border sums are in
      join_copies();
      record_wait_event();
    }
  }
  if (num_border_ > 0)
    border_groups_.add(width, static_cast<const T*>(border_rows.data()), grad, stream_);
}

template <class T>
void DeviceHalo::copy_images(bool of_exchanged, int width, T* x) {
  const int64_t count = of_exchanged ? num_remote_images_ : num_local_images_;
  if (count == 0) return;
  const DeviceArray<int32_t>& images = of_exchanged ? remote_images_ : local_images_;
  const DeviceArray<int32_t>& sources = of_exchanged ? remote_image_sources_ : local_image_sources_;
  copy_rows_kernel<T><<<grid(count * width), kThreads, 0, stream_>>>(count, width, images.data(),
                                                                     sources.data(), x);
  check_launch("copy_rows_kernel");
}

template <class T>
void DeviceHalo::forward(int width, T* x) {
  pack_border(width, x, false);
  record_wait_event();  // the device stops here
  check(cudaStreamSynchronize(stream_), "halo pack");
  exchange_forward(width, x);
  // the self images of both kinds, after the exchanged ghosts (sources of some)
  copy_images(false, width, x);
  copy_images(true, width, x);
}

template <class T>
void DeviceHalo::reverse(int width, T* grad) {
  // self images into their sources (each source's sum in node order, split by the kind of
  // source: disjoint targets), before the exchanged ghosts leave (some are sources)
  local_image_groups_.add(width, static_cast<const T*>(grad), grad, stream_);
  remote_image_groups_.add(width, static_cast<const T*>(grad), grad, stream_);
  pack_ghosts(width, grad, false);
  record_wait_event();  // the device stops here
  check(cudaStreamSynchronize(stream_), "halo pack");
  exchange_reverse(width, grad);
}

// Overlapped order (see DeviceHalo): the same copies and sums as forward() and reverse(),
// around the caller's convolutions.

template <class T>
void DeviceHalo::begin_forward(int width, T* x) {
  ensure_split();
  pack_border(width, x, true);
  record_packed();
  copy_images(false, width, x);  // images of owned nodes: the interior rows may read them
}

template <class T>
void DeviceHalo::finish_forward(int width, T* x) {
  record_wait_event();  // the device's queued work (the interior rows) ends here
  check(cudaEventSynchronize(packed_), "halo pack");
  exchange_forward(width, x);
  copy_images(true, width, x);  // after the exchanged ghosts, their sources
}

template <class T>
void DeviceHalo::begin_reverse(int width, T* grad) {
  // images of exchanged ghosts into their sources before those leave
  remote_image_groups_.add(width, static_cast<const T*>(grad), grad, stream_);
  pack_ghosts(width, grad, true);
  record_packed();
}

template <class T>
void DeviceHalo::finish_reverse(int width, T* grad) {
  // images of owned nodes into their sources, once the caller's work on them is queued
  local_image_groups_.add(width, static_cast<const T*>(grad), grad, stream_);
  record_wait_event();  // the device's queued work ends here
  check(cudaEventSynchronize(packed_), "halo pack");
  exchange_reverse(width, grad);
}

template void DeviceHalo::begin_forward<float>(int, float*);
template void DeviceHalo::begin_forward<double>(int, double*);
template void DeviceHalo::finish_forward<float>(int, float*);
template void DeviceHalo::finish_forward<double>(int, double*);
template void DeviceHalo::begin_reverse<float>(int, float*);
template void DeviceHalo::begin_reverse<double>(int, double*);
template void DeviceHalo::finish_reverse<float>(int, float*);
template void DeviceHalo::finish_reverse<double>(int, double*);
template void DeviceHalo::forward<float>(int, float*);
template void DeviceHalo::forward<double>(int, double*);
template void DeviceHalo::reverse<float>(int, float*);
template void RowGroups::add<float>(int, const float*, float*, cudaStream_t) const;
template void RowGroups::add<double>(int, const double*, double*, cudaStream_t) const;
template void DeviceHalo::reverse<double>(int, double*);

}  // namespace e3fuse::cuda
