// cuda/engine_cuda.cu: the CUDA backend's runners for both model families. They
// mirror CpuRunner / MaceRunner in engine.cpp step by step on device arrays:
// node-level tensors (N x features) live on the GPU between the forward and the
// backward pass; per-edge work happens only inside the fused convolution.
//
// Per call: positions (and species) go host -> device once; energies, forces and
// the virial come back once. The global virial and energy are summed in a fixed
// order (deterministic).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cpu/mace.h"
#include "cpu/ops.h"
#include "cpu/typed_plan.h"
#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "cuda/conv.cuh"
#include "cuda/edge_density.cuh"
#include "cuda/halo.cuh"
#include "cuda/node_ops.cuh"
#include "cuda/pair_repulsion.cuh"
#include "e3fuse/error.h"
#include "neighbors/neighbor_list.cuh"

namespace e3fuse::cuda {

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

bool device_available() { return device_count() > 0; }

size_t device_bytes_in_use() { return DeviceBytes::in_use().load(); }
size_t device_bytes_peak() { return DeviceBytes::peak().load(); }
void reset_device_bytes_peak() { DeviceBytes::peak() = DeviceBytes::in_use().load(); }

namespace {

constexpr int kThreads = 256;

// From this many nodes, SevenNet recomputes each layer's convolution input in the backward
// pass instead of keeping it (E3FUSE_RECOMPUTE_FROM_NODES overrides; 0: always).
int64_t recompute_from_nodes() {
  return std::max<int64_t>(0, env_int("E3FUSE_RECOMPUTE_FROM_NODES", 65536));
}

template <class T>
__global__ void embed_kernel(int64_t n, int dim, const int32_t* species, const T* table, T* x) {
  const int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (q >= n * dim) return;
  const int64_t i = q / dim;
  x[q] = table[static_cast<int64_t>(species[i]) * dim + (q - i * dim)];
}

// SevenNet: e_i = shift[s_i] + scale[s_i] * h_i on energy nodes.
template <class T>
__global__ void sevennet_energy_kernel(int64_t n, int64_t n_energy, const int32_t* species,
                                       const T* h, const T* scale, const T* shift, double* e) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int s = species[i];
  e[i] = i < n_energy ? static_cast<double>(shift[s]) + static_cast<double>(scale[s]) * h[i] : 0.0;
}

// dE/dh_i = c_i on energy nodes (c per species, or one constant when per_species is null).
template <class T>
__global__ void seed_kernel(int64_t n, int64_t n_energy, const int32_t* species,
                            const T* per_species, T constant, T* grad) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  grad[i] = i < n_energy ? (per_species ? per_species[species[i]] : constant) : T(0);
}

template <class T>
__global__ void accumulate_kernel(int64_t n, const T* r, double* sum) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) sum[i] += static_cast<double>(r[i]);
}

// MACE: e_i = e0[s_i] + scale * inter_i + shift on energy nodes.
__global__ void mace_energy_kernel(int64_t n, int64_t n_energy, const int32_t* species,
                                   const double* e0, double scale, double shift,
                                   const double* inter, double* e) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  e[i] = i < n_energy ? e0[species[i]] + scale * inter[i] + shift : 0.0;
}

// Sum of the per-atom virials (9 columns) in one block with a fixed order.
__global__ void virial_sum_kernel(int64_t n, const double* atom_virials, double* out) {
  __shared__ double part[kThreads][9];
  double s[9] = {};
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    for (int q = 0; q < 9; ++q) s[q] += atom_virials[9 * i + q];
  for (int q = 0; q < 9; ++q) part[threadIdx.x][q] = s[q];
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width)
      for (int q = 0; q < 9; ++q) part[threadIdx.x][q] += part[threadIdx.x + width][q];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    for (int q = 0; q < 9; ++q) out[q] = part[0][q];
}

int grid(int64_t work) { return static_cast<int>(blocks_for(work, kThreads)); }

// x = the species embedding of every node (table [species][dim]).
template <class T>
void embed_species(const GraphView& g, int64_t n, int dim, const DeviceArray<T>& table,
                   DeviceArray<T>& x, cudaStream_t st) {
  x.resize(static_cast<size_t>(n) * dim);
  embed_kernel<T><<<grid(n * dim), kThreads, 0, st>>>(n, dim, g.species, table.data(), x.data());
  check_launch("embed_kernel");
}

// Zeroes rows [first_row, num_rows) of a device array of rows of `width` values.
template <class T>
void zero_rows(T* a, int64_t first_row, int64_t num_rows, int width, cudaStream_t stream) {
  if (num_rows > first_row)
    check(cudaMemsetAsync(a + first_row * width, 0, (num_rows - first_row) * width * sizeof(T),
                          stream),
          "memset");
}

// E3FUSE_PROFILE=1: device time of each stage (events around it, summed over calls),
// printed to stderr when the engine is destroyed. Off by default (no events recorded). The
// engine's first call is left out: it pays one-time work (the kernels' first launches,
// allocations), which made the 864-atom sums of `e3fuse bench scaling`'s 11 calls mostly
// that call's (benchmarks/results/session21_h200/).
class StageProfiler {
 public:
  StageProfiler() : enabled_(std::getenv("E3FUSE_PROFILE") != nullptr) {}
  ~StageProfiler() {
    if (!enabled_ || totals_.empty()) return;
    collect();
    double sum = 0.0;
    for (const auto& [name, t] : totals_) sum += t.ms;
    std::fprintf(stderr, "e3fuse profile (device ms summed over %lld calls after the first):\n",
                 static_cast<long long>(calls_ - 1));
    for (const auto& [name, t] : totals_)
      std::fprintf(stderr, "  %-24s %10.3f ms  %5.1f %%  (%lld launches)\n", name.c_str(), t.ms,
                   100.0 * t.ms / (sum > 0 ? sum : 1), static_cast<long long>(t.count));
    for (auto& e : pool_) cudaEventDestroy(e);
  }
  bool enabled() const { return enabled_; }
  void begin_call() {
    if (enabled_) ++calls_;
  }
  // Marks the start of stage `name` on `stream`; the stage ends at the next mark or end().
  void mark(const char* name, cudaStream_t stream) {
    if (!enabled_) return;
    cudaEvent_t e = event();
    cudaEventRecord(e, stream);
    pending_.push_back({name, e});
  }
  void end(cudaStream_t stream) { mark(nullptr, stream); }
  // After the stream is synchronized: add the elapsed times of the marks (none in the first
  // call).
  void collect() {
    for (size_t q = 0; q + 1 < pending_.size() && calls_ > 1; ++q) {
      if (!pending_[q].name) continue;
      float ms = 0.0f;
      cudaEventElapsedTime(&ms, pending_[q].event, pending_[q + 1].event);
      Total& t = totals_[pending_[q].name];
      t.ms += ms;
      ++t.count;
    }
    for (const auto& m : pending_) free_.push_back(m.event);
    pending_.clear();
  }

 private:
  struct Mark {
    const char* name;
    cudaEvent_t event;
  };
  struct Total {
    double ms = 0.0;
    int64_t count = 0;
  };
  cudaEvent_t event() {
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
    cudaEvent_t e;
    check(cudaEventCreate(&e), "cudaEventCreate");
    pool_.push_back(e);
    return e;
  }
  bool enabled_;
  int64_t calls_ = 0;
  std::vector<Mark> pending_;
  std::vector<cudaEvent_t> pool_, free_;
  std::map<std::string, Total> totals_;
};

// What every runner keeps on the device: the graph it was given, outputs, flags.
class DeviceState {
 public:
  // Makes `device` current (every allocation of this engine lives there), then a stream on it.
  explicit DeviceState(int device) {
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream");
  }
  ~DeviceState() { cudaStreamDestroy(stream_); }
  cudaStream_t stream() const { return stream_; }

  DeviceArray<double> positions, energies, forces, atom_virials, virial;
  DeviceArray<int32_t> species, neighbors, shift_index;
  // error_node: [0] coincident atoms, [1] a force out of the fixed-point range (node + 1)
  DeviceArray<int64_t> row_offsets, error_node;
  DeviceArray<double> shifts;
  // The graph's rows in a spatial order (device, row_order_size entries), or null: the order
  // the convolutions take every row in (spatial_rows).
  const int32_t* row_order = nullptr;
  int64_t row_order_size = 0;
  // the convolutions' forces and per-atom virials on message receivers (conv.cuh)
  DeviceArray<unsigned long long> remote_forces, remote_virials;
  // Per-atom virials asked for: each edge's virial term goes half to each end, as on the
  // CPU. Otherwise only their sum is used, and the sender takes the whole term (no
  // fixed-point virial sums).
  bool split_virials = false;
  RemoteForces remote() {
    return {remote_forces.data(), split_virials ? remote_virials.data() : nullptr,
            error_node.data() + 1};
  }
  StageProfiler profiler;
  DeviceHalo halo;

