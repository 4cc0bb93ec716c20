// benchmarks/micro/tile_backward_micro.cu: a design probe for issue 21. The float32 convolution
// backward of one input block with all its paths (SevenNet-l3i5's layer 1 by default), per
// block of 8 warps and node k as the engine's kernel walks it, in two versions:
//
// - fma: the engine's tasks (tp_backward_edge, C = 1): one task per (path, 32 channels), one
//   channel per lane, per edge 4 d1 d3 multiply-adds per channel on the FMA pipes, the path's
//   weight and dw/dr from the radial table in the task;
// - tile: the block's paths side by side as one matrix of columns (path p's output component q
//   is column offset[p] + q, zero-padded to a multiple of 8), and one task per (8 columns,
//   32 channels). Per edge, on the tensor cores in 3xTF32 (cuda/mma_tf32.cuh):
//     D_v = X V          X = s x_k [channels x d1], V = M, K_x, K_y, K_z [d1 x columns]
//     dE/dx_k += (w o G) M^T                    G = dE/dy_j [channels x columns]
//   and on the FMA pipes only what is per (channel, column):
//     f_c += sum (w o G) o D_{K_c},  dE/dr += sum (dw/dr o G) o D_M.
//   That is 8-9 FMA-pipe instructions per (channel, column) where the fma task spends 4 d1
//   multiply-adds and d1 shared-memory loads (d1 = 7: 28 + 7). The weights w and dw/dr of the
//   chunk's edges are evaluated once per (edge, path, channel) into shared memory first.
//
// Both versions: the chunk's {M, K} rows are staged in the engine's layout (path p's entry (a, q)
// at d1 offset[p] + a d3[p] + q, float4 {M, K_x, K_y, K_z}) from a pool in global memory, the
// stand-in for chunk_contract_sh; the weights come from a radial table (cubic coefficients per
// interval and weight, as ops/radial_table.h); dE/dy_j is gathered per edge; each warp's force
// partials go to a column of shared memory summed by the block in a fixed order, and the tasks'
// dE/dx_k to slots of their own, summed in a fixed order at the end (bitwise deterministic).
//
// Tile fragment layout (lane = 4 g + t, see mma_tf32.cuh): tile row r of 16 is channel
// 2 r (r < 8) or 2 (r - 8) + 1, so that lane g holds channels 2 g and 2 g + 1 (8-byte loads).
// D's element d0 is (channel 2 g, column 2 t), d1 (2 g, 2 t + 1), d2 (2 g + 1, 2 t), d3 (2 g + 1,
// 2 t + 1). The dE/dx product takes D's elements as its A operand directly: its k index runs over
// the 8 columns in the order 2 t (k = t) and 2 t + 1 (k = t + 4), and its B operand M^T is read
// in the same order.
//
//   e3fuse_tile_backward_micro [--d1 3|5|7] [--nodes N] [--edges-per-node P] [--chunk 4|8]
//                              [--warmup W] [--repeats R] [--json-out FILE]
//
// Without --d1, the three non-scalar input blocks of SevenNet-l3i5's layer 1 run (d1 7 and 5 with
// 32 channels, d1 3 with 64). Both versions are checked against a double-precision host sum on
// the first nodes (errors relative to the largest value).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backward_probe.cuh"
#include "cuda/common.cuh"
#include "cuda/mma_tf32.cuh"
#include "cuda/warp_sum.cuh"
#include "e3fuse/error.h"
#include "micro_common.h"
#include "ops/radial_table.h"

