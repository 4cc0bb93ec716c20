// cuda/probe.cu: the node-level op probes of cuda/probe.h (tests only): upload,
// run one op on the default stream, synchronize, download.
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/edge_density.cuh"
#include "cuda/node_ops.cuh"
#include "cuda/pair_repulsion.cuh"
#include "cuda/probe.h"

namespace e3fuse::cuda {

namespace {

template <class T>
DeviceArray<T> to_device(const T* host, int64_t count) {
  DeviceArray<T> a;
  a.upload(host, static_cast<size_t>(count));
  return a;
}

template <class T>
void to_host(DeviceArray<T>& a, T* host, int64_t count) {
  check(cudaStreamSynchronize(nullptr), "probe: running the op");
  a.download(host, static_cast<size_t>(count));
  check(cudaStreamSynchronize(nullptr), "probe: download");
}

}  // namespace

template <class T>
void probe_linear(const cpu::Linear<T>& lin, int64_t n, const T* x, T* out, bool transpose) {
  const Linear<T> d = make_linear<T>(lin);
  const int64_t dim_src = transpose ? lin.dim_out : lin.dim_in;
  const int64_t dim_dst = transpose ? lin.dim_in : lin.dim_out;
  DeviceArray<T> dx = to_device(x, n * dim_src), dout;
  dout.resize(static_cast<size_t>(n * dim_dst));
  if (transpose)
    linear_backward(d, n, dx.data(), dout.data(), false, nullptr);
  else
    linear_forward(d, n, dx.data(), dout.data(), nullptr);
  to_host(dout, out, n * dim_dst);
}

template <class T>
void probe_gate(const cpu::Gate<T>& gate, int64_t n, const T* x, const ProbeArg<T>* grad_out,
                T* out) {
  const Gate<T> d = make_gate<T>(gate);
  DeviceArray<T> dx = to_device(x, n * d.dim_in), dout;
  if (grad_out) {
    DeviceArray<T> dg = to_device(grad_out, n * d.dim_out);
    dout.resize(static_cast<size_t>(n * d.dim_in));
    gate_backward(d, n, dx.data(), dg.data(), dout.data(), nullptr);
    to_host(dout, out, n * d.dim_in);
  } else {
    dout.resize(static_cast<size_t>(n * d.dim_out));
    gate_forward(d, n, dx.data(), dout.data(), nullptr);
    to_host(dout, out, n * d.dim_out);
  }
}

template <class T>
void probe_element_linear(const cpu::ElementLinear<T>& lin, int64_t n, const int32_t* species,
                          const T* x, T* out, bool transpose) {
  const ElementLinear<T> d = make_element_linear<T>(lin);
  const int64_t dim_src = transpose ? lin.dim_out : lin.dim_in;
  const int64_t dim_dst = transpose ? lin.dim_in : lin.dim_out;
  DeviceArray<int32_t> ds = to_device(species, n);
  DeviceArray<T> dx = to_device(x, n * dim_src), dout;
  dout.resize(static_cast<size_t>(n * dim_dst));
  if (transpose)
    element_linear_backward(d, n, ds.data(), dx.data(), dout.data(), false, nullptr);
  else
    element_linear_forward(d, n, ds.data(), dx.data(), dout.data(), nullptr);
  to_host(dout, out, n * dim_dst);
}

template <class T>
void probe_symmetric_contraction(const cpu::SymmetricContraction<T>& sc, int64_t n,
                                 const int32_t* species, const T* x, const ProbeArg<T>* grad_out,
                                 T* out) {
  const SymmetricContraction<T> d = make_symmetric_contraction<T>(sc);
  DeviceArray<int32_t> ds = to_device(species, n);
  DeviceArray<T> dx = to_device(x, n * d.dim_in), dout;
  if (grad_out) {
    DeviceArray<T> dg = to_device(grad_out, n * d.dim_out);
    dout.resize(static_cast<size_t>(n * d.dim_in));
    dout.zero();  // entries outside the contraction's input blocks stay 0
    symmetric_contraction_backward(d, n, ds.data(), dx.data(), dg.data(), dout.data(), nullptr);
    to_host(dout, out, n * d.dim_in);
  } else {
    dout.resize(static_cast<size_t>(n * d.dim_out));
    dout.zero();
    symmetric_contraction_forward(d, n, ds.data(), dx.data(), dout.data(), nullptr);
    to_host(dout, out, n * d.dim_out);
  }
}

void probe_pair_repulsion(const ModelPlan& plan, const GraphView& g, double weight,
                          double* energies, double* forces, double* atom_virials) {
  const int64_t n = g.num_nodes;
  const int64_t edges = n > 0 ? g.row_offsets[n] : 0;
  PairRepulsion zbl;
  zbl.upload(plan);
  if (!zbl.enabled()) throw Error("probe: the model has no pair repulsion");
  DeviceArray<double> positions = to_device(g.positions, 3 * n);
  DeviceArray<int32_t> species = to_device(g.species, n);
  DeviceArray<int64_t> row_offsets = to_device(g.row_offsets, n + 1);
  DeviceArray<int32_t> neighbors = to_device(g.neighbors, edges);
  DeviceArray<int32_t> shift_index;
  DeviceArray<double> shifts;
  GraphView d = g;
  d.positions = positions.data();
  d.species = species.data();
  d.row_offsets = row_offsets.data();
  d.neighbors = neighbors.data();
  d.num_edges = edges;
  d.layer_rows = nullptr;
  if (g.shift_index) {
    int32_t max_shift = -1;
    for (int64_t e = 0; e < edges; ++e) max_shift = std::max(max_shift, g.shift_index[e]);
    shift_index = to_device(g.shift_index, edges);
    shifts = to_device(g.shifts, 3 * static_cast<int64_t>(max_shift + 1));
    d.shift_index = shift_index.data();
    d.shifts = shifts.data();
  }
  DeviceArray<double> e, f, w;
  e.resize(static_cast<size_t>(n));
  f.resize(static_cast<size_t>(3 * n));
  w.resize(static_cast<size_t>(9 * n));
  e.zero();
  f.zero();
  w.zero();
  EdgeWalk<double> walk;  // the engine's edge walks with no density layer
  walk.pair = zbl.view();
  walk.pair_nodes = g.num_energy_nodes;
  walk.pair_energies = e.data();
  Geometry<double> no_density;
  edge_walk_forward(no_density, walk, d, nullptr);
  walk.pair_nodes = n;
  walk.pair_weight = weight;
  edge_walk_backward(no_density, walk, d, f.data(), w.data(), nullptr);
  to_host(e, energies, n);
  to_host(f, forces, 3 * n);
  to_host(w, atom_virials, 9 * n);
}

#define E3FUSE_INSTANTIATE(T)                                                                  \
  template void probe_linear<T>(const cpu::Linear<T>&, int64_t, const T*, T*, bool);           \
  template void probe_gate<T>(const cpu::Gate<T>&, int64_t, const T*, const T*, T*);           \
  template void probe_element_linear<T>(const cpu::ElementLinear<T>&, int64_t, const int32_t*, \
                                        const T*, T*, bool);                                   \
  template void probe_symmetric_contraction<T>(const cpu::SymmetricContraction<T>&, int64_t,   \
                                               const int32_t*, const T*, const T*, T*);
E3FUSE_INSTANTIATE(float)
E3FUSE_INSTANTIATE(double)
#undef E3FUSE_INSTANTIATE

}  // namespace e3fuse::cuda
