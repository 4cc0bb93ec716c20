// engine.cpp: runs a model's plan forward (energies) and backward (forces,
// virial) on a graph, and owns the node-level buffers between calls.
//
// SevenNet layer t (sevenn's NequIP-style interaction block):
//   sc = SelfConnection(x); x1 = Linear1(x); y = Conv(x1); p = Linear2(y) + sc; x = Gate(p)
// (SelfConnection: a linear layer, or one per species for self_connection_type 'nequip')
// atomic energy e_i = shift[s_i] + scale[s_i] * Readout(x_i).
// The backward pass keeps x1 and p of every layer (node-level) and applies the
// transposes in reverse order; Conv's adjoint also yields the forces.
#include "e3fuse/engine.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "cpu/mace.h"
#ifdef E3FUSE_WITH_CUDA
#include "cuda/backend.h"
#endif
#include "cpu/ops.h"
#include "cpu/pair_repulsion.h"
#include "cpu/typed_plan.h"
#include "e3fuse/error.h"
#include "e3fuse/neighbors.h"
#include "model/plan.h"
#include "model/system_inputs.h"
#include "neighbors/lattice.h"
#include "ops/activation.h"
#include "regions.h"

#ifndef E3FUSE_VERSION
#define E3FUSE_VERSION "0.0.0"
#endif

namespace e3fuse {

const char* version() { return E3FUSE_VERSION; }

bool cuda_available() {
#ifdef E3FUSE_WITH_CUDA
  return cuda::device_available();
#else
  return false;
#endif
}

int parse_gpu_index(const std::string& name) {
  for (const char* prefix : {"cuda:", "gpu:"}) {
    const std::string p = prefix;
    if (name.compare(0, p.size(), p) == 0) {
      const std::string digits = name.substr(p.size());
      if (digits.empty() || digits.size() > 4 ||
          digits.find_first_not_of("0123456789") != std::string::npos)
        throw Error("unknown device '" + name + "' (expected 'cpu', 'cuda' or 'cuda:N')");
      return std::stoi(digits);
    }
  }
  return -1;
}

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::cpu;
  if (name == "cuda" || name == "gpu") return Device::cuda;
  if (parse_gpu_index(name) >= 0) return Device::cuda;
  throw Error("unknown device '" + name + "' (expected 'cpu', 'cuda' or 'cuda:N')");
}

int cuda_device_count() {
#ifdef E3FUSE_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

Precision parse_precision(const std::string& name) {
  if (name == "float64" || name == "double" || name == "fp64") return Precision::float64;
  if (name == "float32" || name == "float" || name == "fp32") return Precision::float32;
  throw Error("unknown precision '" + name + "' (expected 'float32' or 'float64')");
}

Radial parse_radial(const std::string& name) {
  if (name == "auto") return Radial::automatic;
  if (name == "mlp") return Radial::mlp;
  if (name == "table") return Radial::table;
  throw Error("unknown radial evaluation '" + name + "' (expected 'auto', 'mlp' or 'table')");
}

const char* to_string(Radial r) {
  return r == Radial::table ? "table" : r == Radial::mlp ? "mlp" : "auto";
}

const char* to_string(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }
const char* to_string(Precision p) { return p == Precision::float64 ? "float64" : "float32"; }

namespace {

// Copies the node-level forces and per-atom virials into the caller's buffers
// and sums the global virial (in double, in node order: deterministic).
void write_gradients(const std::vector<double>& forces, const std::vector<double>& atom_virials,
                     ComputeOutput& out) {
  if (out.forces) std::memcpy(out.forces, forces.data(), forces.size() * sizeof(double));
  if (out.atom_virials)
    std::memcpy(out.atom_virials, atom_virials.data(), atom_virials.size() * sizeof(double));
  if (out.virial) {
    for (int q = 0; q < 9; ++q) out.virial[q] = 0.0;
    for (size_t i = 0; i < atom_virials.size(); i += 9)
      for (int q = 0; q < 9; ++q) out.virial[q] += atom_virials[i + q];
  }
}

// x[i] = embedding row of node i's species (the one-hot linear of both families).
template <class T>
void embed_species(const cpu::TypedPlan<T>& plan, const GraphView& g, std::vector<T>& x) {
  const size_t dim = static_cast<size_t>(plan.embedding_dim);
  x.resize(static_cast<size_t>(g.num_nodes) * dim);
  for (int64_t i = 0; i < g.num_nodes; ++i) {
    const T* row = plan.embedding.data() + static_cast<size_t>(g.species[i]) * dim;
    std::copy(row, row + dim, x.begin() + i * dim);
  }
}

// Entries k of an index array (self images' sources, border nodes: rows that may repeat) grouped
// by the row they add into, k ascending within a row, so that rows are summed in parallel and
// each in entry order: the same sums, bit for bit, as one loop over k.
class RowsByTarget {
 public:
  // Regroups only when the targets differ from the last call's.
  void group(const int32_t* targets, int64_t n) {
    if (targets_.size() == static_cast<size_t>(n) &&
        std::equal(targets, targets + n, targets_.begin()))
      return;
    targets_.assign(targets, targets + n);
    entries_.resize(static_cast<size_t>(n));
    std::iota(entries_.begin(), entries_.end(), int64_t{0});
    std::stable_sort(entries_.begin(), entries_.end(),
                     [&](int64_t a, int64_t b) { return targets_[a] < targets_[b]; });
    starts_.clear();
    for (int64_t j = 0; j < n; ++j)
      if (j == 0 || targets_[entries_[j]] != targets_[entries_[j - 1]]) starts_.push_back(j);
    starts_.push_back(n);
  }

  // rows[targets[k]] += entry_row(k) (width w) for every k of the last group().
  template <class T, class EntryRow>
  void add(T* rows, size_t w, EntryRow entry_row) const {
    const int64_t num_targets = static_cast<int64_t>(starts_.size()) - 1;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < num_targets; ++t) {
      T* row = rows + targets_[entries_[starts_[t]]] * w;
      for (int64_t j = starts_[t]; j < starts_[t + 1]; ++j) {
        const T* in = entry_row(entries_[j]);
        for (size_t q = 0; q < w; ++q) row[q] += in[q];
      }
    }
  }

 private:
  std::vector<int32_t> targets_;
  std::vector<int64_t> entries_;    // entry indices k, grouped by target row
  std::vector<int64_t> starts_{0};  // group t: entries_[starts_[t] .. starts_[t + 1])
};

// Rows of node-major arrays of T through a HaloExchange (T on the wire). The exchanged ghost
// rows (owned .. num_nodes - self images) are contiguous: the exchange reads and writes them in
// place; the self images (the last ghosts) are copied from and summed into their sources here.
// Copies and sums run in parallel over the rows they write (OpenMP, the engine's threads).
template <class T>
class HaloRows {
 public:
  // Overwrites the ghost rows of x (num_nodes x width) with their owners' rows.
  void forward(HaloExchange& halo, const GraphView& g, int width, T* x) {
    const size_t w = static_cast<size_t>(width);
    const int32_t* border = halo.border_nodes();
    const int64_t num_border = halo.num_border_nodes();
    border_.resize(static_cast<size_t>(num_border) * w);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < num_border; ++r)
      std::copy(x + border[r] * w, x + (border[r] + 1) * w, border_.begin() + r * w);
    halo.forward(width, border_.data(), x + g.num_energy_nodes * w);
    // sources are owned nodes or exchanged ghosts, never self images
    const int64_t images = halo.num_self_images(), first = g.num_nodes - images;
    const int32_t* sources = halo.self_image_sources();
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < images; ++k)
      std::copy(x + sources[k] * w, x + (sources[k] + 1) * w, x + (first + k) * w);
  }

  // Adds to each border row of grad (num_nodes x width) the adjoints of its ghost copies
  // (a node's entries in entry order: border nodes may repeat).
  void reverse(HaloExchange& halo, const GraphView& g, int width, T* grad) {
    const size_t w = static_cast<size_t>(width);
    // self images first, each source's in node order (a source that is an exchanged ghost
    // sends the sum)
    const int64_t images = halo.num_self_images(), first = g.num_nodes - images;
    image_sources_.group(halo.self_image_sources(), images);
    image_sources_.add(grad, w, [&](int64_t k) { return grad + (first + k) * w; });
    border_.resize(static_cast<size_t>(halo.num_border_nodes()) * w);  // written by reverse()
    halo.reverse(width, grad + g.num_energy_nodes * w, border_.data());
    border_nodes_.group(halo.border_nodes(), halo.num_border_nodes());
    border_nodes_.add(grad, w, [&](int64_t r) { return &border_[r * w]; });
  }

 private:
  std::vector<T> border_;
  RowsByTarget image_sources_, border_nodes_;
};