namespace {

using e3fuse::cuda::check;
using e3fuse::cuda::DeviceArray;
using e3fuse_micro::split_tf32;

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kRowPool = 4096;  // distinct {M, K} rows, edge e takes row e % kRowPool
constexpr int kMaxPaths = 16;
constexpr int kMaxColumns = 64;
constexpr int kMaxTasks = 32;
constexpr int kIntervals = 1310;  // SevenNet-l3i5's layer-1 table (conv_micro's table_intervals)

struct Problem {
  int nodes = 0, edges_per_node = 0, mul = 0, mul_shift = 0, d1 = 0, paths = 0, columns = 0;
  int padded = 0;
  float inv_step = 0.0f;
  int d3[kMaxPaths] = {}, offset[kMaxPaths] = {};
  float sign[kMaxPaths] = {};
  int column_path[kMaxColumns] = {}, column_entry[kMaxColumns] = {};  // entry (0, q) of the path
  // the tasks of warp w: task_order[warp_begin[w] .. warp_begin[w + 1])
  int task_order[kMaxTasks] = {}, warp_begin[kWarps + 1] = {};
};

struct Inputs {
  Problem pb;
  const float* x = nullptr;           // [nodes][d1][mul]
  const float* grad = nullptr;        // [nodes][columns][mul], dE/dy
  const int* receiver = nullptr;      // [edges]
  const float4* rows = nullptr;       // [kRowPool][d1 columns] {M, K_x, K_y, K_z}
  const float4* tile_rows = nullptr;  // [kRowPool][tile_row_width]: the same in fragment order
  const float4* table = nullptr;      // [kIntervals][paths mul] cubic coefficients (tile: signed)
  const int* interval = nullptr;      // [edges]
  const float* local_t = nullptr;     // [edges]
  const float* unit = nullptr;        // [edges][4]
  float* grad_x = nullptr;            // [nodes][d1][mul]
  float* force = nullptr;             // [edges][3]
};

// Shared memory of one block: the chunk's rows, the force partials, the tasks' dE/dx slots and
// (tile) the chunk's weights. The fma version's rows are in the engine's layout; the tile
// version's in fragment order (tile_row_width): per edge, first for column c < padded and t < 4
// the 8 floats {M, K_x, K_y, K_z} at a = t and a = t + 4 side by side, then per column pair j and
// a < 8 the float2 {M[a][2 j], M[a][2 j + 1]}; zeros where a >= d1 or c >= columns. Weights: per
// edge paths + 1 rows of mul {w, dw/dr}, the last all zeros (the padding columns read it).
__host__ __device__ inline int tile_row_width(const Problem& pb) { return pb.padded * 10; }

struct Layout {
  size_t rows, fe, slots, weights, bytes;
  __host__ __device__ Layout(const Problem& pb, int chunk, int tasks, bool tile) {
    rows = 0;
    fe = rows + sizeof(float4) * chunk * (tile ? tile_row_width(pb) : pb.d1 * pb.columns);
    slots = fe + sizeof(float) * chunk * 3 * kWarps;
    weights = slots + sizeof(float) * tasks * pb.d1 * 32;
    weights = (weights + 15) / 16 * 16;
    bytes = weights + (tile ? sizeof(float2) * chunk * (pb.paths + 1) * pb.mul : 0);
  }
};

__device__ __forceinline__ void store_edge_force(float* fe, int ei, float f0, float f1, float f2) {
  const float sum = e3fuse::cuda::warp_sum3(f0, f1, f2);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane % 8 == 0 && lane < 24) fe[(3 * ei + lane / 8) * kWarps + warp] += sum;
}

// One fma task: path p, channels 32 group + lane, over the chunk's n edges from e0.
template <int D1, int D3>
__device__ void fma_task(const Inputs& in, int64_t k, int p, int group, int64_t e0, int n,
                         const float4* rows, float* fe, float* slot) {
  const Problem& pb = in.pb;
  const int lane = threadIdx.x % 32, u = 32 * group + lane;
  float sxk[D1], gxa[D1];
#pragma unroll
  for (int a = 0; a < D1; ++a) {
    sxk[a] = pb.sign[p] * in.x[(k * D1 + a) * pb.mul + u];
    gxa[a] = 0.0f;
  }
  const int row_stride = D1 * pb.columns, entry0 = D1 * pb.offset[p];
#pragma unroll 1
  for (int ei = 0; ei < n; ++ei) {
    const int64_t e = e0 + ei;
    const float4 c4 =
        __ldg(in.table + static_cast<int64_t>(in.interval[e]) * pb.paths * pb.mul + p * pb.mul + u);
    const float coef[4] = {c4.x, c4.y, c4.z, c4.w}, t = in.local_t[e];
    const float w = e3fuse::ops::radial_table_value(coef, t);
    const float dw_dr = e3fuse::ops::radial_table_grad(coef, t, pb.inv_step);
    const float* gj =
        in.grad + (static_cast<int64_t>(in.receiver[e]) * pb.columns + pb.offset[p]) * pb.mul + u;
    float g[D3];
#pragma unroll
    for (int q = 0; q < D3; ++q) g[q] = __ldg(gj + q * pb.mul);
    float dw = 0.0f, f0 = 0.0f, f1 = 0.0f, f2 = 0.0f;
    e3fuse_micro::fma_contract_edge<D1, D3>(rows + ei * row_stride + entry0, g, sxk, w, gxa, dw, f0,
                                            f1, f2);
    const float dr = dw * dw_dr;
    const float* ue = in.unit + 4 * e;
    store_edge_force(fe, ei, w * f0 + dr * ue[0], w * f1 + dr * ue[1], w * f2 + dr * ue[2]);
  }
#pragma unroll
  for (int a = 0; a < D1; ++a) slot[a * 32 + lane] += pb.sign[p] * gxa[a];
}

