// benchmarks/micro/frame_backward_micro.cu: a candidate design for the convolution backward
// (issue 21), timed and checked beside the engine's conv_backward on the same graph and inputs:
// the tensor product of each edge evaluated in the edge's own frame (the SO(2) reduction of
// Passaro and Zitnick, "Reducing SO(3) convolutions to SO(2) for efficient equivariant GNNs",
// ICML 2023, applied to the channelwise 'uvu' product).
//
// Why. Rotate each edge so that its unit vector u goes to the spherical harmonics' polar axis p
// (e3nn's y). There Y_l(p) has one nonzero component (m = 0), and its derivatives across the axis
// two (m = +-1). With D_l the Wigner matrices of that rotation R (Y_l(R v) = D_l Y_l(v)), the
// invariance of the Wigner 3j symbol gives, for a path (l1, l2, l3), x^T M(u) g =
// (D_1 x)^T M0 (D_3 g) with M0[a][k] = sum_b C[a][b][k] Y_b(p) = alpha y0 w3j[a][l2][k]: M0 has
// at most 2 l + 1 entries (|m_a| = |m_k|), not d1 d3, and it is the same for every edge. The
// angular force's K_t = dM/dv . t goes the same way: along t1 (R t1 = z) the entries
// w3j[a][l2 + 1][k], along t2 (R t2 = x) w3j[a][l2 - 1][k], each scaled by dY_l2(p) along the axis.
// Per channel, path and edge the backward then costs d3^2 (g rotated) and a few entries, against
// 4 d1 d3 with the {M, K} rows; the rows and their per-chunk contraction go away, a per-edge
// Wigner matrix set (84 entries for l <= 3) comes in. x_k is rotated once per edge and task, and
// the task's dE/dx (in the frame) rotated back once per edge and task.
//
// The Wigner matrices per edge: D_1 = P R P^T, with P the harmonics' l = 1 basis (Y_1(v) = c P
// v, read from the model's harmonics), then D_l = (2 l + 1) C^T (D_1 x D_(l-1)) C with C =
// w3j(1, l - 1, l), the real Wigner 3j symbol that maps V_1 x V_(l-1) onto V_l equivariantly
// (at most 4 x 4 products per entry). The host checks that the model's polar axis and the
// derivative components are the ones the kernel assumes.
//
//   e3fuse_frame_backward_micro --model M.e3f --structure S.bin [--skin 0.5] [--ec 4|8]
//                               [--ahead 0|1] [--warmup 3] [--repeats 20] [--json-out R.json]
//
// Every layer whose paths are alpha x w3j (Conv::View::sparse_cg) runs, float32, radial
// table, normalized spherical harmonics (SevenNet); other layers are skipped by name. Per layer:
// the engine's conv_backward and the frame kernel, alternating launches (CUDA events), and the
// largest difference of dE/dx, node forces, fixed-point receiver forces and per-atom virials
// relative to the largest value. Built only with -DE3FUSE_MICROBENCH=ON.
//
// Measured (H100, benchmarks/results/frame_backward/): correct to 4e-7 of the engine, and as
// built slower in every layer (1.7-1.8x in SevenNet-l3i5's layers 1-3 at 32,000 atoms), with
// its tasks far from their estimated instruction-issue bound (--ahead 1 took 9 % off, not
// more) and a per-chunk Wigner stage that is latency-bound. Not in the engine.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/typed_plan.h"
#include "cuda/conv_kernels.cuh"
#include "e3fuse/error.h"
#include "e3fuse/model.h"
#include "micro_common.h"
#include "micro_inputs.cuh"
#include "model/plan.h"
#include "ops/sh.h"
#include "ops/wigner3j_table.h"

namespace e3fuse::cuda {
extern template void conv_backward<float>(const Geometry<float>&, const Conv<float>&,
                                          const GraphView&, int64_t, const float*, const float*,
                                          float*, double*, double*, const RemoteForces&, int64_t*,
                                          cudaStream_t, const ConvRows&);
}

