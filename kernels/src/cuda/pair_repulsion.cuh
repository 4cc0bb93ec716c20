// cuda/pair_repulsion.cuh: the CUDA backend's ZBL pair repulsion (ops/pair_repulsion.h): its
// constants on the device. Its energies and forces are evaluated in the density blocks' edge
// walks (EdgeWalk in cuda/edge_density.cuh: one warp per node, each writing its own rows,
// deterministic, no atomics), in double for both precisions, as cpu/pair_repulsion.cpp.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common.cuh"
#include "model/plan.h"
#include "ops/pair_repulsion.h"

namespace e3fuse::cuda {

// The model's ZBL constants on the device (enabled() false when the model has none).
class PairRepulsion {
 public:
  void upload(const ModelPlan& plan);
  bool enabled() const { return view_.pair != nullptr; }
  const ops::PairRepulsionView& view() const { return view_; }

 private:
  DeviceArray<double> table_;
  ops::PairRepulsionView view_;
};

}  // namespace e3fuse::cuda