// One tile task: columns 8 nt .. 8 nt + 7, channels 32 group .. + 31 (two m16 tiles), over the
// chunk's n edges from e0, from the fragment-ordered rows (Layout) and weights
// wd[(ei (paths + 1) + p) mul + u] = {w, dw/dr} (sign folded in). The tensor cores read only the
// top 19 bits of a TF32 operand, so a value goes in as its own high part (ptxas drops the mask).
template <int D1>
__device__ void tile_task(const Inputs& in, int64_t k, int nt, int group, int64_t e0, int n,
                          const float4* rows, const float2* wd, float* fe, float* slot) {
  static_assert(D1 <= 8, "one k-step of 8 input components");
  const Problem& pb = in.pb;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int u0 = 32 * group;
  // A = X: a0 (channel 2 g, a = t), a1 (2 g + 1, t), a2 (2 g, t + 4), a3 (2 g + 1, t + 4)
  uint32_t xh[2][4], xl[2][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int a = t + 4 * (i / 2), u = u0 + 16 * mt + 2 * g + i % 2;
      split_tf32(a < D1 ? in.x[(k * D1 + a) * pb.mul + u] : 0.0f, xh[mt][i], xl[mt][i]);
    }
  // this lane's columns: 8 nt + g of the B fragments (n = g), c0 = 8 nt + 2 t and c0 + 1 of D's
  // elements; a padding column reads column 0's dE/dy and the zero weights
  const int c0 = 8 * nt + 2 * t, c1 = c0 + 1;
  const int p0 = c0 < pb.columns ? pb.column_path[c0] : pb.paths;
  const int p1 = c1 < pb.columns ? pb.column_path[c1] : pb.paths;
  const int u_lane = u0 + 2 * g;
  const int at_g0 = (c0 < pb.columns ? c0 : 0) * pb.mul + u_lane;
  const int at_g1 = (c1 < pb.columns ? c1 : 0) * pb.mul + u_lane;
  const int at_w0 = p0 * pb.mul + u_lane, at_w1 = p1 * pb.mul + u_lane;
  const int at_b = ((8 * nt + g) * 4 + t) * 2, at_m = (4 * nt + t) * 8 + g;
  const int row_width = tile_row_width(pb);
  const int wd_stride = (pb.paths + 1) * pb.mul;
  const int64_t grad_stride = static_cast<int64_t>(pb.columns) * pb.mul;
  float gxacc[2][4] = {};
  // dE/dy of edge e's receiver, this lane's elements: {c0, c1} x {mt 0, 1}
  auto load_grad = [&](int64_t e, float2(&gr)[2][2]) {
    const float* gbase = in.grad + in.receiver[e] * grad_stride;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      gr[mt][0] = __ldg(reinterpret_cast<const float2*>(gbase + at_g0 + 16 * mt));
      gr[mt][1] = __ldg(reinterpret_cast<const float2*>(gbase + at_g1 + 16 * mt));
    }
  };
  float2 gnext[2][2];
  load_grad(e0, gnext);