template <class T>
void zero_rows_from(std::vector<T>& a, int64_t first_row, int width) {
  std::fill(a.begin() + first_row * width, a.end(), T(0));
}

// a[i] *= 1 / (1 + rho[i]) for the first `rows` rows of `width` values (mace's density blocks;
// the CUDA backend scales as the symmetric contraction loads its rows: RowDensity).
template <class T>
void scale_rows(std::vector<T>& a, int64_t rows, int64_t width, const std::vector<double>& rho) {
  for (int64_t i = 0; i < rows; ++i) {
    const T inv_d = static_cast<T>(1.0 / (1.0 + rho[i]));
    for (int64_t q = 0; q < width; ++q) a[i * width + q] *= inv_d;
  }
}

template <class T>
class CpuRunner {
 public:
  CpuRunner(const ModelPlan& plan, bool radial_tables)
      : plan_(cpu::make_typed_plan<T>(plan, radial_tables)) {
    for (const SevennetLayer& l : plan.layers) {
      const ElementLinearPlan per_species{l.self_connection.in, l.self_connection.out,
                                          l.self_connection_species};
      sc_species_.push_back(cpu::make_element_linear<T>(per_species));
    }
  }

  // halo: see HaloExchange; null for a graph that holds every node's neighborhood.
  void run(const GraphView& g, ComputeOutput& out, HaloExchange* halo) {
    const int64_t n = g.num_nodes;
    const auto& layers = plan_.layers;
    const int num_layers = static_cast<int>(layers.size());
    const int64_t last_rows = cpu::layer_output_rows(g, halo, num_layers - 1);
    const bool want_grad = out.forces || out.virial || out.atom_virials;

    x1_.resize(num_layers);
    pre_gate_.resize(num_layers);
    std::vector<T> x;
    embed_species(plan_, g, x);
    std::vector<T> sc, y;
    for (int t = 0; t < num_layers; ++t) {
      const cpu::Layer<T>& L = layers[t];
      const int64_t rows = cpu::layer_output_rows(g, halo, t);
      sc.resize(static_cast<size_t>(n) * L.self_connection.dim_out);
      if (sc_species_[t].per_species.empty())
        cpu::linear_forward(L.self_connection, rows, x.data(), sc.data());
      else
        cpu::element_linear_forward(sc_species_[t], rows, g.species, x.data(), sc.data());
      x1_[t].resize(static_cast<size_t>(n) * L.linear_1.dim_out);
      // layer 0's input (the embedding) is known on every node; later ones come from owners
      // (halo) or from the previous layer's rows
      const int64_t in_rows = cpu::layer_input_rows(g, halo, t);
      cpu::linear_forward(L.linear_1, in_rows, x.data(), x1_[t].data());
      if (halo && t > 0) halo_.forward(*halo, g, L.linear_1.dim_out, x1_[t].data());
      if (!halo) zero_rows_from(x1_[t], in_rows, L.linear_1.dim_out);  // read times 0
      y.resize(static_cast<size_t>(n) * L.conv.dim_out);
      cpu::conv_forward(plan_, L.conv, cpu::first_receivers(g, rows), x1_[t].data(), y.data());
      std::vector<T>& p = pre_gate_[t];
      p.resize(static_cast<size_t>(n) * L.linear_2.dim_out);
      cpu::linear_forward(L.linear_2, rows, y.data(), p.data());
      for (size_t q = 0; q < static_cast<size_t>(rows) * L.linear_2.dim_out; ++q) p[q] += sc[q];
      x.resize(static_cast<size_t>(n) * L.gate.plan.dim_out);
      cpu::gate_forward(L.gate, rows, p.data(), x.data());
    }
    // Readout
    std::vector<T> h = x;
    for (size_t r = 0; r < plan_.readout.size(); ++r) {
      std::vector<T> next(static_cast<size_t>(n) * plan_.readout[r].dim_out);
      cpu::linear_forward(plan_.readout[r], last_rows, h.data(), next.data());
      h.swap(next);
    }
    double energy = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const int s = g.species[i];
      const double e = i < g.num_energy_nodes ? static_cast<double>(plan_.shift[s]) +
                                                    static_cast<double>(plan_.scale[s]) * h[i]
                                              : 0.0;
      if (out.atom_energies) out.atom_energies[i] = e;
      energy += e;
    }
    out.energy = energy;
    if (!want_grad) return;

