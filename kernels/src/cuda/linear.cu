// cuda/linear.cu: e3nn o3.Linear on node features, forward and transpose (the GPU
// version of cpu/linear.cpp + cpu/linear_row.h).
//
// Per destination irrep block and component m the layer is a matrix product over
// nodes, dst[n][c] = sum_k src[n][k] W[k][c] (LinearTask, LinearSource in
// node_ops.cuh). The kernel tiles it as a GEMM: a block takes TN nodes and a
// 32-channel column tile of one destination block, stages 16-deep slices of the
// inputs and of the weights in shared memory, and each thread accumulates a 4 x 4
// (node x channel) tile in registers, so that one shared-memory read feeds four
// FMAs. Each output element is summed by one thread in a fixed order (sources in
// path order, k ascending): deterministic.
//
// With `species` (MACE's element-dependent linear) the block runs once per species
// present among its nodes, with that species' weights, and writes only those
// nodes' rows: one pass when the tile has a single element.
//
// float32 runs the same tiles on the tensor cores (linear_mma_kernel: mma.sync with
// the 3xTF32 split of mma_tf32.cuh, float32-accurate) on sm_80 and later; float64 runs the
// FMA kernel. The tensor-core kernel copies each slice's pre-split B fragments into shared
// memory (cp.async, double-buffered, once per block instead of once per warp and k-step
// from L2) while the previous slice's products run. Measured on an H200 at 32,000 atoms,
// linears' device time per 11 calls: MACE-MP-0 medium 104.6 (FMA kernel) -> 93.1 ms,
// SevenNet-0 92.9 -> 82.4 (benchmarks/results/linear_tc_h200 and session_final_h200, two
// calls on the same kind of card).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <map>
#include <type_traits>
#include <vector>

#include "cuda/mma_tf32.cuh"
#include "cuda/node_ops.cuh"

