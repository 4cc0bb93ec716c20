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
// CPU's order (the CPU sums the rows). A graph of few nodes (864 atoms: 110 k threads, a
// fraction of what an H100 keeps resident) would leave each thread a long serial walk over
// all groups; then up to kMaxScParts threads share one (node, channel), each taking a slice
// of the outputs, and in the backward pass their partial dE/dx are added in part order.
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

// Thread (node n, channel c, part p): with one part, t = n C + c over the grid (c fastest);
// with P > 1 parts (C a multiple of 32), block b is node b / (C / 32), channels
// 32 (b % (C / 32)) + lane, and warp p of the block is part p.
struct ScThread {
  int64_t n;
  int c, part;
};

__device__ inline bool sc_thread(int64_t num_nodes, int C, int parts, ScThread* t) {
  if (parts == 1) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    *t = {i / C, static_cast<int>(i % C), 0};
    return i < num_nodes * C;
  }
  const int tiles = C / 32;
  *t = {static_cast<int64_t>(blockIdx.x) / tiles,
        static_cast<int>(blockIdx.x % tiles) * 32 + static_cast<int>(threadIdx.x % 32),
        static_cast<int>(threadIdx.x / 32)};
  return true;
}

// The outputs [first, last) of part t.part of `parts`.
__device__ inline void sc_part_outputs(const int32_t* part_outputs, int parts, int part, int* first,
                                       int* last) {
  const int32_t* b = part_outputs + (parts - 1) * (kMaxScParts + 1);
  *first = b[part];
  *last = b[part + 1];
}

template <class T, int NU>
__global__ void sc_forward_kernel(
    int64_t num_nodes, int C, int num_ell, int num_groups, int64_t dim_in, int64_t dim_out,
    int parts, const int64_t* __restrict__ ell_offset, const int32_t* __restrict__ ell_stride,
    const ScOutput* __restrict__ outputs, const int32_t* __restrict__ part_outputs,
    const uint32_t* __restrict__ factors, const T* __restrict__ weights,
    const int32_t* __restrict__ species, const T* __restrict__ x, T* __restrict__ out) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int bd = blockDim.x;
  T* xt = reinterpret_cast<T*>(smem_raw) + threadIdx.x;  // xt[i * bd]: x[c][i], xt[num_ell] = 1
  ScThread t;
  if (!sc_thread(num_nodes, C, parts, &t)) return;
  const int c = t.c;
  const int64_t n = t.n;
  const T* xn = x + n * dim_in;
  for (int i = 0; i < num_ell; ++i)
    xt[i * bd] = xn[ell_offset[i] + static_cast<int64_t>(c) * ell_stride[i]];
  xt[num_ell * bd] = T(1);
  const T* W = weights + static_cast<int64_t>(species[n]) * num_groups * C + c;  // W[g * C]
  T* on = out + n * dim_out;
  int first, last;
  sc_part_outputs(part_outputs, parts, t.part, &first, &last);
  for (int o = first; o < last; ++o) {
    const ScOutput q = outputs[o];
    T sum = T(0);
    for (int g = q.group_begin; g < q.group_end; ++g) {
      int slot[NU];
      product_slots<NU>(__ldg(factors + g), slot);
      T prod = W[static_cast<int64_t>(g) * C];
#pragma unroll
      for (int j = 0; j < NU; ++j) prod *= xt[slot[j] * bd];
      sum += prod;
    }
    on[q.offset + static_cast<int64_t>(c) * q.d + q.m] = sum;
  }
}

