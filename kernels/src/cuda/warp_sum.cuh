// cuda/warp_sum.cuh: sums over the 32 lanes of a warp, in a fixed order (deterministic),
// shared by the convolution kernels (conv_kernels.cuh) and benchmarks/micro.
#pragma once

namespace e3fuse::cuda {

// The sums over the warp of three values, in a fixed order: lanes 0-7 get v0's, lanes 8-15
// v1's, lanes 16-23 v2's. Halving exchanges (two values, then one) take 6 shuffles instead of
// 15 for three separate reductions. Every lane of the warp must call it.
template <class T>
__device__ __forceinline__ T warp_sum3(T v0, T v1, T v2) {
  constexpr unsigned kAllLanes = 0xffffffffu;
  const int lane = threadIdx.x % 32;
  const bool upper = lane & 16, odd8 = lane & 8;
  // lanes 0-15 keep v0, v1 and lanes 16-31 v2, 0
  const T a = (upper ? v2 : v0) + __shfl_xor_sync(kAllLanes, upper ? v0 : v2, 16);
  const T b = (upper ? T(0) : v1) + __shfl_xor_sync(kAllLanes, upper ? v1 : T(0), 16);
  // lanes 0-7 keep a, 8-15 b (likewise 16-23, 24-31)
  T r = (odd8 ? b : a) + __shfl_xor_sync(kAllLanes, odd8 ? a : b, 8);
  r += __shfl_xor_sync(kAllLanes, r, 4);
  r += __shfl_xor_sync(kAllLanes, r, 2);
  r += __shfl_xor_sync(kAllLanes, r, 1);
  return r;
}

}  // namespace e3fuse::cuda