namespace e3fuse::cuda {

namespace {

constexpr int kTileK = 16;  // reduction slice staged in shared memory
constexpr int kMicro = 4;   // each thread: kMicro nodes x kMicro channels
constexpr int kColThreads = kLinearTileCols / kMicro;

template <int TN>
constexpr int linear_threads() {
  return (TN / kMicro) * kColThreads;
}

// Output element (node n, column c of the task's block, component m): bias (if any), plus
// its old value with accumulate, plus the product `value`.
template <class T>
__device__ __forceinline__ void store_output(const LinearTask& task, int m, int c, int64_t n,
                                             int64_t dim_dst, const T* __restrict__ bias,
                                             bool accumulate, T value, T* __restrict__ dst) {
  const int64_t e = task.offset + static_cast<int64_t>(task.col0 + c) * task.c_stride +
                    static_cast<int64_t>(m) * task.m_stride;
  T base = bias ? bias[e] : T(0);
  if (accumulate) base += dst[n * dim_dst + e];
  dst[n * dim_dst + e] = base + value;
}

// The smallest species above species_done among the tile's nodes [node0, node0 + TN)
// (INT_MAX: none left), in every thread of the block; slot: one int of shared memory.
template <int TN, int kBlockThreads>
__device__ int next_species_in_tile(const int32_t* __restrict__ species, int64_t node0,
                                    int64_t num_nodes, int species_done, int* slot) {
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) *slot = INT_MAX;
  __syncthreads();
  for (int r = tid; r < TN; r += kBlockThreads) {
    const int64_t n = node0 + r;
    if (n < num_nodes && species[n] > species_done) atomicMin(slot, species[n]);
  }
  __syncthreads();
  const int s = *slot;
  __syncthreads();
  return s;
}

// pass(s) for each species s present among the tile's nodes [node0, node0 + TN) in ascending
// order (the same s in every thread of the block), or once with s = 0 without `species`;
// slot: one int of shared memory.
template <int TN, int kBlockThreads, class Pass>
__device__ __forceinline__ void for_each_species_in_tile(const int32_t* __restrict__ species,
                                                         int64_t node0, int64_t num_nodes,
                                                         int* slot, const Pass& pass) {
  int species_done = -1;
  for (;;) {
    int s = 0;
    if (species) {
      s = next_species_in_tile<TN, kBlockThreads>(species, node0, num_nodes, species_done, slot);
      if (s == INT_MAX) return;
    }
    pass(s);
    if (!species) return;
    species_done = s;
  }
}

// grid: (node tiles of TN x tasks, 1, 1), the task fastest, or with split_m (small
// systems: shorter serial chains per block) (node tiles x tasks, 1, components m of the
// widest irrep).
template <class T, int TN>
__global__ void __launch_bounds__(linear_threads<TN>())
    linear_gemm_kernel(int64_t num_nodes, int64_t dim_src, int64_t dim_dst, int num_tasks,
                       const LinearTask* __restrict__ tasks,
                       const LinearSource* __restrict__ sources, const T* __restrict__ weights,
                       int64_t species_stride, const T* __restrict__ bias,
                       const int32_t* __restrict__ species, bool accumulate, bool split_m,
                       const T* __restrict__ src, T* __restrict__ dst) {
  constexpr int kThreadsPerBlock = linear_threads<TN>();
  // Rows padded by 4: the transposed stores below hit at most 2 ways per bank, and
  // each thread's kMicro consecutive nodes stay 16-byte aligned.
  constexpr int kRow = TN + 4;
  constexpr int kRowsPerLoad = kThreadsPerBlock / kTileK;
  constexpr int kLoadsA = kTileK * TN / kThreadsPerBlock;
  constexpr int kLoadsW = kTileK * kLinearTileCols / kThreadsPerBlock;
  static_assert(kLoadsA * kThreadsPerBlock == kTileK * TN &&
                kLoadsW * kThreadsPerBlock == kTileK * kLinearTileCols);
  __shared__ __align__(16) T a_tile[kTileK][kRow];
  __shared__ __align__(16) T w_tile[kTileK][kLinearTileCols];
  __shared__ int next_species;

  // Tasks fastest: the column tiles of a destination block read the same source rows,
  // and side by side they read them from DRAM once (after it, from L2).
  const LinearTask task = tasks[blockIdx.x % num_tasks];
  // components m of this block: all of them, or with split_m (grid.z > 1) one
  const int m_begin = split_m ? static_cast<int>(blockIdx.z) : 0;
  const int m_end = split_m ? m_begin + 1 : task.d;
  if (m_begin >= task.d) return;
  const int64_t node0 = static_cast<int64_t>(blockIdx.x / num_tasks) * TN;
  const int tid = static_cast<int>(threadIdx.x);
  const int my_row = (tid / kColThreads) * kMicro, my_col = (tid % kColThreads) * kMicro;

  // the tile's rows of species s (all rows without `species`)
  auto species_pass = [&](int s) {
    const T* w_set = weights + static_cast<int64_t>(s) * species_stride;
    for (int m = m_begin; m < m_end; ++m) {
      T acc[kMicro][kMicro];
#pragma unroll
      for (int i = 0; i < kMicro; ++i)
#pragma unroll
        for (int j = 0; j < kMicro; ++j) acc[i][j] = T(0);
      for (int si = task.source_begin; si < task.source_end; ++si) {
        const LinearSource so = sources[si];
        const T* src_m = src + so.offset + static_cast<int64_t>(m) * so.m_stride;
        for (int k0 = 0; k0 < so.K; k0 += kTileK) {
          {  // consecutive threads: consecutive k of one node (contiguous in ir_mul)
            const int kk = tid % kTileK;
            const bool k_ok = k0 + kk < so.K;
            const T* p = src_m + (node0 + tid / kTileK) * dim_src +
                         static_cast<int64_t>(k0 + kk) * so.k_stride;
#pragma unroll
            for (int j = 0; j < kLoadsA; ++j) {
              const int r = tid / kTileK + j * kRowsPerLoad;
              a_tile[kk][r] = k_ok && node0 + r < num_nodes ? p[j * kRowsPerLoad * dim_src] : T(0);
            }
          }
          {
            const int c = tid % kLinearTileCols;
            const bool c_ok = c < task.cols;
#pragma unroll
            for (int j = 0; j < kLoadsW; ++j) {
              const int kk = tid / kLinearTileCols + j * (kThreadsPerBlock / kLinearTileCols);
              w_tile[kk][c] = c_ok && k0 + kk < so.K
                                  ? w_set[so.w + static_cast<int64_t>(k0 + kk) * so.w_row + c]
                                  : T(0);
            }
          }
          __syncthreads();
#pragma unroll
          for (int kk = 0; kk < kTileK; ++kk) {
            T a[kMicro], b[kMicro];
#pragma unroll
            for (int i = 0; i < kMicro; ++i) a[i] = a_tile[kk][my_row + i];
#pragma unroll
            for (int j = 0; j < kMicro; ++j) b[j] = w_tile[kk][my_col + j];
#pragma unroll
            for (int i = 0; i < kMicro; ++i)
#pragma unroll
              for (int j = 0; j < kMicro; ++j) acc[i][j] += a[i] * b[j];
          }
          __syncthreads();
        }
      }
#pragma unroll
      for (int i = 0; i < kMicro; ++i) {
        const int64_t n = node0 + my_row + i;
        if (n >= num_nodes || (species && species[n] != s)) continue;
#pragma unroll
        for (int j = 0; j < kMicro; ++j) {
          const int c = my_col + j;
          if (c < task.cols) store_output(task, m, c, n, dim_dst, bias, accumulate, acc[i][j], dst);
        }
      }
    }
  };
  for_each_species_in_tile<TN, kThreadsPerBlock>(species, node0, num_nodes, &next_species,
                                                 species_pass);
}

// ---------------------------------------------------------------------------------
// float32 on the tensor cores (sm_80 and later)
// ---------------------------------------------------------------------------------
//
// The same tiles on mma.sync.m16n8k8 with TF32 operands in the 3xTF32 split of
// mma_tf32.cuh (float32 accuracy): A = 16 nodes x 8 k of the source rows, staged in
// shared memory and split into high/low parts as a warp reads its fragment; B = 8 k x
// 8 channels of W, split at load time (build_linear_tables) and read as one float4
// per lane {hi(W[t][g]), hi(W[t + 4][g]), lo(W[t][g]), lo(W[t + 4][g])} (lane = 4 g
// + t), a warp's n-tile of one k-step being 512 contiguous bytes. A block of 4 warps
// takes TN nodes x the task's 32 channels (4 n-tiles); warp (wr, wc) of kWarpRows x
// kWarpCols computes kMTiles m-tiles of 16 nodes x 4 / kWarpCols n-tiles. Each output
// element is summed by one lane: sources in path order, k-steps ascending, each k-step's
// three products accumulated on the tensor cores from zero and added in float32
// (deterministic; the order within a k-step is the tensor core's, also fixed).
constexpr int kMmaThreads = 128;
constexpr int kMmaNTiles = kLinearTileCols / 8;

template <int kWarpRows, int kMTiles>
constexpr int mma_tile_nodes() {
  return kWarpRows * 16 * kMTiles;
}

// Blocks per SM that the register allocation must allow (ptxas, sm_90, no spills): 3 for
// the large tiles (167 registers; bound to 1 block ptxas takes 225: 2 blocks), 5 for the
// small ones (96 registers; bound to 1, 140: 3 blocks; 5 x 132 = 660 resident blocks).
template <int kWarpRows, int kMTiles>
constexpr int mma_min_blocks() {
  return kMTiles > 1 ? 3 : 5;
}

// One layer's product in a launch of linear_mma_kernel: its tasks, sources and B fragments, the
// rows it runs over and where its outputs go. A launch runs one product, or two with the same
// source rows (blockIdx.y: which): SevenNet's self-connection and linear_1 in the forward, the
// transposes of the self-connection and linear_2 in the backward. One launch instead of two,
// each of them a handful of blocks per SM at small sizes.
struct MmaProduct {
  const LinearTask* tasks = nullptr;
  const LinearSource* sources = nullptr;
  const float4* frags = nullptr;
  int64_t frag_species_stride = 0;
  const float* bias = nullptr;
  const float* src = nullptr;
  float* dst = nullptr;
  int64_t num_nodes = 0, dim_src = 0, dim_dst = 0;
  int num_tasks = 0, max_d = 1;
  bool accumulate = false;
};
// The products of a launch (first, second), a kernel parameter read in place (__grid_constant__):
// each block reads the fields of its own from the parameter bank as it needs them.
struct MmaProducts {
  MmaProduct of[2];
};

// Where a block is in its list of (source, k0) slices.
struct SliceCursor {
  int si, k0;
};

// kSliceK: k per shared-memory slice (32 or 64: 4 or 8 k-steps of 8).
// kPair: two products (blockIdx.y picks one); the fields of a product picked at run time take
// registers that ptxas spills (20 / 80 bytes stored / loaded per thread in the small tiles, 104
// / 208 in the large ones; none with one product).
template <int kWarpRows, int kMTiles, int kSliceK, bool kPair>
__global__ void __launch_bounds__(kMmaThreads, mma_min_blocks<kWarpRows, kMTiles>())
    linear_mma_kernel(const __grid_constant__ MmaProducts products,
                      const int32_t* __restrict__ species, bool split_m) {
#ifdef E3FUSE_HAVE_MMA_TF32
  constexpr int TN = mma_tile_nodes<kWarpRows, kMTiles>();
  const MmaProduct& product = products.of[kPair ? blockIdx.y : 0];
  const int64_t num_nodes = product.num_nodes, dim_src = product.dim_src, dim_dst = product.dim_dst;
  const int num_tasks = product.num_tasks;
  const LinearTask* __restrict__ tasks = product.tasks;
  const LinearSource* __restrict__ sources = product.sources;
  const float4* __restrict__ frags = product.frags;
  const int64_t frag_species_stride = product.frag_species_stride;
  const float* __restrict__ bias = product.bias;
  const bool accumulate = product.accumulate;
  const float* __restrict__ src = product.src;
  float* __restrict__ dst = product.dst;
  // the grid covers the larger of the two products
  if (static_cast<int64_t>(blockIdx.x) >= (num_nodes + TN - 1) / TN * num_tasks) return;
  constexpr int kWarpCols = kMmaThreads / 32 / kWarpRows;
  constexpr int kNTiles = kMmaNTiles / kWarpCols;
  // Slice rows padded by 4 floats: a fragment read (node g, k t) hits bank 4 g + t, all 32.
  constexpr int kMmaRow = kSliceK + 4;
  constexpr int kRowsPerLoad = kMmaThreads / kSliceK;
  constexpr int kLoads = TN / kRowsPerLoad;
  static_assert(kWarpCols * kWarpRows * 32 == kMmaThreads && kNTiles * kWarpCols == kMmaNTiles &&
                kSliceK % 8 == 0 && kRowsPerLoad * kSliceK == kMmaThreads &&
                kLoads * kRowsPerLoad == TN);
  __shared__ __align__(16) float a_tile[TN * kMmaRow];
  // The slice's B fragments (all kMmaNTiles n-tiles: every warp's), copied while the
  // previous slice's products run; two buffers, b_buf the one the next slice goes into.
  constexpr int kSliceFrags = kSliceK / 8 * kMmaNTiles * 32;
  __shared__ __align__(16) float4 b_tile[2][kSliceFrags];
  __shared__ int next_species;
  int b_buf = 0;

  const LinearTask task = tasks[blockIdx.x % num_tasks];
  const int m_begin = split_m ? static_cast<int>(blockIdx.z) : 0;
  const int m_end = split_m ? m_begin + 1 : task.d;
  if (m_begin >= task.d) return;
  const int64_t node0 = static_cast<int64_t>(blockIdx.x / num_tasks) * TN;
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int row0 = (warp / kWarpCols) * 16 * kMTiles;  // this warp's first node in the tile
  const int nt0 = (warp % kWarpCols) * kNTiles;        // and its first n-tile
  // staging: thread tid loads k = k0 + tid % kSliceK of rows tid / kSliceK + j kRowsPerLoad
  const int load_k = tid % kSliceK, load_row = tid / kSliceK;

  // the tile's rows of species s (all rows without `species`)
  auto species_pass = [&](int s) {
    const float4* frag_set = frags + static_cast<int64_t>(s) * frag_species_stride;
    for (int m = m_begin; m < m_end; ++m) {
      // rows of slice `c` into registers (zero past K and past the last node)
      auto load_slice = [&](const SliceCursor& c, float (&v)[kLoads]) {
        const LinearSource& so = sources[c.si];
        const bool k_ok = c.k0 + load_k < so.K;
        const float* p = src + so.offset + static_cast<int64_t>(m) * so.m_stride +
                         static_cast<int64_t>(c.k0 + load_k) * so.k_stride;
#pragma unroll
        for (int j = 0; j < kLoads; ++j) {
          const int64_t n = node0 + load_row + j * kRowsPerLoad;
          v[j] = k_ok && n < num_nodes ? __ldg(p + n * dim_src) : 0.0f;
        }
      };
      // the k-steps of slice c: kSliceK / 8, fewer in a source's last slice
      auto slice_ksteps = [&](const SliceCursor& c) {
        return min(kSliceK / 8, (sources[c.si].K - c.k0 + 7) / 8);
      };
      auto stage_b = [&](const SliceCursor& c) {
        const LinearSource& so = sources[c.si];
        const int count = slice_ksteps(c) * kMmaNTiles * 32;
        const float4* from = frag_set + so.frag + static_cast<int64_t>(c.k0 / 8) * kMmaNTiles * 32;
        for (int i = tid; i < count; i += kMmaThreads) copy_async_16(&b_tile[b_buf][i], from + i);
      };
      auto advance = [&](SliceCursor& c) {
        c.k0 += kSliceK;
        while (c.si < task.source_end && c.k0 >= sources[c.si].K) {
          ++c.si;
          c.k0 = 0;
        }
      };
      float acc[kMTiles][kNTiles][4];
#pragma unroll
      for (int i = 0; i < kMTiles; ++i)
#pragma unroll
        for (int j = 0; j < kNTiles; ++j)
#pragma unroll
          for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;

      SliceCursor next{task.source_begin, -kSliceK};
      advance(next);  // the first slice of a source with K > 0
      float staged[kLoads];
      if (next.si < task.source_end) {
        load_slice(next, staged);
        stage_b(next);
      }
      // b_tile[b_buf] holds the slice `next`. The buffer it goes into was last read two
      // slices earlier (also across m and species passes), before the first barrier below.
      while (next.si < task.source_end) {
        const SliceCursor cur = next;
        const float4* f = b_tile[b_buf] + nt0 * 32 + lane;
        b_buf ^= 1;
        __syncthreads();  // the previous slice's fragments have been read
#pragma unroll
        for (int j = 0; j < kLoads; ++j)
          a_tile[(load_row + j * kRowsPerLoad) * kMmaRow + load_k] = staged[j];
        copy_async_wait_all();
        __syncthreads();
        advance(next);  // the next slice's loads fly while this one's products run
        if (next.si < task.source_end) {
          load_slice(next, staged);
          stage_b(next);
        }

        const int ksteps = slice_ksteps(cur);
#pragma unroll
        for (int ks = 0; ks < kSliceK / 8; ++ks) {
          if (ks >= ksteps) break;
          uint32_t ah[kMTiles][4], al[kMTiles][4];
#pragma unroll
          for (int i = 0; i < kMTiles; ++i) {
            const float* a = a_tile + (row0 + 16 * i + g) * kMmaRow + 8 * ks + t;
            const float v[4] = {a[0], a[8 * kMmaRow], a[4], a[8 * kMmaRow + 4]};
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              ah[i][q] = to_tf32(v[q]);
              al[i][q] = to_tf32(v[q] - __uint_as_float(ah[i][q]));
            }
          }
#pragma unroll
          for (int j = 0; j < kNTiles; ++j) {
            const float4 b = f[(ks * kMmaNTiles + j) * 32];
            const uint32_t bh[2] = {__float_as_uint(b.x), __float_as_uint(b.y)};
            const uint32_t bl[2] = {__float_as_uint(b.z), __float_as_uint(b.w)};
#pragma unroll
            for (int i = 0; i < kMTiles; ++i) {
              // one k-step's product on the tensor cores from zero, then added to the sum in
              // float32 (round to nearest): the tensor cores' own accumulation truncates, and
              // summed there over K / 8 k-steps the error reached 2.2e-6 of max |y| (SevenNet's
              // linear_2, K = 3,136; H200), above the 2e-6 that the FMA kernel meets
              float step[4] = {0.0f, 0.0f, 0.0f, 0.0f};
              mma_3xtf32(step, ah[i], al[i], bh, bl);
#pragma unroll
              for (int q = 0; q < 4; ++q) acc[i][j][q] += step[q];
            }
          }
        }
      }

      // acc[i][j][q]: node row0 + 16 i + g (+ 8 for q >= 2), channel 8 (nt0 + j) + 2 t + q % 2
#pragma unroll
      for (int i = 0; i < kMTiles; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t n = node0 + row0 + 16 * i + g + 8 * h;
          if (n >= num_nodes || (species && species[n] != s)) continue;
#pragma unroll
          for (int j = 0; j < kNTiles; ++j)
#pragma unroll
            for (int q = 0; q < 2; ++q) {
              const int c = 8 * (nt0 + j) + 2 * t + q;
              if (c < task.cols)
                store_output(task, m, c, n, dim_dst, bias, accumulate, acc[i][j][2 * h + q], dst);
            }
        }
    }
  };
  for_each_species_in_tile<TN, kMmaThreads>(species, node0, num_nodes, &next_species, species_pass);
#else
  __trap();  // launched only where the device and this code are sm_80 or later
#endif
}

