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

}  // namespace e3fuse::ops