    // Backward: seed dE/d(readout output) = scale on energy nodes.
    std::vector<T> grad(static_cast<size_t>(n), T(0));
    for (int64_t i = 0; i < g.num_energy_nodes; ++i) grad[i] = plan_.scale[g.species[i]];
    for (int r = static_cast<int>(plan_.readout.size()) - 1; r >= 0; --r) {
      std::vector<T> prev(static_cast<size_t>(n) * plan_.readout[r].dim_in);
      cpu::linear_backward(plan_.readout[r], last_rows, grad.data(), prev.data(), false);
      grad.swap(prev);
    }
    std::vector<double> forces(static_cast<size_t>(n) * 3, 0.0);
    std::vector<double> atom_virials;
    const bool want_virial = out.virial || out.atom_virials;
    if (want_virial) atom_virials.assign(static_cast<size_t>(n) * 9, 0.0);
    std::vector<T> grad_p, grad_y, grad_x1;
    for (int t = num_layers - 1; t >= 0; --t) {
      const cpu::Layer<T>& L = layers[t];
      const int64_t rows = cpu::layer_output_rows(g, halo, t);
      const int64_t in_rows = cpu::layer_input_rows(g, halo, t);
      grad_p.resize(static_cast<size_t>(n) * L.gate.plan.dim_in);
      cpu::gate_backward(L.gate, rows, pre_gate_[t].data(), grad.data(), grad_p.data());
      grad.resize(static_cast<size_t>(n) * L.self_connection.dim_in);
      if (sc_species_[t].per_species.empty())
        cpu::linear_backward(L.self_connection, rows, grad_p.data(), grad.data(), false);
      else
        cpu::element_linear_backward(sc_species_[t], rows, g.species, grad_p.data(), grad.data(),
                                     false);
      zero_rows_from(grad, rows, L.self_connection.dim_in);  // linear_1's rows may be more
      grad_y.resize(static_cast<size_t>(n) * L.linear_2.dim_in);
      cpu::linear_backward(L.linear_2, rows, grad_p.data(), grad_y.data(), false);
      zero_rows_from(grad_y, rows, L.linear_2.dim_in);  // ghosts' energies are not ours
      grad_x1.resize(static_cast<size_t>(n) * L.conv.dim_in);
      cpu::conv_backward(plan_, L.conv,
                         cpu::first_receivers(g, cpu::layer_backward_nodes(g, halo, t)),
                         x1_[t].data(), grad_y.data(), grad_x1.data(), forces.data(),
                         want_virial ? atom_virials.data() : nullptr);
      if (t == 0) break;
      if (halo) halo_.reverse(*halo, g, L.conv.dim_in, grad_x1.data());
      cpu::linear_backward(L.linear_1, in_rows, grad_x1.data(), grad.data(), true);
    }
    write_gradients(forces, atom_virials, out);
  }

 private:
  cpu::TypedPlan<T> plan_;
  std::vector<cpu::ElementLinear<T>> sc_species_;  // per layer; empty per_species: linear
  std::vector<std::vector<T>> x1_, pre_gate_;
  HaloRows<T> halo_;
};

// MACE interaction t (mace-torch RealAgnostic[Residual]InteractionBlock + product):
//   sc = Skip_s(x) (residual); u = LinearUp(x); y = Conv(u) (1/avg_num_neighbors);
//   m = Linear(y); m = Skip_s(m) (non-residual); x = ProductLinear(SC_s(m)) (+ sc);
//   e_i += Readout_t(x_i).   Atomic energy e_i = e0[s_i] + scale * (sum_t Readout_t + Z_i) + shift
//   (Z_i: the ZBL pair repulsion, ops/pair_repulsion.h, when the model has it).
// The backward pass keeps u, m and the readout hidden pre-activations (node-level).
template <class T>
class MaceRunner {
 public:
  using Layer = cpu::MaceBlock<T>;

  MaceRunner(const ModelPlan& plan, bool radial_tables) : geom_(cpu::make_typed_plan<T>(plan)) {
    for (const MaceLayer& l : plan.mace_layers)
      layers_.push_back(cpu::make_mace_block<T>(l, radial_tables ? &plan : nullptr));
    e0_ = plan.e0;
    scale_ = plan.mace_scale;
    shift_ = plan.mace_shift;
    if (plan.pair_repulsion.enabled) {
      pair_table_ = ops::pair_repulsion_table(plan.pair_repulsion, plan.atomic_numbers);
      pair_ = ops::pair_repulsion_view(plan.pair_repulsion,
                                       static_cast<int>(plan.atomic_numbers.size()), plan.cutoff,
                                       pair_table_.data());
    }
  }

  // Engine::set_system_inputs: the species embedding and e0 of other per-system inputs
  // (converted to T as make_typed_plan converts the plan's).
  void set_system_inputs(const SystemInputFold& fold) {
    geom_.embedding.assign(fold.embedding.begin(), fold.embedding.end());
    e0_ = fold.e0;
  }