// One side of a path: the irrep block at `offset` with `mul` channels of dimension d.
struct Block {
  int64_t offset = 0;
  int mul = 0, d = 1;
  bool ir_mul = false;
  int32_t c_stride() const { return ir_mul ? 1 : d; }
  int32_t m_stride() const { return ir_mul ? mul : 1; }
};

// Per destination block: the paths into it (source block, weight offset), in path order.
using BlockSources = std::vector<std::pair<Block, std::vector<std::pair<Block, int64_t>>>>;

// Tasks and sources of one direction: per destination block (in the order the paths
// first reach them), its column tiles, each reading every path into that block; then
// tasks without sources for the destination elements that no path reaches.
void plan_products(int64_t dim_dst, const BlockSources& into, std::vector<LinearTask>& tasks,
                   std::vector<LinearSource>& sources) {
  std::vector<bool> reached(static_cast<size_t>(dim_dst), false);
  for (const auto& [dst, from] : into) {
    for (int64_t e = dst.offset; e < dst.offset + static_cast<int64_t>(dst.mul) * dst.d; ++e)
      reached[e] = true;
    for (int col0 = 0; col0 < dst.mul; col0 += kLinearTileCols) {
      LinearTask t;
      t.offset = static_cast<int32_t>(dst.offset);
      t.c_stride = dst.c_stride();
      t.m_stride = dst.m_stride();
      t.d = dst.d;
      t.col0 = col0;
      t.cols = std::min(kLinearTileCols, dst.mul - col0);
      t.source_begin = static_cast<int32_t>(sources.size());
      for (const auto& [src, w] : from) {
        LinearSource so;
        so.w = w + col0;  // W[k][c] at w + k * dst.mul + c
        so.offset = static_cast<int32_t>(src.offset);
        so.k_stride = src.c_stride();
        so.m_stride = src.m_stride();
        so.K = src.mul;
        so.w_row = dst.mul;
        sources.push_back(so);
      }
      t.source_end = static_cast<int32_t>(sources.size());
      tasks.push_back(t);
    }
  }
  for (int64_t e = 0; e < dim_dst;) {  // unreached runs: bias or 0 (or left as they are)
    if (reached[e]) {
      ++e;
      continue;
    }
    int64_t end = e;
    while (end < dim_dst && !reached[end] && end - e < kLinearTileCols) ++end;
    LinearTask t;
    t.offset = static_cast<int32_t>(e);
    t.cols = static_cast<int32_t>(end - e);
    t.source_begin = t.source_end = static_cast<int32_t>(sources.size());
    tasks.push_back(t);
    e = end;
  }
}

