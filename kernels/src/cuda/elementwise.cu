// cuda/elementwise.cu: small elementwise helpers of the CUDA runners (residual sums,
// the readout MLP's activation and its derivative), one thread per element.
#include "cuda/node_ops.cuh"
#include "ops/activation.h"

namespace e3fuse::cuda {

namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void add_kernel(int64_t count, const T* __restrict__ x, T* __restrict__ y) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) y[i] += x[i];
}

template <class T>
__global__ void activation_forward_kernel(Activation act, T scale, int64_t count, const T* x,
                                          T* y) {  // may run in place (x == y)
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) y[i] = ops::activation(act, x[i]) * scale;
}

template <class T>
__global__ void activation_backward_kernel(Activation act, T scale, int64_t count,
                                           const T* __restrict__ x, T* __restrict__ g) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) g[i] *= ops::activation_grad(act, x[i]) * scale;
}

unsigned grid(int64_t count) { return static_cast<unsigned>(blocks_for(count, kThreads)); }

}  // namespace

template <class T>
void add_inplace(int64_t count, const T* x, T* y, cudaStream_t stream) {
  if (count <= 0) return;
  add_kernel<T><<<grid(count), kThreads, 0, stream>>>(count, x, y);
  check_launch("add_kernel");
}

template <class T>
void activation_forward(Activation act, T scale, int64_t count, const T* x, T* y,
                        cudaStream_t stream) {
  if (count <= 0) return;
  activation_forward_kernel<T><<<grid(count), kThreads, 0, stream>>>(act, scale, count, x, y);
  check_launch("activation_forward_kernel");
}

template <class T>
void activation_backward(Activation act, T scale, int64_t count, const T* x, T* g,
                         cudaStream_t stream) {
  if (count <= 0) return;
  activation_backward_kernel<T><<<grid(count), kThreads, 0, stream>>>(act, scale, count, x, g);
  check_launch("activation_backward_kernel");
}

#define E3FUSE_INSTANTIATE(T)                                                              \
  template void add_inplace<T>(int64_t, const T*, T*, cudaStream_t);                       \
  template void activation_forward<T>(Activation, T, int64_t, const T*, T*, cudaStream_t); \
  template void activation_backward<T>(Activation, T, int64_t, const T*, T*, cudaStream_t);
E3FUSE_INSTANTIATE(float)
E3FUSE_INSTANTIATE(double)
#undef E3FUSE_INSTANTIATE

}  // namespace e3fuse::cuda
