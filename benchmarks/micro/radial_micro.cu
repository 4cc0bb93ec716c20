// benchmarks/micro/radial_micro.cu: the radial weights of every convolution layer, produced
// two ways over the same edges and summed per receiver, as the forward tensor product would
// consume them (issue 21: "radial weights that do not cost a table row per edge"):
//
//  - table: the engine's cubic table in r (conv_forward's TABLE path): per edge and weight one
//    16-byte read of its coefficients (load_table_entry), evaluated at the edge's r;
//  - mma: the radial MLP over tiles of ET edges on the tensor cores (3xTF32, mma_tf32.cuh),
//    each block taking R consecutive receivers (--rows; a tile may span receivers): the
//    embedding and hidden layers in shared memory, the last layer's fragments read once per
//    tile (pre-split into TF32 parts as make_conv stores them, or with --plain 1 as float32
//    split in registers: half the bytes), its products summed per receiver straight from the
//    accumulators (no per-edge copy of the weights). Per edge the last layer then reads
//    hidden x weights x 8 (or 4) / ET bytes, against 16 x weights for the table.
//
//   e3fuse_radial_micro --model M.e3f --structure S.bin [--skin 0.5] [--tile 16|32|64|128]
//                       [--rows R] [--plain 0|1] [--warmup 3] [--repeats 20] [--json-out R.json]
//
// Both write out[i][m] = sum over receiver i's edges inside the cutoff of weight m; the two
// sums are compared (the largest difference over the largest |sum|, printed per layer: the
// table's interpolation and 3xTF32's rounding, about 1e-6) and a layer whose sums differ by
// more than 1e-4 of their scale fails the run. What is timed is the production of the
// weights alone: neither kernel reads x_j or runs a tensor product. float32 only (the tensor
// cores); SevenNet and MACE models whose radial MLP depends on r alone (no species pairs).
// Built only with -DE3FUSE_MICROBENCH=ON (benchmarks/micro/README.md).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/typed_plan.h"
#include "cuda/common.cuh"
#include "cuda/conv.cuh"
#include "cuda/conv_kernels.cuh"
#include "cuda/mma_tf32.cuh"
#include "e3fuse/error.h"
#include "e3fuse/model.h"
#include "micro_common.h"
#include "micro_inputs.cuh"
#include "model/plan.h"
#include "neighbors/neighbor_list.cuh"

