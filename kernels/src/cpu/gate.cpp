// cpu/gate.cpp: e3nn nn.Gate, forward and transpose. Input [scalars | gates | gated],
// output [act_s(scalars) * c_s | act_g(gate_c) * c_g * gated_c * factor].
#include "cpu/ops.h"
#include "ops/activation.h"

namespace e3fuse::cpu {

template <class T>
void gate_forward(const Gate<T>& gate, int64_t num_nodes, const T* x, T* out) {
  const GatePlan& g = gate.plan;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < num_nodes; ++n) {
    const T* xn = x + n * g.dim_in;
    T* on = out + n * g.dim_out;
    int o = 0;
    for (const auto& s : g.scalars) {
      const T c = static_cast<T>(s.scale);
      for (int i = 0; i < s.dim; ++i) on[o++] = ops::activation(s.act, xn[s.start + i]) * c;
    }
    int gate_seg = 0, gate_i = 0;
    for (const auto& b : g.gated) {
      const int d = 2 * b.l + 1;
      for (int c = 0; c < b.mul; ++c) {
        const GateSegment& gs = g.gates[gate_seg];
        const T gv = ops::activation(gs.act, xn[gs.start + gate_i]) * static_cast<T>(gs.scale) *
                     gate.gated_factor;
        if (++gate_i == gs.dim) {
          ++gate_seg;
          gate_i = 0;
        }
        for (int m = 0; m < d; ++m) on[o++] = gv * xn[b.start + c * d + m];
      }
    }
  }
}

template <class T>
void gate_backward(const Gate<T>& gate, int64_t num_nodes, const T* x, const T* grad_out,
                   T* grad_x) {
  const GatePlan& g = gate.plan;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < num_nodes; ++n) {
    const T* xn = x + n * g.dim_in;
    const T* gn = grad_out + n * g.dim_out;
    T* dn = grad_x + n * g.dim_in;
    for (int64_t i = 0; i < g.dim_in; ++i) dn[i] = T(0);
    int o = 0;
    for (const auto& s : g.scalars) {
      const T c = static_cast<T>(s.scale);
      for (int i = 0; i < s.dim; ++i)
        dn[s.start + i] = gn[o++] * c * ops::activation_grad(s.act, xn[s.start + i]);
    }
    int gate_seg = 0, gate_i = 0;
    for (const auto& b : g.gated) {
      const int d = 2 * b.l + 1;
      for (int c = 0; c < b.mul; ++c) {
        const GateSegment& gs = g.gates[gate_seg];
        const T xg = xn[gs.start + gate_i];
        const T c_g = static_cast<T>(gs.scale) * gate.gated_factor;
        const T gv = ops::activation(gs.act, xg) * c_g;
        T dot = T(0);
        for (int m = 0; m < d; ++m) {
          dn[b.start + c * d + m] = gv * gn[o];
          dot += gn[o] * xn[b.start + c * d + m];
          ++o;
        }
        dn[gs.start + gate_i] += dot * c_g * ops::activation_grad(gs.act, xg);
        if (++gate_i == gs.dim) {
          ++gate_seg;
          gate_i = 0;
        }
      }
    }
  }
}

template void gate_forward<float>(const Gate<float>&, int64_t, const float*, float*);
template void gate_forward<double>(const Gate<double>&, int64_t, const double*, double*);
template void gate_backward<float>(const Gate<float>&, int64_t, const float*, const float*, float*);
template void gate_backward<double>(const Gate<double>&, int64_t, const double*, const double*,
                                    double*);

}  // namespace e3fuse::cpu
