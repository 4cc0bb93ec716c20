// cuda/mace.cu: MACE's element-dependent linear (skip_tp) and symmetric contraction
// (product basis, Batatia et al. eq. 10-11), forward and adjoint with respect to
// node features: the GPU version of cpu/symmetric_contraction.cpp.
//
//   out[c][m] = sum_g W[s][g][c] * prod_{j=1..nu_g} x[c][i_j(g)]
//
// with the weights contracted into the coupling coefficients at load time (one group g
// per distinct product, see SymmetricContraction in node_ops.cuh): layer 0 of
// MACE-MP-0 medium has 1,970 rows (m, i_1..i_nu, k) but 416 distinct products.
//
// One thread per (node n, channel c), c fastest, so that the weights W[s][g][c] are read
// coalesced and every thread walks the same groups (broadcast reads, no divergence). Each
// thread keeps its gathered xt[i] = x[c][i] (and grad_xt[i]) in dynamic shared memory laid
// out [slot][thread] (bank-conflict free, no synchronisation needed), which allows the
// groups' data-dependent indices. The sums run in a fixed order: deterministic, but not the
// CPU's order (the CPU sums the rows).
//
// mace's density blocks divide the contraction's input by 1 + rho per node (RowDensity in
// node_ops.cuh): the kernels scale each value as they load it and, in the backward, scale
// the adjoint they write and leave per-warp partial sums of dE/drho, so that the message
// rows are read and written once per direction (no passes of their own, no stored copy).
#include <algorithm>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda/node_ops.cuh"

