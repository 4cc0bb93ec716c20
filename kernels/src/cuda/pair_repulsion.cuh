// cuda/pair_repulsion.cuh: the CUDA backend's ZBL pair repulsion (ops/pair_repulsion.h),
// the same math and gather-only scheme as cpu/pair_repulsion.cpp: one thread per node,
// each writing its own rows (deterministic, no atomics), in double for both precisions.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common.cuh"
#include "e3fuse/system.h"
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

// energies[i] += sum over i's edges (r < cutoff) of 0.5 V(r_ij), for nodes i < rows
// (g: a device graph).
void pair_repulsion_forward(const ops::PairRepulsionView& zbl, const GraphView& g, int64_t rows,
                            double* energies, cudaStream_t stream);

// For E = weight * sum over energy nodes of their pair energies, adds -dE/dr of nodes
// [0, nodes) to forces (n x 3) and, when given, their per-atom virials (n x 9).
void pair_repulsion_backward(const ops::PairRepulsionView& zbl, const GraphView& g, int64_t nodes,
                             double weight, double* forces, double* atom_virials,
                             cudaStream_t stream);

}  // namespace e3fuse::cuda
