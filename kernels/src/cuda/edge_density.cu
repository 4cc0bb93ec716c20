// cuda/edge_density.cu: mace's density blocks on the GPU (RealAgnosticDensity[Residual]-
// InteractionBlock): the neighbor density rho_i, the division of linear(message) by
// 1 + rho_i, and their adjoints. Same math as cpu/edge_density.cpp and engine.cpp's
// MaceRunner. One warp per node (lanes take its edges in turn, the partial sums meet in a
// fixed shuffle tree); the backward takes both directed edges of each pair at each end and
// writes to that node only, so no atomics and a fixed summation order.
//
// rho depends on the positions only: one edge walk (EdgeWalk) gives every density layer's rho
// and ZBL's pair energies, another after the layers' backward all their forces and ZBL's
// (the per-layer walks cost about the same each: reading the edges, positions in double).
// Per edge, with the densities' tables (cpu::EdgeDensity, the default in float32): edge
// vector and r in double, then per layer one 16-byte read (32 in float64) of the cubic's
// coefficients and 3 FMAs (6 with the slope). Without them (float64): the Bessel basis,
// envelope and distance transform in double once per edge (~800 FP64 instructions: 8 double
// sincos, 2 pow, tanh and 7 divisions for the MACE-OMAT-0 architecture), then per layer its
// weights' dot product and tanh, forward and backward.
//
// The non-linear block's density (ops::RadialMlpView overloads): the RadialMLP of the ordered
// species pair per edge, in double (not tabulated), and z += a / (alpha + beta rho); its own
// walks.
#include <algorithm>
#include <type_traits>

#include "cpu/ops.h"
#include "cuda/edge_density.cuh"
#include "ops/edge_vector.h"
#include "ops/radial.h"
#include "ops/radial_mlp.h"
#include "ops/radial_table.h"