  // A convolution over the first `rows` rows of the graph, all of them: in row_order when
  // there is one for exactly these rows. Thread blocks that run at the same time then work on
  // atoms near each other, whose neighbors' rows (the gathered x_j, dE/dy_j) they share in the
  // L2 cache. Atoms in no spatial order cost the convolutions 11 % (forward) and 27 % (backward)
  // more at 32,000 Cu atoms otherwise (SevenNet-0; MACE-MP-0 6 % and 30 %; the conv micro,
  // H200, benchmarks/results/conv_row_order_h200/). Each row's sums do not depend on the order.
  ConvRows spatial_rows(int64_t rows) const {
    if (!row_order || rows != row_order_size) return {};
    return {row_order, rows};
  }

 private:
  cudaStream_t stream_ = nullptr;
};

// A layer's input rows x (width values) exchanged with the neighbor ranks, then conv(rows)
// over the layer's receivers: the interior rows run while the host exchanges, the boundary
// rows after it (DeviceHalo); without an exchange, every row.
template <class T, class Launch>
void exchange_then_convolve(DeviceState& s, bool exchange, int width, T* x, int64_t rows,
                            Launch&& conv) {
  const cudaStream_t st = s.stream();
  if (exchange) {
    s.profiler.mark("halo exchange", st);
    s.halo.begin_forward(width, x);
    s.profiler.mark("conv forward", st);
    conv(s.halo.interior_receivers());
    s.profiler.mark("halo exchange", st);  // the device's wait for the host, and the copy in
    s.halo.finish_forward(width, x);
    s.profiler.mark("conv forward", st);
    conv(s.halo.boundary_receivers());
    return;
  }
  s.profiler.mark("conv forward", st);
  conv(s.spatial_rows(rows));
}

// conv(rows) over the senders of a layer's backward; with an exchange, the reverse exchange
// of their adjoints grad is begun (finish_reverse_exchange ends it, after the caller's other
// work on owned rows): the senders that need the exchange run first and their adjoints go
// to the host while the other senders run.
template <class T, class Launch>
void convolve_then_begin_reverse(DeviceState& s, bool exchange, int width, T* grad, int64_t senders,
                                 Launch&& conv) {
  const cudaStream_t st = s.stream();
  s.profiler.mark("conv backward", st);
  if (!exchange) {
    conv(s.spatial_rows(senders));
    return;
  }
  conv(s.halo.exchanged_senders());
  s.profiler.mark("halo exchange", st);
  s.halo.begin_reverse(width, grad);
  s.profiler.mark("conv backward", st);
  conv(s.halo.other_senders());
}

template <class T>
void finish_reverse_exchange(DeviceState& s, int width, T* grad) {
  s.profiler.mark("halo exchange", s.stream());
  s.halo.finish_reverse(width, grad);
}

// The model part of a runner: forward + backward on a device graph.
class Model {
 public:
  virtual ~Model() = default;
  // Writes energies[n] (double) and, if want_grad, forces [n][3] and, if want_virial,
  // atom_virials [n][9] (both zeroed first). With s.halo active, node features are
  // computed on owned nodes only and ghost rows of layer inputs are exchanged.
  virtual void run(const GraphView& g, bool want_grad, bool want_virial, DeviceState& s) = 0;
  // Called with the host's species of the next call's nodes before run (MACE builds the
  // radial tables of the species pairs it meets; see cpu::Conv::pair_tables).
  virtual void prepare(const int32_t* /*species*/, int64_t /*n*/) {}
  // The species embedding and e0 of other per-system inputs (see Backend).
  virtual void set_system_inputs(const std::vector<double>& /*embedding*/,
                                 const std::vector<double>& /*e0*/, cudaStream_t /*stream*/) {
    throw Error("internal: this model has no per-system inputs");
  }
  // Bytes of the node tensors run() holds per node for a graph of n nodes (single GPU):
  // the sum of the widths it resizes its arrays to, kept next to run() so the two agree.
  virtual size_t node_bytes(int64_t n, bool want_grad) const = 0;
  // Bytes run() holds per edge of the graph beyond the neighbor list (the non-linear block's
  // per-edge RadialMLP weights, conv.cuh).
  virtual size_t edge_bytes() const { return 0; }
  // Changes whenever prepare() or set_system_inputs() change what run() passes to its kernels
  // from the host (table views, their sizes): StepGraph replays a step only while it stays.
  uint64_t launch_version() const { return launch_version_; }

 protected:
  uint64_t launch_version_ = 0;
};

template <class T>
class SevennetModel : public Model {
 public:
  struct Layer {
    Linear<T> self_connection, linear_1, linear_2;
    Conv<T> conv;
    Gate<T> gate;
    // self_connection_type 'nequip': the self-connection is one linear per species
    bool sc_per_species = false;
    ElementLinear<T> sc_species;
  };

  // `model`: the plan `plan` was made from (its per-species self-connections).
  SevennetModel(const cpu::TypedPlan<T>& plan, const ModelPlan& model)
      : geom_(make_geometry<T>(plan)) {
    embedding_dim_ = plan.embedding_dim;
    embedding_.upload(plan.embedding);
    for (size_t t = 0; t < plan.layers.size(); ++t) {
      const auto& l = plan.layers[t];
      if (l.self_connection.dim_out != l.linear_2.dim_out) {
        throw Error("internal: self-connection and linear_2 of different widths");
      }
      const SevennetLayer& source = model.layers.at(t);
      const bool per_species = !source.self_connection_species.empty();
      Linear<T> self_connection;
      if (per_species) {  // the widths only: run as sc_species
        self_connection.dim_in = l.self_connection.dim_in;
        self_connection.dim_out = l.self_connection.dim_out;
      } else {
        self_connection = make_linear<T>(l.self_connection);
      }
      Layer q;
      q.self_connection = std::move(self_connection);
      q.linear_1 = make_linear<T>(l.linear_1);
      q.linear_2 = make_linear<T>(l.linear_2);
      q.conv = make_conv<T>(l.conv);
      q.gate = make_gate<T>(l.gate);
      if (per_species) {
        q.sc_per_species = true;
        q.sc_species = make_element_linear<T>(cpu::make_element_linear<T>(
            ElementLinearPlan{source.self_connection.in, source.self_connection.out,
                              source.self_connection_species}));
      }
      layers_.push_back(std::move(q));
    }
    for (const auto& r : plan.readout) readout_.push_back(make_linear<T>(r));
    scale_.upload(plan.scale);
    shift_.upload(plan.shift);
  }

