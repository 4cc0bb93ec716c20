// cuda/conv_kernels.cuh: the convolution's kernels and launch helpers (see conv.cuh for
// the scheme; the math is cpu/conv.cpp's, the per-edge pieces are ops/*.h), and
// conv_backward's definition. Included by conv.cu (set-up, forward) and by
// conv_backward_f32.cu / conv_backward_f64.cu, which instantiate the backward each in a
// translation unit of its own, and conv_backward_split_f32.cu (the float kernels that split
// rows, RowSplit): the backward kernels are most of the build, and separate units build in
// parallel.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

#include "cuda/conv.cuh"
#include "cuda/mma_tf32.cuh"
#include "cuda/warp_sum.cuh"
#include "ops/activation.h"
#include "ops/radial.h"
#include "ops/radial_table.h"
#include "ops/wigner3j_table.h"

namespace e3fuse::cuda {

namespace {

constexpr int kWarps = kConvWarps;
constexpr int kThreads = 32 * kWarps;
constexpr unsigned kFullMask = 0xffffffffu;

// Byte offsets of one block's shared-memory workspace (same function on host and device).
struct Smem {
  size_t edge, sender, vec, u, Y, emb, demb, h0, h1, pre, act, wts, M, K, acc, part, red, total;
  size_t interval, local_t;  // radial table: each edge's interval and t
};

E3F_HD size_t align16(size_t x) { return (x + 15) & ~size_t(15); }

// Whether the forward tensor product runs from the compile-time Wigner 3j entries
// (tp_forward_task) instead of the per-edge M table: with a radial table (the float32
// kernels) and input features up to l = 1, or with scalar outputs only. Since
// the M rows are read 16 bytes at a time (31d74fb), M is faster for the layers with l >= 2
// inputs and l >= 1 outputs, the Wigner 3j entries for the others; H100, float32, forward
// ms per layer at 32,000 Cu atoms (benchmarks/results/conv_forward_rows_h100/), entries
// against M: SevenNet-0 layers 1-3 4.41 against 3.81 (864 atoms 0.132 against 0.140),
// layer 0 1.43 against 1.65, layer 4 1.16 against 1.22; MACE-MP-0 medium layer 0 3.16
// against 3.94, layer 1 8.46 against 8.61; SevenNet-l3i5 layer 4 1.33 against 1.52
// (benchmarks/results/conv_scalar_ahead/). With l = 3 inputs and outputs (SevenNet-l3i5 layers 1-3)
// M was faster already with one load per entry (benchmarks/results/sparse_cg_*).
template <class View>
E3F_HD bool sparse_forward(const View& c) {
  return c.sparse_cg && c.table != nullptr && (c.max_d1 <= 3 || c.max_d3 == 1);
}

// Whether the float32 backward runs its tensor product from the compile-time Wigner 3j
// entries (tp_backward_edge_sparse) instead of the per-edge {M, K} rows: no rows are built,
// and the angular force goes through dE/dY (3 d2 multiply-adds per lane and path where the
// K contraction then took 3 d1 d3 per channel, now 2 d1 d3 in the edge's frame). Only in
// layers whose inputs or outputs are all scalars (the first and last of SevenNet, the first
// of MACE). H200, backward ms at 32,000 atoms, {M, K} -> sparse
// (benchmarks/results/sparse_backward/, before the edge's frame): SevenNet-l3i5 layer 0 3.31
// -> 3.12, layer 4 2.69 -> 2.60; SevenNet-0 2.50 -> 2.40, 2.19 -> 2.05; MACE-MP-0 medium
// layer 0 5.82 -> 5.47 (864 atoms 6-16 % less). In the other layers it lost: SevenNet-l3i5's
// layers 1-3 38.2 -> 110.8 ms each (864 atoms 1.11 -> 2.03), SevenNet-0's 10.8 -> 18.8,
// MACE's layer 1 19.4 -> 20.3; there its kernels' code grows (one body per (l1, l2, l3):
// 214 -> 263 KB of SASS for l = 3 inputs), in the scalar kernels it does not.
template <class T, class View>
E3F_HD bool sparse_backward(const View& c) {
  return std::is_same_v<T, float> && c.sparse_cg && c.table != nullptr &&
         (c.max_d1 == 1 || c.max_d3 == 1);
}

template <class T>
E3F_HD Smem smem_layout(const typename Conv<T>::View& c, int sh_dim, int num_basis, int ec,
                        bool backward) {
  Smem s{};
  size_t o = 0;
  auto take = [&](size_t bytes) {
    const size_t at = o;
    o = align16(o + bytes);
    return at;
  };
  const size_t t = sizeof(T);
  const int hidden_layers = c.mlp_layers - 1;
  // With a radial table there is no MLP workspace; without one, no per-edge interval.
  const bool mlp = c.table == nullptr;
  auto take_if = [&](bool needed, size_t bytes) { return take(needed ? bytes : 0); };
  s.edge = take(sizeof(int64_t) * ec);
  s.sender = take(sizeof(int) * ec);
  s.interval = take_if(!mlp, sizeof(int) * ec);
  s.local_t = take_if(!mlp, t * ec);
  // the backward's {Y, dY/dv} per component, 16 bytes (float) that contract_entry reads at once
  s.Y = take(t * ec * sh_dim * (backward ? 4 : 1));
  // each edge's vector and {unit vector, length}: the spherical harmonics read them
  s.vec = take(t * ec * 3);
  s.u = take(t * ec * 4);
  s.h0 = take_if(mlp, t * ec * c.max_hidden);
  s.h1 = take_if(mlp, t * ec * c.max_hidden);
  s.wts = take_if(mlp, t * ec * c.weight_numel);
  s.M = take_if(!backward && !sparse_forward(c), t * ec * c.m_stride_fwd);
  if (!backward) {
    s.acc = take(t * c.dim_out);
  } else {
    s.emb = take_if(mlp, t * ec * num_basis);
    s.demb = take_if(mlp, t * ec * num_basis);
    s.pre = take_if(mlp, t * ec * c.max_hidden * (hidden_layers > 0 ? hidden_layers : 1));
    s.act = take_if(mlp, t * ec * c.max_hidden * (hidden_layers > 0 ? hidden_layers : 1));
    s.K =
        take_if(!sparse_backward<T>(c), t * ec * c.m_per_edge * 4);  // {M, K_1, K_2, K_3} per entry
    s.acc = take(t * c.gx_slots);
    // each warp's per-edge force partials during the tensor product [EC][3][kWarps],
    // then (MLP only) the MLP adjoint's partial sums in the same space
    size_t part_cols = 3 * kWarps;
    if (mlp) {
      const size_t cpt = t == 4 ? 4 : 2;  // backward_cpt<T>()
      // the tensor-core adjoint's kWarps partial sums [EC][K], or the SIMT one's partial rows
      const bool tensor_cores = t == 4 && ec % 8 == 0 && c.frag_bwd[0] != nullptr;
      part_cols = std::max(
          part_cols, tensor_cores ? static_cast<size_t>(kWarps) * c.max_hidden
                                  : std::max(static_cast<size_t>(c.max_hidden), kThreads * cpt));
    }
    s.part = take(t * ec * part_cols);
    // per edge of the chunk its force summed over the threads, then node k's force and
    // virial sums [3 + 9]
    s.red = take(sizeof(double) * (3 * ec + 12));
  }
  s.total = o;
  return s;
}

// ---------------------------------------------------------------------------
// Edges of one receiver, taken EC at a time (only those inside the cutoff).

__device__ inline void edge_vector(const GraphView& g, int64_t i, int64_t e, double v[3]) {
  const int64_t j = g.neighbors[e];
  for (int a = 0; a < 3; ++a) v[a] = g.positions[3 * j + a] - g.positions[3 * i + a];
  if (g.shift_index) {
    const double* s = g.shifts + 3 * static_cast<int64_t>(g.shift_index[e]);
    for (int a = 0; a < 3; ++a) v[a] += s[a];
  }
}

// Warp 0 fills s_edge[0..count) with the next edges of row i inside the cutoff whose
// neighbor is below neighbor_end, in list order, starting at *pos; returns count through
// *count. Block-wide sync after.
template <int EC>
__device__ void take_chunk(const GraphView& g, int64_t i, double cutoff2, int64_t neighbor_end,
                           int64_t end, int64_t* pos, int* count, int64_t* s_edge,
                           int64_t* error_node) {
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int64_t p = *pos;
    int filled = 0;
    while (filled < EC && p < end) {
      const int64_t e = p + lane;
      bool ok = false;
      if (e < end) {
        double v[3];
        edge_vector(g, i, e, v);
        const double r2 = v[0] * v[0] + v[1] * v[1] + v[2] * v[2];
        ok = r2 < cutoff2 && g.neighbors[e] < neighbor_end;
        if (r2 == 0.0) {
          ok = false;
          atomicMax(reinterpret_cast<unsigned long long*>(error_node),
                    static_cast<unsigned long long>(i + 1));
        }
      }
      const unsigned mask = __ballot_sync(kFullMask, ok);
      const int need = EC - filled;
      const int rank = __popc(mask & ((1u << lane) - 1u));
      if (ok && rank < need) s_edge[filled + rank] = e;
      const int found = __popc(mask);
      if (found > need) {  // stop right after the need-th edge found
        const unsigned last = __ballot_sync(kFullMask, ok && rank == need - 1);
        p += __ffs(last);
        filled = EC;
      } else {
        p += 32;
        filled += found;
      }
    }
    if (lane == 0) {
      *pos = p < end ? p : end;
      *count = filled;
    }
  }
  __syncthreads();
}

// This block's graph row and the part of its neighbor list it walks, [begin, end): all of
// it, or for a row at or past split.from (RowSplit) the first (half 0) or second half (half
// 1). False: nothing to do (the idle second block of a whole listed row).
__device__ inline bool block_row(const GraphView& g, const int32_t* rows, const RowSplit& split,
                                 int64_t* row, int* half, int64_t* begin, int64_t* end) {
  const int64_t b = blockIdx.x;
  *half = -1;
  if (rows && split.listed) {
    *row = rows[b / 2];
    if (*row >= split.from)
      *half = static_cast<int>(b % 2);
    else if (b % 2 == 1)
      return false;
  } else if (rows) {
    *row = rows[b];
  } else if (b < split.from) {
    *row = b;
  } else {
    *row = split.from + (b - split.from) / 2;
    *half = static_cast<int>((b - split.from) % 2);
  }
  *begin = g.row_offsets[*row];
  *end = g.row_offsets[*row + 1];
  if (*half >= 0) {
    const int64_t middle = *begin + (*end - *begin) / 2;
    (*half == 0 ? *end : *begin) = middle;
  }
  return true;
}

// With two blocks per row, called by every thread of both once their sums are final:
// false in the first to get here (it stores its sums, then publish_row_part), true in the
// second, which returns once the first's stores are visible (it adds its own to them, then
// release_row_part). The second waits only on a block that has finished its walk, so the
// wait ends.
__device__ inline bool finishes_second(int* state) {
  __shared__ int s_order;
  __syncthreads();
  if (threadIdx.x == 0) s_order = atomicAdd(state, 1);
  __syncthreads();
  if (s_order == 0) return false;
  if (threadIdx.x == 0) {
    while (atomicAdd(state + 1, 0) == 0) {
    }
    __threadfence();
  }
  __syncthreads();
  return true;
}

// The first block's end: its stores made visible, then flagged (finishes_second).
__device__ inline void publish_row_part(int* state) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) atomicExch(state + 1, 1);
}

// The second block's end: the row's state back to zero for the next launch.
__device__ inline void release_row_part(int* state) {
  if (threadIdx.x == 0) {
    state[0] = 0;
    state[1] = 0;
  }
}

// Component m of the spherical harmonics of the unit vector (or the raw vector when
// !normalize) and, if J is given, J[a] = dY_m/dv_a (projected onto the sphere, see ops/sh.h);
// inv_r = 1 / |v|.
template <class T>
__device__ void edge_sh_component(const typename Geometry<T>::View& geo, int m, const T v[3],
                                  const T u[3], T inv_r, T* Y, T* J) {
  const T* p = geo.normalize ? u : v;
  T pw[3][8];
  for (int a = 0; a < 3; ++a) {
    pw[a][0] = T(1);
    for (int k = 1; k <= geo.lmax && k < 8; ++k) pw[a][k] = pw[a][k - 1] * p[a];
  }
  T y = 0, gx = 0, gy = 0, gz = 0;
  for (int t = geo.term_begin[m]; t < geo.term_begin[m + 1]; ++t) {
    const int packed = geo.exps[t];
    const int e0 = packed & 255, e1 = (packed >> 8) & 255, e2 = (packed >> 16) & 255;
    const T c = geo.sh_coeffs[t];
    y += c * pw[0][e0] * pw[1][e1] * pw[2][e2];
    if (J) {
      if (e0) gx += c * T(e0) * pw[0][e0 - 1] * pw[1][e1] * pw[2][e2];
      if (e1) gy += c * T(e1) * pw[0][e0] * pw[1][e1 - 1] * pw[2][e2];
      if (e2) gz += c * T(e2) * pw[0][e0] * pw[1][e1] * pw[2][e2 - 1];
    }
  }
  *Y = y;
  if (!J) return;
  if (geo.normalize) {
    const T qu = gx * u[0] + gy * u[1] + gz * u[2];
    J[0] = (gx - qu * u[0]) * inv_r;
    J[1] = (gy - qu * u[1]) * inv_r;
    J[2] = (gz - qu * u[2]) * inv_r;
  } else {
    J[0] = gx;
    J[1] = gy;
    J[2] = gz;
  }
}