template <class T>
bool same_structure(const cpu::Linear<T>& a, const cpu::Linear<T>& b) {
  if (a.dim_in != b.dim_in || a.dim_out != b.dim_out || a.in_ir_mul != b.in_ir_mul ||
      a.out_ir_mul != b.out_ir_mul || a.paths.size() != b.paths.size()) {
    return false;
  }
  for (size_t i = 0; i < a.paths.size(); ++i) {
    const auto &p = a.paths[i], &q = b.paths[i];
    if (p.in_offset != q.in_offset || p.out_offset != q.out_offset || p.mul_in != q.mul_in ||
        p.mul_out != q.mul_out || p.d != q.d) {
      return false;
    }
  }
  return true;
}

template <class T, int TN>
void launch_linear(int64_t num_nodes, int64_t dim_src, int64_t dim_dst, int num_tasks, int split_d,
                   const LinearTask* tasks, const LinearSource* sources, const T* weights,
                   int64_t species_stride, const T* bias, const int32_t* species, bool accumulate,
                   const T* src, T* dst, cudaStream_t stream) {
  const int64_t blocks = (num_nodes + TN - 1) / TN * num_tasks;
  if (blocks > INT32_MAX) throw Error("linear layer: too many nodes for one launch");
  const dim3 grid(static_cast<unsigned>(blocks), 1u, static_cast<unsigned>(split_d));
  linear_gemm_kernel<T, TN><<<grid, linear_threads<TN>(), 0, stream>>>(
      num_nodes, dim_src, dim_dst, num_tasks, tasks, sources, weights, species_stride, bias,
      species, accumulate, split_d > 1, src, dst);
  check_launch("linear_gemm_kernel");
}