#pragma unroll 1
  for (int ei = 0; ei < n; ++ei) {
    const int64_t e = e0 + ei;
    float2 gcur[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      gcur[mt][0] = gnext[mt][0];
      gcur[mt][1] = gnext[mt][1];
    }
    if (ei + 1 < n) load_grad(e + 1, gnext);  // one edge ahead
    const float2* wde = wd + ei * wd_stride;
    // B = V [a][column]: b0 (a = t), b1 (a = t + 4) of column 8 nt + g, for V = M, K_x, K_y, K_z
    const float4* re = rows + ei * row_width;
    const float4 va = re[at_b], vb = re[at_b + 1];
    const uint32_t bh[4][2] = {{__float_as_uint(va.x), __float_as_uint(va.y)},
                               {__float_as_uint(va.z), __float_as_uint(va.w)},
                               {__float_as_uint(vb.x), __float_as_uint(vb.y)},
                               {__float_as_uint(vb.z), __float_as_uint(vb.w)}};
    uint32_t bl[4][2];
#pragma unroll
    for (int v = 0; v < 4; ++v)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        uint32_t hi;
        split_tf32(__uint_as_float(bh[v][i]), hi, bl[v][i]);
      }
    // B' = M^T with k in the order of D's columns: b0 = M[g][c0], b1 = M[g][c1]
    const float2 mm = reinterpret_cast<const float2*>(re + pb.padded * 8)[at_m];
    const uint32_t mh[2] = {__float_as_uint(mm.x), __float_as_uint(mm.y)};
    uint32_t ml[2], unused;
    split_tf32(mm.x, unused, ml[0]);
    split_tf32(mm.y, unused, ml[1]);
    float f0 = 0.0f, f1 = 0.0f, f2 = 0.0f, radial = 0.0f;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const float2 g0 = gcur[mt][0], g1 = gcur[mt][1];
      const float4 w0 = *reinterpret_cast<const float4*>(wde + at_w0 + 16 * mt);
      const float4 w1 = *reinterpret_cast<const float4*>(wde + at_w1 + 16 * mt);
      float dm[4] = {}, dx[4] = {}, dy[4] = {}, dz[4] = {};
      e3fuse::cuda::mma_3xtf32(dm, xh[mt], xl[mt], bh[0], bl[0]);
      e3fuse::cuda::mma_3xtf32(dx, xh[mt], xl[mt], bh[1], bl[1]);
      e3fuse::cuda::mma_3xtf32(dy, xh[mt], xl[mt], bh[2], bl[2]);
      e3fuse::cuda::mma_3xtf32(dz, xh[mt], xl[mt], bh[3], bl[3]);
      // elements d0 (u, c0), d1 (u, c1), d2 (u + 1, c0), d3 (u + 1, c1)
      const float gv[4] = {g0.x, g1.x, g0.y, g1.y};
      const float wv[4] = {w0.x, w1.x, w0.z, w1.z};
      const float dv[4] = {w0.y, w1.y, w0.w, w1.w};
      float gw[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        gw[i] = wv[i] * gv[i];
        f0 += gw[i] * dx[i];
        f1 += gw[i] * dy[i];
        f2 += gw[i] * dz[i];
        radial += dv[i] * (gv[i] * dm[i]);
      }
      // A' = w o G: a0 (u, c0), a1 (u + 1, c0), a2 (u, c1), a3 (u + 1, c1)
      const uint32_t ah[4] = {__float_as_uint(gw[0]), __float_as_uint(gw[2]),
                              __float_as_uint(gw[1]), __float_as_uint(gw[3])};
      uint32_t al[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) split_tf32(__uint_as_float(ah[i]), unused, al[i]);
      float part[4] = {};
      e3fuse::cuda::mma_3xtf32(part, ah, al, mh, ml);
#pragma unroll
      for (int i = 0; i < 4; ++i) gxacc[mt][i] += part[i];
    }
    const float* ue = in.unit + 4 * e;
    store_edge_force(fe, ei, f0 + radial * ue[0], f1 + radial * ue[1], f2 + radial * ue[2]);
  }
  // gxacc[mt]: (u, a = 2 t), (u, 2 t + 1), (u + 1, 2 t), (u + 1, 2 t + 1), u = 16 mt + 2 g
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int a = 2 * t + i % 2, u = 16 * mt + 2 * g + i / 2;
      if (a < D1) slot[a * 32 + u] += gxacc[mt][i];
    }
}

// f(d3) with d3 a compile-time constant.
template <class F>
__device__ __forceinline__ void with_d3(int d3, F&& f) {
  switch (d3) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 5:
      return f(std::integral_constant<int, 5>{});
    default:
      return f(std::integral_constant<int, 7>{});
  }
}

