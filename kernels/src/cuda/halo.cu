// cuda/halo.cu: DeviceHalo (cuda/halo.cuh), the pack and unpack kernels of the halo rows and
// the copies and sums of the self images.
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

// x[rows[r]][c] += in[r][c] (halo unpack of the reverse exchange; rows are distinct).
template <class T>
__global__ void add_rows_kernel(int64_t count, int width, const int32_t* rows, const T* in, T* x) {
  const int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (q >= count * width) return;
  const int64_t r = q / width;
  x[static_cast<int64_t>(rows[r]) * width + (q - r * width)] += in[q];
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

// grad[source][c] += grad[image][c] over the images of each source, in node order: one
// thread per (source, column), a fixed order of additions (bitwise reproducible).
template <class T>
__global__ void sum_images_kernel(int64_t num_sources, int width, const int32_t* sources,
                                  const int32_t* offsets, const int32_t* images, T* grad) {
  const int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (q >= num_sources * width) return;
  const int64_t s = q / width, c = q - s * width;
  T* row = grad + static_cast<int64_t>(sources[s]) * width + c;
  T sum = *row;
  for (int32_t j = offsets[s]; j < offsets[s + 1]; ++j)
    sum += grad[static_cast<int64_t>(images[j]) * width + c];
  *row = sum;
}

}  // namespace

void DeviceHalo::bind(HaloExchange* exchange, int64_t num_nodes, int64_t num_owned,
                      cudaStream_t stream) {
  exchange_ = exchange;
  if (!exchange_) return;
  num_nodes_ = num_nodes;
  num_owned_ = num_owned;
  num_border_ = exchange_->num_border_nodes();
  stream_ = stream;
  border_.upload(exchange_->border_nodes(), static_cast<size_t>(num_border_), stream);
  num_images_ = exchange_->num_self_images();
  const int32_t* sources = exchange_->self_image_sources();
  image_sources_.upload(sources, static_cast<size_t>(num_images_), stream);
  // the images grouped by source (a counting sort keeps node order within a source)
  const int64_t first = num_nodes_ - num_images_;
  std::vector<int32_t>& offsets = host_source_offsets_;
  offsets.assign(static_cast<size_t>(first) + 1, 0);
  for (int64_t k = 0; k < num_images_; ++k) ++offsets[sources[k] + 1];
  host_source_nodes_.clear();
  for (int64_t u = 0; u < first; ++u)
    if (offsets[u + 1] > 0) host_source_nodes_.push_back(static_cast<int32_t>(u));
  for (int64_t u = 0; u < first; ++u) offsets[u + 1] += offsets[u];
  host_source_images_.resize(static_cast<size_t>(num_images_));
  std::vector<int32_t> next(offsets.begin(), offsets.end() - 1);
  for (int64_t k = 0; k < num_images_; ++k)
    host_source_images_[next[sources[k]]++] = static_cast<int32_t>(first + k);
  // offsets per distinct source (CSR over source_nodes_)
  num_image_sources_ = static_cast<int64_t>(host_source_nodes_.size());
  std::vector<int32_t> compact(static_cast<size_t>(num_image_sources_) + 1, 0);
  for (int64_t s = 0; s < num_image_sources_; ++s)
    compact[s + 1] = offsets[host_source_nodes_[s] + 1];
  offsets.swap(compact);
  source_nodes_.upload(host_source_nodes_.data(), host_source_nodes_.size(), stream);
  source_offsets_.upload(offsets.data(), offsets.size(), stream);
  source_images_.upload(host_source_images_.data(), host_source_images_.size(), stream);
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
  if (num_image_sources_ > 0) {  // before the exchanged ghosts leave: some are sources
    sum_images_kernel<T><<<grid(num_image_sources_ * width), kThreads, 0, stream_>>>(
        num_image_sources_, width, source_nodes_.data(), source_offsets_.data(),
        source_images_.data(), grad);
    check_launch("sum_images_kernel");
  }
  if (ghosts > 0)
    check(cudaMemcpyAsync(host_ghost, grad + num_owned_ * width, ghosts * w * sizeof(T),
                          cudaMemcpyDeviceToHost, stream_),
          "halo pack");
  check(cudaStreamSynchronize(stream_), "halo pack");
  exchange_->reverse(width, host_ghost, host_border);
  if (num_border_ > 0) {
    DeviceArray<T>& border_rows = rows<T>();
    border_rows.upload(host_border, num_border_ * w, stream_);
    add_rows_kernel<T><<<grid(num_border_ * width), kThreads, 0, stream_>>>(
        num_border_, width, border_.data(), border_rows.data(), grad);
    check_launch("add_rows_kernel");
  }
}

template void DeviceHalo::forward<float>(int, float*);
template void DeviceHalo::forward<double>(int, double*);
template void DeviceHalo::reverse<float>(int, float*);
template void DeviceHalo::reverse<double>(int, double*);

}  // namespace e3fuse::cuda
