// e3fuse/neighbors.h: cell-list neighbor search for periodic, partially periodic
// and open systems, triclinic cells and cells smaller than the cutoff.
#pragma once

#include <cstdint>
#include <vector>

#include "e3fuse/system.h"

namespace e3fuse {

// Builds a full (symmetric) receiver-sorted neighbor list with periodic images.
// The list is built with radius cutoff + skin and reused by update() until some
// atom has moved more than skin / 2 since the last build, the cell or the
// periodicity changes, or the number of atoms changes.
//
// Shifts are integer combinations of the cell vectors relative to the positions
// as given (atoms are never wrapped in the caller's arrays), so an edge vector is
// positions[j] - positions[i] + n . cell. Edges with |v| >= cutoff stay in the
// list (the skin); the engine skips them.
class NeighborList {
 public:
  NeighborList(double cutoff, double skin);

  // cell: 3 x 3 row-major, rows are the lattice vectors; only rows of periodic
  // directions are used. Returns true when the list was rebuilt.
  // Throws Error on NaN/inf positions, a degenerate cell along periodic
  // directions, or two atoms closer than min_distance (checked on every call).
  bool update(int64_t num_atoms, const double* positions, const double* cell, const bool pbc[3]);

  // Forces the next update() to rebuild.
  void invalidate() { valid_ = false; }

  // Owned atoms and ghosts (pair_style e3fuse comm exchange, Engine::compute(NodesView)):
  // with num_owned >= 0, only edges with the receiver or the sender among atoms
  // [0, num_owned) are kept, so the rows of atoms past them hold their edges to those
  // atoms only (ghost-ghost pairs are left out; the list stays symmetric). -1 (the
  // default): every pair. A change forces the next update() to rebuild.
  void set_num_owned(int64_t num_owned);
  int64_t num_owned() const { return num_owned_; }

  // A view of the current list for the given positions and species.
  GraphView view(const double* positions, const int32_t* species) const;

  double cutoff() const { return cutoff_; }
  double skin() const { return skin_; }
  int64_t num_edges() const { return static_cast<int64_t>(neighbors_.size()); }
  int64_t num_builds() const { return num_builds_; }
  void set_min_distance(double d) { min_distance_ = d; }

  const std::vector<int64_t>& row_offsets() const { return row_offsets_; }
  const std::vector<int32_t>& neighbors() const { return neighbors_; }
  const std::vector<int32_t>& shift_index() const { return shift_index_; }
  const std::vector<int32_t>& shift_cells() const { return shift_cells_; }  // 3 ints per shift
  const std::vector<double>& shifts() const { return shifts_; }             // 3 doubles per shift

 private:
  void build(int64_t num_atoms, const double* positions, const double* cell, const bool pbc[3]);
  void check_min_distance(const double* positions) const;

  double cutoff_;
  double skin_;
  double min_distance_ = 1e-4;
  int64_t num_owned_ = -1;
  bool valid_ = false;
  int64_t num_builds_ = 0;
  int64_t num_atoms_ = 0;
  double cell_[9] = {};
  bool pbc_[3] = {false, false, false};
  std::vector<double> reference_positions_;  // positions at the last build
  std::vector<int64_t> row_offsets_;
  std::vector<int32_t> neighbors_;
  std::vector<int32_t> shift_index_;
  std::vector<int32_t> shift_cells_;
  std::vector<double> shifts_;
};

}  // namespace e3fuse
