// ops/edge_vector.h: the vector of one neighbor-list entry, shared by the CPU and CUDA
// edge passes (pair repulsion, edge density).
#pragma once

#include <cstdint>

#include "e3fuse/system.h"
#include "ops/activation.h"

namespace e3fuse::ops {

// v = positions[j] - positions[i] + shift of entry e (row i, sender j = neighbors[e]).
E3F_HD void edge_vector(const GraphView& g, int64_t i, int64_t e, double v[3]) {
  const int64_t j = g.neighbors[e];
  for (int a = 0; a < 3; ++a) v[a] = g.positions[3 * j + a] - g.positions[3 * i + a];
  if (g.shift_index) {
    const double* s = g.shifts + 3 * static_cast<int64_t>(g.shift_index[e]);
    for (int a = 0; a < 3; ++a) v[a] += s[a];
  }
}

}  // namespace e3fuse::ops