namespace {

using e3fuse::Error;
using e3fuse::cuda::check;
using e3fuse::cuda::DeviceArray;
using e3fuse::cuda::kThreads;
using e3fuse::cuda::kWarps;
using e3fuse_micro::json_list;
using e3fuse_micro::LaunchTimer;
using View = e3fuse::cuda::Conv<float>::View;
using GeoView = e3fuse::cuda::Geometry<float>::View;

constexpr int kTableChunk = 32;    // edges per chunk of the table kernel (one warp's scan)
constexpr int kMaxPerThread = 16;  // weights per thread of the table kernel: up to 4,096

struct Options : e3fuse_micro::StructureOptions {
  int tile = 64, rows = 1;
  bool plain = false;
};

Options parse(int argc, char** argv) {
  Options o;
  e3fuse_micro::parse_pairs(argc, argv, [&](const std::string& key, const std::string& value) {
    if (key == "--tile") {
      o.tile = std::stoi(value);
    } else if (key == "--rows") {
      o.rows = std::stoi(value);
    } else if (key == "--plain") {
      o.plain = value == "1";
      if (value != "0" && value != "1") throw Error("--plain must be 0 or 1");
    } else {
      return o.take(key, value);
    }
    return true;
  });
  o.validate();
  if (o.dtype != "float32") throw Error("--dtype: the tensor-core MLP is float32 only");
  if (o.tile != 16 && o.tile != 32 && o.tile != 64 && o.tile != 128)
    throw Error("--tile must be 16, 32, 64 or 128");
  if (o.rows < 1 || o.rows > 16) throw Error("--rows must be 1 to 16");
  return o;
}

// out[i][m] = sum over row i's edges inside the cutoff of table weight m at the edge's r.
__global__ void __launch_bounds__(kThreads)
    table_weights_kernel(GeoView geo, View c, e3fuse::GraphView g, float* out,
                         int64_t* error_node) {
  namespace cu = e3fuse::cuda;
  __shared__ int64_t s_edge[kTableChunk];
  __shared__ int s_interval[kTableChunk];
  __shared__ float s_t[kTableChunk];
  __shared__ int64_t s_pos;
  __shared__ int s_count;
  const int64_t i = blockIdx.x;
  if (threadIdx.x == 0) s_pos = g.row_offsets[i];
  const int64_t end = g.row_offsets[i + 1];
  const double cutoff2 = geo.cutoff * geo.cutoff;
  float acc[kMaxPerThread] = {};
  __syncthreads();
  while (true) {
    cu::take_chunk<kTableChunk>(g, i, cutoff2, INT64_MAX, end, &s_pos, &s_count, s_edge,
                                error_node);
    const int n = s_count;
    if (n == 0) break;
    if (threadIdx.x < n) {
      double v[3];
      cu::edge_vector(g, i, s_edge[threadIdx.x], v);
      const double r = sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
      int iv = 0;
      double t = 0.0;
      e3fuse::ops::radial_table_locate(r, c.table_origin, c.table_inv_step, c.table_intervals,
                                       c.table_fine_intervals, c.table_coarse_shift, iv, t);
      s_interval[threadIdx.x] = iv;
      s_t[threadIdx.x] = static_cast<float>(t);
    }
    __syncthreads();
    for (int e = 0; e < n; ++e) {
      const int iv = s_interval[e];
      const float t = s_t[e];
#pragma unroll
      for (int k = 0; k < kMaxPerThread; ++k) {
        const int m = threadIdx.x + k * kThreads;
        if (m < c.weight_numel) {
          float coef[4];
          cu::load_table_entry(cu::table_entry<float>(c, iv, m), coef);
          acc[k] += e3fuse::ops::radial_table_value(coef, t);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int k = 0; k < kMaxPerThread; ++k) {
    const int m = threadIdx.x + k * kThreads;
    if (m < c.weight_numel) out[i * c.weight_numel + m] = acc[k];
  }
}

// The tile's input rows [ET][K] (float) split into TF32 high and low parts for the B operands.
template <int ET>
__device__ void split_rows(const float* in, int K, uint32_t* hi, uint32_t* lo) {
  for (int q = threadIdx.x; q < ET * K; q += blockDim.x) {
    const uint32_t h = e3fuse::cuda::to_tf32(in[q]);
    hi[q] = h;
    lo[q] = e3fuse::cuda::to_tf32(in[q] - __uint_as_float(h));
  }
}

// D = A B for the ET edges of the tile and the 16-row m-tiles of the warp (A: a layer's
// weights, M x K, as m16n8k8 fragments: pre-split into TF32 parts by make_conv
// (append_tf32_fragments, 32 bytes per lane and k-step) or, with `plain`, one float4 per
// lane and k-step split here (half the bytes); B: the split rows [ET][K]). epilogue(mt, d)
// gets each m-tile's accumulators d[nt][4] (mma_tf32.cuh's layout: lane 4 g + t holds rows
// m0 + g and m0 + g + 8 of edges 8 nt + 2 t and 8 nt + 2 t + 1). Not chunk_gemm_tf32: that
// keeps every B operand of the chunk in registers (32 per 8 edges at K = 64), which tiles of
// 32-128 edges cannot afford; here B is read from shared memory per m-tile.
template <int ET, class Epilogue>
__device__ void tile_product(const uint32_t* hi, const uint32_t* lo, int K,
                             const float4* __restrict__ frag, const float4* __restrict__ plain,
                             int M, Epilogue&& epilogue) {
  namespace cu = e3fuse::cuda;
  constexpr int NT = ET / 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int ksteps = (K + 7) / 8, mtiles = (M + 15) / 16;
  for (int mt = warp; mt < mtiles; mt += kWarps) {
    float d[NT][4] = {};
    for (int ks = 0; ks < ksteps; ++ks) {
      uint32_t ah[4], al[4];
      if (plain) {
        const float4 a = __ldg(plain + (static_cast<size_t>(mt) * ksteps + ks) * 32 + lane);
        const float v[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          ah[q] = cu::to_tf32(v[q]);
          al[q] = cu::to_tf32(v[q] - __uint_as_float(ah[q]));
        }
      } else {
        const float4* f = frag + 2 * ((static_cast<size_t>(mt) * ksteps + ks) * 32 + lane);
        const float4 h = __ldg(f), l = __ldg(f + 1);
        const float hv[4] = {h.x, h.y, h.z, h.w}, lv[4] = {l.x, l.y, l.z, l.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          ah[q] = __float_as_uint(hv[q]);
          al[q] = __float_as_uint(lv[q]);
        }
      }
      const int k0 = 8 * ks + t, k1 = k0 + 4;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int row = (8 * nt + g) * K;
        const uint32_t bh[2] = {k0 < K ? hi[row + k0] : 0u, k1 < K ? hi[row + k1] : 0u};
        const uint32_t bl[2] = {k0 < K ? lo[row + k0] : 0u, k1 < K ? lo[row + k1] : 0u};
        cu::mma_3xtf32(d[nt], ah, al, bh, bl);
      }
    }
    epilogue(mt, d);
  }
}

// Warp 0 fills the tile with the next edges inside the cutoff of the block's rows
// [*row, row_end), continuing across rows: s_edge and s_local (the edge's row, counted from
// the block's first row); returns the count through *count. Block-wide sync after. The scan
// of one row is take_chunk's (conv_kernels.cuh), which stops at the end of its row.
template <int ET>
__device__ void take_tile(const e3fuse::GraphView& g, double cutoff2, int64_t first_row,
                          int64_t row_end, int64_t* row, int64_t* pos, int* count, int64_t* s_edge,
                          int* s_local, int64_t* error_node) {
  namespace cu = e3fuse::cuda;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int64_t i = *row, p = *pos;
    int filled = 0;
    while (filled < ET && i < row_end) {
      const int64_t end = g.row_offsets[i + 1];
      if (p >= end) {
        ++i;
        if (i < row_end) p = g.row_offsets[i];
        continue;
      }
      const int64_t e = p + lane;
      bool ok = false;
      if (e < end) {
        double v[3];
        cu::edge_vector(g, i, e, v);
        const double r2 = v[0] * v[0] + v[1] * v[1] + v[2] * v[2];
        ok = r2 < cutoff2;
        if (r2 == 0.0) {
          ok = false;
          atomicMax(reinterpret_cast<unsigned long long*>(error_node),
                    static_cast<unsigned long long>(i + 1));
        }
      }
      const unsigned mask = __ballot_sync(cu::kFullMask, ok);
      const int need = ET - filled;
      const int rank = __popc(mask & ((1u << lane) - 1u));
      if (ok && rank < need) {
        s_edge[filled + rank] = e;
        s_local[filled + rank] = static_cast<int>(i - first_row);
      }
      const int found = __popc(mask);
      if (found > need) {  // stop right after the need-th edge found
        const unsigned last = __ballot_sync(cu::kFullMask, ok && rank == need - 1);
        p += __ffs(last);
        filled = ET;
      } else {
        p = p + 32 < end ? p + 32 : end;
        filled += found;
      }
    }
    if (lane == 0) {
      *row = i;
      *pos = p;
      *count = filled;
    }
  }
  __syncthreads();
}

// out[i][m] = sum over row i's edges inside the cutoff of MLP weight m. Each block takes R
// consecutive rows and runs their edges in tiles of ET (a tile may span rows). Shared
// memory: the layer input [ET][H] (float), its TF32 parts [ET][H] x 2, the sums [R][W].
template <int ET>
__global__ void __launch_bounds__(kThreads)
    mma_weights_kernel(GeoView geo, View c, e3fuse::GraphView g, int rows_per_block,
                       const float4* plain_last, float* out, int64_t* error_node) {
  namespace cu = e3fuse::cuda;
  constexpr int NT = ET / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  const int H = c.max_hidden, W = c.weight_numel, L = c.mlp_layers, R = rows_per_block;
  float* rows = reinterpret_cast<float*>(smem);
  uint32_t* hi = reinterpret_cast<uint32_t*>(rows + ET * H);
  uint32_t* lo = hi + ET * H;
  float* sums = reinterpret_cast<float*>(lo + ET * H);
  __shared__ int64_t s_edge[ET];
  __shared__ int s_local[ET];
  __shared__ int64_t s_row, s_pos;
  __shared__ int s_count;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * R;
  const int64_t row_end = first + R < g.num_nodes ? first + R : g.num_nodes;
  for (int q = threadIdx.x; q < R * W; q += blockDim.x) sums[q] = 0.0f;
  if (threadIdx.x == 0) {
    s_row = first;
    s_pos = g.row_offsets[first];
  }
  const double cutoff2 = geo.cutoff * geo.cutoff;
  const int lane = threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
  __syncthreads();
  while (true) {
    take_tile<ET>(g, cutoff2, first, row_end, &s_row, &s_pos, &s_count, s_edge, s_local,
                  error_node);
    const int n = s_count;
    if (n == 0) break;
    const int nb = c.dims[0];
    if (threadIdx.x < ET) {  // the embedding in double, as chunk_geometry; zero past n
      double b[cu::kMaxBasis] = {};
      if (threadIdx.x < n) {
        double v[3];
        cu::edge_vector(g, first + s_local[threadIdx.x], s_edge[threadIdx.x], v);
        const double r = sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
        if (geo.mace_embedding) {
          double f = 1.0, df = 0.0;
          e3fuse::ops::mace_edge_embedding<double>(geo.num_basis, geo.coeffs, geo.prefactor,
                                                   geo.envelope, geo.transform, geo.apply_cutoff, r,
                                                   1.0, b, nullptr, f, df);
        } else {
          e3fuse::ops::edge_embedding<double>(geo.num_basis, geo.coeffs, geo.prefactor,
                                              geo.envelope, r, b, nullptr);
        }
      }
      for (int k = 0; k < nb; ++k) rows[threadIdx.x * nb + k] = static_cast<float>(b[k]);
    }
    __syncthreads();
    const int local_lo = s_local[0], local_hi = s_local[n - 1];
    for (int l = 0; l < L; ++l) {
      const int K = c.dims[l], N = c.dims[l + 1];
      split_rows<ET>(rows, K, hi, lo);
      __syncthreads();
      if (l + 1 < L) {  // hidden layer: activation(A B) back into rows [ET][N]
        tile_product<ET>(
            hi, lo, K, c.frag_fwd[l], nullptr, N, [&](int mt, const float (&d)[NT][4]) {
#pragma unroll
              for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                  const int m = 16 * mt + gq + (q >= 2 ? 8 : 0);
                  const int e = 8 * nt + 2 * tq + (q & 1);
                  if (m < N)
                    rows[e * N + m] = e3fuse::ops::activation(c.act, d[nt][q]) * c.act_scale;
                }
            });
      } else {  // last layer: each weight summed over the tile's edges of each row, in order
        tile_product<ET>(hi, lo, K, plain_last ? nullptr : c.frag_fwd[l], plain_last, N,
                         [&](int mt, const float (&d)[NT][4]) {
                           const int m = 16 * mt + gq;
                           for (int r = local_lo; r <= local_hi; ++r) {
                             float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
                             for (int nt = 0; nt < NT; ++nt) {
                               const int e = 8 * nt + 2 * tq;
                               if (e < n && s_local[e] == r) {
                                 s0 += d[nt][0];
                                 s1 += d[nt][2];
                               }
                               if (e + 1 < n && s_local[e + 1] == r) {
                                 s0 += d[nt][1];
                                 s1 += d[nt][3];
                               }
                             }
                             s0 += __shfl_xor_sync(cu::kFullMask, s0, 1);
                             s0 += __shfl_xor_sync(cu::kFullMask, s0, 2);
                             s1 += __shfl_xor_sync(cu::kFullMask, s1, 1);
                             s1 += __shfl_xor_sync(cu::kFullMask, s1, 2);
                             if (tq == 0 && m < N) sums[r * W + m] += s0;
                             if (tq == 0 && m + 8 < N) sums[r * W + m + 8] += s1;
                           }
                         });
      }
      __syncthreads();
    }
  }
  for (int q = threadIdx.x; q < (row_end - first) * W; q += blockDim.x)
    out[first * W + q] = sums[q];
}

// A (M x K, row-major) as m16n8k8 A fragments of plain float32 (one float4 per lane and
// k-step, append_tf32_fragments' order), zero-padded to whole 16 x 8 tiles.
std::vector<float> plain_fragments(const std::vector<float>& A, int M, int K) {
  const int mtiles = (M + 15) / 16, ksteps = (K + 7) / 8;
  auto at = [&](int m, int k) { return m < M && k < K ? A[static_cast<size_t>(m) * K + k] : 0.0f; };
  std::vector<float> out;
  for (int mt = 0; mt < mtiles; ++mt)
    for (int ks = 0; ks < ksteps; ++ks)
      for (int lane = 0; lane < 32; ++lane) {
        const int m = 16 * mt + lane / 4, k = 8 * ks + lane % 4;
        for (float v : {at(m, k), at(m + 8, k), at(m, k + 4), at(m + 8, k + 4)}) out.push_back(v);
      }
  return out;
}

template <int ET>
void launch_mma(const GeoView& geo, const View& c, const e3fuse::GraphView& g, int rows_per_block,
                const float4* plain_last, float* out, int64_t* error_node, cudaStream_t stream) {
  const size_t bytes =
      sizeof(float) * (3 * static_cast<size_t>(ET) * c.max_hidden +
                       static_cast<size_t>(rows_per_block) * static_cast<size_t>(c.weight_numel));
  check(cudaFuncSetAttribute(mma_weights_kernel<ET>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(bytes)),
        "cudaFuncSetAttribute");
  const int64_t blocks = (g.num_nodes + rows_per_block - 1) / rows_per_block;
  mma_weights_kernel<ET><<<static_cast<unsigned>(blocks), kThreads, bytes, stream>>>(
      geo, c, g, rows_per_block, plain_last, out, error_node);
  check(cudaGetLastError(), "mma_weights_kernel");
}

int run_float32(const Options& opt) {
  namespace cu = e3fuse::cuda;
  const auto model = e3fuse::Model::load(opt.model);
  const e3fuse::ModelPlan& plan = model->plan();
  const e3fuse_micro::Structure s = e3fuse_micro::read_structure(opt.structure);
  const int64_t n = s.n;
  const e3fuse_micro::DeviceStream ds;
  cudaStream_t stream = ds.stream;

  const e3fuse_micro::DeviceGraph graph(s, plan.cutoff, opt.skin, stream);
  const e3fuse::GraphView& g = graph.view;
  const cu::DeviceNeighborList& neighbors = graph.neighbors;

  const bool mace = plan.family == "mace";
  const e3fuse::cpu::TypedPlan<float> typed = e3fuse::cpu::make_typed_plan<float>(plan, !mace);
  const cu::Geometry<float> geom = cu::make_geometry<float>(typed);
  if (geom.view.mace_embedding && geom.view.transform.kind != e3fuse::DistanceTransform::none)
    throw Error("a distance transform (species-pair radial input) is not timed here");
  const std::vector<const e3fuse::ConvPlan*> conv_plans = e3fuse_micro::conv_plans(plan);
  DeviceArray<int64_t> error_node;
  error_node.resize(2);
  error_node.zero();

  std::ostringstream layers;
  const int launches = opt.warmup + opt.repeats;
  for (size_t t = 0; t < conv_plans.size(); ++t) {
    const e3fuse::cpu::Conv<float> host_conv =
        mace ? e3fuse::cpu::make_conv<float>(*conv_plans[t], &plan) : typed.layers[t].conv;
    const cu::Conv<float> conv = cu::make_conv<float>(host_conv);
    const View& c = conv.view;
    if (!c.table || c.pair_slot) throw Error("layer " + std::to_string(t) + ": no single table");
    if (!c.frag_fwd[0] || c.mlp_layers < 1)
      throw Error("layer " + std::to_string(t) + ": no tensor-core MLP (needs sm_80)");
    if (c.weight_numel > kMaxPerThread * kThreads)
      throw Error("layer " + std::to_string(t) + ": more than 4,096 weights");
    const size_t size = static_cast<size_t>(n) * c.weight_numel;
    // the last layer's A = W^T (weight_numel x hidden) as plain float32 fragments (--plain 1)
    const int last = c.mlp_layers - 1;
    DeviceArray<float4> plain_last;
    {
      const std::vector<float> f =
          plain_fragments(host_conv.mlp.weight_t[last], c.dims[last + 1], c.dims[last]);
      plain_last.upload(reinterpret_cast<const float4*>(f.data()), f.size() / 4);
    }
    DeviceArray<float> by_table, by_mma;
    by_table.resize(size);
    by_mma.resize(size);
    LaunchTimer table_timer(launches), mma_timer(launches);
    for (int r = 0; r < launches; ++r) {
      table_timer.start(r, stream);
      table_weights_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
          geom.view, c, g, by_table.data(), error_node.data());
      table_timer.stop(r, stream);
      check(cudaGetLastError(), "table_weights_kernel");
    }
    for (int r = 0; r < launches; ++r) {
      mma_timer.start(r, stream);
      const float4* plain = opt.plain ? plain_last.data() : nullptr;
      if (opt.tile == 16)
        launch_mma<16>(geom.view, c, g, opt.rows, plain, by_mma.data(), error_node.data(), stream);
      else if (opt.tile == 32)
        launch_mma<32>(geom.view, c, g, opt.rows, plain, by_mma.data(), error_node.data(), stream);
      else if (opt.tile == 64)
        launch_mma<64>(geom.view, c, g, opt.rows, plain, by_mma.data(), error_node.data(), stream);
      else
        launch_mma<128>(geom.view, c, g, opt.rows, plain, by_mma.data(), error_node.data(), stream);
      mma_timer.stop(r, stream);
    }
    check(cudaStreamSynchronize(stream), "the timed kernels");
    std::vector<float> a(size), b(size);
    by_table.download(a.data(), size);
    by_mma.download(b.data(), size);
    int64_t errors[2] = {0, 0};
    error_node.download(errors, 2);
    check(cudaDeviceSynchronize(), "download");
    if (errors[0]) throw Error("two atoms coincide (node " + std::to_string(errors[0] - 1) + ")");
    double scale = 0.0, diff = 0.0;
    for (size_t q = 0; q < size; ++q) {
      if (!std::isfinite(a[q]) || !std::isfinite(b[q]))
        throw Error("layer " + std::to_string(t) + ": weight sums not finite");
      scale = std::max(scale, static_cast<double>(std::fabs(a[q])));
      diff = std::max(diff, static_cast<double>(std::fabs(a[q] - b[q])));
    }
    const double relative = scale > 0.0 ? diff / scale : 0.0;
    if (scale == 0.0 || relative > 1e-4)
      throw Error("layer " + std::to_string(t) + ": table and MLP sums differ by " +
                  std::to_string(relative) + " of their scale " + std::to_string(scale));
    std::ostringstream dims;
    for (int l = 0; l <= c.mlp_layers; ++l) dims << (l ? ", " : "") << c.dims[l];
    layers << (t ? ",\n  " : "") << "{\"layer\": " << t << ", \"weight_numel\": " << c.weight_numel
           << ", \"mlp_dims\": [" << dims.str() << "], \"table_intervals\": " << c.table_intervals
           << ", \"max_relative_difference\": " << relative
           << ", \"table_ms\": " << json_list(table_timer.ms(opt.warmup))
           << ", \"mma_ms\": " << json_list(mma_timer.ms(opt.warmup)) << "}";
  }
  std::ostringstream out;
  out.precision(10);
  out << "{\"tool\": \"e3fuse_radial_micro\", \"model\": \"" << opt.model << "\", \"family\": \""
      << plan.family << "\", \"device\": \"" << ds.prop.name << "\", \"tile\": " << opt.tile
      << ", \"rows_per_block\": " << opt.rows << ", \"plain\": " << (opt.plain ? "true" : "false")
      << ", \"cutoff\": " << plan.cutoff << ", \"atoms\": " << n
      << ", \"edges_in_list\": " << neighbors.num_edges() << ", \"warmup\": " << opt.warmup
      << ", \"repeats\": " << opt.repeats << ",\n \"layers\": [\n  " << layers.str() << "]}\n";
  e3fuse_micro::emit_json(out.str(), opt.json_out);
  return 0;
}

int run_float64(const Options&) { throw Error("float32 only"); }

}  // namespace

int main(int argc, char** argv) {
  return e3fuse_micro::run_main<Options>("e3fuse_radial_micro", argc, argv, parse, run_float32,
                                         run_float64);
}
