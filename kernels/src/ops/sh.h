// ops/sh.h: e3nn's real spherical harmonics (normalize=True) of an edge vector,
// evaluated from the homogeneous polynomials stored in the model file:
// Y_l^m(v) = P_l^m(v / |v|), and the vector-Jacobian product
// d/dv [g . Y(v)] = (q - (q . u) u) / |v| with q = sum_m g_m grad P_m(u).
#pragma once

#include <array>
#include <vector>

#include "ops/activation.h"

namespace e3fuse::ops {

// A flat, typed copy of ShPlan: monomials of all degrees in one list.
template <class T>
struct ShTable {
  bool normalize = true;
  int lmax = 0;
  int dim = 0;
  std::vector<int> term_begin;           // per component (dim + 1): range of terms
  std::vector<std::array<int, 3>> exps;  // per term
  std::vector<T> coeffs;                 // per term
};

template <class T>
ShTable<T> make_sh_table(const ShPlan& plan) {
  ShTable<T> t;
  t.normalize = plan.normalize;
  t.lmax = plan.lmax;
  t.dim = plan.dim;
  t.term_begin.push_back(0);
  for (const ShDegree& d : plan.degrees) {
    const int n = static_cast<int>(d.exponents.size());
    for (int m = 0; m < 2 * d.l + 1; ++m) {
      for (int k = 0; k < n; ++k) {
        const double c = d.coeffs[m * n + k];
        if (c == 0.0) continue;
        t.exps.push_back(d.exponents[k]);
        t.coeffs.push_back(static_cast<T>(c));
      }
      t.term_begin.push_back(static_cast<int>(t.exps.size()));
    }
  }
  return t;
}

template <class T>
inline void powers(T x, int n, T* out) {
  out[0] = T(1);
  for (int i = 1; i <= n; ++i) out[i] = out[i - 1] * x;
}

// Y[dim] at unit vector u; if dY is given, dY[3*dim] = grad P_m(u) (not projected).
template <class T>
inline void spherical_harmonics(const ShTable<T>& t, const T u[3], T* Y, T* dP) {
  T px[9], py[9], pz[9];
  powers(u[0], t.lmax, px);
  powers(u[1], t.lmax, py);
  powers(u[2], t.lmax, pz);
  for (int m = 0; m < t.dim; ++m) {
    T y = 0, gx = 0, gy = 0, gz = 0;
    for (int k = t.term_begin[m]; k < t.term_begin[m + 1]; ++k) {
      const auto& e = t.exps[k];
      const T c = t.coeffs[k];
      y += c * px[e[0]] * py[e[1]] * pz[e[2]];
      if (dP) {
        if (e[0]) gx += c * T(e[0]) * px[e[0] - 1] * py[e[1]] * pz[e[2]];
        if (e[1]) gy += c * T(e[1]) * px[e[0]] * py[e[1] - 1] * pz[e[2]];
        if (e[2]) gz += c * T(e[2]) * px[e[0]] * py[e[1]] * pz[e[2] - 1];
      }
    }
    Y[m] = y;
    if (dP) {
      dP[3 * m] = gx;
      dP[3 * m + 1] = gy;
      dP[3 * m + 2] = gz;
    }
  }
}

// grad_v [g . Y(v)] given g[dim], dP from spherical_harmonics(), u = v/r. With
// normalize == false, Y(v) = P(v) was evaluated at v itself and the gradient is q.
template <class T>
inline void spherical_harmonics_vjp(int dim, const T* g, const T* dP, const T u[3], T r, T out[3],
                                    bool normalize = true) {
  T q[3] = {0, 0, 0};
  for (int m = 0; m < dim; ++m) {
    q[0] += g[m] * dP[3 * m];
    q[1] += g[m] * dP[3 * m + 1];
    q[2] += g[m] * dP[3 * m + 2];
  }
  if (!normalize) {
    for (int a = 0; a < 3; ++a) out[a] = q[a];
    return;
  }
  const T qu = q[0] * u[0] + q[1] * u[1] + q[2] * u[2];
  const T inv_r = T(1) / r;
  for (int a = 0; a < 3; ++a) out[a] = (q[a] - qu * u[a]) * inv_r;
}

}  // namespace e3fuse::ops
