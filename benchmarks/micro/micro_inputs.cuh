// benchmarks/micro/micro_inputs.cuh: what conv_micro.cu and radial_micro.cu take in: the
// structure file of conv_micro.py, the engine's GPU neighbor list over it, and the model's
// convolution plans.
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "cuda/common.cuh"
#include "e3fuse/error.h"
#include "micro_common.h"
#include "model/plan.h"
#include "neighbors/neighbor_list.cuh"

namespace e3fuse_micro {

// A structure file of conv_micro.py: float64 little endian [n, cell (9, rows = lattice
// vectors), pbc (3, 0/1), positions (3 n)].
struct Structure {
  int64_t n = 0;
  double cell[9] = {};
  bool pbc[3] = {false, false, false};
  std::vector<double> positions;
};

inline Structure read_structure(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw e3fuse::Error("cannot open the structure file " + path);
  std::vector<double> head(13);
  f.read(reinterpret_cast<char*>(head.data()), 13 * sizeof(double));
  if (!f) throw e3fuse::Error(path + ": truncated header");
  Structure s;
  s.n = static_cast<int64_t>(head[0]);
  if (s.n <= 0 || static_cast<double>(s.n) != head[0])
    throw e3fuse::Error(path + ": bad atom count");
  std::copy(head.begin() + 1, head.begin() + 10, s.cell);
  for (int a = 0; a < 3; ++a) s.pbc[a] = head[10 + a] != 0.0;
  s.positions.resize(static_cast<size_t>(3 * s.n));
  f.read(reinterpret_cast<char*>(s.positions.data()),
         static_cast<std::streamsize>(s.positions.size() * sizeof(double)));
  if (!f) throw e3fuse::Error(path + ": truncated positions");
  return s;
}

// The options of the tools that read a structure file: CommonOptions' and --structure (required,
// see validate), --skin (the neighbor list's, default 0.5 A as e3fuse.Calculator).
struct StructureOptions : CommonOptions {
  std::string structure;
  double skin = 0.5;
  bool take(const std::string& key, const std::string& value) {
    if (key == "--structure") {
      structure = value;
    } else if (key == "--skin") {
      skin = std::stod(value);
    } else {
      return CommonOptions::take(key, value);
    }
    return true;
  }
  void validate() const {
    CommonOptions::validate();
    if (structure.empty()) throw e3fuse::Error("--structure is required");
  }
};

// The graph of a structure as BackendImpl::compute_system builds it: the engine's GPU
// neighbor list (cutoff + skin), every atom of species 0, every atom an energy node.
struct DeviceGraph {
  e3fuse::cuda::DeviceArray<double> positions;
  e3fuse::cuda::DeviceArray<int32_t> species;
  e3fuse::cuda::DeviceNeighborList neighbors;
  e3fuse::GraphView view;
  DeviceGraph(const Structure& s, double cutoff, double skin, cudaStream_t stream)
      : neighbors(cutoff, skin) {
    positions.upload(s.positions.data(), s.positions.size(), stream);
    neighbors.update(s.n, positions.data(), s.cell, s.pbc, 0.0, stream, s.positions.data());
    e3fuse::cuda::check(cudaStreamSynchronize(stream), "neighbor list");
    species.upload(std::vector<int32_t>(static_cast<size_t>(s.n), 0));
    view = neighbors.view(positions.data(), species.data());
    view.num_nodes = s.n;
    view.num_energy_nodes = s.n;
  }
};

// The model's convolutions in layer order: SevenNet's layers or MACE's interaction blocks.
inline std::vector<const e3fuse::ConvPlan*> conv_plans(const e3fuse::ModelPlan& plan) {
  std::vector<const e3fuse::ConvPlan*> plans;
  if (plan.family == "mace") {
    for (const auto& l : plan.mace_layers) plans.push_back(&l.conv);
  } else {
    for (const auto& l : plan.layers) plans.push_back(&l.conv);
  }
  return plans;
}

}  // namespace e3fuse_micro
