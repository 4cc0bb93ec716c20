// cuda/conv_backward_f32.cu: the convolution backward for float (conv_kernels.cuh), in a
// translation unit of its own so that it builds in parallel with the others.
#include "cuda/conv_kernels.cuh"

namespace e3fuse::cuda {

template void conv_backward<float>(const Geometry<float>&, const Conv<float>&, const GraphView&,
                                   int64_t, const float*, const float*, float*, double*, double*,
                                   const RemoteForces&, int64_t*, cudaStream_t, const ConvRows&);

}  // namespace e3fuse::cuda