// The backward's edge frame (t1, t2, u): two unit vectors orthogonal to the edge's unit vector
// u and to each other, a function of u alone, so that every thread that needs it gets the same
// bits (Duff et al., "Building an orthonormal basis, revisited", JCGT 6(1), 2017; stable for
// every u). The backward works with the spherical harmonics' gradients and the edge forces in
// this frame: there the angular part of an edge's force has only the t1 and t2 components when
// Y depends on u alone, and a u component fixed by Y itself otherwise (tp_backward_edge).
template <class T>
__device__ __forceinline__ void edge_frame(const T u[3], T t1[3], T t2[3]) {
  const T sign = u[2] < T(0) ? T(-1) : T(1);
  const T a = T(-1) / (sign + u[2]);
  const T b = u[0] * u[1] * a;
  t1[0] = T(1) + sign * u[0] * u[0] * a;
  t1[1] = sign * b;
  t1[2] = -sign * u[0];
  t2[0] = b;
  t2[1] = sign + u[1] * u[1] * a;
  t2[2] = -u[1];
}

// Geometry of the chunk's edges, in two steps with a block-wide sync between them: thread
// t < n takes edge t (vector, length, neighbor, table interval or MLP embedding), then
// thread q < n sh_dim takes component q % sh_dim of edge q / sh_dim's spherical harmonics
// (each component's sum in the same order as one thread for all: the same bits): Y[e][m],
// or with sh_gradient (backward) Y[e][m][4] = {Y, dY/dv . t1, dY/dv . t2, dY/dv . u} in the
// edge's frame (edge_frame); with normalize, Y depends on u alone and dY/dv . u is 0.
// vec[3 e + a]: the edge vector; unit[4 e + a]: its unit vector, unit[4 e + 3] 1 / length.
// Rows past n of the MLP input are zeroed so the chunk GEMM reads defined values.
// With a radial table (c.table), emb is null and each edge's table interval and local
// coordinate go to s_interval and s_t instead; receiver_is_i: node i receives the chunk's
// messages (forward), else it sends them (backward), which orders the species pair.
// PER_EDGE: the table is the per-edge array of the non-linear block's exact RadialMLP
// (conv.cuh), whose entry of edge e is interval e at t = 0 (its pair already chosen).
template <class T, bool PER_EDGE = false>
__device__ void chunk_geometry(const typename Geometry<T>::View& geo,
                               const typename Conv<T>::View& c, const GraphView& g, int64_t i,
                               int n, int ec, const int64_t* s_edge, int* s_sender, T* Y, T* emb,
                               int emb_stride, bool sh_gradient, T* demb, T* vec, T* unit,
                               int* s_interval, T* s_t, bool receiver_is_i) {
  const int t = threadIdx.x;
  if (t < n) {
    const int64_t e = s_edge[t];
    double v[3];
    edge_vector(g, i, e, v);
    const double r = sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
    s_sender[t] = g.neighbors[e];
    for (int a = 0; a < 3; ++a) {
      vec[3 * t + a] = static_cast<T>(v[a]);
      unit[4 * t + a] = static_cast<T>(v[a] / r);
    }
    unit[4 * t + 3] = static_cast<T>(1.0 / r);
    if (!emb) {
      if constexpr (PER_EDGE) {
        s_interval[t] = static_cast<int>(e);  // conv_forward / conv_backward check E < 2^31
        s_t[t] = T(0);
      } else {
        int iv = 0;
        double x = 0.0;
        ops::radial_table_locate(r, c.table_origin, c.table_inv_step, c.table_intervals,
                                 c.table_fine_intervals, c.table_coarse_shift, iv, x);
        if (c.pair_slot) {  // the table of the message's (receiver, sender) species pair
          const int si = g.species[i], sj = g.species[s_sender[t]];
          const int pair = receiver_is_i ? si * c.num_species + sj : sj * c.num_species + si;
          iv += c.pair_slot[pair] * c.table_intervals;
        }
        s_interval[t] = iv;
        s_t[t] = static_cast<T>(x);
      }
    } else {
      // The embedding in double whatever T is (as on the CPU: accurate near the cutoff).
      double b[kMaxBasis], db[kMaxBasis];
      if (geo.mace_embedding) {  // apply_cutoff false is refused with the MLP (engine_cuda.cu)
        const double r0 = geo.pair_r0
                              ? geo.pair_r0[g.species[i] * geo.num_species + g.species[s_sender[t]]]
                              : 1.0;
        double f = 1.0, df = 0.0;
        ops::mace_edge_embedding<double>(geo.num_basis, geo.coeffs, geo.prefactor, geo.envelope,
                                         geo.transform, geo.apply_cutoff, r, r0, b,
                                         demb ? db : nullptr, f, df);
      } else {
        ops::edge_embedding<double>(geo.num_basis, geo.coeffs, geo.prefactor, geo.envelope, r, b,
                                    demb ? db : nullptr);
      }
      for (int k = 0; k < geo.num_basis; ++k) {
        emb[t * emb_stride + k] = static_cast<T>(b[k]);
        if (demb) demb[t * geo.num_basis + k] = static_cast<T>(db[k]);
      }
    }
  } else if (t < ec && emb) {
    for (int k = 0; k < emb_stride; ++k) emb[t * emb_stride + k] = T(0);
  }
  __syncthreads();
  for (int q = t; q < n * geo.sh_dim; q += blockDim.x) {
    const int e = q / geo.sh_dim, m = q - e * geo.sh_dim;
    if (!sh_gradient) {
      edge_sh_component<T>(geo, m, vec + 3 * e, unit + 4 * e, unit[4 * e + 3], Y + q, nullptr);
      continue;
    }
    T J[3], t1[3], t2[3];
    const T* u = unit + 4 * e;
    edge_sh_component<T>(geo, m, vec + 3 * e, u, unit[4 * e + 3], Y + 4 * q, J);
    edge_frame<T>(u, t1, t2);
    Y[4 * q + 1] = J[0] * t1[0] + J[1] * t1[1] + J[2] * t1[2];
    Y[4 * q + 2] = J[0] * t2[0] + J[1] * t2[1] + J[2] * t2[2];
    Y[4 * q + 3] = geo.normalize ? T(0) : J[0] * u[0] + J[1] * u[1] + J[2] * u[2];
  }
}

// Where weight w of edge e (interval iv) sits in the table.
template <class T>
__device__ __forceinline__ const T* table_entry(const typename Conv<T>::View& c, int iv, int w) {
  return c.table + (static_cast<size_t>(iv) * c.weight_numel + w) * 4;
}

// The register-blocked tile of the chunk GEMMs: for columns c = c0 + j * cstride
// (j < CPT, c < ncols) and the chunk's EC rows,
//   out[e * out_stride + c] = sum_{r0 <= r < r1} in[e * in_stride + r] * W[r * ncols + c].
// Every thread keeps CPT x EC accumulators, so one shared-memory read of in[e][r]
// feeds CPT multiply-adds (columns stay coalesced across the warp).
template <class T, int EC, int CPT>
__device__ void gemm_tile(const T* in, int in_stride, const T* __restrict__ W, int r0, int r1,
                          int c0, int cstride, int ncols, T* out, int out_stride) {
  T acc[CPT][EC];
#pragma unroll
  for (int j = 0; j < CPT; ++j)
#pragma unroll
    for (int e = 0; e < EC; ++e) acc[j][e] = T(0);
  for (int r = r0; r < r1; ++r) {
    T w[CPT];
#pragma unroll
    for (int j = 0; j < CPT; ++j) {
      const int col = c0 + j * cstride;
      w[j] = col < ncols ? __ldg(W + static_cast<size_t>(r) * ncols + col) : T(0);
    }
#pragma unroll
    for (int e = 0; e < EC; ++e) {
      const T h = in[e * in_stride + r];
#pragma unroll
      for (int j = 0; j < CPT; ++j) acc[j][e] += h * w[j];
    }
  }
#pragma unroll
  for (int j = 0; j < CPT; ++j) {
    const int col = c0 + j * cstride;
    if (col < ncols)
#pragma unroll
      for (int e = 0; e < EC; ++e) out[e * out_stride + col] = acc[j][e];
  }
}

// out[e][col] = sum_k in[e][k] W[k][col] for the chunk's EC rows (a small GEMM;
// each weight is read once per chunk), CPT columns per thread.
template <class T, int EC, int CPT>
__device__ void chunk_gemm_blocked(const T* in, int K, const T* __restrict__ W, int N, T* out) {
  const int B = blockDim.x;
  for (int c0 = threadIdx.x; c0 < N; c0 += B * CPT)
    gemm_tile<T, EC, CPT>(in, K, W, 0, K, c0, B, N, out, N);
}

template <class T, int EC>
__device__ void chunk_gemm(const T* in, int K, const T* __restrict__ W, int N, T* out) {
  const int B = blockDim.x;
  if (N > 2 * B)
    chunk_gemm_blocked<T, EC, 4>(in, K, W, N, out);
  else if (N > B)
    chunk_gemm_blocked<T, EC, 2>(in, K, W, N, out);
  else
    chunk_gemm_blocked<T, EC, 1>(in, K, W, N, out);
}

// out[e][n] = sum_k in[e][k] W_l[k][n] for MLP layer l: on the tensor cores
// (3xTF32) in float32 when the weights were laid out for them, else FMAs.
template <class T, int EC>
__device__ void mlp_layer_product(const typename Conv<T>::View& c, int l, const T* in, T* out) {
#ifdef E3FUSE_HAVE_MMA_TF32
  if constexpr (std::is_same_v<T, float> && EC % 8 == 0) {
    if (c.frag_fwd[l]) {
      chunk_gemm_tf32<EC, kWarps>(in, c.dims[l], c.frag_fwd[l], c.dims[l + 1], out);
      return;
    }
  }
#endif
  chunk_gemm<T, EC>(in, c.dims[l], c.w[l], c.dims[l + 1], out);
}

// Radial MLP forward over the chunk: weights into wts [EC][numel]. In the backward
// pass pre/act [layer][EC][H] keep every hidden layer.
template <class T, int EC>
__device__ void chunk_mlp_forward(const typename Conv<T>::View& c, T* emb, T* h0, T* h1, T* wts,
                                  T* pre, T* act) {
  const T* in = emb;
  const int stride = EC * c.max_hidden;
  for (int l = 0; l < c.mlp_layers; ++l) {
    const int N = c.dims[l + 1];
    if (l + 1 == c.mlp_layers) {
      mlp_layer_product<T, EC>(c, l, in, wts);
    } else {
      T* p = pre ? pre + l * stride : (in == h0 ? h1 : h0);
      T* a = act ? act + l * stride : p;
      mlp_layer_product<T, EC>(c, l, in, p);
      __syncthreads();
      for (int q = threadIdx.x; q < EC * N; q += blockDim.x)
        a[q] = ops::activation(c.act, p[q]) * c.act_scale;
      in = a;
    }
    __syncthreads();
  }
}

// Four consecutive values from shared memory (16-byte aligned): one vector load.
template <class T>
__device__ __forceinline__ void load4_shared(const T* p, T v[4]) {
  if constexpr (std::is_same_v<T, float>) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    v[0] = a.x;
    v[1] = a.y;
    v[2] = a.z;
    v[3] = a.w;
  } else {
    const double2 a = reinterpret_cast<const double2*>(p)[0];
    const double2 b = reinterpret_cast<const double2*>(p)[1];
    v[0] = a.x;
    v[1] = a.y;
    v[2] = b.x;
    v[3] = b.y;
  }
}

// Entry me of the chunk's edges e, e + step, ... below n: M[e][out] = sum_t w[t] Y[e][y[t]]
// over the column's nonzero coefficients (Conv::MEntry), or with GRADIENT the backward's
// MK[e][out] = {M, K_1, K_2, K_3}, K_a the same sum of dY[e][b]/dv along axis a of the edge's
// frame (t1, t2, u), from Y[e][b][4] (chunk_geometry), read by one 16-byte (float) load per
// (a, q) in tp_backward_edge, which uses K_1 and K_2. Summed over every b, these terms were
// among zeros (the same values). H200, all layers at 32,000 atoms, every b -> nonzero terms
// (benchmarks/results/sparse_columns/): SevenNet-l3i5's forward 41.52 -> 39.13 ms (611 of
// its 3,436 coefficients are nonzero), SevenNet-0's backward 36.89 -> 35.34, MACE-MP-0
// medium's backward 24.83 -> 24.03 (864 atoms 2-7 % less); not in the l = 3 backward
// (dense_columns).
template <class T, bool GRADIENT>
__device__ __forceinline__ void contract_entry(const typename Conv<T>::View& c,
                                               const typename Conv<T>::MEntry& me, int e, int step,
                                               int n, int sh_dim, const T* Y, T* M) {
  constexpr int R = GRADIENT ? 4 : 1;  // values per component of Y and per entry of M
  constexpr int inline_terms = Conv<T>::kInlineTerms;
  for (; e < n; e += step) {
    const T* Ye = Y + R * e * sh_dim;
    T s[R] = {};
    auto add = [&](T w, int y) {
      if constexpr (GRADIENT) {
        T v[4];
        load4_shared(Ye + 4 * y, v);
#pragma unroll
        for (int r = 0; r < 4; ++r) s[r] += w * v[r];
      } else {
        s[0] += w * Ye[y];
      }
    };
    add(me.w[0], me.y[0]);
    if (me.terms > 1) add(me.w[1], me.y[1]);
    for (int t = inline_terms; t < me.terms; ++t)
      add(c.extra_w[me.extra + t - inline_terms], c.extra_y[me.extra + t - inline_terms]);
    T* out = M + R * (e * (GRADIENT ? c.m_per_edge : c.m_stride_fwd) + me.out);
#pragma unroll
    for (int r = 0; r < R; ++r) out[r] = s[r];
  }
}

