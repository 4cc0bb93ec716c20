// One frame task compiled alone, to count its instructions (README.md, "The cost model against
// the compiled code"): a kernel that calls frame_task<D1, true> of frame_backward_micro.cu.
// Not run, only compiled; from the repository root:
//   nvcc -std=c++17 -arch=sm_90 -O3 --expt-relaxed-constexpr -DE3FUSE_WITH_CUDA=1 -I kernels/src \
//     -I kernels/include -I benchmarks/micro -cubin -o probe.cubin \
//     benchmarks/results/frame_backward/static/task_probe.cu
//   nvdisasm probe.cubin   (the probe<7> and probe<5> functions)
#define main frame_micro_main
#include "frame_backward_micro.cu"
#undef main

namespace {
template <int D1>
__global__ void probe(cu::Conv<float>::View c, FrameView fv, FrameTask task, FrameBlock B, int n,
                      const float* x, const float* g, const float* w, const int* s, const int* iv,
                      const float* t, const float* u, float* part, float* gx) {
  frame_task<D1, true>(c, fv, task, B, n, 0, x, g, w, s, iv, t, u, part, gx);
}
template __global__ void probe<7>(cu::Conv<float>::View, FrameView, FrameTask, FrameBlock, int,
                                  const float*, const float*, const float*, const int*, const int*,
                                  const float*, const float*, float*, float*);
template __global__ void probe<5>(cu::Conv<float>::View, FrameView, FrameTask, FrameBlock, int,
                                  const float*, const float*, const float*, const int*, const int*,
                                  const float*, const float*, float*, float*);
}  // namespace
