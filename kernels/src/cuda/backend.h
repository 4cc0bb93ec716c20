// cuda/backend.h: the CUDA backend as the engine sees it. Plain C++ (no CUDA
// headers), so engine.cpp and the bindings compile with the host compiler.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "e3fuse/engine.h"
#include "e3fuse/system.h"
#include "model/plan.h"

namespace e3fuse::cuda {

class Backend {
 public:
  virtual ~Backend() = default;
  // A host CSR graph (LAMMPS, explicit graphs): copied to the device each call.
  // halo (may be null): see e3fuse::HaloExchange; rows are packed and unpacked on
  // the GPU and staged through pinned host buffers.
  virtual void compute(const GraphView& host_graph, ComputeOutput& out, HaloExchange* halo) = 0;
  // A system: neighbors are found on the GPU (cell list with skin, kept between calls;
  // rebuild forces a new one). Atoms [0, num_energy_nodes) contribute energy; layer_rows
  // (host, may be null): see GraphView::layer_rows.
  virtual void compute_system(const SystemView& system, double skin, double min_distance,
                              ComputeOutput& out, int64_t num_energy_nodes, bool rebuild,
                              const int64_t* layer_rows) = 0;
  // Nodes of an open system whose edges are found on the GPU (see NodesView), with radius
  // cutoff + skin, and kept until rebuild or until a node moved more than skin / 2.
  virtual void compute_nodes(const NodesView& nodes, double skin, double min_distance, bool rebuild,
                             ComputeOutput& out, HaloExchange* halo) = 0;
  // The edges of the last compute_nodes, copied to the host.
  virtual void node_graph(std::vector<int64_t>& row_offsets,
                          std::vector<int32_t>& neighbors) const = 0;
  // The most atoms one compute_system call can take now on this GPU (estimated: free
  // memory plus what this backend's per-call arrays hold, over the bytes per atom of a
  // system with edges_per_atom edges per atom).
  virtual int64_t max_atoms(double edges_per_atom, bool want_grad, bool want_virial) const = 0;
  virtual int64_t num_neighbor_builds() const = 0;
  virtual int64_t num_neighbor_edges() const = 0;
  // Calls whose launches ran as a replay of the CUDA graph of an earlier call (StepGraph).
  virtual int64_t num_step_replays() const = 0;
  virtual std::string device_name() const = 0;
  // Engine::set_system_inputs: the species embedding [num_species][dim] and e0 of other
  // per-system inputs (MACE), uploaded before this call returns.
  virtual void set_system_inputs(const std::vector<double>& embedding,
                                 const std::vector<double>& e0) = 0;
};

// Throws Error when no GPU can be used. gpu: device index, -1 for the current device.
// radial_tables: the convolutions read their radial MLP from tables (RadialTable).
std::unique_ptr<Backend> make_backend(const ModelPlan& plan, Precision precision, int gpu,
                                      bool radial_tables);

// Whether a CUDA device can be used by this process (false without a GPU), and how many.
bool device_available();
int device_count();

// Bytes this process holds in e3fuse device arrays: now, and the peak since the last reset.
size_t device_bytes_in_use();
size_t device_bytes_peak();
void reset_device_bytes_peak();

}  // namespace e3fuse::cuda