  void run(const GraphView& g, bool want_grad, bool want_virial, DeviceState& s) override {
    const int64_t n = g.num_nodes;
    const bool halo = s.halo.active();
    const cudaStream_t st = s.stream();
    const int L = static_cast<int>(layers_.size());
    const int64_t last_rows = cpu::layer_output_rows(g, halo, L - 1);
    // Large single-GPU systems keep one convolution input (x1) instead of one per layer
    // and recompute it in the backward pass from the stored gate inputs (a gate and a
    // linear layer per layer, ~1.5 % of a step): 480 floats per atom and layer for
    // SevenNet-0. With a halo the ghost rows would need exchanging again: kept.
    const bool recompute_x1 = want_grad && !s.halo.active() && n >= recompute_from_nodes();
    x1_.resize(recompute_x1 ? 1 : L);
    pre_gate_.resize(L);
    embed_species(g, n, embedding_dim_, embedding_, x_, st);
    for (int t = 0; t < L; ++t) {
      const Layer& l = layers_[t];
      const int64_t rows = cpu::layer_output_rows(g, halo, t);
      const int64_t in_rows = cpu::layer_input_rows(g, halo, t);
      s.profiler.mark("linear forward", st);
      // the self-connection goes straight into the gate's input; linear_2 adds to it
      pre_gate_[t].resize(static_cast<size_t>(n) * l.linear_2.dim_out);
      DeviceArray<T>& x1 = x1_[recompute_x1 ? 0 : t];
      x1.resize(static_cast<size_t>(n) * l.linear_1.dim_out);
      // layer 0's input (the embedding) is known on every node; later ones come from owners
      // (halo) or from the previous layer's rows
      if (l.sc_per_species) {
        element_linear_forward(l.sc_species, rows, g.species, x_.data(), pre_gate_[t].data(), st);
        linear_forward(l.linear_1, in_rows, x_.data(), x1.data(), st);
      } else {
        linear_forward_pair(l.self_connection, rows, pre_gate_[t].data(), l.linear_1, in_rows,
                            x1.data(), x_.data(), st);
      }
      if (!halo) zero_rows(x1.data(), in_rows, n, static_cast<int>(l.linear_1.dim_out), st);
      y_.resize(static_cast<size_t>(n) * l.conv.view.dim_out);
      exchange_then_convolve(s, halo && t > 0, static_cast<int>(l.linear_1.dim_out), x1.data(),
                             rows, [&](const ConvRows& part) {
                               conv_forward(geom_, l.conv, cpu::first_receivers(g, rows), x1.data(),
                                            y_.data(), s.error_node.data(), st, part);
                             });
      s.profiler.mark("linear forward", st);
      linear_forward_add(l.linear_2, rows, y_.data(), pre_gate_[t].data(), st);
      x_.resize(static_cast<size_t>(n) * l.gate.dim_out);
      s.profiler.mark("gate", st);
      gate_forward(l.gate, rows, pre_gate_[t].data(), x_.data(), st);
    }
    s.profiler.mark("readout, energy", st);
    const T* h = x_.data();
    for (size_t r = 0; r < readout_.size(); ++r) {
      DeviceArray<T>& next = (r % 2 == 0) ? h0_ : h1_;
      next.resize(static_cast<size_t>(n) * readout_[r].dim_out);
      linear_forward(readout_[r], last_rows, h, next.data(), st);
      h = next.data();
    }
    sevennet_energy_kernel<T><<<grid(n), kThreads, 0, st>>>(
        n, g.num_energy_nodes, g.species, h, scale_.data(), shift_.data(), s.energies.data());
    check_launch("sevennet_energy_kernel");
    if (!want_grad) return;

    grad_.resize(static_cast<size_t>(n));
    seed_kernel<T><<<grid(n), kThreads, 0, st>>>(n, g.num_energy_nodes, g.species, scale_.data(),
                                                 T(0), grad_.data());
    check_launch("seed_kernel");
    for (int r = static_cast<int>(readout_.size()) - 1; r >= 0; --r) {
      tmp_.resize(static_cast<size_t>(n) * readout_[r].dim_in);
      linear_backward(readout_[r], last_rows, grad_.data(), tmp_.data(), false, st);
      std::swap(grad_, tmp_);
    }
    for (int t = L - 1; t >= 0; --t) {
      const Layer& l = layers_[t];
      const int64_t rows = cpu::layer_output_rows(g, halo, t);
      const int64_t in_rows = cpu::layer_input_rows(g, halo, t);
      s.profiler.mark("gate", st);
      grad_p_.resize(static_cast<size_t>(n) * l.gate.dim_in);
      gate_backward(l.gate, rows, pre_gate_[t].data(), grad_.data(), grad_p_.data(), st);
      s.profiler.mark("linear backward", st);
      grad_.resize(static_cast<size_t>(n) * l.self_connection.dim_in);
      // dE/dy reuses y's buffer: y is dead once linear_2 has run, and the two
      // (N x conv.dim_out each) are the largest node tensors of the model
      y_.resize(static_cast<size_t>(n) * l.linear_2.dim_in);
      T* grad_y = y_.data();
      if (l.sc_per_species) {
        element_linear_backward(l.sc_species, rows, g.species, grad_p_.data(), grad_.data(), false,
                                st);
        linear_backward(l.linear_2, rows, grad_p_.data(), grad_y, false, st);
      } else {
        linear_backward_pair(l.self_connection, rows, grad_.data(), l.linear_2, rows, grad_y,
                             grad_p_.data(), st);
      }
      // linear_1's rows may be more
      zero_rows(grad_.data(), rows, in_rows, static_cast<int>(l.self_connection.dim_in), st);
      // ghosts' energies are not ours
      zero_rows(grad_y, rows, n, static_cast<int>(l.linear_2.dim_in), st);
      if (recompute_x1) {  // x1 = linear_1(this layer's input), bitwise as in the forward
        s.profiler.mark("recompute", st);
        if (t == 0) {
          embed_species(g, n, embedding_dim_, embedding_, x_, st);
        } else {
          const Gate<T>& previous = layers_[t - 1].gate;
          x_.resize(static_cast<size_t>(n) * previous.dim_out);
          gate_forward(previous, in_rows, pre_gate_[t - 1].data(), x_.data(), st);
        }
        x1_[0].resize(static_cast<size_t>(n) * l.linear_1.dim_out);
        linear_forward(l.linear_1, in_rows, x_.data(), x1_[0].data(), st);
        zero_rows(x1_[0].data(), in_rows, n, static_cast<int>(l.linear_1.dim_out), st);
      }
      const T* x1 = x1_[recompute_x1 ? 0 : t].data();
      grad_x1_.resize(static_cast<size_t>(n) * l.conv.view.dim_in);
      const bool exchange = s.halo.active() && t > 0;
      const int64_t senders = cpu::layer_backward_nodes(g, halo, t);
      convolve_then_begin_reverse(
          s, exchange, l.conv.view.dim_in, grad_x1_.data(), senders, [&](const ConvRows& part) {
            conv_backward(geom_, l.conv, cpu::first_receivers(g, senders), rows, x1, grad_y,
                          grad_x1_.data(), s.forces.data(),
                          want_virial ? s.atom_virials.data() : nullptr, s.remote(),
                          s.error_node.data(), st, part);
          });
      if (t == 0) break;
      if (exchange) finish_reverse_exchange(s, l.conv.view.dim_in, grad_x1_.data());
      s.profiler.mark("linear backward", st);
      linear_backward(l.linear_1, in_rows, grad_x1_.data(), grad_.data(), true, st);
    }
  }

  size_t node_bytes(int64_t n, bool want_grad) const override {
    const bool recompute_x1 = want_grad && n >= recompute_from_nodes();
    size_t pre_gate = 0, x1 = 0, x1_max = 0, y = 0, x = embedding_dim_, grad = 1, grad_p = 0,
           grad_x1 = 0;
    for (const Layer& l : layers_) {
      pre_gate += l.linear_2.dim_out;
      x1 += l.linear_1.dim_out;
      x1_max = std::max<size_t>(x1_max, l.linear_1.dim_out);
      y = std::max<size_t>({y, size_t(l.conv.view.dim_out), size_t(l.linear_2.dim_in)});
      x = std::max<size_t>(x, l.gate.dim_out);
      grad = std::max<size_t>(grad, l.self_connection.dim_in);
      grad_p = std::max<size_t>(grad_p, l.gate.dim_in);
      grad_x1 = std::max<size_t>(grad_x1, l.conv.view.dim_in);
    }
    size_t h[2] = {0, 0};
    for (size_t r = 0; r < readout_.size(); ++r) {
      h[r % 2] = std::max<size_t>(h[r % 2], readout_[r].dim_out);
      grad = std::max<size_t>({grad, size_t(readout_[r].dim_in), size_t(readout_[r].dim_out)});
    }
    size_t floats = pre_gate + (recompute_x1 ? x1_max : x1) + y + x + h[0] + h[1];
    if (want_grad) floats += 2 * grad + grad_p + grad_x1;  // grad_ and tmp_ swap
    return floats * sizeof(T);
  }

 private:
  Geometry<T> geom_;
  int embedding_dim_ = 0;
  DeviceArray<T> embedding_, scale_, shift_;
  std::vector<Layer> layers_;
  std::vector<Linear<T>> readout_;
  std::vector<DeviceArray<T>> x1_, pre_gate_;
  DeviceArray<T> x_, y_, h0_, h1_, grad_, tmp_, grad_p_, grad_x1_;
};

template <class T>
class MaceModel : public Model {
 public:
  struct Layer {
    bool residual = false, add_sc = false, nonlinear = false;
    bool skip_reads_conv = false;  // m = skip(y), skip composed with linear (cpu::MaceBlock)
    ElementLinear<T> skip;
    Linear<T> linear_up, linear, product_linear, readout_1, readout_2;
    Conv<T> conv;
    SymmetricContraction<T> product;
    Activation act = Activation::identity;
    T act_scale = T(1);
    bool density = false;  // divide linear(convolution) by 1 + rho (cpu::MaceBlock)
    EdgeDensity<T> edge_density;
    // mace's non-linear block (cpu::MaceBlock): `linear` is its linear_1
    bool nonlinear_block = false;
    Linear<T> linear_res, linear_2;
    Gate<T> gate;
    double alpha = 1.0, beta = 0.0;
    DeviceArray<double> density_params;
    ops::RadialMlpView density_layout;
    ops::RadialMlpView density_mlp() const {
      ops::RadialMlpView v = density_layout;
      v.params = density_params.data();
      return v;
    }
  };

