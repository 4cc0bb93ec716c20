// cuda/conv_backward_f64.cu: the convolution backward for double (conv_kernels.cuh), in a
// translation unit of its own so that it builds in parallel with the others.
#include "cuda/conv_kernels.cuh"

namespace e3fuse::cuda {

template void conv_backward<double>(const Geometry<double>&, const Conv<double>&, const GraphView&,
                                    int64_t, const double*, const double*, double*, double*,
                                    double*, const RemoteForces&, int64_t*, cudaStream_t,
                                    const ConvRows&);

}  // namespace e3fuse::cuda
