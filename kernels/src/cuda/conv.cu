// cuda/conv.cu: the convolution's set-up (make_geometry, make_conv) and its forward pass
// (conv_kernels.cuh holds the kernels; the backward is instantiated in conv_backward_f32.cu,
// conv_backward_split_f32.cu and conv_backward_f64.cu).
#include "cuda/conv_kernels.cuh"

namespace e3fuse::cuda {

namespace {

// Channels per lane of the tasks of path p (Conv<T>::Task): 2 in float32 when its block is
// a multiple of 64 channels, every row it reads starts on an even element (8-byte loads of
// channel pairs) and the path is small enough (pairs_channels); 1 otherwise.
template <class T>
int lane_channels(const typename Conv<T>::View& v, const typename Conv<T>::InBlock& b,
                  const typename Conv<T>::Path& p) {
  if (!std::is_same_v<T, float>) return 1;
  const bool aligned = b.mul % 64 == 0 && b.in_offset % 2 == 0 && p.out_offset % 2 == 0 &&
                       v.dim_in % 2 == 0 && v.dim_out % 2 == 0;
  return aligned && pairs_channels(b.d1, p.d3) ? 2 : 1;
}

// The order in which the threads take the M entries (chunk_contract_sh: thread t the stored
// entries t, t + kThreads, ...): when they are more than half the threads, sorted by their
// terms (an entry's sum per edge) from the most, each round of kThreads taken in the
// opposite direction of the one before, so that each thread's sum of terms is near the
// mean. Fewer entries keep path order (every thread takes at most one per group of edges).
template <class MEntry>
std::vector<MEntry> contraction_order(const std::vector<MEntry>& entries) {
  if (entries.size() <= static_cast<size_t>(kThreads / 2)) return entries;
  std::vector<MEntry> order = entries;
  std::stable_sort(order.begin(), order.end(),
                   [](const MEntry& a, const MEntry& b) { return a.terms > b.terms; });
  for (size_t r = 0; r < order.size(); r += kThreads) {
    if ((r / kThreads) % 2 == 1) {
      const size_t end = std::min(order.size(), r + kThreads);
      std::reverse(order.begin() + static_cast<std::ptrdiff_t>(r),
                   order.begin() + static_cast<std::ptrdiff_t>(end));
    }
  }
  return order;
}

// Splits the tensor product into warp tasks (path, 32 x lane_channels channels) and deals
// them to `warps` warps, largest cost (d1 x d3 x lane_channels multiply-adds per edge
// and lane) first, each to the least loaded warp; fills task_begin[0 .. warps] and
// v.max_lane_channels and returns the tasks grouped by warp.
template <class T>
std::vector<typename Conv<T>::Task> deal_tasks(const std::vector<typename Conv<T>::InBlock>& blocks,
                                               const std::vector<typename Conv<T>::Path>& paths,
                                               int warps, int* task_begin,
                                               typename Conv<T>::View& v) {
  using Task = typename Conv<T>::Task;
  struct Costed {
    Task task;
    int cost;
  };
  std::vector<Costed> all;
  for (size_t b = 0; b < blocks.size(); ++b)
    for (int p = blocks[b].path_begin; p < blocks[b].path_end; ++p) {
      const int lc = lane_channels<T>(v, blocks[b], paths[p]);
      v.max_lane_channels = std::max(v.max_lane_channels, lc);
      for (int u0 = 0; u0 < blocks[b].mul; u0 += 32 * lc)
        all.push_back({{static_cast<int>(b), p, u0, lc}, blocks[b].d1 * paths[p].d3 * lc});
    }
  std::stable_sort(all.begin(), all.end(),
                   [](const Costed& a, const Costed& b) { return a.cost > b.cost; });
  std::vector<std::vector<Task>> per_warp(warps);
  std::vector<int> load(warps, 0);
  for (const Costed& t : all) {
    const int w = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    per_warp[w].push_back(t.task);
    load[w] += t.cost;
  }
  std::vector<Task> out;
  for (int w = 0; w < warps; ++w) {
    task_begin[w] = static_cast<int>(out.size());
    out.insert(out.end(), per_warp[w].begin(), per_warp[w].end());
  }
  task_begin[warps] = static_cast<int>(out.size());
  return out;
}

// Column (a, k) of a path's Clebsch-Gordan block cg [d1][d2][d3] as M's entry `out`: its
// nonzero coefficients in increasing b (Conv::MEntry), those past the first kInlineTerms
// appended to extra_y / extra_w. False for a column with none: M's entry stays zero.
template <class T>
bool column_entry(const std::vector<T>& cg, int a, int k, int d2, int d3, int sh_offset, int out,
                  std::vector<int>& extra_y, std::vector<T>& extra_w,
                  typename Conv<T>::MEntry& entry) {
  constexpr int inline_terms = Conv<T>::kInlineTerms;
  entry = {out, 0, static_cast<int>(extra_y.size()), {}, {}};
  for (int b = 0; b < d2; ++b) {
    const T w = cg[(static_cast<size_t>(a) * d2 + b) * d3 + k];
    if (w == T(0)) continue;
    if (entry.terms < inline_terms) {
      entry.y[entry.terms] = sh_offset + b;
      entry.w[entry.terms] = w;
    } else {
      extra_y.push_back(sh_offset + b);
      extra_w.push_back(w);
    }
    ++entry.terms;
  }
  return entry.terms > 0;
}

// Whether a path's Clebsch-Gordan block cg [d1][d2][d3] is alpha x w3j(l1, l2, l3), every
// entry to a few units of its own rounding (it was computed from the same float64 w3j and
// may be stored in float32); alpha from the largest entry.
template <class T>
bool w3j_multiple(int d1, int d2, int d3, const std::vector<T>& cg, double& alpha) {
  std::vector<double> w(static_cast<size_t>(d1) * d2 * d3);
  if (cg.size() != w.size() ||
      !ops::wigner3j_dense((d1 - 1) / 2, (d2 - 1) / 2, (d3 - 1) / 2, w.data()))
    return false;
  size_t largest = 0;
  for (size_t i = 1; i < w.size(); ++i)
    if (std::abs(w[i]) > std::abs(w[largest])) largest = i;
  alpha = static_cast<double>(cg[largest]) / w[largest];
  const double tolerance = 8.0 * std::numeric_limits<T>::epsilon() * std::abs(alpha);
  for (size_t i = 0; i < w.size(); ++i)
    if (std::abs(static_cast<double>(cg[i]) - alpha * w[i]) > tolerance) return false;
  return true;
}

// Whether the CG block cg [d1][d2][d3] is scale x partner [d3][d2][d1] transposed (a and k
// swapped), every entry to a few units of its own rounding; scale from the largest entry.
template <class T>
bool transposed_multiple(int d1, int d2, int d3, const std::vector<T>& cg,
                         const std::vector<T>& partner, double& scale) {
  const size_t n = static_cast<size_t>(d1) * d2 * d3;
  if (cg.size() != n || partner.size() != n) return false;
  auto other = [&](int a, int b, int k) {
    return static_cast<double>(partner[(static_cast<size_t>(k) * d2 + b) * d1 + a]);
  };
  double largest = 0.0;
  scale = 0.0;
  for (int a = 0; a < d1; ++a)
    for (int b = 0; b < d2; ++b)
      for (int k = 0; k < d3; ++k)
        if (std::abs(other(a, b, k)) > largest) {
          largest = std::abs(other(a, b, k));
          scale =
              static_cast<double>(cg[(static_cast<size_t>(a) * d2 + b) * d3 + k]) / other(a, b, k);
        }
  if (largest == 0.0 || scale == 0.0) return false;
  const double tolerance = 8.0 * std::numeric_limits<T>::epsilon() * std::abs(scale) * largest;
  for (int a = 0; a < d1; ++a)
    for (int b = 0; b < d2; ++b)
      for (int k = 0; k < d3; ++k)
        if (std::abs(static_cast<double>(cg[(static_cast<size_t>(a) * d2 + b) * d3 + k]) -
                     scale * other(a, b, k)) > tolerance)
          return false;
  return true;
}

// The float32 radial MLP on the tensor cores (3xTF32, as accurate as FMAs) unless the
// device is older than sm_80. The kernels' shared-memory layout depends on it, so it also
// checks the code that runs was compiled for sm_80 or later (not JIT-compiled from older PTX).
bool tensor_cores_enabled() {
  int device = 0, major = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
        "cudaDeviceGetAttribute");
  cudaFuncAttributes attr{};
  check(cudaFuncGetAttributes(&attr, conv_forward_kernel<float, 8, false, 3, false>),
        "cudaFuncGetAttributes");
  return major >= 8 && attr.ptxVersion >= 80;
}

}  // namespace

