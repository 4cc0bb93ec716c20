// cpu/conv.cpp: the SevenNet/NequIP convolution (edge embedding, spherical
// harmonics, radial MLP, channelwise 'uvu' tensor product, sum over neighbors)
// and its hand-written adjoint with respect to node features and positions.
//
// Memory rule (DESIGN §2): nothing with a feature dimension is stored per edge
// of the graph. Each node's edges are processed as one tile in a per-thread
// workspace (size: max neighbors x features), recomputed in the backward pass.
//
// Backward without scatter: for node k and each neighbor j (edge vector v),
// we handle both directed edges of the pair, e1 = (k <- j) with vector v and
// e2 = (j <- k) with vector -v. They share r, the radial MLP and its backward;
// Y_l(-v) = (-1)^l Y_l(v). Node k receives grad_x[k] from e2 (it is e2's sender),
// and its force F_k = sum_j f_kj with f = dE/dv_e1 - dE/dv_e2 (both edges move
// with r_k). Each directed edge is thus visited once at each end; all writes go
// to node k only, so the pass is deterministic and needs no atomics.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include "cpu/ops.h"
#include "e3fuse/error.h"
#include "ops/activation.h"
#include "ops/radial.h"
#include "ops/radial_table.h"
#include "ops/sh.h"
#include "ops/tp.h"