// M (forward) or MK (backward, GRADIENT) for the chunk's n edges (contract_entry): the stored
// entries only, the others stay the zeros of zero_contracted_rows. Thread t takes the stored
// entries m = t, t + blockDim, ... and, when the entries are fewer than half the threads, one
// of blockDim / entries groups of the edges: the entry's bookkeeping is paid once per group,
// not once per edge. The sums are the ones each entry had when a thread took one (edge,
// entry) pair (same order: same bits).
// The forward takes the entries in contraction_order, the backward in path order. Measured
// with both in contraction_order against both in path order (H100, 32,000 atoms, all layers,
// benchmarks/results/conv_order_h100/): SevenNet-l3i5's forward 48.86 -> 46.59 ms (864 atoms
// 1.383 -> 1.310), but its backward 129.56 -> 134.34 ms (864 atoms 3.737 -> 3.539);
// SevenNet-0's backward 39.80 -> 38.74.
template <class T, bool GRADIENT>
__device__ void chunk_contract_sh(const typename Conv<T>::View& c, int n, int sh_dim, const T* Y,
                                  T* M) {
  const int entries = GRADIENT ? c.m_columns : c.m_columns_fwd;
  if (entries == 0) return;
  const int groups = max(1, static_cast<int>(blockDim.x) / entries);
  for (int q = threadIdx.x; q < groups * entries; q += blockDim.x) {
    const int group = q / entries, m = q - group * entries;
    const typename Conv<T>::MEntry me = GRADIENT ? c.m_entries[m] : c.m_entries_balanced[m];
    contract_entry<T, GRADIENT>(c, me, group, groups, n, sh_dim, Y, M);
  }
}

// The backward kernels compiled for l = 3 inputs (MAX_D1 = 7: the float32 table kernel of
// layers with l = 3 inputs, and the float64 and radial-MLP kernels of every layer) build
// their {M, K} rows from every coefficient of each column (Conv::DenseEntry), zeros
// included. With the nonzero ones only (chunk_contract_sh), SevenNet-l3i5's layer-1
// backward executed 6.5 % fewer instructions but waited for them: "no instruction" stalls
// 1.67 -> 4.14 cycles per issue (ncu, H200, 32,000 atoms), and its layers 1-3 took
// 37.7 -> 44.8 ms each (864 atoms 1.10 -> 1.05). The float32 table kernels of the other
// layers were faster with the nonzero terms (benchmarks/results/sparse_columns/).
template <int MAX_D1>
constexpr bool dense_columns() {
  return MAX_D1 == 7;
}

// Entry me of the chunk's edges e, e + step, ... below n: MK[e][out] = {M, K_x, K_y, K_z}
// summed over every b of the column, which stays in registers for all its edges; D2 = d2
// (1, 3, 5, 7), or 0: d2 at run time (spherical harmonics above l = 3).
template <class T, int D2>
__device__ __forceinline__ void contract_dense_entry(const typename Conv<T>::View& c,
                                                     const typename Conv<T>::DenseEntry& me, int e,
                                                     int step, int n, int sh_dim, const T* Y,
                                                     T* M) {
  const T* cg = c.cg + me.cg_base;
  T column[D2 > 0 ? D2 : 1];
  if constexpr (D2 > 0) {
#pragma unroll
    for (int b = 0; b < D2; ++b) column[b] = cg[b * me.d3];
  }
  auto weight = [&](int b) {
    if constexpr (D2 > 0)
      return column[b];
    else
      return cg[b * me.d3];
  };
  const int d2 = D2 > 0 ? D2 : me.d2;
  for (; e < n; e += step) {
    const int q = e * c.m_per_edge + me.out;
    const int y0 = e * sh_dim + me.sh_offset;
    T s = T(0), k0 = T(0), k1 = T(0), k2 = T(0);
#pragma unroll
    for (int b = 0; b < (D2 > 0 ? D2 : d2); ++b) {
      T v[4];
      load4_shared(Y + 4 * (y0 + b), v);
      const T w = weight(b);
      s += w * v[0];
      k0 += w * v[1];
      k1 += w * v[2];
      k2 += w * v[3];
    }
    M[4 * q] = s;
    M[4 * q + 1] = k0;
    M[4 * q + 2] = k1;
    M[4 * q + 3] = k2;
  }
}

// chunk_contract_sh's backward with DenseEntry: every one of the m_per_edge entries.
template <class T>
__device__ void chunk_contract_dense(const typename Conv<T>::View& c, int n, int sh_dim, const T* Y,
                                     T* M) {
  const int entries = c.m_per_edge;
  if (entries == 0) return;
  const int groups = max(1, static_cast<int>(blockDim.x) / entries);
  for (int q = threadIdx.x; q < groups * entries; q += blockDim.x) {
    const int group = q / entries, m = q - group * entries;
    const typename Conv<T>::DenseEntry me = c.m_dense_entries[m];
    auto run = [&](auto d2) {
      contract_dense_entry<T, decltype(d2)::value>(c, me, group, groups, n, sh_dim, Y, M);
    };
    switch (me.d2) {
      case 1:
        run(std::integral_constant<int, 1>{});
        break;
      case 3:
        run(std::integral_constant<int, 3>{});
        break;
      case 5:
        run(std::integral_constant<int, 5>{});
        break;
      case 7:
        run(std::integral_constant<int, 7>{});
        break;
      default:
        run(std::integral_constant<int, 0>{});
        break;
    }
  }
}

// Zeroes the block's M (forward) or MK (backward, GRADIENT) rows of ec edges once: the
// entries chunk_contract_sh does not store (no nonzero coefficient) keep these zeros.
template <class T, bool GRADIENT>
__device__ void zero_contracted_rows(const typename Conv<T>::View& c, int ec, T* M) {
  const int count = GRADIENT ? 4 * ec * c.m_per_edge : ec * c.m_stride_fwd;
  for (int q = threadIdx.x; q < count; q += blockDim.x) M[q] = T(0);
}

// C consecutive values (C = 1 or 2) through the read-only path: one 4-, 8- or 16-byte
// load (p aligned to C elements).
template <class T, int C>
__device__ __forceinline__ void ldg_vec(const T* p, T v[C]) {
  static_assert(C == 1 || C == 2, "one or two channels per lane");
  if constexpr (C == 1) {
    v[0] = __ldg(p);
  } else if constexpr (std::is_same_v<T, float>) {
    const float2 a = __ldg(reinterpret_cast<const float2*>(p));
    v[0] = a.x;
    v[1] = a.y;
  } else {
    const double2 a = __ldg(reinterpret_cast<const double2*>(p));
    v[0] = a.x;
    v[1] = a.y;
  }
}

// ---------------------------------------------------------------------------
// Tensor product: warp tasks (conv.cuh); lane l takes the C = lane_channels adjacent
// channels u = task.u0 + C l .. u + C - 1.

// Calls f(std::integral_constant<int, D>{}) for an irrep dimension d = 2l + 1, l <= 3,
// so the per-channel loops below unroll over compile-time sizes. A switch, not
// with_int_constant's chain of ifs: with the chain, MACE's forward convolution measured
// 4 % slower (one run each, H100, 32,000 atoms; benchmarks/results/gpu_summary.md).
template <int MAX_D = 7, class F>
__device__ __forceinline__ void with_irrep_dim(int d, F&& f) {
  static_assert(MAX_D == 1 || MAX_D == 3 || MAX_D == 5 || MAX_D == 7,
                "irrep dimensions up to 1, 3, 5 or 7");
  if constexpr (MAX_D == 1) {
    f(std::integral_constant<int, 1>{});
  } else if constexpr (MAX_D == 3) {
    if (d == 1)
      f(std::integral_constant<int, 1>{});
    else
      f(std::integral_constant<int, 3>{});
  } else {
    switch (d) {
      case 1:
        f(std::integral_constant<int, 1>{});
        break;
      case 3:
        f(std::integral_constant<int, 3>{});
        break;
      case 5:
        if constexpr (MAX_D == 7) {
          f(std::integral_constant<int, 5>{});
          break;
        }
        [[fallthrough]];  // MAX_D == 5: one copy of f's body for d = 5
      default:
        f(std::integral_constant<int, MAX_D>{});
        break;
    }
  }
}

// f(d1, d3) with both as compile-time constants (d1 <= MAX_D1, d3 <= MAX_D3).
template <int MAX_D1 = 7, int MAX_D3 = 7, class F>
__device__ __forceinline__ void with_path_dims(int d1, int d3, F&& f) {
  with_irrep_dim<MAX_D1>(d1, [&](auto a) { with_irrep_dim<MAX_D3>(d3, [&](auto b) { f(a, b); }); });
}

// f(std::integral_constant<int, D2>{}) for a path of input dimension D1, output D3 and
// spherical-harmonics dimension d2, compiled only where the real Wigner 3j symbol
// (l1, l2, l3) has entries (ops/wigner3j_table.h): the sparse kernels' dispatch. make_conv
// admits only such paths to them (sparse_cg), so the others trap.
template <int D1, int D3, class F>
__device__ __forceinline__ void with_wigner3j_d2(int d2, F&& f) {
  with_irrep_dim(d2, [&](auto d) {
    constexpr int D2 = decltype(d)::value;
    if constexpr (!ops::Wigner3j<(D1 - 1) / 2, (D2 - 1) / 2, (D3 - 1) / 2>::exists)
      __trap();
    else
      f(d);
  });
}

// Whether a path of these irrep dimensions may take two channels per lane: the larger
// ones would need more than the backward kernel's 128 registers.
E3F_HD constexpr bool pairs_channels(int d1, int d3) { return d1 + d3 <= 8; }

// Runs this warp's tensor-product tasks: f(d1, d3, C, B, P, u, active) with d1, d3 and C
// (channels per lane) compile-time constants and u this lane's first channel. Lanes past
// the block's width sit out, or with WHOLE_WARP (the task shuffles across the warp) run
// with active = false on the task's first channels, contributing nothing. Two channels per
// lane exist in float32 only. MAX_D1 = 1 (3, 5): every input block has l = 0 (l <= 1, 2)
// (Conv::View::max_d1), and only those paths are compiled (fewer registers); MAX_D3 = 1:
// every output is a scalar (Conv::View::max_d3). WARPS: the block's warps (kWarps, or
// kWideConvWarps: the tasks dealt to that many).
template <class T, bool WHOLE_WARP = false, int MAX_D1 = 7, int MAX_D3 = 7, int WARPS = kWarps,
          class F>
__device__ __forceinline__ void for_each_warp_task(const typename Conv<T>::View& c, F&& f) {
  static_assert(WARPS == kWarps || WARPS == kWideConvWarps);
  constexpr bool wide = WARPS == kWideConvWarps;
  const int* task_begin = wide ? c.wide_task_begin : c.task_begin;
  const typename Conv<T>::Task* tasks = wide ? c.wide_tasks : c.tasks;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int q = task_begin[warp]; q < task_begin[warp + 1]; ++q) {
    const typename Conv<T>::Task task = tasks[q];
    const typename Conv<T>::InBlock B = c.blocks[task.block];
    const typename Conv<T>::Path P = c.paths[task.path];
    int u = task.u0 + task.lane_channels * lane;
    const bool active = u < B.mul;
    if (!active) {
      if (!WHOLE_WARP) continue;
      u = task.u0;
    }
    with_path_dims<MAX_D1, MAX_D3>(B.d1, P.d3, [&](auto d1, auto d3) {
      if constexpr (std::is_same_v<T, float> && pairs_channels(d1, d3)) {
        if (task.lane_channels == 2) {
          f(d1, d3, std::integral_constant<int, 2>{}, B, P, u, active);
          return;
        }
      }
      f(d1, d3, std::integral_constant<int, 1>{}, B, P, u, active);
    });
  }
}

// The radial-table coefficients of the weights of channels u .. u + C - 1 of path P on
// edge e (interval[e]).
template <class T, int C>
__device__ __forceinline__ void load_edge_coefficients(const typename Conv<T>::View& c,
                                                       const typename Conv<T>::Path& P, int u,
                                                       int e, const int* interval,
                                                       T (&coef)[C][4]) {
  const T* entry = table_entry<T>(c, interval[e], P.weight_offset + u);
#pragma unroll
  for (int ch = 0; ch < C; ++ch) load_table_entry(entry + 4 * ch, coef[ch]);
}

// The radial weights w[c] of channels u .. u + C - 1 of path P on edge e: with TABLE from
// their coefficients (load_edge_coefficients) at local_t[e], with dw/dr in dw_dr if given,
// else from the MLP's output in wts.
template <class T, int C, bool TABLE>
__device__ __forceinline__ void edge_weights(const typename Conv<T>::View& c,
                                             const typename Conv<T>::Path& P, int u, int e,
                                             const T (&coef)[C][4], const T* wts, const T* local_t,
                                             T (&w)[C], T* dw_dr) {
  if constexpr (TABLE) {
    const T t = local_t[e];
#pragma unroll
    for (int ch = 0; ch < C; ++ch) {
      w[ch] = ops::radial_table_value(coef[ch], t);
      if (dw_dr) dw_dr[ch] = ops::radial_table_grad(coef[ch], t, static_cast<T>(c.table_inv_step));
    }
  } else {
#pragma unroll
    for (int ch = 0; ch < C; ++ch) w[ch] = wts[e * c.weight_numel + P.weight_offset + u + ch];
  }
}