// One block per node k; TILE selects the version. The chunk's rows (and, TILE, its weights) are
// staged, then each warp runs its tasks over the chunk, then the edge forces are summed.
// MINB: blocks per SM the registers are budgeted for (2: 128 registers, 3: 80, 4: 64).
template <int D1, int CHUNK, bool TILE, int MINB>
__global__ void __launch_bounds__(kThreads, MINB) backward_kernel(Inputs in) {
  extern __shared__ float4 shared[];
  const Problem& pb = in.pb;
  const int tasks = pb.warp_begin[kWarps];
  const Layout lay(pb, CHUNK, tasks, TILE);
  char* base = reinterpret_cast<char*>(shared);
  float4* rows = reinterpret_cast<float4*>(base + lay.rows);
  float* fe = reinterpret_cast<float*>(base + lay.fe);
  float* slots = reinterpret_cast<float*>(base + lay.slots);
  float2* wd = reinterpret_cast<float2*>(base + lay.weights);
  const int64_t k = blockIdx.x;
  const int warp = threadIdx.x / 32;
  const int groups = pb.mul / 32;
  const int row_width = D1 * pb.columns;
  for (int i = threadIdx.x; i < tasks * D1 * 32; i += kThreads) slots[i] = 0.0f;
  if constexpr (TILE)
    for (int i = threadIdx.x; i < CHUNK * pb.mul; i += kThreads)
      wd[(i / pb.mul) * (pb.paths + 1) * pb.mul + pb.paths * pb.mul + i % pb.mul] =
          make_float2(0.0f, 0.0f);
  const int64_t first = k * pb.edges_per_node, last = first + pb.edges_per_node;
  for (int64_t e0 = first; e0 < last; e0 += CHUNK) {
    const int n = last - e0 < CHUNK ? static_cast<int>(last - e0) : CHUNK;
    __syncthreads();
    for (int i = threadIdx.x; i < CHUNK * 3 * kWarps; i += kThreads) fe[i] = 0.0f;
    // The stand-in for the engine's {M, K} rows (chunk_contract_sh): copied from the pool with
    // cp.async (no register round trip), waited for before the barrier below
    const int width = TILE ? tile_row_width(pb) : row_width;
    const float4* pool = TILE ? in.tile_rows : in.rows;
    for (int ei = 0; ei < n; ++ei) {
      const float4* row = pool + ((e0 + ei) & (kRowPool - 1)) * width;
      for (int i = threadIdx.x; i < width; i += kThreads)
        e3fuse::cuda::copy_async_16(rows + ei * width + i, row + i);
    }
    if constexpr (TILE) {
      // the chunk's weights, from the tile version's table (the path's sign folded in)
      const int per_edge = pb.paths * pb.mul, wd_stride = per_edge + pb.mul;
      for (int ei = 0; ei < n; ++ei) {
        const float4* coefs = in.table + static_cast<int64_t>(in.interval[e0 + ei]) * per_edge;
        const float t = in.local_t[e0 + ei];
        float2* to = wd + ei * wd_stride;
        for (int r = threadIdx.x; r < per_edge; r += kThreads) {
          const float4 c4 = __ldg(coefs + r);
          const float coef[4] = {c4.x, c4.y, c4.z, c4.w};
          to[r] = make_float2(e3fuse::ops::radial_table_value(coef, t),
                              e3fuse::ops::radial_table_grad(coef, t, pb.inv_step));
        }
      }
    }
    e3fuse::cuda::copy_async_wait_all();
    __syncthreads();
    for (int i = pb.warp_begin[warp]; i < pb.warp_begin[warp + 1]; ++i) {
      const int task = pb.task_order[i];
      float* slot = slots + task * D1 * 32;
      if constexpr (TILE) {
        const int tiles = pb.padded / 8;
        tile_task<D1>(in, k, task % tiles, task / tiles, e0, n, rows, wd, fe, slot);
      } else {
        const int p = task % pb.paths, group = task / pb.paths;
        with_d3(pb.d3[p], [&](auto D3) {
          fma_task<D1, decltype(D3)::value>(in, k, p, group, e0, n, rows, fe, slot);
        });
      }
    }
    __syncthreads();
    for (int r = threadIdx.x; r < 3 * n; r += kThreads) {
      float sum = 0.0f;
      for (int w = 0; w < kWarps; ++w) sum += fe[r * kWarps + w];
      in.force[e0 * 3 + r] = sum;
    }
  }
  __syncthreads();
  // dE/dx_k: the slots of the channel's group, in task order
  const int per_group = tasks / groups;
  for (int i = threadIdx.x; i < D1 * pb.mul; i += kThreads) {
    const int a = i / pb.mul, u = i % pb.mul, group = u / 32;
    float sum = 0.0f;
    for (int task = group * per_group; task < (group + 1) * per_group; ++task)
      sum += slots[task * D1 * 32 + a * 32 + u % 32];
    in.grad_x[(k * D1 + a) * pb.mul + u] = sum;
  }
}

// The tasks dealt to the warps, longest first to the least loaded (ties: the lower warp).
void deal_tasks(Problem& pb, const std::vector<int>& cost) {
  const int tasks = static_cast<int>(cost.size());
  if (tasks > kMaxTasks) throw e3fuse::Error("too many tasks");
  std::vector<int> order(tasks);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return cost[a] > cost[b]; });
  std::vector<std::vector<int>> of(kWarps);
  std::vector<int> load(kWarps, 0);
  for (int task : order) {
    const int w = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    of[w].push_back(task);
    load[w] += cost[task];
  }
  int at = 0;
  for (int w = 0; w < kWarps; ++w) {
    pb.warp_begin[w] = at;
    for (int task : of[w]) pb.task_order[at++] = task;
  }
  pb.warp_begin[kWarps] = at;
}

