// cpu/mace.h: typed MACE-specific ops for the CPU backend: the element-dependent
// linear (mace's skip_tp), the symmetric contraction (product basis) and their
// adjoints with respect to node features. Node-major arrays, OpenMP over nodes.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "cpu/typed_plan.h"
#include "model/plan.h"
#include "ops/radial_mlp.h"

namespace e3fuse::cpu {

template <class T>
struct ElementLinear {
  int64_t dim_in = 0, dim_out = 0;
  std::vector<Linear<T>> per_species;  // or one map shared by all (ElementLinearPlan::shared)
  const Linear<T>& of_species(int32_t s) const {
    return per_species[per_species.size() == 1 ? 0 : static_cast<size_t>(s)];
  }
};

template <class T>
struct SymmetricContraction {
  struct Term {
    int nu = 0, num_params = 0;
    int64_t rows = 0;
    std::vector<int32_t> index;  // [rows][nu + 2]: m, i_1..i_nu, k
    std::vector<T> values;       // [rows]
    std::vector<T> weights;      // [num_species][num_params][C]
  };
  struct Contraction {
    int64_t out_offset = 0;
    int d = 1;
    std::vector<Term> terms;
  };
  int C = 0, num_ell = 0;
  int64_t dim_in = 0, dim_out = 0;
  std::vector<int64_t> ell_offset;  // x[c][i] = x_flat[ell_offset[i] + c * ell_stride[i]]
  std::vector<int> ell_stride;
  std::vector<Contraction> contractions;
};

template <class T>
ElementLinear<T> make_element_linear(const ElementLinearPlan& p) {
  ElementLinear<T> e;
  e.dim_in = p.in.dim;
  e.dim_out = p.out.dim;
  for (const LinearPlan& l : p.per_species) e.per_species.push_back(make_linear<T>(l));
  return e;
}

template <class T>
SymmetricContraction<T> make_symmetric_contraction(const SymmetricContractionPlan& p) {
  SymmetricContraction<T> s;
  s.C = p.num_features;
  s.num_ell = p.num_ell;
  s.dim_in = p.in.dim;
  s.dim_out = p.out.dim;
  for (const IrrepBlock& b : p.in.blocks)
    for (int m = 0; m < 2 * b.l + 1; ++m) {
      s.ell_offset.push_back(b.offset + m);
      s.ell_stride.push_back(2 * b.l + 1);
    }
  for (const ContractionPlan& c : p.contractions) {
    typename SymmetricContraction<T>::Contraction q;
    q.out_offset = p.out.blocks[c.out_block].offset;
    q.d = 2 * p.out.blocks[c.out_block].l + 1;
    for (const ContractionTerm& t : c.terms) {
      typename SymmetricContraction<T>::Term u;
      u.nu = t.nu;
      u.num_params = t.num_params;
      u.rows = static_cast<int64_t>(t.values.size());
      u.index = std::vector<int32_t>(t.index.begin(), t.index.end());
      u.values = std::vector<T>(t.values.begin(), t.values.end());
      u.weights = std::vector<T>(t.weights.begin(), t.weights.end());
      q.terms.push_back(std::move(u));
    }
    s.contractions.push_back(std::move(q));
  }
  return s;
}

// then(first(x)) as one element-dependent linear layer, in float64. Both maps act within
// each irrep type, so per species every pair of paths a -> b (first) and b -> c (then)
// gives W[a -> c] += W_first[a -> b] W_then[b -> c] (e3nn's path weights are folded into
// the plan's weights).
inline ElementLinearPlan compose_linears(const LinearPlan& first, const ElementLinearPlan& then) {
  auto same_irreps = [](const Irreps& a, const Irreps& b) {
    if (a.dim != b.dim || a.blocks.size() != b.blocks.size()) return false;
    for (size_t i = 0; i < a.blocks.size(); ++i)
      if (a.blocks[i].mul != b.blocks[i].mul || a.blocks[i].l != b.blocks[i].l ||
          a.blocks[i].parity != b.blocks[i].parity || a.blocks[i].offset != b.blocks[i].offset)
        return false;
    return true;
  };
  if (!first.biases.empty() || !same_irreps(first.out, then.in))
    throw Error("internal: linear layers that do not compose");
  ElementLinearPlan out;
  out.in = first.in;
  out.out = then.out;
  for (const LinearPlan& second : then.per_species) {
    if (!second.biases.empty() || !same_irreps(second.in, then.in))
      throw Error("internal: linear layers that do not compose");
    LinearPlan c;
    c.in = first.in;
    c.out = second.out;
    std::map<std::pair<int, int>, size_t> index;  // (in block, out block) -> path
    for (const LinearPath& p : first.paths)
      for (const LinearPath& q : second.paths) {
        if (q.in_block != p.out_block) continue;
        const int mul_a = first.in.blocks[p.in_block].mul;
        const int mul_b = first.out.blocks[p.out_block].mul;
        const int mul_c = second.out.blocks[q.out_block].mul;
        const auto [at, fresh] =
            index.emplace(std::make_pair(p.in_block, q.out_block), c.paths.size());
        if (fresh)
          c.paths.push_back({p.in_block, q.out_block,
                             std::vector<double>(static_cast<size_t>(mul_a) * mul_c, 0.0)});
        std::vector<double>& w = c.paths[at->second].weight;
        for (int u = 0; u < mul_a; ++u)
          for (int v = 0; v < mul_b; ++v) {
            const double a = p.weight[static_cast<size_t>(u) * mul_b + v];
            for (int k = 0; k < mul_c; ++k)
              w[static_cast<size_t>(u) * mul_c + k] +=
                  a * q.weight[static_cast<size_t>(v) * mul_c + k];
          }
      }
    out.per_species.push_back(std::move(c));
  }
  return out;
}

// One MACE interaction + product + readout as typed ops (see MaceRunner in
// engine.cpp), the convolution's neighbours wired to its ir_mul layout.
template <class T>
struct MaceBlock {
  bool residual = false, add_sc = false, nonlinear = false;
  // Without residual (mace's first interaction), m = skip(linear(y)): `skip` is then that
  // composition, one element-dependent linear reading the convolution's output y in its
  // ir_mul layout (compose_linears), and `linear` is not run (its dimensions are y's and m's).
  bool skip_reads_conv = false;
  ElementLinear<T> skip;
  Linear<T> linear_up, linear, product_linear, readout_1, readout_2;
  Conv<T> conv;
  SymmetricContraction<T> product;
  Activation act = Activation::identity;
  T act_scale = T(1);
  bool density = false;         // divide linear(message) by 1 + rho (MaceLayer)
  EdgeDensity<T> edge_density;  // rho's weights (and table)
  // mace's non-linear block (MaceLayer::nonlinear_block): `linear` is its linear_1.
  bool nonlinear_block = false;
  Linear<T> linear_res, linear_2;  // linear_res reads linear_up's (ir_mul) output
  Gate<T> gate;
  double alpha = 1.0, beta = 0.0;
  std::vector<double> density_params;  // the density RadialMLP (ops::radial_mlp_layout)
  ops::RadialMlpView density_layout;   // offsets into density_params
  ops::RadialMlpView density_mlp() const {
    ops::RadialMlpView v = density_layout;
    v.params = density_params.data();
    return v;
  }
};

// With `table_of` (the model), the convolution's radial MLP and the edge density are also
// tabulated.
template <class T>
MaceBlock<T> make_mace_block(const MaceLayer& l, const ModelPlan* table_of = nullptr) {
  MaceBlock<T> q;
  q.residual = l.residual;
  q.add_sc = l.residual && l.product_sc;
  q.skip_reads_conv = !l.residual && !l.nonlinear_block;
  q.skip = make_element_linear<T>(q.skip_reads_conv ? compose_linears(l.linear, l.skip) : l.skip);
  q.linear_up = make_linear<T>(l.linear_up);
  q.linear = make_linear<T>(l.linear);
  q.conv = make_conv<T>(l.conv, table_of);
  q.product = make_symmetric_contraction<T>(l.product);
  q.product_linear = make_linear<T>(l.product_linear);
  q.readout_1 = make_linear<T>(l.readout.linear_1);
  q.nonlinear = l.readout.nonlinear;
  if (q.nonlinear) q.readout_2 = make_linear<T>(l.readout.linear_2);
  q.act = l.readout.act;
  q.act_scale = static_cast<T>(l.readout.act_scale);
  q.density = l.density;
  if (q.density) q.edge_density = make_edge_density<T>(l.density_weights, table_of);
  wire_conv_layout(q.linear_up, q.conv, q.linear);
  if (q.skip_reads_conv)
    for (Linear<T>& lin : q.skip.per_species) {
      split_linear_side(lin, q.conv.out_blocks, true);
      lin.in_ir_mul = true;
    }
  if (l.nonlinear_block) {
    q.nonlinear_block = true;
    q.linear_res = make_linear<T>(l.linear_res);
    split_linear_side(q.linear_res, q.conv.in_blocks, true);
    q.linear_res.in_ir_mul = true;
    q.linear_2 = make_linear<T>(l.linear_2);
    q.gate.plan = l.gate;
    q.gate.gated_factor = static_cast<T>(l.gate.gated_factor);
    q.alpha = l.alpha;
    q.beta = l.beta;
    q.density_layout = ops::radial_mlp_layout(l.density_mlp, q.density_params);
    if (q.density_layout.layers == 0) throw Error("density MLP with too many layers");
  }
  return q;
}

// out = W_{s_n} x_n for every node n (mul_ir layout both sides, out overwritten).
template <class T>
void element_linear_forward(const ElementLinear<T>& lin, int64_t num_nodes, const int32_t* species,
                            const T* x, T* out);
// grad_x (+)= W_{s_n}^T grad_out_n.
template <class T>
void element_linear_backward(const ElementLinear<T>& lin, int64_t num_nodes, const int32_t* species,
                             const T* grad_out, T* grad_x, bool accumulate);

// out[n] = SC(x[n]; species s_n), out overwritten (mul_ir layout of irreps_out).
template <class T>
void symmetric_contraction_forward(const SymmetricContraction<T>& sc, int64_t num_nodes,
                                   const int32_t* species, const T* x, T* out);
// grad_x = (d SC / d x)^T grad_out, overwritten.
template <class T>
void symmetric_contraction_backward(const SymmetricContraction<T>& sc, int64_t num_nodes,
                                    const int32_t* species, const T* x, const T* grad_out,
                                    T* grad_x);

}  // namespace e3fuse::cpu