namespace {

namespace cu = e3fuse::cuda;
using e3fuse::Error;
using e3fuse::cuda::check;
using e3fuse::cuda::DeviceArray;

constexpr int kFrameWarps = cu::kConvWarps;
constexpr int kFrameThreads = 32 * kFrameWarps;
// Per edge the Wigner matrices D_0 .. D_3, rows padded to row_pad(l) floats for 16-byte loads,
// from wigner_offset(l).
__host__ __device__ constexpr int row_pad(int l) { return l < 2 ? 4 : 8; }
__host__ __device__ constexpr int wigner_offset(int l) {
  return l == 0 ? 0 : l == 1 ? 4 : l == 2 ? 16 : l == 3 ? 56 : 112;
}
constexpr int kWignerFloats = wigner_offset(4);

struct FramePath {
  int block, d2, d3, out_offset, weight_offset;
  float scale_m, scale_1,
      scale_2;  // s alpha y0, s alpha dY(p).q1 (m = +1), s alpha dY(p).q2 (m = -1)
};
struct FrameBlock {
  int in_offset, mul, d1, task_list_begin, task_list_end;  // its tasks: block_tasks[begin, end)
};
// Channels u0 .. u0 + 31 of the paths [path_begin, path_end) of one input block; dE/dx partial
// sums in gx[slot + a * 32 + lane].
struct FrameTask {
  int block, u0, path_begin, path_end, slot;
};
struct FrameView {
  const FramePath* paths = nullptr;
  const FrameBlock* blocks = nullptr;
  const FrameTask* tasks = nullptr;
  const int* block_tasks = nullptr;
  int num_blocks = 0, gx_slots = 0;
  int task_begin[kFrameWarps + 1] = {};
  // [kConstants]: the axes p, q1, q2 of R = p u^T + q1 t1^T + q2 t2^T (3 x 3), then the
  // harmonics' l = 1 basis P (3 x 3, Y_1(v) = c P v)
  const float* constants = nullptr;
  // D_l = (2 l + 1) C^T (D_1 x D_(l-1)) C with C = w3j(1, l - 1, l), for l = 2, 3: column m of C
  // holds entries [rec_begin[l - 2][m], rec_begin[l - 2][m + 1]) of rec_ab (a * 8 + b) and
  // rec_value (C sqrt(2 l + 1))
  const int* rec_begin = nullptr;  // [2][8]
  const int* rec_ab = nullptr;
  const float* rec_value = nullptr;
  int lmax = 3;  // the largest input or output degree: D_l for l <= lmax
};
constexpr int kAxisAt = 0, kBasisAt = 9, kConstants = 18;

struct FrameSmem {
  int wigner, vec, unit, local_t, part, gx, interval, sender, edge, red, bytes;
};
__host__ __device__ inline FrameSmem frame_smem(int ec, int gx_slots) {
  FrameSmem s{};
  int o = 0;
  auto take = [&](int bytes, int align) {
    o = (o + align - 1) / align * align;
    const int at = o;
    o += bytes;
    return at;
  };
  s.wigner = take(4 * ec * kWignerFloats, 16);
  s.vec = take(4 * 3 * ec, 16);
  s.unit = take(4 * 4 * ec, 16);
  s.local_t = take(4 * ec, 16);
  s.part = take(4 * 3 * ec * kFrameWarps, 16);
  s.gx = take(4 * gx_slots, 16);
  s.interval = take(4 * ec, 16);
  s.sender = take(4 * ec, 16);
  s.edge = take(8 * ec, 16);
  s.red = take(8 * (3 * ec + 12), 16);
  s.bytes = o;
  return s;
}

// out[m] = sum_m' W[m][m'] in[m'] (W rows padded to PAD floats, 16-byte aligned).
template <int D, int PAD>
__device__ __forceinline__ void rotate(const float* W, const float (&in)[D], float (&out)[D]) {
#pragma unroll
  for (int m = 0; m < D; ++m) {
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < D; c += 4) {
      const float4 w = *reinterpret_cast<const float4*>(W + m * PAD + c);
      s += w.x * in[c];
      if (c + 1 < D) s += w.y * in[c + 1];
      if (c + 2 < D) s += w.z * in[c + 2];
      if (c + 3 < D) s += w.w * in[c + 3];
    }
    out[m] = s;
  }
}

// acc[m'] += sum_m W[m][m'] in[m] (the transpose: back from the frame).
template <int D, int PAD>
__device__ __forceinline__ void rotate_back_add(const float* W, const float (&in)[D],
                                                float (&acc)[D]) {
#pragma unroll
  for (int m = 0; m < D; ++m) {
#pragma unroll
    for (int c = 0; c < D; c += 4) {
      const float4 w = *reinterpret_cast<const float4*>(W + m * PAD + c);
      acc[c] += w.x * in[m];
      if (c + 1 < D) acc[c + 1] += w.y * in[m];
      if (c + 2 < D) acc[c + 2] += w.z * in[m];
      if (c + 3 < D) acc[c + 3] += w.w * in[m];
    }
  }
}

// The inputs of one (edge, path) pair of a task: the path, g_j's row (d3 values, zeros past
// d3) and the radial table's coefficients of the lane's weight.
struct PairInputs {
  FramePath path;
  float g[7], coef[4];
};

__device__ __forceinline__ void load_pair(const cu::Conv<float>::View& c, const FrameView& fv,
                                          const FrameBlock& B, int u, int e, int q,
                                          const float* __restrict__ grad_y, const int* sender,
                                          const int* interval, PairInputs& in) {
  in.path = fv.paths[q];
  const float* row = grad_y + static_cast<int64_t>(sender[e]) * c.dim_out + in.path.out_offset + u;
#pragma unroll
  for (int m = 0; m < 7; ++m) in.g[m] = m < in.path.d3 ? __ldg(row + m * B.mul) : 0.0f;
  cu::load_table_entry(cu::table_entry<float>(c, interval[e], in.path.weight_offset + u), in.coef);
}