template <class T>
Geometry<T> make_geometry(const cpu::TypedPlan<T>& plan) {
  Geometry<T> g;
  auto& v = g.view;
  v.cutoff = plan.cutoff;
  v.num_basis = plan.num_basis;
  if (v.num_basis > kMaxBasis)
    throw Error("the CUDA backend supports at most " + std::to_string(kMaxBasis) +
                " radial basis functions");
  for (int b = 0; b < v.num_basis; ++b) v.coeffs[b] = plan.radial_coeffs_f64[b];
  v.prefactor = plan.radial_prefactor_f64;
  v.envelope = plan.envelope;
  v.normalize = plan.sh.normalize;
  v.lmax = plan.sh.lmax;
  v.sh_dim = plan.sh.dim;
  if (v.lmax > 7) throw Error("the CUDA backend supports spherical harmonics up to l = 7");
  std::vector<int> exps;
  for (const auto& e : plan.sh.exps) exps.push_back(e[0] | (e[1] << 8) | (e[2] << 16));
  g.term_begin.upload(plan.sh.term_begin);
  g.exps.upload(exps);
  g.sh_coeffs.upload(plan.sh.coeffs);
  v.term_begin = g.term_begin.data();
  v.exps = g.exps.data();
  v.sh_coeffs = g.sh_coeffs.data();
  v.mace_embedding = plan.mace_embedding;
  v.apply_cutoff = plan.apply_cutoff;
  v.transform = plan.transform;
  v.num_species = plan.num_species;
  if (plan.pair_dependent) {
    g.pair_r0.upload(plan.pair_r0);
    v.pair_r0 = g.pair_r0.data();
  }
  return g;
}