  void run(const GraphView& g, ComputeOutput& out, HaloExchange* halo) {
    const int64_t n = g.num_nodes;
    const int num_layers = static_cast<int>(layers_.size());
    const bool want_grad = out.forces || out.virial || out.atom_virials;
    const auto N = static_cast<size_t>(n);
    up_.resize(num_layers);
    m_.resize(num_layers);
    rho_.resize(num_layers);
    nl_a_.resize(num_layers);
    nl_z_.resize(num_layers);
    hidden_.resize(num_layers);
    std::vector<T> x;
    embed_species(geom_, g, x);
    std::vector<double> inter(N, 0.0);
    std::vector<T> sc, y, p, r(N);
    for (int t = 0; t < num_layers; ++t) {
      const Layer& L = layers_[t];
      const int64_t rows = cpu::layer_output_rows(g, halo, t);
      if (L.residual) {
        sc.resize(N * L.skip.dim_out);
        cpu::element_linear_forward(L.skip, rows, g.species, x.data(), sc.data());
      }
      up_[t].resize(N * L.linear_up.dim_out);
      // layer 0's input (the embedding) is known on every node; later ones come from owners
      // (halo) or from the previous layer's rows
      const int64_t in_rows = cpu::layer_input_rows(g, halo, t);
      cpu::linear_forward(L.linear_up, in_rows, x.data(), up_[t].data());
      if (halo && t > 0) halo_.forward(*halo, g, L.linear_up.dim_out, up_[t].data());
      if (!halo) zero_rows_from(up_[t], in_rows, L.linear_up.dim_out);  // read times 0
      y.resize(N * L.conv.dim_out);
      cpu::ensure_pair_tables(layers_[t].conv, n, g.species);
      cpu::conv_forward(geom_, L.conv, cpu::first_receivers(g, rows), up_[t].data(), y.data());
      if (L.nonlinear_block) {  // z = linear_1(y) / (alpha + beta rho) + linear_res(u)
        rho_[t].resize(N);
        cpu::edge_density_forward(geom_, L.density_mlp(), cpu::first_receivers(g, rows),
                                  rho_[t].data());
        std::vector<T>& a = nl_a_[t];
        std::vector<T>& z = nl_z_[t];
        a.resize(N * L.linear.dim_out);
        z.resize(N * L.linear_res.dim_out);
        cpu::linear_forward(L.linear, rows, y.data(), a.data());
        cpu::linear_forward(L.linear_res, rows, up_[t].data(), z.data());
        const auto dim = static_cast<size_t>(L.linear.dim_out);
        for (size_t i = 0; i < static_cast<size_t>(rows); ++i) {
          const double d = L.alpha + L.beta * rho_[t][i];
          for (size_t q = 0; q < dim; ++q)
            z[i * dim + q] += static_cast<T>(static_cast<double>(a[i * dim + q]) / d);
        }
        std::vector<T> gated(N * L.gate.plan.dim_out);
        cpu::gate_forward(L.gate, rows, z.data(), gated.data());
        m_[t].resize(N * L.linear_2.dim_out);
        cpu::linear_forward(L.linear_2, rows, gated.data(), m_[t].data());
      } else {
        // m = linear(y), or skip(linear(y)) without residual (one element-dependent linear of
        // y, MaceBlock::skip_reads_conv); as mace, density blocks divide m by 1 + rho
        const int64_t dim = L.skip_reads_conv ? L.skip.dim_out : L.linear.dim_out;
        m_[t].resize(N * dim);
        if (L.skip_reads_conv)
          cpu::element_linear_forward(L.skip, rows, g.species, y.data(), m_[t].data());
        else
          cpu::linear_forward(L.linear, rows, y.data(), m_[t].data());
        if (L.density) {
          cpu::ensure_density_tables(layers_[t].edge_density, n, g.species);
          rho_[t].resize(N);
          cpu::edge_density_forward(geom_, L.edge_density, cpu::first_receivers(g, rows),
                                    rho_[t].data());
          scale_rows(m_[t], rows, dim, rho_[t]);
        }
      }
      p.resize(N * L.product.dim_out);
      cpu::symmetric_contraction_forward(L.product, rows, g.species, m_[t].data(), p.data());
      x.resize(N * L.product_linear.dim_out);
      cpu::linear_forward(L.product_linear, rows, p.data(), x.data());
      if (L.add_sc)
        for (size_t q = 0; q < static_cast<size_t>(rows) * L.product_linear.dim_out; ++q)
          x[q] += sc[q];
      if (L.nonlinear) {
        std::vector<T>& h = hidden_[t];
        h.resize(N * L.readout_1.dim_out);
        cpu::linear_forward(L.readout_1, rows, x.data(), h.data());
        std::vector<T> a(h.size());
        for (size_t q = 0; q < h.size(); ++q) a[q] = ops::activation(L.act, h[q]) * L.act_scale;
        cpu::linear_forward(L.readout_2, rows, a.data(), r.data());
      } else {
        cpu::linear_forward(L.readout_1, rows, x.data(), r.data());
      }
      for (int64_t i = 0; i < rows; ++i) inter[i] += static_cast<double>(r[i]);
    }
    // ZBL: an interaction energy, scaled and shifted with the readouts' (ScaleShiftMACE)
    if (pair_.pair) cpu::pair_repulsion_forward(pair_, g, g.num_energy_nodes, inter.data());
    double energy = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const double e =
          i < g.num_energy_nodes ? e0_[g.species[i]] + scale_ * inter[i] + shift_ : 0.0;
      if (out.atom_energies) out.atom_energies[i] = e;
      energy += e;
    }
    out.energy = energy;
    if (!want_grad) return;