// One task of the chunk: for each edge, x_k's channel rotated into the frame, then every path
// of the task in the frame (g_j's row rotated, M0 and the two K slices from the compile-time
// w3j entries), the task's dE/dx rotated back, the force components (t1, t2, u) summed over
// the warp into the warp's column of part. AHEAD: the next (edge, path) pair's inputs are
// loaded before this pair's products (the engine's tp_backward_task loads one edge ahead).
template <int D1, bool AHEAD>
__device__ void frame_task(const cu::Conv<float>::View& c, const FrameView& fv,
                           const FrameTask& task, const FrameBlock& B, int n, int64_t k,
                           const float* __restrict__ x, const float* __restrict__ grad_y,
                           const float* wigner, const int* sender, const int* interval,
                           const float* local_t, const float* unit, float* part, float* gx) {
  constexpr int L1 = (D1 - 1) / 2;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int u_lane = task.u0 + lane;
  const bool active = u_lane < B.mul;
  const int u = active ? u_lane : task.u0;
  float xk[D1], gacc[D1];
  const float* xrow = x + k * c.dim_in + B.in_offset + u;
#pragma unroll
  for (int a = 0; a < D1; ++a) {
    xk[a] = active ? __ldg(xrow + a * B.mul) : 0.0f;
    gacc[a] = 0.0f;
  }
  const float inv_step = static_cast<float>(c.table_inv_step);
  PairInputs cur;
  if constexpr (AHEAD) load_pair(c, fv, B, u, 0, task.path_begin, grad_y, sender, interval, cur);
#pragma unroll 1
  for (int e = 0; e < n; ++e) {
    const float* W1 = wigner + e * kWignerFloats + wigner_offset(L1);
    float xr[D1], dxr[D1];
    rotate<D1, row_pad(L1)>(W1, xk, xr);
#pragma unroll
    for (int a = 0; a < D1; ++a) dxr[a] = 0.0f;
    float f1 = 0.0f, f2 = 0.0f, f3 = 0.0f;
    const float t = local_t[e];
#pragma unroll 1
    for (int q = task.path_begin; q < task.path_end; ++q) {
      PairInputs next;
      if constexpr (AHEAD) {
        const bool last_path = q + 1 == task.path_end;
        const int en = last_path ? e + 1 : e, qn = last_path ? task.path_begin : q + 1;
        if (en < n) load_pair(c, fv, B, u, en, qn, grad_y, sender, interval, next);
      } else {
        load_pair(c, fv, B, u, e, q, grad_y, sender, interval, cur);
      }
      const FramePath& P = cur.path;
      cu::with_irrep_dim(P.d3, [&](auto d3) {
        constexpr int D3 = decltype(d3)::value, L3 = (D3 - 1) / 2;
        cu::with_wigner3j_d2<D1, D3>(P.d2, [&](auto d2) {
          constexpr int D2 = decltype(d2)::value, L2 = (D2 - 1) / 2;
          float gq[D3], gr[D3];
#pragma unroll
          for (int m = 0; m < D3; ++m) gq[m] = cur.g[m];
          const float w = e3fuse::ops::radial_table_value(cur.coef, t);
          const float dw_dr = e3fuse::ops::radial_table_grad(cur.coef, t, inv_step);
          rotate<D3, row_pad(L3)>(wigner + e * kWignerFloats + wigner_offset(L3), gq, gr);
          float t0[D1] = {}, h1 = 0.0f, h2 = 0.0f;
          e3fuse::ops::Wigner3j<L1, L2, L3>::for_each([&](int a, int b, int kk, double value) {
            const float v = static_cast<float>(value);
            if (b == L2) {
              t0[a] += v * gr[kk];
            } else if (b == L2 + 1) {
              h1 += v * (xr[a] * gr[kk]);
            } else if (b == L2 - 1) {
              h2 += v * (xr[a] * gr[kk]);
            }
          });
          float dw = 0.0f;
#pragma unroll
          for (int a = 0; a < D1; ++a) dw += xr[a] * t0[a];
          dw *= P.scale_m;
          const float wm = w * P.scale_m;
#pragma unroll
          for (int a = 0; a < D1; ++a) dxr[a] += wm * t0[a];
          f1 += w * P.scale_1 * h1;
          f2 += w * P.scale_2 * h2;
          f3 += dw * dw_dr;
        });
      });
      if constexpr (AHEAD) cur = next;
    }
    rotate_back_add<D1, row_pad(L1)>(W1, dxr, gacc);
    const float inv_r = unit[4 * e + 3];
    const float sum = cu::warp_sum3(f1 * inv_r * c.inv_denominator, f2 * inv_r * c.inv_denominator,
                                    f3 * c.inv_denominator);
    if (lane % 8 == 0 && lane < 24) part[(3 * e + lane / 8) * kFrameWarps + warp] += sum;
  }
  if (!active) return;
  float* slot = gx + task.slot + lane;
#pragma unroll
  for (int a = 0; a < D1; ++a) slot[a * 32] += gacc[a];
}