// Appends W[k][c] (k < K, c < cols, at w[k * w_row + c]) as m16n8k8 B fragments split
// into TF32 parts, zero-padded to whole k-steps of 8 and kMmaNTiles n-tiles of 8: for
// k-step ks, n-tile nt and lane = 4 g + t, float4 (ks * kMmaNTiles + nt) * 32 + lane is
// {hi(W[8 ks + t][8 nt + g]), hi(W[8 ks + t + 4][8 nt + g]), lo(same), lo(same)}.
void append_b_fragments(const float* w, int64_t w_row, int K, int cols, std::vector<float>& out) {
  auto at = [&](int k, int c) { return k < K && c < cols ? w[k * w_row + c] : 0.0f; };
  for (int ks = 0; ks < (K + 7) / 8; ++ks)
    for (int nt = 0; nt < kMmaNTiles; ++nt)
      for (int lane = 0; lane < 32; ++lane) {
        const int c = 8 * nt + lane / 4, k = 8 * ks + lane % 4;
        const float v[2] = {at(k, c), at(k + 4, c)};
        for (float x : v) out.push_back(round_tf32(x));
        for (float x : v) out.push_back(round_tf32(x - round_tf32(x)));
      }
}

// The float4 count of append_b_fragments for K.
int64_t b_fragment_count(int K) { return static_cast<int64_t>((K + 7) / 8) * kMmaNTiles * 32; }

