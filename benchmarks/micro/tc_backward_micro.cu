// benchmarks/micro/tc_backward_micro.cu: a design probe for issue 21. The convolution
// backward's per-edge contraction of one path (d1 x d3, 32 channels per warp), as the engine
// runs it on the FMA pipes (tp_backward_edge in cuda/conv_kernels.cuh, one channel per lane),
// against the same contraction on the tensor cores in 3xTF32 (cuda/mma_tf32.cuh).
//
// Per edge e = (k -> j) and channel u, with s x_k the sender's row, g = dE/dy_j the receiver's
// and {M, K_x, K_y, K_z} the edge's rows (M[a][q] = sum_b C[a][b][q] Y_b, K = dM/dv):
//   dE/dx_k[u][a] += w[u] (M g)[u][a]
//   f_c            = sum_u w[u] sum_a s x_k[u][a] (K_c g)[u][a]
//                  + sum_u dw[u] (dw/dr)[u] unit_c,    dw[u] = sum_a s x_k[u][a] (M g)[u][a]
// Three versions:
// - fma: the engine's, 4 d1 d3 multiply-adds per channel;
// - tc: one product per edge, D = G B, G [32 channels x d3] and B [d3 x 4 d1] with column
//   4 a + c the rows M (c = 0) and K_c: two m16 tiles x ceil(d1 / 2) n8 tiles x one k8 step,
//   three MMAs each (3xTF32), then per channel the d1 sums above on D's fragments;
// - tc_force: M g per channel on the FMA pipes (d1 d3), and the force's sum over channels as
//   one product per edge over the channels, P = (s x_k)^T diag(w) G (k = 32), contracted with
//   K per warp (tc_force_backward_kernel).
//
// What it leaves out of the engine's kernel, alike in both: the radial table (w and dw/dr come
// from arrays), the parity sign, prefetching the next edge, building the {M, K} rows (they
// come from a pool of rows in global memory, staged per edge in the warp's shared memory),
// and the block's other tasks (every warp runs one task: one node, 32 channels, one path).
//
//   e3fuse_tc_backward_micro [--d1 D --d3 D] [--nodes N] [--edges-per-node P] [--mul M]
//                            [--warmup W] [--repeats R] [--json-out FILE]
//
// Without --d1 / --d3 every d1, d3 in {1, 3, 5, 7} runs. Both versions are checked against a
// double-precision host sum on the first tasks (errors relative to the largest value).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backward_probe.cuh"
#include "cuda/common.cuh"
#include "cuda/mma_tf32.cuh"
#include "cuda/warp_sum.cuh"
#include "e3fuse/error.h"
#include "micro_common.h"

