// ops/radial_table.h: the radial MLP of a convolution as a cubic Hermite table in r.
//
// The MLP's output R_w(r) = MLP(emb(r))_w depends on the edge length alone, so it is
// tabulated once at load time on knots r_i = r_0 + i h covering [0, cutoff] (r_0 <= 0 puts
// a knot where the envelope has a kink): on interval i, with t = (r - r_0) / h - i,
//   R_w(r) = c0 + t (c1 + t (c2 + t c3)),  dR_w/dr = (c1 + t (2 c2 + 3 t c3)) / h,
// the cubic that matches R_w and dR_w/dr (evaluated exactly in double) at both knots.
// Its error is h^4 / 384 max|R''''| (value) and O(h^3) (derivative): the builder
// (cpu/radial_table.cpp) refines h until both are below float32 rounding. Per edge this
// replaces the MLP (and its adjoint, dE/dr = sum_w dE/dR_w dR_w/dr) by one read of
// 4 coefficients per weight.
#pragma once

#include "ops/activation.h"

namespace e3fuse::ops {

// Interval and local coordinate of r (double in, so t keeps full precision).
E3F_HD void radial_table_locate(double r, double origin, double inv_step, int intervals,
                                int& interval, double& t) {
  const double x = (r - origin) * inv_step;
  int i = static_cast<int>(x);
  if (i < 0) i = 0;
  if (i > intervals - 1) i = intervals - 1;
  interval = i;
  t = x - i;
}

template <class T>
E3F_HD T radial_table_value(const T c[4], T t) {
  return c[0] + t * (c[1] + t * (c[2] + t * c[3]));
}

// dR/dr (inv_step = 1 / h).
template <class T>
E3F_HD T radial_table_grad(const T c[4], T t, T inv_step) {
  return (c[1] + t * (T(2) * c[2] + T(3) * t * c[3])) * inv_step;
}

}  // namespace e3fuse::ops
