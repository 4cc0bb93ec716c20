// cuda/halo.cu: DeviceHalo (cuda/halo.cuh), the pack and unpack kernels of the halo rows and
// the copies and sums of the self images.
#include <cstring>

#include "cuda/halo.cuh"

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

// x[first + k][c] = x[sources[k]][c] (self images; sources are never images themselves).
template <class T>
__global__ void copy_images_kernel(int64_t count, int width, const int32_t* sources, int64_t first,
                                   T* x) {
  const int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (q >= count * width) return;
  const int64_t k = q / width, c = q - k * width;
  x[(first + k) * width + c] = x[static_cast<int64_t>(sources[k]) * width + c];
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

}  // namespace

void DeviceHalo::bind(HaloExchange* exchange, int64_t num_nodes, int64_t num_owned,
                      cudaStream_t stream) {
  exchange_ = exchange;
  if (!exchange_) return;
  stream_ = stream;
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
  num_nodes_ = num_nodes;
  num_owned_ = num_owned;
  num_border_ = num_border;
  num_images_ = num_images;
  kept_border_.assign(border, border + num_border);
  kept_sources_.assign(sources, sources + num_images);
  border_.upload(kept_border_.data(), kept_border_.size(), stream);
  border_groups_.build(border, num_border_, num_owned_, 0, stream);
  image_sources_.upload(kept_sources_.data(), kept_sources_.size(), stream);
  image_groups_.build(sources, num_images_, num_nodes_ - num_images_, num_nodes_ - num_images_,
                      stream);
}

void RowGroups::build(const int32_t* targets, int64_t count, int64_t bound, int64_t first_entry,
                      cudaStream_t stream) {
  // a counting sort by target keeps the entries' order within a target
  std::vector<int32_t>& offsets = host_offsets_;
  offsets.assign(static_cast<size_t>(bound) + 1, 0);
  for (int64_t k = 0; k < count; ++k) ++offsets[targets[k] + 1];
  host_targets_.clear();
  for (int64_t u = 0; u < bound; ++u)
    if (offsets[u + 1] > 0) host_targets_.push_back(static_cast<int32_t>(u));
  for (int64_t u = 0; u < bound; ++u) offsets[u + 1] += offsets[u];
  host_entries_.resize(static_cast<size_t>(count));
  std::vector<int32_t> next(offsets.begin(), offsets.end() - 1);
  for (int64_t k = 0; k < count; ++k)
    host_entries_[next[targets[k]]++] = static_cast<int32_t>(first_entry + k);
  // offsets per group (distinct target)
  num_groups = static_cast<int64_t>(host_targets_.size());
  std::vector<int32_t> compact(static_cast<size_t>(num_groups) + 1, 0);
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

template <class T>
void DeviceHalo::forward(int width, T* x) {
  const size_t w = static_cast<size_t>(width);
  const int64_t ghosts = num_nodes_ - num_owned_ - num_images_;  // exchanged ghosts
  T* host_border = host_border_.reserve<T>(num_border_ * w + 1);
  T* host_ghost = host_ghost_.reserve<T>(ghosts * w + 1);
  DeviceArray<T>& border_rows = rows<T>();
  border_rows.resize(num_border_ * w);
  if (num_border_ > 0) {
    gather_rows_kernel<T><<<grid(num_border_ * width), kThreads, 0, stream_>>>(
        num_border_, width, border_.data(), x, border_rows.data());
    check_launch("gather_rows_kernel");
    border_rows.download(host_border, num_border_ * w, stream_);
  }
  check(cudaStreamSynchronize(stream_), "halo pack");
  exchange_->forward(width, host_border, host_ghost);
  if (ghosts > 0)
    check(cudaMemcpyAsync(x + num_owned_ * width, host_ghost, ghosts * w * sizeof(T),
                          cudaMemcpyHostToDevice, stream_),
          "halo unpack");
  if (num_images_ > 0) {  // after the exchanged ghosts: some are sources
    copy_images_kernel<T><<<grid(num_images_ * width), kThreads, 0, stream_>>>(
        num_images_, width, image_sources_.data(), num_nodes_ - num_images_, x);
    check_launch("copy_images_kernel");
  }
}

template <class T>
void DeviceHalo::reverse(int width, T* grad) {
  const size_t w = static_cast<size_t>(width);
  const int64_t ghosts = num_nodes_ - num_owned_ - num_images_;  // exchanged ghosts
  T* host_border = host_border_.reserve<T>(num_border_ * w + 1);
  T* host_ghost = host_ghost_.reserve<T>(ghosts * w + 1);
  // self images into their sources, before the exchanged ghosts leave (some are sources)
  image_groups_.add(width, static_cast<const T*>(grad), grad, stream_);
  if (ghosts > 0)
    check(cudaMemcpyAsync(host_ghost, grad + num_owned_ * width, ghosts * w * sizeof(T),
                          cudaMemcpyDeviceToHost, stream_),
          "halo pack");
  check(cudaStreamSynchronize(stream_), "halo pack");
  exchange_->reverse(width, host_ghost, host_border);
  if (num_border_ > 0) {
    DeviceArray<T>& border_rows = rows<T>();
    border_rows.upload(host_border, num_border_ * w, stream_);
    border_groups_.add(width, static_cast<const T*>(border_rows.data()), grad, stream_);
  }
}

template void DeviceHalo::forward<float>(int, float*);
template void DeviceHalo::forward<double>(int, double*);
template void DeviceHalo::reverse<float>(int, float*);
template void RowGroups::add<float>(int, const float*, float*, cudaStream_t) const;
template void RowGroups::add<double>(int, const double*, double*, cudaStream_t) const;
template void DeviceHalo::reverse<double>(int, double*);

}  // namespace e3fuse::cuda
