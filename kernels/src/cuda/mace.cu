// cuda/mace.cu: MACE's element-dependent linear (skip_tp) and symmetric contraction
// (product basis, Batatia et al. eq. 10-11), forward and adjoint with respect to
// node features: the GPU version of cpu/symmetric_contraction.cpp.
//
//   out[c][m] = sum_terms sum_rows value * W[s][k][c] * prod_{j=1..nu} x[c][i_j]
//
// Symmetric contraction: one thread per (node n, channel c), c fastest, so that the
// weights W[s][k][c] are read coalesced and every thread walks the same sparse rows
// (broadcast reads, no divergence). Each thread keeps its private vectors (the
// gathered xt[i] = x[c][i], and acc[m] or grad_xt[i]) in dynamic shared memory laid
// out [slot][thread] (bank-conflict free, no synchronisation needed), which allows
// the rows' data-dependent indices. Rows are visited in the CPU's order, so every
// sum is accumulated in the same order as on the CPU.
#include <algorithm>
#include <vector>

#include "cuda/node_ops.cuh"

namespace e3fuse::cuda {

namespace {

constexpr size_t kDefaultSharedBytes = 48 * 1024;

template <class T>
__global__ void sc_forward_kernel(
    int64_t num_nodes, int C, int num_ell, int64_t dim_in, int64_t dim_out, int num_contractions,
    const int64_t* __restrict__ ell_offset, const int32_t* __restrict__ ell_stride,
    const ScContraction* __restrict__ contractions, const ScTerm* __restrict__ terms,
    const int32_t* __restrict__ index, const T* __restrict__ values, const T* __restrict__ weights,
    const int32_t* __restrict__ species, const T* __restrict__ x, T* __restrict__ out) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int bd = blockDim.x;
  T* xt = reinterpret_cast<T*>(smem_raw) + threadIdx.x;  // xt[i * bd]: x[c][i]
  T* acc = xt + static_cast<int64_t>(num_ell) * bd;      // acc[m * bd]
  const int64_t t = static_cast<int64_t>(blockIdx.x) * bd + threadIdx.x;
  if (t >= num_nodes * C) return;
  const int c = static_cast<int>(t % C);
  const int64_t n = t / C;
  const int64_t s = species[n];
  const T* xn = x + n * dim_in;
  for (int i = 0; i < num_ell; ++i)
    xt[i * bd] = xn[ell_offset[i] + static_cast<int64_t>(c) * ell_stride[i]];
  T* on = out + n * dim_out;
  for (int q = 0; q < num_contractions; ++q) {
    const ScContraction con = contractions[q];
    for (int m = 0; m < con.d; ++m) acc[m * bd] = T(0);
    for (int tt = con.term_begin; tt < con.term_end; ++tt) {
      const ScTerm term = terms[tt];
      const int nu = term.nu, width = nu + 2;
      const T* W = weights + term.weight_begin + s * term.num_params * C + c;  // W[k * C]
      const int32_t* rows = index + term.index_begin;
      const T* vals = values + term.value_begin;
      for (int64_t r = 0; r < term.rows; ++r) {
        const int32_t* row = rows + r * width;  // m, i_1..i_nu, k
        T prod = vals[r] * W[static_cast<int64_t>(row[nu + 1]) * C] * xt[row[1] * bd];
        for (int j = 2; j <= nu; ++j) prod *= xt[row[j] * bd];
        acc[row[0] * bd] += prod;
      }
    }
    for (int m = 0; m < con.d; ++m)
      on[con.out_offset + static_cast<int64_t>(c) * con.d + m] = acc[m * bd];
  }
}

template <class T>
__global__ void sc_backward_kernel(
    int64_t num_nodes, int C, int num_ell, int64_t dim_in, int64_t dim_out, int num_contractions,
    const int64_t* __restrict__ ell_offset, const int32_t* __restrict__ ell_stride,
    const ScContraction* __restrict__ contractions, const ScTerm* __restrict__ terms,
    const int32_t* __restrict__ index, const T* __restrict__ values, const T* __restrict__ weights,
    const int32_t* __restrict__ species, const T* __restrict__ x, const T* __restrict__ grad_out,
    T* __restrict__ grad_x) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int bd = blockDim.x;
  T* xt = reinterpret_cast<T*>(smem_raw) + threadIdx.x;  // xt[i * bd]: x[c][i]
  T* gxt = xt + static_cast<int64_t>(num_ell) * bd;      // gxt[i * bd]: dE/dx[c][i]
  const int64_t t = static_cast<int64_t>(blockIdx.x) * bd + threadIdx.x;
  if (t >= num_nodes * C) return;
  const int c = static_cast<int>(t % C);
  const int64_t n = t / C;
  const int64_t s = species[n];
  const T* xn = x + n * dim_in;
  for (int i = 0; i < num_ell; ++i) {
    xt[i * bd] = xn[ell_offset[i] + static_cast<int64_t>(c) * ell_stride[i]];
    gxt[i * bd] = T(0);
  }
  const T* gn = grad_out + n * dim_out;
  for (int q = 0; q < num_contractions; ++q) {
    const ScContraction con = contractions[q];
    const T* g = gn + con.out_offset + static_cast<int64_t>(c) * con.d;  // g[m]
    for (int tt = con.term_begin; tt < con.term_end; ++tt) {
      const ScTerm term = terms[tt];
      const int nu = term.nu, width = nu + 2;
      const T* W = weights + term.weight_begin + s * term.num_params * C + c;
      const int32_t* rows = index + term.index_begin;
      const T* vals = values + term.value_begin;
      for (int64_t r = 0; r < term.rows; ++r) {
        const int32_t* row = rows + r * width;  // m, i_1..i_nu, k
        const T base = vals[r] * W[static_cast<int64_t>(row[nu + 1]) * C] * g[row[0]];
        for (int j = 1; j <= nu; ++j) {  // d/dx[i_j]: the product of the other factors
          T part = base;
          for (int p = 1; p <= nu; ++p)
            if (p != j) part *= xt[row[p] * bd];
          gxt[row[j] * bd] += part;
        }
      }
    }
  }
  T* gx = grad_x + n * dim_in;
  for (int i = 0; i < num_ell; ++i)
    gx[ell_offset[i] + static_cast<int64_t>(c) * ell_stride[i]] = gxt[i * bd];
}

