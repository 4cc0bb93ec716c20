// e3fuse/engine.h: evaluates energy, forces and virial of a model on a graph.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "e3fuse/model.h"
#include "e3fuse/system.h"

namespace e3fuse {

class RegionSplitter;
struct RegionGrid;

enum class Device { cpu, cuda };
enum class Precision { float32, float64 };
// How each convolution evaluates its radial MLP R(r): per edge with the model's own
// layers ("mlp"), or from a cubic Hermite table in r built at load time whose error is
// below float32 rounding ("table", see ops/radial_table.h). "auto" (the default):
// table in float32, mlp in float64. MACE's edge density (density blocks) follows the same
// choice: exact per edge with "mlp", tabulated in r with "table".
enum class Radial { automatic, mlp, table };

// "cpu", "cuda" or "cuda:N" (GPU N of this process's visible devices).
Device parse_device(const std::string& name);
// The N of "cuda:N"; -1 for "cuda" (the current device, normally 0) and "cpu".
int parse_gpu_index(const std::string& name);
Precision parse_precision(const std::string& name);
Radial parse_radial(const std::string& name);  // "auto", "mlp" or "table"
const char* to_string(Device device);
const char* to_string(Precision precision);
const char* to_string(Radial radial);
bool cuda_available();
int cuda_device_count();  // GPUs this process can use (0 without CUDA)
const char* version();

// Caller-owned output buffers; a null pointer means "not wanted".
//
// Virial convention (LAMMPS): virial = -sum_edges v (x) dE/dv, a full 3 x 3
// row-major tensor; for a periodic system ASE's stress is -virial / volume.
// Per-atom virials split each edge's term equally between its two atoms.
struct ComputeOutput {
  double energy = 0.0;              // sum over nodes [0, num_energy_nodes)
  double* atom_energies = nullptr;  // num_nodes (zero for nodes past num_energy_nodes)
  double* forces = nullptr;         // num_nodes x 3
  double* virial = nullptr;         // 9
  double* atom_virials = nullptr;   // num_nodes x 9
};

// Domain decomposition with a halo one cutoff thick (pair_style e3fuse comm
// exchange): nodes [0, num_energy_nodes) of the graph are owned by this rank, the
// others are ghosts, copies of atoms owned elsewhere (another rank, or a periodic
// image of an owned atom). The engine computes node features on owned nodes only.
// Before every interaction layer but the first (whose input, the species
// embedding, every node has), it asks the front end to refresh the ghosts' copy
// of the layer's input from their owners; in the backward pass, the adjoints of
// that input gathered on ghosts go back and are added to their owners.
//
// The graph needs the owned nodes' full rows and, for each ghost, the row of its
// edges to owned nodes (the transpose); ghost-ghost edges carry no energy
// gradient and may be left out. The engine calls forward() num_layers - 1 times
// per compute and, when gradients are wanted, reverse() num_layers - 1 times,
// on every rank, also when this rank's graph is empty (the calls are collective).
class HaloExchange {
 public:
  virtual ~HaloExchange() = default;
  // Owned nodes whose rows are sent (to other ranks, or to this rank's images). A node may
  // appear more than once (sent to several ranks: each entry is its own row).
  virtual int64_t num_border_nodes() const = 0;
  virtual const int32_t* border_nodes() const = 0;
  // Self images: the last num_self_images() ghosts, nodes [num_nodes - S, num_nodes), are
  // copies the engine keeps itself, on the device that holds the rows: before forward()
  // hands over the other ghosts, nothing is done for them; after it, each takes the row of
  // its source, self_image_sources()[k] for node num_nodes - S + k: an owned node (a
  // periodic image of this rank's own atom) or one of the exchanged ghosts before them (a
  // second image of a remote atom). In the backward pass their adjoints are added to their
  // sources, in node order, before reverse() (so that a remote source sends the sum).
  // Default: none, every ghost goes through forward()/reverse().
  virtual int64_t num_self_images() const { return 0; }
  virtual const int32_t* self_image_sources() const { return nullptr; }
  // border_rows: num_border_nodes x width, the rows of the border nodes in the
  // order of border_nodes(). Writes ghost_rows: (num_nodes - num_energy_nodes - S) x width,
  // each exchanged ghost's row taken from its owner. Rows are in the engine's precision
  // (float for Precision::float32): those are the bytes that travel.
  virtual void forward(int width, const double* border_rows, double* ghost_rows) = 0;
  virtual void forward(int width, const float* border_rows, float* ghost_rows) = 0;
  // ghost_rows: adjoints on the exchanged ghosts (self images' already added to their
  // sources). Writes border_sums: num_border_nodes x width, for each border entry the sum
  // of the adjoints of the ghost copies it stands for (summed in the rows' type); the engine
  // adds the entries to their nodes in entry order.
  virtual void reverse(int width, const double* ghost_rows, double* border_sums) = 0;
  virtual void reverse(int width, const float* ghost_rows, float* border_sums) = 0;
  // After each compute on a GPU: how long the device waited, summed over this call's
  // exchanges, for forward()/reverse() to return (from the end of the work queued before
  // the exchange to the next work queued after it); the device computes the convolution
  // of the rows that need no exchanged data meanwhile (DeviceHalo, cuda/halo.cuh). Not
  // called on the CPU, whose exchanges block the computation throughout. Default: ignored.
  virtual void add_device_wait(double /*seconds*/) {}
  // Whether forward() and reverse() take rows in GPU memory (an exchange that reads and
  // writes device memory itself, e.g. through CUDA-aware MPI): a GPU engine then passes
  // device pointers, without copies through host memory. Asked at each compute. Default:
  // host rows.
  virtual bool takes_device_rows() const { return false; }
};

class Engine {
 public:
  // gpu: index of the GPU for Device::cuda (-1: the current device).
  Engine(std::shared_ptr<const Model> model, Device device, Precision precision,
         int num_threads = 0, int gpu = -1, Radial radial = Radial::automatic);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Throws Error on bad input (unknown species index, NaN positions, ...).
  void compute(const GraphView& graph, ComputeOutput& output);
  // With a halo exchange (see HaloExchange): energies of owned nodes, forces and
  // per-atom virials of all nodes (ghosts' still to be reverse-communicated).
  void compute(const GraphView& graph, ComputeOutput& output, HaloExchange* halo);
  // Nodes whose edges the engine finds itself (see NodesView): the owned nodes' energies,
  // every node's forces and per-atom virials, as compute(GraphView, output, halo) gives them
  // for that graph. The edges are kept between calls (NodesView::same_nodes_as_last).
  // halo null: the graph is evaluated as it is, every node's features from its own edges
  // (an open system when every node is owned; with ghosts, what compute(GraphView) gives
  // on this graph, which has no ghost-ghost edges).
  void compute(const NodesView& nodes, ComputeOutput& output, HaloExchange* halo);
  // The edges found by the last compute(NodesView) (copied from the GPU for device cuda):
  // row_offsets (num_nodes + 1) and neighbors, the CSR rows GraphView describes.
  void node_graph(std::vector<int64_t>& row_offsets, std::vector<int32_t>& neighbors) const;
  // The most values per node one halo exchange moves (the widest input of layers
  // 1 .. L-1; 0 for a one-layer model, which exchanges nothing).
  int halo_width() const;

