// cuda/pair_repulsion.cu: MACE's ZBL pair repulsion on the GPU (see pair_repulsion.cuh).
#include <vector>

#include "cuda/pair_repulsion.cuh"

namespace e3fuse::cuda {

namespace {

// One warp per node, its lanes over the node's edges (one thread per node measured 0.32 ms
// per MACE-OMAT-0-arch. call at 864 atoms on an H100: 864 serial double-precision loops).
constexpr int kPairThreads = 128;

__global__ void pair_repulsion_forward_kernel(ops::PairRepulsionView zbl, GraphView g, int64_t rows,
                                              double* energies) {
  int lane;
  const int64_t i = warp_node(lane);
  if (i >= rows) return;  // the whole warp
  const double e = warp_sum(ops::pair_repulsion_node_energy(zbl, g, i, lane, kWarp));
  if (lane == 0) energies[i] += e;
}

__global__ void pair_repulsion_backward_kernel(ops::PairRepulsionView zbl, GraphView g,
                                               int64_t nodes, double weight, double* forces,
                                               double* atom_virials) {
  int lane;
  const int64_t k = warp_node(lane);
  if (k >= nodes) return;  // the whole warp
  double f[3], w[9];
  ops::pair_repulsion_node_gradient(zbl, g, k, weight, f, w, lane, kWarp);
  for (int a = 0; a < 3; ++a) f[a] = warp_sum(f[a]);
  if (atom_virials)
    for (int q = 0; q < 9; ++q) w[q] = warp_sum(w[q]);
  if (lane != 0) return;
  for (int a = 0; a < 3; ++a) forces[3 * k + a] += f[a];
  if (atom_virials)
    for (int q = 0; q < 9; ++q) atom_virials[9 * k + q] += w[q];
}

}  // namespace

void PairRepulsion::upload(const ModelPlan& plan) {
  view_ = ops::PairRepulsionView{};
  if (!plan.pair_repulsion.enabled) return;
  const std::vector<double> table =
      ops::pair_repulsion_table(plan.pair_repulsion, plan.atomic_numbers);
  table_.upload(table);
  check(cudaStreamSynchronize(nullptr), "pair repulsion table upload");
  view_ =
      ops::pair_repulsion_view(plan.pair_repulsion, static_cast<int>(plan.atomic_numbers.size()),
                               plan.cutoff, table_.data());
}

void pair_repulsion_forward(const ops::PairRepulsionView& zbl, const GraphView& g, int64_t rows,
                            double* energies, cudaStream_t stream) {
  if (rows <= 0) return;
  pair_repulsion_forward_kernel<<<static_cast<int>(blocks_for(rows * kWarp, kPairThreads)),
                                  kPairThreads, 0, stream>>>(zbl, g, rows, energies);
  check_launch("pair_repulsion_forward_kernel");
}

void pair_repulsion_backward(const ops::PairRepulsionView& zbl, const GraphView& g, int64_t nodes,
                             double weight, double* forces, double* atom_virials,
                             cudaStream_t stream) {
  if (nodes <= 0) return;
  pair_repulsion_backward_kernel<<<static_cast<int>(blocks_for(nodes * kWarp, kPairThreads)),
                                   kPairThreads, 0, stream>>>(zbl, g, nodes, weight, forces,
                                                              atom_virials);
  check_launch("pair_repulsion_backward_kernel");
}

}  // namespace e3fuse::cuda