namespace e3fuse::cuda {

namespace {

constexpr size_t kDefaultSharedBytes = 48 * 1024;
constexpr int kMaxCorrelation = 4;  // factors per product packed in one 32-bit word

// The NU factors of one product: slots of xt (slot num_ell holds 1).
template <int NU>
__device__ __forceinline__ void product_slots(uint32_t factors, int slot[NU]) {
#pragma unroll
  for (int j = 0; j < NU; ++j) slot[j] = (factors >> (8 * j)) & 255u;
}

template <class T, int NU>
__global__ void sc_forward_kernel(
    int64_t num_nodes, int C, int num_ell, int num_groups, int64_t dim_in, int64_t dim_out,
    int num_contractions, const int64_t* __restrict__ ell_offset,
    const int32_t* __restrict__ ell_stride, const ScContraction* __restrict__ contractions,
    const int32_t* __restrict__ group_begin, const uint32_t* __restrict__ factors,
    const T* __restrict__ weights, const int32_t* __restrict__ species, const T* __restrict__ x,
    const double* __restrict__ rho, T* __restrict__ out) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int bd = blockDim.x;
  T* xt = reinterpret_cast<T*>(smem_raw) + threadIdx.x;  // xt[i * bd]: m[c][i], xt[num_ell] = 1
  const int64_t t = static_cast<int64_t>(blockIdx.x) * bd + threadIdx.x;
  if (t >= num_nodes * C) return;
  const int c = static_cast<int>(t % C);
  const int64_t n = t / C;
  const T* xn = x + n * dim_in;
  const T scale = rho ? static_cast<T>(1.0 / (1.0 + rho[n])) : T(1);  // m = x * scale
  for (int i = 0; i < num_ell; ++i) {
    const T v = xn[ell_offset[i] + static_cast<int64_t>(c) * ell_stride[i]];
    xt[i * bd] = rho ? v * scale : v;
  }
  xt[num_ell * bd] = T(1);
  const T* W = weights + static_cast<int64_t>(species[n]) * num_groups * C + c;  // W[g * C]
  T* on = out + n * dim_out;
  for (int q = 0; q < num_contractions; ++q) {
    const ScContraction con = contractions[q];
    for (int m = 0; m < con.d; ++m) {
      T sum = T(0);
      for (int g = group_begin[con.m_at + m]; g < group_begin[con.m_at + m + 1]; ++g) {
        int slot[NU];
        product_slots<NU>(__ldg(factors + g), slot);
        T prod = W[static_cast<int64_t>(g) * C];
#pragma unroll
        for (int j = 0; j < NU; ++j) prod *= xt[slot[j] * bd];
        sum += prod;
      }
      on[con.out_offset + static_cast<int64_t>(c) * con.d + m] = sum;
    }
  }
}

// grad_x may be x (in place): each thread reads its own elements of x before it writes
// the same elements of grad_x, and no other thread touches them.
// With rho (density blocks, m = x * scale): grad_x = dE/dm * scale, and the thread's share
// dE/dm . m of its node's -dE/drho * (1 + rho) goes to partials: summed over the warp when
// C % kWarp == 0 (a warp then lies within one node: t counts from a multiple of 32, blocks
// are whole warps, and num_nodes * C is a multiple of 32, so whole warps return), else
// one per thread; density_grad_kernel adds them up per node.
template <class T, int NU>
__global__ void sc_backward_kernel(
    int64_t num_nodes, int C, int num_ell, int num_groups, int64_t dim_in, int64_t dim_out,
    int num_contractions, const int64_t* __restrict__ ell_offset,
    const int32_t* __restrict__ ell_stride, const ScContraction* __restrict__ contractions,
    const int32_t* __restrict__ group_begin, const uint32_t* __restrict__ factors,
    const T* __restrict__ weights, const int32_t* __restrict__ species, const T* x,
    const double* __restrict__ rho, const T* __restrict__ grad_out, T* grad_x,
    double* __restrict__ partials) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int bd = blockDim.x;
  T* xt = reinterpret_cast<T*>(smem_raw) + threadIdx.x;  // xt[i * bd]: m[c][i], xt[num_ell] = 1
  T* gxt = xt + static_cast<int64_t>(num_ell + 1) * bd;  // gxt[i * bd]: dE/dm[c][i]
  const int64_t t = static_cast<int64_t>(blockIdx.x) * bd + threadIdx.x;
  if (t >= num_nodes * C) return;
  const int c = static_cast<int>(t % C);
  const int64_t n = t / C;
  const T* xn = x + n * dim_in;
  const T scale = rho ? static_cast<T>(1.0 / (1.0 + rho[n])) : T(1);  // m = x * scale
  for (int i = 0; i < num_ell; ++i) {
    const T v = xn[ell_offset[i] + static_cast<int64_t>(c) * ell_stride[i]];
    xt[i * bd] = rho ? v * scale : v;
    gxt[i * bd] = T(0);
  }
  xt[num_ell * bd] = T(1);
  gxt[num_ell * bd] = T(0);  // collects the (unused) adjoint of the constant slot
  const T* W = weights + static_cast<int64_t>(species[n]) * num_groups * C + c;
  const T* gn = grad_out + n * dim_out;
  for (int q = 0; q < num_contractions; ++q) {
    const ScContraction con = contractions[q];
    for (int m = 0; m < con.d; ++m) {
      const T gm = gn[con.out_offset + static_cast<int64_t>(c) * con.d + m];
      for (int g = group_begin[con.m_at + m]; g < group_begin[con.m_at + m + 1]; ++g) {
        int slot[NU];
        product_slots<NU>(__ldg(factors + g), slot);
        T f[NU];
#pragma unroll
        for (int j = 0; j < NU; ++j) f[j] = xt[slot[j] * bd];
        const T base = W[static_cast<int64_t>(g) * C] * gm;
#pragma unroll
        for (int j = 0; j < NU; ++j) {  // d/dx[i_j]: the product of the other factors
          T part = base;
#pragma unroll
          for (int p = 0; p < NU; ++p)
            if (p != j) part *= f[p];
          gxt[slot[j] * bd] += part;
        }
      }
    }
  }
  T* gx = grad_x + n * dim_in;
  if (!rho) {
    for (int i = 0; i < num_ell; ++i)
      gx[ell_offset[i] + static_cast<int64_t>(c) * ell_stride[i]] = gxt[i * bd];
    return;
  }
  double dot = 0.0;  // dE/dm . m over this thread's components
  for (int i = 0; i < num_ell; ++i) {
    const T g = gxt[i * bd];
    dot += static_cast<double>(g) * static_cast<double>(xt[i * bd]);
    gx[ell_offset[i] + static_cast<int64_t>(c) * ell_stride[i]] = g * scale;
  }
  if (C % kWarp == 0) {
    dot = warp_sum(dot);
    if (threadIdx.x % kWarp == 0) partials[t / kWarp] = dot;
  } else {
    partials[t] = dot;
  }
}

