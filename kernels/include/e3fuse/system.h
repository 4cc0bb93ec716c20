// e3fuse/system.h: the graph the engine evaluates, as plain pointers.
#pragma once

#include <cstdint>

namespace e3fuse {

// A receiver-sorted CSR graph over nodes. Edge e of row i points from sender
// neighbors[e] to receiver i with edge vector
//     v = positions[neighbors[e]] - positions[i] + shifts[shift_index[e]]
// (the convention of sevenn and mace-torch: vector = sender - receiver + shift).
//
// The graph must be symmetric: for every edge i <- j with shift s there is an
// edge j <- i with shift -s. The backward pass relies on it to gather instead of
// scatter (see engine.cpp). Neighbor lists built by e3fuse and LAMMPS full
// neighbor lists with ghost neighbors satisfy this.
//
// Only nodes [0, num_energy_nodes) contribute energy (LAMMPS: local atoms);
// forces and virials are returned for every node (ghost forces are reverse-
// communicated by the front end).
struct GraphView {
  int64_t num_nodes = 0;
  int64_t num_energy_nodes = 0;
  const double* positions = nullptr;     // num_nodes x 3
  const int32_t* species = nullptr;      // model species index per node
  const int64_t* row_offsets = nullptr;  // num_nodes + 1
  const int32_t* neighbors = nullptr;    // row_offsets[num_nodes]
  const int32_t* shift_index = nullptr;  // per edge; nullptr means all shifts are zero
  const double* shifts = nullptr;        // Cartesian shift vectors, 3 per entry
  // Optional, host: the edge count row_offsets[num_nodes], for graphs whose arrays are in
  // device memory (the CUDA backend's own graphs); -1: unknown (read back where needed).
  int64_t num_edges = -1;
  // Optional, host memory (regions, see Engine::set_region_atoms): per interaction layer t,
  // the number of leading nodes whose layer-t output is read on the way to the energy of
  // nodes [0, num_energy_nodes). Nodes are then ordered by their distance from those, so
  // that every neighbor of a node in layer_rows[t] is in layer_rows[t - 1]. Ignored with
  // a halo exchange.
  const int64_t* layer_rows = nullptr;
  // Optional: the caller promises that row_offsets, neighbors, shift_index and shifts hold
  // what they held in its previous compute(GraphView) on this engine, with the same
  // num_nodes (LAMMPS's list between reneighborings: only positions changed). The engine
  // then neither checks the edges again nor, on the GPU, copies them again. It checks the
  // promise only as far as the counts go: after any other kind of call, or with other node
  // or edge counts, the graph is taken as new; a false promise otherwise gives wrong results.
  bool same_edges_as_last = false;
};

// Nodes without edges for Engine::compute(NodesView): the engine finds the edges
// itself, as pair_style e3fuse comm exchange needs them. Nodes [0, num_owned) are a
// rank's own atoms (the energy nodes), the others ghosts: explicit copies of atoms
// owned elsewhere or of periodic images, so the system is open (no shifts). Edges
// join pairs closer than the model's cutoff + the engine's neighbor skin with an
// owned node at one end at least (the graph GraphView describes for a halo
// exchange: owned rows hold all their edges, a ghost's row its edges to owned
// nodes), found with the engine's neighbor list on the device it runs on and kept
// on that device between calls.
struct NodesView {
  int64_t num_nodes = 0;
  int64_t num_owned = 0;
  const double* positions = nullptr;  // num_nodes x 3
  const int32_t* species = nullptr;   // model species index per node
  // The caller's promise that the nodes are those of its previous compute(NodesView) on
  // this engine, in the same order, and that only their positions changed (LAMMPS between
  // reneighborings). The engine then keeps the edges it found, unless some node moved
  // more than skin / 2 since they were found. Without it (the default), or with other node
  // or owned counts than that call's, the edges are found again. A false promise gives
  // wrong results.
  bool same_nodes_as_last = false;
};

// A whole system for Engine::compute(SystemView): the engine finds the neighbors
// itself (on the device it runs on) and keeps the list between calls. Positions
// are used as given (never wrapped); cell rows are the lattice vectors, only rows
// of periodic directions are used.
struct SystemView {
  int64_t num_atoms = 0;
  const double* positions = nullptr;  // num_atoms x 3
  const int32_t* species = nullptr;   // model species index per atom
  const double* cell = nullptr;       // 3 x 3 row-major
  bool pbc[3] = {false, false, false};
};

}  // namespace e3fuse
