// cpu/pair_repulsion.cpp: MACE's ZBL pair repulsion on the CPU (ops/pair_repulsion.h).
// Each node writes only its own rows: deterministic, no atomics.
#include "cpu/pair_repulsion.h"

namespace e3fuse::cpu {

void pair_repulsion_forward(const ops::PairRepulsionView& zbl, const GraphView& g, int64_t rows,
                            double* energies) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) energies[i] += ops::pair_repulsion_node_energy(zbl, g, i);
}

void pair_repulsion_backward(const ops::PairRepulsionView& zbl, const GraphView& g, int64_t nodes,
                             double weight, double* forces, double* atom_virials) {
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < nodes; ++k) {
    double f[3], w[9];
    ops::pair_repulsion_node_gradient(zbl, g, k, weight, f, w);
    for (int a = 0; a < 3; ++a) forces[3 * k + a] += f[a];
    if (atom_virials)
      for (int q = 0; q < 9; ++q) atom_virials[9 * k + q] += w[q];
  }
}

}  // namespace e3fuse::cpu