  // Evaluates a whole system; the engine builds its own neighbor list (cell list
  // with radius cutoff + skin, on the GPU for device cuda) and rebuilds it only
  // when an atom moved more than skin / 2, or the cell, periodicity or atom count
  // changed. Atoms closer than `min_distance` are an error.
  void compute(const SystemView& system, ComputeOutput& output);
  void set_neighbor_skin(double skin);
  void set_min_distance(double min_distance);
  // Systems too large for one pass are evaluated region by region (compute(SystemView)
  // only): the atoms are split along the lattice directions into regions, each
  // evaluated with the atoms and periodic images within num_layers x cutoff of it as
  // ghosts, which costs their extra work and holds the node tensors of one region at
  // a time. Energies, forces and virials are those of one pass up to rounding.
  // max_atoms: the most atoms (owned + ghosts) a region may hold; 0 (the default):
  // automatic, on a GPU what its free memory holds (estimated per atom and edge), on
  // the CPU always one pass. The neighbor list of a region is built for each call.
  void set_region_atoms(int64_t max_atoms);
  int64_t region_atoms() const;
  int num_regions() const;  // regions of the last compute(SystemView); 1: one pass
  // Of the neighbor list of the last compute(SystemView) or compute(NodesView):
  int64_t num_neighbor_builds() const;
  int64_t num_neighbor_edges() const;  // skin included
  // Calls whose GPU launches were replayed from the CUDA graph of an earlier call with the
  // same launches (0 on the CPU).
  int64_t num_step_replays() const;
  double neighbor_skin() const;

  // Device memory held by this process's e3fuse arrays (0 on the CPU): now and peak.
  static size_t device_bytes_in_use();
  static size_t device_bytes_peak();
  static void reset_device_bytes_peak();

  // Models with per-system inputs (mace's embedding_specs: total charge, spin; see
  // Model::with_system_inputs): switches the engine to other values, values[i] of
  // model().system_inputs()[i]. Only what they change is recomputed (the species
  // embedding and reference energies); radial tables, the neighbor list and device
  // buffers are kept, and the results are those of an engine built for the new values.
  // Throws Error, keeping the current values, on a model without such inputs, a wrong
  // count or a value outside a categorical input's classes.
  void set_system_inputs(const std::vector<double>& values);
  // The values in use (those model() was folded with until set_system_inputs; empty
  // for a model without per-system inputs).
  const std::vector<double>& system_input_values() const;

  const Model& model() const { return *model_; }
  Device device() const { return device_; }
  Precision precision() const { return precision_; }
  Radial radial() const { return radial_; }  // mlp or table (auto resolved)
  std::string describe() const;              // model, device, precision, threads

 private:
  void compute_regions(const RegionSplitter& splitter, const RegionGrid& grid,
                       ComputeOutput& output);
  void compute_region(const SystemView& region, int64_t num_owned, const int64_t* layer_rows,
                      ComputeOutput& output);
  void run_cpu(const GraphView& graph, ComputeOutput& output, HaloExchange* halo);

  struct Impl;
  std::shared_ptr<const Model> model_;
  Device device_;
  Precision precision_;
  Radial radial_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace e3fuse
