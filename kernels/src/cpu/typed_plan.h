// cpu/typed_plan.h: the plan's layers as flat, typed structs (float or double)
// that the CPU kernels read. Built once per engine from the ModelPlan.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "e3fuse/error.h"
#include "model/plan.h"
#include "ops/radial.h"
#include "ops/radial_mlp.h"
#include "ops/sh.h"

namespace e3fuse::cpu {

template <class T>
struct Linear {
  struct Path {
    int64_t in_offset = 0, out_offset = 0;
    int mul_in = 0, mul_out = 0, d = 1;
    std::vector<T> weight;  // [mul_in][mul_out]
  };
  struct Bias {
    int64_t out_offset = 0;
    std::vector<T> bias;
  };
  int64_t dim_in = 0, dim_out = 0;
  int max_mul = 0;
  // Layout of each side: e3nn's [mul][2l+1] ("mul_ir", default) or [2l+1][mul]
  // ("ir_mul", what the convolution uses).
  bool in_ir_mul = false, out_ir_mul = false;
  std::vector<Path> paths;
  std::vector<Bias> biases;
};

template <class T>
struct Mlp {
  std::vector<int> dims;
  std::vector<std::vector<T>> weight;    // [dims[i]][dims[i+1]]
  std::vector<std::vector<T>> weight_t;  // transposed, for the backward pass
  Activation act = Activation::identity;
  T act_scale = T(1);
};

// The radial MLP tabulated in r (ops/radial_table.h); empty: evaluate the MLP per edge.
template <class T>
struct RadialTable {
  int intervals = 0;                                // 0: no table
  double origin = 0.0, step = 0.0, inv_step = 0.0;  // knot i at origin + i step ...
  // ... for i <= fine_intervals; past them the step is 2^coarse_shift step (coarse_shift 0:
  // one step throughout; ops::radial_table_locate)
  int fine_intervals = 0, coarse_shift = 0;
  std::vector<T> coeffs;  // [intervals][weight_numel][4]
  // Largest interpolation error found at the interval midpoints, relative to the
  // largest |R_w| (value) and |dR_w/dr| (derivative) of the same output w.
  double value_error = 0.0, grad_error = 0.0;
  bool empty() const { return intervals == 0; }
};

// Tabulates `mlp` composed with the model's edge embedding over [0, cutoff], halving the
// step until the midpoint errors are below float32 rounding (cpu/radial_table.cpp).
// With a MACE distance transform the table is that of one species pair, whose r_0 is `r0`;
// min_intervals: start the refinement there (pair tables share one grid, see Conv).
// With `rmlp` (mace's RadialMLP) the table is that network's for the ordered species pair
// `pair` (s_receiver * S + s_sender), and `mlp` is ignored.
// coarse_tail_above: a coarser step past the radius where it meets the tolerances when the
// table with one step would take more than this many bytes in float32 (one table, not the pair
// tables, which share one grid; max: never).
template <class T>
RadialTable<T> make_radial_table(const ModelPlan& model, const MlpPlan& mlp, double r0 = 0.0,
                                 int min_intervals = 0, const RadialMlpPlan* rmlp = nullptr,
                                 int pair = 0,
                                 size_t coarse_tail_above = std::numeric_limits<size_t>::max());

// The one-step table size above which a convolution's table gets a coarse tail. Measured at
// 32,000 Cu atoms on an H200 (benchmarks/results/session_final2_h200/): SevenNet-l3i5's tables
// of 58-115 MB (beyond the 50-60 MB L2) read 4-8 % faster with one (37-63 MB), those of
// SevenNet-0 and MACE-MP-0 medium (6-32 MB) within 1 %; and a tail costs accuracy (forces
// 2e-7 -> 1.2e-6 eV/A from the exact MLP, within the table's tolerances): below this size the
// finer table is kept.
constexpr size_t kRadialTableCoarseTailAbove = size_t{32} << 20;

// mace's edge density tanh((w . emb)^2) (times the envelope without apply_cutoff;
// ops::edge_density) as a one-output table in r, to the same tolerances; the slope is also
// checked where its interpolation error peaks (cpu/radial_table.cpp).
template <class T>
RadialTable<T> make_density_table(const ModelPlan& model, const std::vector<double>& weights,
                                  double r0 = 0.0, int min_intervals = 0);

// The tables of the species pairs present in species[0..n) that `slot` (S x S) lacks (-1),
// built by build(r_0 of the pair, min_intervals, pair = a * S + b) and appended to `tables`;
// then the coarser tables are rebuilt on the finest grid (one grid for all). `ordered`: one
// table per ordered pair (a, b) (mace's RadialMLP, whose weights depend on the order), else
// `slot` is symmetric. True when it built any. Shared by the radial MLP (Conv) and the edge
// density (EdgeDensity).
template <class T, class Build>
bool ensure_tables_of_pairs(const ModelPlan& model, std::vector<int>& slot,
                            std::vector<RadialTable<T>>& tables, int64_t n, const int32_t* species,
                            bool ordered, Build&& build) {
  const int S = static_cast<int>(model.atomic_numbers.size());
  std::vector<char> present(static_cast<size_t>(S), 0);
  for (int64_t i = 0; i < n; ++i) present[static_cast<size_t>(species[i])] = 1;
  const ops::TransformParams tp{model.radial.transform, model.radial.agnesi_q,
                                model.radial.agnesi_p, model.radial.agnesi_a,
                                model.radial.soft_alpha};
  auto r0_of = [&](int a, int b) {
    return model.radial.pair_dependent() ? ops::transform_r0(tp, model.radial.covalent_radii[a],
                                                             model.radial.covalent_radii[b])
                                         : 0.0;
  };
  bool built = false;
  for (int a = 0; a < S; ++a)
    for (int b = ordered ? 0 : a; b < S; ++b) {
      if (!present[a] || !present[b] || slot[a * S + b] >= 0) continue;
      const int grid = tables.empty() ? 0 : tables.front().intervals;
      tables.push_back(build(r0_of(a, b), grid, a * S + b));
      slot[a * S + b] = static_cast<int>(tables.size()) - 1;
      if (!ordered) slot[b * S + a] = slot[a * S + b];
      built = true;
    }
  if (!built) return false;
  int finest = 0;
  for (const RadialTable<T>& t : tables) finest = std::max(finest, t.intervals);
  for (int a = 0; a < S; ++a)
    for (int b = ordered ? 0 : a; b < S; ++b) {
      const int k = slot[a * S + b];
      if (k >= 0 && tables[k].intervals != finest)
        tables[k] = build(r0_of(a, b), finest, a * S + b);
    }
  return true;
}

template <class T>
struct Conv {
  struct Path {
    int64_t in_offset = 0, out_offset = 0, weight_offset = 0, sh_offset = 0;
    int mul = 0, d1 = 1, d2 = 1, d3 = 1, l2 = 0;
    std::vector<T> cg;  // [d1][d2][d3]
  };
  struct Block {
    int64_t offset = 0;
    int mul = 0, d = 1;
  };
  int64_t dim_in = 0, dim_out = 0, weight_numel = 0;
  std::vector<Block> in_blocks, out_blocks;  // for layout conversions (tests)
  std::vector<Path> paths;
  Mlp<T> mlp;
  RadialTable<T> table;  // used instead of mlp when not empty
  T inv_denominator = T(1);
  // Species-pair-dependent embedding (MACE distance transforms): the radial MLP's output is a
  // function of r for each unordered species pair, so the tables are per pair. A foundation
  // model has up to 89 elements (4005 pairs, each table 15-115 MB): only the pairs of the
  // species present in the evaluated system are built, on first use (ensure_pair_tables),
  // and kept. pair_table[a * S + b] indexes pair_tables, -1 while not built; empty: no
  // pair tables (per-edge MLP, or the one `table`). All pair tables of a convolution share
  // one grid (the finest any pair needs), so that the GPU reads them as one table whose
  // interval index is offset by pair_table[...] x intervals.
  std::vector<int> pair_table;
  std::vector<RadialTable<T>> pair_tables;
  MlpPlan mlp_plan;                     // to build pair tables (double weights)
  const ModelPlan* table_of = nullptr;  // the model (outlives the engine's typed plans)
  // mace's non-linear block: the RadialMLP of ConvPlan::radial_mlp (in the model), whose
  // tables are per ORDERED pair (s_receiver, s_sender): pair_table[a * S + b] then need not
  // equal pair_table[b * S + a].
  const RadialMlpPlan* radial_mlp = nullptr;
  // Without tables, the same RadialMLP evaluated exactly per edge (ops::radial_mlp_forward):
  // its arrays, and their layout (radial_mlp_view() points it at them).
  std::vector<double> radial_mlp_params;
  ops::RadialMlpView radial_mlp_layout;
  ops::RadialMlpView radial_mlp_view() const {
    ops::RadialMlpView v = radial_mlp_layout;
    v.params = radial_mlp_params.data();
    return v;
  }
  bool tabulated() const { return !table.empty() || !pair_table.empty(); }
  const RadialTable<T>& table_for_pair(int pair) const {
    return pair_table.empty() ? table : pair_tables[static_cast<size_t>(pair_table[pair])];
  }
};

// Builds the pair tables of `conv` that the species in species[0..n) need (no-op without
// pair tables); true when it built any. Not thread-safe: call between ops.
template <class T>
bool ensure_pair_tables(Conv<T>& conv, int64_t n, const int32_t* species) {
  if (conv.pair_table.empty()) return false;
  const ModelPlan& model = *conv.table_of;
  return ensure_tables_of_pairs(model, conv.pair_table, conv.pair_tables, n, species,
                                conv.radial_mlp != nullptr, [&](double r0, int grid, int pair) {
                                  return make_radial_table<T>(model, conv.mlp_plan, r0, grid,
                                                              conv.radial_mlp, pair);
                                });
}

// mace's edge density (RealAgnosticDensity[Residual]InteractionBlock, cpu/edge_density.cpp):
// the weights of its linear layer density_fn and, where the engine reads the radial MLP from
// tables, the density tanh((w . emb)^2) (x f(r) without apply_cutoff) and its r-derivative as
// a table in r (make_density_table) instead of the basis evaluated per edge. With a distance
// transform the density depends on the species pair: the tables are per pair, built on first
// use on one grid, as Conv's (ensure_density_tables).
template <class T>
struct EdgeDensity {
  std::vector<double> weights;  // [num_basis], e3nn's 1/sqrt(fan_in) folded in
  RadialTable<T> table;         // without a distance transform; empty: no table
  std::vector<int> pair_table;  // [S x S] into pair_tables, -1 while not built; empty: none
  std::vector<RadialTable<T>> pair_tables;
  const ModelPlan* table_of = nullptr;  // the model, to build pair tables
  bool tabulated() const { return !table.empty() || !pair_table.empty(); }
  const RadialTable<T>& table_for_pair(int pair) const {
    return pair_table.empty() ? table : pair_tables[static_cast<size_t>(pair_table[pair])];
  }
};

// With `table_of` (the model), the density is tabulated (per pair: on first use).
template <class T>
EdgeDensity<T> make_edge_density(const std::vector<double>& weights,
                                 const ModelPlan* table_of = nullptr) {
  EdgeDensity<T> d;
  d.weights = weights;
  if (table_of && table_of->radial.pair_dependent()) {
    const size_t S = table_of->atomic_numbers.size();
    d.pair_table.assign(S * S, -1);
    d.table_of = table_of;
  } else if (table_of) {
    d.table = make_density_table<T>(*table_of, weights);
  }
  return d;
}

// The pair tables of `density` that species[0..n) need (as ensure_pair_tables).
template <class T>
bool ensure_density_tables(EdgeDensity<T>& density, int64_t n, const int32_t* species) {
  if (density.pair_table.empty()) return false;
  const ModelPlan& model = *density.table_of;
  return ensure_tables_of_pairs(model, density.pair_table, density.pair_tables, n, species, false,
                                [&](double r0, int grid, int) {
                                  return make_density_table<T>(model, density.weights, r0, grid);
                                });
}

template <class T>
struct Gate {
  GatePlan plan;
  T gated_factor = T(1);
};

template <class T>
struct Layer {
  Linear<T> self_connection, linear_1, linear_2;
  Conv<T> conv;
  Gate<T> gate;
};

template <class T>
struct TypedPlan {
  double cutoff = 0;
  int num_species = 0;
  int num_basis = 0;
  std::vector<T> radial_coeffs;
  T radial_prefactor = T(0);
  std::vector<double> radial_coeffs_f64;  // the edge embedding is evaluated in double
  double radial_prefactor_f64 = 0.0;
  ops::EnvelopeParams envelope{};
  // MACE radial options: with mace_embedding the edge embedding is ops::mace_edge_embedding
  // (distance transform with r_0 = pair_r0[s_receiver * num_species + s_sender], and/or the
  // envelope applied to the MLP output instead, apply_cutoff false).
  bool mace_embedding = false, apply_cutoff = true, pair_dependent = false;
  ops::TransformParams transform{};
  std::vector<double> pair_r0;
  ops::ShTable<T> sh;
  int embedding_dim = 0;
  std::vector<T> embedding;
  std::vector<Layer<T>> layers;
  std::vector<Linear<T>> readout;
  std::vector<T> scale, shift;
};

template <class T>
Linear<T> make_linear(const LinearPlan& p) {
  Linear<T> l;
  l.dim_in = p.in.dim;
  l.dim_out = p.out.dim;
  for (const LinearPath& path : p.paths) {
    const IrrepBlock& bi = p.in.blocks[path.in_block];
    const IrrepBlock& bo = p.out.blocks[path.out_block];
    typename Linear<T>::Path q;
    q.in_offset = bi.offset;
    q.out_offset = bo.offset;
    q.mul_in = bi.mul;
    q.mul_out = bo.mul;
    q.d = 2 * bi.l + 1;
    q.weight = std::vector<T>(path.weight.begin(), path.weight.end());
    l.max_mul = std::max({l.max_mul, bi.mul, bo.mul});
    l.paths.push_back(std::move(q));
  }
  for (const LinearBias& b : p.biases) {
    typename Linear<T>::Bias q;
    q.out_offset = p.out.blocks[b.out_block].offset;
    q.bias = std::vector<T>(b.bias.begin(), b.bias.end());
    l.biases.push_back(std::move(q));
  }
  return l;
}

template <class T>
Mlp<T> make_mlp(const MlpPlan& p) {
  Mlp<T> m;
  m.dims = p.dims;
  m.act = p.act;
  m.act_scale = static_cast<T>(p.act_scale);
  for (size_t i = 0; i < p.weights.size(); ++i) {
    const int rows = p.dims[i], cols = p.dims[i + 1];
    std::vector<T> w(p.weights[i].begin(), p.weights[i].end());
    std::vector<T> wt(w.size());
    for (int a = 0; a < rows; ++a)
      for (int b = 0; b < cols; ++b)
        wt[static_cast<size_t>(b) * rows + a] = w[static_cast<size_t>(a) * cols + b];
    m.weight.push_back(std::move(w));
    m.weight_t.push_back(std::move(wt));
  }
  return m;
}

// With `table_of` (the model), the radial MLP is also tabulated (RadialTable).
template <class T>
Conv<T> make_conv(const ConvPlan& p, const ModelPlan* table_of = nullptr) {
  Conv<T> c;
  c.dim_in = p.in.dim;
  c.dim_out = p.out.dim;
  c.weight_numel = p.weight_numel;
  for (const IrrepBlock& b : p.in.blocks) c.in_blocks.push_back({b.offset, b.mul, 2 * b.l + 1});
  for (const IrrepBlock& b : p.out.blocks) c.out_blocks.push_back({b.offset, b.mul, 2 * b.l + 1});
  for (const TensorProductPath& path : p.paths) {
    typename Conv<T>::Path q;
    q.in_offset = p.in.blocks[path.in_block].offset;
    q.out_offset = p.out.blocks[path.out_block].offset;
    q.sh_offset = p.sh.blocks[path.sh_block].offset;
    q.weight_offset = path.weight_offset;
    q.mul = p.in.blocks[path.in_block].mul;
    q.d1 = 2 * path.l1 + 1;
    q.d2 = 2 * path.l2 + 1;
    q.d3 = 2 * path.l3 + 1;
    q.l2 = path.l2;
    q.cg = std::vector<T>(path.cg.begin(), path.cg.end());
    c.paths.push_back(std::move(q));
  }
  c.mlp = make_mlp<T>(p.mlp);
  if (!p.radial_mlp.empty()) {
    // mace's RadialMLP, per ordered species pair: tabulated, or (without table_of) evaluated
    // exactly per edge (on CUDA from these arrays too: cuda/conv.cuh)
    c.radial_mlp = &p.radial_mlp;
    if (table_of) {
      const size_t S = table_of->atomic_numbers.size();
      c.pair_table.assign(S * S, -1);
      c.mlp_plan = p.mlp;
      c.table_of = table_of;
    } else {
      c.radial_mlp_layout = ops::radial_mlp_layout(p.radial_mlp, c.radial_mlp_params);
      if (c.radial_mlp_layout.layers == 0) throw Error("radial MLP with too many layers");
    }
  } else if (table_of && table_of->radial.pair_dependent()) {
    const size_t S = table_of->atomic_numbers.size();
    c.pair_table.assign(S * S, -1);
    c.mlp_plan = p.mlp;
    c.table_of = table_of;
  } else if (table_of) {
    c.table =
        make_radial_table<T>(*table_of, p.mlp, 0.0, 0, nullptr, 0, kRadialTableCoarseTailAbove);
  }
  c.inv_denominator = static_cast<T>(1.0 / p.denominator);
  return c;
}

// Splits a linear layer's paths so that its input (or output) side is cut along
// `blocks` (offset, mul, d): needed for the ir_mul layout, where "384x1e" and
// "128x1e+256x1e" are laid out differently although their mul_ir layouts agree.
template <class T, class Block>
void split_linear_side(Linear<T>& lin, const std::vector<Block>& blocks, bool input) {
  std::vector<typename Linear<T>::Path> out;
  for (const auto& p : lin.paths) {
    const int64_t begin = input ? p.in_offset : p.out_offset;
    const int mul = input ? p.mul_in : p.mul_out;
    const int64_t end = begin + static_cast<int64_t>(mul) * p.d;
    for (const Block& b : blocks) {
      const int64_t b_end = b.offset + static_cast<int64_t>(b.mul) * b.d;
      if (b_end <= begin || b.offset >= end) continue;
      if (b.d != p.d || b.offset < begin || b_end > end) {
        throw Error("internal: linear layer and convolution irreps are not compatible");
      }
      const int u0 = static_cast<int>((b.offset - begin) / p.d);
      typename Linear<T>::Path q = p;
      if (input) {
        q.in_offset = b.offset;
        q.mul_in = b.mul;
        q.weight.assign(p.weight.begin() + static_cast<size_t>(u0) * p.mul_out,
                        p.weight.begin() + static_cast<size_t>(u0 + b.mul) * p.mul_out);
      } else {
        q.out_offset = b.offset;
        q.mul_out = b.mul;
        q.weight.clear();
        for (int u = 0; u < p.mul_in; ++u)
          for (int w = 0; w < b.mul; ++w)
            q.weight.push_back(p.weight[static_cast<size_t>(u) * p.mul_out + u0 + w]);
      }
      out.push_back(std::move(q));
    }
  }
  lin.paths = std::move(out);
}

// The convolution works in the ir_mul layout: the linear before it writes that
// layout and the linear after it reads it, cut along the convolution's blocks.
template <class T>
void wire_conv_layout(Linear<T>& before, const Conv<T>& conv, Linear<T>& after) {
  split_linear_side(before, conv.in_blocks, false);
  split_linear_side(after, conv.out_blocks, true);
  before.out_ir_mul = true;
  after.in_ir_mul = true;
}

// radial_tables: tabulate the radial MLPs of the SevenNet layers (see RadialTable). Each
// layer's linear_1 / linear_2 are wired to the convolution's ir_mul layout (wire_conv_layout),
// as MACE's blocks wire theirs (make_mace_block).
template <class T>
TypedPlan<T> make_typed_plan(const ModelPlan& p, bool radial_tables = false) {
  TypedPlan<T> t;
  t.cutoff = p.cutoff;
  t.num_species = static_cast<int>(p.atomic_numbers.size());
  t.num_basis = p.radial.num_basis;
  t.radial_coeffs = std::vector<T>(p.radial.coeffs.begin(), p.radial.coeffs.end());
  t.radial_prefactor = static_cast<T>(p.radial.prefactor);
  t.radial_coeffs_f64 = p.radial.coeffs;
  t.radial_prefactor_f64 = p.radial.prefactor;
  t.envelope = {p.radial.envelope, p.radial.r_cut, p.radial.r_on, p.radial.p};
  t.apply_cutoff = p.radial.apply_cutoff;
  t.pair_dependent = p.radial.pair_dependent();
  t.mace_embedding = t.pair_dependent || !t.apply_cutoff;
  t.transform = {p.radial.transform, p.radial.agnesi_q, p.radial.agnesi_p, p.radial.agnesi_a,
                 p.radial.soft_alpha};
  if (t.pair_dependent) {
    const int S = t.num_species;
    t.pair_r0.resize(static_cast<size_t>(S) * S);
    for (int a = 0; a < S; ++a)
      for (int b = 0; b < S; ++b)
        t.pair_r0[static_cast<size_t>(a) * S + b] =
            ops::transform_r0(t.transform, p.radial.covalent_radii[a], p.radial.covalent_radii[b]);
  }
  t.sh = ops::make_sh_table<T>(p.sh);
  t.embedding_dim = p.embedding_dim;
  t.embedding = std::vector<T>(p.embedding.begin(), p.embedding.end());
  for (const SevennetLayer& l : p.layers) {
    Layer<T> q;
    q.self_connection = make_linear<T>(l.self_connection);
    q.linear_1 = make_linear<T>(l.linear_1);
    q.linear_2 = make_linear<T>(l.linear_2);
    q.conv = make_conv<T>(l.conv, radial_tables ? &p : nullptr);
    wire_conv_layout(q.linear_1, q.conv, q.linear_2);
    q.gate.plan = l.gate;
    q.gate.gated_factor = static_cast<T>(l.gate.gated_factor);
    t.layers.push_back(std::move(q));
  }
  for (const LinearPlan& r : p.readout) t.readout.push_back(make_linear<T>(r));
  t.scale = std::vector<T>(p.scale.begin(), p.scale.end());
  t.shift = std::vector<T>(p.shift.begin(), p.shift.end());
  return t;
}

}  // namespace e3fuse::cpu
