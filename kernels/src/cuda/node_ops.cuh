// cuda/node_ops.cuh: the node-level ops on the GPU (o3.Linear, Gate, MACE's
// element-dependent linear and symmetric contraction, small elementwise helpers),
// the same math as their CPU versions in cpu/. Each op is built once from its host
// struct (cpu::Linear<T>, ...) into flat device tables; the entry points take
// device pointers to node-major arrays (node n at x + n * dim), launch on `stream`
// and return at once. Deterministic: every output element is written by one thread
// that sums in a fixed order (the CPU's order wherever it is cheap to follow).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "cpu/mace.h"
#include "cpu/typed_plan.h"
#include "cuda/common.cuh"

namespace e3fuse::cuda {

// ---------------------------------------------------------------------------------
// o3.Linear (and its transpose)
// ---------------------------------------------------------------------------------

// A linear layer as a block-sparse matrix product. Per node, a destination irrep
// block (mul_dst channels c of dimension d) gets, for each component m,
//   dst[c, m] = sum over its sources, sum_{k < K} W[k][c] src[k, m],
// the same weights for every m (e3nn's o3.Linear; the transpose swaps the roles of
// the two sides and uses W^T). An element (c, m) of a block sits at
//   offset + c * c_stride + m * m_stride
// ([mul][2l+1] "mul_ir": strides (d, 1); [2l+1][mul] "ir_mul": (1, mul)).
struct LinearSource {
  int64_t w = 0;  // W[k][c] at w + k * w_row + c (c counted from the task's col0)
  // float32 on the tensor cores: this source's W as mma B fragments (hi/lo TF32 parts), at
  // float4 frag + (k_step * 4 + n_tile) * 32 + lane of its weight set (linear.cu)
  int64_t frag = 0;
  int32_t offset = 0, k_stride = 1, m_stride = 1, K = 0, w_row = 0;
};
// One column tile (cols <= kLinearTileCols channels from col0) of one destination
// block; a task without sources writes bias or 0 (elements no path reaches).
struct LinearTask {
  int32_t offset = 0, c_stride = 1, m_stride = 1, d = 1;
  int32_t col0 = 0, cols = 0, source_begin = 0, source_end = 0;
};
inline constexpr int kLinearTileCols = 32;

// The forward and transposed products of one or more layers with the same paths
// (several: one per species, weights species_stride apart).
template <class T>
struct LinearTables {
  DeviceArray<LinearTask> fwd_tasks, bwd_tasks;
  DeviceArray<LinearSource> fwd_sources, bwd_sources;
  DeviceArray<T> weights, weights_t;
  DeviceArray<T> bias;  // [dim_out], empty when the layer has no bias
  int64_t species_stride = 0;
  int max_d = 1;  // the widest irrep dimension of the paths
  // float32 only: the weights as tensor-core fragments (empty: the FMA kernel runs, on
  // `weights`, which are left empty when these are set)
  DeviceArray<float> frag_fwd, frag_bwd;
  int64_t frag_fwd_stride = 0, frag_bwd_stride = 0;  // float4 per weight set
};

template <class T>
struct Linear {
  int64_t dim_in = 0, dim_out = 0;
  LinearTables<T> tables;
};

namespace detail {
// Builds the tables of one or more linear layers with the same paths (one weight
// set per layer, in order; biases only when `with_bias`). Defined in linear.cu.
template <class T>
void build_linear_tables(const std::vector<const cpu::Linear<T>*>& layers, bool with_bias,
                         LinearTables<T>& tables);
// dst (+)= W src for every node, forward (src: dim_in, dst: dim_out, bias added when
// present) or transposed (src: dim_out, dst: dim_in). With `species`, node n uses the
// weight set species[n]; otherwise set 0.
template <class T>
void run_linear_tables(const LinearTables<T>& tables, int64_t dim_in, int64_t dim_out,
                       bool transpose, int64_t num_nodes, const int32_t* species, bool accumulate,
                       const T* src, T* dst, cudaStream_t stream);
}  // namespace detail

// Honours in_ir_mul / out_ir_mul and the scalar biases of `host`.
template <class T>
Linear<T> make_linear(const cpu::Linear<T>& host);
// out = W x + b (out overwritten).
template <class T>
void linear_forward(const Linear<T>& lin, int64_t num_nodes, const T* x, T* out,
                    cudaStream_t stream);
// out += W x + b.
template <class T>
void linear_forward_add(const Linear<T>& lin, int64_t num_nodes, const T* x, T* out,
                        cudaStream_t stream);
// grad_x = W^T grad_out, or += with `accumulate` (no bias).
template <class T>
void linear_backward(const Linear<T>& lin, int64_t num_nodes, const T* grad_out, T* grad_x,
                     bool accumulate, cudaStream_t stream);
// Two layers on one input: out_a = A x + b_A over rows_a nodes, out_b = B x + b_B over rows_b
// (overwritten), in one launch where both run on the tensor cores (float32, sm_80 and later);
// each output element is the sum linear_forward makes, bitwise.
template <class T>
void linear_forward_pair(const Linear<T>& a, int64_t rows_a, T* out_a, const Linear<T>& b,
                         int64_t rows_b, T* out_b, const T* x, cudaStream_t stream);
// Their transposes on one gradient: grad_a = A^T grad_out, grad_b = B^T grad_out (overwritten),
// as linear_forward_pair.
template <class T>
void linear_backward_pair(const Linear<T>& a, int64_t rows_a, T* grad_a, const Linear<T>& b,
                          int64_t rows_b, T* grad_b, const T* grad_out, cudaStream_t stream);

// ---------------------------------------------------------------------------------
// e3nn nn.Gate
// ---------------------------------------------------------------------------------

// Output element: act(x[x]) * scale (gate < 0, a scalar), or
// act(x[gate]) * scale * gated_factor * x[x] (a gated irrep component).
struct GateOutput {
  int32_t x = 0, gate = -1, act = 0;
};
// Input element, by kind: 0 unused (gradient 0); 1 scalar, read at output o;
// 2 gated component, output o, its gate at x[xa]; 3 gate, gating the d
// components x[xa .. xa + d) written at outputs o .. o + d.
struct GateInput {
  int32_t kind = 0, o = 0, xa = 0, d = 0, act = 0;
};

template <class T>
struct Gate {
  int64_t dim_in = 0, dim_out = 0;
  T gated_factor = T(1);
  DeviceArray<GateOutput> outputs;  // [dim_out]
  DeviceArray<T> out_scale;         // [dim_out]
  DeviceArray<GateInput> inputs;    // [dim_in]
  DeviceArray<T> in_scale;          // [dim_in]
};

template <class T>
Gate<T> make_gate(const cpu::Gate<T>& host);
template <class T>
void gate_forward(const Gate<T>& gate, int64_t num_nodes, const T* x, T* out, cudaStream_t stream);
// grad_x = (d gate / dx)^T grad_out (overwritten).
template <class T>
void gate_backward(const Gate<T>& gate, int64_t num_nodes, const T* x, const T* grad_out, T* grad_x,
                   cudaStream_t stream);

// ---------------------------------------------------------------------------------
// MACE: element-dependent linear (skip_tp) and symmetric contraction
// ---------------------------------------------------------------------------------

// One o3.Linear per species, without biases (as on the CPU); weight set s of
// `tables` belongs to species s.
template <class T>
struct ElementLinear {
  int64_t dim_in = 0, dim_out = 0;
  int num_species = 0;
  LinearTables<T> tables;
};

template <class T>
ElementLinear<T> make_element_linear(const cpu::ElementLinear<T>& host);
// out = W_{s_n} x_n (out overwritten).
template <class T>
void element_linear_forward(const ElementLinear<T>& lin, int64_t num_nodes, const int32_t* species,
                            const T* x, T* out, cudaStream_t stream);
// grad_x (+)= W_{s_n}^T grad_out_n.
template <class T>
void element_linear_backward(const ElementLinear<T>& lin, int64_t num_nodes, const int32_t* species,
                             const T* grad_out, T* grad_x, bool accumulate, cudaStream_t stream);

// The symmetric contraction on the GPU, with the weights contracted into the coupling
// coefficients at load time: the CPU's rows (m, i_1..i_nu, k, value) are grouped by their
// product (m, i_1..i_nu), and per species s, group g and channel c
//   W[s][g][c] = sum_{rows r of g} value_r * W_nu[s][k_r][c],
// so that out[c][m] = sum_g W[s][g][c] prod_j x[c][i_j] (Batatia et al. 2022, eq. 10-11)
// visits each product once instead of once per (product, k) row.
// One output irrep: its component m sums the groups
// [group_begin[m_at + m] .. group_begin[m_at + m + 1]).
struct ScContraction {
  int64_t out_offset = 0;
  int32_t d = 1, m_at = 0;
};

template <class T>
struct SymmetricContraction {
  int64_t dim_in = 0, dim_out = 0;
  int C = 0, num_ell = 0, max_d = 1, num_contractions = 0, max_nu = 1, num_groups = 0;
  DeviceArray<int64_t> ell_offset;  // x[c][i] = x_flat[ell_offset[i] + c * ell_stride[i]]
  DeviceArray<int32_t> ell_stride;
  DeviceArray<ScContraction> contractions;
  DeviceArray<int32_t> group_begin;
  // per group, its product x[i_1] ... x[i_nu]: factor j in byte j - 1; factors past nu
  // name the slot num_ell, which holds 1
  DeviceArray<uint32_t> factors;
  DeviceArray<T> weights;  // [species][num_groups][C]
};

template <class T>
SymmetricContraction<T> make_symmetric_contraction(const cpu::SymmetricContraction<T>& host);

// mace's density blocks (RealAgnosticDensity[Residual]InteractionBlock) divide the message
// by 1 + rho: the contraction's input is m[n] = x[n] / (1 + rho[n]) with x = P(Z) (Z =
// linear(conv), P = the element skip or the identity) kept unscaled, the scale applied as
// the contraction loads its input (as 1 / (1 + rho) in double rounded to T, the CPU's
// scale_rows), instead of passes of their own over the rows.
struct RowDensity {
  const double* rho = nullptr;  // per node; null: no scaling (every other block)
  // backward only: dE/drho for nodes < num_nodes, 0 for num_nodes <= i < nodes
  double* grad_rho = nullptr;
  int64_t nodes = 0;
  // backward scratch: sc_density_partials(sc) doubles per node
  double* partials = nullptr;
};
// Partial sums of dE/drho per node that the contraction's backward leaves in
// RowDensity::partials: one per warp of the node's channels when they fill whole warps
// (C % 32 == 0, a warp's shuffle sum), else one per channel.
template <class T>
int sc_density_partials(const SymmetricContraction<T>& sc) {
  return sc.C % kWarp == 0 ? sc.C / kWarp : sc.C;
}
// out[n] = SC(m[n]; species s_n), out overwritten; m = x, or x / (1 + rho) with density.rho.
template <class T>
void symmetric_contraction_forward(const SymmetricContraction<T>& sc, int64_t num_nodes,
                                   const int32_t* species, const T* x, T* out, cudaStream_t stream,
                                   const RowDensity& density = {});
// grad_x = (d SC / dx)^T grad_out (overwritten; grad_x may be x). With density.rho (x unscaled,
// m = x / d, d = 1 + rho): grad_x = (dSC/dm)^T grad_out / d (= dE/dx) and
// density.grad_rho[n] = -(dE/dm . m) / d (= -dE/dm . x / d^2), summed in a fixed order.
template <class T>
void symmetric_contraction_backward(const SymmetricContraction<T>& sc, int64_t num_nodes,
                                    const int32_t* species, const T* x, const T* grad_out,
                                    T* grad_x, cudaStream_t stream, const RowDensity& density = {});

// ---------------------------------------------------------------------------------
// Elementwise helpers
// ---------------------------------------------------------------------------------

// y += x.
template <class T>
void add_inplace(int64_t count, const T* x, T* y, cudaStream_t stream);
// y = act(x) * scale.
template <class T>
void activation_forward(Activation act, T scale, int64_t count, const T* x, T* y,
                        cudaStream_t stream);
// g *= act'(x) * scale.
template <class T>
void activation_backward(Activation act, T scale, int64_t count, const T* x, T* g,
                         cudaStream_t stream);

}  // namespace e3fuse::cuda
