// cuda/edge_density.cuh: mace's density blocks on the GPU (RealAgnosticDensity[Residual]-
// InteractionBlock; cuda/edge_density.cu): the neighbor density rho_i, the division of the
// block's linear(convolution) by 1 + rho_i, and their adjoints, the densities of all layers
// and ZBL's pair repulsion in one edge walk each way (EdgeWalk); also the non-linear block's
// (RealAgnosticResidualNonLinearInteractionBlock) RadialMLP density and its division by
// alpha + beta rho_i (cpu/edge_density.cpp and MaceRunner in engine.cpp are the reference).
#pragma once

#include <cstdint>
#include <string>

#include "cpu/typed_plan.h"
#include "cuda/common.cuh"
#include "cuda/conv.cuh"
#include "e3fuse/system.h"
#include "ops/pair_repulsion.h"
#include "ops/radial_mlp.h"

namespace e3fuse::cuda {

// The edge density's data on the device (cpu::EdgeDensity): density_fn's weights for the exact
// evaluation, or its table in r: one table, or the species pairs' tables one after the other
// on one grid, pair (a, b) at slot pair_slot[a * num_species + b] x intervals.
template <class T>
struct EdgeDensity {
  struct View {
    const double* weights = nullptr;  // [num_basis]
    const T* table = nullptr;         // [slots][intervals][4]; null: exact evaluation
    const int* pair_slot = nullptr;   // null: one table
    int num_species = 0, intervals = 0;
    double origin = 0.0, inv_step = 0.0;
  };
  View view;
  DeviceArray<double> weights;
  DeviceArray<T> table;
  DeviceArray<int> pair_slot;
};

// The weights and, when `host` is tabulated, its table (for pair tables: those built so far).
template <class T>
EdgeDensity<T> make_edge_density(const cpu::EdgeDensity<T>& host);
// (Re)uploads the pair tables of `host` (after cpu::ensure_density_tables built some).
template <class T>
void upload_density_tables(EdgeDensity<T>& d, const cpu::EdgeDensity<T>& host);

// One edge walk for every density block of a model and its ZBL pair repulsion (rho depends on
// the positions only): the forward gives rho_t of each density layer t and the nodes' pair
// energies, the backward the forces / per-atom virials of every layer's dE/drho_t and of the
// pair energies, each in one pass over each node's edges (both directed edges of each pair
// at each end, written to that node only: no atomics, deterministic). Passed by value to the
// walk's kernel; at most kMaxWalkDensityLayers density layers (the engine checks at load).
constexpr int kMaxWalkDensityLayers = 8;
template <class T>
struct EdgeWalk {
  struct Layer {
    typename EdgeDensity<T>::View density;
    // forward: rho[i] written for nodes i < nodes (the layer's output rows); backward: nodes
    // k < nodes take the layer's force (the nodes its convolution's backward visits)
    int64_t nodes = 0;
    double* rho = nullptr;             // forward: out, [nodes]
    const double* grad_rho = nullptr;  // backward: dE/drho_t of every node of the graph
  };
  int num_layers = 0;
  Layer layers[kMaxWalkDensityLayers];
  // ZBL (mace's ZBLBasis, ops/pair_repulsion.h), when pair.pair is set: forward, energies[i]
  // += the sum of 0.5 V over i's edges for i < pair_nodes (the energy nodes); backward, the
  // forces of nodes k < pair_nodes from E = pair_weight * sum of the energy nodes' pair energies
  ops::PairRepulsionView pair;
  int64_t pair_nodes = 0;
  double pair_weight = 1.0;
  double* pair_energies = nullptr;

  bool empty() const { return num_layers == 0 && pair.pair == nullptr; }
  void add_density(const EdgeDensity<T>& density, int64_t nodes, double* rho,
                   const double* grad_rho) {
    // the model refuses more density layers at load (MaceModel's constructor)
    if (num_layers == kMaxWalkDensityLayers)
      throw Error("internal: EdgeWalk::add_density past kMaxWalkDensityLayers");
    layers[num_layers++] = Layer{density.view, nodes, rho, grad_rho};
  }
};

// The walks over the graph's nodes [0, g.num_nodes) (`g` on the device; the layers' and the
// pair's node counts bound them). Every density layer is tabulated, or none (exact: the
// basis evaluated once per edge for all layers, in double).
template <class T>
void edge_walk_forward(const Geometry<T>& geom, const EdgeWalk<T>& walk, const GraphView& g,
                       cudaStream_t stream);
template <class T>
void edge_walk_backward(const Geometry<T>& geom, const EdgeWalk<T>& walk, const GraphView& g,
                        double* forces, double* atom_virials, cudaStream_t stream);
// mace's non-linear block: the same with the edge density tanh(MLP(emb_ij, s_i, s_j)^2) of its
// RadialMLP (cpu/edge_density.cpp's RadialMlpView overloads), always evaluated exactly in
// double; mlp.params in device memory, mlp.max_dim <= kMaxDensityMlpDim.
constexpr int kMaxDensityMlpDim = 128;
template <class T>
void edge_density_forward(const Geometry<T>& geom, const ops::RadialMlpView& mlp,
                          const GraphView& g, double* rho, cudaStream_t stream);
template <class T>
void edge_density_backward(const Geometry<T>& geom, const ops::RadialMlpView& mlp,
                           const GraphView& g, const double* grad_rho, double* forces,
                           double* atom_virials, cudaStream_t stream);
// The non-linear block's normalisation: z[i] += a[i] / (alpha + beta rho[i]) for i < rows (dim
// values per row), and its adjoint given gz = dE/dz: ga[i] = gz[i] / d_i and
// grad_rho[i] = -beta gz_i . a_i / d_i^2 for i < rows, grad_rho[i] = 0 for rows <= i < n.
template <class T>
void nonlinear_scale_forward(int64_t rows, int dim, double alpha, double beta, const double* rho,
                             const T* a, T* z, cudaStream_t stream);
template <class T>
void nonlinear_scale_backward(int64_t rows, int64_t n, int dim, double alpha, double beta,
                              const T* a, const T* gz, const double* rho, T* ga, double* grad_rho,
                              cudaStream_t stream);

}  // namespace e3fuse::cuda