namespace e3fuse::cpu {

namespace {

// Register-blocked micro-kernel: a ROWS x COLS block of C accumulated over all
// of K in registers, then stored once.
template <class T, int ROWS, int COLS>
inline void gemm_block(int K, int N, const T* A, const T* B, T* C, int cols) {
  T acc[ROWS][COLS] = {};
  for (int k = 0; k < K; ++k) {
    const T* b = B + static_cast<size_t>(k) * N;
    for (int r = 0; r < ROWS; ++r) {
      const T a = A[static_cast<size_t>(r) * K + k];
#pragma omp simd
      for (int c = 0; c < COLS; ++c) acc[r][c] += a * b[c];
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < cols; ++c) C[static_cast<size_t>(r) * N + c] = acc[r][c];
}

// C[n x N] = A[n x K] @ B[K x N], all row-major and contiguous.
template <class T>
void gemm(int n, int K, int N, const T* A, const T* B, T* C) {
  constexpr int COLS = 64 / static_cast<int>(sizeof(T));  // two 256-bit registers per row
  int e = 0;
  for (; e + 4 <= n; e += 4) {
    const T* a = A + static_cast<size_t>(e) * K;
    T* c = C + static_cast<size_t>(e) * N;
    int col = 0;
    for (; col + COLS <= N; col += COLS) gemm_block<T, 4, COLS>(K, N, a, B + col, c + col, COLS);
    if (col < N) {  // ragged right edge: pad B through a small copy
      for (int r = 0; r < 4; ++r)
        for (int cc = col; cc < N; ++cc) {
          T s = T(0);
          for (int k = 0; k < K; ++k)
            s += a[static_cast<size_t>(r) * K + k] * B[static_cast<size_t>(k) * N + cc];
          c[static_cast<size_t>(r) * N + cc] = s;
        }
    }
  }
  for (; e < n; ++e) {
    const T* a = A + static_cast<size_t>(e) * K;
    T* c = C + static_cast<size_t>(e) * N;
    int col = 0;
    for (; col + COLS <= N; col += COLS) gemm_block<T, 1, COLS>(K, N, a, B + col, c + col, COLS);
    for (int cc = col; cc < N; ++cc) {
      T s = T(0);
      for (int k = 0; k < K; ++k) s += a[k] * B[static_cast<size_t>(k) * N + cc];
      c[cc] = s;
    }
  }
}

template <class T>
struct Tile {
  int n = 0;
  std::vector<int32_t> sender;
  std::vector<T> vec, r, u, Y, dP, emb, demb;
  std::vector<double> r_f64;
  std::vector<std::vector<T>> pre, hidden;  // radial MLP, per hidden layer [n][h]
  std::vector<T> weights, grad_w, grad_h, grad_h2;
  std::vector<T> dYc, dr;     // backward: combined angular adjoint [n][sh_dim], dE/dr [n]
  std::vector<int> interval;  // radial table: each edge's interval and local coordinate
  std::vector<T> local_t;
  std::vector<int> pair;  // s_receiver * num_species + s_sender
  // Ordered-pair radial weights (Conv::radial_mlp): the other direction's pair, s_j S + s_i,
  // its weights and their adjoint (conv_backward's e2 = (j <- k)).
  std::vector<int> pair_reverse;
  std::vector<T> weights_reverse, grad_w_reverse;
  // the exact ordered-pair MLP (pair_mlp_weights): dR/dr of both directions, and its
  // double workspace (kept with the tile: no allocation per node)
  std::vector<T> dweights, dweights_reverse;
  std::vector<double> mlp_emb, mlp_demb, mlp_out, mlp_dout, mlp_work;
  std::vector<T> cut, dcut, raw;  // apply_cutoff false: f(r), f'(r), MLP output before f
  std::vector<T> M, A1, A2, dY1, dY2;

  void reserve_edges(int64_t count, int sh_dim, int num_basis) {
    const size_t c = static_cast<size_t>(count);
    sender.resize(c);
    vec.resize(3 * c);
    r.resize(c);
    r_f64.resize(c);
    u.resize(3 * c);
    Y.resize(c * sh_dim);
    dP.resize(3 * c * sh_dim);
    emb.resize(c * num_basis);
    demb.resize(c * num_basis);
    pair.resize(c);
    pair_reverse.resize(c);
    cut.resize(c);
    dcut.resize(c);
  }
};

// Collects node i's edges inside the cutoff with their geometry and (unless the
// radial MLP is tabulated) embedding. Returns false if two atoms coincide (r == 0).
template <class T>
bool gather_tile(const TypedPlan<T>& plan, const GraphView& g, int64_t i, bool with_grad,
                 bool with_embedding, Tile<T>& t) {
  const int64_t begin = g.row_offsets[i], end = g.row_offsets[i + 1];
  const int sh_dim = plan.sh.dim, nb = plan.num_basis;
  t.reserve_edges(end - begin, sh_dim, nb);
  const double cutoff2 = plan.cutoff * plan.cutoff;
  const double* pi = g.positions + 3 * i;
  int n = 0;
  for (int64_t e = begin; e < end; ++e) {
    const int32_t j = g.neighbors[e];
    const double* pj = g.positions + 3 * static_cast<int64_t>(j);
    double v[3] = {pj[0] - pi[0], pj[1] - pi[1], pj[2] - pi[2]};
    if (g.shift_index) {
      const double* s = g.shifts + 3 * static_cast<int64_t>(g.shift_index[e]);
      v[0] += s[0];
      v[1] += s[1];
      v[2] += s[2];
    }
    const double r2 = v[0] * v[0] + v[1] * v[1] + v[2] * v[2];
    if (r2 >= cutoff2) continue;
    if (r2 == 0.0) return false;
    const double r = std::sqrt(r2);
    t.sender[n] = j;
    t.pair[n] = g.species[i] * plan.num_species + g.species[j];
    t.pair_reverse[n] = g.species[j] * plan.num_species + g.species[i];
    for (int a = 0; a < 3; ++a) {
      t.vec[3 * n + a] = static_cast<T>(v[a]);
      t.u[3 * n + a] = static_cast<T>(v[a] / r);
    }
    t.r[n] = static_cast<T>(r);
    t.r_f64[n] = r;
    ++n;
  }
  t.n = n;
  for (int e = 0; e < n; ++e) {
    ops::spherical_harmonics(plan.sh, plan.sh.normalize ? &t.u[3 * e] : &t.vec[3 * e],
                             &t.Y[static_cast<size_t>(e) * sh_dim],
                             with_grad ? &t.dP[3 * static_cast<size_t>(e) * sh_dim] : nullptr);
    if (!with_embedding) continue;
    // In double whatever T is: cheap per edge, and it keeps float32 accurate near the cutoff.
    double emb[64], demb[64];
    if (plan.mace_embedding) {
      const double r0 = plan.pair_dependent ? plan.pair_r0[static_cast<size_t>(t.pair[e])] : 1.0;
      double f = 1.0, df = 0.0;
      ops::mace_edge_embedding(nb, plan.radial_coeffs_f64.data(), plan.radial_prefactor_f64,
                               plan.envelope, plan.transform, plan.apply_cutoff, t.r_f64[e], r0,
                               emb, with_grad ? demb : nullptr, f, df);
      t.cut[e] = static_cast<T>(f);
      t.dcut[e] = static_cast<T>(df);
    } else {
      ops::edge_embedding(nb, plan.radial_coeffs_f64.data(), plan.radial_prefactor_f64,
                          plan.envelope, t.r_f64[e], emb, with_grad ? demb : nullptr);
    }
    for (int b = 0; b < nb; ++b) {
      t.emb[static_cast<size_t>(e) * nb + b] = static_cast<T>(emb[b]);
      if (with_grad) t.demb[static_cast<size_t>(e) * nb + b] = static_cast<T>(demb[b]);
    }
  }
  return true;
}

// Radial MLP forward on the tile: t.weights[n][weight_numel], keeping
// pre-activations and activations of hidden layers for the backward pass.
template <class T>
void mlp_forward(const Mlp<T>& mlp, Tile<T>& t) {
  const int layers = static_cast<int>(mlp.weight.size());
  t.pre.resize(layers);
  t.hidden.resize(layers);
  const T* h = t.emb.data();
  for (int li = 0; li < layers; ++li) {
    const int K = mlp.dims[li], N = mlp.dims[li + 1];
    std::vector<T>& out = (li + 1 < layers) ? t.pre[li] : t.weights;
    out.resize(static_cast<size_t>(t.n) * N);
    gemm(t.n, K, N, h, mlp.weight[li].data(), out.data());
    if (li + 1 < layers) {
      std::vector<T>& act = t.hidden[li];
      act.resize(out.size());
      for (size_t q = 0; q < out.size(); ++q)
        act[q] = ops::activation(mlp.act, out[q]) * mlp.act_scale;
      h = act.data();
    }
  }
}

// Backward of the radial MLP: from t.grad_w [n][numel] to dE/dr per edge (into t.dr).
template <class T>
void mlp_backward_to_r(const Mlp<T>& mlp, int num_basis, Tile<T>& t) {
  const int layers = static_cast<int>(mlp.weight.size());
  std::vector<T>* g = &t.grad_w;
  for (int li = layers - 1; li >= 0; --li) {
    const int K = mlp.dims[li], N = mlp.dims[li + 1];
    std::vector<T>& dh = (g == &t.grad_h) ? t.grad_h2 : t.grad_h;
    dh.resize(static_cast<size_t>(t.n) * K);
    gemm(t.n, N, K, g->data(), mlp.weight_t[li].data(), dh.data());
    if (li > 0) {
      const std::vector<T>& pre = t.pre[li - 1];
      for (size_t q = 0; q < dh.size(); ++q)
        dh[q] *= ops::activation_grad(mlp.act, pre[q]) * mlp.act_scale;
    }
    g = &dh;
  }
  // g now holds dE/d emb [n][num_basis]
  t.dr.resize(t.n);
  for (int e = 0; e < t.n; ++e) {
    T s = T(0);
    for (int b = 0; b < num_basis; ++b)
      s += (*g)[static_cast<size_t>(e) * num_basis + b] *
           t.demb[static_cast<size_t>(e) * num_basis + b];
    t.dr[e] = s;
  }
}

// The tabulated radial MLP (ops/radial_table.h): t.weights [n][numel], and each edge's
// interval and local coordinate for the backward.
template <class T>
void table_weights(const Conv<T>& conv, int64_t numel, Tile<T>& t) {
  t.weights.resize(static_cast<size_t>(t.n) * numel);
  t.interval.resize(t.n);
  t.local_t.resize(t.n);
  for (int e = 0; e < t.n; ++e) {
    const RadialTable<T>& table = conv.table_for_pair(t.pair[e]);
    double x = 0.0;
    ops::radial_table_locate(t.r_f64[e], table.origin, table.inv_step, table.intervals,
                             table.fine_intervals, table.coarse_shift, t.interval[e], x);
    t.local_t[e] = static_cast<T>(x);
    const T* c = table.coeffs.data() + static_cast<size_t>(t.interval[e]) * numel * 4;
    T* w = t.weights.data() + static_cast<size_t>(e) * numel;
    for (int64_t q = 0; q < numel; ++q) w[q] = ops::radial_table_value(c + 4 * q, t.local_t[e]);
  }
}

// The weights of the reverse pairs (t.pair_reverse) into t.weights_reverse, at the intervals
// table_weights found (all pair tables share one grid).
template <class T>
void table_weights_reverse(const Conv<T>& conv, int64_t numel, Tile<T>& t) {
  t.weights_reverse.resize(static_cast<size_t>(t.n) * numel);
  for (int e = 0; e < t.n; ++e) {
    const RadialTable<T>& table = conv.table_for_pair(t.pair_reverse[e]);
    const T* c = table.coeffs.data() + static_cast<size_t>(t.interval[e]) * numel * 4;
    T* w = t.weights_reverse.data() + static_cast<size_t>(e) * numel;
    for (int64_t q = 0; q < numel; ++q) w[q] = ops::radial_table_value(c + 4 * q, t.local_t[e]);
  }
}

// sum_q gw[q] dR_q/dr of one edge's table entry.
template <class T>
T table_slope_dot(const RadialTable<T>& table, int64_t numel, int interval, T local_t,
                  const T* gw) {
  const T inv_step = static_cast<T>(table.inv_step);
  const T* c = table.coeffs.data() + static_cast<size_t>(interval) * numel * 4;
  T s = T(0);
  for (int64_t q = 0; q < numel; ++q)
    s += gw[q] * ops::radial_table_grad(c + 4 * q, local_t, inv_step);
  return s;
}

// dE/dr per edge (into t.dr) from t.grad_w = dE/dR [n][numel], after table_weights (and
// with ordered pairs t.grad_w_reverse through the reverse pair's table).
template <class T>
void table_backward_to_r(const Conv<T>& conv, int64_t numel, Tile<T>& t) {
  t.dr.resize(t.n);
  const bool ordered = conv.radial_mlp != nullptr;
  for (int e = 0; e < t.n; ++e) {
    const size_t at = static_cast<size_t>(e) * numel;
    T s = table_slope_dot(conv.table_for_pair(t.pair[e]), numel, t.interval[e], t.local_t[e],
                          t.grad_w.data() + at);
    if (ordered)
      s += table_slope_dot(conv.table_for_pair(t.pair_reverse[e]), numel, t.interval[e],
                           t.local_t[e], t.grad_w_reverse.data() + at);
    t.dr[e] = s;
  }
}

// mace's RadialMLP of the ordered species pair, exactly per edge in double
// (ops::radial_mlp_forward in tangent mode; the non-linear block without tables): t.weights
// and, with `both`, the reverse pair's weights and both directions' dR/dr. With apply_cutoff
// false, R = MLP(emb) f(r) as the tables hold it.
template <class T>
void pair_mlp_weights(const TypedPlan<T>& plan, const Conv<T>& conv, bool both, Tile<T>& t) {
  const ops::RadialMlpView view = conv.radial_mlp_view();
  const int nb = plan.num_basis;
  const size_t numel = static_cast<size_t>(conv.weight_numel);
  t.weights.resize(static_cast<size_t>(t.n) * numel);
  if (both) {
    t.weights_reverse.resize(t.weights.size());
    t.dweights.resize(t.weights.size());
    t.dweights_reverse.resize(t.weights.size());
  }
  std::vector<double>&emb = t.mlp_emb, &demb = t.mlp_demb, &out = t.mlp_out, &dout = t.mlp_dout;
  emb.resize(nb);
  demb.resize(nb);
  out.resize(numel);
  dout.resize(numel);
  t.mlp_work.resize(4 * static_cast<size_t>(view.max_dim));
  for (int e = 0; e < t.n; ++e) {
    for (int b = 0; b < nb; ++b) {
      emb[b] = static_cast<double>(t.emb[static_cast<size_t>(e) * nb + b]);
      demb[b] = both ? static_cast<double>(t.demb[static_cast<size_t>(e) * nb + b]) : 0.0;
    }
    const double f = plan.apply_cutoff ? 1.0 : static_cast<double>(t.cut[e]);
    const double df = plan.apply_cutoff ? 0.0 : static_cast<double>(t.dcut[e]);
    for (int direction = 0; direction < (both ? 2 : 1); ++direction) {
      const int pair = direction == 0 ? t.pair[e] : t.pair_reverse[e];
      // an edge between two atoms of one species: the reverse pair is the same pair, and
      // out / dout still hold its values
      if (direction == 0 || pair != t.pair[e])
        ops::radial_mlp_forward(view, pair, emb.data(), both ? demb.data() : nullptr, out.data(),
                                both ? dout.data() : nullptr, t.mlp_work.data());
      T* w = (direction == 0 ? t.weights : t.weights_reverse).data() + e * numel;
      for (size_t q = 0; q < numel; ++q) w[q] = static_cast<T>(out[q] * f);
      if (!both) continue;
      T* dw = (direction == 0 ? t.dweights : t.dweights_reverse).data() + e * numel;
      for (size_t q = 0; q < numel; ++q) dw[q] = static_cast<T>(dout[q] * f + out[q] * df);
    }
  }
}

// The radial weights R(r) of the tile's edges into t.weights: per edge through the MLP,
// or from the table (the exact ordered-pair MLP: pair_mlp_weights).
// With apply_cutoff false (MACE) the MLP's output is multiplied by the envelope f(r), and
// t.raw keeps it before that for the backward pass (the tables include f).
template <class T>
void radial_weights(const TypedPlan<T>& plan, const Conv<T>& conv, Tile<T>& t) {
  if (conv.tabulated()) {
    table_weights(conv, conv.weight_numel, t);
    return;
  }
  mlp_forward(conv.mlp, t);
  if (plan.apply_cutoff) return;
  t.raw = t.weights;
  const size_t numel = static_cast<size_t>(conv.weight_numel);
  for (int e = 0; e < t.n; ++e)
    for (size_t q = 0; q < numel; ++q) t.weights[e * numel + q] *= t.cut[e];
}

// dE/dr per edge into t.dr from t.grad_w = dE/dR (consumed).
template <class T>
void radial_backward_to_r(const TypedPlan<T>& plan, const Conv<T>& conv, Tile<T>& t) {
  if (conv.tabulated()) {
    table_backward_to_r(conv, conv.weight_numel, t);
    return;
  }
  if (conv.radial_mlp) {  // the exact ordered-pair MLP: both directions' dR/dr
    const size_t numel = static_cast<size_t>(conv.weight_numel);
    t.dr.resize(t.n);
    for (int e = 0; e < t.n; ++e) {
      T s = T(0);
      for (size_t q = 0; q < numel; ++q)
        s += t.grad_w[e * numel + q] * t.dweights[e * numel + q] +
             t.grad_w_reverse[e * numel + q] * t.dweights_reverse[e * numel + q];
      t.dr[e] = s;
    }
    return;
  }
  if (plan.apply_cutoff) {
    mlp_backward_to_r(conv.mlp, plan.num_basis, t);
    return;
  }
  // R = MLP(emb) f(r): dE/dr = (dE/dR f) . dMLP/dr + (dE/dR . MLP) f'(r)
  const size_t numel = static_cast<size_t>(conv.weight_numel);
  std::vector<T> slope(t.n);
  for (int e = 0; e < t.n; ++e) {
    T s = T(0);
    for (size_t q = 0; q < numel; ++q) {
      s += t.grad_w[e * numel + q] * t.raw[e * numel + q];
      t.grad_w[e * numel + q] *= t.cut[e];
    }
    slope[e] = s * t.dcut[e];
  }
  mlp_backward_to_r(conv.mlp, plan.num_basis, t);
  for (int e = 0; e < t.n; ++e) t.dr[e] += slope[e];
}

template <class T>
void coincident_error(const GraphView& g, int64_t i) {
  (void)g;
  throw Error("two atoms are at the same position (atom " + std::to_string(i) +
              " and a neighbor at distance 0)");
}

// Path kernels: compile-time specialized for l <= 3 (ops/tp.h), generic otherwise.
template <class T>
struct PathForward {
  const typename Conv<T>::Path& p;
  const T *Y, *x, *w;
  T* y;
  template <int L1, int L2, int L3>
  void run() {
    ops::tp_path_forward<T, 2 * L1 + 1, 2 * L2 + 1, 2 * L3 + 1>(p.mul, p.cg.data(), Y, x, w, y);
  }
  void generic(std::vector<T>& M) {
    const int d1 = p.d1, d2 = p.d2, d3 = p.d3;
    M.assign(static_cast<size_t>(d1) * d3, T(0));
    for (int a = 0; a < d1; ++a)
      for (int b = 0; b < d2; ++b)
        for (int k = 0; k < d3; ++k) M[a * d3 + k] += p.cg[(a * d2 + b) * d3 + k] * Y[b];
    const int mul = p.mul;
    for (int u = 0; u < mul; ++u)
      for (int k = 0; k < d3; ++k) {
        T s = T(0);
        for (int a = 0; a < d1; ++a) s += x[a * mul + u] * M[a * d3 + k];
        y[k * mul + u] += w[u] * s;
      }
  }
};

template <class T>
struct PathBackward {
  const typename Conv<T>::Path& p;
  T s;
  const T *Y, *xj, *xk, *gk, *gj, *w, *w2;  // w2: e2's weights (== w unless ordered pairs)
  T *gw, *gw2, *gxk, *dY1, *dY2;            // gw2 null: gw takes both edges' adjoints
  template <int L1, int L2, int L3>
  void run() {
    ops::tp_path_backward<T, 2 * L1 + 1, 2 * L2 + 1, 2 * L3 + 1>(
        p.mul, s, p.cg.data(), Y, xj, xk, gk, gj, w, w2, gw, gw2, gxk, dY1, dY2);
  }
  void generic(std::vector<T>& M, std::vector<T>& A1, std::vector<T>& A2) {
    const int d1 = p.d1, d2 = p.d2, d3 = p.d3;
    M.assign(static_cast<size_t>(d1) * d3, T(0));
    A1.assign(M.size(), T(0));
    A2.assign(M.size(), T(0));
    for (int a = 0; a < d1; ++a)
      for (int b = 0; b < d2; ++b)
        for (int k = 0; k < d3; ++k) M[a * d3 + k] += p.cg[(a * d2 + b) * d3 + k] * Y[b];
    const int mul = p.mul;
    for (int u = 0; u < mul; ++u) {
      T dw1 = T(0), dw2 = T(0);
      for (int a = 0; a < d1; ++a) {
        T mg1 = T(0), mg2 = T(0);
        for (int q = 0; q < d3; ++q) {
          mg1 += M[a * d3 + q] * gk[q * mul + u];
          mg2 += M[a * d3 + q] * gj[q * mul + u];
        }
        dw1 += xj[a * mul + u] * mg1;
        dw2 += xk[a * mul + u] * mg2;
        gxk[a * mul + u] += w2[u] * s * mg2;
        for (int q = 0; q < d3; ++q) {
          A1[a * d3 + q] += w[u] * xj[a * mul + u] * gk[q * mul + u];
          A2[a * d3 + q] += w2[u] * xk[a * mul + u] * gj[q * mul + u];
        }
      }
      if (gw2) {
        gw[u] = dw1;
        gw2[u] = s * dw2;
      } else {
        gw[u] = dw1 + s * dw2;
      }
    }
    for (int b = 0; b < d2; ++b)
      for (int a = 0; a < d1; ++a)
        for (int q = 0; q < d3; ++q) {
          dY1[b] += p.cg[(a * d2 + b) * d3 + q] * A1[a * d3 + q];
          dY2[b] += p.cg[(a * d2 + b) * d3 + q] * A2[a * d3 + q];
        }
  }
};

}  // namespace

template <class T>
void conv_forward(const TypedPlan<T>& plan, const Conv<T>& conv, const GraphView& g, const T* x,
                  T* y) {
  std::atomic<int64_t> bad_node{-1};
#pragma omp parallel
  {
    Tile<T> t;
    std::vector<T> M;
#pragma omp for schedule(dynamic, 2)
    for (int64_t i = 0; i < g.num_nodes; ++i) {
      T* yi = y + i * conv.dim_out;
      std::fill(yi, yi + conv.dim_out, T(0));
      if (!gather_tile(plan, g, i, false, !conv.tabulated(), t)) {
        bad_node = i;
        continue;
      }
      if (t.n == 0) continue;
      if (conv.radial_mlp && !conv.tabulated())
        pair_mlp_weights(plan, conv, false, t);
      else
        radial_weights(plan, conv, t);
      const int sh_dim = plan.sh.dim;
      for (int e = 0; e < t.n; ++e) {
        const T* xj = x + static_cast<int64_t>(t.sender[e]) * conv.dim_in;
        const T* w = t.weights.data() + static_cast<size_t>(e) * conv.weight_numel;
        const T* Y = t.Y.data() + static_cast<size_t>(e) * sh_dim;
        for (const auto& p : conv.paths) {
          PathForward<T> f{p, Y + p.sh_offset, xj + p.in_offset, w + p.weight_offset,
                           yi + p.out_offset};
          if (!ops::dispatch_l123(p.d1 / 2, p.l2, p.d3 / 2, f)) f.generic(M);
        }
      }
      for (int64_t q = 0; q < conv.dim_out; ++q) yi[q] *= conv.inv_denominator;
    }
  }
  if (bad_node >= 0) coincident_error<T>(g, bad_node);
}

template <class T>
void conv_backward(const TypedPlan<T>& plan, const Conv<T>& conv, const GraphView& g, const T* x,
                   const T* grad_y, T* grad_x, double* forces, double* atom_virials) {
  std::atomic<int64_t> bad_node{-1};
  const int sh_dim = plan.sh.dim;
  std::vector<T> parity(sh_dim);
  for (int l = 0, m = 0; m < sh_dim; ++l)
    for (int q = 0; q < 2 * l + 1; ++q, ++m) parity[m] = (l % 2) ? T(-1) : T(1);
#pragma omp parallel
  {
    Tile<T> t;
    std::vector<T> M, A1, A2, dY1(sh_dim), dY2(sh_dim);
#pragma omp for schedule(dynamic, 2)
    for (int64_t k = 0; k < g.num_nodes; ++k) {
      T* gxk = grad_x + k * conv.dim_in;
      std::fill(gxk, gxk + conv.dim_in, T(0));
      if (!gather_tile(plan, g, k, true, !conv.tabulated(), t)) {
        bad_node = k;
        continue;
      }
      if (t.n == 0) continue;
      // Ordered-pair weights (mace's non-linear block): from the tables, or exact per edge
      const bool ordered = conv.radial_mlp != nullptr;
      if (ordered && !conv.tabulated())
        pair_mlp_weights(plan, conv, true, t);
      else
        radial_weights(plan, conv, t);
      t.grad_w.assign(static_cast<size_t>(t.n) * conv.weight_numel, T(0));
      if (ordered) {
        if (conv.tabulated()) table_weights_reverse(conv, conv.weight_numel, t);
        t.grad_w_reverse.assign(t.grad_w.size(), T(0));
      }
      std::vector<T>& dYc = t.dYc;
      dYc.resize(static_cast<size_t>(t.n) * sh_dim);
      const T* xk = x + k * conv.dim_in;
      const T* gk = grad_y + k * conv.dim_out;
      for (int e = 0; e < t.n; ++e) {
        const int64_t j = t.sender[e];
        const T* xj = x + j * conv.dim_in;
        const T* gj = grad_y + j * conv.dim_out;
        const size_t at = static_cast<size_t>(e) * conv.weight_numel;
        const T* w = t.weights.data() + at;
        const T* w2 = ordered ? t.weights_reverse.data() + at : w;
        T* gw = t.grad_w.data() + at;
        T* gw2 = ordered ? t.grad_w_reverse.data() + at : nullptr;
        const T* Y = t.Y.data() + static_cast<size_t>(e) * sh_dim;
        std::fill(dY1.begin(), dY1.end(), T(0));
        std::fill(dY2.begin(), dY2.end(), T(0));
        for (const auto& p : conv.paths) {
          PathBackward<T> f{p,
                            (p.l2 % 2) ? T(-1) : T(1),
                            Y + p.sh_offset,
                            xj + p.in_offset,
                            xk + p.in_offset,
                            gk + p.out_offset,
                            gj + p.out_offset,
                            w + p.weight_offset,
                            w2 + p.weight_offset,
                            gw + p.weight_offset,
                            gw2 ? gw2 + p.weight_offset : nullptr,
                            gxk + p.in_offset,
                            dY1.data() + p.sh_offset,
                            dY2.data() + p.sh_offset};
          if (!ops::dispatch_l123(p.d1 / 2, p.l2, p.d3 / 2, f)) f.generic(M, A1, A2);
        }
        for (int64_t q = 0; q < conv.weight_numel; ++q) gw[q] *= conv.inv_denominator;
        if (gw2)
          for (int64_t q = 0; q < conv.weight_numel; ++q) gw2[q] *= conv.inv_denominator;
        // Combined angular adjoint (see header): dY1 + (-1)^l dY2.
        T* dyc = dYc.data() + static_cast<size_t>(e) * sh_dim;
        for (int m = 0; m < sh_dim; ++m)
          dyc[m] = (dY1[m] + parity[m] * dY2[m]) * conv.inv_denominator;
      }
      for (int64_t q = 0; q < conv.dim_in; ++q) gxk[q] *= conv.inv_denominator;
      radial_backward_to_r(plan, conv, t);  // dE/dr per edge in t.dr
      double fk[3] = {0, 0, 0};
      double wk[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
      for (int e = 0; e < t.n; ++e) {
        T f[3];
        const T* u = &t.u[3 * e];
        ops::spherical_harmonics_vjp(sh_dim, &dYc[static_cast<size_t>(e) * sh_dim],
                                     &t.dP[3 * static_cast<size_t>(e) * sh_dim], u, t.r[e], f,
                                     plan.sh.normalize);
        const T dr = t.dr[e];
        for (int a = 0; a < 3; ++a) {
          f[a] += dr * u[a];
          fk[a] += static_cast<double>(f[a]);
        }
        if (atom_virials) {
          for (int a = 0; a < 3; ++a)
            for (int b = 0; b < 3; ++b)
              wk[3 * a + b] -= 0.5 * static_cast<double>(t.vec[3 * e + a]) * f[b];
        }
      }
      for (int a = 0; a < 3; ++a) forces[3 * k + a] += fk[a];
      if (atom_virials)
        for (int q = 0; q < 9; ++q) atom_virials[9 * k + q] += wk[q];
    }
  }
  if (bad_node >= 0) coincident_error<T>(g, bad_node);
}

template void conv_forward<float>(const TypedPlan<float>&, const Conv<float>&, const GraphView&,
                                  const float*, float*);
template void conv_forward<double>(const TypedPlan<double>&, const Conv<double>&, const GraphView&,
                                   const double*, double*);
template void conv_backward<float>(const TypedPlan<float>&, const Conv<float>&, const GraphView&,
                                   const float*, const float*, float*, double*, double*);
template void conv_backward<double>(const TypedPlan<double>&, const Conv<double>&, const GraphView&,
                                    const double*, const double*, double*, double*, double*);

}  // namespace e3fuse::cpu