struct Options {
  int d1 = 0, nodes = 32000, edges_per_node = 42, chunk = 8, warmup = 3, repeats = 10;
  std::string json_out;
};

Options parse(int argc, char** argv) {
  Options o;
  e3fuse_micro::parse_probe_options(argc, argv,
                                    {{"--d1", &o.d1},
                                     {"--nodes", &o.nodes},
                                     {"--edges-per-node", &o.edges_per_node},
                                     {"--chunk", &o.chunk},
                                     {"--warmup", &o.warmup},
                                     {"--repeats", &o.repeats}},
                                    o.json_out);
  if (o.d1 != 0 && o.d1 != 3 && o.d1 != 5 && o.d1 != 7) throw e3fuse::Error("--d1: 3, 5 or 7");
  if (o.chunk != 4 && o.chunk != 8) throw e3fuse::Error("--chunk: 4 or 8");
  if (o.nodes < 1 || o.edges_per_node < 1 || o.repeats < 1 || o.warmup < 0)
    throw e3fuse::Error("--nodes, --edges-per-node and --repeats >= 1, --warmup >= 0");
  return o;
}

// SevenNet-l3i5 layer 1's input blocks: the output dimensions d3 of their paths, in the layer's
// path order, and their channels.
std::vector<int> block_paths(int d1) {
  if (d1 == 7) return {1, 3, 3, 5, 5, 5, 7, 7, 7, 7};
  if (d1 == 5) return {1, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7};
  return {1, 3, 3, 3, 5, 5, 5, 7, 7};
}

Problem make_problem(const Options& o, int d1) {
  Problem pb;
  pb.nodes = o.nodes;
  pb.edges_per_node = o.edges_per_node;
  pb.d1 = d1;
  pb.mul = d1 == 3 ? 64 : 32;
  pb.mul_shift = d1 == 3 ? 6 : 5;
  const std::vector<int> d3 = block_paths(d1);
  pb.paths = static_cast<int>(d3.size());
  pb.inv_step = 262.0f;  // 1310 intervals over 5 A
  for (int p = 0; p < pb.paths; ++p) {
    pb.d3[p] = d3[p];
    pb.offset[p] = pb.columns;
    pb.sign[p] = (p % 3 == 1) ? -1.0f : 1.0f;
    for (int q = 0; q < d3[p]; ++q) {
      pb.column_path[pb.columns] = p;
      pb.column_entry[pb.columns] = d1 * pb.offset[p] + q;
      ++pb.columns;
    }
  }
  pb.padded = (pb.columns + 7) / 8 * 8;
  if (pb.padded > kMaxColumns) throw e3fuse::Error("too many columns");
  return pb;
}