template <int EC, bool AHEAD>
__global__ void __launch_bounds__(kFrameThreads, 2)
    frame_backward_kernel(cu::Geometry<float>::View geo, cu::Conv<float>::View c, FrameView fv,
                          e3fuse::GraphView g, int64_t receiver_rows, const float* __restrict__ x,
                          const float* __restrict__ grad_y, float* __restrict__ grad_x,
                          double* forces, double* atom_virials, cu::RemoteForces remote,
                          int64_t* error_node) {
  extern __shared__ __align__(16) unsigned char smem[];
  const FrameSmem L = frame_smem(EC, fv.gx_slots);
  float* wigner = reinterpret_cast<float*>(smem + L.wigner);
  float* vec = reinterpret_cast<float*>(smem + L.vec);
  float* unit = reinterpret_cast<float*>(smem + L.unit);
  float* local_t = reinterpret_cast<float*>(smem + L.local_t);
  float* part = reinterpret_cast<float*>(smem + L.part);
  float* gx = reinterpret_cast<float*>(smem + L.gx);
  int* interval = reinterpret_cast<int*>(smem + L.interval);
  int* sender = reinterpret_cast<int*>(smem + L.sender);
  int64_t* s_edge = reinterpret_cast<int64_t*>(smem + L.edge);
  double* red = reinterpret_cast<double*>(smem + L.red);
  __shared__ int64_t s_pos;
  __shared__ int s_count;

  const int64_t k = blockIdx.x;
  for (int q = threadIdx.x; q < fv.gx_slots; q += blockDim.x) gx[q] = 0.0f;
  if (threadIdx.x == 0) s_pos = g.row_offsets[k];
  const int64_t end = g.row_offsets[k + 1];
  const double cutoff2 = geo.cutoff * geo.cutoff;
  double* edge_force = red;
  double* force_sums = red + 3 * EC;
  if (threadIdx.x < 12) force_sums[threadIdx.x] = 0.0;
  __syncthreads();
  while (true) {
    cu::take_chunk<EC>(g, k, cutoff2, receiver_rows, end, &s_pos, &s_count, s_edge, error_node);
    const int n = s_count;
    if (n == 0) break;
    const int tid = threadIdx.x;
    if (tid < n) {
      double v[3];
      cu::edge_vector(g, k, s_edge[tid], v);
      const double r = sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
      sender[tid] = g.neighbors[s_edge[tid]];
      for (int a = 0; a < 3; ++a) {
        vec[3 * tid + a] = static_cast<float>(v[a]);
        unit[4 * tid + a] = static_cast<float>(v[a] / r);
      }
      unit[4 * tid + 3] = static_cast<float>(1.0 / r);
      int iv = 0;
      double xt = 0.0;
      e3fuse::ops::radial_table_locate(r, c.table_origin, c.table_inv_step, c.table_intervals,
                                       c.table_fine_intervals, c.table_coarse_shift, iv, xt);
      interval[tid] = iv;
      local_t[tid] = static_cast<float>(xt);
    }
    __syncthreads();
    // D_1 = P R P^T (P: the harmonics' l = 1 basis, Y_1(v) = c P v), D_0 = 1
    for (int q = tid; q < n * 9; q += blockDim.x) {
      const int e = q / 9, m = (q % 9) / 3, mp = q % 3;
      const float* ue = unit + 4 * e;
      float t1[3], t2[3];
      cu::edge_frame<float>(ue, t1, t2);
      const float* ax = fv.constants + kAxisAt;
      const float* P = fv.constants + kBasisAt;
      // (P p)_m (P u)_m' + (P q1)_m (P t1)_m' + (P q2)_m (P t2)_m'
      float pa[3] = {}, pb[3] = {};
      for (int a = 0; a < 3; ++a) {
        pa[0] += P[3 * m + a] * ax[a];
        pa[1] += P[3 * m + a] * ax[3 + a];
        pa[2] += P[3 * m + a] * ax[6 + a];
        pb[0] += P[3 * mp + a] * ue[a];
        pb[1] += P[3 * mp + a] * t1[a];
        pb[2] += P[3 * mp + a] * t2[a];
      }
      float* W = wigner + e * kWignerFloats;
      W[wigner_offset(1) + m * row_pad(1) + mp] = pa[0] * pb[0] + pa[1] * pb[1] + pa[2] * pb[2];
      if (m == 0 && mp == 0) W[0] = 1.0f;
    }
    for (int q = tid; q < 3 * n * kFrameWarps; q += blockDim.x) part[q] = 0.0f;
    __syncthreads();
    for (int l = 2; l <= fv.lmax; ++l) {
      const int d = 2 * l + 1;
      const int* begin = fv.rec_begin + 8 * (l - 2);
      for (int q = tid; q < n * d * d; q += blockDim.x) {
        const int e = q / (d * d), m = (q / d) % d, mp = q % d;
        const float* W = wigner + e * kWignerFloats;
        const float* W1 = W + wigner_offset(1);
        const float* Wp = W + wigner_offset(l - 1);
        const int pad1 = row_pad(1), padp = row_pad(l - 1);
        float sum = 0.0f;
        for (int i = begin[m]; i < begin[m + 1]; ++i) {
          const int ai = fv.rec_ab[i] >> 3, bi = fv.rec_ab[i] & 7;
          float inner = 0.0f;
          for (int j = begin[mp]; j < begin[mp + 1]; ++j) {
            const int aj = fv.rec_ab[j] >> 3, bj = fv.rec_ab[j] & 7;
            inner += fv.rec_value[j] * W1[ai * pad1 + aj] * Wp[bi * padp + bj];
          }
          sum += fv.rec_value[i] * inner;
        }
        wigner[e * kWignerFloats + wigner_offset(l) + m * row_pad(l) + mp] = sum;
      }
      __syncthreads();
    }
    const int warp = tid / 32;
    for (int q = fv.task_begin[warp]; q < fv.task_begin[warp + 1]; ++q) {
      const FrameTask task = fv.tasks[q];
      const FrameBlock B = fv.blocks[task.block];
      cu::with_irrep_dim(B.d1, [&](auto d1) {
        frame_task<decltype(d1)::value, AHEAD>(c, fv, task, B, n, k, x, grad_y, wigner, sender,
                                               interval, local_t, unit, part, gx);
      });
    }
    __syncthreads();
    cu::sum_edge_forces<float>(part, n, unit, edge_force);
    __syncthreads();
    cu::add_edge_forces<float>(vec, n, edge_force, remote.virials ? 0.5 : 1.0, force_sums);
    cu::deliver_edge_forces<float>(remote, sender, vec, n, edge_force);
    __syncthreads();
  }
  float* gk = grad_x + k * c.dim_in;
  for (int q = threadIdx.x; q < c.dim_in; q += blockDim.x) {
    int b = 0;
    while (b + 1 < fv.num_blocks && q >= fv.blocks[b + 1].in_offset) ++b;
    const FrameBlock B = fv.blocks[b];
    const int r = q - B.in_offset, a = r / B.mul, u = r - a * B.mul;
    float sum = 0.0f;
    for (int t = B.task_list_begin; t < B.task_list_end && a < B.d1; ++t) {
      const FrameTask task = fv.tasks[fv.block_tasks[t]];
      if (u >= task.u0 && u < task.u0 + 32) sum += gx[task.slot + a * 32 + u - task.u0];
    }
    gk[q] = sum * c.inv_denominator;
  }
  if (threadIdx.x == 0) {
    for (int a = 0; a < 3; ++a) forces[3 * k + a] += force_sums[a];
    if (atom_virials)
      for (int q = 0; q < 9; ++q) atom_virials[9 * k + q] += force_sums[3 + q];
  }
}