namespace {

using e3fuse::cuda::check;
using e3fuse::cuda::DeviceArray;
using e3fuse_micro::split_tf32;

constexpr int kWarps = 8;  // one task per warp, as many warps per block as the engine's kernels
constexpr int kThreads = 32 * kWarps;
constexpr int kRowPool = 4096;  // distinct {M, K} rows, reused by edge e % kRowPool
constexpr unsigned kFullMask = 0xffffffffu;

struct Inputs {
  int nodes = 0, edges_per_node = 0, mul = 0, d1 = 0, d3 = 0;
  const float* x = nullptr;       // [nodes][d1 mul], s x_k, component-major as the engine's rows
  const float* grad = nullptr;    // [nodes][d3 mul], dE/dy
  const int* receiver = nullptr;  // [edges]
  const float* rows = nullptr;    // [kRowPool][d1][d3][4]: {M, K_x, K_y, K_z}
  const float* w = nullptr;       // [edges][mul]
  const float* dw_dr = nullptr;   // [edges][mul]
  const float* unit = nullptr;    // [edges][4]
  float* grad_x = nullptr;        // [nodes][d1 mul]
  float* force = nullptr;         // [edges][mul / 32][3], one column per channel group
};

// Copies edge e's {M, K} row into this warp's slice of shared memory.
template <int D1, int D3>
__device__ __forceinline__ void stage_row(const Inputs& in, int64_t e, float* slice) {
  const float4* from = reinterpret_cast<const float4*>(in.rows) + (e % kRowPool) * (D1 * D3);
  float4* to = reinterpret_cast<float4*>(slice);
  __syncwarp();
  for (int i = threadIdx.x % 32; i < D1 * D3; i += 32) to[i] = __ldg(from + i);
  __syncwarp();
}

__device__ __forceinline__ void store_force(const Inputs& in, int64_t e, int group, float f0,
                                            float f1, float f2) {
  const float sum = e3fuse::cuda::warp_sum3(f0, f1, f2);
  const int lane = threadIdx.x % 32;
  if (lane % 8 == 0 && lane < 24) in.force[(e * (in.mul / 32) + group) * 3 + lane / 8] = sum;
}

// The engine's arithmetic (tp_backward_edge, one channel per lane).
template <int D1, int D3>
__global__ void __launch_bounds__(kThreads, 2) fma_backward_kernel(Inputs in) {
  extern __shared__ float4 shared[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int groups = in.mul / 32;
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (task >= static_cast<int64_t>(in.nodes) * groups) return;
  const int64_t k = task / groups;
  const int group = static_cast<int>(task % groups);
  const int u = 32 * group + lane;
  float* slice = reinterpret_cast<float*>(shared) + warp * D1 * D3 * 4;
  float sx[D1], gxa[D1];
#pragma unroll
  for (int a = 0; a < D1; ++a) {
    sx[a] = in.x[k * D1 * in.mul + a * in.mul + u];
    gxa[a] = 0.0f;
  }
#pragma unroll 1
  for (int64_t e = k * in.edges_per_node; e < (k + 1) * in.edges_per_node; ++e) {
    stage_row<D1, D3>(in, e, slice);
    const float* gj = in.grad + static_cast<int64_t>(in.receiver[e]) * D3 * in.mul + u;
    float g[D3];
#pragma unroll
    for (int q = 0; q < D3; ++q) g[q] = gj[q * in.mul];
    const float w = in.w[e * in.mul + u], dd = in.dw_dr[e * in.mul + u];
    float dw = 0.0f, f0 = 0.0f, f1 = 0.0f, f2 = 0.0f;
    e3fuse_micro::fma_contract_edge<D1, D3>(reinterpret_cast<const float4*>(slice), g, sx, w, gxa,
                                            dw, f0, f1, f2);
    const float dr = dw * dd;
    const float* ue = in.unit + 4 * e;
    store_force(in, e, group, w * f0 + dr * ue[0], w * f1 + dr * ue[1], w * f2 + dr * ue[2]);
  }
#pragma unroll
  for (int a = 0; a < D1; ++a) in.grad_x[k * D1 * in.mul + a * in.mul + u] = gxa[a];
}

// The same sums from D = G B on the tensor cores. Lane = 4 g + t holds, per m-tile mt and
// n-tile nt, D at rows (channels) 16 mt + g and + 8 and columns 8 nt + 2 t, + 1: input
// component a = 2 nt + t / 2, and {M g, K_x g} for even t, {K_y g, K_z g} for odd t.
template <int D1, int D3>
__global__ void __launch_bounds__(kThreads, 2) tc_backward_kernel(Inputs in) {
  static_assert(D3 <= 8, "one k-step");
  constexpr int NT = (D1 + 1) / 2;  // n-tiles of 8 columns 4 a + c
  extern __shared__ float4 shared[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const bool even = t % 2 == 0;
  const int groups = in.mul / 32;
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (task >= static_cast<int64_t>(in.nodes) * groups) return;
  const int64_t k = task / groups;
  const int group = static_cast<int>(task % groups);
  const int u0 = 32 * group;
  float* slice = reinterpret_cast<float*>(shared) + warp * D1 * D3 * 4;
  // f(mt, nt, h, offset of x_k[a][r]) for this lane's rows r = 16 mt + 8 h + g and
  // components a = 2 nt + t / 2 < d1
  auto for_each_element = [&](auto&& f) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int a = 2 * nt + t / 2, r = 16 * mt + 8 * h + g;
          if (a < D1) f(mt, nt, h, k * D1 * in.mul + a * in.mul + u0 + r);
        }
  };
  float sx[2][NT][2] = {}, gxa[2][NT][2] = {};
  for_each_element([&](int mt, int nt, int h, int64_t at) { sx[mt][nt][h] = in.x[at]; });
#pragma unroll 1
  for (int64_t e = k * in.edges_per_node; e < (k + 1) * in.edges_per_node; ++e) {
    stage_row<D1, D3>(in, e, slice);
    const float* gj = in.grad + static_cast<int64_t>(in.receiver[e]) * D3 * in.mul + u0;
    // A = G [32 x 8]: a0 = G[g][t], a1 = G[g + 8][t], a2 = G[g][t + 4], a3 = G[g + 8][t + 4]
    uint32_t ah[2][4], al[2][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = 16 * mt + g + 8 * (i % 2), q = t + 4 * (i / 2);
        split_tf32(q < D3 ? gj[q * in.mul + r] : 0.0f, ah[mt][i], al[mt][i]);
      }
    float w[2][2], dd[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = 16 * mt + 8 * h + g;
        w[mt][h] = in.w[e * in.mul + u0 + r];
        dd[mt][h] = in.dw_dr[e * in.mul + u0 + r];
      }
    float fa = 0.0f, fb = 0.0f, dr = 0.0f;  // even t: K_x, dr; odd t: K_y, K_z
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      // B [8 x 8]: b0 = B[t][g], b1 = B[t + 4][g], column g = 4 (a - 2 nt) + c
      const int a = 2 * nt + g / 4, c = g % 4;
      uint32_t bh[2], bl[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int q = t + 4 * i;
        split_tf32(a < D1 && q < D3 ? slice[(a * D3 + q) * 4 + c] : 0.0f, bh[i], bl[i]);
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        e3fuse::cuda::mma_3xtf32(d, ah[mt], al[mt], bh, bl);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float wsx = w[mt][h] * sx[mt][nt][h];
          const float d0 = d[2 * h], d1 = d[2 * h + 1];
          if (even) {
            gxa[mt][nt][h] += w[mt][h] * d0;
            dr += sx[mt][nt][h] * d0 * dd[mt][h];
            fa += wsx * d1;
          } else {
            fa += wsx * d0;
            fb += wsx * d1;
          }
        }
      }
    }
    const float* ue = in.unit + 4 * e;
    const float f0 = even ? fa + dr * ue[0] : 0.0f;
    const float f1 = even ? dr * ue[1] : fa;
    const float f2 = even ? dr * ue[2] : fb;
    store_force(in, e, group, f0, f1, f2);
  }
  if (even)
    for_each_element([&](int mt, int nt, int h, int64_t at) { in.grad_x[at] = gxa[mt][nt][h]; });
}

