// benchmarks/micro/backward_probe.cuh: what the convolution-backward design probes share
// (tc_backward_micro.cu, tile_backward_micro.cu): the engine's per-edge contraction on the FMA
// pipes, the 3xTF32 split, their options, the timed launches and the check of the two outputs
// (dE/dx and the edge forces) against double-precision sums.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "cuda/common.cuh"
#include "micro_common.h"

namespace e3fuse_micro {

// One edge of one path for one channel, as the engine's tp_backward_edge (C = 1) ran it
// before 88c2930 (which contracts K's two components in the edge's frame, not three; the
// probes' records were measured with this one): mk holds the path's {M, K_x, K_y, K_z}
// entries [D1][D3], g the receiver's dE/dy, sx the sender's (sign-folded) x. Per a:
// h = (M g)[a], gxa[a] += w h, dw += sx[a] h and f_c += sx[a] (K_c g)[a] (the caller scales f
// by w and adds the radial part dw dw/dr).
template <int D1, int D3>
__device__ __forceinline__ void fma_contract_edge(const float4* mk, const float (&g)[D3],
                                                  const float (&sx)[D1], float w, float (&gxa)[D1],
                                                  float& dw, float& f0, float& f1, float& f2) {
#pragma unroll
  for (int a = 0; a < D1; ++a) {
    float mg = 0.0f, k0 = 0.0f, k1 = 0.0f, k2 = 0.0f;
#pragma unroll
    for (int q = 0; q < D3; ++q) {
      const float4 v = mk[a * D3 + q];
      mg += v.x * g[q];
      k0 += v.y * g[q];
      k1 += v.z * g[q];
      k2 += v.w * g[q];
    }
    f0 += sx[a] * k0;
    f1 += sx[a] * k1;
    f2 += sx[a] * k2;
    dw += sx[a] * mg;
    gxa[a] += w * mg;
  }
}

// v = hi + lo for 3xTF32: hi keeps v's sign, exponent and top 10 mantissa bits (truncated, one
// logic op instead of cvt.rna's rounding), lo = v - hi is exact; the tensor cores read only
// the top 19 bits of a TF32 operand, so lo goes in as it is (its own truncation, below
// 2^-10 of lo, is 2^-20 of v).
__device__ __forceinline__ void split_tf32(float v, uint32_t& hi, uint32_t& lo) {
  hi = __float_as_uint(v) & 0xffffe000u;
  lo = __float_as_uint(v - __uint_as_float(hi));
}

// "--key value" options: the integer fields named in `integers`, and --json-out.
inline void parse_probe_options(int argc, char** argv,
                                std::initializer_list<std::pair<const char*, int*>> integers,
                                std::string& json_out) {
  parse_pairs(argc, argv, [&](const std::string& key, const std::string& value) {
    for (const auto& [name, field] : integers)
      if (key == name) {
        *field = std::stoi(value);
        return true;
      }
    if (key != "--json-out") return false;
    json_out = value;
    return true;
  });
}

// warmup + repeats launches on `stream`, each between CUDA events; the repeats' ms.
template <class Launch>
std::vector<double> time_launches(int warmup, int repeats, cudaStream_t stream, Launch&& launch) {
  LaunchTimer timer(warmup + repeats);
  for (int i = 0; i < warmup + repeats; ++i) {
    timer.start(i, stream);
    launch();
    timer.stop(i, stream);
  }
  e3fuse::cuda::check(cudaGetLastError(), "launch");
  e3fuse::cuda::check(cudaStreamSynchronize(stream), "kernels");
  return timer.ms(warmup);
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The largest |got - ref| of each output and the largest |ref|, over the references' length
// (the first nodes or edges).
struct ProbeErrors {
  double grad_x_err = 0.0, grad_x_max = 0.0, force_err = 0.0, force_max = 0.0;
};

inline ProbeErrors check_outputs(const std::vector<double>& ref_grad_x,
                                 const e3fuse::cuda::DeviceArray<float>& grad_x,
                                 const std::vector<double>& ref_force,
                                 const e3fuse::cuda::DeviceArray<float>& force) {
  auto compare = [](const std::vector<double>& ref, const e3fuse::cuda::DeviceArray<float>& d,
                    double& max_err, double& max_ref) {
    std::vector<float> got(ref.size());
    d.download(got.data(), got.size());
    e3fuse::cuda::check(cudaDeviceSynchronize(), "download");
    for (size_t i = 0; i < ref.size(); ++i) {
      max_err = std::max(max_err, std::abs(static_cast<double>(got[i]) - ref[i]));
      max_ref = std::max(max_ref, std::abs(ref[i]));
    }
  };
  ProbeErrors e;
  compare(ref_grad_x, grad_x, e.grad_x_err, e.grad_x_max);
  compare(ref_force, force, e.force_err, e.force_max);
  return e;
}

// main's body: run(parse(argc, argv)); an error is printed under the tool's name, exit code 1.
template <class Options>
int probe_main(const char* tool, int argc, char** argv, Options (*parse)(int, char**),
               int (*run)(const Options&)) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& err) {
    std::fprintf(stderr, "%s: %s\n", tool, err.what());
    return 1;
  }
}

}  // namespace e3fuse_micro