// Edge e's inputs of a forward task: x_j's rows of block B (channels u ..) and the radial
// weights of path P (from the table or the MLP's output in wts).
template <class T, int D1, int C, bool TABLE>
__device__ __forceinline__ void forward_edge_inputs(const typename Conv<T>::View& c,
                                                    const typename Conv<T>::InBlock& B,
                                                    const typename Conv<T>::Path& P, int u, int e,
                                                    const int* sender, const T* __restrict__ x,
                                                    const T* wts, const int* interval,
                                                    const T* local_t, T (&xa)[D1][C], T (&w)[C]) {
  const T* xj = x + static_cast<int64_t>(sender[e]) * c.dim_in + B.in_offset + u;
#pragma unroll
  for (int a = 0; a < D1; ++a) ldg_vec<T, C>(xj + a * B.mul, xa[a]);
  T coef[C][4];
  if constexpr (TABLE) load_edge_coefficients<T, C>(c, P, u, e, interval, coef);
  edge_weights<T, C, TABLE>(c, P, u, e, coef, wts, local_t, w, nullptr);
}

// y[out block of P][k][u] += w_e sum_a M_e[a][k] x_j[a][u] over the chunk's edges, summed
// in registers and added once (the slots belong to this lane alone); C channels per lane
// share each read of M.
// TABLE: w_e comes from the radial table (interval[e], local_t[e]) instead of wts.
// SPARSE (sparse_forward): the path's alpha x w3j entries, compile-time constants, instead
// of M: per edge Y's D2 values are read, no M is built.
template <class T, int D1, int D3, int C, bool TABLE, bool SPARSE>
__device__ void tp_forward_task(const typename Conv<T>::View& c, const typename Conv<T>::InBlock& B,
                                const typename Conv<T>::Path& P, int u, int n, const int* sender,
                                const T* __restrict__ x, const T* wts, const int* interval,
                                const T* local_t, const T* M, int sh_dim, const T* Y, T* yacc) {
  T acc[D3][C];
#pragma unroll
  for (int k = 0; k < D3; ++k)
#pragma unroll
    for (int ch = 0; ch < C; ++ch) acc[k][ch] = T(0);
  if constexpr (SPARSE) {
    // y[k] += w alpha sum w3j[a][b][k] x_j[a] Y[b] (ops/wigner3j_table.h); alpha at the end
    with_wigner3j_d2<D1, D3>(P.d2, [&](auto d2) {
      constexpr int D2 = decltype(d2)::value;
      using W3j = ops::Wigner3j<(D1 - 1) / 2, (D2 - 1) / 2, (D3 - 1) / 2>;
#pragma unroll 1
      for (int e = 0; e < n; ++e) {
        T xa[D1][C], w[C];
        forward_edge_inputs<T, D1, C, TABLE>(c, B, P, u, e, sender, x, wts, interval, local_t, xa,
                                             w);
        const T* ye = Y + e * sh_dim + P.sh_offset;
        T y[D2];
#pragma unroll
        for (int b = 0; b < D2; ++b) y[b] = ye[b];
#pragma unroll
        for (int ch = 0; ch < C; ++ch) {
          T s[D3];
#pragma unroll
          for (int k = 0; k < D3; ++k) s[k] = T(0);
          W3j::for_each([&](int a, int b, int k, double value) {
            s[k] += static_cast<T>(value) * (xa[a][ch] * y[b]);
          });
#pragma unroll
          for (int k = 0; k < D3; ++k) acc[k][ch] += w[ch] * s[k];
        }
      }
    });
  } else {
    for (int e = 0; e < n; ++e) {
      T xa[D1][C], w[C];
      forward_edge_inputs<T, D1, C, TABLE>(c, B, P, u, e, sender, x, wts, interval, local_t, xa, w);
      // the path's padded rows (Path::mf_offset): in float32 four entries per 16-byte load,
      // the sums over a in the same order (D3 of them at once)
      constexpr int kRow = forward_m_row(D3);
      const T* Mp = M + e * c.m_stride_fwd + P.mf_offset;
      if constexpr (std::is_same_v<T, float>) {
        T s[D3][C];
#pragma unroll
        for (int k = 0; k < D3; ++k)
#pragma unroll
          for (int ch = 0; ch < C; ++ch) s[k][ch] = T(0);
        if constexpr (D3 == 1) {
#pragma unroll
          for (int a0 = 0; a0 < D1; a0 += 4) {
            T m[4];
            load4_shared(Mp + a0, m);
#pragma unroll
            for (int a = a0; a < D1 && a < a0 + 4; ++a)
#pragma unroll
              for (int ch = 0; ch < C; ++ch) s[0][ch] += m[a - a0] * xa[a][ch];
          }
        } else {
#pragma unroll
          for (int a = 0; a < D1; ++a)
#pragma unroll
            for (int k0 = 0; k0 < D3; k0 += 4) {
              T m[4];
              load4_shared(Mp + a * kRow + k0, m);
#pragma unroll
              for (int k = k0; k < D3 && k < k0 + 4; ++k)
#pragma unroll
                for (int ch = 0; ch < C; ++ch) s[k][ch] += m[k - k0] * xa[a][ch];
            }
        }
#pragma unroll
        for (int k = 0; k < D3; ++k)
#pragma unroll
          for (int ch = 0; ch < C; ++ch) acc[k][ch] += w[ch] * s[k][ch];
      } else {  // double: one sum at a time (D3 at once spill in the 64-register kernels)
#pragma unroll
        for (int k = 0; k < D3; ++k) {
          T s[C] = {};
#pragma unroll
          for (int a = 0; a < D1; ++a) {
            const T m = Mp[a * kRow + k];
#pragma unroll
            for (int ch = 0; ch < C; ++ch) s[ch] += m * xa[a][ch];
          }
#pragma unroll
          for (int ch = 0; ch < C; ++ch) acc[k][ch] += w[ch] * s[ch];
        }
      }
    }
  }
  const T scale = SPARSE ? P.alpha : T(1);
  T* y = yacc + P.out_offset + u;
#pragma unroll
  for (int k = 0; k < D3; ++k)
#pragma unroll
    for (int ch = 0; ch < C; ++ch) y[k * B.mul + ch] += scale * acc[k][ch];
}

// One edge e of a backward task (tp_backward_task): g_j's row gj, and with TABLE the
// weights' cubic coefficients, already in registers. TRANSPOSED (Path::m_transposed): the
// path's {M, K} entry (a, q) is its partner's (q, a), scaled by m_scale (in s x_k).
//
// The force is summed in the edge's frame (t1, t2, u) (edge_frame; sum_edge_forces turns it
// back): K's t1 and t2 components are MK's entries 1 and 2. Its u component is not read: with
// normalize, Y depends on u alone and K . u = 0; without, Y_l2 is a homogeneous polynomial of
// degree l2 of v, v . dY/dv = l2 Y (Euler), so K . u = (l2 / r) M and that part of the force
// is (l2 / r) w s x_k M g_j = (l2 / r) w dw (sh_degree = l2 there, 0 with normalize). Two
// multiply-adds per entry and channel for the angular force instead of three.
template <class T, int D1, int D3, int C, bool TABLE, bool TRANSPOSED>
__device__ __forceinline__ void tp_backward_edge(const typename Conv<T>::View& c,
                                                 const typename Conv<T>::Path& P, int u,
                                                 bool active, int e, const T (&gj)[D3][C],
                                                 const T (&coef)[C][4], T* wts, const T* local_t,
                                                 const T* unit, const T* MK, const T (&sxk)[D1][C],
                                                 T (&gxa)[D1][C], T sh_degree, T* fe) {
  constexpr bool kFold = C > 1;
  T w[C], dw_dr[C];
  edge_weights<T, C, TABLE>(c, P, u, e, coef, wts, local_t, w, TABLE ? dw_dr : nullptr);
  const T* mk = MK + 4 * (e * c.m_per_edge + P.m_offset);
  constexpr int kRowStride = TRANSPOSED ? 1 : D3, kColumnStride = TRANSPOSED ? D1 : 1;
  // dw = s x_k M g_j; t = the same product without M, contracted with K for the force
  T dw[C] = {}, f0 = T(0), f1 = T(0);
  if constexpr (C == 1) {
    // one channel: K g first (3 FMAs per entry with M g), then s x_k[a] (K g)[a] per row
#pragma unroll
    for (int a = 0; a < D1; ++a) {
      T mg = T(0), k0 = T(0), k1 = T(0);
#pragma unroll
      for (int q = 0; q < D3; ++q) {
        T v[4];
        load4_shared(mk + 4 * (a * kRowStride + q * kColumnStride), v);
        mg += v[0] * gj[q][0];
        k0 += v[1] * gj[q][0];
        k1 += v[2] * gj[q][0];
      }
      f0 += sxk[a][0] * k0;
      f1 += sxk[a][0] * k1;
      dw[0] += sxk[a][0] * mg;
      gxa[a][0] += w[0] * mg;
    }
  } else {
#pragma unroll
    for (int a = 0; a < D1; ++a) {
      T wsxk[C];
#pragma unroll
      for (int ch = 0; ch < C; ++ch) wsxk[ch] = kFold ? w[ch] * sxk[a][ch] : sxk[a][ch];
      T mg[C] = {};
#pragma unroll
      for (int q = 0; q < D3; ++q) {
        T v[4];
        load4_shared(mk + 4 * (a * kRowStride + q * kColumnStride), v);
        T t = T(0);
#pragma unroll
        for (int ch = 0; ch < C; ++ch) {
          mg[ch] += v[0] * gj[q][ch];
          t += wsxk[ch] * gj[q][ch];
        }
        f0 += v[1] * t;
        f1 += v[2] * t;
      }
#pragma unroll
      for (int ch = 0; ch < C; ++ch) {
        dw[ch] += sxk[a][ch] * mg[ch];
        gxa[a][ch] += w[ch] * mg[ch];
      }
    }
  }
  const T fscale = kFold ? c.inv_denominator : w[0] * c.inv_denominator;
  f0 *= fscale;
  f1 *= fscale;
  // the u component: the radial part (dE/dw) (dw/dr) with TABLE, and K . u's
  const T h = sh_degree * unit[4 * e + 3];
  T f2 = T(0);
#pragma unroll
  for (int ch = 0; ch < C; ++ch)
    f2 += dw[ch] * c.inv_denominator * ((TABLE ? dw_dr[ch] : T(0)) + w[ch] * h);
  if constexpr (!TABLE) {
    if (active) {
      T* slot = wts + e * c.weight_numel + P.weight_offset + u;
#pragma unroll
      for (int ch = 0; ch < C; ++ch) slot[ch] = dw[ch] * c.inv_denominator;
    }
  }
  const T sum = warp_sum3(f0, f1, f2);
  const int lane = threadIdx.x % 32;
  if (lane % 8 == 0 && lane < 24) fe[(3 * e + lane / 8) * kWarps] += sum;
}

// One edge e of a backward task from the path's compile-time Wigner 3j entries
// (ops/wigner3j_table.h; its Clebsch-Gordan block is alpha x w3j) instead of {M, K} rows,
// with the radial table's w and dw/dr. Per channel mg[a] = alpha sum_{b,q} w3j[a][b][q] Y[b]
// g_j[q] (tp_backward_edge's M g_j), and over the lane's channels the path's dE/dY,
// t[b] = sum_{a,q} w3j[a][b][q] (w s x_k[a]) g_j[q], whose angular force is
// alpha sum_b t[b] dY[b]/dv (Y[e][b][4] = {Y, dY/dv in the edge's frame}, chunk_geometry):
// the force in the edge's frame, as tp_backward_edge's.
template <class T, int D1, int D2, int D3, int C>
__device__ __forceinline__ void tp_backward_edge_sparse(
    const typename Conv<T>::View& c, const typename Conv<T>::Path& P, int u, int e,
    const T (&gj)[D3][C], const T (&coef)[C][4], const T* local_t, const T* Y, int sh_dim,
    const T (&sxk)[D1][C], T (&gxa)[D1][C], T* fe) {
  using W3j = ops::Wigner3j<(D1 - 1) / 2, (D2 - 1) / 2, (D3 - 1) / 2>;
  T w[C], dw_dr[C];
  edge_weights<T, C, true>(c, P, u, e, coef, nullptr, local_t, w, dw_dr);
  const T* ye = Y + 4 * (e * sh_dim + P.sh_offset);
  T y[D2], t[D2];
#pragma unroll
  for (int b = 0; b < D2; ++b) {
    y[b] = ye[4 * b];
    t[b] = T(0);
  }
  T wsx[D1][C], mg[D1][C];
#pragma unroll
  for (int a = 0; a < D1; ++a)
#pragma unroll
    for (int ch = 0; ch < C; ++ch) {
      wsx[a][ch] = w[ch] * sxk[a][ch];
      mg[a][ch] = T(0);
    }
  W3j::for_each([&](int a, int b, int q, double value) {
#pragma unroll
    for (int ch = 0; ch < C; ++ch) {
      const T p = static_cast<T>(value) * gj[q][ch];
      mg[a][ch] += p * y[b];
      t[b] += p * wsx[a][ch];
    }
  });
  T dw[C] = {};
#pragma unroll
  for (int a = 0; a < D1; ++a)
#pragma unroll
    for (int ch = 0; ch < C; ++ch) {
      const T m = P.alpha * mg[a][ch];
      dw[ch] += sxk[a][ch] * m;
      gxa[a][ch] += w[ch] * m;
    }
  T f0 = T(0), f1 = T(0), f2 = T(0);
#pragma unroll
  for (int b = 0; b < D2; ++b) {
    T v[4];
    load4_shared(ye + 4 * b, v);
    f0 += t[b] * v[1];
    f1 += t[b] * v[2];
    f2 += t[b] * v[3];
  }
  const T fscale = P.alpha * c.inv_denominator;
  T dr = T(0);
#pragma unroll
  for (int ch = 0; ch < C; ++ch) dr += dw[ch] * c.inv_denominator * dw_dr[ch];
  f0 *= fscale;
  f1 *= fscale;
  f2 = f2 * fscale + dr;
  const T sum = warp_sum3(f0, f1, f2);
  const int lane = threadIdx.x % 32;
  if (lane % 8 == 0 && lane < 24) fe[(3 * e + lane / 8) * kWarps] += sum;
}