// The force's channel sum on the tensor cores, the rest on the FMA pipes. Per edge,
// P[a][q] = sum_u s x_k[u][a] w[u] g[u][q] is one product over the task's 32 channels
// (m16 x n8 x four k8 steps: a <= 7 of 16 rows, q <= 7 of 8 columns, three MMAs each), and
// f_c = sum_{a,q} K_c[a][q] P[a][q] takes d1 d3 / 32 entries per lane; each lane keeps its
// channel's M g (d1 d3 multiply-adds instead of 4 d1 d3) for dE/dx_k and dw. The edge's row
// is staged planar: M [d1][d3 rounded up to 4] (read 16 bytes at a time; the padding is
// never multiplied), then {K_x, K_y, K_z, 0} per entry. A = (s x_k)^T is the same for every edge
// (split once per task); lane 4 g + t holds a0 = A[g][t + 8 ks] (a = g, channel 8 ks + t) and a2
// (channel + 4), and a1 = a3 = 0 (rows a >= 8); B = w g: b0 = B[8 ks + t][g] (q = g), b1 at channel
// + 4.
template <int D1, int D3>
__global__ void __launch_bounds__(kThreads, 2) tc_force_backward_kernel(Inputs in) {
  static_assert(D1 <= 8 && D3 <= 8, "one m16 tile (rows a < 8 used), one n8 tile");
  constexpr int D3P = (D3 + 3) / 4 * 4;  // M's row stride
  extern __shared__ float4 shared[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int groups = in.mul / 32;
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (task >= static_cast<int64_t>(in.nodes) * groups) return;
  const int64_t k = task / groups;
  const int group = static_cast<int>(task % groups);
  const int u0 = 32 * group, u = u0 + lane;
  float* m_plane = reinterpret_cast<float*>(shared) + warp * (D1 * D3P + 4 * D1 * D3);
  float4* k_rows = reinterpret_cast<float4*>(m_plane + D1 * D3P);
  const float* xk = in.x + k * D1 * in.mul;
  uint32_t ah[4][4], al[4][4];
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    split_tf32(g < D1 ? xk[g * in.mul + u0 + 8 * ks + t] : 0.0f, ah[ks][0], al[ks][0]);
    split_tf32(g < D1 ? xk[g * in.mul + u0 + 8 * ks + t + 4] : 0.0f, ah[ks][2], al[ks][2]);
    ah[ks][1] = al[ks][1] = ah[ks][3] = al[ks][3] = 0u;
  }
  float sx[D1], gxa[D1];
#pragma unroll
  for (int a = 0; a < D1; ++a) {
    sx[a] = xk[a * in.mul + u];
    gxa[a] = 0.0f;
  }
#pragma unroll 1
  for (int64_t e = k * in.edges_per_node; e < (k + 1) * in.edges_per_node; ++e) {
    const float4* from = reinterpret_cast<const float4*>(in.rows) + (e % kRowPool) * (D1 * D3);
    __syncwarp();
    for (int i = lane; i < D1 * D3; i += 32) {
      const float4 v = __ldg(from + i);
      m_plane[(i / D3) * D3P + i % D3] = v.x;
      k_rows[i] = make_float4(v.y, v.z, v.w, 0.0f);
    }
    __syncwarp();
    const float* gj = in.grad + static_cast<int64_t>(in.receiver[e]) * D3 * in.mul;
    float gq[D3P];
#pragma unroll
    for (int q = 0; q < D3P; ++q) gq[q] = q < D3 ? gj[q * in.mul + u] : 0.0f;
    const float w = in.w[e * in.mul + u], dd = in.dw_dr[e * in.mul + u];
    float dw = 0.0f;
#pragma unroll
    for (int a = 0; a < D1; ++a) {
      float mg = 0.0f;
#pragma unroll
      for (int q0 = 0; q0 < D3P; q0 += 4) {
        const float4 m = *reinterpret_cast<const float4*>(m_plane + a * D3P + q0);
        mg += m.x * gq[q0];
        if (q0 + 1 < D3) mg += m.y * gq[q0 + 1];
        if (q0 + 2 < D3) mg += m.z * gq[q0 + 2];
        if (q0 + 3 < D3) mg += m.w * gq[q0 + 3];
      }
      dw += sx[a] * mg;
      gxa[a] += w * mg;
    }
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      uint32_t bh[2], bl[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int c = 8 * ks + t + 4 * i;  // the channel, within the task
        const float wc = __shfl_sync(kFullMask, w, c);
        split_tf32(g < D3 ? wc * gj[g * in.mul + u0 + c] : 0.0f, bh[i], bl[i]);
      }
      e3fuse::cuda::mma_3xtf32(d, ah[ks], al[ks], bh, bl);
    }
    // d0 = P[g][2 t], d1 = P[g][2 t + 1] (d2, d3: rows a >= 8, zero)
    float f0 = 0.0f, f1 = 0.0f, f2 = 0.0f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int q = 2 * t + j;
      if (g < D1 && q < D3) {
        const float4 kc = k_rows[g * D3 + q];
        f0 += kc.x * d[j];
        f1 += kc.y * d[j];
        f2 += kc.z * d[j];
      }
    }
    const float dr = dw * dd;
    const float* ue = in.unit + 4 * e;
    store_force(in, e, group, f0 + dr * ue[0], f1 + dr * ue[1], f2 + dr * ue[2]);
  }
