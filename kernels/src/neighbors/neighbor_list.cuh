// neighbors/neighbor_list.cuh: the cell-list neighbor search on the GPU
// (the device counterpart of e3fuse::NeighborList, see e3fuse/neighbors.h).
//
// Same edge set as the CPU list for the same positions, cell, pbc, cutoff and
// skin: every pair (periodic self-images included) with |v| < cutoff + skin,
// v = positions[j] - positions[i] + n . cell, decided on the edge vector exactly
// as the engine computes it from the shift table, so the list is symmetric
// (i <- j with n implies j <- i with -n). Receiver-sorted CSR; the order within
// a row is deterministic but not the CPU's. With set_num_owned, pairs of two
// atoms past the owned ones are left out, as on the CPU.
//
// Per edge: neighbor (int32) + shift_index (int32), 8 bytes. shift_index
// encodes the integer image n = (n0, n1, n2) as
//   ((n0 + K0) * (2 K1 + 1) + (n1 + K1)) * (2 K2 + 1) + (n2 + K2)
// into a small device table of Cartesian shifts n . cell covering |n_a| <= K_a.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "cuda/common.cuh"
#include "e3fuse/system.h"

namespace e3fuse::cuda {

// Device-side status of the per-call checks (one small copy to the host).
struct NeighborStatus {
  unsigned long long first_nonfinite;  // smallest atom with a non-finite position
  unsigned long long first_close;      // smallest edge closer than min_distance
  unsigned int moved;                  // some atom moved more than skin / 2
  unsigned int pad;
};

// Bounds found while taking fractional coordinates (one small copy per build).
struct FracStats {
  double fmin[3];  // open directions: bounds of the coordinate along the basis vector
  double fmax[3];
  int wmin[3];  // periodic directions: bounds of the integer wrap
  int wmax[3];
  double max_abs;       // largest |x| of any position component
  long long first_far;  // smallest atom too many cells away (or LLONG_MAX)
};

class DeviceNeighborList {
 public:
  DeviceNeighborList(double cutoff, double skin);
  ~DeviceNeighborList();
  DeviceNeighborList(const DeviceNeighborList&) = delete;
  DeviceNeighborList& operator=(const DeviceNeighborList&) = delete;

  // positions: DEVICE array num_atoms x 3, used as given (never wrapped).
  // cell: HOST 3 x 3 row-major (rows are lattice vectors; only rows of periodic
  // directions are used); pbc: HOST. Returns true when the list was rebuilt:
  // first call, invalidate(), number of atoms / cell / pbc changed, or some atom
  // moved more than skin / 2 since the last build (any motion when skin == 0).
  // Every call checks on the GPU for non-finite positions and for pairs of the
  // list closer than min_distance (<= 0 disables), and throws Error naming them.
  //
  // host_positions (optional): the same positions in host memory. The displacement and
  // the non-finite checks then run on the host, and when the list stays, the minimum
  // distance check is only launched: its status comes back with the step's results and
  // finish_checks() (after the stream was synchronized) throws if it failed. The step
  // then has no synchronization before the model runs.
  bool update(int64_t num_atoms, const double* positions, const double* cell, const bool pbc[3],
              double min_distance, cudaStream_t stream, const double* host_positions = nullptr);
  // Reports a minimum-distance check that update() left pending (no-op otherwise). Call it
  // once the stream has been synchronized after update().
  void finish_checks(const double* positions, cudaStream_t stream);
  void invalidate() { valid_ = false; }
  // Owned atoms and ghosts: see NeighborList::set_num_owned (-1: every pair).
  void set_num_owned(int64_t num_owned);
  int64_t num_owned() const { return num_owned_; }

  // Device pointers: row_offsets (n + 1), neighbors, shift_index (per edge),
  // shifts (3 doubles per table entry); positions and species as passed.
  GraphView view(const double* positions, const int32_t* species) const;

  double cutoff() const { return cutoff_; }
  double skin() const { return skin_; }
  int64_t num_atoms() const { return num_atoms_; }
  int64_t num_edges() const { return num_edges_; }
  int64_t num_builds() const { return num_builds_; }
  size_t bytes() const;  // device bytes held

  // The integer image n of each shift table entry (3 ints per entry, host).
  const std::vector<int32_t>& shift_cells() const { return table_cells_; }
  const int64_t* row_offsets() const { return row_offsets_.data(); }
  const int32_t* neighbors() const { return neighbors_.data(); }
  // The atoms in the order of their bins at the last build (num_atoms entries, device): atoms
  // near each other in space are near each other in this order.
  const int32_t* bin_order() const { return sorted_atoms_.data(); }
  const int32_t* shift_index() const { return shift_index_.data(); }
  const double* shifts() const { return table_.data(); }

 private:
  void build(const double* positions, cudaStream_t stream);
  // Launches the minimum-distance check on the current list into status_.
  void launch_min_distance(const double* positions, double min_distance, cudaStream_t stream);
  void report_close_pair(unsigned long long edge, const double* positions, double min_distance,
                         cudaStream_t stream) const;
  void ensure_temp(size_t bytes);

  double cutoff_;
  double skin_;
  int64_t num_owned_ = -1;
  bool valid_ = false;
  int64_t num_atoms_ = 0;
  int64_t num_edges_ = 0;
  int64_t num_builds_ = 0;
  double cell_[9] = {};
  bool pbc_[3] = {false, false, false};

  // The shift table: |n_a| <= table_reach_[a], Cartesian shifts for table_cell_.
  int table_reach_[3] = {-1, -1, -1};
  double table_cell_[9] = {};
  std::vector<int32_t> table_cells_;  // host: n per entry
  std::vector<double> table_host_;    // host: n . cell per entry

  // Per atom (node-level).
  DeviceArray<double> reference_;  // positions at the last build, 3 n
  DeviceArray<double> frac_;       // fractional coordinates (wrapped if periodic), SoA 3 n
  DeviceArray<int32_t> wrap_;      // integer wrap per periodic direction, SoA 3 n
  DeviceArray<uint32_t> keys_;     // bin of each atom
  DeviceArray<uint32_t> sorted_keys_;
  DeviceArray<int32_t> atoms_;  // 0..n-1
  DeviceArray<int32_t> sorted_atoms_;
  DeviceArray<double> sorted_pos_;    // positions in bin order, SoA 3 n
  DeviceArray<int32_t> sorted_wrap_;  // wraps in bin order, SoA 3 n
  DeviceArray<int64_t> counts_;       // n + 1
  DeviceArray<int64_t> row_offsets_;  // n + 1
  // Per bin.
  DeviceArray<int32_t> bin_count_;
  DeviceArray<int32_t> bin_start_;
  // Per edge: 8 bytes.
  DeviceArray<int32_t> neighbors_;
  DeviceArray<int32_t> shift_index_;
  // Small.
  DeviceArray<double> table_;
  DeviceArray<FracStats> partial_stats_;
  DeviceArray<NeighborStatus> status_;
  // A minimum-distance check in flight: its status is copied to pinned host memory.
  NeighborStatus* pending_status_ = nullptr;
  bool check_pending_ = false;
  double pending_min_distance_ = 0.0;
  std::vector<double> reference_host_;  // positions at the last build, when given on the host
  DeviceArray<unsigned char> temp_;     // CUB temporary storage
};

}  // namespace e3fuse::cuda
