// ops/tp.h: one 'uvu' path of the channelwise tensor product, forward and adjoint,
// specialized at compile time on the irrep dimensions D1 = 2 l1 + 1 (node feature),
// D2 = 2 l2 + 1 (spherical harmonic), D3 = 2 l3 + 1 (output), so the small inner
// loops unroll. For one edge and channel u:
//   y[u, k] += w[u] * sum_ij cg[i, j, k] x[u, i] Y[j] = w[u] * sum_i x[u, i] M[i, k]
// with M = cg . Y computed once per edge and path.
#pragma once

#include "ops/activation.h"

namespace e3fuse::ops {

template <class T, int D1, int D2, int D3>
E3F_HD void tp_contract_sh(const T* cg, const T* Y, T* M) {
  for (int q = 0; q < D1 * D3; ++q) M[q] = T(0);
  for (int a = 0; a < D1; ++a)
    for (int b = 0; b < D2; ++b) {
      const T yb = Y[b];
      for (int k = 0; k < D3; ++k) M[a * D3 + k] += cg[(a * D2 + b) * D3 + k] * yb;
    }
}

// Node features of the convolution are stored "ir_mul": block (mul, l) holds
// x[a][u] at offset + a * mul + u, so every inner loop below runs over the
// channel u with unit stride and vectorizes; the irrep loops unroll.
template <class T, int D1, int D2, int D3>
E3F_HD void tp_path_forward(int mul, const T* cg, const T* Y, const T* x, const T* w, T* y) {
  T M[D1 * D3];
  tp_contract_sh<T, D1, D2, D3>(cg, Y, M);
  for (int k = 0; k < D3; ++k) {
    T* yk = y + k * mul;
#pragma omp simd
    for (int u = 0; u < mul; ++u) {
      T s = T(0);
      for (int a = 0; a < D1; ++a) s += M[a * D3 + k] * x[a * mul + u];
      yk[u] += w[u] * s;
    }
  }
}

// Adjoint for the pair (k <- j) = e1 and (j <- k) = e2 handled at node k (see
// cpu/conv.cpp): given x_j, x_k, g_k = dE/dy_k, g_j = dE/dy_j and the parity sign
// s = (-1)^l2 (Y(-v) = s Y(v)), the radial weights w1 of e1 and w2 of e2 (the same array
// unless the weights depend on the ordered species pair, mace's non-linear block), produce
//   grad_w1[u] = dE/dw_e1[u] + dE/dw_e2[u]        (overwritten; grad_w2 null: w1 == w2)
//   or grad_w1[u] = dE/dw_e1[u], grad_w2[u] = dE/dw_e2[u]
//   grad_xk[a, u] += dE/dx_k via e2
//   dY1[j] += dE/dY(v) via e1, dY2[j] += dE/dY(-v) via e2.
template <class T, int D1, int D2, int D3>
E3F_HD void tp_path_backward(int mul, T s, const T* cg, const T* Y, const T* xj, const T* xk,
                             const T* gk, const T* gj, const T* w1, const T* w2, T* grad_w1,
                             T* grad_w2, T* grad_xk, T* dY1, T* dY2) {
  T M[D1 * D3];
  tp_contract_sh<T, D1, D2, D3>(cg, Y, M);
#pragma omp simd
  for (int u = 0; u < mul; ++u) {
    T dw1 = T(0), dw2 = T(0);
    const T ws = w2[u] * s;
    for (int a = 0; a < D1; ++a) {
      T mg1 = T(0), mg2 = T(0);
      for (int q = 0; q < D3; ++q) {
        mg1 += M[a * D3 + q] * gk[q * mul + u];
        mg2 += M[a * D3 + q] * gj[q * mul + u];
      }
      dw1 += xj[a * mul + u] * mg1;
      dw2 += xk[a * mul + u] * mg2;
      grad_xk[a * mul + u] += ws * mg2;
    }
    if (grad_w2) {
      grad_w1[u] = dw1;
      grad_w2[u] = s * dw2;
    } else {
      grad_w1[u] = dw1 + s * dw2;
    }
  }
  T A1[D1 * D3], A2[D1 * D3];
  if constexpr (D1 * D3 < 9) {  // few (a, q): one reduction loop each
    for (int a = 0; a < D1; ++a)
      for (int q = 0; q < D3; ++q) {
        T s1 = T(0), s2 = T(0);
        const T* xja = xj + a * mul;
        const T* xka = xk + a * mul;
        const T* gkq = gk + q * mul;
        const T* gjq = gj + q * mul;
#pragma omp simd reduction(+ : s1, s2)
        for (int u = 0; u < mul; ++u) {
          s1 += w1[u] * xja[u] * gkq[u];
          s2 += w2[u] * xka[u] * gjq[u];
        }
        A1[a * D3 + q] = s1;
        A2[a * D3 + q] = s2;
      }
  } else {
    // A1[a, q] = sum_u w_u xj[a, u] gk[q, u] (and A2 with xk, gj); dY = cg . A.
    // Accumulated in V-lane partial sums (one SIMD register wide) over chunks of
    // u, so each chunk's operands are loaded once; lanes are summed at the end.
    constexpr int V = 32 / static_cast<int>(sizeof(T));
    T acc1[D1 * D3][V], acc2[D1 * D3][V];
    for (int q = 0; q < D1 * D3; ++q)
      for (int l = 0; l < V; ++l) acc1[q][l] = acc2[q][l] = T(0);
    int u0 = 0;
    for (; u0 + V <= mul; u0 += V) {
      T wx1[D1][V], wx2[D1][V];
      for (int a = 0; a < D1; ++a)
        for (int l = 0; l < V; ++l) {
          wx1[a][l] = w1[u0 + l] * xj[a * mul + u0 + l];
          wx2[a][l] = w2[u0 + l] * xk[a * mul + u0 + l];
        }
      for (int q = 0; q < D3; ++q) {
        T gkq[V], gjq[V];
        for (int l = 0; l < V; ++l) {
          gkq[l] = gk[q * mul + u0 + l];
          gjq[l] = gj[q * mul + u0 + l];
        }
        for (int a = 0; a < D1; ++a)
          for (int l = 0; l < V; ++l) {
            acc1[a * D3 + q][l] += wx1[a][l] * gkq[l];
            acc2[a * D3 + q][l] += wx2[a][l] * gjq[l];
          }
      }
    }
    for (int a = 0; a < D1; ++a)
      for (int q = 0; q < D3; ++q) {
        T s1 = T(0), s2 = T(0);
        for (int l = 0; l < V; ++l) {
          s1 += acc1[a * D3 + q][l];
          s2 += acc2[a * D3 + q][l];
        }
        for (int u = u0; u < mul; ++u) {  // tail
          s1 += w1[u] * xj[a * mul + u] * gk[q * mul + u];
          s2 += w2[u] * xk[a * mul + u] * gj[q * mul + u];
        }
        A1[a * D3 + q] = s1;
        A2[a * D3 + q] = s2;
      }
  }
  for (int b = 0; b < D2; ++b) {
    T s1 = T(0), s2 = T(0);
    for (int a = 0; a < D1; ++a)
      for (int q = 0; q < D3; ++q) {
        const T c = cg[(a * D2 + b) * D3 + q];
        s1 += c * A1[a * D3 + q];
        s2 += c * A2[a * D3 + q];
      }
    dY1[b] += s1;
    dY2[b] += s2;
  }
}

// Calls F::template run<L1, L2, L3>() for l1, l2, l3 <= 3; returns false otherwise.
template <class F>
bool dispatch_l123(int l1, int l2, int l3, F&& f) {
#define E3F_L3(A, B, C)        \
  if (l3 == C) {               \
    f.template run<A, B, C>(); \
    return true;               \
  }
#define E3F_L2(A, B)                                                              \
  if (l2 == B) {                                                                  \
    E3F_L3(A, B, 0) E3F_L3(A, B, 1) E3F_L3(A, B, 2) E3F_L3(A, B, 3) return false; \
  }
#define E3F_L1(A)                                                     \
  if (l1 == A) {                                                      \
    E3F_L2(A, 0) E3F_L2(A, 1) E3F_L2(A, 2) E3F_L2(A, 3) return false; \
  }
  E3F_L1(0)
  E3F_L1(1)
  E3F_L1(2) E3F_L1(3)
#undef E3F_L1
#undef E3F_L2
#undef E3F_L3
      return false;
}

}  // namespace e3fuse::ops
