// cuda/linear.cu: e3nn o3.Linear on node features, forward and transpose (the GPU
// version of cpu/linear.cpp + cpu/linear_row.h).
//
// Each path (in block -> out block, weight W[u][w]) maps destination element
// (w, m) of the output to sum_u W[u][w] x[u, m]; the transpose maps input (u, m)
// to sum_w W[u][w] g[w, m]. The host unrolls this into per-element segments
// (LinearSegment: a strided dot product over u or w) so that the kernel is one
// thread per (group of NB nodes, destination element): consecutive threads handle
// consecutive elements of the same nodes and read consecutive weights. Each thread
// sums its segments in path order, each segment from 0 as the CPU's `acc` does:
//   dst = (bias or 0 or dst) + seg_0 + seg_1 + ...
#include <algorithm>
#include <vector>

#include "cuda/node_ops.cuh"

namespace e3fuse::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kNodesPerThread = 4;  // weights read once for this many nodes

// NB nodes per thread; with `species` only NB == 1 (each node picks its table).
template <class T, int NB>
__global__ void linear_kernel(int64_t num_nodes, int64_t dim_src, int64_t dim_dst,
                              const int32_t* __restrict__ offsets,
                              const LinearSegment* __restrict__ segs, const T* __restrict__ weights,
                              const T* __restrict__ bias, const int32_t* __restrict__ species,
                              bool accumulate, const T* __restrict__ src, T* __restrict__ dst) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t groups = (num_nodes + NB - 1) / NB;
  if (t >= groups * dim_dst) return;
  const int64_t e = t % dim_dst;
  const int64_t n0 = (t / dim_dst) * NB;
  const int64_t table = species ? static_cast<int64_t>(species[n0]) * (dim_dst + 1) : 0;
  const int begin = offsets[table + e], end = offsets[table + e + 1];

  const T* xs[NB];
  T val[NB];
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    // Past the last node: read a valid row, write nothing.
    const int64_t n = min(n0 + b, num_nodes - 1);
    xs[b] = src + n * dim_src;
    if (bias)
      val[b] = bias[e];
    else if (accumulate)
      val[b] = dst[n * dim_dst + e];
    else
      val[b] = T(0);
  }
  for (int s = begin; s < end; ++s) {
    const LinearSegment seg = segs[s];
    const T* w = weights + seg.w;
    T acc[NB];
#pragma unroll
    for (int b = 0; b < NB; ++b) acc[b] = T(0);
    for (int u = 0; u < seg.count; ++u) {
      const T wu = w[static_cast<int64_t>(u) * seg.w_stride];
      const int64_t i = seg.src + static_cast<int64_t>(u) * seg.src_stride;
#pragma unroll
      for (int b = 0; b < NB; ++b) acc[b] += wu * xs[b][i];
    }
#pragma unroll
    for (int b = 0; b < NB; ++b) val[b] += acc[b];
  }
#pragma unroll
  for (int b = 0; b < NB; ++b)
    if (n0 + b < num_nodes) dst[(n0 + b) * dim_dst + e] = val[b];
}

}  // namespace