template <int D1>
std::string run_block(const Options& o, e3fuse_micro::DeviceStream& device) {
  const Problem base = make_problem(o, D1);
  const int64_t edges = static_cast<int64_t>(o.nodes) * o.edges_per_node;
  const int S = base.columns, mul = base.mul, P = base.paths, groups = mul / 32;
  const auto x = e3fuse_micro::random_rows<float>(o.nodes, D1 * mul, 1);
  const auto grad = e3fuse_micro::random_rows<float>(o.nodes, S * mul, 2);
  const auto rows = e3fuse_micro::random_rows<float>(kRowPool, D1 * S * 4, 3);
  // coefficients scaled as a smooth table's: values ~1, higher orders small
  auto table = e3fuse_micro::random_rows<float>(kIntervals, P * mul * 4, 4);
  for (size_t i = 0; i < table.size(); ++i) table[i] *= (i % 4 == 0 ? 1.0f : 0.01f);
  // the tile version's table: each path's sign folded into its coefficients
  std::vector<float> signed_table(table);
  for (size_t i = 0; i < signed_table.size(); ++i)
    signed_table[i] *= base.sign[(i / 4) % (static_cast<size_t>(P) * mul) / mul];
  const auto unit = e3fuse_micro::random_rows<float>(edges, 4, 6);
  std::vector<int> receiver(static_cast<size_t>(edges)), interval(static_cast<size_t>(edges));
  std::vector<float> local_t(static_cast<size_t>(edges));
  for (int64_t e = 0; e < edges; ++e) {
    const int64_t k = e / o.edges_per_node;
    const int64_t offset = static_cast<int64_t>(e3fuse_micro::splitmix64(7 + e) % 257) - 128;
    receiver[e] = static_cast<int>(((k + offset) % o.nodes + o.nodes) % o.nodes);
    const uint64_t r = e3fuse_micro::splitmix64(11 + e);
    interval[e] = static_cast<int>(400 + r % 900);
    local_t[e] = static_cast<float>((r >> 20) % 1000) / 1000.0f;
  }
  // the same rows in fragment order (Layout)
  const int tile_width = tile_row_width(base);
  std::vector<float> tile_rows(static_cast<size_t>(kRowPool) * tile_width * 4, 0.0f);
  for (int r = 0; r < kRowPool; ++r) {
    const float* row = rows.data() + static_cast<size_t>(r) * D1 * S * 4;
    float* to = tile_rows.data() + static_cast<size_t>(r) * tile_width * 4;
    auto entry = [&](int a, int c) {
      return row + (base.column_entry[c] + a * base.d3[base.column_path[c]]) * 4;
    };
    for (int c = 0; c < S; ++c)
      for (int t = 0; t < 4; ++t)
        for (int h = 0; h < 2; ++h) {
          const int a = t + 4 * h;
          if (a >= D1) continue;
          for (int v = 0; v < 4; ++v) to[(c * 4 + t) * 8 + 2 * v + h] = entry(a, c)[v];
        }
    float* mt = to + base.padded * 8 * 4;
    for (int c = 0; c < S; ++c)
      for (int a = 0; a < D1; ++a) mt[((c / 2) * 8 + a) * 2 + c % 2] = entry(a, c)[0];
  }
  DeviceArray<float> dx, dgrad, drows, dtile_rows, dtable, dsigned_table, dunit, dt, dgx, dforce;
  DeviceArray<int> drecv, dint;
  dx.upload(x);
  dgrad.upload(grad);
  drows.upload(rows);
  dtile_rows.upload(tile_rows);
  dtable.upload(table);
  dsigned_table.upload(signed_table);
  dunit.upload(unit);
  dt.upload(local_t);
  drecv.upload(receiver);
  dint.upload(interval);
  dgx.resize(x.size());
  dforce.resize(static_cast<size_t>(edges * 3));

  // host reference, double, on the first nodes
  const int64_t checked = std::min<int64_t>(o.nodes, 48);
  std::vector<double> ref_gx(static_cast<size_t>(checked * D1 * mul), 0.0);
  std::vector<double> ref_force(static_cast<size_t>(checked * o.edges_per_node * 3), 0.0);
  for (int64_t k = 0; k < checked; ++k)
    for (int64_t e = k * o.edges_per_node; e < (k + 1) * o.edges_per_node; ++e) {
      const double t = local_t[e];
      const float* rw = rows.data() + (e % kRowPool) * D1 * S * 4;
      for (int p = 0; p < P; ++p)
        for (int u = 0; u < mul; ++u) {
          const float* c =
              table.data() + ((static_cast<int64_t>(interval[e]) * P + p) * mul + u) * 4;
          const double cd[4] = {c[0], c[1], c[2], c[3]};
          const double w = e3fuse::ops::radial_table_value(cd, t);
          const double dw_dr = e3fuse::ops::radial_table_grad(cd, t, double(base.inv_step));
          double dw = 0.0, f[3] = {0.0, 0.0, 0.0};
          for (int a = 0; a < D1; ++a) {
            const double sx = base.sign[p] * x[(k * D1 + a) * mul + u];
            double mk[4] = {0.0, 0.0, 0.0, 0.0};
            for (int q = 0; q < base.d3[p]; ++q) {
              const double gq =
                  grad[(static_cast<int64_t>(receiver[e]) * S + base.offset[p] + q) * mul + u];
              const float* v = rw + (D1 * base.offset[p] + a * base.d3[p] + q) * 4;
              for (int i = 0; i < 4; ++i) mk[i] += v[i] * gq;
            }
            ref_gx[(k * D1 + a) * mul + u] += base.sign[p] * w * mk[0];
            dw += sx * mk[0];
            for (int i = 0; i < 3; ++i) f[i] += w * sx * mk[i + 1];
          }
          for (int i = 0; i < 3; ++i) ref_force[e * 3 + i] += f[i] + dw * dw_dr * unit[4 * e + i];
        }
    }

  std::ostringstream out;
  out << "{\"d1\": " << D1 << ", \"mul\": " << mul << ", \"paths\": " << P << ", \"columns\": " << S
      << ", \"nodes\": " << o.nodes << ", \"edges\": " << edges << ", \"chunk\": " << o.chunk;
  // versions: fma, tile, tile with registers for 3 blocks per SM, fma with registers for 3 and
  // for 4 blocks per SM (the occupancy question of the engine's backward)
  for (const int version : {0, 1, 2, 3, 4}) {
    const bool tile = version == 1 || version == 2;
    Problem pb = base;
    std::vector<int> cost;
    if (tile) {
      cost.assign(static_cast<size_t>(pb.padded / 8 * groups), 1);
    } else {
      for (int group = 0; group < groups; ++group)
        for (int p = 0; p < P; ++p) cost.push_back(D1 * pb.d3[p]);
    }
    deal_tasks(pb, cost);
    const Inputs in{pb,
                    dx.data(),
                    dgrad.data(),
                    drecv.data(),
                    reinterpret_cast<const float4*>(drows.data()),
                    reinterpret_cast<const float4*>(dtile_rows.data()),
                    reinterpret_cast<const float4*>(tile ? dsigned_table.data() : dtable.data()),
                    dint.data(),
                    dt.data(),
                    dunit.data(),
                    dgx.data(),
                    dforce.data()};
    const Layout lay(pb, o.chunk, pb.warp_begin[kWarps], tile);
    auto launch = [&]() {
      auto go = [&](auto kernel) {
        check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(lay.bytes)),
              "smem attribute");
        kernel<<<static_cast<unsigned>(o.nodes), kThreads, lay.bytes, device.stream>>>(in);
      };
      auto with_chunk = [&](auto chunk) {
        constexpr int EC = decltype(chunk)::value;
        if (version == 0) go(backward_kernel<D1, EC, false, 2>);
        if (version == 1) go(backward_kernel<D1, EC, true, 2>);
        if (version == 2) go(backward_kernel<D1, EC, true, 3>);
        if (version == 3) go(backward_kernel<D1, EC, false, 3>);
        if (version == 4) go(backward_kernel<D1, EC, false, 4>);
      };
      if (o.chunk == 4)
        with_chunk(std::integral_constant<int, 4>{});
      else
        with_chunk(std::integral_constant<int, 8>{});
    };
    check(cudaMemsetAsync(dgx.data(), 0, dgx.size() * sizeof(float), device.stream), "memset");
    const std::vector<double> ms =
        e3fuse_micro::time_launches(o.warmup, o.repeats, device.stream, launch);
    const e3fuse_micro::ProbeErrors err =
        e3fuse_micro::check_outputs(ref_gx, dgx, ref_force, dforce);
    const double median = e3fuse_micro::median(ms);
    const char* const names[] = {"fma", "tile", "tile_3blocks", "fma_3blocks", "fma_4blocks"};
    const char* name = names[version];
    std::fprintf(
        stderr,
        "d1 %d mul %d chunk %d %-12s %8.3f ms (%6.2f ns/edge, smem %zu B)  grad_x err %.2e "
        "(of %.2e)  force err %.2e (of %.2e)\n",
        D1, mul, o.chunk, name, median, median * 1e6 / static_cast<double>(edges), lay.bytes,
        err.grad_x_err, err.grad_x_max, err.force_err, err.force_max);
    out << ", \"" << name << "\": {\"median_ms\": " << median
        << ", \"ms\": " << e3fuse_micro::json_list(ms) << ", \"smem_bytes\": " << lay.bytes
        << ", \"grad_x_err\": " << err.grad_x_err << ", \"grad_x_max\": " << err.grad_x_max
        << ", \"force_err\": " << err.force_err << ", \"force_max\": " << err.force_max << "}";
  }
  out << "}";
  return out.str();
}

int run(const Options& o) {
  e3fuse_micro::DeviceStream device;
  std::ostringstream json;
  json << "{\"benchmark\": \"tile_backward_micro\", \"gpu\": \"" << device.prop.name
       << "\", \"blocks\": [";
  bool first = true;
  auto one = [&](auto D1) {
    if (o.d1 != 0 && o.d1 != decltype(D1)::value) return;
    json << (first ? "\n  " : ",\n  ") << run_block<decltype(D1)::value>(o, device);
    first = false;
  };
  one(std::integral_constant<int, 7>{});
  one(std::integral_constant<int, 5>{});
  one(std::integral_constant<int, 3>{});
  json << "\n]}\n";
  e3fuse_micro::emit_json(json.str(), o.json_out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return e3fuse_micro::probe_main("e3fuse_tile_backward_micro", argc, argv, parse, run);
}
