// cuda/mma_tf32.cuh: float32 matrix products of an edge chunk on the tensor cores.
//
// The radial MLP of a convolution is, per chunk of EC edges, out[e][m] = sum_k
// in[e][k] A[m][k] with A the layer's weights (W^T forward, W for the adjoint).
// mma.sync.m16n8k8 computes D (16 x 8) += A (16 x 8) B (8 x 8) with TF32 operands
// (10-bit mantissa): A is a 16-row tile of the weights and B^T is 8 edges of the
// chunk. TF32 alone would lose ~3 decimal digits, so both operands are split,
// x = hi + lo with hi = tf32(x), lo = tf32(x - hi), and the product is
// hi*lo + lo*hi + hi*hi (the "3xTF32" scheme; lo*lo is below float32 rounding):
// float32-accurate at a third of the tensor-core rate, ~6x the FMA pipes' rate.
//
// Fragment layout (PTX ISA, "Matrix fragments for mma.m16n8k8", .tf32), lane =
// 4 g + t: a0 = A[g][t], a1 = A[g + 8][t], a2 = A[g][t + 4], a3 = A[g + 8][t + 4];
// b0 = B[t][g], b1 = B[t + 4][g]; d0 = D[g][2t], d1 = D[g][2t + 1], d2 = D[g + 8][2t],
// d3 = D[g + 8][2t + 1]. The weights are stored in that order at load time (one
// float4 of high parts and one of low parts per lane, tile and k-step), so a
// warp reads a tile's operands as two coalesced 512-byte loads.
//
// Every sum runs in a fixed order: the products are deterministic.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace e3fuse::cuda {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define E3FUSE_HAVE_MMA_TF32 1
#endif

// TF32 rounding as cvt.rna.tf32.f32 does it: nearest, ties away from zero.
inline float round_tf32(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  bits = (bits + 0x1000u) & 0xffffe000u;
  std::memcpy(&x, &bits, sizeof bits);
  return x;
}

// Appends A (M x K, row-major) as m16n8k8 A fragments split into TF32 parts, zero-padded
// to whole 16 x 8 tiles: for m-tile mt, k-step ks and lane, float4 number
// 2 ((mt * ksteps + ks) * 32 + lane) holds the high parts, the next the low parts.
inline void append_tf32_fragments(const std::vector<float>& A, int M, int K,
                                  std::vector<float>& out) {
  const int mtiles = (M + 15) / 16, ksteps = (K + 7) / 8;
  auto at = [&](int m, int k) { return m < M && k < K ? A[static_cast<size_t>(m) * K + k] : 0.0f; };
  for (int mt = 0; mt < mtiles; ++mt)
    for (int ks = 0; ks < ksteps; ++ks)
      for (int lane = 0; lane < 32; ++lane) {
        const int m = 16 * mt + lane / 4, k = 8 * ks + lane % 4;
        const float a[4] = {at(m, k), at(m + 8, k), at(m, k + 4), at(m + 8, k + 4)};
        for (float v : a) out.push_back(round_tf32(v));
        for (float v : a) out.push_back(round_tf32(v - round_tf32(v)));
      }
}

// Device part: only where the tensor cores take TF32 (sm_80 and later; the host pass
// sees the declarations).
#if defined(__CUDACC__) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)

__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// B operand of one k-step: hi/lo parts of in[g][k0 + t] and in[g][k0 + t + 4] (zero past K).
__device__ __forceinline__ void load_b_split(const float* in_row, int k0, int t, int K,
                                             uint32_t hi[2], uint32_t lo[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int k = k0 + t + 4 * h;
    const float v = k < K ? in_row[k] : 0.0f;
    hi[h] = to_tf32(v);
    lo[h] = to_tf32(v - __uint_as_float(hi[h]));
  }
}

