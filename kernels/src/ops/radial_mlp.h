// ops/radial_mlp.h: mace's RadialMLP (model/plan.h RadialMlpPlan) on one edge, in double,
// with its r-derivative carried forward (tangent mode): shared by the radial-table builder
// (cpu/radial_table.cpp) and the edge density of the non-linear block (cpu/edge_density.cpp,
// cuda/edge_density.cu).
//   hidden layer l: z = h W_l + b_l (b_0 = pair_bias[pair]), y = LayerNorm(z), h = silu(y)
//   LayerNorm: y = (z - mean z) / sqrt(var z + eps) gamma + beta (biased variance)
//   tangent:   dc = dz - mean dz, dvar = 2 mean(c dc), ds = -s^3 dvar / 2, s = 1/sqrt(var+eps),
//              dy = (dc s + c ds) gamma
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "model/plan.h"
#include "ops/activation.h"

namespace e3fuse::ops {

constexpr int kMaxRadialMlpLayers = 8;

// Flat view of a RadialMlpPlan: every array inside `params` (host or device memory).
struct RadialMlpView {
  const double* params = nullptr;
  int layers = 0, max_dim = 0;
  int dims[kMaxRadialMlpLayers + 1] = {};
  int64_t weight[kMaxRadialMlpLayers] = {};  // [dims[l]][dims[l+1]]
  int64_t bias[kMaxRadialMlpLayers] = {};    // layer 0: pair_bias [S * S][dims[1]]
  int64_t gamma[kMaxRadialMlpLayers] = {}, beta[kMaxRadialMlpLayers] = {};
  double eps = 1e-5;
};

// Appends the plan's arrays to `params` and returns their offsets (params pointer unset).
inline RadialMlpView radial_mlp_layout(const RadialMlpPlan& p, std::vector<double>& params) {
  RadialMlpView v;
  v.layers = static_cast<int>(p.weights.size());
  if (v.layers < 1 || v.layers > kMaxRadialMlpLayers) return RadialMlpView{};
  v.eps = p.eps;
  auto put = [&](const std::vector<double>& a) {
    const auto at = static_cast<int64_t>(params.size());
    params.insert(params.end(), a.begin(), a.end());
    return at;
  };
  for (int l = 0; l <= v.layers; ++l) {
    v.dims[l] = p.dims[static_cast<size_t>(l)];
    if (v.dims[l] > v.max_dim) v.max_dim = v.dims[l];
  }
  for (int l = 0; l < v.layers; ++l) {
    v.weight[l] = put(p.weights[static_cast<size_t>(l)]);
    v.bias[l] = put(l == 0 ? p.pair_bias : p.biases[static_cast<size_t>(l)]);
    if (l + 1 < v.layers) {
      v.gamma[l] = put(p.gamma[static_cast<size_t>(l)]);
      v.beta[l] = put(p.beta[static_cast<size_t>(l)]);
    }
  }
  return v;
}

// out[w] = MLP(emb, pair)_w and dout[w] = d out_w / dr given demb = d emb / dr (dout and demb
// may be null together). work: 4 * max_dim doubles.
E3F_HD void radial_mlp_forward(const RadialMlpView& m, int pair, const double* emb,
                               const double* demb, double* out, double* dout, double* work) {
  const bool tangent = dout != nullptr;
  double* h = work;                  // current activations
  double* dh = work + m.max_dim;     // and their tangents
  double* z = work + 2 * m.max_dim;  // pre-activations of the next layer
  double* dz = work + 3 * m.max_dim;
  const int nb = m.dims[0];
  for (int k = 0; k < nb; ++k) {
    h[k] = emb[k];
    dh[k] = tangent ? demb[k] : 0.0;
  }
  for (int l = 0; l < m.layers; ++l) {
    const int K = m.dims[l], N = m.dims[l + 1];
    const double* W = m.params + m.weight[l];
    const double* b = m.params + m.bias[l] + (l == 0 ? static_cast<int64_t>(pair) * N : 0);
    const bool last = l + 1 == m.layers;
    double* zo = last ? out : z;
    double* dzo = last ? dout : dz;
    for (int c = 0; c < N; ++c) {
      zo[c] = b[c];
      if (tangent) dzo[c] = 0.0;
    }
    for (int k = 0; k < K; ++k) {
      const double a = h[k], da = dh[k];
      const double* w = W + static_cast<int64_t>(k) * N;
      for (int c = 0; c < N; ++c) {
        zo[c] += a * w[c];
        if (tangent) dzo[c] += da * w[c];
      }
    }
    if (last) return;
    double mean = 0.0, dmean = 0.0;
    for (int c = 0; c < N; ++c) {
      mean += z[c];
      dmean += dz[c];
    }
    mean /= N;
    dmean /= N;
    double var = 0.0, dvar = 0.0;
    for (int c = 0; c < N; ++c) {
      z[c] -= mean;
      dz[c] -= dmean;
      var += z[c] * z[c];
      dvar += 2.0 * z[c] * dz[c];
    }
    var /= N;
    dvar /= N;
    const double s = 1.0 / std::sqrt(var + m.eps);
    const double ds = -0.5 * s * s * s * dvar;
    const double* gamma = m.params + m.gamma[l];
    const double* beta = m.params + m.beta[l];
    for (int c = 0; c < N; ++c) {
      const double y = z[c] * s * gamma[c] + beta[c];
      const double dy = (dz[c] * s + z[c] * ds) * gamma[c];
      h[c] = activation(Activation::silu, y);
      dh[c] = tangent ? dy * activation_grad(Activation::silu, y) : 0.0;
    }
  }
}

}  // namespace e3fuse::ops
