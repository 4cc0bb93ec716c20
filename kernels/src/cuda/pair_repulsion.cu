// cuda/pair_repulsion.cu: MACE's ZBL pair repulsion on the GPU (see pair_repulsion.cuh); its
// edge walks are the density blocks' (EdgeWalk, cuda/edge_density.cu).
#include <vector>

#include "cuda/pair_repulsion.cuh"

namespace e3fuse::cuda {

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

}  // namespace e3fuse::cuda