template <class T>
Conv<T> make_conv(const cpu::Conv<T>& conv, std::shared_ptr<DeviceArray<T>> edge_weights) {
  using InBlock = typename Conv<T>::InBlock;
  using Path = typename Conv<T>::Path;
  using MEntry = typename Conv<T>::MEntry;
  using Task = typename Conv<T>::Task;
  Conv<T> c;
  auto& v = c.view;
  v.dim_in = static_cast<int>(conv.dim_in);
  v.dim_out = static_cast<int>(conv.dim_out);
  v.weight_numel = static_cast<int>(conv.weight_numel);
  // Group the paths by input block (in the order of the input blocks).
  std::vector<InBlock> blocks;
  std::vector<Path> paths;
  using DenseEntry = typename Conv<T>::DenseEntry;
  std::vector<MEntry> entries, entries_fwd;
  std::vector<DenseEntry> dense_entries;
  int m_stride_fwd = 0, m_per_edge = 0;
  std::vector<T> cg;
  std::vector<int> extra_y;
  std::vector<T> extra_w;
  std::vector<int64_t> outputs_seen;
  std::vector<const std::vector<T>*> path_cg;  // per path: its CG block, d1, offset in cg
  std::vector<int> path_d1, path_cg_begin;
  int gx_slots = 0;
  bool sparse_cg = true;
  for (const auto& ib : conv.in_blocks) {
    InBlock b{static_cast<int>(ib.offset), ib.mul, ib.d, static_cast<int>(paths.size()), 0};
    for (const auto& p : conv.paths) {
      if (p.in_offset != ib.offset) continue;
      if (p.mul != ib.mul || p.d1 != ib.d)
        throw Error("internal: convolution path does not match its input block");
      if (p.d1 > 7 || p.d3 > 7) throw Error("the CUDA backend supports node features up to l = 3");
      if (std::find(outputs_seen.begin(), outputs_seen.end(), p.out_offset) != outputs_seen.end())
        throw Error("the CUDA backend needs one output block per tensor-product path");
      outputs_seen.push_back(p.out_offset);
      double alpha = 0.0;
      if (!w3j_multiple(p.d1, p.d2, p.d3, p.cg, alpha)) sparse_cg = false;
      Path q{static_cast<int>(p.out_offset),
             static_cast<int>(p.weight_offset),
             static_cast<int>(p.sh_offset),
             p.d2,
             p.d3,
             p.l2 % 2,
             -1,
             gx_slots,
             static_cast<T>(alpha),
             0,
             0,
             T(1)};
      gx_slots += p.d1 * ib.mul;
      path_cg_begin.push_back(static_cast<int>(cg.size()));
      cg.insert(cg.end(), p.cg.begin(), p.cg.end());
      const int row = forward_m_row(p.d3);
      q.mf_offset = m_stride_fwd;
      m_stride_fwd += forward_m_size(p.d1, p.d3);
      for (int a = 0; a < p.d1; ++a)
        for (int k = 0; k < p.d3; ++k) {
          MEntry entry;
          if (column_entry(p.cg, a, k, p.d2, p.d3, q.sh_offset, q.mf_offset + a * row + k, extra_y,
                           extra_w, entry))
            entries_fwd.push_back(entry);
        }
      paths.push_back(q);
      path_cg.push_back(&p.cg);
      path_d1.push_back(p.d1);
    }
    b.path_end = static_cast<int>(paths.size());
    blocks.push_back(b);
  }
  if (paths.size() != conv.paths.size())
    throw Error("internal: convolution path outside the input blocks");
  // The backward's {M, K} rows: in a layer with l = 3 inputs, a path (l1 < l3) whose
  // partner (l3, l2, l1) reads the same spherical harmonics reads the partner's rows
  // transposed (Path::m_transposed); the others have rows of their own, in path order.
  // SevenNet-l3i5's layers 1-3: 738 -> 531 entries per edge, backward 38.2 -> 37.3 ms per
  // layer at 32,000 atoms and 1.14 -> 1.10 at 864 (H100, benchmarks/results/backward_chunk_cap/).
  // In SevenNet-0's l = 2 layers the same sharing measured 37.0 -> 37.1 ms (all layers) and
  // 1.22 -> 1.24 at 864 atoms (benchmarks/results/backward_mk_partner/): they keep their own.
  std::vector<int> partner(paths.size(), -1);
  const int max_d1 = path_d1.empty() ? 0 : *std::max_element(path_d1.begin(), path_d1.end());
  for (size_t i = 0; i < paths.size() && max_d1 == 7; ++i) {
    const Path& q = paths[i];
    if (path_d1[i] >= q.d3) continue;
    for (size_t j = 0; j < paths.size() && partner[i] < 0; ++j) {
      const Path& r = paths[j];
      double scale = 0.0;
      if (path_d1[j] == q.d3 && r.d3 == path_d1[i] && r.d2 == q.d2 && r.sh_offset == q.sh_offset &&
          transposed_multiple(path_d1[i], q.d2, q.d3, *path_cg[i], *path_cg[j], scale)) {
        partner[i] = static_cast<int>(j);
        paths[i].m_scale = static_cast<T>(scale);
      }
    }
  }
  for (size_t i = 0; i < paths.size(); ++i) {
    if (partner[i] >= 0) continue;
    Path& q = paths[i];
    q.m_offset = m_per_edge;
    for (int a = 0; a < path_d1[i]; ++a)
      for (int k = 0; k < q.d3; ++k, ++m_per_edge) {
        dense_entries.push_back(
            {path_cg_begin[i] + a * q.d2 * q.d3 + k, q.d2, q.d3, q.sh_offset, m_per_edge});
        MEntry entry;
        if (column_entry(*path_cg[i], a, k, q.d2, q.d3, q.sh_offset, m_per_edge, extra_y, extra_w,
                         entry))
          entries.push_back(entry);
      }
  }
  for (size_t i = 0; i < paths.size(); ++i) {
    if (partner[i] < 0) continue;
    paths[i].m_offset = paths[partner[i]].m_offset;
    paths[i].m_transposed = 1;
  }
  v.num_blocks = static_cast<int>(blocks.size());
  v.sparse_cg = sparse_cg;
  for (const InBlock& b : blocks) v.max_d1 = std::max(v.max_d1, b.d1);
  for (const Path& p : paths) v.max_d3 = std::max(v.max_d3, p.d3);
  v.gx_slots = gx_slots;
  c.tasks.upload(deal_tasks<T>(blocks, paths, kWarps, v.task_begin, v));
  v.tasks = c.tasks.data();
  c.wide_tasks.upload(deal_tasks<T>(blocks, paths, kWideConvWarps, v.wide_task_begin, v));
  v.wide_tasks = c.wide_tasks.data();
  v.m_per_edge = m_per_edge;
  v.m_columns = static_cast<int>(entries.size());
  v.m_columns_fwd = static_cast<int>(entries_fwd.size());
  v.m_stride_fwd = m_stride_fwd;
  c.blocks.upload(blocks);
  c.paths.upload(paths);
  c.m_entries.upload(entries);
  c.m_entries_balanced.upload(contraction_order(entries_fwd));
  c.extra_y.upload(extra_y);
  c.extra_w.upload(extra_w);
  c.m_dense_entries.upload(dense_entries);
  c.cg.upload(cg);
  v.m_dense_entries = c.m_dense_entries.data();
  v.cg = c.cg.data();
  v.blocks = c.blocks.data();
  v.paths = c.paths.data();
  v.m_entries = c.m_entries.data();
  v.m_entries_balanced = c.m_entries_balanced.data();
  v.extra_y = c.extra_y.data();
  v.extra_w = c.extra_w.data();

  const auto& mlp = conv.mlp;
  v.mlp_layers = static_cast<int>(mlp.weight.size());
  // mace's non-linear block: its RadialMLP is read from the ordered-pair tables or evaluated
  // exactly per edge (radial_mlp below), there is no plain MLP to upload
  const bool tables_only = conv.radial_mlp != nullptr;
  if (tables_only ? v.mlp_layers > kMaxMlpLayers
                  : (v.mlp_layers < 1 || v.mlp_layers > kMaxMlpLayers))
    throw Error("the CUDA backend supports radial MLPs of 1 to 8 layers");
  std::vector<T> flat;
  std::vector<size_t> w_at, wt_at;
  for (int l = 0; l < v.mlp_layers; ++l) {
    v.dims[l] = mlp.dims[l];
    w_at.push_back(flat.size());
    flat.insert(flat.end(), mlp.weight[l].begin(), mlp.weight[l].end());
    wt_at.push_back(flat.size());
    flat.insert(flat.end(), mlp.weight_t[l].begin(), mlp.weight_t[l].end());
    v.max_hidden = std::max(v.max_hidden, mlp.dims[l]);
  }
  if (!tables_only) {
    v.dims[v.mlp_layers] = mlp.dims[v.mlp_layers];
    if (v.dims[v.mlp_layers] != v.weight_numel)
      throw Error("internal: radial MLP output does not match the tensor-product weights");
  }
  c.mlp.upload(flat);
  for (int l = 0; l < v.mlp_layers; ++l) {
    v.w[l] = c.mlp.data() + w_at[l];
    v.wt[l] = c.mlp.data() + wt_at[l];
  }
  if constexpr (std::is_same_v<T, float>) {
    if (tensor_cores_enabled()) {
      std::vector<float> frags;
      std::vector<size_t> fwd_at, bwd_at;
      for (int l = 0; l < v.mlp_layers; ++l) {
        const int K = mlp.dims[l], N = mlp.dims[l + 1];
        fwd_at.push_back(frags.size());
        append_tf32_fragments(mlp.weight_t[l], N, K, frags);  // A = W^T (N x K)
        bwd_at.push_back(frags.size());
        append_tf32_fragments(mlp.weight[l], K, N, frags);  // A = W (K x N)
      }
      c.mlp_fragments.upload(frags);
      for (int l = 0; l < v.mlp_layers; ++l) {
        v.frag_fwd[l] = reinterpret_cast<const float4*>(c.mlp_fragments.data() + fwd_at[l]);
        v.frag_bwd[l] = reinterpret_cast<const float4*>(c.mlp_fragments.data() + bwd_at[l]);
      }
    }
  }
  v.act = mlp.act;
  v.act_scale = mlp.act_scale;
  v.inv_denominator = conv.inv_denominator;
  if (conv.radial_mlp && !conv.tabulated()) {  // the exact per-edge RadialMLP (conv.cuh)
    const ops::RadialMlpView& layout = conv.radial_mlp_layout;
    if (layout.layers < 1 || layout.dims[layout.layers] != v.weight_numel)
      throw Error("internal: the non-linear block's RadialMLP does not match its tensor product");
    for (int l = 0; l < layout.layers; ++l)
      c.radial_mlp_hidden = std::max(c.radial_mlp_hidden, layout.dims[l]);
    if (c.radial_mlp_hidden > kMaxEdgeMlpHidden)
      throw Error("the non-linear block's RadialMLP on CUDA (radial='mlp'): hidden layers of " +
                  std::to_string(c.radial_mlp_hidden) + " > " + std::to_string(kMaxEdgeMlpHidden) +
                  " units are not supported; use "
                  "radial='table'");
    c.radial_mlp_params.upload(conv.radial_mlp_params);
    c.radial_mlp = layout;
    c.radial_mlp.params = c.radial_mlp_params.data();
    c.edge_weights = edge_weights ? std::move(edge_weights) : std::make_shared<DeviceArray<T>>();
  }
  if (!conv.table.empty()) {
    c.table.upload(conv.table.coeffs);
    v.table = c.table.data();
    v.table_intervals = conv.table.intervals;
    v.table_origin = conv.table.origin;
    v.table_inv_step = conv.table.inv_step;
    v.table_fine_intervals = conv.table.fine_intervals;
    v.table_coarse_shift = conv.table.coarse_shift;
  }
  return c;
}