// Edge e's inputs of a backward task: g_j's row of path P (channels u ..) and with TABLE
// the cubic coefficients of its weights.
template <class T, int D3, int C, bool TABLE>
__device__ __forceinline__ void gather_backward_edge(
    const typename Conv<T>::View& c, const typename Conv<T>::InBlock& B,
    const typename Conv<T>::Path& P, int u, int e, const int* receiver,
    const T* __restrict__ grad_y, const int* interval, T (&g)[D3][C], T (&coef)[C][4]) {
  const T* row = grad_y + static_cast<int64_t>(receiver[e]) * c.dim_out + P.out_offset + u;
#pragma unroll
  for (int q = 0; q < D3; ++q) ldg_vec<T, C>(row + q * B.mul, g[q]);
  if constexpr (TABLE) load_edge_coefficients<T, C>(c, P, u, e, interval, coef);
}

// The chunk's edges e = (k, j) of one task, for the message k -> j that node k sends
// (conv.cuh): the weight's adjoint dE/dw goes to the weight slot, dE/dx_k's partial to the
// path's gx slot, and the angular part of f = dE/dv (v = r_j - r_k), contracted through
// K = dM/dv, summed over the warp (warp_sum3) into the warp's column of fe:
// fe[(3 e + a) * kWarps] (shared memory), component a of the edge's frame (t1, t2, u). An
// inactive lane (past the block's channels) contributes zeros and writes nothing.
// homogeneous_sh: the spherical harmonics are of the raw vector (!normalize): K . u is not 0
// (tp_backward_edge).
//
// The message is y_j += w s TP(x_k, Y(v)): Y_l(-v) = (-1)^l Y_l(v) puts the parity sign s of
// the path on x_k, so M and K are the chunk's own (v from k to j).
//
// TABLE: w and dw/dr come from the radial table, and the radial part of f,
// (dE/dw) (dw/dr) u_e, goes to the same columns (no MLP adjoint afterwards).
//
// C channels per lane share each {M, K} read and the force partials: with C > 1 each
// channel's weight is folded into s x_k once per task, so that the K contraction runs once
// for the C channels.
//
// SPARSE (sparse_backward, with TABLE): each edge from the path's Wigner 3j entries
// (tp_backward_edge_sparse), reading Y and dY/dv instead of {M, K}.
template <class T, int D1, int D3, int C, bool TABLE, bool AHEAD, bool TRANSPOSED, bool SPARSE>
__device__ void tp_backward_task(const typename Conv<T>::View& c,
                                 const typename Conv<T>::InBlock& B,
                                 const typename Conv<T>::Path& P, int u, bool active, int64_t k,
                                 int n, const int* receiver, const T* __restrict__ x,
                                 const T* __restrict__ grad_y, T* wts, const int* interval,
                                 const T* local_t, const T* unit, const T* MK, const T* Y,
                                 int sh_dim, bool homogeneous_sh, T* gx_slot, T* fe) {
  // the parity sign, and the partner's scale of transposed rows (Path::m_scale, 1 otherwise;
  // the sparse tasks read no rows)
  const T s = (P.parity ? T(-1) : T(1)) * (SPARSE ? T(1) : P.m_scale);
  const T sh_degree = homogeneous_sh ? T((P.d2 - 1) / 2) : T(0);  // l2 (tp_backward_edge)
  T sxk[D1][C], gxa[D1][C];
  const T* xk_row = x + k * c.dim_in + B.in_offset + u;
#pragma unroll
  for (int a = 0; a < D1; ++a) {
    ldg_vec<T, C>(xk_row + a * B.mul, sxk[a]);
#pragma unroll
    for (int ch = 0; ch < C; ++ch) {
      sxk[a][ch] = active ? s * sxk[a][ch] : T(0);  // an inactive lane adds zeros
      gxa[a][ch] = T(0);
    }
  }
  // AHEAD: the next edge's row and coefficients are loaded before this edge's products (n >= 1)
  auto walk_edges = [&](auto&& edge) {
    T gj[D3][C], coef[C][4];
    if constexpr (AHEAD)
      gather_backward_edge<T, D3, C, TABLE>(c, B, P, u, 0, receiver, grad_y, interval, gj, coef);
#pragma unroll 1
    for (int e = 0; e < n; ++e) {
      if constexpr (!AHEAD) {
        gather_backward_edge<T, D3, C, TABLE>(c, B, P, u, e, receiver, grad_y, interval, gj, coef);
        edge(e, gj, coef);
      } else {
        T gn[D3][C], cn[C][4];
        gather_backward_edge<T, D3, C, TABLE>(c, B, P, u, e + 1 < n ? e + 1 : e, receiver, grad_y,
                                              interval, gn, cn);
        edge(e, gj, coef);
#pragma unroll
        for (int q = 0; q < D3; ++q)
#pragma unroll
          for (int ch = 0; ch < C; ++ch) gj[q][ch] = gn[q][ch];
#pragma unroll
        for (int ch = 0; ch < C; ++ch)
#pragma unroll
          for (int i = 0; i < 4; ++i) coef[ch][i] = cn[ch][i];
      }
    }
  };
  if constexpr (SPARSE) {
    static_assert(TABLE, "the sparse backward reads its weights from the radial table");
    with_wigner3j_d2<D1, D3>(P.d2, [&](auto d2) {
      walk_edges([&](int e, const T(&gj)[D3][C], const T(&coef)[C][4]) {
        tp_backward_edge_sparse<T, D1, decltype(d2)::value, D3, C>(c, P, u, e, gj, coef, local_t, Y,
                                                                   sh_dim, sxk, gxa, fe);
      });
    });
  } else {
    walk_edges([&](int e, const T(&gj)[D3][C], const T(&coef)[C][4]) {
      tp_backward_edge<T, D1, D3, C, TABLE, TRANSPOSED>(c, P, u, active, e, gj, coef, wts, local_t,
                                                        unit, MK, sxk, gxa, sh_degree, fe);
    });
  }
  if (!active) return;
#pragma unroll
  for (int a = 0; a < D1; ++a)
#pragma unroll
    for (int ch = 0; ch < C; ++ch) gx_slot[a * B.mul + ch] += s * gxa[a][ch];
}

// The force on each of the chunk's n edges: the warps' partials (rows [n][3] of kWarps
// columns, components in the edge's frame) summed in double in a fixed order and turned
// into x, y, z (f = f_1 t1 + f_2 t2 + f_3 u, edge_frame of unit[4 e ..]), by thread e for
// edge e.
template <class T>
__device__ void sum_edge_forces(const T* part, int n, const T* unit, double* edge_force) {
  for (int e = threadIdx.x; e < n; e += blockDim.x) {
    double f[3];
    for (int a = 0; a < 3; ++a) {
      const T* row = part + static_cast<size_t>(3 * e + a) * kWarps;
      double sum = 0.0;
      for (int w = 0; w < kWarps; ++w) sum += static_cast<double>(row[w]);
      f[a] = sum;
    }
    T t1[3], t2[3];
    const T* u = unit + 4 * e;
    edge_frame<T>(u, t1, t2);
    for (int a = 0; a < 3; ++a)
      edge_force[3 * e + a] = f[0] * static_cast<double>(t1[a]) +
                              f[1] * static_cast<double>(t2[a]) + f[2] * static_cast<double>(u[a]);
  }
}

// Adds the chunk's edge forces to node k's sums: force[3], then the per-atom virial
// [a][b] -= share v[a] f[b] (share 1/2 when the receiver takes the other half, else 1).
// Thread q < 12 owns sums[q] and walks the edges in order.
template <class T>
__device__ void add_edge_forces(const T* vec, int n, const double* edge_force, double share,
                                double* sums) {
  const int q = threadIdx.x;
  if (q >= 12) return;
  double sum = sums[q];
  for (int e = 0; e < n; ++e) {
    const double* f = edge_force + 3 * e;
    if (q < 3) {
      sum += f[q];
    } else {
      const int a = (q - 3) / 3, b = (q - 3) % 3;
      sum -= share * static_cast<double>(vec[3 * e + a]) * f[b];
    }
  }
  sums[q] = sum;
}

// Adds value to a fixed-point sum {hi, lo} (RemoteForces); a value out of range flags its
// node.
__device__ inline void add_fixed(unsigned long long* sum, double value, int64_t node,
                                 int64_t* overflow_node) {
  if (!(fabs(value) < kFixedLimit)) {
    atomicMax(reinterpret_cast<unsigned long long*>(overflow_node),
              static_cast<unsigned long long>(node + 1));
    return;
  }
  const double hi = rint(value * kFixedHiScale);
  const double lo = rint((value - hi / kFixedHiScale) * kFixedLoScale);
  atomicAdd(sum, static_cast<unsigned long long>(static_cast<long long>(hi)));
  atomicAdd(sum + 1, static_cast<unsigned long long>(static_cast<long long>(lo)));
}

// The chunk's message forces on their receivers j: -f_e, and j's half of the per-atom
// virial, -v f_e / 2 (the sender took the other half in add_edge_forces).
template <class T>
__device__ void deliver_edge_forces(const RemoteForces& remote, const int* receiver, const T* vec,
                                    int n, const double* edge_force) {
  const int per_edge = remote.virials ? 12 : 3;
  for (int q = threadIdx.x; q < n * per_edge; q += blockDim.x) {
    const int e = q / per_edge, r = q - e * per_edge;
    const int64_t j = receiver[e];
    const double* f = edge_force + 3 * e;
    if (r < 3) {
      add_fixed(remote.forces + 2 * (3 * j + r), -f[r], j, remote.overflow_node);
    } else {
      const int a = (r - 3) / 3, b = (r - 3) % 3;
      add_fixed(remote.virials + 2 * (9 * j + r - 3),
                -0.5 * static_cast<double>(vec[3 * e + a]) * f[b], j, remote.overflow_node);
    }
  }
}

// ---------------------------------------------------------------------------
// Kernels

// TABLE: the radial MLP comes from c.table (no MLP workspace).
// MINB: blocks per SM the registers are budgeted for (<= 64K / (256 MINB) per thread):
// forward 3 (4 with a radial table), backward 2 (with a table 3 for inputs up to l = 2 and
// 4 for scalar-only paths: three_backward_blocks, kScalarPathBlocks).
// PER_EDGE (with TABLE): c.table is the per-edge array of the exact RadialMLP (conv.cuh).
// WARPS (with TABLE): kWarps, or kWideConvWarps with the same registers per thread (MINB
// counts blocks of kWarps warps; launch_largest_chunk's `wide`).
template <class T, int EC, bool TABLE, int MINB, bool SPARSE, bool PER_EDGE = false,
          int WARPS = kWarps>
__global__ void __launch_bounds__(32 * WARPS, MINB* kWarps / WARPS)
    conv_forward_kernel(typename Geometry<T>::View geo, typename Conv<T>::View c, GraphView g,
                        const T* __restrict__ x, T* __restrict__ y, int64_t* error_node,
                        const int32_t* __restrict__ rows) {
  extern __shared__ __align__(16) unsigned char smem[];
  const Smem L = smem_layout<T>(c, geo.sh_dim, geo.num_basis, EC, false);
  int64_t* s_edge = reinterpret_cast<int64_t*>(smem + L.edge);
  int* s_sender = reinterpret_cast<int*>(smem + L.sender);
  T* Y = reinterpret_cast<T*>(smem + L.Y);
  T* vec = reinterpret_cast<T*>(smem + L.vec);
  T* unit = reinterpret_cast<T*>(smem + L.u);
  T* h0 = reinterpret_cast<T*>(smem + L.h0);
  T* h1 = reinterpret_cast<T*>(smem + L.h1);
  T* wts = reinterpret_cast<T*>(smem + L.wts);
  T* M = reinterpret_cast<T*>(smem + L.M);
  T* yacc = reinterpret_cast<T*>(smem + L.acc);
  int* s_interval = reinterpret_cast<int*>(smem + L.interval);
  T* s_t = reinterpret_cast<T*>(smem + L.local_t);
  __shared__ int64_t s_pos;
  __shared__ int s_count;
  static_assert(TABLE || WARPS == kWarps, "the radial MLP's products are dealt to kWarps warps");
  static_assert(MINB * kWarps % WARPS == 0);

  const int64_t i = rows ? rows[blockIdx.x] : blockIdx.x;  // ConvRows
  for (int q = threadIdx.x; q < c.dim_out; q += blockDim.x) yacc[q] = T(0);
  if constexpr (!SPARSE) zero_contracted_rows<T, false>(c, EC, M);
  if (threadIdx.x == 0) s_pos = g.row_offsets[i];
  const int64_t end = g.row_offsets[i + 1];
  const double cutoff2 = geo.cutoff * geo.cutoff;
  __syncthreads();
  while (true) {
    take_chunk<EC>(g, i, cutoff2, INT64_MAX, end, &s_pos, &s_count, s_edge, error_node);
    const int n = s_count;
    if (n == 0) break;
    // h0 holds the embedding with row stride num_basis = dims[0].
    chunk_geometry<T, PER_EDGE>(geo, c, g, i, n, EC, s_edge, s_sender, Y, TABLE ? nullptr : h0,
                                c.dims[0], false, nullptr, vec, unit, s_interval, s_t, true);
    __syncthreads();
    if constexpr (!TABLE) chunk_mlp_forward<T, EC>(c, h0, h0, h1, wts, nullptr, nullptr);
    if constexpr (!SPARSE) chunk_contract_sh<T, false>(c, n, geo.sh_dim, Y, M);
    __syncthreads();
    for_each_warp_task<T, false, 7, 7, WARPS>(
        c, [&](auto d1, auto d3, auto lc, const auto& B, const auto& P, int ch, bool) {
          tp_forward_task<T, decltype(d1)::value, decltype(d3)::value, decltype(lc)::value, TABLE,
                          SPARSE>(c, B, P, ch, n, s_sender, x, wts, s_interval, s_t, M, geo.sh_dim,
                                  Y, yacc);
        });
    __syncthreads();
  }
  T* yi = y + i * c.dim_out;
  for (int q = threadIdx.x; q < c.dim_out; q += blockDim.x) yi[q] = yacc[q] * c.inv_denominator;
}