// Numbers the sources' fragments (LinearSource::frag) and appends them for each of the
// `sets` weight sets (set s at weights + s * per_set); returns the float4 count per set.
int64_t plan_fragments(const std::vector<LinearTask>& tasks, std::vector<LinearSource>& sources,
                       const std::vector<float>& weights, int64_t per_set, size_t sets,
                       std::vector<float>& frags) {
  int64_t count = 0;
  for (LinearSource& so : sources) {
    so.frag = count;
    count += b_fragment_count(so.K);
  }
  for (size_t set = 0; set < sets; ++set)
    for (const LinearTask& t : tasks)
      for (int si = t.source_begin; si < t.source_end; ++si) {
        const LinearSource& so = sources[si];
        append_b_fragments(weights.data() + static_cast<int64_t>(set) * per_set + so.w, so.w_row,
                           so.K, t.cols, frags);
      }
  return count;
}

// float32 linear layers on the tensor cores unless the device or the compiled code is
// older than sm_80.
bool linear_tensor_cores() {
  int device = 0, major = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
        "cudaDeviceGetAttribute");
  cudaFuncAttributes attr{};
  check(cudaFuncGetAttributes(&attr, linear_mma_kernel<4, 2, 32, false>), "cudaFuncGetAttributes");
  return major >= 8 && attr.ptxVersion >= 80;
}

// The `count` products (1 or 2) in one launch of tile shape <kWarpRows, kMTiles, kSliceK>,
// split_d blocks per tile along the components m.
template <int kWarpRows, int kMTiles, int kSliceK>
void launch_linear_mma(const MmaProduct* products, int count, int split_d, const int32_t* species,
                       cudaStream_t stream) {
  constexpr int TN = mma_tile_nodes<kWarpRows, kMTiles>();
  int64_t blocks = 0;
  for (int i = 0; i < count; ++i)
    blocks = std::max(blocks, (products[i].num_nodes + TN - 1) / TN * products[i].num_tasks);
  if (blocks > INT32_MAX) throw Error("linear layer: too many nodes for one launch");
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(count),
                  static_cast<unsigned>(split_d));
  MmaProducts both;
  both.of[0] = products[0];
  both.of[1] = products[count - 1];
  if (count == 2)
    linear_mma_kernel<kWarpRows, kMTiles, kSliceK, true>
        <<<grid, kMmaThreads, 0, stream>>>(both, species, split_d > 1);
  else
    linear_mma_kernel<kWarpRows, kMTiles, kSliceK, false>
        <<<grid, kMmaThreads, 0, stream>>>(both, species, split_d > 1);
  check_launch("linear_mma_kernel");
}

// Products on the tensor cores. Large: 128-node tiles, each warp 32 nodes x 32 channels (2 x 4
// mma tiles, each B fragment feeds 2 m-tiles), 32-deep slices. Small (fewer than 2 blocks of
// those per SM, both products together): 32-node tiles, each warp 16 x 16, one block per
// component m (split_m): 4x the node tiles and up to max_d x the blocks; 64-deep slices halve
// the serial chain of slices (each a global round trip) to K / 64 per block. Between 2 and 8
// large blocks per SM the large tiles are split by component as well (SevenNet-l3i5, 864
// atoms: the linears' sum 0.605 -> 0.581 ms on the H100, unchanged at 32,000 atoms;
// benchmarks/results/linear_policy/, policy 3).
void launch_products(const MmaProduct* products, int count, const int32_t* species,
                     cudaStream_t stream) {
  static const int multiprocessors = device_multiprocessors();
  int64_t large_blocks = 0;
  int max_d = 1;
  for (int i = 0; i < count; ++i) {
    large_blocks += (products[i].num_nodes + 127) / 128 * products[i].num_tasks;
    max_d = std::max(max_d, products[i].max_d);
  }
  if (large_blocks < 2 * multiprocessors)
    launch_linear_mma<2, 1, 64>(products, count, max_d, species, stream);
  else
    launch_linear_mma<4, 2, 32>(products, count, large_blocks < 8 * multiprocessors ? max_d : 1,
                                species, stream);
}

// Whether the product of `tables` (transposed or not) over num_nodes rows writes anything.
template <class T>
bool has_work(const LinearTables<T>& tables, int64_t dim_in, int64_t dim_out, bool transpose,
              int64_t num_nodes) {
  const DeviceArray<LinearTask>& tasks = transpose ? tables.bwd_tasks : tables.fwd_tasks;
  return num_nodes > 0 && (transpose ? dim_in : dim_out) > 0 && tasks.size() != 0;
}

// The tensor-core product of `tables` (transposed or not) from src into dst; false where the
// tables have no fragments (float64, or a device or build older than sm_80).
template <class T>
bool mma_product(const LinearTables<T>& tables, int64_t dim_in, int64_t dim_out, bool transpose,
                 int64_t num_nodes, bool accumulate, const T* src, T* dst, MmaProduct& p) {
  if constexpr (std::is_same_v<T, float>) {
    const DeviceArray<float>& frags = transpose ? tables.frag_bwd : tables.frag_fwd;
    if (frags.size() == 0) return false;
    const DeviceArray<LinearTask>& tasks = transpose ? tables.bwd_tasks : tables.fwd_tasks;
    p.tasks = tasks.data();
    p.num_tasks = static_cast<int>(tasks.size());
    p.sources = transpose ? tables.bwd_sources.data() : tables.fwd_sources.data();
    p.frags = reinterpret_cast<const float4*>(frags.data());
    p.frag_species_stride = transpose ? tables.frag_bwd_stride : tables.frag_fwd_stride;
    p.bias = transpose || tables.bias.size() == 0 ? nullptr : tables.bias.data();
    p.src = src;
    p.dst = dst;
    p.num_nodes = num_nodes;
    p.dim_src = transpose ? dim_out : dim_in;
    p.dim_dst = transpose ? dim_in : dim_out;
    p.max_d = tables.max_d;
    p.accumulate = accumulate;
    return true;
  } else {
    return false;
  }
}

}  // namespace