  // m's row: the linear's (or skip's) output; with skip_reads_conv also dE/dy in the backward
  static size_t m_width(const Layer& l) {
    return static_cast<size_t>(l.skip_reads_conv ? std::max(l.skip.dim_out, l.linear.dim_in)
                                                 : l.linear.dim_out);
  }

  MaceModel(const ModelPlan& plan, const cpu::TypedPlan<T>& typed, bool radial_tables)
      : geom_(make_geometry<T>(typed)) {
    embedding_dim_ = typed.embedding_dim;
    embedding_.upload(typed.embedding);
    // the non-linear blocks' per-edge RadialMLP weights (conv.cuh): one array for the layers
    const auto edge_weights = std::make_shared<DeviceArray<T>>();
    for (const MaceLayer& l : plan.mace_layers) {
      const cpu::MaceBlock<T> h = cpu::make_mace_block<T>(l, radial_tables ? &plan : nullptr);
      Layer q;
      q.residual = h.residual;
      q.skip_reads_conv = h.skip_reads_conv;
      q.add_sc = h.add_sc;
      q.nonlinear = h.nonlinear;
      q.skip = make_element_linear<T>(h.skip);
      q.linear_up = make_linear<T>(h.linear_up);
      if (h.skip_reads_conv) {  // composed into skip: only its dimensions are read
        q.linear.dim_in = h.linear.dim_in;
        q.linear.dim_out = h.linear.dim_out;
      } else {
        q.linear = make_linear<T>(h.linear);
      }
      q.conv = make_conv<T>(h.conv, edge_weights);
      q.product = make_symmetric_contraction<T>(h.product);
      q.product_linear = make_linear<T>(h.product_linear);
      q.readout_1 = make_linear<T>(h.readout_1);
      if (q.nonlinear) q.readout_2 = make_linear<T>(h.readout_2);
      q.act = h.act;
      q.act_scale = h.act_scale;
      q.density = h.density;
      if (q.density) q.edge_density = make_edge_density<T>(h.edge_density);
      if (h.nonlinear_block) {
        if (h.density_layout.max_dim > kMaxDensityMlpDim)
          throw Error("non-linear block: density MLP wider than " +
                      std::to_string(kMaxDensityMlpDim) + " on the GPU");
        q.nonlinear_block = true;
        q.linear_res = make_linear<T>(h.linear_res);
        q.linear_2 = make_linear<T>(h.linear_2);
        q.gate = make_gate<T>(h.gate);
        q.alpha = h.alpha;
        q.beta = h.beta;
        q.density_params.upload(h.density_params);
        q.density_layout = h.density_layout;
      }
      if (!h.conv.pair_table.empty()) host_convs_.push_back(h.conv);  // tables built in prepare
      host_densities_.push_back(h.edge_density);  // pair tables built in prepare
      layers_.push_back(std::move(q));
    }
    if (std::count_if(layers_.begin(), layers_.end(), [](const Layer& l) { return l.density; }) >
        kMaxWalkDensityLayers)
      throw Error("CUDA backend: more than " + std::to_string(kMaxWalkDensityLayers) +
                  " density interaction blocks (one edge walk) are not supported");
    e0_.upload(plan.e0);
    scale_ = plan.mace_scale;
    shift_ = plan.mace_shift;
    pair_.upload(plan);
  }

  // Same sizes: uploaded in place (converted to T as make_typed_plan converts the plan's).
  void set_system_inputs(const std::vector<double>& embedding, const std::vector<double>& e0,
                         cudaStream_t stream) override {
    const std::vector<T> typed(embedding.begin(), embedding.end());
    embedding_.upload(typed.data(), typed.size(), stream);
    e0_.upload(e0.data(), e0.size(), stream);
    check(cudaStreamSynchronize(stream), "uploading the per-system inputs");
    ++launch_version_;
  }

  void prepare(const int32_t* species, int64_t n) override {
    for (size_t t = 0; t < host_convs_.size(); ++t)  // all layers have pair tables, or none
      if (cpu::ensure_pair_tables(host_convs_[t], n, species)) {
        upload_pair_tables(layers_[t].conv, host_convs_[t]);
        ++launch_version_;
      }
    for (size_t t = 0; t < host_densities_.size(); ++t)
      if (cpu::ensure_density_tables(host_densities_[t], n, species)) {
        upload_density_tables(layers_[t].edge_density, host_densities_[t]);
        ++launch_version_;
      }
  }