// grad_x may be x (in place): each thread reads its own elements of x before it writes
// the same elements of grad_x, and no other thread touches them (with parts, the block's
// threads of one (node, channel) have all read x before part 0 writes).
template <class T, int NU>
__global__ void sc_backward_kernel(
    int64_t num_nodes, int C, int num_ell, int num_groups, int64_t dim_in, int64_t dim_out,
    int parts, const int64_t* __restrict__ ell_offset, const int32_t* __restrict__ ell_stride,
    const ScOutput* __restrict__ outputs, const int32_t* __restrict__ part_outputs,
    const uint32_t* __restrict__ factors, const T* __restrict__ weights,
    const int32_t* __restrict__ species, const T* x, const T* __restrict__ grad_out, T* grad_x) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int bd = blockDim.x;
  T* xt = reinterpret_cast<T*>(smem_raw) + threadIdx.x;  // xt[i * bd]: x[c][i], xt[num_ell] = 1
  T* gxt = xt + static_cast<int64_t>(num_ell + 1) * bd;  // gxt[i * bd]: dE/dx[c][i]
  ScThread t;
  if (!sc_thread(num_nodes, C, parts, &t)) return;
  const int c = t.c;
  const int64_t n = t.n;
  const T* xn = x + n * dim_in;
  for (int i = 0; i < num_ell; ++i) {
    xt[i * bd] = xn[ell_offset[i] + static_cast<int64_t>(c) * ell_stride[i]];
    gxt[i * bd] = T(0);
  }
  xt[num_ell * bd] = T(1);
  gxt[num_ell * bd] = T(0);  // collects the (unused) adjoint of the constant slot
  const T* W = weights + static_cast<int64_t>(species[n]) * num_groups * C + c;
  const T* gn = grad_out + n * dim_out;
  int first, last;
  sc_part_outputs(part_outputs, parts, t.part, &first, &last);
  for (int o = first; o < last; ++o) {
    const ScOutput q = outputs[o];
    const T gm = gn[q.offset + static_cast<int64_t>(c) * q.d + q.m];
    for (int g = q.group_begin; g < q.group_end; ++g) {
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
  if (parts > 1) {  // part 0 adds the other parts' sums (warps 1 .. P-1), in part order
    __syncthreads();
    if (t.part != 0) return;
    for (int i = 0; i < num_ell; ++i)
      for (int p = 1; p < parts; ++p) gxt[i * bd] += gxt[i * bd + 32 * p];
  }
  T* gx = grad_x + n * dim_in;
  for (int i = 0; i < num_ell; ++i)
    gx[ell_offset[i] + static_cast<int64_t>(c) * ell_stride[i]] = gxt[i * bd];
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
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(bytes)),
        "symmetric contraction: shared memory per block");
  return 32;
}

struct ScLaunch {
  unsigned blocks = 0;
  int threads = 0, parts = 1;
  size_t bytes = 0;
};