namespace detail {

template <class T>
void build_linear_tables(const std::vector<const cpu::Linear<T>*>& layers, bool with_bias,
                         LinearTables<T>& tables) {
  if (layers.empty()) throw Error("internal: a linear layer without weights");
  const cpu::Linear<T>& first = *layers.front();
  std::map<int64_t, size_t> fwd_index, bwd_index;
  BlockSources fwd, bwd;
  std::vector<T> weights, weights_t;
  int64_t offset = 0;
  int max_d = 1;
  for (const auto& p : first.paths) {
    if (p.in_offset + static_cast<int64_t>(p.mul_in) * p.d > first.dim_in ||
        p.out_offset + static_cast<int64_t>(p.mul_out) * p.d > first.dim_out) {
      throw Error("internal: inconsistent linear layer path");
    }
    const Block in{p.in_offset, p.mul_in, p.d, first.in_ir_mul};
    const Block out{p.out_offset, p.mul_out, p.d, first.out_ir_mul};
    auto add = [](BlockSources& into, std::map<int64_t, size_t>& index, const Block& dst,
                  const Block& src, int64_t w) {
      auto [it, fresh] = index.emplace(dst.offset, into.size());
      if (fresh) into.push_back({dst, {}});
      const Block& have = into[it->second].first;
      if (have.mul != dst.mul || have.d != dst.d) {
        throw Error("internal: linear layer paths into one block of different shapes");
      }
      into[it->second].second.push_back({src, w});
    };
    add(fwd, fwd_index, out, in, offset);  // W[u][w] at offset + u * mul_out + w
    add(bwd, bwd_index, in, out, offset);  // W^T[w][u] at offset + w * mul_in + u
    offset += static_cast<int64_t>(p.mul_in) * p.mul_out;
    max_d = std::max(max_d, p.d);
  }
  const int64_t per_set = offset;
  for (const cpu::Linear<T>* lin : layers) {
    if (!same_structure(*lin, first)) {
      throw Error("internal: linear layers of one table set with different paths");
    }
    for (const auto& p : lin->paths) {
      if (static_cast<int64_t>(p.weight.size()) != static_cast<int64_t>(p.mul_in) * p.mul_out) {
        throw Error("internal: inconsistent linear layer path");
      }
      const size_t at = weights.size();
      weights.insert(weights.end(), p.weight.begin(), p.weight.end());
      weights_t.resize(weights.size());
      for (int u = 0; u < p.mul_in; ++u)
        for (int w = 0; w < p.mul_out; ++w)
          weights_t[at + static_cast<size_t>(w) * p.mul_in + u] =
              p.weight[static_cast<size_t>(u) * p.mul_out + w];
    }
  }
  std::vector<T> bias;
  if (with_bias && !first.biases.empty()) {
    if (layers.size() != 1) throw Error("internal: biases on a multi-table linear layer");
    bias.assign(first.dim_out, T(0));  // as on the CPU: 0 + bias_1 (+ bias_2 ...)
    for (const auto& b : first.biases) {
      if (b.out_offset + static_cast<int64_t>(b.bias.size()) > first.dim_out) {
        throw Error("internal: inconsistent linear layer bias");
      }
      for (size_t w = 0; w < b.bias.size(); ++w) bias[b.out_offset + w] += b.bias[w];
    }
  }
  if (first.dim_in > INT32_MAX || first.dim_out > INT32_MAX) {
    throw Error("linear layer too large for the CUDA backend");
  }
  std::vector<LinearTask> fwd_tasks, bwd_tasks;
  std::vector<LinearSource> fwd_sources, bwd_sources;
  plan_products(first.dim_out, fwd, fwd_tasks, fwd_sources);
  plan_products(first.dim_in, bwd, bwd_tasks, bwd_sources);
  bool fragments = false;  // float32 on the tensor cores: the FMA kernel's copies unused
  if constexpr (std::is_same_v<T, float>) {
    if (linear_tensor_cores()) {
      fragments = true;
      std::vector<float> frags;
      tables.frag_fwd_stride =
          plan_fragments(fwd_tasks, fwd_sources, weights, per_set, layers.size(), frags);
      tables.frag_fwd.upload(frags);
      frags.clear();
      tables.frag_bwd_stride =
          plan_fragments(bwd_tasks, bwd_sources, weights_t, per_set, layers.size(), frags);
      tables.frag_bwd.upload(frags);
    }
  }
  tables.fwd_tasks.upload(fwd_tasks);
  tables.bwd_tasks.upload(bwd_tasks);
  tables.fwd_sources.upload(fwd_sources);
  tables.bwd_sources.upload(bwd_sources);
  if (!fragments) {
    tables.weights.upload(weights);
    tables.weights_t.upload(weights_t);
  }
  tables.bias.upload(bias);
  tables.species_stride = per_set;
  tables.max_d = max_d;
  // The uploads read pageable host memory that is freed on return.
  check(cudaStreamSynchronize(nullptr), "linear layer upload");
}

template <class T>
void run_linear_tables(const LinearTables<T>& tables, int64_t dim_in, int64_t dim_out,
                       bool transpose, int64_t num_nodes, const int32_t* species, bool accumulate,
                       const T* src, T* dst, cudaStream_t stream) {
  const int64_t dim_src = transpose ? dim_out : dim_in, dim_dst = transpose ? dim_in : dim_out;
  if (!has_work(tables, dim_in, dim_out, transpose, num_nodes)) return;
  const DeviceArray<LinearTask>& tasks = transpose ? tables.bwd_tasks : tables.fwd_tasks;
  const LinearSource* sources = transpose ? tables.bwd_sources.data() : tables.fwd_sources.data();
  const T* weights = transpose ? tables.weights_t.data() : tables.weights.data();
  const T* bias = transpose || tables.bias.size() == 0 ? nullptr : tables.bias.data();
  const int num_tasks = static_cast<int>(tasks.size());
  static const int multiprocessors = device_multiprocessors();
  MmaProduct product;
  if (mma_product(tables, dim_in, dim_out, transpose, num_nodes, accumulate, src, dst, product)) {
    launch_products(&product, 1, species, stream);
    return;
  }
  // Small systems: half-height tiles and one block per component m, so that the grid
  // still fills the GPU and each block's serial chain of slices is short.
  const bool small = (num_nodes + 127) / 128 * num_tasks < 2 * multiprocessors;
  if (small)
    launch_linear<T, 64>(num_nodes, dim_src, dim_dst, num_tasks, tables.max_d, tasks.data(),
                         sources, weights, tables.species_stride, bias, species, accumulate, src,
                         dst, stream);
  else
    launch_linear<T, 128>(num_nodes, dim_src, dim_dst, num_tasks, 1, tasks.data(), sources, weights,
                          tables.species_stride, bias, species, accumulate, src, dst, stream);
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
void linear_forward_add(const Linear<T>& lin, int64_t num_nodes, const T* x, T* out,
                        cudaStream_t stream) {
  detail::run_linear_tables(lin.tables, lin.dim_in, lin.dim_out, false, num_nodes, nullptr, true, x,
                            out, stream);
}

template <class T>
void linear_backward(const Linear<T>& lin, int64_t num_nodes, const T* grad_out, T* grad_x,
                     bool accumulate, cudaStream_t stream) {
  detail::run_linear_tables(lin.tables, lin.dim_in, lin.dim_out, true, num_nodes, nullptr,
                            accumulate, grad_out, grad_x, stream);
}

namespace {
// dst_a = A src over rows_a nodes and dst_b = B src over rows_b nodes (transposed: A^T, B^T),
// overwritten: one launch where both run on the tensor cores, else one each.
template <class T>
void run_linear_pair(const Linear<T>& a, int64_t rows_a, T* dst_a, const Linear<T>& b,
                     int64_t rows_b, T* dst_b, bool transpose, const T* src, cudaStream_t stream) {
  MmaProduct products[2];
  int count = 0;
  bool on_tensor_cores = true;
  const auto add = [&](const Linear<T>& lin, int64_t rows, T* dst) {
    if (!has_work(lin.tables, lin.dim_in, lin.dim_out, transpose, rows)) return;
    if (mma_product(lin.tables, lin.dim_in, lin.dim_out, transpose, rows, false, src, dst,
                    products[count]))
      ++count;
    else
      on_tensor_cores = false;
  };
  add(a, rows_a, dst_a);
  add(b, rows_b, dst_b);
  if (!on_tensor_cores) {
    detail::run_linear_tables(a.tables, a.dim_in, a.dim_out, transpose, rows_a, nullptr, false, src,
                              dst_a, stream);
    detail::run_linear_tables(b.tables, b.dim_in, b.dim_out, transpose, rows_b, nullptr, false, src,
                              dst_b, stream);
    return;
  }
  if (count == 2)
    launch_products(products, 2, nullptr, stream);
  else
    for (int i = 0; i < count; ++i) launch_products(products + i, 1, nullptr, stream);
}
}  // namespace

template <class T>
void linear_forward_pair(const Linear<T>& a, int64_t rows_a, T* out_a, const Linear<T>& b,
                         int64_t rows_b, T* out_b, const T* x, cudaStream_t stream) {
  run_linear_pair(a, rows_a, out_a, b, rows_b, out_b, false, x, stream);
}

template <class T>
void linear_backward_pair(const Linear<T>& a, int64_t rows_a, T* grad_a, const Linear<T>& b,
                          int64_t rows_b, T* grad_b, const T* grad_out, cudaStream_t stream) {
  run_linear_pair(a, rows_a, grad_a, b, rows_b, grad_b, true, grad_out, stream);
}

#define E3FUSE_INSTANTIATE(T)                                                                     \
  template void detail::build_linear_tables<T>(const std::vector<const cpu::Linear<T>*>&, bool,   \
                                               LinearTables<T>&);                                 \
  template void detail::run_linear_tables<T>(const LinearTables<T>&, int64_t, int64_t, bool,      \
                                             int64_t, const int32_t*, bool, const T*, T*,         \
                                             cudaStream_t);                                       \
  template Linear<T> make_linear<T>(const cpu::Linear<T>&);                                       \
  template void linear_forward<T>(const Linear<T>&, int64_t, const T*, T*, cudaStream_t);         \
  template void linear_forward_add<T>(const Linear<T>&, int64_t, const T*, T*, cudaStream_t);     \
  template void linear_backward<T>(const Linear<T>&, int64_t, const T*, T*, bool, cudaStream_t);  \
  template void linear_forward_pair<T>(const Linear<T>&, int64_t, T*, const Linear<T>&, int64_t,  \
                                       T*, const T*, cudaStream_t);                               \
  template void linear_backward_pair<T>(const Linear<T>&, int64_t, T*, const Linear<T>&, int64_t, \
                                        T*, const T*, cudaStream_t);
E3FUSE_INSTANTIATE(float)
E3FUSE_INSTANTIATE(double)
#undef E3FUSE_INSTANTIATE

}  // namespace e3fuse::cuda