// One thread per node: grad_rho[i] = -(its partials' sum, in order) / (1 + rho[i]) for
// i < rows, 0 for rows <= i < n (mace's m = P(Z) / (1 + rho): dE/drho = -dE/dm . m / (1 + rho)).
__global__ void density_grad_kernel(int64_t rows, int64_t n, int per_node,
                                    const double* __restrict__ rho,
                                    const double* __restrict__ partials,
                                    double* __restrict__ grad_rho) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (i >= rows) {
    grad_rho[i] = 0.0;
    return;
  }
  const double* p = partials + i * per_node;
  double s = 0.0;
  for (int q = 0; q < per_node; ++q) s += p[q];
  grad_rho[i] = -s / (1.0 + rho[i]);
}

// f(std::integral_constant<int, NU>{}) for the correlation order nu (1..4).
template <class F>
void with_correlation(int nu, F&& f) {
  with_int_constant<1, 2, 3, 4>(nu, static_cast<F&&>(f));
}

// Threads per block such that `slots` values of T per thread fit in the default
// 48 KiB of dynamic shared memory; beyond that, 32 threads and an opt-in.
template <class T, class Kernel>
int sc_block(Kernel kernel, int slots, size_t& bytes) {
  for (int threads : {128, 64, 32}) {
    bytes = static_cast<size_t>(slots) * threads * sizeof(T);
    if (bytes <= kDefaultSharedBytes) return threads;
  }
  raise_dynamic_shared_limit(reinterpret_cast<const void*>(kernel), bytes,
                             "symmetric contraction: shared memory per block");
  return 32;
}

}  // namespace

// ---------------------------------------------------------------------------------
// Element-dependent linear: the linear kernel with one table per species (one table shared
// by all species: the plain linear kernel, no species).
// ---------------------------------------------------------------------------------

template <class T>
ElementLinear<T> make_element_linear(const cpu::ElementLinear<T>& host) {
  ElementLinear<T> lin;
  lin.dim_in = host.dim_in;
  lin.dim_out = host.dim_out;
  lin.num_species = static_cast<int>(host.per_species.size());
  std::vector<const cpu::Linear<T>*> layers;
  for (const auto& l : host.per_species) {
    if (l.dim_in != host.dim_in || l.dim_out != host.dim_out) {
      throw Error("internal: element linear layers of different dimensions");
    }
    layers.push_back(&l);
  }
  detail::build_linear_tables<T>(layers, false, lin.tables);  // no biases, as on the CPU
  return lin;
}

template <class T>
void element_linear_forward(const ElementLinear<T>& lin, int64_t num_nodes, const int32_t* species,
                            const T* x, T* out, cudaStream_t stream) {
  detail::run_linear_tables(lin.tables, lin.dim_in, lin.dim_out, false, num_nodes,
                            lin.num_species == 1 ? nullptr : species, false, x, out, stream);
}

template <class T>
void element_linear_backward(const ElementLinear<T>& lin, int64_t num_nodes, const int32_t* species,
                             const T* grad_out, T* grad_x, bool accumulate, cudaStream_t stream) {
  detail::run_linear_tables(lin.tables, lin.dim_in, lin.dim_out, true, num_nodes,
                            lin.num_species == 1 ? nullptr : species, accumulate, grad_out, grad_x,
                            stream);
}

// ---------------------------------------------------------------------------------
// Symmetric contraction
// ---------------------------------------------------------------------------------

