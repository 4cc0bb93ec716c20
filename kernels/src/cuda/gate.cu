// cuda/gate.cu: e3nn nn.Gate, forward and transpose (the GPU version of
// cpu/gate.cpp). Input [scalars | gates | gated], output
// [act_s(scalars) * c_s | act_g(gate_c) * c_g * factor * gated_c].
// The host walks the plan exactly as the CPU loops do and records, per output
// (forward) and per input (backward) element, where its operands are; the kernels
// are one thread per (node, element), with the CPU's order of operations.
#include <vector>

#include "cuda/node_ops.cuh"
#include "ops/activation.h"

namespace e3fuse::cuda {

namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void gate_forward_kernel(int64_t num_nodes, int64_t dim_in, int64_t dim_out,
                                    const GateOutput* __restrict__ outputs,
                                    const T* __restrict__ scale, T gated_factor,
                                    const T* __restrict__ x, T* __restrict__ out) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= num_nodes * dim_out) return;
  const int64_t o = t % dim_out, n = t / dim_out;
  const T* xn = x + n * dim_in;
  const GateOutput e = outputs[o];
  const Activation act = static_cast<Activation>(e.act);
  T v;
  if (e.gate < 0) {
    v = ops::activation(act, xn[e.x]) * scale[o];
  } else {
    const T gv = ops::activation(act, xn[e.gate]) * scale[o] * gated_factor;
    v = gv * xn[e.x];
  }
  out[t] = v;
}

template <class T>
__global__ void gate_backward_kernel(int64_t num_nodes, int64_t dim_in, int64_t dim_out,
                                     const GateInput* __restrict__ inputs,
                                     const T* __restrict__ scale, T gated_factor,
                                     const T* __restrict__ x, const T* __restrict__ grad_out,
                                     T* __restrict__ grad_x) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= num_nodes * dim_in) return;
  const int64_t i = t % dim_in, n = t / dim_in;
  const T* xn = x + n * dim_in;
  const T* gn = grad_out + n * dim_out;
  const GateInput e = inputs[i];
  const Activation act = static_cast<Activation>(e.act);
  T v = T(0);
  if (e.kind == 1) {  // scalar
    v = gn[e.o] * scale[i] * ops::activation_grad(act, xn[i]);
  } else if (e.kind == 2) {  // gated component: its gate's value
    const T c_g = scale[i] * gated_factor;
    const T gv = ops::activation(act, xn[e.xa]) * c_g;
    v = gv * gn[e.o];
  } else if (e.kind == 3) {  // gate: sum over the components it gates
    const T c_g = scale[i] * gated_factor;
    T dot = T(0);
    for (int m = 0; m < e.d; ++m) dot += gn[e.o + m] * xn[e.xa + m];
    v = dot * c_g * ops::activation_grad(act, xn[i]);
  }
  grad_x[t] = v;
}

}  // namespace

template <class T>
Gate<T> make_gate(const cpu::Gate<T>& host) {
  const GatePlan& g = host.plan;
  Gate<T> gate;
  gate.dim_in = g.dim_in;
  gate.dim_out = g.dim_out;
  gate.gated_factor = host.gated_factor;
  std::vector<GateOutput> outputs(g.dim_out);
  std::vector<T> out_scale(g.dim_out, T(0));
  std::vector<GateInput> inputs(g.dim_in);
  std::vector<T> in_scale(g.dim_in, T(0));
  auto check_in = [&](int64_t i) {
    if (i < 0 || i >= g.dim_in) throw Error("internal: gate input index out of range");
  };
  auto check_out = [&](int64_t o) {
    if (o < 0 || o >= g.dim_out) throw Error("internal: gate output index out of range");
  };
  // The same walk as cpu::gate_forward / gate_backward.
  int o = 0;
  for (const auto& s : g.scalars) {
    for (int i = 0; i < s.dim; ++i) {
      check_out(o);
      check_in(s.start + i);
      outputs[o] = {s.start + i, -1, static_cast<int32_t>(s.act)};
      out_scale[o] = static_cast<T>(s.scale);
      inputs[s.start + i] = {1, o, 0, 0, static_cast<int32_t>(s.act)};
      in_scale[s.start + i] = static_cast<T>(s.scale);
      ++o;
    }
  }
  size_t gate_seg = 0;
  int gate_i = 0;
  for (const auto& b : g.gated) {
    const int d = 2 * b.l + 1;
    for (int c = 0; c < b.mul; ++c) {
      if (gate_seg >= g.gates.size()) throw Error("internal: gate has fewer gates than gated");
      const GateSegment& gs = g.gates[gate_seg];
      const int xg = gs.start + gate_i;
      const int act = static_cast<int32_t>(gs.act);
      const T scale = static_cast<T>(gs.scale);
      check_in(xg);
      check_out(o + d - 1);
      check_in(b.start + c * d + d - 1);
      inputs[xg] = {3, o, b.start + c * d, d, act};
      in_scale[xg] = scale;
      for (int m = 0; m < d; ++m) {
        const int xi = b.start + c * d + m;
        outputs[o] = {xi, xg, act};
        out_scale[o] = scale;
        inputs[xi] = {2, o, xg, 0, act};
        in_scale[xi] = scale;
        ++o;
      }
      if (++gate_i == gs.dim) {
        ++gate_seg;
        gate_i = 0;
      }
    }
  }
  if (o != g.dim_out) throw Error("internal: gate output dimension mismatch");
  gate.outputs.upload(outputs);
  gate.out_scale.upload(out_scale);
  gate.inputs.upload(inputs);
  gate.in_scale.upload(in_scale);
  check(cudaStreamSynchronize(nullptr), "gate upload");
  return gate;
}

template <class T>
void gate_forward(const Gate<T>& gate, int64_t num_nodes, const T* x, T* out, cudaStream_t stream) {
  const int64_t work = num_nodes * gate.dim_out;
  if (work <= 0) return;
  gate_forward_kernel<T>
      <<<static_cast<unsigned>(blocks_for(work, kThreads)), kThreads, 0, stream>>>(
          num_nodes, gate.dim_in, gate.dim_out, gate.outputs.data(), gate.out_scale.data(),
          gate.gated_factor, x, out);
  check_launch("gate_forward_kernel");
}

template <class T>
void gate_backward(const Gate<T>& gate, int64_t num_nodes, const T* x, const T* grad_out, T* grad_x,
                   cudaStream_t stream) {
  const int64_t work = num_nodes * gate.dim_in;
  if (work <= 0) return;
  gate_backward_kernel<T>
      <<<static_cast<unsigned>(blocks_for(work, kThreads)), kThreads, 0, stream>>>(
          num_nodes, gate.dim_in, gate.dim_out, gate.inputs.data(), gate.in_scale.data(),
          gate.gated_factor, x, grad_out, grad_x);
  check_launch("gate_backward_kernel");
}

#define E3FUSE_INSTANTIATE(T)                                                         \
  template Gate<T> make_gate<T>(const cpu::Gate<T>&);                                 \
  template void gate_forward<T>(const Gate<T>&, int64_t, const T*, T*, cudaStream_t); \
  template void gate_backward<T>(const Gate<T>&, int64_t, const T*, const T*, T*, cudaStream_t);
E3FUSE_INSTANTIATE(float)
E3FUSE_INSTANTIATE(double)
#undef E3FUSE_INSTANTIATE

}  // namespace e3fuse::cuda
