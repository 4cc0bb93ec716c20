// neighbors/neighbor_probe.cu: host-array wrappers around DeviceNeighborList for
// the tests (see cuda/probe.h). Not for the engine's hot path.

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/probe.h"
#include "neighbors/neighbor_list.cuh"

namespace e3fuse::cuda {

void probe_neighbor_list_frames(double cutoff, double skin, int64_t num_atoms, int64_t num_frames,
                                const double* frames, const double* cell, const bool pbc[3],
                                double min_distance, std::vector<int8_t>& rebuilt,
                                std::vector<int64_t>& row_offsets, std::vector<int32_t>& neighbors,
                                std::vector<int32_t>& images) {
  if (num_frames < 1) throw Error("probe_neighbor_list_frames needs at least one frame");
  DeviceNeighborList list(cutoff, skin);
  DeviceArray<double> positions;
  positions.resize(3 * num_atoms);
  rebuilt.clear();
  for (int64_t f = 0; f < num_frames; ++f) {
    positions.upload(frames + 3 * num_atoms * f, 3 * num_atoms, nullptr);
    rebuilt.push_back(
        list.update(num_atoms, positions.data(), cell, pbc, min_distance, nullptr) ? 1 : 0);
  }
  const int64_t num_edges = list.num_edges();
  row_offsets.assign(num_atoms + 1, 0);
  neighbors.assign(num_edges, 0);
  std::vector<int32_t> shift_index(num_edges);
  check(cudaMemcpy(row_offsets.data(), list.row_offsets(), (num_atoms + 1) * sizeof(int64_t),
                   cudaMemcpyDeviceToHost),
        "download row_offsets");
  if (num_edges > 0) {
    check(cudaMemcpy(neighbors.data(), list.neighbors(), num_edges * sizeof(int32_t),
                     cudaMemcpyDeviceToHost),
          "download neighbors");
    check(cudaMemcpy(shift_index.data(), list.shift_index(), num_edges * sizeof(int32_t),
                     cudaMemcpyDeviceToHost),
          "download shift_index");
  }
  check(cudaDeviceSynchronize(), "synchronize");
  const std::vector<int32_t>& cells = list.shift_cells();
  const int64_t table_entries = static_cast<int64_t>(cells.size() / 3);
  images.assign(3 * num_edges, 0);
  for (int64_t e = 0; e < num_edges; ++e) {
    const int64_t k = shift_index[e];
    if (k < 0 || k >= table_entries) {
      throw Error("probe_neighbor_list: shift index " + std::to_string(k) + " of edge " +
                  std::to_string(e) + " outside the shift table");
    }
    for (int a = 0; a < 3; ++a) images[3 * e + a] = cells[3 * k + a];
  }
}

void probe_neighbor_list(double cutoff, double skin, int64_t num_atoms, const double* positions,
                         const double* cell, const bool pbc[3], double min_distance,
                         std::vector<int64_t>& row_offsets, std::vector<int32_t>& neighbors,
                         std::vector<int32_t>& images) {
  std::vector<int8_t> rebuilt;
  probe_neighbor_list_frames(cutoff, skin, num_atoms, 1, positions, cell, pbc, min_distance,
                             rebuilt, row_offsets, neighbors, images);
}

}  // namespace e3fuse::cuda