  void run(const GraphView& g, bool want_grad, bool want_virial, DeviceState& s) override {
    const int64_t n = g.num_nodes;
    const bool halo = s.halo.active();
    const auto N = static_cast<size_t>(n);
    const cudaStream_t st = s.stream();
    const int L = static_cast<int>(layers_.size());
    up_.resize(L);
    m_.resize(L);
    rho_.resize(L);
    grad_rho_.resize(L);
    mlin_.resize(L);
    nlz_.resize(L);
    hidden_.resize(L);
    embed_species(g, n, embedding_dim_, embedding_, x_, st);
    inter_.resize(N);
    inter_.zero(st);
    {  // rho of every density layer (on its rows) and ZBL's pair energies (an interaction
      // energy, scaled and shifted with the readouts'): one edge walk, positions only
      EdgeWalk<T> walk;
      for (int t = 0; t < L; ++t)
        if (layers_[t].density) {
          rho_[t].resize(N);
          walk.add_density(layers_[t].edge_density, cpu::layer_output_rows(g, halo, t),
                           rho_[t].data(), nullptr);
        }
      if (pair_.enabled()) {
        walk.pair = pair_.view();
        walk.pair_nodes = g.num_energy_nodes;
        walk.pair_energies = inter_.data();
      }
      if (!walk.empty()) {
        s.profiler.mark(walk.num_layers > 0 ? "edge density" : "pair repulsion", st);
        edge_walk_forward(geom_, walk, g, st);
      }
    }
    for (int t = 0; t < L; ++t) {
      const Layer& l = layers_[t];
      const int64_t rows = cpu::layer_output_rows(g, halo, t);
      const int64_t in_rows = cpu::layer_input_rows(g, halo, t);
      s.profiler.mark("linear forward", st);
      if (l.residual) {
        sc_.resize(N * l.skip.dim_out);
        element_linear_forward(l.skip, rows, g.species, x_.data(), sc_.data(), st);
      }
      up_[t].resize(N * l.linear_up.dim_out);
      // layer 0's input (the embedding) is known on every node; later ones come from owners
      // (halo) or from the previous layer's rows
      linear_forward(l.linear_up, in_rows, x_.data(), up_[t].data(), st);
      if (!halo) zero_rows(up_[t].data(), in_rows, n, static_cast<int>(l.linear_up.dim_out), st);
      y_.resize(N * l.conv.view.dim_out);
      exchange_then_convolve(
          s, halo && t > 0, l.conv.view.dim_in, up_[t].data(), rows, [&](const ConvRows& part) {
            conv_forward(geom_, l.conv, cpu::first_receivers(g, rows), up_[t].data(), y_.data(),
                         s.error_node.data(), st, part);
          });
      s.profiler.mark("linear forward", st);
      m_[t].resize(N * m_width(l));
      if (l.nonlinear_block) {  // z = linear_1(y) / (alpha + beta rho) + linear_res(u)
        s.profiler.mark("edge density", st);
        rho_[t].resize(N);
        edge_density_forward(geom_, l.density_mlp(), cpu::first_receivers(g, rows), rho_[t].data(),
                             st);
        s.profiler.mark("linear forward", st);
        mlin_[t].resize(N * l.linear.dim_out);
        linear_forward(l.linear, rows, y_.data(), mlin_[t].data(), st);
        nlz_[t].resize(N * l.linear_res.dim_out);
        linear_forward(l.linear_res, rows, up_[t].data(), nlz_[t].data(), st);
        nonlinear_scale_forward(rows, static_cast<int>(l.linear.dim_out), l.alpha, l.beta,
                                rho_[t].data(), mlin_[t].data(), nlz_[t].data(), st);
        a_.resize(N * l.gate.dim_out);
        gate_forward(l.gate, rows, nlz_[t].data(), a_.data(), st);
        m_[t].resize(N * l.linear_2.dim_out);
        linear_forward(l.linear_2, rows, a_.data(), m_[t].data(), st);
      } else {
        // m = P(y) = linear(y), or skip(linear(y)) without residual (one element-dependent
        // linear of y, skip_reads_conv); as mace, density blocks divide m by 1 + rho: m_ keeps
        // P(y) unscaled and the contraction scales its rows as it loads them (RowDensity),
        // forward and backward
        if (l.skip_reads_conv)
          element_linear_forward(l.skip, rows, g.species, y_.data(), m_[t].data(), st);
        else
          linear_forward(l.linear, rows, y_.data(), m_[t].data(), st);
      }
      p_.resize(N * l.product.dim_out);
      s.profiler.mark("symmetric contraction", st);
      RowDensity density;
      if (l.density) density.rho = rho_[t].data();
      symmetric_contraction_forward(l.product, rows, g.species, m_[t].data(), p_.data(), st,
                                    density);
      x_.resize(N * l.product_linear.dim_out);
      s.profiler.mark("linear forward", st);
      linear_forward(l.product_linear, rows, p_.data(), x_.data(), st);
      if (l.add_sc) add_inplace(rows * l.product_linear.dim_out, sc_.data(), x_.data(), st);
      r_.resize(N);
      if (l.nonlinear) {
        hidden_[t].resize(N * l.readout_1.dim_out);
        linear_forward(l.readout_1, rows, x_.data(), hidden_[t].data(), st);
        a_.resize(hidden_[t].size());
        activation_forward(l.act, l.act_scale, static_cast<int64_t>(a_.size()), hidden_[t].data(),
                           a_.data(), st);
        linear_forward(l.readout_2, rows, a_.data(), r_.data(), st);
      } else {
        linear_forward(l.readout_1, rows, x_.data(), r_.data(), st);
      }
      accumulate_kernel<T><<<grid(n), kThreads, 0, st>>>(rows, r_.data(), inter_.data());
      check_launch("accumulate_kernel");
    }
    mace_energy_kernel<<<grid(n), kThreads, 0, st>>>(n, g.num_energy_nodes, g.species, e0_.data(),
                                                     scale_, shift_, inter_.data(),
                                                     s.energies.data());
    check_launch("mace_energy_kernel");
    if (!want_grad) return;

    seed_.resize(N);
    seed_kernel<T><<<grid(n), kThreads, 0, st>>>(n, g.num_energy_nodes, g.species, nullptr,
                                                 static_cast<T>(scale_), seed_.data());
    check_launch("seed_kernel");
    // The backward's node adjoints reuse the forward's buffers that it no longer reads:
    // dE/dx goes to x's, dE/dp to p's, dE/dm to m's own (the contraction's adjoint runs in
    // place) and dE/dy to y's.
    DeviceArray<T>& gx = x_;
    gx.resize(N * layers_.back().product_linear.dim_out);
    gx.zero(st);
    for (int t = L - 1; t >= 0; --t) {
      const Layer& l = layers_[t];
      const int64_t rows = cpu::layer_output_rows(g, halo, t);
      const int64_t in_rows = cpu::layer_input_rows(g, halo, t);
      s.profiler.mark("readout, energy", st);
      if (l.nonlinear) {
        gh_.resize(N * l.readout_2.dim_in);
        linear_backward(l.readout_2, rows, seed_.data(), gh_.data(), false, st);
        activation_backward(l.act, l.act_scale, static_cast<int64_t>(gh_.size()), hidden_[t].data(),
                            gh_.data(), st);
        linear_backward(l.readout_1, rows, gh_.data(), gx.data(), true, st);
      } else {
        linear_backward(l.readout_1, rows, seed_.data(), gx.data(), true, st);
      }
      DeviceArray<T>& gp = p_;
      gp.resize(N * l.product_linear.dim_in);
      linear_backward(l.product_linear, rows, gx.data(), gp.data(), false, st);
      DeviceArray<T>& gm = m_[t];
      s.profiler.mark("symmetric contraction", st);
      RowDensity density;  // density blocks: m = P(Z) / d (P: skip or 1), m_ holds P(Z): the
      // contraction's adjoint writes dE/dP(Z) = dE/dm / d and dE/drho = -dE/dm . m / d
      if (l.density) {
        grad_rho_[t].resize(N);
        rho_partials_.resize(N * static_cast<size_t>(sc_density_partials(l.product)));
        density = {rho_[t].data(), grad_rho_[t].data(), n, rho_partials_.data()};
      }
      // with skip_reads_conv, dE/dP(y) goes to y's (dead) buffer and dE/dy = skip^T of it to
      // m's (sized for it, m_width)
      if (l.skip_reads_conv) y_.resize(std::max(y_.size(), N * l.skip.dim_out));
      T* g_product_in = l.skip_reads_conv ? y_.data() : gm.data();
      symmetric_contraction_backward(l.product, rows, g.species, m_[t].data(), gp.data(),
                                     g_product_in, st, density);
      s.profiler.mark("linear backward", st);
      // dE/dy: m's buffer (skip_reads_conv), else y's (dead after the forward's linear; the
      // largest node tensor)
      const T* g_linear_out = gm.data();
      if (l.nonlinear_block) {  // dE/dz = gate^T linear_2^T dE/dm; dE/da = dE/dz / d; dE/drho
        gh_.resize(N * l.linear_2.dim_in);
        linear_backward(l.linear_2, rows, gm.data(), gh_.data(), false, st);
        gz_.resize(N * l.gate.dim_in);
        gate_backward(l.gate, rows, nlz_[t].data(), gh_.data(), gz_.data(), st);
        grad_rho_[t].resize(N);
        ga_.resize(N * l.linear.dim_out);
        nonlinear_scale_backward(rows, n, static_cast<int>(l.linear.dim_out), l.alpha, l.beta,
                                 mlin_[t].data(), gz_.data(), rho_[t].data(), ga_.data(),
                                 grad_rho_[t].data(), st);
        g_linear_out = ga_.data();
      }
      T* gy = gm.data();
      if (l.skip_reads_conv) {
        element_linear_backward(l.skip, rows, g.species, y_.data(), gy, false, st);
      } else {
        y_.resize(N * l.linear.dim_in);
        gy = y_.data();
        linear_backward(l.linear, rows, g_linear_out, gy, false, st);
      }
      zero_rows(gy, rows, n, static_cast<int>(l.linear.dim_in), st);  // not our energies
      gup_.resize(N * l.conv.view.dim_in);
      const GraphView backward_graph =
          cpu::first_receivers(g, cpu::layer_backward_nodes(g, halo, t));
      const bool exchange = s.halo.active() && t > 0;
      convolve_then_begin_reverse(s, exchange, l.conv.view.dim_in, gup_.data(),
                                  backward_graph.num_nodes, [&](const ConvRows& part) {
                                    conv_backward(geom_, l.conv, backward_graph, rows,
                                                  up_[t].data(), gy, gup_.data(), s.forces.data(),
                                                  want_virial ? s.atom_virials.data() : nullptr,
                                                  s.remote(), s.error_node.data(), st, part);
                                  });
      if (l.nonlinear_block) {
        s.profiler.mark("edge density", st);
        edge_density_backward(geom_, l.density_mlp(), backward_graph, grad_rho_[t].data(),
                              s.forces.data(), want_virial ? s.atom_virials.data() : nullptr, st);
        s.profiler.mark("linear backward", st);
        linear_backward(l.linear_res, rows, gz_.data(), gup_.data(), true, st);
      }
      s.profiler.mark("linear backward", st);
      if (t == 0) break;
      if (exchange) finish_reverse_exchange(s, l.conv.view.dim_in, gup_.data());
      s.profiler.mark("linear backward", st);
      gprev_.resize(N * l.linear_up.dim_in);
      linear_backward(l.linear_up, in_rows, gup_.data(), gprev_.data(), false, st);
      if (l.add_sc)
        element_linear_backward(l.skip, rows, g.species, gx.data(), gprev_.data(), true, st);
      std::swap(gx, gprev_);
    }
    // The forces of every density layer's dE/drho (on the nodes its convolution's backward
    // visits) and of ZBL's pair energies (E = scale x their sum): one edge walk
    EdgeWalk<T> walk;
    for (int t = 0; t < L; ++t)
      if (layers_[t].density)
        walk.add_density(layers_[t].edge_density, cpu::layer_backward_nodes(g, halo, t), nullptr,
                         grad_rho_[t].data());
    if (pair_.enabled()) {
      walk.pair = pair_.view();
      walk.pair_nodes = n;
      walk.pair_weight = scale_;
    }
    if (!walk.empty()) {
      s.profiler.mark(walk.num_layers > 0 ? "edge density" : "pair repulsion", st);
      edge_walk_backward(geom_, walk, g, s.forces.data(),
                         want_virial ? s.atom_virials.data() : nullptr, st);
    }
  }