// Threads per block such that `slots` values of T per thread fit in the default
// 48 KiB of dynamic shared memory; beyond that, 32 threads and an opt-in.
template <class T, class Kernel>
int sc_block(Kernel kernel, int slots, size_t& bytes) {
  for (int threads : {128, 64, 32}) {
    bytes = static_cast<size_t>(slots) * threads * sizeof(T);
    if (bytes <= kDefaultSharedBytes) return threads;
  }
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(bytes)),
        "symmetric contraction: shared memory per block");
  return 32;
}

}  // namespace

// ---------------------------------------------------------------------------------
// Element-dependent linear: the linear kernel with one table per species.
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
  detail::run_linear_tables(lin.tables, lin.dim_in, lin.dim_out, false, num_nodes, species, false,
                            x, out, stream);
}

template <class T>
void element_linear_backward(const ElementLinear<T>& lin, int64_t num_nodes, const int32_t* species,
                             const T* grad_out, T* grad_x, bool accumulate, cudaStream_t stream) {
  detail::run_linear_tables(lin.tables, lin.dim_in, lin.dim_out, true, num_nodes, species,
                            accumulate, grad_out, grad_x, stream);
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
  std::vector<ScContraction> contractions;
  std::vector<ScTerm> terms;
  std::vector<int32_t> index;
  std::vector<T> values, weights;
  for (const auto& con : host.contractions) {
    ScContraction q;
    q.out_offset = con.out_offset;
    q.d = con.d;
    q.term_begin = static_cast<int32_t>(terms.size());
    sc.max_d = std::max(sc.max_d, con.d);
    if (con.out_offset + static_cast<int64_t>(host.C) * con.d > host.dim_out) {
      throw Error("internal: symmetric contraction output out of range");
    }
    for (const auto& t : con.terms) {
      if (t.nu < 1 || static_cast<int64_t>(t.index.size()) != t.rows * (t.nu + 2) ||
          static_cast<int64_t>(t.values.size()) != t.rows) {
        throw Error("internal: inconsistent symmetric contraction term");
      }
      for (int64_t r = 0; r < t.rows; ++r) {
        const int32_t* row = t.index.data() + r * (t.nu + 2);
        bool ok =
            row[0] >= 0 && row[0] < con.d && row[t.nu + 1] >= 0 && row[t.nu + 1] < t.num_params;
        for (int j = 1; j <= t.nu; ++j) ok = ok && row[j] >= 0 && row[j] < host.num_ell;
        if (!ok) throw Error("internal: symmetric contraction index out of range");
      }
      ScTerm u;
      u.rows = t.rows;
      u.nu = t.nu;
      u.num_params = t.num_params;
      u.index_begin = static_cast<int64_t>(index.size());
      u.value_begin = static_cast<int64_t>(values.size());
      u.weight_begin = static_cast<int64_t>(weights.size());
      index.insert(index.end(), t.index.begin(), t.index.end());
      values.insert(values.end(), t.values.begin(), t.values.end());
      weights.insert(weights.end(), t.weights.begin(), t.weights.end());
      terms.push_back(u);
    }
    q.term_end = static_cast<int32_t>(terms.size());
    contractions.push_back(q);
  }
  sc.ell_offset.upload(host.ell_offset);
  sc.ell_stride.upload(std::vector<int32_t>(host.ell_stride.begin(), host.ell_stride.end()));
  sc.contractions.upload(contractions);
  sc.terms.upload(terms);
  sc.index.upload(index);
  sc.values.upload(values);
  sc.weights.upload(weights);
  check(cudaStreamSynchronize(nullptr), "symmetric contraction upload");
  return sc;
}