#pragma unroll
  for (int a = 0; a < D1; ++a) in.grad_x[k * D1 * in.mul + a * in.mul + u] = gxa[a];
}

struct Options {
  int d1 = 0, d3 = 0, nodes = 32000, edges_per_node = 43, mul = 32, warmup = 3, repeats = 10;
  std::string json_out;
};

Options parse(int argc, char** argv) {
  Options o;
  e3fuse_micro::parse_probe_options(argc, argv,
                                    {{"--d1", &o.d1},
                                     {"--d3", &o.d3},
                                     {"--nodes", &o.nodes},
                                     {"--edges-per-node", &o.edges_per_node},
                                     {"--mul", &o.mul},
                                     {"--warmup", &o.warmup},
                                     {"--repeats", &o.repeats}},
                                    o.json_out);
  auto odd_dim = [](int d) { return d == 1 || d == 3 || d == 5 || d == 7; };
  if ((o.d1 != 0 || o.d3 != 0) && !(odd_dim(o.d1) && odd_dim(o.d3)))
    throw e3fuse::Error("--d1 and --d3 must both be 1, 3, 5 or 7");
  if (o.mul < 32 || o.mul % 32 != 0) throw e3fuse::Error("--mul must be a multiple of 32");
  if (o.nodes < 1 || o.edges_per_node < 1 || o.repeats < 1 || o.warmup < 0)
    throw e3fuse::Error("--nodes, --edges-per-node and --repeats >= 1, --warmup >= 0");
  return o;
}