// ---------------------------------------------------------------------------
// Host: the frame's constants and the task deal.

// w3j(l1, l2, l3) as a dense [d1][d2][d3] array (ops::wigner3j_dense).
std::vector<double> w3j(int l1, int l2, int l3) {
  std::vector<double> w(static_cast<size_t>(2 * l1 + 1) * (2 * l2 + 1) * (2 * l3 + 1));
  if (!e3fuse::ops::wigner3j_dense(l1, l2, l3, w.data()))
    throw Error("no Wigner 3j symbol (" + std::to_string(l1) + ", " + std::to_string(l2) + ", " +
                std::to_string(l3) + ") in the table");
  return w;
}

struct HostFrame {
  FrameView view;  // pointers set once uploaded
  std::vector<float> constants = std::vector<float>(kConstants);
  std::vector<int> rec_begin, rec_ab;
  std::vector<float> rec_value;
  std::vector<FramePath> paths;
  std::vector<FrameBlock> blocks;
  std::vector<FrameTask> tasks;
  std::vector<int> block_tasks;
  std::string deal;  // the tasks per warp, for the record
};

// The frame of a layer, or an empty reason why it cannot run.
std::string make_frame(const e3fuse::cpu::Conv<float>& conv, const e3fuse::ops::ShTable<double>& sh,
                       HostFrame& out) {
  if (!sh.normalize) return "spherical harmonics not normalized";
  if (sh.lmax > 3) return "spherical harmonics above l = 3";
  if (conv.table.intervals == 0) return "no radial table";
  if (!conv.pair_tables.empty() || conv.radial_mlp) return "per-pair radial tables";
  // the polar axis p = y, q1 = z (dY lands on m = +1), q2 = x (m = -1): checked below
  const double p[3] = {0, 1, 0}, q1[3] = {0, 0, 1}, q2[3] = {1, 0, 0};
  std::vector<double> Y(sh.dim), dP(3 * sh.dim);
  e3fuse::ops::spherical_harmonics(sh, p, Y.data(), dP.data());
  std::vector<double> y0(4), dq1(4), dq2(4);
  for (int l = 0; l <= sh.lmax; ++l) {
    for (int m = 0; m < 2 * l + 1; ++m) {
      const int q = l * l + m;
      const double gz = dP[3 * q] * q1[0] + dP[3 * q + 1] * q1[1] + dP[3 * q + 2] * q1[2];
      const double gxv = dP[3 * q] * q2[0] + dP[3 * q + 1] * q2[1] + dP[3 * q + 2] * q2[2];
      if (m == l)
        y0[l] = Y[q];
      else if (std::fabs(Y[q]) > 1e-12)
        return "Y(y) has components off m = 0";
      if (m == l + 1)
        dq1[l] = gz;
      else if (std::fabs(gz) > 1e-12)
        return "dY(y)/dz off m = +1";
      if (m == l - 1)
        dq2[l] = gxv;
      else if (std::fabs(gxv) > 1e-12)
        return "dY(y)/dx off m = -1";
    }
  }
  // Duff's frame is right-handed (t1 x t2 = u), as (q1, q2, p)
  FrameView& v = out.view;
  float* cs = out.constants.data();
  for (int a = 0; a < 3; ++a) {
    cs[kAxisAt + a] = static_cast<float>(p[a]);
    cs[kAxisAt + 3 + a] = static_cast<float>(q1[a]);
    cs[kAxisAt + 6 + a] = static_cast<float>(q2[a]);
  }
  // the l = 1 basis: Y_1(e_a) = c P[:, a]
  for (int a = 0; a < 3; ++a) {
    const double e[3] = {a == 0 ? 1.0 : 0.0, a == 1 ? 1.0 : 0.0, a == 2 ? 1.0 : 0.0};
    e3fuse::ops::spherical_harmonics(sh, e, Y.data(), dP.data());
    for (int m = 0; m < 3; ++m) cs[kBasisAt + 3 * m + a] = static_cast<float>(Y[1 + m] / y0[1]);
  }
  for (int m = 0; m < 3; ++m)
    for (int q = 0; q < 3; ++q) {
      double dot = 0.0;
      for (int a = 0; a < 3; ++a) dot += cs[kBasisAt + 3 * m + a] * cs[kBasisAt + 3 * q + a];
      if (std::fabs(dot - (m == q ? 1.0 : 0.0)) > 1e-6)
        return "the l = 1 harmonics are not an orthonormal basis of v";
    }
  // the recursion's w3j(1, l - 1, l) columns
  out.rec_begin.assign(16, 0);
  for (int l = 2; l <= 3; ++l) {
    const std::vector<double> C = w3j(1, l - 1, l);
    const int d2 = 2 * l - 1, d3 = 2 * l + 1;
    for (int m = 0; m < d3; ++m) {
      out.rec_begin[8 * (l - 2) + m] = static_cast<int>(out.rec_ab.size());
      for (int a = 0; a < 3; ++a)
        for (int b = 0; b < d2; ++b) {
          const double c = C[(a * d2 + b) * d3 + m];
          if (c == 0.0) continue;
          out.rec_ab.push_back(a * 8 + b);
          out.rec_value.push_back(static_cast<float>(c * std::sqrt(static_cast<double>(d3))));
        }
      out.rec_begin[8 * (l - 2) + m + 1] = static_cast<int>(out.rec_ab.size());
    }
  }
  // paths, grouped by input block (the host order), their alpha from cg = alpha w3j
  std::vector<int> cost;
  std::vector<const e3fuse::cpu::Conv<float>::Path*> by_block;
  for (const auto& P : conv.paths) by_block.push_back(&P);
  std::stable_sort(by_block.begin(), by_block.end(),
                   [](auto* a, auto* b) { return a->in_offset < b->in_offset; });
  int lmax = 0;
  for (const auto* pp : by_block) {
    const auto& P = *pp;
    lmax = std::max(lmax, std::max((P.d1 - 1) / 2, (P.d3 - 1) / 2));
    if (P.d1 > 7 || P.d3 > 7) return "irreps above l = 3";
    const int l1 = (P.d1 - 1) / 2, l2 = (P.d2 - 1) / 2, l3 = (P.d3 - 1) / 2;
    const std::vector<double> w = w3j(l1, l2, l3);
    double num = 0.0, den = 0.0, mx = 0.0;
    for (size_t q = 0; q < w.size(); ++q) {
      num += static_cast<double>(P.cg[q]) * w[q];
      den += w[q] * w[q];
      mx = std::max(mx, std::fabs(static_cast<double>(P.cg[q])));
    }
    if (den == 0.0) return "a path without Wigner 3j entries";
    const double alpha = num / den;
    for (size_t q = 0; q < w.size(); ++q)
      if (std::fabs(static_cast<double>(P.cg[q]) - alpha * w[q]) > 1e-5 * mx)
        return "a path that is not alpha x w3j";
    if (out.blocks.empty() || out.blocks.back().in_offset != P.in_offset) {
      if (!out.blocks.empty() && P.in_offset <= out.blocks.back().in_offset)
        return "input blocks out of order";
      out.blocks.push_back({static_cast<int>(P.in_offset), P.mul, P.d1, 0, 0});
    }
    const double s = (l2 % 2) ? -1.0 : 1.0;  // Y_l(-v) = (-1)^l Y_l(v), on x_k
    FramePath fp{};
    fp.block = static_cast<int>(out.blocks.size()) - 1;
    fp.d2 = P.d2;
    fp.d3 = P.d3;
    fp.out_offset = static_cast<int>(P.out_offset);
    fp.weight_offset = static_cast<int>(P.weight_offset);
    fp.scale_m = static_cast<float>(s * alpha * y0[l2]);
    fp.scale_1 = static_cast<float>(s * alpha * dq1[l2]);
    fp.scale_2 = static_cast<float>(s * alpha * dq2[l2]);
    out.paths.push_back(fp);
    int entries = 0;
    for (int a = 0; a < P.d1; ++a)
      for (int b = std::max(0, l2 - 1); b <= std::min(P.d2 - 1, l2 + 1); ++b)
        for (int k = 0; k < P.d3; ++k) entries += w[(a * P.d2 + b) * P.d3 + k] != 0.0;
    cost.push_back(P.d3 * P.d3 + 2 * entries + 3 * P.d1 + 24);
  }
  // Tasks: per input block and 32 channels, its paths split into pieces of about a warp's
  // share of the whole; then the pieces dealt largest first to the least loaded warp.
  int total = 0;
  std::vector<std::vector<int>> block_paths(out.blocks.size());
  for (size_t q = 0; q < out.paths.size(); ++q) block_paths[out.paths[q].block].push_back(q);
  auto overhead = [](int d1) { return 2 * d1 * d1 + 40; };
  std::vector<int> block_cost(out.blocks.size());  // one task of 32 channels with all its paths
  for (size_t b = 0; b < out.blocks.size(); ++b) {
    block_cost[b] = overhead(out.blocks[b].d1);
    for (int q : block_paths[b]) block_cost[b] += cost[q];
    total += block_cost[b] * ((out.blocks[b].mul + 31) / 32);
  }
  const double share = static_cast<double>(total) / kFrameWarps;
  struct Piece {
    FrameTask task;
    int cost;
  };
  std::vector<Piece> pieces;
  std::vector<FramePath> ordered;
  for (size_t b = 0; b < out.blocks.size(); ++b) {
    const int first = static_cast<int>(ordered.size());
    for (int q : block_paths[b]) ordered.push_back(out.paths[q]);
    const int c = block_cost[b];
    const int parts = std::max(1, static_cast<int>(std::lround(c / share)));
    // contiguous pieces of about c / parts each
    std::vector<std::pair<int, int>> ranges;  // [begin, end) into ordered
    int begin = first, acc = 0;
    const double target = static_cast<double>(c) / parts;
    for (size_t i = 0; i < block_paths[b].size(); ++i) {
      acc += cost[block_paths[b][i]];
      const int end = first + static_cast<int>(i) + 1;
      const bool last = i + 1 == block_paths[b].size();
      if (last || (static_cast<int>(ranges.size()) + 1 < parts && acc >= target)) {
        ranges.push_back({begin, end});
        begin = end;
        acc = 0;
      }
    }
    for (int u0 = 0; u0 < out.blocks[b].mul; u0 += 32)
      for (auto [pb, pe] : ranges) {
        int pc = overhead(out.blocks[b].d1);
        for (int q = pb; q < pe; ++q) pc += cost[block_paths[b][q - first]];
        pieces.push_back({{static_cast<int>(b), u0, pb, pe, 0}, pc});
      }
  }
  out.paths = ordered;
  std::stable_sort(pieces.begin(), pieces.end(),
                   [](const Piece& a, const Piece& b) { return a.cost > b.cost; });
  std::vector<std::vector<Piece>> per_warp(kFrameWarps);
  std::vector<int> load(kFrameWarps, 0);
  for (const Piece& pc : pieces) {
    const int w = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    per_warp[w].push_back(pc);
    load[w] += pc.cost;
  }
  int slot = 0;
  std::ostringstream deal;
  for (int w = 0; w < kFrameWarps; ++w) {
    v.task_begin[w] = static_cast<int>(out.tasks.size());
    deal << (w ? ", " : "") << load[w];
    for (Piece pc : per_warp[w]) {
      pc.task.slot = slot;
      slot += 32 * out.blocks[pc.task.block].d1;
      out.tasks.push_back(pc.task);
    }
  }
  v.task_begin[kFrameWarps] = static_cast<int>(out.tasks.size());
  v.gx_slots = slot;
  for (size_t b = 0; b < out.blocks.size(); ++b) {
    out.blocks[b].task_list_begin = static_cast<int>(out.block_tasks.size());
    // in the order of their channels, then paths: a fixed order for the sums
    std::vector<int> ids;
    for (size_t t = 0; t < out.tasks.size(); ++t)
      if (out.tasks[t].block == static_cast<int>(b)) ids.push_back(static_cast<int>(t));
    std::sort(ids.begin(), ids.end(), [&](int a, int c) {
      const FrameTask &x = out.tasks[a], &y = out.tasks[c];
      return x.u0 != y.u0 ? x.u0 < y.u0 : x.path_begin < y.path_begin;
    });
    for (int id : ids) out.block_tasks.push_back(id);
    out.blocks[b].task_list_end = static_cast<int>(out.block_tasks.size());
  }
  v.num_blocks = static_cast<int>(out.blocks.size());
  v.lmax = lmax;
  out.deal =
      "\"tasks\": " + std::to_string(out.tasks.size()) + ", \"warp_cost\": [" + deal.str() + "]";
  return "";
}

