// cpu/typed_plan.h: the plan's layers as flat, typed structs (float or double)
// that the CPU kernels read. Built once per engine from the ModelPlan.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "model/plan.h"
#include "ops/radial.h"
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
  std::vector<Path> paths;
  std::vector<Bias> biases;
};

template <class T>
struct Mlp {
  std::vector<int> dims;
  std::vector<std::vector<T>> weight;     // [dims[i]][dims[i+1]]
  std::vector<std::vector<T>> weight_t;   // transposed, for the backward pass
  Activation act = Activation::identity;
  T act_scale = T(1);
};

template <class T>
struct Conv {
  struct Path {
    int64_t in_offset = 0, out_offset = 0, weight_offset = 0, sh_offset = 0;
    int mul = 0, d1 = 1, d2 = 1, d3 = 1, l2 = 0;
    std::vector<T> cg;  // [d1][d2][d3]
  };
  int64_t dim_in = 0, dim_out = 0, weight_numel = 0;
  std::vector<Path> paths;
  Mlp<T> mlp;
  T inv_denominator = T(1);
};

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
  ops::EnvelopeParams envelope{};
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
    q.weight.assign(path.weight.begin(), path.weight.end());
    l.max_mul = std::max({l.max_mul, bi.mul, bo.mul});
    l.paths.push_back(std::move(q));
  }
  for (const LinearBias& b : p.biases) {
    typename Linear<T>::Bias q;
    q.out_offset = p.out.blocks[b.out_block].offset;
    q.bias.assign(b.bias.begin(), b.bias.end());
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
      for (int b = 0; b < cols; ++b) wt[static_cast<size_t>(b) * rows + a] = w[static_cast<size_t>(a) * cols + b];
    m.weight.push_back(std::move(w));
    m.weight_t.push_back(std::move(wt));
  }
  return m;
}

template <class T>
Conv<T> make_conv(const ConvPlan& p) {
  Conv<T> c;
  c.dim_in = p.in.dim;
  c.dim_out = p.out.dim;
  c.weight_numel = p.weight_numel;
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
    q.cg.assign(path.cg.begin(), path.cg.end());
    c.paths.push_back(std::move(q));
  }
  c.mlp = make_mlp<T>(p.mlp);
  c.inv_denominator = static_cast<T>(1.0 / p.denominator);
  return c;
}

template <class T>
TypedPlan<T> make_typed_plan(const ModelPlan& p) {
  TypedPlan<T> t;
  t.cutoff = p.cutoff;
  t.num_species = static_cast<int>(p.atomic_numbers.size());
  t.num_basis = p.radial.num_basis;
  t.radial_coeffs.assign(p.radial.coeffs.begin(), p.radial.coeffs.end());
  t.radial_prefactor = static_cast<T>(p.radial.prefactor);
  t.envelope = {p.radial.envelope, p.radial.r_cut, p.radial.r_on, p.radial.p};
  t.sh = ops::make_sh_table<T>(p.sh);
  t.embedding_dim = p.embedding_dim;
  t.embedding.assign(p.embedding.begin(), p.embedding.end());
  for (const SevennetLayer& l : p.layers) {
    Layer<T> q;
    q.self_connection = make_linear<T>(l.self_connection);
    q.linear_1 = make_linear<T>(l.linear_1);
    q.linear_2 = make_linear<T>(l.linear_2);
    q.conv = make_conv<T>(l.conv);
    q.gate.plan = l.gate;
    q.gate.gated_factor = static_cast<T>(l.gate.gated_factor);
    t.layers.push_back(std::move(q));
  }
  for (const LinearPlan& r : p.readout) t.readout.push_back(make_linear<T>(r));
  t.scale.assign(p.scale.begin(), p.scale.end());
  t.shift.assign(p.shift.begin(), p.shift.end());
  return t;
}

}  // namespace e3fuse::cpu
