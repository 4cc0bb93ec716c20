// cuda/halo.cu: DeviceHalo (cuda/halo.cuh), the pack and unpack kernels of the halo rows.
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
}

template <class T>
void DeviceHalo::forward(int width, T* x) {
  const size_t w = static_cast<size_t>(width);
  const int64_t ghosts = num_nodes_ - num_owned_;
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
}

template <class T>
void DeviceHalo::reverse(int width, T* grad) {
  const size_t w = static_cast<size_t>(width);
  const int64_t ghosts = num_nodes_ - num_owned_;
  T* host_border = host_border_.reserve<T>(num_border_ * w + 1);
  T* host_ghost = host_ghost_.reserve<T>(ghosts * w + 1);
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
