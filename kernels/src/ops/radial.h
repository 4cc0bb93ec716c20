// ops/radial.h: the edge embedding of SevenNet/NequIP, emb_n(r) = B_n(r) * f_env(r)
// with the Bessel basis B_n(r) = prefactor * sin(c_n r) / r (c_n trainable) and
// the XPLOR or polynomial (DimeNet, arXiv:2003.03123 eq. 8) envelope, and d emb_n / dr.
#pragma once

#include <cmath>

#include "model/plan.h"
#include "ops/activation.h"

namespace e3fuse::ops {

struct EnvelopeParams {
  EnvelopeKind kind;
  double r_cut, r_on, p;
};

// Envelope value and derivative at r (r < r_cut).
template <class T>
E3F_HD void envelope(const EnvelopeParams& e, T r, T& value, T& grad) {
  if (e.kind == EnvelopeKind::xplor) {
    if (r < T(e.r_on)) {
      value = T(1);
      grad = T(0);
      return;
    }
    const T rc2 = T(e.r_cut * e.r_cut), ron2 = T(e.r_on * e.r_on), r2 = r * r;
    const T denom = (rc2 - ron2) * (rc2 - ron2) * (rc2 - ron2);
    const T a = rc2 - r2, b = rc2 + T(2) * r2 - T(3) * ron2;
    value = a * a * b / denom;
    // d/dr [a^2 b] = 2 a (-2r) b + a^2 (4r)
    grad = (T(-4) * r * a * b + T(4) * r * a * a) / denom;
    return;
  }
  const T x = r / T(e.r_cut);
  const int ip = static_cast<int>(e.p);
  if (static_cast<double>(ip) == e.p && ip >= 1 && ip <= 32) {
    // 1 - c0 x^p + c1 x^(p+1) - c2 x^(p+2) has a triple root at x = 1:
    // f = (1 - x)^3 Q(x), Q = sum_{k<p} C(k+2, 2) x^k. The expanded form loses
    // all digits to cancellation near the cutoff in float32; this one does not.
    T q = T(0), dq = T(0);
    for (int k = ip - 1; k >= 0; --k) {  // Horner for Q and Q'
      dq = dq * x + q;
      q = q * x + T((k + 1) * (k + 2) / 2);
    }
    const T om = T(1) - x;
    value = om * om * om * q;
    grad = (om * om * om * dq - T(3) * om * om * q) / T(e.r_cut);
    return;
  }
  const T p = T(e.p);
  const T c0 = (p + T(1)) * (p + T(2)) / T(2), c1 = p * (p + T(2)), c2 = p * (p + T(1)) / T(2);
  const T xp = std::pow(x, p);
  value = T(1) - c0 * xp + c1 * xp * x - c2 * xp * x * x;
  const T dxp = (x > T(0)) ? p * xp / x : T(0);
  const T dvalue_dx = -c0 * dxp + c1 * (p + T(1)) * xp - c2 * (p + T(2)) * xp * x;
  grad = dvalue_dx / T(e.r_cut);
}

// emb[n] and demb[n] = d emb[n] / dr for n < num_basis.
template <class T>
E3F_HD void edge_embedding(int num_basis, const T* coeffs, T prefactor, const EnvelopeParams& env,
                           T r, T* emb, T* demb) {
  T f, df;
  envelope(env, r, f, df);
  const T inv_r = T(1) / r;
  for (int n = 0; n < num_basis; ++n) {
    const T cr = coeffs[n] * r;
    const T s = std::sin(cr), c = std::cos(cr);
    const T b = prefactor * s * inv_r;
    const T db = prefactor * (coeffs[n] * c * inv_r - s * inv_r * inv_r);
    emb[n] = b * f;
    if (demb) demb[n] = db * f + b * df;
  }
}

// MACE's distance transforms (plan.h DistanceTransform; mace/modules/radial.py
// AgnesiTransform, SoftTransform) for one edge of "radius" r_0: x = T(r) and dx/dr.
struct TransformParams {
  DistanceTransform kind = DistanceTransform::none;
  double q = 0, p = 0, a = 0, alpha = 0;
};

// r_0 of an edge between species of covalent radii rc_a and rc_b.
E3F_HD double transform_r0(const TransformParams& t, double rc_a, double rc_b) {
  return t.kind == DistanceTransform::agnesi ? 0.5 * (rc_a + rc_b) : rc_a + rc_b;
}

template <class T>
E3F_HD void distance_transform(const TransformParams& tp, T r, T r0, T& x, T& dx) {
  if (tp.kind == DistanceTransform::agnesi) {
    // x = D / (D + N), N = a y^q, D = 1 + y^(q-p): dx/dr = (D' N - D N') / (D + N)^2
    const T y = r / r0, q = T(tp.q), p = T(tp.p), a = T(tp.a);
    const T yq = std::pow(y, q), yqp = std::pow(y, q - p);
    const T N = a * yq, D = T(1) + yqp;
    const T dN = a * q * yq / r, dD = (q - p) * yqp / r;
    const T s = D + N;
    x = D / s;
    dx = (dD * N - D * dN) / (s * s);
    return;
  }
  if (tp.kind == DistanceTransform::soft) {
    const T p0 = T(0.75) * r0, p1 = (T(4) / T(3)) * r0;
    const T m = T(0.5) * (p0 + p1), al = T(tp.alpha) / (p1 - p0);
    const T th = std::tanh(al * (r - m));
    const T sx = T(0.5) * (T(1) + th);
    x = p0 + (r - p0) * sx;
    dx = sx + (r - p0) * T(0.5) * al * (T(1) - th * th);
    return;
  }
  x = r;
  dx = T(1);
}

// MACE's radial embedding (mace RadialEmbeddingBlock): emb[n] = B_n(x) * (apply_cutoff ?
// f(r) : 1) with x = T(r, r_0), and demb[n] = d emb[n] / dr (when demb is given); cutoff
// and dcutoff receive f(r) and f'(r).
template <class T>
E3F_HD void mace_edge_embedding(int num_basis, const T* coeffs, T prefactor,
                                const EnvelopeParams& env, const TransformParams& tp,
                                bool apply_cutoff, T r, T r0, T* emb, T* demb, T& cutoff,
                                T& dcutoff) {
  envelope(env, r, cutoff, dcutoff);
  T x, dx;
  distance_transform(tp, r, r0, x, dx);
  const T f = apply_cutoff ? cutoff : T(1), df = apply_cutoff ? dcutoff : T(0);
  const T inv_x = T(1) / x;
  for (int n = 0; n < num_basis; ++n) {
    const T cx = coeffs[n] * x;
    const T s = std::sin(cx), c = std::cos(cx);
    const T b = prefactor * s * inv_x;
    const T db = prefactor * (coeffs[n] * c * inv_x - s * inv_x * inv_x) * dx;
    emb[n] = b * f;
    if (demb) demb[n] = db * f + b * df;
  }
}

// mace's edge density tanh(s^2), s = w . emb (density_fn, a linear layer), times the
// envelope when apply_cutoff is false; value and d/dr from emb, demb, f, f'.
template <class T>
E3F_HD void edge_density(int num_basis, const T* weights, const T* emb, const T* demb,
                         bool apply_cutoff, T cutoff, T dcutoff, T& value, T& grad) {
  T s = T(0), ds = T(0);
  for (int n = 0; n < num_basis; ++n) {
    s += weights[n] * emb[n];
    ds += weights[n] * demb[n];
  }
  const T th = std::tanh(s * s);
  const T dth = T(2) * s * ds * (T(1) - th * th);
  if (apply_cutoff) {
    value = th;
    grad = dth;
  } else {
    value = th * cutoff;
    grad = dth * cutoff + th * dcutoff;
  }
}

}  // namespace e3fuse::ops
