// cpu/ops.h: the CPU backend's entry points, one per op, on node-major arrays
// (node n's features at x + n * dim). OpenMP over nodes inside each call.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/typed_plan.h"
#include "e3fuse/system.h"
#include "ops/radial_mlp.h"

namespace e3fuse::cpu {

// out = linear(x) over num_nodes rows (out overwritten).
template <class T>
void linear_forward(const Linear<T>& lin, int64_t num_nodes, const T* x, T* out);
// grad_x (+)= linear^T(grad_out); accumulate when `accumulate` is set.
template <class T>
void linear_backward(const Linear<T>& lin, int64_t num_nodes, const T* grad_out, T* grad_x,
                     bool accumulate);

template <class T>
void gate_forward(const Gate<T>& gate, int64_t num_nodes, const T* x, T* out);
// grad_x = d gate / dx ^T grad_out (overwritten).
template <class T>
void gate_backward(const Gate<T>& gate, int64_t num_nodes, const T* x, const T* grad_out,
                   T* grad_x);

// Edge geometry the convolution needs, shared by its forward and backward.
template <class T>
struct EdgeGeometry {
  const TypedPlan<T>* plan = nullptr;
  const GraphView* graph = nullptr;
};

// The graph with only its first `rows` nodes as receivers (the convolution over
// the owned nodes of a halo-exchange graph, for both backends); senders stay any node.
inline GraphView first_receivers(const GraphView& g, int64_t rows) {
  GraphView r = g;
  r.num_nodes = rows;
  return r;
}

// Nodes whose layer-t features are computed on graph g: the owned nodes with a halo
// exchange; with GraphView::layer_rows (regions), layer_rows[t] (the inputs of layer t on
// the outputs of layer t - 1, every node for layer 0, the embedding); otherwise all.
inline int64_t layer_output_rows(const GraphView& g, bool halo, int t) {
  if (halo) return g.num_energy_nodes;
  return g.layer_rows ? g.layer_rows[t] : g.num_nodes;
}
inline int64_t layer_input_rows(const GraphView& g, bool halo, int t) {
  return t == 0 ? g.num_nodes : layer_output_rows(g, halo, t - 1);
}
// The nodes the backward pass of layer t's convolution visits: with layer_rows, nodes past
// its inputs touch no receiver of it (their per-axis distance from the energy nodes is a
// whole shell further out); with a halo, ghosts collect adjoints for their owners.
inline int64_t layer_backward_nodes(const GraphView& g, bool halo, int t) {
  return halo ? g.num_nodes : layer_input_rows(g, false, t);
}

// y_i = (1/D) sum_{j in N(i), r_ij < cutoff} TP(x_j, Y(v_ij), MLP(emb(r_ij))) for all nodes.
template <class T>
void conv_forward(const TypedPlan<T>& plan, const Conv<T>& conv, const GraphView& graph, const T* x,
                  T* y);

// Adjoint of conv_forward given grad_y = dE/dy for all nodes: writes grad_x
// (overwritten) and adds the edge-geometry part to forces (num_nodes x 3,
// F = -dE/dr) and, when given, to atom_virials (num_nodes x 9, LAMMPS sign).
// Gathers only: each node handles its own edges in both directions, which needs
// the symmetric graph described in system.h.
template <class T>
void conv_backward(const TypedPlan<T>& plan, const Conv<T>& conv, const GraphView& graph,
                   const T* x, const T* grad_y, T* grad_x, double* forces, double* atom_virials);

// The edge density of species pair `pair` (s_i * num_species + s_j) at distance r < cutoff
// and its r-derivative: from the density's table when it has one (the pair's table built),
// else evaluated in double (ops::edge_density).
template <class T>
void edge_density_at(const TypedPlan<T>& plan, const EdgeDensity<T>& density, int pair, double r,
                     double& value, double& grad);

// mace's density blocks: rho_i = sum_{j in N(i), r_ij < cutoff} tanh((w . emb_ij)^2) (times
// the envelope when apply_cutoff is false) for every node of the graph (overwritten); from
// the density's table when it has one (EdgeDensity).
template <class T>
void edge_density_forward(const TypedPlan<T>& plan, const EdgeDensity<T>& density,
                          const GraphView& graph, double* rho);
// Adds the edge-geometry part of grad_rho = dE/drho (every node of the graph) to forces and,
// when given, atom_virials (as conv_backward; needs the symmetric graph).
template <class T>
void edge_density_backward(const TypedPlan<T>& plan, const EdgeDensity<T>& density,
                           const GraphView& graph, const double* grad_rho, double* forces,
                           double* atom_virials);

// The non-linear block's density: tanh(MLP(emb_ij, s_i, s_j)^2) per edge (cpu/edge_density.cpp);
// `mlp` reads host memory.
template <class T>
void edge_density_forward(const TypedPlan<T>& plan, const ops::RadialMlpView& mlp,
                          const GraphView& graph, double* rho);
template <class T>
void edge_density_backward(const TypedPlan<T>& plan, const ops::RadialMlpView& mlp,
                           const GraphView& graph, const double* grad_rho, double* forces,
                           double* atom_virials);

}  // namespace e3fuse::cpu