template <class T>
void upload_pair_tables(Conv<T>& c, const cpu::Conv<T>& host) {
  if (host.pair_tables.empty()) return;
  const auto& first = host.pair_tables.front();
  std::vector<T> all;
  all.reserve(first.coeffs.size() * host.pair_tables.size());
  for (const auto& t : host.pair_tables) {
    if (t.intervals != first.intervals || t.origin != first.origin || t.coarse_shift != 0)
      throw Error("internal: pair radial tables on different grids");
    all.insert(all.end(), t.coeffs.begin(), t.coeffs.end());
  }
  c.table.upload(all);
  c.pair_slot.upload(host.pair_table);
  auto& v = c.view;
  v.table = c.table.data();
  v.table_intervals = first.intervals;
  v.table_origin = first.origin;
  v.table_inv_step = first.inv_step;
  v.table_fine_intervals = first.intervals;
  v.table_coarse_shift = 0;
  v.pair_slot = c.pair_slot.data();
  v.num_species = host.table_of ? static_cast<int>(host.table_of->atomic_numbers.size()) : 0;
  // the uploads ran on the default stream; rare (new species pairs), so simply wait for them
  check(cudaDeviceSynchronize(), "radial pair tables upload");
}

namespace {

// The forward kernel for launch_largest_chunk's `wide` (its measurements are there): float32
// with a radial table and M rows, 16 warps per block (kWideConvWarps), the registers per
// thread of the 8-warp kernel; none otherwise.
template <class T>
auto wide_forward_kernel(const typename Conv<T>::View& view) {
  decltype(&conv_forward_kernel<T, kWideChunk, true, 4, false>) kernel = nullptr;
  if constexpr (std::is_same_v<T, float>) {
    if (view.table && !sparse_forward(view))
      kernel = conv_forward_kernel<T, kWideChunk, true, 4, false, false, kWideConvWarps>;
  }
  return kernel;
}

}  // namespace

