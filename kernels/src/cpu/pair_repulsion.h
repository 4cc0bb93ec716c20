// cpu/pair_repulsion.h: the CPU backend's ZBL pair repulsion (ops/pair_repulsion.h),
// forward (per-node energies) and backward (forces, per-atom virials); gathers only,
// OpenMP over nodes, in double for both engine precisions.
#pragma once

#include <cstdint>

#include "e3fuse/system.h"
#include "ops/pair_repulsion.h"

namespace e3fuse::cpu {

// energies[i] += sum over i's edges (r < cutoff) of 0.5 V(r_ij), for nodes i < rows.
void pair_repulsion_forward(const ops::PairRepulsionView& zbl, const GraphView& g, int64_t rows,
                            double* energies);

// For E = weight * sum over energy nodes of their pair energies, adds -dE/dr of nodes
// [0, nodes) to forces (n x 3) and, when given, their per-atom virials (n x 9, LAMMPS sign).
void pair_repulsion_backward(const ops::PairRepulsionView& zbl, const GraphView& g, int64_t nodes,
                             double weight, double* forces, double* atom_virials);

}  // namespace e3fuse::cpu