// Columns per thread of the transposed products in the MLP backward.
template <class T>
constexpr int backward_cpt() {
  return sizeof(T) == 4 ? 4 : 2;
}

// MLP backward over the chunk: from grad_w (in wts) to dE/d emb [EC][num_basis] in
// `out`. Each layer's transposed product out[e][k] = sum_n g[e][n] W^T[n][k] runs on
// G = K / CPT column groups of CPT columns, split over P = blockDim / G thread
// groups along n; the P partial sums are added in a fixed order (deterministic).
template <class T, int EC>
__device__ void chunk_mlp_backward(const typename Conv<T>::View& c, const T* wts, const T* pre,
                                   T* g0, T* g1, T* part, T*& out) {
  constexpr int CPT = backward_cpt<T>();
  const int stride = EC * c.max_hidden;
  const T* gin = wts;
  T* gout = g0;
  for (int l = c.mlp_layers - 1; l >= 0; --l) {
    const int K = c.dims[l], N = c.dims[l + 1];
    int P = 0;  // partial sums to add, each [EC][K] in part
#ifdef E3FUSE_HAVE_MMA_TF32
    if constexpr (std::is_same_v<T, float> && EC % 8 == 0) {
      if (c.frag_bwd[l]) {
        chunk_gemm_tf32_split_k<EC, kWarps>(gin, N, c.frag_bwd[l], K, part);
        P = kWarps;
      }
    }
#endif
    if (P == 0) {
      const int G = (K + CPT - 1) / CPT;
      P = max(1, kThreads / G);
      const int chunk = (N + P - 1) / P;
      const T* Wt = c.wt[l];
      for (int t = threadIdx.x; t < G * P; t += blockDim.x) {
        const int kb = t % G, part_id = t / G;
        const int n0 = part_id * chunk, n1 = min(N, n0 + chunk);
        gemm_tile<T, EC, CPT>(gin, N, Wt, n0, n1, kb, G, K, part + part_id * EC * K, K);
      }
    }
    __syncthreads();
    for (int q = threadIdx.x; q < EC * K; q += blockDim.x) {
      T s = T(0);
      for (int p = 0; p < P; ++p) s += part[p * EC * K + q];
      if (l > 0) s *= ops::activation_grad(c.act, pre[(l - 1) * stride + q]) * c.act_scale;
      gout[q] = s;
    }
    __syncthreads();
    gin = gout;
    gout = (gout == g0) ? g1 : g0;
  }
  out = const_cast<T*>(gin);
}

// Whether the backward's tasks of (d1, d3, c) load each edge's inputs one edge ahead
// (tp_backward_task's AHEAD), in the kernel compiled for MAX_D1 / MAX_D3: with scalar inputs
// or outputs all of them; with l <= 1 inputs those of paths up to l = 2; with l = 2 or 3
// inputs the small ones, d1 d3 c <= 15. H100, backward at 32,000 atoms
// (benchmarks/results/conv_scalar_ahead/ and conv_forward_ahead/):
// - l = 3 (SevenNet-l3i5 layers 1-3, 127 registers, no spills): 40.3 -> 38.1 ms each with
//   the limit 15, 41.0-42.1 with 25; the l <= 2 rule spilled and measured 10 % slower than
//   none ahead;
// - l = 2 (SevenNet-0 layers 1-3, 128 registers): the limit 15 removes the l <= 2 rule's 56 /
//   152 bytes of spills, 11.00-11.13 -> 10.82-10.87 ms each;
// - l = 1 (MACE layer 1, 80 registers): the limit 15 took 19.19 -> 19.71 ms, not kept.
template <int MAX_D1, int MAX_D3>
constexpr bool backward_prefetch(int d1, int d3, int c) {
  if (MAX_D1 == 1 || MAX_D3 == 1) return true;
  if (MAX_D1 <= 3) return d1 <= 5 && d3 <= 5;
  return d1 * d3 * c <= 15;
}

// MAX_D1: the largest input irrep dimension compiled (1, 3, 5 or 7, see for_each_warp_task);
// MAX_D3 = 1: scalar outputs only.
// PER_EDGE: as conv_forward_kernel's.
// SPARSE: the tensor product from the Wigner 3j entries (sparse_backward), no {M, K} rows.
// SPLIT: rows may take two blocks (RowSplit); compiled apart, so that the launches of graphs
// that split none run the code without it (conv_backward).
template <class T, int EC, bool TABLE, int MINB, int MAX_D1, int MAX_D3 = 7, bool PER_EDGE = false,
          bool SPARSE = false, bool SPLIT = false>
__global__ void __launch_bounds__(kThreads, MINB)
    conv_backward_kernel(typename Geometry<T>::View geo, typename Conv<T>::View c, GraphView g,
                         int64_t receiver_rows, const T* __restrict__ x,
                         const T* __restrict__ grad_y, T* __restrict__ grad_x, double* forces,
                         double* atom_virials, RemoteForces remote, int64_t* error_node,
                         const int32_t* __restrict__ rows, RowSplit split) {
  extern __shared__ __align__(16) unsigned char smem[];
  const Smem L = smem_layout<T>(c, geo.sh_dim, geo.num_basis, EC, true);
  int64_t* s_edge = reinterpret_cast<int64_t*>(smem + L.edge);
  int* s_sender = reinterpret_cast<int*>(smem + L.sender);
  T* Y = reinterpret_cast<T*>(smem + L.Y);
  T* vec = reinterpret_cast<T*>(smem + L.vec);
  T* u = reinterpret_cast<T*>(smem + L.u);
  T* emb = reinterpret_cast<T*>(smem + L.emb);
  T* demb = reinterpret_cast<T*>(smem + L.demb);
  T* h0 = reinterpret_cast<T*>(smem + L.h0);
  T* h1 = reinterpret_cast<T*>(smem + L.h1);
  T* pre = reinterpret_cast<T*>(smem + L.pre);
  T* act = reinterpret_cast<T*>(smem + L.act);
  T* wts = reinterpret_cast<T*>(smem + L.wts);
  T* MK = reinterpret_cast<T*>(smem + L.K);
  T* gx = reinterpret_cast<T*>(smem + L.acc);
  T* part = reinterpret_cast<T*>(smem + L.part);
  double* red = reinterpret_cast<double*>(smem + L.red);
  int* s_interval = reinterpret_cast<int*>(smem + L.interval);
  T* s_t = reinterpret_cast<T*>(smem + L.local_t);
  __shared__ int64_t s_pos;
  __shared__ int s_count;

  int64_t k = 0, begin = 0, end = 0;  // ConvRows, RowSplit
  int half = -1;
  if constexpr (SPLIT) {
    if (!block_row(g, rows, split, &k, &half, &begin, &end)) return;
  } else {
    k = rows ? rows[blockIdx.x] : blockIdx.x;
  }
  for (int q = threadIdx.x; q < c.gx_slots; q += blockDim.x) gx[q] = T(0);
  if constexpr (!SPARSE && !dense_columns<MAX_D1>()) zero_contracted_rows<T, true>(c, EC, MK);
  if constexpr (SPLIT) {
    if (threadIdx.x == 0) s_pos = begin;
  } else {
    if (threadIdx.x == 0) s_pos = g.row_offsets[k];
    end = g.row_offsets[k + 1];
  }
  const double cutoff2 = geo.cutoff * geo.cutoff;
  double* edge_force = red;           // [EC][3]
  double* force_sums = red + 3 * EC;  // node k's force [3] and virial [9]
  if (threadIdx.x < 12) force_sums[threadIdx.x] = 0.0;
  __syncthreads();
  while (true) {
    // messages to nodes at or past receiver_rows carry no adjoint (their dE/dy is zero)
    take_chunk<EC>(g, k, cutoff2, receiver_rows, end, &s_pos, &s_count, s_edge, error_node);
    const int n = s_count;
    if (n == 0) break;
    // node k sends these messages: their receiver is the neighbor (ordered-pair tables)
    chunk_geometry<T, PER_EDGE>(geo, c, g, k, n, EC, s_edge, s_sender, Y, TABLE ? nullptr : emb,
                                geo.num_basis, true, demb, vec, u, s_interval, s_t, false);
    __syncthreads();
    if constexpr (!TABLE) chunk_mlp_forward<T, EC>(c, emb, h0, h1, wts, pre, act);
    if constexpr (SPARSE) {
    } else if constexpr (dense_columns<MAX_D1>()) {
      chunk_contract_dense<T>(c, n, geo.sh_dim, Y, MK);
    } else {
      chunk_contract_sh<T, true>(c, n, geo.sh_dim, Y, MK);
    }
    __syncthreads();
    {
      // the force partials [EC][3][kWarps], one column per warp
      for (int r = threadIdx.x; r < 3 * n * kWarps; r += blockDim.x) part[r] = T(0);
      __syncthreads();
      for_each_warp_task<T, true, MAX_D1, MAX_D3>(c, [&](auto d1, auto d3, auto lc, const auto& B,
                                                         const auto& P, int ch, bool active) {
        constexpr int D1 = decltype(d1)::value, D3 = decltype(d3)::value, C = decltype(lc)::value;
        auto run = [&](auto transposed) {
          tp_backward_task<T, D1, D3, C, TABLE, backward_prefetch<MAX_D1, MAX_D3>(D1, D3, C),
                           decltype(transposed)::value, SPARSE>(
              c, B, P, ch, active, k, n, s_sender, x, grad_y, wts, s_interval, s_t, u, MK, Y,
              geo.sh_dim, !geo.normalize, gx + P.gx_offset + ch, part + threadIdx.x / 32);
        };
        // only paths with d1 < d3 read their partner's rows, in layers with l = 3 inputs
        // (make_conv); the other kernels compile no transposed reads
        if constexpr (D1 < D3 && MAX_D1 == 7 && !SPARSE) {
          if (P.m_transposed) {
            run(std::true_type{});
            return;
          }
        }
        run(std::false_type{});
      });
    }
    __syncthreads();
    sum_edge_forces<T>(part, n, u, edge_force);
    __syncthreads();
    if constexpr (!TABLE) {  // with a table, the radial part went in with the tensor product
      // Radial part: dE/dr per edge through the MLP, f += dr * u.
      T* gemb = nullptr;
      chunk_mlp_backward<T, EC>(c, wts, pre, h0, h1, part, gemb);
      if (threadIdx.x < n) {
        const int e = threadIdx.x;
        T dr = T(0);
        for (int b = 0; b < geo.num_basis; ++b)
          dr += gemb[e * geo.num_basis + b] * demb[e * geo.num_basis + b];
        for (int a = 0; a < 3; ++a) edge_force[3 * e + a] += static_cast<double>(dr * u[4 * e + a]);
      }
      __syncthreads();
    }
    add_edge_forces<T>(vec, n, edge_force, remote.virials ? 0.5 : 1.0, force_sums);
    deliver_edge_forces<T>(remote, s_sender, vec, n, edge_force);
    __syncthreads();
  }
  // dE/dx_k: each input block's path slots added in path order (with two blocks per row,
  // the second adds its sums to the first's: RowSplit)
  T* gk = grad_x + k * c.dim_in;
  int* state = nullptr;
  double* first_sums = nullptr;
  bool second = false;
  if constexpr (SPLIT) {
    if (half >= 0) {
      state = split.state + 2 * (k - split.from);
      first_sums = split.sums + 12 * (k - split.from);
      second = finishes_second(state);
    }
  }
  for (int q = threadIdx.x; q < c.dim_in; q += blockDim.x) {
    int b = 0;
    while (b + 1 < c.num_blocks && q >= c.blocks[b + 1].in_offset) ++b;
    const typename Conv<T>::InBlock B = c.blocks[b];
    const int r = q - B.in_offset;  // a * mul + u
    T sum = T(0);
    if (r < B.mul * B.d1)
      for (int p = B.path_begin; p < B.path_end; ++p) sum += gx[c.paths[p].gx_offset + r];
    const T share = sum * c.inv_denominator;
    gk[q] = second ? __ldcg(gk + q) + share : share;
  }
  if constexpr (SPLIT) {
    if (state && !second) {
      if (threadIdx.x < 12) first_sums[threadIdx.x] = force_sums[threadIdx.x];
      publish_row_part(state);
      return;
    }
  }
  if (threadIdx.x == 0) {
    auto total = [&](int q) {
      return second ? force_sums[q] + __ldcg(first_sums + q) : force_sums[q];
    };
    for (int a = 0; a < 3; ++a) forces[3 * k + a] += total(a);
    if (atom_virials)
      for (int q = 0; q < 9; ++q) atom_virials[9 * k + q] += total(3 + q);
  }
  if constexpr (SPLIT) {
    if (second) release_row_part(state);
  }
}

// ---------------------------------------------------------------------------
// The non-linear block's RadialMLP, exactly per edge (conv.cuh): one warp per node walks its
// row's edges inside the cutoff (the rows the convolution walks, in their order), the lanes
// sharing each edge's layers; the activations and their r-tangents stay in the warp's shared
// memory, 4 x hidden doubles. Same math as ops::radial_mlp_forward (tangent mode) and, on the
// CPU, cpu/conv.cpp pair_mlp_weights: R = MLP(emb) f(r) (f = 1 with apply_cutoff).