namespace detail {

template <class T>
void build_linear_tables(const std::vector<const cpu::Linear<T>*>& layers, bool with_bias,
                         LinearTables<T>& tables) {
  std::vector<int32_t> fwd_offsets, bwd_offsets;
  std::vector<LinearSegment> fwd_segs, bwd_segs;
  std::vector<T> weights, weights_t, bias;
  for (const cpu::Linear<T>* lin : layers) {
    const int64_t dim_in = lin->dim_in, dim_out = lin->dim_out;
    std::vector<std::vector<LinearSegment>> fwd(dim_out), bwd(dim_in);
    for (const auto& p : lin->paths) {
      if (static_cast<int64_t>(p.weight.size()) != static_cast<int64_t>(p.mul_in) * p.mul_out ||
          p.in_offset + static_cast<int64_t>(p.mul_in) * p.d > dim_in ||
          p.out_offset + static_cast<int64_t>(p.mul_out) * p.d > dim_out) {
        throw Error("internal: inconsistent linear layer path");
      }
      const int64_t wo = static_cast<int64_t>(weights.size());  // W[u][w] at wo + u*mul_out + w
      const int64_t wto = wo;  // W^T[w][u] at wto + w*mul_in + u (same size and place)
      weights.insert(weights.end(), p.weight.begin(), p.weight.end());
      weights_t.resize(weights.size());
      for (int u = 0; u < p.mul_in; ++u)
        for (int w = 0; w < p.mul_out; ++w)
          weights_t[wto + static_cast<int64_t>(w) * p.mul_in + u] =
              p.weight[static_cast<size_t>(u) * p.mul_out + w];
      for (int m = 0; m < p.d; ++m) {
        // x[u, m] = x[in_offset + in_base + u * in_stride]; likewise g[w, m] on the output side.
        const int32_t in_base =
            static_cast<int32_t>(p.in_offset) + (lin->in_ir_mul ? m * p.mul_in : m);
        const int32_t in_stride = lin->in_ir_mul ? 1 : p.d;
        const int32_t out_base =
            static_cast<int32_t>(p.out_offset) + (lin->out_ir_mul ? m * p.mul_out : m);
        const int32_t out_stride = lin->out_ir_mul ? 1 : p.d;
        for (int w = 0; w < p.mul_out; ++w) {
          LinearSegment s;
          s.w = wo + w;
          s.w_stride = p.mul_out;
          s.src = in_base;
          s.src_stride = in_stride;
          s.count = p.mul_in;
          fwd[out_base + static_cast<int64_t>(w) * out_stride].push_back(s);
        }
        for (int u = 0; u < p.mul_in; ++u) {
          LinearSegment s;
          s.w = wto + u;
          s.w_stride = p.mul_in;
          s.src = out_base;
          s.src_stride = out_stride;
          s.count = p.mul_out;
          bwd[in_base + static_cast<int64_t>(u) * in_stride].push_back(s);
        }
      }
    }
    for (const auto& list : fwd) {
      fwd_offsets.push_back(static_cast<int32_t>(fwd_segs.size()));
      fwd_segs.insert(fwd_segs.end(), list.begin(), list.end());
    }
    fwd_offsets.push_back(static_cast<int32_t>(fwd_segs.size()));
    for (const auto& list : bwd) {
      bwd_offsets.push_back(static_cast<int32_t>(bwd_segs.size()));
      bwd_segs.insert(bwd_segs.end(), list.begin(), list.end());
    }
    bwd_offsets.push_back(static_cast<int32_t>(bwd_segs.size()));
    if (with_bias && !lin->biases.empty()) {
      if (layers.size() != 1) throw Error("internal: biases on a multi-table linear layer");
      bias.assign(dim_out, T(0));  // as on the CPU: 0 + bias_1 (+ bias_2 ...)
      for (const auto& b : lin->biases) {
        if (b.out_offset + static_cast<int64_t>(b.bias.size()) > dim_out) {
          throw Error("internal: inconsistent linear layer bias");
        }
        for (size_t w = 0; w < b.bias.size(); ++w) bias[b.out_offset + w] += b.bias[w];
      }
    }
  }
  if (fwd_segs.size() > INT32_MAX || bwd_segs.size() > INT32_MAX) {
    throw Error("linear layer too large for the CUDA backend");
  }
  tables.fwd_offsets.upload(fwd_offsets);
  tables.bwd_offsets.upload(bwd_offsets);
  tables.fwd_segs.upload(fwd_segs);
  tables.bwd_segs.upload(bwd_segs);
  tables.weights.upload(weights);
  tables.weights_t.upload(weights_t);
  tables.bias.upload(bias);
  // The uploads read pageable host memory that is freed on return.
  check(cudaStreamSynchronize(nullptr), "linear layer upload");
}

template <class T>
void run_linear_tables(const LinearTables<T>& tables, int64_t dim_in, int64_t dim_out,
                       bool transpose, int64_t num_nodes, const int32_t* species, bool accumulate,
                       const T* src, T* dst, cudaStream_t stream) {
  const int64_t dim_src = transpose ? dim_out : dim_in, dim_dst = transpose ? dim_in : dim_out;
  if (num_nodes <= 0 || dim_dst <= 0) return;
  const int32_t* offsets = transpose ? tables.bwd_offsets.data() : tables.fwd_offsets.data();
  const LinearSegment* segs = transpose ? tables.bwd_segs.data() : tables.fwd_segs.data();
  const T* weights = transpose ? tables.weights_t.data() : tables.weights.data();
  const T* bias = transpose || tables.bias.size() == 0 ? nullptr : tables.bias.data();
  if (species) {
    const int64_t blocks = blocks_for(num_nodes * dim_dst, kThreads);
    linear_kernel<T, 1><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        num_nodes, dim_src, dim_dst, offsets, segs, weights, bias, species, accumulate, src, dst);
  } else {
    const int64_t groups = (num_nodes + kNodesPerThread - 1) / kNodesPerThread;
    const int64_t blocks = blocks_for(groups * dim_dst, kThreads);
    linear_kernel<T, kNodesPerThread><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        num_nodes, dim_src, dim_dst, offsets, segs, weights, bias, nullptr, accumulate, src, dst);
  }
  check_launch("linear_kernel");
}

}  // namespace detail

template <class T>
Linear<T> make_linear(const cpu::Linear<T>& host) {
  Linear<T> lin;
  lin.dim_in = host.dim_in;
  lin.dim_out = host.dim_out;
  detail::build_linear_tables<T>({&host}, true, lin.tables);
  return lin;
}

template <class T>
void linear_forward(const Linear<T>& lin, int64_t num_nodes, const T* x, T* out,
                    cudaStream_t stream) {
  detail::run_linear_tables(lin.tables, lin.dim_in, lin.dim_out, false, num_nodes, nullptr, false,
                            x, out, stream);
}

template <class T>
void linear_backward(const Linear<T>& lin, int64_t num_nodes, const T* grad_out, T* grad_x,
                     bool accumulate, cudaStream_t stream) {
  detail::run_linear_tables(lin.tables, lin.dim_in, lin.dim_out, true, num_nodes, nullptr,
                            accumulate, grad_out, grad_x, stream);
}

#define E3FUSE_INSTANTIATE(T)                                                                   \
  template void detail::build_linear_tables<T>(const std::vector<const cpu::Linear<T>*>&, bool, \
                                               LinearTables<T>&);                               \
  template void detail::run_linear_tables<T>(const LinearTables<T>&, int64_t, int64_t, bool,    \
                                             int64_t, const int32_t*, bool, const T*, T*,       \
                                             cudaStream_t);                                     \
  template Linear<T> make_linear<T>(const cpu::Linear<T>&);                                     \
  template void linear_forward<T>(const Linear<T>&, int64_t, const T*, T*, cudaStream_t);       \
  template void linear_backward<T>(const Linear<T>&, int64_t, const T*, T*, bool, cudaStream_t);
E3FUSE_INSTANTIATE(float)
E3FUSE_INSTANTIATE(double)
#undef E3FUSE_INSTANTIATE

}  // namespace e3fuse::cuda