template <class T>
SymmetricContraction<T> make_symmetric_contraction(const cpu::SymmetricContraction<T>& host) {
  SymmetricContraction<T> sc;
  sc.dim_in = host.dim_in;
  sc.dim_out = host.dim_out;
  sc.C = host.C;
  sc.num_ell = host.num_ell;
  sc.num_contractions = static_cast<int>(host.contractions.size());
  if (static_cast<int>(host.ell_offset.size()) != host.num_ell ||
      static_cast<int>(host.ell_stride.size()) != host.num_ell) {
    throw Error("internal: symmetric contraction ell tables of the wrong size");
  }
  if (host.num_ell + 1 > 255)
    throw Error("the CUDA backend supports symmetric contractions of at most 254 components");
  int num_species = -1;
  for (const auto& con : host.contractions)
    for (const auto& t : con.terms) {
      if (t.nu < 1 || static_cast<int64_t>(t.index.size()) != t.rows * (t.nu + 2) ||
          static_cast<int64_t>(t.values.size()) != t.rows || t.num_params < 1 ||
          t.weights.size() % (static_cast<size_t>(t.num_params) * host.C) != 0) {
        throw Error("internal: inconsistent symmetric contraction term");
      }
      if (t.nu > kMaxCorrelation)
        throw Error("the CUDA backend supports correlation orders up to " +
                    std::to_string(kMaxCorrelation));
      const int s =
          static_cast<int>(t.weights.size() / (static_cast<size_t>(t.num_params) * host.C));
      if (num_species >= 0 && s != num_species)
        throw Error("internal: symmetric contraction terms of different species counts");
      num_species = s;
      sc.max_nu = std::max(sc.max_nu, t.nu);
    }
  // One group per distinct (m, product); its rows (term, k, value) are summed into the
  // group's weight below. Groups are ordered by m, then by first appearance.
  struct Row {
    const typename cpu::SymmetricContraction<T>::Term* term;
    int32_t k;
    double value;
  };
  struct Group {
    int32_t m;
    uint32_t factors;
    std::vector<Row> rows;
  };
  std::vector<ScContraction> contractions;
  std::vector<int32_t> group_begin;
  std::vector<Group> groups;
  for (const auto& con : host.contractions) {
    if (con.out_offset + static_cast<int64_t>(host.C) * con.d > host.dim_out) {
      throw Error("internal: symmetric contraction output out of range");
    }
    std::vector<Group> mine;
    std::map<std::pair<int32_t, uint32_t>, size_t> where;
    for (const auto& t : con.terms) {
      for (int64_t r = 0; r < t.rows; ++r) {
        const int32_t* row = t.index.data() + r * (t.nu + 2);
        bool ok =
            row[0] >= 0 && row[0] < con.d && row[t.nu + 1] >= 0 && row[t.nu + 1] < t.num_params;
        uint32_t factors = 0;
        for (int j = 0; j < sc.max_nu; ++j) {
          const int32_t i = j < t.nu ? row[j + 1] : host.num_ell;
          ok = ok && i >= 0 && (i < host.num_ell || j >= t.nu);
          factors |= static_cast<uint32_t>(i) << (8 * j);
        }
        if (!ok) throw Error("internal: symmetric contraction index out of range");
        const auto key = std::make_pair(row[0], factors);
        auto [it, added] = where.emplace(key, mine.size());
        if (added) mine.push_back({row[0], factors, {}});
        mine[it->second].rows.push_back({&t, row[t.nu + 1], static_cast<double>(t.values[r])});
      }
    }
    std::stable_sort(mine.begin(), mine.end(),
                     [](const Group& a, const Group& b) { return a.m < b.m; });
    ScContraction q;
    q.out_offset = con.out_offset;
    q.d = con.d;
    q.m_at = static_cast<int32_t>(group_begin.size());
    sc.max_d = std::max(sc.max_d, con.d);
    size_t g = 0;
    for (int m = 0; m <= con.d; ++m) {
      while (g < mine.size() && mine[g].m < m) ++g;
      group_begin.push_back(static_cast<int32_t>(groups.size() + g));
    }
    for (auto& grp : mine) groups.push_back(std::move(grp));
    contractions.push_back(q);
  }
  sc.num_groups = static_cast<int>(groups.size());
  const int S = std::max(num_species, 0);
  std::vector<uint32_t> factors(groups.size());
  std::vector<T> weights(static_cast<size_t>(S) * groups.size() * host.C);
  for (size_t g = 0; g < groups.size(); ++g) {
    factors[g] = groups[g].factors;
    for (int s = 0; s < S; ++s)
      for (int c = 0; c < host.C; ++c) {
        double w = 0.0;
        for (const Row& r : groups[g].rows)
          w += r.value *
               static_cast<double>(
                   r.term
                       ->weights[(static_cast<size_t>(s) * r.term->num_params + r.k) * host.C + c]);
        weights[(static_cast<size_t>(s) * groups.size() + g) * host.C + c] = static_cast<T>(w);
      }
  }
  sc.ell_offset.upload(host.ell_offset);
  sc.ell_stride.upload(std::vector<int32_t>(host.ell_stride.begin(), host.ell_stride.end()));
  sc.contractions.upload(contractions);
  sc.group_begin.upload(group_begin);
  sc.factors.upload(factors);
  sc.weights.upload(weights);
  check(cudaStreamSynchronize(nullptr), "symmetric contraction upload");
  return sc;
}