constexpr int kEdgeMlpThreads = 128;
constexpr int kMaxEdgeMlpHidden = 256;  // 4 warps x 4 x 256 doubles: 32 KB of shared memory

// The sum of x over the warp, in every lane (a fixed butterfly).
__device__ inline double warp_all_sum(double x) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(kFullMask, x, offset);
  return x;
}

// Column c of a layer's affine map of the warp's activations h: o = b[c] + h . W[:, c], and
// with TANGENT its r-derivative d = dh . W[:, c] (else 0).
template <bool TANGENT>
__device__ inline void mlp_column(const double* W, const double* b, const double* h,
                                  const double* dh, int K, int N, int c, double& o, double& d) {
  o = b[c];
  d = 0.0;
  for (int k = 0; k < K; ++k) {
    const double w = W[static_cast<int64_t>(k) * N + c];
    o += h[k] * w;
    if (TANGENT) d += dh[k] * w;
  }
}

// For every edge e of rows [0, g.num_nodes) inside the cutoff with a neighbor below
// neighbor_end: out[e][w] = {R_w, dR_w/dr (TANGENT, else 0), 0, 0} of the ordered species pair
// (s_i, s_j) of row i, or with `reverse` of (s_j, s_i) (the message i -> j of the backward).
// Other entries are not written (the convolution skips those edges).
template <class T, bool TANGENT>
__global__ void __launch_bounds__(kEdgeMlpThreads)
    radial_mlp_edges_kernel(typename Geometry<T>::View geo, ops::RadialMlpView mlp, int hidden,
                            GraphView g, int64_t neighbor_end, bool reverse, T* out) {
  extern __shared__ __align__(16) unsigned char smem[];
  double* h = reinterpret_cast<double*>(smem) + (threadIdx.x / kWarp) * 4 * hidden;
  double* dh = h + hidden;  // d h / dr
  double* z = h + 2 * hidden;
  double* dz = h + 3 * hidden;
  int lane;
  const int64_t i = warp_node(lane);
  if (i >= g.num_nodes) return;  // the whole warp
  const int S = geo.num_species, nb = geo.num_basis;
  const int numel = mlp.dims[mlp.layers];
  const double cutoff2 = geo.cutoff * geo.cutoff;
  for (int64_t e = g.row_offsets[i]; e < g.row_offsets[i + 1]; ++e) {
    const int64_t j = g.neighbors[e];
    if (j >= neighbor_end) continue;
    double v[3];
    edge_vector(g, i, e, v);
    const double r2 = v[0] * v[0] + v[1] * v[1] + v[2] * v[2];
    if (r2 >= cutoff2 || r2 == 0.0) continue;  // the convolution reports r = 0
    const double r = sqrt(r2);
    const int si = g.species[i], sj = g.species[j];
    const int pair = reverse ? sj * S + si : si * S + sj;
    // the embedding (one per edge, both directions: r_0 of the row's order, as the CPU)
    double f = 1.0, df = 0.0;
    if (lane == 0) {
      double emb[kMaxBasis], demb[kMaxBasis];
      const double r0 = geo.pair_r0 ? geo.pair_r0[si * S + sj] : 1.0;
      ops::mace_edge_embedding<double>(nb, geo.coeffs, geo.prefactor, geo.envelope, geo.transform,
                                       geo.apply_cutoff, r, r0, emb, demb, f, df);
      for (int b = 0; b < nb; ++b) {
        h[b] = emb[b];
        dh[b] = demb[b];
      }
      if (geo.apply_cutoff) {  // the envelope is inside emb
        f = 1.0;
        df = 0.0;
      }
    }
    f = __shfl_sync(kFullMask, f, 0);
    df = __shfl_sync(kFullMask, df, 0);
    __syncwarp();
    for (int l = 0; l < mlp.layers; ++l) {
      const int K = mlp.dims[l], N = mlp.dims[l + 1];
      const double* W = mlp.params + mlp.weight[l];
      const double* b = mlp.params + mlp.bias[l] + (l == 0 ? static_cast<int64_t>(pair) * N : 0);
      if (l + 1 == mlp.layers) {  // the output layer: straight to the edge's entries
        T* row = out + static_cast<size_t>(e) * numel * 4;
        for (int c = lane; c < N; c += kWarp) {
          double o, d;
          mlp_column<TANGENT>(W, b, h, dh, K, N, c, o, d);
          row[4 * c] = static_cast<T>(o * f);
          row[4 * c + 1] = TANGENT ? static_cast<T>(d * f + o * df) : T(0);
          row[4 * c + 2] = T(0);
          row[4 * c + 3] = T(0);
        }
        break;
      }
      double sum = 0.0, dsum = 0.0;
      for (int c = lane; c < N; c += kWarp) {
        double o, d;
        mlp_column<TANGENT>(W, b, h, dh, K, N, c, o, d);
        z[c] = o;
        dz[c] = d;
        sum += o;
        dsum += d;
      }
      // LayerNorm (ops/radial_mlp.h): y = (z - mean) s gamma + beta, s = 1 / sqrt(var + eps)
      const double mean = warp_all_sum(sum) / N, dmean = warp_all_sum(dsum) / N;
      double var = 0.0, dvar = 0.0;
      for (int c = lane; c < N; c += kWarp) {
        const double zc = z[c] - mean, dc = dz[c] - dmean;
        var += zc * zc;
        dvar += 2.0 * zc * dc;
      }
      var = warp_all_sum(var) / N;
      dvar = warp_all_sum(dvar) / N;
      const double s = 1.0 / sqrt(var + mlp.eps);
      const double ds = -0.5 * s * s * s * dvar;
      const double* gamma = mlp.params + mlp.gamma[l];
      const double* beta = mlp.params + mlp.beta[l];
      __syncwarp();  // every lane has read h
      for (int c = lane; c < N; c += kWarp) {
        const double zc = z[c] - mean, dc = dz[c] - dmean;
        const double y = zc * s * gamma[c] + beta[c];
        const double dy = (dc * s + zc * ds) * gamma[c];
        h[c] = ops::activation(Activation::silu, y);
        dh[c] = TANGENT ? dy * ops::activation_grad(Activation::silu, y) : 0.0;
      }
      __syncwarp();
    }
    __syncwarp();  // every lane has read h before the next edge's embedding replaces it
  }
}

// Largest dynamic shared memory a block may use on the current device.
inline size_t shared_limit() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  int optin = 0;
  check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
        "cudaDeviceGetAttribute");
  return static_cast<size_t>(optin) - 2048;  // static shared variables and reserve
}

// Whether the float32 backward runs 3 blocks per SM (80 registers per thread, the kernel
// compiled for input blocks up to the layer's largest l): with a radial table and inputs of
// l <= 2 (MACE with hidden irreps up to l = 1, SevenNet-0's layers 1-3).
// - l = 2 inputs: SevenNet-0's layers 1-3 at 32,000 atoms 10.35 -> 9.20 ms each, 864 atoms
//   0.331 -> 0.311; at 4 blocks per SM 12.58 and 0.352 (H200,
//   benchmarks/results/l3_backward_occupancy/call1). An older kernel lost at 3 blocks (89.0
//   against 85.1 ms for the model, H100, gpu_summary.md).
// - l = 3 inputs (SevenNet-l3i5's layers 1-3) stay at 2 blocks: at 3 they took 54.7 against
//   38.6 ms per layer at 32,000 atoms (4 blocks 54.4; the same record). That kernel is bound by
//   instruction fetch, and more resident warps miss more (ncu: the no-instruction stall went
//   1.87 -> 8.56 cycles per issue; benchmarks/results/l3_backward_ncu/).
template <class T>
bool three_backward_blocks(const typename Conv<T>::View& v) {
  return v.table != nullptr && v.max_d1 <= 5;
}

// The float32 backward of a layer whose inputs (the first layer of SevenNet and MACE) or
// outputs (the last of SevenNet) are all scalars runs a kernel compiled for those paths
// alone, 4 blocks per SM (64 registers). Before, scalar inputs ran the l <= 1 kernel (3 blocks
// per SM) and scalar outputs the kernel of the layer's largest input l (2 blocks per SM).
// H100, 32,000 atoms, backward ms (benchmarks/results/conv_scalar_ahead/):
// - scalar inputs: SevenNet-0 3.24 -> 2.50, SevenNet-l3i5 4.20 -> 3.38, MACE-MP-0 medium
//   7.50 -> 5.98 (864 atoms 0.123 -> 0.093, 0.166 -> 0.128, 0.286 -> 0.222); at 5 blocks
//   per SM it spills 464 bytes and SevenNet-l3i5 took 3.99, MACE 6.88;
// - scalar outputs: SevenNet-0 3.37 -> 2.19, SevenNet-l3i5 4.22 -> 2.64 (864 atoms
//   0.113 -> 0.078, 0.140 -> 0.095); 3 blocks per SM 2.46 and 2.96.
// The forward of those layers at 5 or 6 blocks per SM was faster for SevenNet's scalar
// outputs at 32,000 atoms (1.14 -> 0.91 ms) but slower at 864 atoms and for MACE's scalar
// inputs at both sizes (3.16 -> 3.36-3.42 ms, 0.115 -> 0.142-0.147): not kept.
constexpr int kScalarPathBlocks = 4;

// Largest edge chunk to try: 8 with the radial MLP, 16 with a radial table. A larger chunk
// reads the MLP's weights fewer times and synchronizes less, but takes more shared memory
// (benchmarks/results/gpu_summary.md has the measurements). The backward of layers with
// l = 3 inputs and l > 0 outputs takes at most 4 edges: SevenNet-l3i5's layers 1-3 at 2
// blocks per SM (H100, 32,000 atoms, benchmarks/results/backward_chunk_cap/) ran 37.3 ms
// each at 4 edges, 50.5 at 8 and (with rows of their own) 44.5 at 6 against 38.2 at 4; only
// at 864 atoms were 8 edges faster (1.06 against 1.10 ms). Its last layer (scalar outputs,
// the 4-block kernel) is not capped: capped, it took 4.67 ms against 2.66 at 32,000 atoms
// (0.153 against 0.095 at 864; benchmarks/results/backward_l1_carveout/, call 4).
template <class T>
int max_edge_chunk(const typename Conv<T>::View& view, bool backward) {
  if (backward && view.max_d1 == 7 && view.max_d3 > 1) return 4;
  return view.table != nullptr ? 16 : 8;
}

// What `fact(device)` says of `kernel` launched with `threads` threads and `bytes` of dynamic
// shared memory on the current device, computed once per device, kernel and size (the launch
// path asks at every call); each caller's `fact` has a table of its own.
template <class Kernel, class Fact>
auto remembered_per_kernel(Kernel kernel, size_t bytes, int threads, Fact&& fact) {
  using Value = std::invoke_result_t<Fact&, int>;
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, size_t, int>, Value> known;
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  const auto key = std::make_tuple(device, reinterpret_cast<const void*>(kernel), bytes, threads);
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = known.find(key); it != known.end()) return it->second;
  const Value value = fact(device);
  known.emplace(key, value);
  return value;
}

// Whether `bytes` of dynamic shared memory (beside the kernel's static shared memory) leave one
// SM as many blocks of `threads` threads of `kernel` as its registers and launch bounds allow;
// remembered per device, kernel and size (the launch path asks every call).
template <class Kernel>
bool shared_keeps_occupancy(Kernel kernel, size_t bytes, int threads = kThreads) {
  return remembered_per_kernel(kernel, bytes, threads, [&](int device) {
    int per_sm = 0, reserved = 0, register_blocks = 0;
    check(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device),
          "cudaDeviceGetAttribute");
    check(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device),
          "cudaDeviceGetAttribute");
    cudaFuncAttributes attributes{};
    check(cudaFuncGetAttributes(&attributes, kernel), "cudaFuncGetAttributes");
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&register_blocks, kernel, threads, 0),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    const size_t per_block = bytes + attributes.sharedSizeBytes + static_cast<size_t>(reserved);
    return static_cast<size_t>(per_sm) / per_block >= static_cast<size_t>(register_blocks);
  });
}

// Blocks of `kernel` (`threads` threads, `bytes` of dynamic shared memory) resident on the
// whole device at once; remembered per device, kernel and size.
template <class Kernel>
int64_t resident_blocks(Kernel kernel, size_t bytes, int threads) {
  return remembered_per_kernel(kernel, bytes, threads, [&](int) {
    int per_sm = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, bytes),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    return std::max<int64_t>(1, static_cast<int64_t>(per_sm) * device_multiprocessors());
  });
}

// Graphs of fewer rows than this many waves of resident blocks split their last rows
// (split_rows); in larger ones the last wave is a small part of the launch.
constexpr int64_t kSplitWaves = 4;

// The rows of a graph of num_nodes rows that take two blocks each in a launch of `kernel`
// (`threads` threads, `bytes` of dynamic shared memory): in a graph of fewer than kSplitWaves
// waves of resident blocks, with R rows left after the full waves (all of them when there is
// less than one wave), the last R when their 2 R halves fit in one wave; otherwise none (0).
// Halving a row costs more than half of it (partial chunks: benchmarks/results/row_split/),
// so only the rows that would otherwise run alone at the end are split.
template <class Kernel>
int64_t split_rows(Kernel kernel, size_t bytes, int threads, int64_t num_nodes) {
  const int64_t resident = resident_blocks(kernel, bytes, threads);
  const int64_t last = num_nodes % resident;
  if (num_nodes >= kSplitWaves * resident || 2 * last > resident) return 0;
  return last;
}