    std::vector<T> seed(N, T(0));
    for (int64_t i = 0; i < g.num_energy_nodes; ++i) seed[i] = static_cast<T>(scale_);
    std::vector<double> forces(N * 3, 0.0);
    std::vector<double> atom_virials;
    const bool want_virial = out.virial || out.atom_virials;
    if (want_virial) atom_virials.assign(N * 9, 0.0);
    if (pair_.pair)
      cpu::pair_repulsion_backward(pair_, g, n, scale_, forces.data(),
                                   want_virial ? atom_virials.data() : nullptr);
    std::vector<T> gx(N * layers_.back().product_linear.dim_out, T(0)), gp, gm, gy, gup, gh;
    for (int t = num_layers - 1; t >= 0; --t) {
      const Layer& L = layers_[t];
      const int64_t rows = cpu::layer_output_rows(g, halo, t);
      if (L.nonlinear) {  // gx += readout^T(seed)
        gh.resize(N * L.readout_2.dim_in);
        cpu::linear_backward(L.readout_2, rows, seed.data(), gh.data(), false);
        const std::vector<T>& h = hidden_[t];
        for (size_t q = 0; q < gh.size(); ++q)
          gh[q] *= ops::activation_grad(L.act, h[q]) * L.act_scale;
        cpu::linear_backward(L.readout_1, rows, gh.data(), gx.data(), true);
      } else {
        cpu::linear_backward(L.readout_1, rows, seed.data(), gx.data(), true);
      }
      gp.resize(N * L.product_linear.dim_in);
      cpu::linear_backward(L.product_linear, rows, gx.data(), gp.data(), false);
      gm.resize(N * L.product.dim_in);
      cpu::symmetric_contraction_backward(L.product, rows, g.species, m_[t].data(), gp.data(),
                                          gm.data());
      if (L.density) {  // m = P(y) / d, d = 1 + rho, P linear: dE/drho = -dE/dm . m / d,
        // and dE/dP(y) = dE/dm / d
        grad_rho.assign(N, 0.0);
        const auto dim = static_cast<size_t>(L.product.dim_in);
        for (size_t i = 0; i < static_cast<size_t>(rows); ++i) {
          double s = 0.0;
          for (size_t q = 0; q < dim; ++q)
            s += static_cast<double>(gm[i * dim + q]) * static_cast<double>(m_[t][i * dim + q]);
          grad_rho[i] = -s / (1.0 + rho_[t][i]);
        }
        scale_rows(gm, rows, static_cast<int64_t>(dim), rho_[t]);
      }
      if (L.nonlinear_block) {
        // m = linear_2(gate(z)), z = a / d + linear_res(u), a = linear_1(y), d = alpha + beta rho:
        // dE/dz = gate^T linear_2^T dE/dm, dE/da = dE/dz / d, dE/drho = -beta dE/dz . a / d^2
        std::vector<T> ggated(N * L.linear_2.dim_in);
        cpu::linear_backward(L.linear_2, rows, gm.data(), ggated.data(), false);
        gz.resize(N * L.gate.plan.dim_in);
        cpu::gate_backward(L.gate, rows, nl_z_[t].data(), ggated.data(), gz.data());
        grad_rho.assign(N, 0.0);
        const auto dim = static_cast<size_t>(L.linear.dim_out);
        gm.resize(N * dim);
        for (size_t i = 0; i < static_cast<size_t>(rows); ++i) {
          const double d = L.alpha + L.beta * rho_[t][i];
          double s = 0.0;
          for (size_t q = 0; q < dim; ++q) {
            const double gzq = static_cast<double>(gz[i * dim + q]);
            s += gzq * static_cast<double>(nl_a_[t][i * dim + q]);
            gm[i * dim + q] = static_cast<T>(gzq / d);
          }
          grad_rho[i] = -L.beta * s / (d * d);
        }
      }
      gy.resize(N * L.linear.dim_in);
      if (L.skip_reads_conv)
        cpu::element_linear_backward(L.skip, rows, g.species, gm.data(), gy.data(), false);
      else
        cpu::linear_backward(L.linear, rows, gm.data(), gy.data(), false);
      zero_rows_from(gy, rows, L.linear.dim_in);  // ghosts' energies are not ours
      gup.resize(N * L.conv.dim_in);
      const GraphView backward_graph =
          cpu::first_receivers(g, cpu::layer_backward_nodes(g, halo, t));
      cpu::conv_backward(geom_, L.conv, backward_graph, up_[t].data(), gy.data(), gup.data(),
                         forces.data(), want_virial ? atom_virials.data() : nullptr);
      if (L.density)
        cpu::edge_density_backward(geom_, L.edge_density, backward_graph, grad_rho.data(),
                                   forces.data(), want_virial ? atom_virials.data() : nullptr);
      if (L.nonlinear_block) {
        cpu::edge_density_backward(geom_, L.density_mlp(), backward_graph, grad_rho.data(),
                                   forces.data(), want_virial ? atom_virials.data() : nullptr);
        cpu::linear_backward(L.linear_res, rows, gz.data(), gup.data(), true);
      }
      if (t == 0) break;
      if (halo) halo_.reverse(*halo, g, L.conv.dim_in, gup.data());
      std::vector<T> gprev(N * L.linear_up.dim_in, T(0));
      cpu::linear_backward(L.linear_up, cpu::layer_input_rows(g, halo, t), gup.data(), gprev.data(),
                           true);
      if (L.add_sc)
        cpu::element_linear_backward(L.skip, rows, g.species, gx.data(), gprev.data(), true);
      gx.swap(gprev);
    }
    write_gradients(forces, atom_virials, out);
  }

 private:
  cpu::TypedPlan<T> geom_;  // radial basis, spherical harmonics, embedding
  std::vector<Layer> layers_;
  std::vector<double> e0_;
  double scale_ = 1.0, shift_ = 0.0;
  std::vector<double> pair_table_;  // ZBL pair repulsion (pair_.pair null: none)
  ops::PairRepulsionView pair_;
  std::vector<std::vector<T>> up_, m_, hidden_;
  std::vector<std::vector<double>> rho_;  // density blocks: 1 + rho divides m
  std::vector<double> grad_rho;
  std::vector<std::vector<T>> nl_a_, nl_z_;  // non-linear blocks: linear_1(y), the gate's input
  std::vector<T> gz;
  HaloRows<T> halo_;
};

}  // namespace

struct Engine::Impl {
  std::unique_ptr<CpuRunner<float>> f32;
  std::unique_ptr<CpuRunner<double>> f64;
  std::unique_ptr<MaceRunner<float>> mace32;
  std::unique_ptr<MaceRunner<double>> mace64;
#ifdef E3FUSE_WITH_CUDA
  std::unique_ptr<cuda::Backend> gpu;
#endif
  std::unique_ptr<NeighborList> neighbors;         // compute(SystemView) on the CPU
  std::unique_ptr<NeighborList> region_neighbors;  // the same, one region at a time
  std::unique_ptr<NeighborList> node_neighbors;    // compute(NodesView) on the CPU
  // node and owned counts of the last compute(NodesView) (NodesView::same_nodes_as_last)
  int64_t last_nodes = -1, last_owned = -1;
  bool nodes_last = false;  // the last list built or used was compute(NodesView)'s
  int64_t region_atoms = 0;
  int num_regions = 1;
  double skin = 0.5;
  double min_distance = 0.1;
  int num_threads = 0;
  // node and edge counts of the caller's last compute(GraphView), whose edges were checked
  // (GraphView::same_edges_as_last); -1 after any other kind of call
  int64_t last_graph_nodes = -1, last_graph_edges = -1;
  std::vector<double> system_input_values;  // see Engine::set_system_inputs
};