namespace e3fuse::cuda {

namespace {

constexpr int kDensityThreads = 128;  // 4 nodes per block

// One edge's force on node k, f = (dE/dr / r) v, into the lane's sums fk, and with virials
// k's half of -v f into wk.
__device__ inline void add_edge_force(double dr_over_r, const double v[3], bool virials,
                                      double fk[3], double wk[9]) {
  for (int a = 0; a < 3; ++a) {
    const double f = dr_over_r * v[a];
    fk[a] += f;
    if (virials)
      for (int b = 0; b < 3; ++b) wk[3 * b + a] -= 0.5 * v[b] * f;
  }
}

// The warp's sums (a fixed tree) added to node k by lane 0.
__device__ inline void add_node_forces(int lane, int64_t k, double fk[3], double wk[9],
                                       double* forces, double* atom_virials) {
  for (int a = 0; a < 3; ++a) fk[a] = warp_sum(fk[a]);
  if (atom_virials)
    for (int q = 0; q < 9; ++q) wk[q] = warp_sum(wk[q]);
  if (lane != 0) return;
  for (int a = 0; a < 3; ++a) forces[3 * k + a] += fk[a];
  if (atom_virials)
    for (int q = 0; q < 9; ++q) atom_virials[9 * k + q] += wk[q];
}

static_assert(kMaxWalkDensityLayers <= 32, "one bit per layer in an unsigned mask");

// The edge densities of the walk's layers in `layers` (bit q: layer q) at the edge (i, j) at
// distance r, value[q] and d/dr grad[q]: with TABLE from each layer's table (in T), else the
// basis evaluated once in double and contracted with each layer's weights. MAX_LAYERS >=
// walk.num_layers: the loops unroll, the arrays stay in registers.
template <class T, bool TABLE, int MAX_LAYERS>
__device__ __forceinline__ void walk_edge_densities(const typename Geometry<T>::View& geo,
                                                    const EdgeWalk<T>& walk, const GraphView& g,
                                                    int64_t i, int64_t j, double r, unsigned layers,
                                                    double value[MAX_LAYERS],
                                                    double grad[MAX_LAYERS]) {
  if constexpr (TABLE) {
#pragma unroll
    for (int q = 0; q < MAX_LAYERS; ++q) {
      value[q] = grad[q] = 0.0;
      if (!(layers >> q & 1u)) continue;
      const typename EdgeDensity<T>::View& d = walk.layers[q].density;
      int interval = 0;
      double t = 0.0;
      ops::radial_table_locate(r, d.origin, d.inv_step, d.intervals, d.intervals, 0, interval, t);
      if (d.pair_slot)
        interval += d.pair_slot[g.species[i] * d.num_species + g.species[j]] * d.intervals;
      T c[4];
      load_table_entry(d.table + 4 * static_cast<int64_t>(interval), c);
      const T tt = static_cast<T>(t);
      value[q] = static_cast<double>(ops::radial_table_value(c, tt));
      grad[q] = static_cast<double>(ops::radial_table_grad(c, tt, static_cast<T>(d.inv_step)));
    }
  } else {
    double emb[kMaxBasis], demb[kMaxBasis], f = 1.0, df = 0.0;
    if (geo.mace_embedding) {
      const double r0 =
          geo.pair_r0 ? geo.pair_r0[g.species[i] * geo.num_species + g.species[j]] : 1.0;
      ops::mace_edge_embedding<double>(geo.num_basis, geo.coeffs, geo.prefactor, geo.envelope,
                                       geo.transform, geo.apply_cutoff, r, r0, emb, demb, f, df);
    } else {
      ops::edge_embedding<double>(geo.num_basis, geo.coeffs, geo.prefactor, geo.envelope, r, emb,
                                  demb);
    }
#pragma unroll
    for (int q = 0; q < MAX_LAYERS; ++q) {
      value[q] = grad[q] = 0.0;
      if (layers >> q & 1u)
        ops::edge_density<double>(geo.num_basis, walk.layers[q].density.weights, emb, demb,
                                  geo.apply_cutoff, f, df, value[q], grad[q]);
    }
  }
}

// Node i's rho for each layer whose rows hold i, and its pair energy when it is an energy
// node: per layer the same per-lane sums and shuffle tree as a walk of its own.
template <class T, bool TABLE, int MAX_LAYERS>
__global__ void edge_walk_forward_kernel(typename Geometry<T>::View geo, EdgeWalk<T> walk,
                                         GraphView g) {
  int lane;
  const int64_t i = warp_node(lane);
  if (i >= g.num_nodes) return;  // the whole warp
  unsigned layers = 0;           // uniform across the warp, as i
#pragma unroll
  for (int q = 0; q < MAX_LAYERS; ++q)
    if (q < walk.num_layers && i < walk.layers[q].nodes) layers |= 1u << q;
  const bool pair = walk.pair.pair != nullptr && i < walk.pair_nodes;
  if (layers == 0 && !pair) return;  // the whole warp
  const double cutoff2 = geo.cutoff * geo.cutoff;
  double rho[MAX_LAYERS], pair_energy = 0.0;
#pragma unroll
  for (int q = 0; q < MAX_LAYERS; ++q) rho[q] = 0.0;
  for (int64_t e = g.row_offsets[i] + lane; e < g.row_offsets[i + 1]; e += kWarp) {
    const int64_t j = g.neighbors[e];
    double v[3];
    ops::edge_vector(g, i, e, v);
    const double r2 = v[0] * v[0] + v[1] * v[1] + v[2] * v[2];
    if (r2 == 0.0) continue;  // r == 0 is reported by the convolution
    const double r = sqrt(r2);
    if (layers != 0 && r2 < cutoff2) {
      double value[MAX_LAYERS], grad[MAX_LAYERS];
      walk_edge_densities<T, TABLE, MAX_LAYERS>(geo, walk, g, i, j, r, layers, value, grad);
#pragma unroll
      for (int q = 0; q < MAX_LAYERS; ++q)
        if (layers >> q & 1u) rho[q] += value[q];
    }
    if (pair && r2 < walk.pair.cutoff2) {
      double half, dhalf;
      ops::pair_repulsion_half(walk.pair, g.species[i], g.species[j], r, half, dhalf);
      pair_energy += half;
    }
  }
#pragma unroll
  for (int q = 0; q < MAX_LAYERS; ++q) {
    if (!(layers >> q & 1u)) continue;
    const double sum = warp_sum(rho[q]);
    if (lane == 0) walk.layers[q].rho[i] = sum;
  }
  if (pair) {
    const double sum = warp_sum(pair_energy);
    if (lane == 0) walk.pair_energies[i] += sum;
  }
}

// Node k takes both directed edges of each pair (k, j), which share r: dE/dr = sum over the
// layers holding k of (dE/drho_k + dE/drho_j) d(edge density)/dr (symmetric in the pair),
// plus weight x (the pair's energy nodes among k, j) x d(0.5 V)/dr for ZBL; one force
// f = (dE/dr / r) v per edge, written to node k only.
template <class T, bool TABLE, int MAX_LAYERS>
__global__ void edge_walk_backward_kernel(typename Geometry<T>::View geo, EdgeWalk<T> walk,
                                          GraphView g, double* forces, double* atom_virials) {
  int lane;
  const int64_t k = warp_node(lane);
  if (k >= g.num_nodes) return;  // the whole warp
  unsigned layers = 0;           // uniform across the warp, as k
  double grad_k[MAX_LAYERS];
#pragma unroll
  for (int q = 0; q < MAX_LAYERS; ++q) {
    grad_k[q] = 0.0;
    if (q < walk.num_layers && k < walk.layers[q].nodes) {
      layers |= 1u << q;
      grad_k[q] = walk.layers[q].grad_rho[k];
    }
  }
  const bool pair = walk.pair.pair != nullptr && k < walk.pair_nodes;
  if (layers == 0 && !pair) return;  // the whole warp
  const double cutoff2 = geo.cutoff * geo.cutoff;
  const int k_counts = k < g.num_energy_nodes ? 1 : 0;
  double fk[3] = {0, 0, 0}, wk[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t e = g.row_offsets[k] + lane; e < g.row_offsets[k + 1]; e += kWarp) {
    const int64_t j = g.neighbors[e];
    double gsum[MAX_LAYERS];
    unsigned wanted = 0;  // the layers with a nonzero dE/drho_k + dE/drho_j
#pragma unroll
    for (int q = 0; q < MAX_LAYERS; ++q) {
      gsum[q] = 0.0;
      if (!(layers >> q & 1u)) continue;
      gsum[q] = grad_k[q] + walk.layers[q].grad_rho[j];
      if (gsum[q] != 0.0) wanted |= 1u << q;
    }
    const int count = pair ? k_counts + (j < g.num_energy_nodes ? 1 : 0) : 0;
    if (wanted == 0 && count == 0) continue;
    double v[3];
    ops::edge_vector(g, k, e, v);
    const double r2 = v[0] * v[0] + v[1] * v[1] + v[2] * v[2];
    if (r2 == 0.0) continue;
    const double r = sqrt(r2);
    double dr = 0.0;  // dE/dr of the pair
    bool inside = false;
    if (wanted != 0 && r2 < cutoff2) {
      double value[MAX_LAYERS], grad[MAX_LAYERS];
      walk_edge_densities<T, TABLE, MAX_LAYERS>(geo, walk, g, k, j, r, wanted, value, grad);
#pragma unroll
      for (int q = 0; q < MAX_LAYERS; ++q)
        if (wanted >> q & 1u) dr += gsum[q] * grad[q];
      inside = true;
    }
    if (count != 0 && r2 < walk.pair.cutoff2) {
      double half, dhalf;
      ops::pair_repulsion_half(walk.pair, g.species[k], g.species[j], r, half, dhalf);
      dr += walk.pair_weight * count * dhalf;
      inside = true;
    }
    if (inside) add_edge_force(dr / r, v, atom_virials != nullptr, fk, wk);  // one division
  }
  add_node_forces(lane, k, fk, wk, forces, atom_virials);
}

template <class T>
void set_table_view(EdgeDensity<T>& d, const std::vector<const cpu::RadialTable<T>*>& tables,
                    const std::vector<int>& pair_slot, int num_species) {
  const cpu::RadialTable<T>& first = *tables.front();
  std::vector<T> all;
  all.reserve(first.coeffs.size() * tables.size());
  for (const cpu::RadialTable<T>* t : tables) {
    if (t->intervals != first.intervals || t->origin != first.origin || t->coarse_shift != 0)
      throw Error("internal: edge density pair tables on different grids");
    all.insert(all.end(), t->coeffs.begin(), t->coeffs.end());
  }
  d.table.upload(all);
  auto& v = d.view;
  v.table = d.table.data();
  v.intervals = first.intervals;
  v.origin = first.origin;
  v.inv_step = first.inv_step;
  if (!pair_slot.empty()) {
    d.pair_slot.upload(pair_slot);
    v.pair_slot = d.pair_slot.data();
    v.num_species = num_species;
  }
  // the uploads ran on the default stream; rare (load, new species pairs): wait for them
  check(cudaDeviceSynchronize(), "edge density table upload");
}

// The non-linear block's edge density of the ordered pair `pair` (receiver, sender) at r.
template <class T>
__device__ void edge_density_at(const typename Geometry<T>::View& geo,
                                const ops::RadialMlpView& mlp, int pair, double r, double& value,
                                double& grad) {
  double emb[kMaxBasis], demb[kMaxBasis], f = 1.0, df = 0.0;
  const double r0 = geo.pair_r0 ? geo.pair_r0[pair] : 1.0;
  ops::mace_edge_embedding<double>(geo.num_basis, geo.coeffs, geo.prefactor, geo.envelope,
                                   geo.transform, geo.apply_cutoff, r, r0, emb, demb, f, df);
  double work[4 * kMaxDensityMlpDim];
  double s, ds;
  ops::radial_mlp_forward(mlp, pair, emb, demb, &s, &ds, work);
  const double one = 1.0;
  ops::edge_density<double>(1, &one, &s, &ds, geo.apply_cutoff, f, df, value, grad);
}

template <class T>
__global__ void edge_density_mlp_forward_kernel(typename Geometry<T>::View geo,
                                                ops::RadialMlpView mlp, GraphView g, double* rho) {
  int lane;
  const int64_t i = warp_node(lane);
  if (i >= g.num_nodes) return;  // the whole warp
  const double cutoff2 = geo.cutoff * geo.cutoff;
  double sum = 0.0;
  for (int64_t e = g.row_offsets[i] + lane; e < g.row_offsets[i + 1]; e += kWarp) {
    double v[3];
    ops::edge_vector(g, i, e, v);
    const double r2 = v[0] * v[0] + v[1] * v[1] + v[2] * v[2];
    if (r2 >= cutoff2 || r2 == 0.0) continue;
    const int pair = g.species[i] * geo.num_species + g.species[g.neighbors[e]];
    double value, grad;
    edge_density_at<T>(geo, mlp, pair, sqrt(r2), value, grad);
    sum += value;
  }
  sum = warp_sum(sum);
  if (lane == 0) rho[i] = sum;
}

// Both directed edges of each pair at node k: dE/dr = gk d_kj/dr + gj d_jk/dr.
template <class T>
__global__ void edge_density_mlp_backward_kernel(typename Geometry<T>::View geo,
                                                 ops::RadialMlpView mlp, GraphView g,
                                                 const double* grad_rho, double* forces,
                                                 double* atom_virials) {
  int lane;
  const int64_t k = warp_node(lane);
  if (k >= g.num_nodes) return;  // the whole warp
  const double cutoff2 = geo.cutoff * geo.cutoff;
  const int S = geo.num_species;
  double fk[3] = {0, 0, 0}, wk[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t e = g.row_offsets[k] + lane; e < g.row_offsets[k + 1]; e += kWarp) {
    const int64_t j = g.neighbors[e];
    if (grad_rho[k] == 0.0 && grad_rho[j] == 0.0) continue;
    double v[3];
    ops::edge_vector(g, k, e, v);
    const double r2 = v[0] * v[0] + v[1] * v[1] + v[2] * v[2];
    if (r2 >= cutoff2 || r2 == 0.0) continue;
    const double r = sqrt(r2);
    const int kj = g.species[k] * S + g.species[j], jk = g.species[j] * S + g.species[k];
    double value, grad_kj, grad_jk;
    edge_density_at<T>(geo, mlp, kj, r, value, grad_kj);
    grad_jk = grad_kj;
    if (jk != kj) edge_density_at<T>(geo, mlp, jk, r, value, grad_jk);
    const double dr = grad_rho[k] * grad_kj + grad_rho[j] * grad_jk;
    add_edge_force(dr / r, v, atom_virials != nullptr, fk, wk);
  }
  add_node_forces(lane, k, fk, wk, forces, atom_virials);
}

template <class T>
__global__ void nonlinear_scale_forward_kernel(int64_t rows, int dim, double alpha, double beta,
                                               const double* rho, const T* a, T* z) {
  const int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (q >= rows * dim) return;
  z[q] += static_cast<T>(static_cast<double>(a[q]) / (alpha + beta * rho[q / dim]));
}

template <class T>
__global__ void nonlinear_grad_rho_kernel(int64_t rows, int64_t n, int dim, double alpha,
                                          double beta, const T* a, const T* gz, const double* rho,
                                          double* grad_rho) {
  int lane;
  const int64_t i = warp_node(lane);
  if (i >= n) return;  // the whole warp
  double s = 0.0;
  if (i < rows)
    for (int q = lane; q < dim; q += kWarp)
      s += static_cast<double>(gz[i * dim + q]) * static_cast<double>(a[i * dim + q]);
  s = warp_sum(s);
  if (lane != 0) return;
  if (i >= rows) {
    grad_rho[i] = 0.0;
    return;
  }
  const double d = alpha + beta * rho[i];
  grad_rho[i] = -beta * s / (d * d);
}

template <class T>
__global__ void nonlinear_ga_kernel(int64_t rows, int dim, double alpha, double beta,
                                    const double* rho, const T* gz, T* ga) {
  const int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (q >= rows * dim) return;
  ga[q] = static_cast<T>(static_cast<double>(gz[q]) / (alpha + beta * rho[q / dim]));
}

}  // namespace

template <class T>
void edge_density_forward(const Geometry<T>& geom, const ops::RadialMlpView& mlp,
                          const GraphView& g, double* rho, cudaStream_t stream) {
  if (g.num_nodes == 0) return;
  edge_density_mlp_forward_kernel<T>
      <<<static_cast<unsigned>(blocks_for(g.num_nodes * kWarp, kDensityThreads)), kDensityThreads,
         0, stream>>>(geom.view, mlp, g, rho);
  check_launch("edge_density_mlp_forward_kernel");
}

template <class T>
void edge_density_backward(const Geometry<T>& geom, const ops::RadialMlpView& mlp,
                           const GraphView& g, const double* grad_rho, double* forces,
                           double* atom_virials, cudaStream_t stream) {
  if (g.num_nodes == 0) return;
  edge_density_mlp_backward_kernel<T>
      <<<static_cast<unsigned>(blocks_for(g.num_nodes * kWarp, kDensityThreads)), kDensityThreads,
         0, stream>>>(geom.view, mlp, g, grad_rho, forces, atom_virials);
  check_launch("edge_density_mlp_backward_kernel");
}

template <class T>
void nonlinear_scale_forward(int64_t rows, int dim, double alpha, double beta, const double* rho,
                             const T* a, T* z, cudaStream_t stream) {
  if (rows == 0) return;
  nonlinear_scale_forward_kernel<T>
      <<<static_cast<unsigned>(blocks_for(rows * dim, 256)), 256, 0, stream>>>(rows, dim, alpha,
                                                                               beta, rho, a, z);
  check_launch("nonlinear_scale_forward_kernel");
}

template <class T>
void nonlinear_scale_backward(int64_t rows, int64_t n, int dim, double alpha, double beta,
                              const T* a, const T* gz, const double* rho, T* ga, double* grad_rho,
                              cudaStream_t stream) {
  if (n == 0) return;
  nonlinear_grad_rho_kernel<T>
      <<<static_cast<unsigned>(blocks_for(n * kWarp, kDensityThreads)), kDensityThreads, 0,
         stream>>>(rows, n, dim, alpha, beta, a, gz, rho, grad_rho);
  check_launch("nonlinear_grad_rho_kernel");
  if (rows == 0) return;
  nonlinear_ga_kernel<T><<<static_cast<unsigned>(blocks_for(rows * dim, 256)), 256, 0, stream>>>(
      rows, dim, alpha, beta, rho, gz, ga);
  check_launch("nonlinear_ga_kernel");
}

template <class T>
EdgeDensity<T> make_edge_density(const cpu::EdgeDensity<T>& host) {
  EdgeDensity<T> d;
  d.weights.upload(host.weights);
  d.view.weights = d.weights.data();
  if (!host.table.empty()) set_table_view<T>(d, {&host.table}, {}, 0);
  upload_density_tables(d, host);
  return d;
}

template <class T>
void upload_density_tables(EdgeDensity<T>& d, const cpu::EdgeDensity<T>& host) {
  if (host.pair_tables.empty()) return;
  std::vector<const cpu::RadialTable<T>*> tables;
  for (const auto& t : host.pair_tables) tables.push_back(&t);
  const int S = host.table_of ? static_cast<int>(host.table_of->atomic_numbers.size()) : 0;
  set_table_view<T>(d, tables, host.pair_table, S);
}

namespace {

// Calls launch(TABLE, MAX_LAYERS) for `walk` (std::integral_constant arguments): MAX_LAYERS the
// smallest of 2, 4, 8 that holds its layers; TABLE when they are tabulated (all or none).
template <class T, class Launch>
void dispatch_walk(const EdgeWalk<T>& walk, Launch&& launch) {
  const bool table = walk.num_layers > 0 && walk.layers[0].density.table != nullptr;
  for (int q = 0; q < walk.num_layers; ++q)
    if ((walk.layers[q].density.table != nullptr) != table)
      throw Error("internal: density layers mixing tabulated and exact edge densities");
  const auto with_max = [&](auto max) {
    if (table)
      launch(std::true_type{}, max);
    else
      launch(std::false_type{}, max);
  };
  if (walk.num_layers <= 2)
    with_max(std::integral_constant<int, 2>{});
  else if (walk.num_layers <= 4)
    with_max(std::integral_constant<int, 4>{});
  else
    with_max(std::integral_constant<int, kMaxWalkDensityLayers>{});
}

// Calls launch(TABLE, MAX_LAYERS, blocks, graph) (dispatch_walk's constants) for the nodes the
// walk visits, those of its layers and of its pair term within `g` (graph: its first rows),
// one warp per node; nothing when there are none.
template <class T, class Launch>
void launch_walk(const EdgeWalk<T>& walk, const GraphView& g, Launch&& launch) {
  int64_t nodes = walk.pair.pair ? walk.pair_nodes : 0;
  for (int q = 0; q < walk.num_layers; ++q) nodes = std::max(nodes, walk.layers[q].nodes);
  nodes = std::min(nodes, g.num_nodes);
  if (nodes <= 0) return;
  const GraphView graph = cpu::first_receivers(g, nodes);
  const auto blocks = static_cast<unsigned>(blocks_for(nodes * kWarp, kDensityThreads));
  dispatch_walk(walk, [&](auto table, auto max) { launch(table, max, blocks, graph); });
}

}  // namespace

template <class T>
void edge_walk_forward(const Geometry<T>& geom, const EdgeWalk<T>& walk, const GraphView& g,
                       cudaStream_t stream) {
  launch_walk(walk, g, [&](auto table, auto max, unsigned blocks, const GraphView& graph) {
    edge_walk_forward_kernel<T, decltype(table)::value, decltype(max)::value>
        <<<blocks, kDensityThreads, 0, stream>>>(geom.view, walk, graph);
    check_launch("edge_walk_forward_kernel");
  });
}

template <class T>
void edge_walk_backward(const Geometry<T>& geom, const EdgeWalk<T>& walk, const GraphView& g,
                        double* forces, double* atom_virials, cudaStream_t stream) {
  launch_walk(walk, g, [&](auto table, auto max, unsigned blocks, const GraphView& graph) {
    edge_walk_backward_kernel<T, decltype(table)::value, decltype(max)::value>
        <<<blocks, kDensityThreads, 0, stream>>>(geom.view, walk, graph, forces, atom_virials);
    check_launch("edge_walk_backward_kernel");
  });
}

#define E3FUSE_INSTANTIATE(T)                                                                   \
  template EdgeDensity<T> make_edge_density<T>(const cpu::EdgeDensity<T>&);                     \
  template void upload_density_tables<T>(EdgeDensity<T>&, const cpu::EdgeDensity<T>&);          \
  template void edge_walk_forward<T>(const Geometry<T>&, const EdgeWalk<T>&, const GraphView&,  \
                                     cudaStream_t);                                             \
  template void edge_walk_backward<T>(const Geometry<T>&, const EdgeWalk<T>&, const GraphView&, \
                                      double*, double*, cudaStream_t);
E3FUSE_INSTANTIATE(float)
E3FUSE_INSTANTIATE(double)
#undef E3FUSE_INSTANTIATE

#define E3FUSE_INSTANTIATE_NONLINEAR(T)                                                           \
  template void edge_density_forward<T>(const Geometry<T>&, const ops::RadialMlpView&,            \
                                        const GraphView&, double*, cudaStream_t);                 \
  template void edge_density_backward<T>(const Geometry<T>&, const ops::RadialMlpView&,           \
                                         const GraphView&, const double*, double*, double*,       \
                                         cudaStream_t);                                           \
  template void nonlinear_scale_forward<T>(int64_t, int, double, double, const double*, const T*, \
                                           T*, cudaStream_t);                                     \
  template void nonlinear_scale_backward<T>(int64_t, int64_t, int, double, double, const T*,      \
                                            const T*, const double*, T*, double*, cudaStream_t);
E3FUSE_INSTANTIATE_NONLINEAR(float)
E3FUSE_INSTANTIATE_NONLINEAR(double)
#undef E3FUSE_INSTANTIATE_NONLINEAR

}  // namespace e3fuse::cuda