struct Options : e3fuse_micro::StructureOptions {
  int ec = 4;
  bool ahead = true;
};

Options parse(int argc, char** argv) {
  Options o;
  e3fuse_micro::parse_pairs(argc, argv, [&](const std::string& key, const std::string& value) {
    if (key == "--ec") {
      o.ec = std::stoi(value);
    } else if (key == "--ahead") {
      if (value != "0" && value != "1") throw Error("--ahead must be 0 or 1");
      o.ahead = value == "1";
    } else {
      return o.take(key, value);
    }
    return true;
  });
  o.validate();
  if (o.dtype != "float32") throw Error("the frame micro runs float32 only");
  if (o.ec != 4 && o.ec != 8) throw Error("--ec must be 4 or 8");
  return o;
}

// max |a - b| / max |b|
template <class T>
double relative_difference(const std::vector<T>& a, const std::vector<T>& b) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return scale > 0.0 ? diff / scale : diff;
}

std::vector<double> fixed_to_double(const std::vector<unsigned long long>& f) {
  std::vector<double> out(f.size() / 2);
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<double>(static_cast<long long>(f[2 * i])) / cu::kFixedHiScale +
             static_cast<double>(static_cast<long long>(f[2 * i + 1])) / cu::kFixedLoScale;
  return out;
}

