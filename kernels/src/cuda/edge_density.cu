// cuda/edge_density.cu: mace's density blocks on the GPU (RealAgnosticDensity[Residual]-
// InteractionBlock): the neighbor density rho_i, the division of the convolution by
// 1 + rho_i, and their adjoints. Same math as cpu/edge_density.cpp (ops::edge_density, in
// double), one warp per node (lanes take its edges in turn, the partial sums meet in a
// fixed shuffle tree); the backward takes both directed edges of each pair at each end and
// writes to that node only, so no atomics and a fixed summation order. One thread per node
// measured 2.2 ms per MACE-OMAT-0-arch. call at 864 atoms on an H100 (latency of its serial
// double-precision edge loop, 864 threads).
#include "cuda/conv.cuh"
#include "ops/edge_vector.h"
#include "ops/radial.h"
#include "ops/radial_mlp.h"

namespace e3fuse::cuda {

namespace {

constexpr int kDensityThreads = 128;  // 4 nodes per block

// The edge density of the edge (i, j) at distance r, and its r-derivative.
template <class T>
__device__ void density_of_edge(const typename Geometry<T>::View& geo, const double* w,
                                const GraphView& g, int64_t i, int64_t j, double r, double& value,
                                double& grad) {
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
  ops::edge_density<double>(geo.num_basis, w, emb, demb, geo.apply_cutoff, f, df, value, grad);
}

template <class T>
__global__ void edge_density_forward_kernel(typename Geometry<T>::View geo, const double* w,
                                            GraphView g, double* rho) {
  int lane;
  const int64_t i = warp_node(lane);
  if (i >= g.num_nodes) return;  // the whole warp
  const double cutoff2 = geo.cutoff * geo.cutoff;
  double sum = 0.0;
  for (int64_t e = g.row_offsets[i] + lane; e < g.row_offsets[i + 1]; e += kWarp) {
    double v[3];
    ops::edge_vector(g, i, e, v);
    const double r2 = v[0] * v[0] + v[1] * v[1] + v[2] * v[2];
    if (r2 >= cutoff2 || r2 == 0.0) continue;  // r == 0 is reported by the convolution
    double value, grad;
    density_of_edge<T>(geo, w, g, i, g.neighbors[e], sqrt(r2), value, grad);
    sum += value;
  }
  sum = warp_sum(sum);
  if (lane == 0) rho[i] = sum;
}

template <class T>
__global__ void edge_density_backward_kernel(typename Geometry<T>::View geo, const double* w,
                                             GraphView g, const double* grad_rho, double* forces,
                                             double* atom_virials) {
  int lane;
  const int64_t k = warp_node(lane);
  if (k >= g.num_nodes) return;  // the whole warp
  const double cutoff2 = geo.cutoff * geo.cutoff;
  double fk[3] = {0, 0, 0}, wk[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t e = g.row_offsets[k] + lane; e < g.row_offsets[k + 1]; e += kWarp) {
    const int64_t j = g.neighbors[e];
    const double gsum = grad_rho[k] + grad_rho[j];
    if (gsum == 0.0) continue;
    double v[3];
    ops::edge_vector(g, k, e, v);
    const double r2 = v[0] * v[0] + v[1] * v[1] + v[2] * v[2];
    if (r2 >= cutoff2 || r2 == 0.0) continue;
    const double r = sqrt(r2);
    double value, grad;
    density_of_edge<T>(geo, w, g, k, j, r, value, grad);
    const double dr = gsum * grad;
    for (int a = 0; a < 3; ++a) {
      const double f = dr * v[a] / r;
      fk[a] += f;
      if (atom_virials)
        for (int b = 0; b < 3; ++b) wk[3 * b + a] -= 0.5 * v[b] * f;
    }
  }
  for (int a = 0; a < 3; ++a) fk[a] = warp_sum(fk[a]);
  if (atom_virials)
    for (int q = 0; q < 9; ++q) wk[q] = warp_sum(wk[q]);
  if (lane != 0) return;
  for (int a = 0; a < 3; ++a) forces[3 * k + a] += fk[a];
  if (atom_virials)
    for (int q = 0; q < 9; ++q) atom_virials[9 * k + q] += wk[q];
}

template <class T>
__global__ void density_scale_forward_kernel(int64_t rows, int dim, const double* rho, T* y) {
  const int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (q >= rows * dim) return;
  y[q] = static_cast<T>(static_cast<double>(y[q]) / (1.0 + rho[q / dim]));
}

template <class T>
__global__ void density_grad_rho_kernel(int64_t rows, int64_t n, int dim, const T* m, const T* gm,
                                        const double* rho, double* grad_rho) {
  int lane;
  const int64_t i = warp_node(lane);
  if (i >= n) return;  // the whole warp
  double s = 0.0;
  if (i < rows)
    for (int q = lane; q < dim; q += kWarp)
      s += static_cast<double>(m[i * dim + q]) * static_cast<double>(gm[i * dim + q]);
  s = warp_sum(s);
  if (lane == 0) grad_rho[i] = i < rows ? -s / (1.0 + rho[i]) : 0.0;
}

// The non-linear block's edge density of the ordered pair `pair` (receiver, sender) at r.
template <class T>
__device__ void density_of_edge(const typename Geometry<T>::View& geo,
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
    density_of_edge<T>(geo, mlp, pair, sqrt(r2), value, grad);
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
    density_of_edge<T>(geo, mlp, kj, r, value, grad_kj);
    grad_jk = grad_kj;
    if (jk != kj) density_of_edge<T>(geo, mlp, jk, r, value, grad_jk);
    const double dr = grad_rho[k] * grad_kj + grad_rho[j] * grad_jk;
    for (int a = 0; a < 3; ++a) {
      const double f = dr * v[a] / r;
      fk[a] += f;
      if (atom_virials)
        for (int b = 0; b < 3; ++b) wk[3 * b + a] -= 0.5 * v[b] * f;
    }
  }
  for (int a = 0; a < 3; ++a) fk[a] = warp_sum(fk[a]);
  if (atom_virials)
    for (int q = 0; q < 9; ++q) wk[q] = warp_sum(wk[q]);
  if (lane != 0) return;
  for (int a = 0; a < 3; ++a) forces[3 * k + a] += fk[a];
  if (atom_virials)
    for (int q = 0; q < 9; ++q) atom_virials[9 * k + q] += wk[q];
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
void edge_density_forward(const Geometry<T>& geom, const double* weights, const GraphView& g,
                          double* rho, cudaStream_t stream) {
  if (g.num_nodes == 0) return;
  edge_density_forward_kernel<T>
      <<<static_cast<unsigned>(blocks_for(g.num_nodes * kWarp, kDensityThreads)), kDensityThreads,
         0, stream>>>(geom.view, weights, g, rho);
  check_launch("edge_density_forward_kernel");
}

template <class T>
void edge_density_backward(const Geometry<T>& geom, const double* weights, const GraphView& g,
                           const double* grad_rho, double* forces, double* atom_virials,
                           cudaStream_t stream) {
  if (g.num_nodes == 0) return;
  edge_density_backward_kernel<T>
      <<<static_cast<unsigned>(blocks_for(g.num_nodes * kWarp, kDensityThreads)), kDensityThreads,
         0, stream>>>(geom.view, weights, g, grad_rho, forces, atom_virials);
  check_launch("edge_density_backward_kernel");
}

template <class T>
void density_scale_forward(int64_t rows, int dim, const double* rho, T* y, cudaStream_t stream) {
  if (rows == 0) return;
  density_scale_forward_kernel<T>
      <<<static_cast<unsigned>(blocks_for(rows * dim, 256)), 256, 0, stream>>>(rows, dim, rho, y);
  check_launch("density_scale_forward_kernel");
}

template <class T>
void density_scale_backward(int64_t rows, int64_t n, int dim, const T* m, const T* gm,
                            const double* rho, int gy_dim, T* gy, double* grad_rho,
                            cudaStream_t stream) {
  if (n == 0) return;
  density_grad_rho_kernel<T><<<static_cast<unsigned>(blocks_for(n * kWarp, kDensityThreads)),
                               kDensityThreads, 0, stream>>>(rows, n, dim, m, gm, rho, grad_rho);
  check_launch("density_grad_rho_kernel");
  density_scale_forward<T>(rows, gy_dim, rho, gy, stream);  // dE/dS = dE/dy / (1 + rho)
}

#define E3FUSE_INSTANTIATE(T)                                                                 \
  template void edge_density_forward<T>(const Geometry<T>&, const double*, const GraphView&,  \
                                        double*, cudaStream_t);                               \
  template void edge_density_backward<T>(const Geometry<T>&, const double*, const GraphView&, \
                                         const double*, double*, double*, cudaStream_t);      \
  template void density_scale_forward<T>(int64_t, int, const double*, T*, cudaStream_t);      \
  template void density_scale_backward<T>(int64_t, int64_t, int, const T*, const T*,          \
                                          const double*, int, T*, double*, cudaStream_t);
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