  size_t node_bytes(int64_t /*n*/, bool want_grad) const override {
    size_t up = 0, m = 0, hidden = 0, x = embedding_dim_, sc = 0, y = 0, p = 0, a = 0, gh = 0,
           gup = 0, gprev = 0, doubles = 0, partials = 0;
    for (const Layer& l : layers_) {
      up += l.linear_up.dim_out;
      m += m_width(l);
      x = std::max<size_t>(x, l.product_linear.dim_out);
      if (l.residual) sc = std::max<size_t>(sc, l.skip.dim_out);
      y = std::max<size_t>({y, size_t(l.conv.view.dim_out), size_t(l.skip.dim_out),
                            size_t(l.skip.dim_in), size_t(l.linear.dim_in)});
      p = std::max<size_t>({p, size_t(l.product.dim_out), size_t(l.product_linear.dim_in)});
      if (l.nonlinear) {
        hidden += l.readout_1.dim_out;
        a = std::max<size_t>(a, l.readout_1.dim_out);
        gh = std::max<size_t>(gh, l.readout_2.dim_in);
      }
      gup = std::max<size_t>(gup, l.conv.view.dim_in);
      gprev = std::max<size_t>(gprev, l.linear_up.dim_in);
      if (l.density) {  // rho_; the contraction's backward's partials of dE/drho
        doubles += 1;
        partials = std::max<size_t>(partials, sc_density_partials(l.product));
      }
      if (l.nonlinear_block) {  // mlin_, nlz_, rho_; gate output in a_, gz_ and ga_
        m += l.linear.dim_out + l.linear_res.dim_out;
        a = std::max<size_t>(a, l.gate.dim_out);
        gh = std::max<size_t>(gh, l.linear_2.dim_in);
        gup += l.gate.dim_in + l.linear.dim_out;
        doubles += 1;
      }
    }
    if (want_grad) doubles = 2 * doubles + partials;             // + grad_rho_, rho_partials_
    size_t floats = up + m + hidden + x + sc + y + p + 1 + a;    // + r_
    if (want_grad) floats += 1 + gh + gup + gprev;               // + seed_
    return floats * sizeof(T) + (1 + doubles) * sizeof(double);  // + inter_
  }

  size_t edge_bytes() const override {
    size_t per_edge = 0;  // the layers share one array (conv.cuh)
    for (const Layer& l : layers_)
      if (l.conv.radial_mlp.layers > 0)
        per_edge = std::max<size_t>(per_edge, 4 * sizeof(T) * l.conv.view.weight_numel);
    return per_edge;
  }

 private:
  Geometry<T> geom_;
  int embedding_dim_ = 0;
  DeviceArray<T> embedding_;
  DeviceArray<double> e0_, inter_;
  double scale_ = 1.0, shift_ = 0.0;
  PairRepulsion pair_;
  std::vector<Layer> layers_;
  std::vector<cpu::Conv<T>> host_convs_;  // per layer, with pair tables (cpu::Conv)
  // per layer, with the density's pair tables (cpu::EdgeDensity)
  std::vector<cpu::EdgeDensity<T>> host_densities_;
  std::vector<DeviceArray<T>> up_, m_, hidden_;
  std::vector<DeviceArray<T>> mlin_;      // non-linear blocks: linear_1(y)
  std::vector<DeviceArray<double>> rho_;  // density layers: rho per node
  std::vector<DeviceArray<double>> grad_rho_;
  DeviceArray<double> rho_partials_;  // density layers' backward: RowDensity::partials
  std::vector<DeviceArray<T>> nlz_;   // non-linear blocks: the gate's input z
  DeviceArray<T> gz_, ga_;            // non-linear blocks: dE/dz, dE/d linear_1(y)
  DeviceArray<T> x_, sc_, y_, p_, r_, a_, seed_, gh_, gup_, gprev_;
};

// A step's launches (run's zeroing, the model, the force and virial sums, the copies of the
// results) replayed as one CUDA graph when a call makes exactly the launches of the call before
// (issue 21: at 864 atoms a step is about 60 kernels, and the GPU idles about 0.13 ms between
// them, benchmarks/results/session24_h100/call2/). The key is everything those launches take
// from the host: sizes, device and staging addresses, flags, the count of device allocations
// and the model's launch_version(). A key seen in two calls in a row is captured (the first of
// them made the allocations), and the graph is replayed while the key stays; the kernels read
// positions, species, neighbors and tables from device memory, so a replay computes the step
// of the data uploaded before it, bitwise as the direct launches. What the capture refuses
// runs directly from then on.
class StepGraph {
 public:
  StepGraph() = default;
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;
  ~StepGraph() { clear(); }