int run_float(const Options& opt) {
  const auto model = e3fuse::Model::load(opt.model);
  const e3fuse::ModelPlan& plan = model->plan();
  if (plan.family == "mace") throw Error("the frame micro runs SevenNet models");
  const e3fuse_micro::Structure s = e3fuse_micro::read_structure(opt.structure);
  const int64_t n = s.n;
  const e3fuse_micro::DeviceStream ds;
  cudaStream_t stream = ds.stream;
  const e3fuse_micro::DeviceGraph graph(s, plan.cutoff, opt.skin, stream);
  const e3fuse::GraphView& g = graph.view;
  const e3fuse::cpu::TypedPlan<float> typed = e3fuse::cpu::make_typed_plan<float>(plan, true);
  const cu::Geometry<float> geom = cu::make_geometry<float>(typed);
  const auto sh = e3fuse::ops::make_sh_table<double>(plan.sh);

  DeviceArray<int64_t> error_node;
  error_node.resize(2);
  DeviceArray<double> forces, virials;
  DeviceArray<unsigned long long> remote_forces;
  forces.resize(static_cast<size_t>(3 * n));
  virials.resize(static_cast<size_t>(9 * n));
  remote_forces.resize(static_cast<size_t>(6 * n));
  const cu::RemoteForces remote{remote_forces.data(), nullptr, error_node.data() + 1};

  std::ostringstream layers;
  int listed = 0;
  for (size_t t = 0; t < typed.layers.size(); ++t) {
    const e3fuse::cpu::Conv<float>& host_conv = typed.layers[t].conv;
    HostFrame hf;
    const std::string why = make_frame(host_conv, sh, hf);
    if (!why.empty()) {
      std::fprintf(stderr, "layer %zu skipped: %s\n", t, why.c_str());
      continue;
    }
    const cu::Conv<float> conv = cu::make_conv<float>(host_conv);
    DeviceArray<FramePath> d_paths;
    DeviceArray<FrameBlock> d_blocks;
    DeviceArray<FrameTask> d_tasks;
    DeviceArray<int> d_block_tasks;
    DeviceArray<float> d_constants, d_rec_value;
    DeviceArray<int> d_rec_begin, d_rec_ab;
    d_constants.upload(hf.constants);
    d_rec_value.upload(hf.rec_value);
    d_rec_begin.upload(hf.rec_begin);
    d_rec_ab.upload(hf.rec_ab);
    d_paths.upload(hf.paths);
    d_blocks.upload(hf.blocks);
    d_tasks.upload(hf.tasks);
    d_block_tasks.upload(hf.block_tasks);
    FrameView fv = hf.view;
    fv.paths = d_paths.data();
    fv.blocks = d_blocks.data();
    fv.tasks = d_tasks.data();
    fv.block_tasks = d_block_tasks.data();
    fv.constants = d_constants.data();
    fv.rec_begin = d_rec_begin.data();
    fv.rec_ab = d_rec_ab.data();
    fv.rec_value = d_rec_value.data();

    const int64_t dim_in = conv.view.dim_in, dim_out = conv.view.dim_out;
    DeviceArray<float> x, grad_y, grad_x;
    x.upload(e3fuse_micro::random_rows<float>(n, dim_in, 11 + t));
    grad_y.upload(e3fuse_micro::random_rows<float>(n, dim_out, 23 + t));
    grad_x.resize(static_cast<size_t>(n * dim_in));
    error_node.zero();

    const FrameSmem L = frame_smem(opt.ec, fv.gx_slots);
    auto kernel =
        opt.ec == 4
            ? (opt.ahead ? frame_backward_kernel<4, true> : frame_backward_kernel<4, false>)
            : (opt.ahead ? frame_backward_kernel<8, true> : frame_backward_kernel<8, false>);
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L.bytes),
          "frame smem");
    auto run_frame = [&]() {
      kernel<<<static_cast<unsigned>(n), kFrameThreads, L.bytes, stream>>>(
          geom.view, conv.view, fv, g, n, x.data(), grad_y.data(), grad_x.data(), forces.data(),
          virials.data(), remote, error_node.data());
      check(cudaGetLastError(), "frame_backward_kernel");
    };
    auto run_engine = [&]() {
      cu::conv_backward<float>(geom, conv, g, n, x.data(), grad_y.data(), grad_x.data(),
                               forces.data(), virials.data(), remote, error_node.data(), stream,
                               cu::ConvRows{});
    };
    auto zero = [&]() {
      forces.zero(stream);
      virials.zero(stream);
      remote_forces.zero(stream);
    };
    struct Out {
      std::vector<float> gx;
      std::vector<double> f, v, rf;
    };
    auto fetch = [&]() {
      check(cudaStreamSynchronize(stream), "sync");
      Out o;
      o.gx.resize(grad_x.size());
      o.f.resize(forces.size());
      o.v.resize(virials.size());
      std::vector<unsigned long long> rf(remote_forces.size());
      grad_x.download(o.gx.data(), o.gx.size());
      forces.download(o.f.data(), o.f.size());
      virials.download(o.v.data(), o.v.size());
      remote_forces.download(rf.data(), rf.size());
      check(cudaDeviceSynchronize(), "download");
      o.rf = fixed_to_double(rf);
      return o;
    };
    zero();
    run_engine();
    const Out ref = fetch();
    zero();
    run_frame();
    const Out got = fetch();
    int64_t errors[2] = {0, 0};
    error_node.download(errors, 2);
    check(cudaDeviceSynchronize(), "error flags");
    if (errors[0] || errors[1]) throw Error("layer " + std::to_string(t) + ": flagged node");
    std::ostringstream diffs;
    diffs << "\"dE_dx\": " << relative_difference(got.gx, ref.gx)
          << ", \"node_force\": " << relative_difference(got.f, ref.f)
          << ", \"receiver_force\": " << relative_difference(got.rf, ref.rf)
          << ", \"virial\": " << relative_difference(got.v, ref.v);

    const int launches = opt.warmup + opt.repeats;
    e3fuse_micro::LaunchTimer te(launches), tf(launches);
    for (int r = 0; r < launches; ++r) {
      zero();
      te.start(r, stream);
      run_engine();
      te.stop(r, stream);
      zero();
      tf.start(r, stream);
      run_frame();
      tf.stop(r, stream);
    }
    check(cudaStreamSynchronize(stream), "timed launches");
    std::ostringstream paths;
    for (size_t p = 0; p < host_conv.paths.size(); ++p) {
      const auto& q = host_conv.paths[p];
      paths << (p ? ", " : "") << "[" << q.mul << ", " << (q.d1 - 1) / 2 << ", " << (q.d2 - 1) / 2
            << ", " << (q.d3 - 1) / 2 << "]";
    }
    layers << (listed++ ? ",\n  " : "") << "{\"layer\": " << t << ", \"paths_mul_l1_l2_l3\": ["
           << paths.str() << "], " << hf.deal << ", \"smem_bytes\": " << L.bytes
           << ", \"relative_difference\": {" << diffs.str() << "}"
           << ", \"engine_ms\": " << e3fuse_micro::json_list(te.ms(opt.warmup))
           << ", \"frame_ms\": " << e3fuse_micro::json_list(tf.ms(opt.warmup)) << "}";
  }
  std::ostringstream out;
  out.precision(8);
  out << "{\"tool\": \"e3fuse_frame_backward_micro\", \"model\": \"" << opt.model
      << "\", \"device\": \"" << ds.prop.name << "\", \"atoms\": " << n << ", \"ec\": " << opt.ec
      << ", \"ahead\": " << (opt.ahead ? "true" : "false") << ", \"warmup\": " << opt.warmup
      << ", \"repeats\": " << opt.repeats << ",\n \"layers\": [\n  " << layers.str() << "]}\n";
  e3fuse_micro::emit_json(out.str(), opt.json_out);
  return 0;
}

int run_double(const Options&) { throw Error("float32 only"); }

}  // namespace

int main(int argc, char** argv) {
  return e3fuse_micro::run_main<Options>("e3fuse_frame_backward_micro", argc, argv, parse,
                                         run_float, run_double);
}