template <class T>
void symmetric_contraction_forward(const SymmetricContraction<T>& sc, int64_t num_nodes,
                                   const int32_t* species, const T* x, T* out,
                                   cudaStream_t stream) {
  const int64_t work = num_nodes * sc.C;
  if (work <= 0) return;
  size_t bytes = 0;
  const int threads = sc_block<T>(sc_forward_kernel<T>, sc.num_ell + sc.max_d, bytes);
  sc_forward_kernel<T>
      <<<static_cast<unsigned>(blocks_for(work, threads)), threads, bytes, stream>>>(
          num_nodes, sc.C, sc.num_ell, sc.dim_in, sc.dim_out, sc.num_contractions,
          sc.ell_offset.data(), sc.ell_stride.data(), sc.contractions.data(), sc.terms.data(),
          sc.index.data(), sc.values.data(), sc.weights.data(), species, x, out);
  check_launch("sc_forward_kernel");
}

template <class T>
void symmetric_contraction_backward(const SymmetricContraction<T>& sc, int64_t num_nodes,
                                    const int32_t* species, const T* x, const T* grad_out,
                                    T* grad_x, cudaStream_t stream) {
  const int64_t work = num_nodes * sc.C;
  if (work <= 0) return;
  size_t bytes = 0;
  const int threads = sc_block<T>(sc_backward_kernel<T>, 2 * sc.num_ell, bytes);
  sc_backward_kernel<T>
      <<<static_cast<unsigned>(blocks_for(work, threads)), threads, bytes, stream>>>(
          num_nodes, sc.C, sc.num_ell, sc.dim_in, sc.dim_out, sc.num_contractions,
          sc.ell_offset.data(), sc.ell_stride.data(), sc.contractions.data(), sc.terms.data(),
          sc.index.data(), sc.values.data(), sc.weights.data(), species, x, grad_out, grad_x);
  check_launch("sc_backward_kernel");
}

#define E3FUSE_INSTANTIATE(T)                                                                 \
  template ElementLinear<T> make_element_linear<T>(const cpu::ElementLinear<T>&);             \
  template void element_linear_forward<T>(const ElementLinear<T>&, int64_t, const int32_t*,   \
                                          const T*, T*, cudaStream_t);                        \
  template void element_linear_backward<T>(const ElementLinear<T>&, int64_t, const int32_t*,  \
                                           const T*, T*, bool, cudaStream_t);                 \
  template SymmetricContraction<T> make_symmetric_contraction<T>(                             \
      const cpu::SymmetricContraction<T>&);                                                   \
  template void symmetric_contraction_forward<T>(const SymmetricContraction<T>&, int64_t,     \
                                                 const int32_t*, const T*, T*, cudaStream_t); \
  template void symmetric_contraction_backward<T>(const SymmetricContraction<T>&, int64_t,    \
                                                  const int32_t*, const T*, const T*, T*,     \
                                                  cudaStream_t);
E3FUSE_INSTANTIATE(float)
E3FUSE_INSTANTIATE(double)
#undef E3FUSE_INSTANTIATE

}  // namespace e3fuse::cuda