template <class T>
void conv_forward(const Geometry<T>& geom, const Conv<T>& conv, const GraphView& g, const T* x,
                  T* y, int64_t* error_node, cudaStream_t stream, const ConvRows& rows) {
  if (g.num_nodes == 0) return;
  check_row_alignment<T>(conv.view, x);
  const int64_t blocks = rows.all() ? g.num_nodes : rows.count;
  const int32_t* row_list = rows.all() ? nullptr : rows.rows;
  if (conv.radial_mlp.layers > 0) {
    const typename Conv<T>::View v = per_edge_weights(
        geom, conv, g, std::numeric_limits<int64_t>::max(), false, stream, rows.edge_weights_ready);
    if (blocks == 0) return;
    launch_largest_chunk(
        geom, v, false, "convolution", "conv_forward_kernel",
        [&](auto ec) { return conv_forward_kernel<T, decltype(ec)::value, true, 4, false, true>; },
        [&](auto kernel, size_t smem, int threads) {
          kernel<<<blocks, threads, smem, stream>>>(geom.view, v, g, x, y, error_node, row_list);
        });
    return;
  }
  if (blocks == 0) return;
  launch_largest_chunk(
      geom, conv.view, false, "convolution", "conv_forward_kernel",
      [&](auto ec) {
        constexpr int EC = decltype(ec)::value;
        return !conv.view.table            ? conv_forward_kernel<T, EC, false, 3, false>
               : sparse_forward(conv.view) ? conv_forward_kernel<T, EC, true, 4, true>
                                           : conv_forward_kernel<T, EC, true, 4, false>;
      },
      [&](auto kernel, size_t smem, int threads) {
        kernel<<<blocks, threads, smem, stream>>>(geom.view, conv.view, g, x, y, error_node,
                                                  row_list);
      },
      wide_forward_kernel<T>(conv.view));
}