// Parts per (node, channel): enough for about two waves of the threads the GPU keeps
// resident, at most kMaxScParts; 1 when C is not a multiple of 32 (ScThread) or the parts'
// blocks would need more than the default shared memory.
// E3FUSE_SC_PARTS=P asks for P (1: never split), to measure.
template <class T, class Kernel>
ScLaunch sc_launch(Kernel kernel, const SymmetricContraction<T>& sc, int64_t num_nodes, int slots) {
  ScLaunch l;
  const int64_t work = num_nodes * sc.C;
  l.threads = sc_block<T>(kernel, slots, l.bytes);
  const int forced = static_cast<int>(env_int("E3FUSE_SC_PARTS", 0));  // read at every call
  const bool splittable =
      sc.C % 32 == 0 &&
      static_cast<size_t>(slots) * 32 * kMaxScParts * sizeof(T) <= kDefaultSharedBytes;
  if (splittable) {
    if (forced > 0) {
      l.parts = std::min(forced, kMaxScParts);
    } else {
      int device = 0, multiprocessors = 0, per_sm = 0;
      check(cudaGetDevice(&device), "cudaGetDevice");
      check(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device),
            "multiprocessor count");
      check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, l.threads, l.bytes),
            "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
      const int64_t resident = static_cast<int64_t>(per_sm) * l.threads * multiprocessors;
      l.parts =
          static_cast<int>(std::clamp<int64_t>((2 * resident + work - 1) / work, 1, kMaxScParts));
    }
  }
  if (l.parts == 1) {
    l.blocks = static_cast<unsigned>(blocks_for(work, l.threads));
    return l;
  }
  // one block per (node, 32 channels), a warp per part; its shared memory per thread as before
  l.threads = 32 * l.parts;
  l.bytes = static_cast<size_t>(slots) * l.threads * sizeof(T);
  l.blocks = static_cast<unsigned>(work / 32);
  return l;
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
  std::vector<ScOutput> outputs;
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
    sc.max_d = std::max(sc.max_d, con.d);
    size_t g = 0;
    for (int m = 0; m < con.d; ++m) {
      ScOutput q;
      q.offset = con.out_offset;
      q.d = con.d;
      q.m = m;
      while (g < mine.size() && mine[g].m < m) ++g;
      q.group_begin = static_cast<int32_t>(groups.size() + g);
      while (g < mine.size() && mine[g].m == m) ++g;
      q.group_end = static_cast<int32_t>(groups.size() + g);
      outputs.push_back(q);
    }
    for (auto& grp : mine) groups.push_back(std::move(grp));
  }
  sc.num_groups = static_cast<int>(groups.size());
  sc.num_outputs = static_cast<int>(outputs.size());
  // Part p of P starts at the first output whose groups begin at or past p / P of all
  // (each output at least one group in, so that every part may take some).
  std::vector<int32_t> part_outputs(kMaxScParts * (kMaxScParts + 1), sc.num_outputs);
  for (int P = 1; P <= kMaxScParts; ++P) {
    int32_t* b = part_outputs.data() + (P - 1) * (kMaxScParts + 1);
    for (int p = 0; p < P; ++p) {
      const int64_t target = static_cast<int64_t>(sc.num_groups) * p / P;
      int o = 0;
      while (o < sc.num_outputs && outputs[o].group_begin < target) ++o;
      b[p] = o;
    }
    b[P] = sc.num_outputs;
  }
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
  sc.outputs.upload(outputs);
  sc.part_outputs.upload(part_outputs);
  sc.factors.upload(factors);
  sc.weights.upload(weights);
  check(cudaStreamSynchronize(nullptr), "symmetric contraction upload");
  return sc;
}

template <class T>
void symmetric_contraction_forward(const SymmetricContraction<T>& sc, int64_t num_nodes,
                                   const int32_t* species, const T* x, T* out,
                                   cudaStream_t stream) {
  if (num_nodes <= 0 || sc.C <= 0) return;
  with_correlation(sc.max_nu, [&](auto nu) {
    auto kernel = sc_forward_kernel<T, decltype(nu)::value>;
    const ScLaunch l = sc_launch<T>(kernel, sc, num_nodes, sc.num_ell + 1);
    kernel<<<l.blocks, l.threads, l.bytes, stream>>>(
        num_nodes, sc.C, sc.num_ell, sc.num_groups, sc.dim_in, sc.dim_out, l.parts,
        sc.ell_offset.data(), sc.ell_stride.data(), sc.outputs.data(), sc.part_outputs.data(),
        sc.factors.data(), sc.weights.data(), species, x, out);
  });
  check_launch("sc_forward_kernel");
}

template <class T>
void symmetric_contraction_backward(const SymmetricContraction<T>& sc, int64_t num_nodes,
                                    const int32_t* species, const T* x, const T* grad_out,
                                    T* grad_x, cudaStream_t stream) {
  if (num_nodes <= 0 || sc.C <= 0) return;
  with_correlation(sc.max_nu, [&](auto nu) {
    auto kernel = sc_backward_kernel<T, decltype(nu)::value>;
    const ScLaunch l = sc_launch<T>(kernel, sc, num_nodes, 2 * (sc.num_ell + 1));
    kernel<<<l.blocks, l.threads, l.bytes, stream>>>(
        num_nodes, sc.C, sc.num_ell, sc.num_groups, sc.dim_in, sc.dim_out, l.parts,
        sc.ell_offset.data(), sc.ell_stride.data(), sc.outputs.data(), sc.part_outputs.data(),
        sc.factors.data(), sc.weights.data(), species, x, grad_out, grad_x);
  });
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