// f(d1, d3) with both as compile-time constants.
template <class F>
void with_dims(int d1, int d3, F&& f) {
  auto inner = [&](auto D1) {
    switch (d3) {
      case 1:
        return f(D1, std::integral_constant<int, 1>{});
      case 3:
        return f(D1, std::integral_constant<int, 3>{});
      case 5:
        return f(D1, std::integral_constant<int, 5>{});
      default:
        return f(D1, std::integral_constant<int, 7>{});
    }
  };
  switch (d1) {
    case 1:
      return inner(std::integral_constant<int, 1>{});
    case 3:
      return inner(std::integral_constant<int, 3>{});
    case 5:
      return inner(std::integral_constant<int, 5>{});
    default:
      return inner(std::integral_constant<int, 7>{});
  }
}

std::string run_shape(const Options& o, int d1, int d3, e3fuse_micro::DeviceStream& device) {
  const int64_t edges = static_cast<int64_t>(o.nodes) * o.edges_per_node;
  const int groups = o.mul / 32;
  const auto x = e3fuse_micro::random_rows<float>(o.nodes, d1 * o.mul, 1);
  const auto grad = e3fuse_micro::random_rows<float>(o.nodes, d3 * o.mul, 2);
  const auto rows = e3fuse_micro::random_rows<float>(kRowPool, d1 * d3 * 4, 3);
  const auto w = e3fuse_micro::random_rows<float>(edges, o.mul, 4);
  const auto dw_dr = e3fuse_micro::random_rows<float>(edges, o.mul, 5);
  const auto unit = e3fuse_micro::random_rows<float>(edges, 4, 6);
  // receivers near the sender (a neighborhood in a spatially sorted list)
  std::vector<int> receiver(static_cast<size_t>(edges));
  for (int64_t e = 0; e < edges; ++e) {
    const int64_t k = e / o.edges_per_node;
    const int64_t offset = static_cast<int64_t>(e3fuse_micro::splitmix64(7 + e) % 257) - 128;
    receiver[e] = static_cast<int>(((k + offset) % o.nodes + o.nodes) % o.nodes);
  }
  DeviceArray<float> dx, dgrad, drows, dw, ddw, dunit, dgx, dforce;
  DeviceArray<int> drecv;
  dx.upload(x);
  dgrad.upload(grad);
  drows.upload(rows);
  dw.upload(w);
  ddw.upload(dw_dr);
  dunit.upload(unit);
  drecv.upload(receiver);
  dgx.resize(x.size());
  dforce.resize(static_cast<size_t>(edges * groups * 3));
  Inputs in{o.nodes,    o.edges_per_node, o.mul,        d1,           d3,
            dx.data(),  dgrad.data(),     drecv.data(), drows.data(), dw.data(),
            ddw.data(), dunit.data(),     dgx.data(),   dforce.data()};

  // host reference, double, on the first tasks
  const int64_t checked_nodes = std::min<int64_t>(o.nodes, 64);
  std::vector<double> ref_gx(static_cast<size_t>(checked_nodes * d1 * o.mul), 0.0);
  std::vector<double> ref_force(static_cast<size_t>(checked_nodes * o.edges_per_node * groups * 3));
  for (int64_t k = 0; k < checked_nodes; ++k)
    for (int64_t e = k * o.edges_per_node; e < (k + 1) * o.edges_per_node; ++e)
      for (int grp = 0; grp < groups; ++grp) {
        double f[3] = {0.0, 0.0, 0.0};
        for (int u = 32 * grp; u < 32 * grp + 32; ++u) {
          const double wu = w[e * o.mul + u];
          double dw_u = 0.0;
          for (int a = 0; a < d1; ++a) {
            const double sx = x[k * d1 * o.mul + a * o.mul + u];
            double mk[4] = {0.0, 0.0, 0.0, 0.0};
            for (int q = 0; q < d3; ++q) {
              const double gq =
                  grad[static_cast<int64_t>(receiver[e]) * d3 * o.mul + q * o.mul + u];
              for (int c = 0; c < 4; ++c)
                mk[c] += rows[((e % kRowPool) * d1 * d3 + a * d3 + q) * 4 + c] * gq;
            }
            ref_gx[k * d1 * o.mul + a * o.mul + u] += wu * mk[0];
            dw_u += sx * mk[0];
            for (int c = 0; c < 3; ++c) f[c] += wu * sx * mk[c + 1];
          }
          for (int c = 0; c < 3; ++c) f[c] += dw_u * dw_dr[e * o.mul + u] * unit[4 * e + c];
        }
        for (int c = 0; c < 3; ++c) ref_force[(e * groups + grp) * 3 + c] = f[c];
      }

  const unsigned blocks =
      static_cast<unsigned>((o.nodes * static_cast<int64_t>(groups) + kWarps - 1) / kWarps);
  const size_t smem = sizeof(float) * kWarps * d1 * d3 * 4;
  const size_t smem_planar = sizeof(float) * kWarps * (d1 * ((d3 + 3) / 4 * 4) + 4 * d1 * d3);
  std::ostringstream out;
  out << "{\"d1\": " << d1 << ", \"d3\": " << d3 << ", \"nodes\": " << o.nodes
      << ", \"edges\": " << edges << ", \"mul\": " << o.mul;
  for (const std::string variant : {"fma", "tc", "tc_force"}) {
    auto launch = [&]() {
      with_dims(d1, d3, [&](auto D1, auto D3) {
        constexpr int A = decltype(D1)::value, B = decltype(D3)::value;
        if (variant == "tc")
          tc_backward_kernel<A, B><<<blocks, kThreads, smem, device.stream>>>(in);
        else if (variant == "tc_force")
          tc_force_backward_kernel<A, B><<<blocks, kThreads, smem_planar, device.stream>>>(in);
        else
          fma_backward_kernel<A, B><<<blocks, kThreads, smem, device.stream>>>(in);
      });
    };
    const std::vector<double> ms =
        e3fuse_micro::time_launches(o.warmup, o.repeats, device.stream, launch);
    const e3fuse_micro::ProbeErrors err =
        e3fuse_micro::check_outputs(ref_gx, dgx, ref_force, dforce);
    const double median = e3fuse_micro::median(ms);
    std::fprintf(stderr,
                 "d1 %d d3 %d %-3s %8.3f ms  grad_x err %.2e (of %.2e)  force err %.2e (of %.2e)\n",
                 d1, d3, variant.c_str(), median, err.grad_x_err, err.grad_x_max, err.force_err,
                 err.force_max);
    out << ", \"" << variant << "\": {\"median_ms\": " << median
        << ", \"ms\": " << e3fuse_micro::json_list(ms) << ", \"grad_x_err\": " << err.grad_x_err
        << ", \"grad_x_max\": " << err.grad_x_max << ", \"force_err\": " << err.force_err
        << ", \"force_max\": " << err.force_max << "}";
  }
  out << "}";
  return out.str();
}

int run(const Options& o) {
  e3fuse_micro::DeviceStream device;
  std::vector<std::pair<int, int>> shapes;
  for (int d1 : {1, 3, 5, 7})
    for (int d3 : {1, 3, 5, 7})
      if ((o.d1 == 0 && o.d3 == 0) || (d1 == o.d1 && d3 == o.d3)) shapes.emplace_back(d1, d3);
  std::ostringstream json;
  json << "{\"benchmark\": \"tc_backward_micro\", \"gpu\": \"" << device.prop.name
       << "\", \"shapes\": [";
  for (size_t i = 0; i < shapes.size(); ++i)
    json << (i ? ",\n  " : "\n  ") << run_shape(o, shapes[i].first, shapes[i].second, device);
  json << "\n]}\n";
  e3fuse_micro::emit_json(json.str(), o.json_out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return e3fuse_micro::probe_main("e3fuse_tc_backward_micro", argc, argv, parse, run);
}