__device__ __forceinline__ void mma_tf32(float d[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 16 bytes from global to shared memory without a register round trip (cp.async, sm_80),
// and the wait for all of this thread's copies.
__device__ __forceinline__ void copy_async_16(void* to_shared, const void* from_global) {
  const auto to = static_cast<unsigned>(__cvta_generic_to_shared(to_shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(to), "l"(from_global) : "memory");
}

__device__ __forceinline__ void copy_async_wait_all() {
  asm volatile("cp.async.wait_all;" ::: "memory");
}

// d += A B in 3xTF32 (small terms first), both operands already split: A as a[4] high / low
// parts, B as b[2].
__device__ __forceinline__ void mma_3xtf32(float d[4], const uint32_t ah[4], const uint32_t al[4],
                                           const uint32_t bh[2], const uint32_t bl[2]) {
  mma_tf32(d, al[0], al[1], al[2], al[3], bh[0], bh[1]);
  mma_tf32(d, ah[0], ah[1], ah[2], ah[3], bl[0], bl[1]);
  mma_tf32(d, ah[0], ah[1], ah[2], ah[3], bh[0], bh[1]);
}

// The same with A's parts as stored by append_tf32_fragments (one float4 each).
__device__ __forceinline__ void mma_3xtf32(float d[4], const float4& ah, const float4& al,
                                           const uint32_t bh[2], const uint32_t bl[2]) {
  const uint32_t h[4] = {__float_as_uint(ah.x), __float_as_uint(ah.y), __float_as_uint(ah.z),
                         __float_as_uint(ah.w)};
  const uint32_t l[4] = {__float_as_uint(al.x), __float_as_uint(al.y), __float_as_uint(al.z),
                         __float_as_uint(al.w)};
  mma_3xtf32(d, h, l, bh, bl);
}

// Writes the D tile (rows m0.., edges e0..) transposed into out[e][m] (stride M).
__device__ __forceinline__ void store_d(const float d[4], int m0, int e0, int g, int t, int M,
                                        float* out) {
  const int ma = m0 + g, mb = ma + 8, ea = e0 + 2 * t;
  if (ma < M) {
    out[ea * M + ma] = d[0];
    out[(ea + 1) * M + ma] = d[1];
  }
  if (mb < M) {
    out[ea * M + mb] = d[2];
    out[(ea + 1) * M + mb] = d[3];
  }
}

// out[e][m] = sum_k in[e][k] A[m][k] for the chunk's EC rows (EC a multiple of 8, in
// row stride K, out row stride M); the M/16 row tiles are dealt to the warps. With at
// most 8 k-steps (K <= 64, the MLP's hidden widths) each warp splits its B operands
// once and keeps them in registers for all its tiles.
template <int EC, int kWarpsPerBlock>
__device__ void chunk_gemm_tf32(const float* in, int K, const float4* __restrict__ frag, int M,
                                float* out) {
  constexpr int NT = EC / 8;
  constexpr int kCached = 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int ksteps = (K + 7) / 8, mtiles = (M + 15) / 16;
  if (ksteps <= kCached) {
    uint32_t bh[NT][kCached][2], bl[NT][kCached][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int ks = 0; ks < kCached; ++ks)
        if (ks < ksteps) load_b_split(in + (8 * nt + g) * K, 8 * ks, t, K, bh[nt][ks], bl[nt][ks]);
    for (int mt = warp; mt < mtiles; mt += kWarpsPerBlock) {
      float d[NT][4] = {};
      const float4* f = frag + 2 * (static_cast<size_t>(mt) * ksteps * 32 + lane);
#pragma unroll
      for (int ks = 0; ks < kCached; ++ks)
        if (ks < ksteps) {
          const float4 ah = __ldg(f + 64 * ks), al = __ldg(f + 64 * ks + 1);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) mma_3xtf32(d[nt], ah, al, bh[nt][ks], bl[nt][ks]);
        }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) store_d(d[nt], 16 * mt, 8 * nt, g, t, M, out);
    }
    return;
  }
  for (int mt = warp; mt < mtiles; mt += kWarpsPerBlock) {
    float d[NT][4] = {};
    const float4* f = frag + 2 * (static_cast<size_t>(mt) * ksteps * 32 + lane);
    for (int ks = 0; ks < ksteps; ++ks) {
      const float4 ah = __ldg(f + 64 * ks), al = __ldg(f + 64 * ks + 1);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        uint32_t bh[2], bl[2];
        load_b_split(in + (8 * nt + g) * K, 8 * ks, t, K, bh, bl);
        mma_3xtf32(d[nt], ah, al, bh, bl);
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) store_d(d[nt], 16 * mt, 8 * nt, g, t, M, out);
  }
}

// The same product for a long K and a short M (the adjoint of the MLP's wide last
// layer): the k-steps are split into one contiguous range per warp, and warp w writes
// its partial sums to part[w][e][m] (zeros if its range is empty); the caller adds the
// kWarpsPerBlock partials in warp order.
template <int EC, int kWarpsPerBlock>
__device__ void chunk_gemm_tf32_split_k(const float* in, int K, const float4* __restrict__ frag,
                                        int M, float* part) {
  constexpr int NT = EC / 8;
  constexpr int kTiles = 4;  // row tiles per pass (accumulators in registers)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int ksteps = (K + 7) / 8, mtiles = (M + 15) / 16;
  const int per_warp = (ksteps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int ks0 = min(ksteps, warp * per_warp), ks1 = min(ksteps, ks0 + per_warp);
  float* out = part + static_cast<size_t>(warp) * EC * M;
  for (int mt0 = 0; mt0 < mtiles; mt0 += kTiles) {
    float d[kTiles][NT][4] = {};
    for (int ks = ks0; ks < ks1; ++ks) {
      uint32_t bh[NT][2], bl[NT][2];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        load_b_split(in + (8 * nt + g) * K, 8 * ks, t, K, bh[nt], bl[nt]);
#pragma unroll
      for (int j = 0; j < kTiles; ++j)
        if (mt0 + j < mtiles) {
          const float4* f = frag + 2 * ((static_cast<size_t>(mt0 + j) * ksteps + ks) * 32 + lane);
          const float4 ah = __ldg(f), al = __ldg(f + 1);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) mma_3xtf32(d[j][nt], ah, al, bh[nt], bl[nt]);
        }
    }
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
      if (mt0 + j < mtiles)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) store_d(d[j][nt], 16 * (mt0 + j), 8 * nt, g, t, M, out);
  }
}

#endif  // device part

}  // namespace e3fuse::cuda