Engine::Engine(std::shared_ptr<const Model> model, Device device, Precision precision,
               int num_threads, int gpu, Radial radial)
    : model_(std::move(model)),
      device_(device),
      precision_(precision),
      radial_(radial != Radial::automatic       ? radial
              : precision == Precision::float32 ? Radial::table
                                                : Radial::mlp),
      impl_(std::make_unique<Impl>()) {
  if (!model_) throw Error("Engine: no model");
  const std::string& family = model_->family();
  if (family != "sevennet" && family != "mace")
    throw Error("model family '" + family + "' is not supported");
  if (model_->needs_system_inputs()) {
    std::string names;
    for (const Model::SystemInput& in : model_->system_inputs())
      names += (names.empty() ? "" : ", ") + in.name + " (" + in.key + ")";
    throw Error("the model has per-system inputs " + names +
                ": evaluate it through Model::with_system_inputs");
  }
  impl_->num_threads = num_threads > 0 ? num_threads : omp_get_max_threads();
  impl_->system_input_values = model_->plan().joint_embedding.values;
  const bool tables = radial_ == Radial::table;
  if (device == Device::cuda) {
#ifdef E3FUSE_WITH_CUDA
    impl_->gpu = cuda::make_backend(model_->plan(), precision, gpu, tables);
    return;
#else
    (void)gpu;
    throw Error("this e3fuse was built without CUDA; use device 'cpu'");
#endif
  }
  if (family == "mace") {
    if (precision == Precision::float64)
      impl_->mace64 = std::make_unique<MaceRunner<double>>(model_->plan(), tables);
    else
      impl_->mace32 = std::make_unique<MaceRunner<float>>(model_->plan(), tables);
  } else if (precision == Precision::float64)
    impl_->f64 = std::make_unique<CpuRunner<double>>(model_->plan(), tables);
  else
    impl_->f32 = std::make_unique<CpuRunner<float>>(model_->plan(), tables);
}

Engine::~Engine() = default;

namespace {

void check_atoms(int64_t n, const int32_t* species, const double* positions, int num_species) {
  for (int64_t i = 0; i < n; ++i) {
    if (species[i] < 0 || species[i] >= num_species) {
      throw Error("atom " + std::to_string(i) + " has species index " + std::to_string(species[i]) +
                  ", outside the model's " + std::to_string(num_species) + " species");
    }
    for (int a = 0; a < 3; ++a) {
      if (!std::isfinite(positions[3 * i + a])) {
        throw Error("position of atom " + std::to_string(i) + " is not finite (NaN or inf)");
      }
    }
  }
}

// Border nodes of a halo exchange must be owned nodes; self images the last ghosts, each
// the copy of an owned node or of an exchanged ghost.
void check_border_nodes(const HaloExchange* halo, int64_t num_owned, int64_t num_nodes) {
  if (!halo) return;
  const int32_t* border = halo->border_nodes();
  for (int64_t r = 0; r < halo->num_border_nodes(); ++r)
    if (border[r] < 0 || border[r] >= num_owned)
      throw Error("invalid halo exchange: border node " + std::to_string(border[r]) +
                  " is not an owned node");
  const int64_t images = halo->num_self_images();
  if (images < 0 || images > num_nodes - num_owned)
    throw Error("invalid halo exchange: " + std::to_string(images) + " self images but " +
                std::to_string(num_nodes - num_owned) + " ghosts");
  const int32_t* sources = halo->self_image_sources();
  for (int64_t k = 0; k < images; ++k)
    if (sources[k] < 0 || sources[k] >= num_nodes - images)
      throw Error("invalid halo exchange: self image " + std::to_string(num_nodes - images + k) +
                  " has source node " + std::to_string(sources[k]) +
                  ", not an owned node or exchanged ghost");
}

}  // namespace

void Engine::set_system_inputs(const std::vector<double>& values) {
  // computed, and checked, before anything changes
  const SystemInputFold fold = fold_system_inputs(model_->plan(), values);
#ifdef E3FUSE_WITH_CUDA
  if (impl_->gpu) impl_->gpu->set_system_inputs(fold.embedding, fold.e0);
#endif
  if (impl_->mace64) impl_->mace64->set_system_inputs(fold);
  if (impl_->mace32) impl_->mace32->set_system_inputs(fold);
  impl_->system_input_values = values;
}

const std::vector<double>& Engine::system_input_values() const {
  return impl_->system_input_values;
}

void Engine::set_neighbor_skin(double skin) {
  if (!(skin >= 0.0)) throw Error("the neighbor-list skin must be >= 0");
  impl_->skin = skin;
}

void Engine::set_min_distance(double min_distance) { impl_->min_distance = min_distance; }

int64_t Engine::num_neighbor_builds() const {
#ifdef E3FUSE_WITH_CUDA
  if (impl_->gpu) return impl_->gpu->num_neighbor_builds();
#endif
  const NeighborList* list =
      impl_->nodes_last ? impl_->node_neighbors.get() : impl_->neighbors.get();
  return list ? list->num_builds() : 0;
}

int64_t Engine::num_step_replays() const {
#ifdef E3FUSE_WITH_CUDA
  if (impl_->gpu) return impl_->gpu->num_step_replays();
#endif
  return 0;
}

int64_t Engine::num_neighbor_edges() const {
#ifdef E3FUSE_WITH_CUDA
  if (impl_->gpu) return impl_->gpu->num_neighbor_edges();
#endif
  const NeighborList* list =
      impl_->nodes_last ? impl_->node_neighbors.get() : impl_->neighbors.get();
  return list ? list->num_edges() : 0;
}

double Engine::neighbor_skin() const { return impl_->skin; }

size_t Engine::device_bytes_in_use() {
#ifdef E3FUSE_WITH_CUDA
  return cuda::device_bytes_in_use();
#else
  return 0;
#endif
}

size_t Engine::device_bytes_peak() {
#ifdef E3FUSE_WITH_CUDA
  return cuda::device_bytes_peak();
#else
  return 0;
#endif
}

void Engine::reset_device_bytes_peak() {
#ifdef E3FUSE_WITH_CUDA
  cuda::reset_device_bytes_peak();
#endif
}

void Engine::set_region_atoms(int64_t max_atoms) {
  if (max_atoms < 0) throw Error("the most atoms per region must be >= 0 (0: automatic)");
  impl_->region_atoms = max_atoms;
}

int64_t Engine::region_atoms() const { return impl_->region_atoms; }

int Engine::num_regions() const { return impl_->num_regions; }