  // enqueue() on `stream`, directly or as the graph of an equal key; an empty key: directly.
  template <class Enqueue>
  void run(const std::vector<uint64_t>& key, cudaStream_t stream, Enqueue&& enqueue) {
    if (key.empty() || refused_) {
      last_key_.clear();
      enqueue();
      return;
    }
    if (exec_ && key == graph_key_) {
      check(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch");
      ++replays_;
      return;
    }
    if (key != last_key_) {
      last_key_ = key;
      enqueue();
      return;
    }
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
    cudaGraph_t graph = nullptr;
    bool captured = true;
    try {
      enqueue();
    } catch (...) {
      captured = false;
    }
    cudaError_t status = cudaStreamEndCapture(stream, &graph);
    if (captured && status == cudaSuccess) {
      // the launches of the graph held, with other arguments: its parameters updated in place
      cudaGraphExecUpdateResultInfo info{};
      if (!exec_ || cudaGraphExecUpdate(exec_, graph, &info) != cudaSuccess) {
        cudaGetLastError();
        clear();
        status = cudaGraphInstantiate(&exec_, graph, 0);
      }
    }
    if (graph) cudaGraphDestroy(graph);
    if (!captured || status != cudaSuccess) {
      cudaGetLastError();  // capture errors are not sticky
      clear();
      refused_ = true;
      enqueue();  // an error of the step itself is thrown here
      return;
    }
    graph_key_ = key;
    check(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch");
  }
  // Steps run as a replay of a graph captured in an earlier step.
  int64_t replays() const { return replays_; }

 private:
  void clear() {
    if (exec_) cudaGraphExecDestroy(exec_);
    exec_ = nullptr;
    graph_key_.clear();
  }
  cudaGraphExec_t exec_ = nullptr;
  std::vector<uint64_t> graph_key_, last_key_;
  bool refused_ = false;
  int64_t replays_ = 0;
};

class BackendImpl : public Backend {
 public:
  BackendImpl(const ModelPlan& plan, Precision precision, int device, bool radial_tables)
      : cutoff_(plan.cutoff),
        halo_widths_(halo_widths(plan)),
        float32_(precision == Precision::float32),
        device_(device),
        state_(device) {
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties");
    name_ = prop.name;
    if (plan.family == "mace") {
      if (precision == Precision::float64)
        model_ = std::make_unique<MaceModel<double>>(plan, cpu::make_typed_plan<double>(plan),
                                                     radial_tables);
      else
        model_ = std::make_unique<MaceModel<float>>(plan, cpu::make_typed_plan<float>(plan),
                                                    radial_tables);
    } else {
      if (precision == Precision::float64)
        model_ = make_sevennet<double>(plan, radial_tables);
      else
        model_ = make_sevennet<float>(plan, radial_tables);
    }
    state_.error_node.resize(2);
    state_.virial.resize(9);
    bytes_after_load_ = DeviceBytes::in_use().load();
  }
  ~BackendImpl() override { cudaSetDevice(device_); }  // the arrays are freed on their GPU

  void compute(const GraphView& h, ComputeOutput& out, HaloExchange* halo) override {
    check(cudaSetDevice(device_), "cudaSetDevice");
    DeviceState& s = state_;
    const cudaStream_t st = s.stream();
    const int64_t n = h.num_nodes;
    const int64_t edges = n > 0 ? h.row_offsets[n] : 0;
    s.row_order = nullptr;  // the caller's order (LAMMPS sorts its atoms in space)
    s.positions.upload(h.positions, 3 * n, st);
    s.species.upload(h.species, n, st);
    // the edges of the caller's previous graph are still here: Engine::compute, this
    // method's only caller, passes GraphView::same_edges_as_last on only after a
    // compute(GraphView) with the same counts and no other kind of call since
    const bool same_edges = h.same_edges_as_last;
    if (!same_edges) {
      s.row_offsets.upload(h.row_offsets, n + 1, st);
      s.neighbors.upload(h.neighbors, edges, st);
    }
    GraphView g;
    g.num_nodes = n;
    g.num_energy_nodes = h.num_energy_nodes;
    g.layer_rows = h.layer_rows;
    g.positions = s.positions.data();
    g.species = s.species.data();
    g.row_offsets = s.row_offsets.data();
    g.neighbors = s.neighbors.data();
    g.num_edges = edges;
    if (h.shift_index) {
      if (!same_edges) {
        int32_t max_shift = -1;
        for (int64_t e = 0; e < edges; ++e) max_shift = std::max(max_shift, h.shift_index[e]);
        s.shift_index.upload(h.shift_index, edges, st);
        s.shifts.upload(h.shifts, 3 * static_cast<size_t>(max_shift + 1), st);
      }
      g.shift_index = s.shift_index.data();
      g.shifts = s.shifts.data();
    }
    s.halo.bind(halo, n, h.num_energy_nodes, st);
    s.halo.set_graph(g, same_edges);
    model_->prepare(h.species, n);
    run(g, out);
  }

  void compute_system(const SystemView& sys, double skin, double min_distance, ComputeOutput& out,
                      int64_t num_energy_nodes, bool rebuild, const int64_t* layer_rows) override {
    check(cudaSetDevice(device_), "cudaSetDevice");
    DeviceState& s = state_;
    const cudaStream_t st = s.stream();
    const int64_t n = sys.num_atoms;
    if (!neighbors_ || neighbor_skin_ != skin) {
      neighbors_ = std::make_unique<DeviceNeighborList>(cutoff_, skin);
      neighbor_skin_ = skin;
    }
    if (rebuild) neighbors_->invalidate();
    s.positions.upload(sys.positions, 3 * n, st);
    s.species.upload(sys.species, n, st);
    s.profiler.mark("neighbor list", st);
    neighbors_->update(n, s.positions.data(), sys.cell, sys.pbc, min_distance, st, sys.positions);
    last_list_ = neighbors_.get();
    GraphView g = neighbors_->view(s.positions.data(), s.species.data());
    g.num_nodes = n;
    g.num_energy_nodes = num_energy_nodes;
    g.layer_rows = layer_rows;
    s.halo.bind(nullptr, n, n, st);
    model_->prepare(sys.species, n);
    s.row_order = neighbors_->bin_order();
    s.row_order_size = n;
    // a minimum-distance check left in flight by update() is reported before the model's own
    run(g, out, [&] { neighbors_->finish_checks(s.positions.data(), st); });
    largest_call_bytes_ = std::max(
        largest_call_bytes_,
        n * call_bytes_per_atom(
                static_cast<double>(neighbors_->num_edges()) / std::max<int64_t>(n, 1),
                out.forces || out.virial || out.atom_virials, out.atom_virials || out.virial));
  }

  void compute_nodes(const NodesView& nodes, double skin, double min_distance, bool rebuild,
                     ComputeOutput& out, HaloExchange* halo) override {
    check(cudaSetDevice(device_), "cudaSetDevice");
    DeviceState& s = state_;
    const cudaStream_t st = s.stream();
    const int64_t n = nodes.num_nodes;
    if (!node_neighbors_ || node_neighbors_->skin() != skin)
      node_neighbors_ = std::make_unique<DeviceNeighborList>(cutoff_, skin);
    node_neighbors_->set_num_owned(nodes.num_owned);
    if (rebuild) node_neighbors_->invalidate();
    s.positions.upload(nodes.positions, 3 * n, st);
    s.species.upload(nodes.species, n, st);
    s.profiler.mark("neighbor list", st);
    const bool open[3] = {false, false, false};
    const bool rebuilt = node_neighbors_->update(n, s.positions.data(), nullptr, open, min_distance,
                                                 st, nodes.positions);
    last_list_ = node_neighbors_.get();
    GraphView g = node_neighbors_->view(s.positions.data(), s.species.data());
    g.num_energy_nodes = nodes.num_owned;
    g.shift_index = nullptr;  // open: every shift is zero
    g.shifts = nullptr;
    s.halo.bind(halo, n, nodes.num_owned, st);
    s.halo.set_graph(g, !rebuilt);
    model_->prepare(nodes.species, n);
    s.row_order = nullptr;  // owned rows and ghosts: the exchange's own row lists
    run(g, out, [&] { node_neighbors_->finish_checks(s.positions.data(), st); });
  }

  void node_graph(std::vector<int64_t>& row_offsets,
                  std::vector<int32_t>& neighbors) const override {
    if (!node_neighbors_) throw Error("node_graph: no compute(NodesView) yet");
    check(cudaSetDevice(device_), "cudaSetDevice");
    const int64_t n = node_neighbors_->num_atoms();
    const int64_t edges = node_neighbors_->num_edges();
    row_offsets.resize(n + 1);
    neighbors.resize(edges);
    const cudaStream_t st = state_.stream();
    check(cudaMemcpyAsync(row_offsets.data(), node_neighbors_->row_offsets(),
                          (n + 1) * sizeof(int64_t), cudaMemcpyDeviceToHost, st),
          "node graph download");
    if (edges > 0)
      check(cudaMemcpyAsync(neighbors.data(), node_neighbors_->neighbors(), edges * sizeof(int32_t),
                            cudaMemcpyDeviceToHost, st),
            "node graph download");
    check(cudaStreamSynchronize(st), "node graph download");
  }

  int64_t max_atoms(double edges_per_atom, bool want_grad, bool want_virial) const override {
    check(cudaSetDevice(device_), "cudaSetDevice");
    size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    // what this backend's per-call arrays hold now is theirs to reuse
    const size_t held = DeviceBytes::in_use().load();
    const double reusable = std::min<double>(
        largest_call_bytes_, held > bytes_after_load_ ? double(held - bytes_after_load_) : 0.0);
    const double budget = kUsableFraction * (static_cast<double>(free) + reusable) - kReserve;
    if (budget <= 0.0) return 1;
    return std::max<int64_t>(
        1,
        static_cast<int64_t>(budget / call_bytes_per_atom(edges_per_atom, want_grad, want_virial)));
  }

  int64_t num_neighbor_builds() const override { return last_list_ ? last_list_->num_builds() : 0; }
  int64_t num_step_replays() const override { return step_graph_.replays(); }
  int64_t num_neighbor_edges() const override { return last_list_ ? last_list_->num_edges() : 0; }
  std::string device_name() const override {
    return name_ + " (GPU " + std::to_string(device_) + ")";
  }
  void set_system_inputs(const std::vector<double>& embedding,
                         const std::vector<double>& e0) override {
    check(cudaSetDevice(device_), "cudaSetDevice");
    model_->set_system_inputs(embedding, e0, state_.stream());
  }

 private:
  template <class T>
  static std::unique_ptr<Model> make_sevennet(const ModelPlan& plan, bool radial_tables) {
    return std::make_unique<SevennetModel<T>>(cpu::make_typed_plan<T>(plan, radial_tables), plan);
  }

  // after_sync: called once the step's results are on the host, before its errors are read.
  void run(const GraphView& g, ComputeOutput& out, const std::function<void()>& after_sync = {}) {
    DeviceState& s = state_;
    const cudaStream_t st = s.stream();
    const int64_t n = g.num_nodes;
    const bool want_grad = out.forces || out.virial || out.atom_virials;
    const bool want_virial = out.virial || out.atom_virials;
    out.energy = 0.0;
    if (out.virial)
      for (int q = 0; q < 9; ++q) out.virial[q] = 0.0;
    if (n == 0) {
      if (s.halo.active()) {
        empty_exchanges(want_grad);
        check(cudaStreamSynchronize(st), "halo exchange");
        s.halo.collect();
      }
      return;
    }
    s.energies.resize(n);
    if (want_grad) {
      s.forces.resize(3 * n);
      s.remote_forces.resize(2 * 3 * n);
    }
    if (want_virial) s.atom_virials.resize(9 * n);
    s.split_virials = out.atom_virials != nullptr;
    if (s.split_virials) s.remote_virials.resize(2 * 9 * n);
    // The results come back through page-locked memory (asynchronous copies, one wait):
    // energies [n], the two error words, then forces [3n], per-atom virials [9n] and the
    // virial [9] where asked for.
    const size_t N = static_cast<size_t>(n);
    double* const staged = results_.reserve(N + 2 + (out.forces ? 3 * N : 0) +
                                            (out.atom_virials ? 9 * N : 0) + (out.virial ? 9 : 0));
    double* at = staged + N + 2;
    const auto stage = [&](bool wanted, size_t count) {
      if (!wanted) return static_cast<double*>(nullptr);
      at += count;
      return at - count;
    };
    double* const forces = stage(out.forces, 3 * N);
    double* const atom_virials = stage(out.atom_virials, 9 * N);
    double* const virial = stage(out.virial, 9);
    s.profiler.begin_call();
    auto enqueue = [&] {
      s.error_node.zero(st);
      if (want_grad) {
        s.forces.zero(st);
        s.remote_forces.zero(st);
      }
      if (want_virial) s.atom_virials.zero(st);
      if (s.split_virials) s.remote_virials.zero(st);
      model_->run(g, want_grad, want_virial, s);
      s.profiler.mark("virial, copies", st);
      if (want_grad)
        add_remote_forces(n, s.remote(), s.forces.data(),
                          want_virial ? s.atom_virials.data() : nullptr, st);
      if (out.virial) {
        virial_sum_kernel<<<1, kThreads, 0, st>>>(n, s.atom_virials.data(), s.virial.data());
        check_launch("virial_sum_kernel");
      }
      s.energies.download(staged, N, st);
      check(cudaMemcpyAsync(staged + N, s.error_node.data(), 2 * sizeof(int64_t),
                            cudaMemcpyDeviceToHost, st),
            "download");
      if (forces) s.forces.download(forces, 3 * N, st);
      if (atom_virials) s.atom_virials.download(atom_virials, 9 * N, st);
      if (virial) s.virial.download(virial, 9, st);
    };
    std::vector<uint64_t> key;
    if (!s.halo.active() && !s.profiler.enabled() && !g.layer_rows) {
      const auto address = [](const void* p) { return static_cast<uint64_t>(uintptr_t(p)); };
      key = {static_cast<uint64_t>(n),
             static_cast<uint64_t>(g.num_energy_nodes),
             static_cast<uint64_t>(g.num_edges),
             address(g.positions),
             address(g.species),
             address(g.row_offsets),
             address(g.neighbors),
             address(g.shift_index),
             address(g.shifts),
             address(s.row_order),
             static_cast<uint64_t>(s.row_order_size),
             (want_grad ? 1u : 0u) | (want_virial ? 2u : 0u) | (s.split_virials ? 4u : 0u) |
                 (out.forces ? 8u : 0u) | (out.atom_virials ? 16u : 0u) | (out.virial ? 32u : 0u),
             address(staged),
             static_cast<uint64_t>(recompute_from_nodes()),
             DeviceBytes::changes().load(),
             model_->launch_version()};
    }
    step_graph_.run(key, st, enqueue);
    s.profiler.end(st);
    check(cudaStreamSynchronize(st), "the GPU computation");
    s.profiler.collect();
    s.halo.collect();
    int64_t errors[2] = {0, 0};
    std::memcpy(errors, staged + N, sizeof(errors));
    if (forces) std::copy(forces, forces + 3 * N, out.forces);
    if (atom_virials) std::copy(atom_virials, atom_virials + 9 * N, out.atom_virials);
    if (virial) std::copy(virial, virial + 9, out.virial);
    if (after_sync) after_sync();
    if (errors[0] > 0) {
      throw Error("two atoms are at the same position (atom " + std::to_string(errors[0] - 1) +
                  " and a neighbor at distance 0)");
    }
    if (errors[1] > 0) {
      throw Error("a force or per-atom virial contribution on atom " +
                  std::to_string(errors[1] - 1) +
                  " is not finite or exceeds 5e8 eV/A (eV): the model is far outside its "
                  "range here");
    }
    double energy = 0.0;
    for (int64_t i = 0; i < n; ++i) energy += staged[i];
    out.energy = energy;
    if (out.atom_energies) std::copy(staged, staged + N, out.atom_energies);
  }

  // A rank with an empty graph still takes part in every (collective) exchange, with rows
  // in the model's precision as the other ranks'.
  void empty_exchanges(bool want_grad) {
    if (float32_)
      empty_exchanges<float>(want_grad);
    else
      empty_exchanges<double>(want_grad);
  }
  template <class T>
  void empty_exchanges(bool want_grad) {
    for (int width : halo_widths_) state_.halo.forward<T>(width, nullptr);
    if (!want_grad) return;
    for (auto w = halo_widths_.rbegin(); w != halo_widths_.rend(); ++w)
      state_.halo.reverse<T>(*w, nullptr);
  }

  // Device bytes per atom of one compute_system call: node tensors, per-atom state
  // (positions, species, energies, forces, per-atom virials) and the neighbor list (about
  // 150 bytes per atom with its sort buffers, 8 per edge plus growth slack).
  double call_bytes_per_atom(double edges_per_atom, bool want_grad, bool want_virial) const {
    const double node =
        static_cast<double>(model_->node_bytes(std::numeric_limits<int64_t>::max(), want_grad));
    // the forces and virials in double and as fixed-point receiver sums (2 words each)
    const double state =
        3 * 8 + 4 + 8 + (want_grad ? 3 * 3 * 8 : 0) + (want_virial ? 3 * 9 * 8 : 0);
    const double edge = kNeighborBytesPerEdge + static_cast<double>(model_->edge_bytes());
    return node + state + kNeighborBytesPerAtom + edge * edges_per_atom;
  }

  static constexpr double kUsableFraction = 0.9;
  static constexpr double kReserve = 512.0 * 1024 * 1024;  // CUDA runtime and launch workspace
  static constexpr double kNeighborBytesPerAtom = 160.0;
  static constexpr double kNeighborBytesPerEdge = 9.0;

  size_t bytes_after_load_ = 0;      // e3fuse device bytes once the model was uploaded
  double largest_call_bytes_ = 0.0;  // estimated bytes of the largest call so far
  double cutoff_;
  std::vector<int> halo_widths_;  // of the exchanges an empty graph still takes part in
  bool float32_;                  // the model's precision (the halo rows' type)
  int device_ = 0;
  std::string name_;
  std::unique_ptr<Model> model_;
  DeviceState state_;
  std::unique_ptr<DeviceNeighborList> neighbors_;
  double neighbor_skin_ = -1.0;
  std::unique_ptr<DeviceNeighborList> node_neighbors_;  // compute_nodes
  const DeviceNeighborList* last_list_ = nullptr;       // of the last compute_system or _nodes
  PinnedBuffer results_;  // run()'s results on their way to the caller
  StepGraph step_graph_;  // run()'s launches, replayed while a step repeats the last one's
};

}  // namespace

std::unique_ptr<Backend> make_backend(const ModelPlan& plan, Precision precision, int gpu,
                                      bool radial_tables) {
  const int count = device_count();
  if (count == 0) throw Error("no CUDA device is available to this process");
  if (gpu >= count)
    throw Error("GPU " + std::to_string(gpu) + " requested, but this process sees " +
                std::to_string(count) + " GPU(s) (CUDA_VISIBLE_DEVICES)");
  if (gpu < 0) check(cudaGetDevice(&gpu), "cudaGetDevice");
  // apply_cutoff=False multiplies the radial MLP's output by the envelope: the tables include
  // it, and so does the non-linear block's exact RadialMLP (conv.cuh), but the GPU's per-edge
  // MLP kernels of the other blocks do not (refused by name rather than computed wrongly).
  bool plain_mlp = plan.mace_layers.empty();
  for (const MaceLayer& l : plan.mace_layers) plain_mlp = plain_mlp || !l.nonlinear_block;
  if (!plan.radial.apply_cutoff && !radial_tables && plain_mlp)
    throw Error(
        "the CUDA engine supports MACE apply_cutoff=False with radial tables only (float32, "
        "radial 'auto' or 'table'); use device 'cpu' for float64 or radial 'mlp'");
  return std::make_unique<BackendImpl>(plan, precision, gpu, radial_tables);
}

}  // namespace e3fuse::cuda