// The RowSplit of a launch over a graph of num_nodes rows whose last `last` rows split
// (split_rows; `rows`: the call's ConvRows). A call over every row then takes them in the
// graph's order (`row_list` becomes null), so that the split rows are the last to start: the
// spatial order of spatial_rows (engine_cuda.cu) serves the L2 cache of large graphs, and
// these fit in it. A call over some rows (the halo's interior or boundary) gets two blocks per
// listed row, the second idle if the row is whole: each row's sums are the same whichever call
// runs it. The split rows' state is zeroed when first allocated or grown (each launch leaves
// it zero). `blocks` becomes the launch's grid.
inline RowSplit row_split(RowSplitScratch& scratch, int64_t last, int64_t num_nodes,
                          const ConvRows& rows, cudaStream_t stream, int64_t& blocks,
                          const int32_t*& row_list) {
  RowSplit split;
  split.from = num_nodes - last;
  const size_t split_count = static_cast<size_t>(last);
  if (scratch.state.size() < 2 * split_count) {
    scratch.state.resize(2 * split_count);
    scratch.state.zero(stream);
    // a call on another stream (ConvRows) may use it next
    check(cudaStreamSynchronize(stream), "row split state");
  }
  if (scratch.sums.size() < 12 * split_count) scratch.sums.resize(12 * split_count);
  split.state = scratch.state.data();
  split.sums = scratch.sums.data();
  if (rows.all() || rows.count == num_nodes) {  // every row: in the graph's order
    row_list = nullptr;
    blocks = num_nodes + last;
  } else {
    split.listed = true;
    blocks = 2 * rows.count;
  }
  return split;
}

// Launches pick's kernel for edge chunk EC, `warps` warps per block, if its workspace fits in
// shared memory and, when `full_occupancy`, if shared memory leaves the SM as many blocks as the
// kernel's registers allow. A chunk that costs a block per SM loses more than its fewer
// synchronizations gain: SevenNet-l3i5's backward at 32,000 atoms, all layers, 235.2 ms with
// 16-edge chunks (220.7 KB, 1 block per SM in layers 1-3) against 175.2 ms with this rule (H100,
// benchmarks/results/chunk_occupancy/).
template <class T, int EC, class Pick, class Launch>
bool launch_with(const Geometry<T>& geom, const typename Conv<T>::View& view, bool backward,
                 bool full_occupancy, size_t& bytes, Pick&& pick, Launch&& launch,
                 int warps = kWarps) {
  if (EC > max_edge_chunk<T>(view, backward)) return false;
  bytes = smem_layout<T>(view, geom.view.sh_dim, geom.view.num_basis, EC, backward).total;
  if (bytes > shared_limit()) return false;
  const auto kernel = pick(std::integral_constant<int, EC>{});
  if (full_occupancy && !shared_keeps_occupancy(kernel, bytes, 32 * warps)) return false;
  raise_dynamic_shared_limit(reinterpret_cast<const void*>(kernel), bytes, "cudaFuncSetAttribute");
  launch(kernel, bytes, 32 * warps);
  return true;
}

// Channel pairs are read as one vector (lane_channels): the node rows must be aligned to it.
template <class T>
void check_row_alignment(const typename Conv<T>::View& view, const T* rows) {
  if (reinterpret_cast<uintptr_t>(rows) % (sizeof(T) * view.max_lane_channels) != 0)
    throw Error("internal: convolution input rows not aligned for paired-channel loads");
}

// Edges per chunk of the wide kernel (launch_largest_chunk's `wide`).
constexpr int kWideChunk = 16;

// The largest chunk of 16, 8, 4 or 2 edges that keeps the kernel's full occupancy, else the
// largest that fits: `pick(ec)` is the kernel of kWarps warps for chunk ec, and
// `launch(kernel, bytes, threads)` starts it. `wide`, if given, is a kernel of kWideChunk-edge
// chunks and kWideConvWarps warps (the forward's, conv.cu), tried where the 16-edge chunk costs
// pick's kernel blocks per SM and leaves the wide kernel its own: two blocks of 16 warps share
// each chunk's M rows and one output sum where four of 8 warps took 4-edge chunks.
// SevenNet-l3i5's layers 1-3 (95 KB at 16 edges), H200, forward ms per layer at 32,000 atoms,
// 8 -> 16 warps: 11.99 -> 9.53 (864 atoms 0.370 -> 0.300; benchmarks/results/warps16_probe/).
// Where 16-edge chunks keep full occupancy, 16 warps lost: SevenNet-0's layers 1-3
// 3.65 -> 4.28, MACE-MP-0 medium's layer 1 7.87 -> 11.21.
template <class T, class Pick, class Launch>
void launch_largest_chunk(
    const Geometry<T>& geom, const typename Conv<T>::View& view, bool backward, const char* what,
    const char* kernel, Pick&& pick, Launch&& launch,
    std::invoke_result_t<Pick&, std::integral_constant<int, kWideChunk>> wide = nullptr) {
  size_t bytes = 0;
  const auto pick_wide = [&](auto) { return wide; };
  auto largest = [&](bool full) {
    return launch_with<T, 16>(geom, view, backward, full, bytes, pick, launch) ||
           (full && wide &&
            launch_with<T, kWideChunk>(geom, view, backward, full, bytes, pick_wide, launch,
                                       kWideConvWarps)) ||
           launch_with<T, 8>(geom, view, backward, full, bytes, pick, launch) ||
           launch_with<T, 4>(geom, view, backward, full, bytes, pick, launch) ||
           launch_with<T, 2>(geom, view, backward, full, bytes, pick, launch);
  };
  if (!largest(true) && !largest(false)) {
    throw Error(std::string("the ") + what + " does not fit in shared memory (" +
                std::to_string(bytes) + " bytes for 2 edges)");
  }
  check_launch(kernel);
}

// The non-linear block's exact RadialMLP (conv.cuh): its weights for the edges of g's rows
// (with `reverse`, those of the messages the rows send, and their r-derivatives) into
// conv.edge_weights, and the view that reads them as a table of one interval per edge.
// Sized by g.num_edges, the whole graph's edge count known on the host (first_receivers keeps
// it: edges past the rows' own are left unwritten); only without it is the count read back
// from the device (a stream synchronization).
template <class T>
typename Conv<T>::View per_edge_weights(const Geometry<T>& geom, const Conv<T>& conv,
                                        const GraphView& g, int64_t neighbor_end, bool reverse,
                                        cudaStream_t stream, bool ready = false) {
  int64_t edges = 0;
  if (g.num_edges >= 0) {
    edges = g.num_edges;
  } else {
    check(cudaMemcpyAsync(&edges, g.row_offsets + g.num_nodes, sizeof(int64_t),
                          cudaMemcpyDeviceToHost, stream),
          "edge count download");
    check(cudaStreamSynchronize(stream), "edge count download");
  }
  if (edges >= std::numeric_limits<int>::max())
    throw Error("the non-linear block's per-edge RadialMLP on CUDA: " + std::to_string(edges) +
                " edges, 2^31 or more are not supported; use radial='table'");
  DeviceArray<T>& out = *conv.edge_weights;
  out.resize(std::max<size_t>(1, static_cast<size_t>(edges) * conv.view.weight_numel * 4));
  const int hidden = conv.radial_mlp_hidden;
  const size_t smem = sizeof(double) * 4 * hidden * (kEdgeMlpThreads / kWarp);
  const auto blocks = static_cast<unsigned>(blocks_for(g.num_nodes * kWarp, kEdgeMlpThreads));
  if (!ready) {  // ConvRows::edge_weights_ready: written for this graph just before
    if (reverse)
      radial_mlp_edges_kernel<T, true><<<blocks, kEdgeMlpThreads, smem, stream>>>(
          geom.view, conv.radial_mlp, hidden, g, neighbor_end, true, out.data());
    else
      radial_mlp_edges_kernel<T, false><<<blocks, kEdgeMlpThreads, smem, stream>>>(
          geom.view, conv.radial_mlp, hidden, g, neighbor_end, false, out.data());
    check_launch("radial_mlp_edges_kernel");
  }
  typename Conv<T>::View v = conv.view;
  v.table = out.data();
  v.table_intervals = static_cast<int>(std::max<int64_t>(1, edges));
  v.table_fine_intervals = v.table_intervals;
  v.table_coarse_shift = 0;
  v.table_origin = 0.0;
  v.table_inv_step = 1.0;  // dR/dr = c1 exactly (radial_table_grad at t = 0)
  v.pair_slot = nullptr;
  v.sparse_cg = false;  // the forward kernel compiled for it reads M (smem_layout agrees)
  return v;
}

// The convolution backward over `rows` of g (`view`: conv's, or per_edge_weights' for a
// non-linear block), one launch of the kernels compiled for SPLIT. Without SPLIT and in
// float32, nothing is launched where the graph would split rows (split_rows): false, and
// conv_backward_split launches it with the kernels that can.
template <class T, bool SPLIT>
bool conv_backward_launch(const Geometry<T>& geom, const Conv<T>& conv,
                          const typename Conv<T>::View& view, const GraphView& g,
                          int64_t receiver_rows, const T* x, const T* grad_y, T* grad_x,
                          double* forces, double* atom_virials, const RemoteForces& remote,
                          int64_t* error_node, cudaStream_t stream, const ConvRows& rows) {
  static_assert(!SPLIT || std::is_same_v<T, float>, "rows split in float32 only");
  bool launched = true;
  const auto launch = [&](auto kernel, size_t smem, int threads) {
    int64_t blocks = rows.all() ? g.num_nodes : rows.count;
    const int32_t* row_list = rows.all() ? nullptr : rows.rows;
    RowSplit split;
    if constexpr (std::is_same_v<T, float>) {
      const int64_t last = split_rows(kernel, smem, threads, g.num_nodes);
      if constexpr (SPLIT) {
        if (last > 0)
          split = row_split(*conv.row_split, last, g.num_nodes, rows, stream, blocks, row_list);
      } else if (last > 0) {
        launched = false;
        return;
      }
    }
    kernel<<<blocks, threads, smem, stream>>>(geom.view, view, g, receiver_rows, x, grad_y, grad_x,
                                              forces, atom_virials, remote, error_node, row_list,
                                              split);
  };
  if (conv.radial_mlp.layers > 0) {
    launch_largest_chunk(
        geom, view, true, "convolution backward", "conv_backward_kernel",
        [&](auto ec) {
          return conv_backward_kernel<T, decltype(ec)::value, true, 2, 7, 7, true, false, SPLIT>;
        },
        launch);
    return launched;
  }
  launch_largest_chunk(
      geom, view, true, "convolution backward", "conv_backward_kernel",
      [&](auto ec) {
        constexpr int EC = decltype(ec)::value;
        auto kernel = view.table ? conv_backward_kernel<T, EC, true, 2, 7, 7, false, false, SPLIT>
                                 : conv_backward_kernel<T, EC, false, 2, 7, 7, false, false, SPLIT>;
        if constexpr (std::is_same_v<T, float>) {
          constexpr int S = kScalarPathBlocks;
          const bool sparse = sparse_backward<T>(view);
          if (view.table && view.max_d1 == 1)
            kernel = sparse ? conv_backward_kernel<T, EC, true, S, 1, 7, false, true, SPLIT>
                            : conv_backward_kernel<T, EC, true, S, 1, 7, false, false, SPLIT>;
          else if (view.table && view.max_d3 == 1)
            kernel = sparse ? conv_backward_kernel<T, EC, true, S, 7, 1, false, true, SPLIT>
                            : conv_backward_kernel<T, EC, true, S, 7, 1, false, false, SPLIT>;
          else if (three_backward_blocks<T>(view))
            kernel = view.max_d1 <= 3
                         ? conv_backward_kernel<T, EC, true, 3, 3, 7, false, false, SPLIT>
                         : conv_backward_kernel<T, EC, true, 3, 5, 7, false, false, SPLIT>;
        }
        return kernel;
      },
      launch);
  return launched;
}

}  // namespace

// conv_backward_launch with SPLIT (conv_backward_split_f32.cu, a translation unit of its own
// so that it builds in parallel with conv_backward_f32.cu).
void conv_backward_split(const Geometry<float>& geom, const Conv<float>& conv,
                         const typename Conv<float>::View& view, const GraphView& g,
                         int64_t receiver_rows, const float* x, const float* grad_y, float* grad_x,
                         double* forces, double* atom_virials, const RemoteForces& remote,
                         int64_t* error_node, cudaStream_t stream, const ConvRows& rows);

template <class T>
void conv_backward(const Geometry<T>& geom, const Conv<T>& conv, const GraphView& g,
                   int64_t receiver_rows, const T* x, const T* grad_y, T* grad_x, double* forces,
                   double* atom_virials, const RemoteForces& remote, int64_t* error_node,
                   cudaStream_t stream, const ConvRows& rows) {
  if (g.num_nodes == 0) return;
  check_row_alignment<T>(conv.view, x);
  check_row_alignment<T>(conv.view, grad_y);
  const typename Conv<T>::View view =
      conv.radial_mlp.layers > 0
          ? per_edge_weights(geom, conv, g, receiver_rows, true, stream, rows.edge_weights_ready)
          : conv.view;
  if (rows.count == 0) return;
  if (conv_backward_launch<T, false>(geom, conv, view, g, receiver_rows, x, grad_y, grad_x, forces,
                                     atom_virials, remote, error_node, stream, rows))
    return;
  if constexpr (std::is_same_v<T, float>)
    conv_backward_split(geom, conv, view, g, receiver_rows, x, grad_y, grad_x, forces, atom_virials,
                        remote, error_node, stream, rows);
}

}  // namespace e3fuse::cuda
