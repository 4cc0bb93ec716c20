// cuda/conv_backward_split_f32.cu: the float convolution backward of graphs that split rows
// over two blocks (RowSplit, conv_kernels.cuh), in a translation unit of its own so that it
// builds in parallel with conv_backward_f32.cu.
#include "cuda/conv_kernels.cuh"

namespace e3fuse::cuda {

void conv_backward_split(const Geometry<float>& geom, const Conv<float>& conv,
                         const typename Conv<float>::View& view, const GraphView& g,
                         int64_t receiver_rows, const float* x, const float* grad_y, float* grad_x,
                         double* forces, double* atom_virials, const RemoteForces& remote,
                         int64_t* error_node, cudaStream_t stream, const ConvRows& rows) {
  conv_backward_launch<float, true>(geom, conv, view, g, receiver_rows, x, grad_y, grad_x, forces,
                                    atom_virials, remote, error_node, stream, rows);
}

}  // namespace e3fuse::cuda