#ifdef E3FUSE_WITH_CUDA
namespace {

// Automatic regions (GPU) are considered for larger systems only, and never smaller.
constexpr int64_t kMinAutomaticRegionAtoms = 65536;

// Edges per atom of a neighbor list of radius `radius`: from the density of a fully
// periodic cell, else (or when denser) that of a dense solid, 0.15 atoms per A^3.
double expected_edges_per_atom(const SystemView& s, double radius) {
  double density = 0.15;
  if (s.pbc[0] && s.pbc[1] && s.pbc[2] && s.cell && s.num_atoms > 0) {
    double c12[3];
    lattice::cross3(s.cell + 3, s.cell + 6, c12);
    const double volume = std::abs(lattice::dot3(s.cell, c12));
    if (volume > 0.0) density = std::max(density, static_cast<double>(s.num_atoms) / volume);
  }
  return density * 4.0 / 3.0 * 3.141592653589793 * radius * radius * radius;
}

}  // namespace
#endif

void Engine::compute(const SystemView& s, ComputeOutput& out) {
  // the CPU path and regions evaluate graphs of their own: none is a caller's last graph
  struct ForgetGraph {
    Impl& impl;
    ForgetGraph(Impl& i) : impl(i) { impl.last_graph_nodes = impl.last_graph_edges = -1; }
    ~ForgetGraph() { impl.last_graph_nodes = impl.last_graph_edges = -1; }
  } forget_graph(*impl_);
  if (s.num_atoms < 0) throw Error("invalid system: negative atom count");
  impl_->nodes_last = false;
  const int num_species = static_cast<int>(model_->atomic_numbers().size());
  check_atoms(s.num_atoms, s.species, s.positions, num_species);
  int64_t max_atoms = impl_->region_atoms;
#ifdef E3FUSE_WITH_CUDA
  if (impl_->gpu && max_atoms == 0 && s.num_atoms > kMinAutomaticRegionAtoms) {
    const bool want_grad = out.forces || out.virial || out.atom_virials;
    const bool want_virial = out.virial || out.atom_virials;
    const double radius = model_->cutoff() + impl_->skin;
    max_atoms =
        std::max(kMinAutomaticRegionAtoms,
                 impl_->gpu->max_atoms(expected_edges_per_atom(s, radius), want_grad, want_virial));
  }
#endif
  impl_->num_regions = 1;
  if (max_atoms > 0 && s.num_atoms > max_atoms) {
    const RegionSplitter splitter(s, model_->cutoff(), model_->num_layers());
    const RegionGrid grid = splitter.choose(max_atoms);
    if (grid.total() > 1) {
      compute_regions(splitter, grid, out);
      return;
    }
  }
#ifdef E3FUSE_WITH_CUDA
  if (impl_->gpu) {
    impl_->gpu->compute_system(s, impl_->skin, impl_->min_distance, out, s.num_atoms, false,
                               nullptr);
    return;
  }
#endif
  if (!impl_->neighbors || impl_->neighbors->skin() != impl_->skin)
    impl_->neighbors = std::make_unique<NeighborList>(model_->cutoff(), impl_->skin);
  impl_->neighbors->set_min_distance(impl_->min_distance);
  impl_->neighbors->update(s.num_atoms, s.positions, s.cell, s.pbc);
  compute(impl_->neighbors->view(s.positions, s.species), out);
}

void Engine::compute_regions(const RegionSplitter& splitter, const RegionGrid& grid,
                             ComputeOutput& out) {
  out.energy = 0.0;
  if (out.virial) std::fill(out.virial, out.virial + 9, 0.0);
  const int64_t n = splitter.num_atoms();
  if (out.atom_energies) std::fill(out.atom_energies, out.atom_energies + n, 0.0);
  if (out.forces) std::fill(out.forces, out.forces + 3 * n, 0.0);
  if (out.atom_virials) std::fill(out.atom_virials, out.atom_virials + 9 * n, 0.0);
  Region region;
  std::vector<double> energies, forces, virial(9), atom_virials;
  for (int r = 0; r < grid.total(); ++r) {
    splitter.make(grid, r, region);
    if (region.num_owned == 0) continue;
    const int64_t m = region.num_atoms();
    ComputeOutput part;
    energies.resize(out.atom_energies ? m : 0);
    forces.resize(out.forces ? 3 * m : 0);
    atom_virials.resize(out.atom_virials ? 9 * m : 0);
    if (out.atom_energies) part.atom_energies = energies.data();
    if (out.forces) part.forces = forces.data();
    if (out.virial) part.virial = virial.data();
    if (out.atom_virials) part.atom_virials = atom_virials.data();
    SystemView sub;
    sub.num_atoms = m;
    sub.positions = region.positions.data();
    sub.species = region.species.data();
    sub.cell = region.cell;
    for (int a = 0; a < 3; ++a) sub.pbc[a] = region.pbc[a];
    try {
      compute_region(sub, region.num_owned, region.layer_rows.data(), part);
    } catch (const Error& e) {
      throw Error(region_message(e.what(), region));
    }
    out.energy += part.energy;
    for (int64_t i = 0; i < m; ++i) {
      const int64_t j = region.atom[i];
      if (out.atom_energies && i < region.num_owned) out.atom_energies[j] = energies[i];
      if (out.forces)
        for (int k = 0; k < 3; ++k) out.forces[3 * j + k] += forces[3 * i + k];
      if (out.atom_virials)
        for (int k = 0; k < 9; ++k) out.atom_virials[9 * j + k] += atom_virials[9 * i + k];
    }
    if (out.virial)
      for (int k = 0; k < 9; ++k) out.virial[k] += virial[k];
  }
  impl_->num_regions = grid.total();
}

// One region: a fresh neighbor list without skin (the next call is another region).
void Engine::compute_region(const SystemView& sub, int64_t num_owned, const int64_t* layer_rows,
                            ComputeOutput& out) {
#ifdef E3FUSE_WITH_CUDA
  if (impl_->gpu) {
    impl_->gpu->compute_system(sub, 0.0, impl_->min_distance, out, num_owned, true, layer_rows);
    return;
  }
#endif
  if (!impl_->region_neighbors)
    impl_->region_neighbors = std::make_unique<NeighborList>(model_->cutoff(), 0.0);
  NeighborList& list = *impl_->region_neighbors;
  list.set_min_distance(impl_->min_distance);
  list.invalidate();
  list.update(sub.num_atoms, sub.positions, sub.cell, sub.pbc);
  GraphView g = list.view(sub.positions, sub.species);
  g.num_energy_nodes = num_owned;
  g.layer_rows = layer_rows;
  compute(g, out, nullptr);
}

void Engine::compute(const GraphView& g, ComputeOutput& out) { compute(g, out, nullptr); }