template <class T>
void symmetric_contraction_forward(const SymmetricContraction<T>& sc, int64_t num_nodes,
                                   const int32_t* species, const T* x, T* out, cudaStream_t stream,
                                   const RowDensity& density) {
  const int64_t work = num_nodes * sc.C;
  if (work <= 0) return;
  with_correlation(sc.max_nu, [&](auto nu) {
    auto kernel = sc_forward_kernel<T, decltype(nu)::value>;
    size_t bytes = 0;
    const int threads = sc_block<T>(kernel, sc.num_ell + 1, bytes);
    kernel<<<static_cast<unsigned>(blocks_for(work, threads)), threads, bytes, stream>>>(
        num_nodes, sc.C, sc.num_ell, sc.num_groups, sc.dim_in, sc.dim_out, sc.num_contractions,
        sc.ell_offset.data(), sc.ell_stride.data(), sc.contractions.data(), sc.group_begin.data(),
        sc.factors.data(), sc.weights.data(), species, x, density.rho, out);
  });
  check_launch("sc_forward_kernel");
}

template <class T>
void symmetric_contraction_backward(const SymmetricContraction<T>& sc, int64_t num_nodes,
                                    const int32_t* species, const T* x, const T* grad_out,
                                    T* grad_x, cudaStream_t stream, const RowDensity& density) {
  if (density.rho && (!density.grad_rho || !density.partials || density.nodes < num_nodes))
    throw Error("internal: the symmetric contraction's density adjoint without its buffers");
  const int64_t work = num_nodes * sc.C;
  if (work > 0) {
    with_correlation(sc.max_nu, [&](auto nu) {
      auto kernel = sc_backward_kernel<T, decltype(nu)::value>;
      size_t bytes = 0;
      const int threads = sc_block<T>(kernel, 2 * (sc.num_ell + 1), bytes);
      kernel<<<static_cast<unsigned>(blocks_for(work, threads)), threads, bytes, stream>>>(
          num_nodes, sc.C, sc.num_ell, sc.num_groups, sc.dim_in, sc.dim_out, sc.num_contractions,
          sc.ell_offset.data(), sc.ell_stride.data(), sc.contractions.data(), sc.group_begin.data(),
          sc.factors.data(), sc.weights.data(), species, x, density.rho, grad_out, grad_x,
          density.partials);
    });
    check_launch("sc_backward_kernel");
  }
  if (density.rho && density.nodes > 0) {
    constexpr int kGradThreads = 256;
    density_grad_kernel<<<static_cast<unsigned>(blocks_for(density.nodes, kGradThreads)),
                          kGradThreads, 0, stream>>>(num_nodes, density.nodes,
                                                     sc_density_partials(sc), density.rho,
                                                     density.partials, density.grad_rho);
    check_launch("density_grad_kernel");
  }
}

#define E3FUSE_INSTANTIATE(T)                                                                \
  template ElementLinear<T> make_element_linear<T>(const cpu::ElementLinear<T>&);            \
  template void element_linear_forward<T>(const ElementLinear<T>&, int64_t, const int32_t*,  \
                                          const T*, T*, cudaStream_t);                       \
  template void element_linear_backward<T>(const ElementLinear<T>&, int64_t, const int32_t*, \
                                           const T*, T*, bool, cudaStream_t);                \
  template SymmetricContraction<T> make_symmetric_contraction<T>(                            \
      const cpu::SymmetricContraction<T>&);                                                  \
  template void symmetric_contraction_forward<T>(const SymmetricContraction<T>&, int64_t,    \
                                                 const int32_t*, const T*, T*, cudaStream_t, \
                                                 const RowDensity&);                         \
  template void symmetric_contraction_backward<T>(const SymmetricContraction<T>&, int64_t,   \
                                                  const int32_t*, const T*, const T*, T*,    \
                                                  cudaStream_t, const RowDensity&);
E3FUSE_INSTANTIATE(float)
E3FUSE_INSTANTIATE(double)
#undef E3FUSE_INSTANTIATE

}  // namespace e3fuse::cuda