namespace {

__global__ void add_remote_forces_kernel(int64_t n, RemoteForces remote, double* forces,
                                         double* atom_virials) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  auto value = [](const unsigned long long* sum) {
    return static_cast<double>(static_cast<long long>(sum[0])) / kFixedHiScale +
           static_cast<double>(static_cast<long long>(sum[1])) / kFixedLoScale;
  };
  for (int a = 0; a < 3; ++a) forces[3 * i + a] += value(remote.forces + 2 * (3 * i + a));
  if (remote.virials && atom_virials)
    for (int q = 0; q < 9; ++q) atom_virials[9 * i + q] += value(remote.virials + 2 * (9 * i + q));
}

}  // namespace

void add_remote_forces(int64_t num_nodes, const RemoteForces& remote, double* forces,
                       double* atom_virials, cudaStream_t stream) {
  if (num_nodes == 0) return;
  add_remote_forces_kernel<<<static_cast<unsigned>(blocks_for(num_nodes, kThreads)), kThreads, 0,
                             stream>>>(num_nodes, remote, forces, atom_virials);
  check_launch("add_remote_forces_kernel");
}

#define E3FUSE_INSTANTIATE(T)                                                                   \
  template Geometry<T> make_geometry<T>(const cpu::TypedPlan<T>&);                              \
  template Conv<T> make_conv<T>(const cpu::Conv<T>&, std::shared_ptr<DeviceArray<T>>);          \
  template void upload_pair_tables<T>(Conv<T>&, const cpu::Conv<T>&);                           \
  template void conv_forward<T>(const Geometry<T>&, const Conv<T>&, const GraphView&, const T*, \
                                T*, int64_t*, cudaStream_t, const ConvRows&);
E3FUSE_INSTANTIATE(float)
E3FUSE_INSTANTIATE(double)
#undef E3FUSE_INSTANTIATE

}  // namespace e3fuse::cuda