int Engine::halo_width() const {
  const std::vector<int> widths = halo_widths(model_->plan());
  return widths.empty() ? 0 : *std::max_element(widths.begin(), widths.end());
}

void Engine::compute(const GraphView& g, ComputeOutput& out, HaloExchange* halo) {
  if (g.num_nodes < 0 || g.num_energy_nodes < 0 || g.num_energy_nodes > g.num_nodes) {
    throw Error("invalid graph: node counts");
  }
  const int num_species = static_cast<int>(model_->atomic_numbers().size());
  check_atoms(g.num_nodes, g.species, g.positions, num_species);
  const int64_t num_edges = g.num_nodes > 0 ? g.row_offsets[g.num_nodes] : 0;
  GraphView checked = g;
  checked.same_edges_as_last = g.same_edges_as_last && impl_->last_graph_nodes == g.num_nodes &&
                               impl_->last_graph_edges == num_edges;
  impl_->last_graph_nodes = impl_->last_graph_edges = -1;
  if (!checked.same_edges_as_last) {
    for (int64_t e = 0; e < num_edges; ++e) {
      if (g.neighbors[e] < 0 || g.neighbors[e] >= g.num_nodes)
        throw Error("invalid graph: neighbor index out of range");
    }
  }
  if (g.layer_rows) {
    for (int t = 0; t < model_->num_layers(); ++t) {
      const int64_t rows = g.layer_rows[t];
      const int64_t inner = t == 0 ? g.num_nodes : g.layer_rows[t - 1];
      if (rows < g.num_energy_nodes || rows > inner)
        throw Error(
            "invalid graph: layer_rows must not increase with the layer and lie "
            "between num_energy_nodes and num_nodes");
    }
  }
  check_border_nodes(halo, g.num_energy_nodes, g.num_nodes);
#ifdef E3FUSE_WITH_CUDA
  if (impl_->gpu) {
    impl_->gpu->compute(checked, out, halo);
    impl_->last_graph_nodes = g.num_nodes;
    impl_->last_graph_edges = num_edges;
    return;
  }
#endif
  run_cpu(g, out, halo);
  impl_->last_graph_nodes = g.num_nodes;
  impl_->last_graph_edges = num_edges;
}

void Engine::compute(const NodesView& nodes, ComputeOutput& out, HaloExchange* halo) {
  // none of the caller's graphs is the last one now (GraphView::same_edges_as_last)
  impl_->last_graph_nodes = impl_->last_graph_edges = -1;
  if (nodes.num_nodes < 0 || nodes.num_owned < 0 || nodes.num_owned > nodes.num_nodes)
    throw Error("invalid nodes: counts (num_owned must lie between 0 and num_nodes)");
  const int num_species = static_cast<int>(model_->atomic_numbers().size());
  check_atoms(nodes.num_nodes, nodes.species, nodes.positions, num_species);
  check_border_nodes(halo, nodes.num_owned, nodes.num_nodes);
  const bool keep_edges = nodes.same_nodes_as_last && impl_->last_nodes == nodes.num_nodes &&
                          impl_->last_owned == nodes.num_owned;
  impl_->last_nodes = impl_->last_owned = -1;
#ifdef E3FUSE_WITH_CUDA
  if (impl_->gpu) {
    impl_->gpu->compute_nodes(nodes, impl_->skin, impl_->min_distance, !keep_edges, out, halo);
    impl_->last_nodes = nodes.num_nodes;
    impl_->last_owned = nodes.num_owned;
    return;
  }
#endif
  if (!impl_->node_neighbors || impl_->node_neighbors->skin() != impl_->skin)
    impl_->node_neighbors = std::make_unique<NeighborList>(model_->cutoff(), impl_->skin);
  NeighborList& list = *impl_->node_neighbors;
  impl_->nodes_last = true;
  list.set_min_distance(impl_->min_distance);
  list.set_num_owned(nodes.num_owned);
  if (!keep_edges) list.invalidate();
  const bool open[3] = {false, false, false};
  list.update(nodes.num_nodes, nodes.positions, nullptr, open);
  GraphView g = list.view(nodes.positions, nodes.species);
  g.num_energy_nodes = nodes.num_owned;
  g.shift_index = nullptr;  // open: every shift is zero
  g.shifts = nullptr;
  run_cpu(g, out, halo);
  impl_->last_nodes = nodes.num_nodes;
  impl_->last_owned = nodes.num_owned;
}

void Engine::node_graph(std::vector<int64_t>& row_offsets, std::vector<int32_t>& neighbors) const {
#ifdef E3FUSE_WITH_CUDA
  if (impl_->gpu) {
    impl_->gpu->node_graph(row_offsets, neighbors);
    return;
  }
#endif
  if (!impl_->node_neighbors) throw Error("node_graph: no compute(NodesView) yet");
  row_offsets = impl_->node_neighbors->row_offsets();
  neighbors = impl_->node_neighbors->neighbors();
}

void Engine::run_cpu(const GraphView& g, ComputeOutput& out, HaloExchange* halo) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(impl_->num_threads);
  try {
    if (impl_->f64)
      impl_->f64->run(g, out, halo);
    else if (impl_->f32)
      impl_->f32->run(g, out, halo);
    else if (impl_->mace64)
      impl_->mace64->run(g, out, halo);
    else
      impl_->mace32->run(g, out, halo);
  } catch (...) {
    omp_set_num_threads(saved);
    throw;
  }
  omp_set_num_threads(saved);
}

// Built without iostreams: a process that also loads another C++ runtime (torch)
// crashed inside ostream's number formatting on the GPU machine.
std::string Engine::describe() const {
  char cutoff[32];
  std::snprintf(cutoff, sizeof cutoff, "%g", model_->cutoff());
  std::string s = std::string("e3fuse ") + version() + ": " + model_->family() + " model (" +
                  std::to_string(model_->num_layers()) + " layers, cutoff " + cutoff + " A, " +
                  std::to_string(model_->atomic_numbers().size()) + " elements), device " +
                  to_string(device_) + ", precision " + to_string(precision_) + ", radial " +
                  to_string(radial_) + ", ";
#ifdef E3FUSE_WITH_CUDA
  if (impl_->gpu) return s + "GPU " + impl_->gpu->device_name();
#endif
  return s + std::to_string(impl_->num_threads) + " CPU threads";
}

}  // namespace e3fuse
