// cuda/probe.h: host-array wrappers that run one CUDA op on the GPU (upload the
// inputs, run, synchronize, download), for the op-level tests through the Python
// OpsProbe. Plain C++ (no CUDA headers): included by the bindings. Not for the
// engine's hot path. Each section belongs to one group of ops.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/mace.h"
#include "cpu/typed_plan.h"
#include "e3fuse/system.h"
#include "model/plan.h"

namespace e3fuse::cuda {

// ---------------------------------------------------------------------------------
// Node-level ops (cuda/linear.cu, gate.cu, mace.cu), defined in cuda/probe.cu.
// Host arrays, node-major; instantiated for float and double.
// ---------------------------------------------------------------------------------

// grad_out below is not used for template deduction, so that nullptr may be passed.
template <class T>
struct ProbeNonDeduced {
  using type = T;
};
template <class T>
using ProbeArg = typename ProbeNonDeduced<T>::type;

// out = W x + b (x: n x dim_in, out: n x dim_out), or with `transpose`
// out = W^T x (x: n x dim_out, out: n x dim_in).
template <class T>
void probe_linear(const cpu::Linear<T>& lin, int64_t n, const T* x, T* out, bool transpose);
// grad_out == nullptr: out = gate(x) (n x dim_out); else out = (d gate/dx)^T grad_out
// (n x dim_in).
template <class T>
void probe_gate(const cpu::Gate<T>& gate, int64_t n, const T* x, const ProbeArg<T>* grad_out,
                T* out);
// out = W_{s} x, or with `transpose` out = W_{s}^T x (x: n x dim_out).
template <class T>
void probe_element_linear(const cpu::ElementLinear<T>& lin, int64_t n, const int32_t* species,
                          const T* x, T* out, bool transpose);
// grad_out == nullptr: out = SC(x) (n x dim_out); else out = (d SC/dx)^T grad_out
// (n x dim_in).
template <class T>
void probe_symmetric_contraction(const cpu::SymmetricContraction<T>& sc, int64_t n,
                                 const int32_t* species, const T* x, const ProbeArg<T>* grad_out,
                                 T* out);

// ---------------------------------------------------------------------------------
// (end of the node-level ops section)
// ---------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------
// ZBL pair repulsion (EdgeWalk in cuda/edge_density.cu), defined in cuda/probe.cu.
// ---------------------------------------------------------------------------------

// The op on the graph `g` (host arrays; nodes [0, g.num_energy_nodes) count): energies
// (n) = the forward on those nodes, forces (n x 3) and atom_virials (n x 9) = the backward
// with `weight`; all overwritten.
void probe_pair_repulsion(const ModelPlan& plan, const GraphView& g, double weight,
                          double* energies, double* forces, double* atom_virials);

// ---------------------------------------------------------------------------------
// Neighbor list (neighbors/neighbor_list.cu), defined in neighbors/neighbor_probe.cu.
// Host arrays in and out; one DeviceNeighborList for all frames.
// ---------------------------------------------------------------------------------

// Runs the GPU neighbor list once; returns the edges on the host: row_offsets
// (n + 1), neighbors, and the integer image per edge (3 ints per edge).
void probe_neighbor_list(double cutoff, double skin, int64_t num_atoms, const double* positions,
                         const double* cell, const bool pbc[3], double min_distance,
                         std::vector<int64_t>& row_offsets, std::vector<int32_t>& neighbors,
                         std::vector<int32_t>& images);
// Runs update() on num_frames position frames (num_frames x num_atoms x 3) with one
// list; rebuilt[f] tells whether frame f rebuilt it; the edges are those after the
// last frame.
void probe_neighbor_list_frames(double cutoff, double skin, int64_t num_atoms, int64_t num_frames,
                                const double* frames, const double* cell, const bool pbc[3],
                                double min_distance, std::vector<int8_t>& rebuilt,
                                std::vector<int64_t>& row_offsets, std::vector<int32_t>& neighbors,
                                std::vector<int32_t>& images);

// ---------------------------------------------------------------------------------
// (end of the neighbor list section)
// ---------------------------------------------------------------------------------

}  // namespace e3fuse::cuda
