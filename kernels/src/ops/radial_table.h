// ops/radial_table.h: the radial MLP of a convolution as a cubic Hermite table in r.
//
// The MLP's output R_w(r) = MLP(emb(r))_w depends on the edge length alone, so it is
// tabulated once at load time on knots r_i = r_0 + i h covering [0, cutoff] (r_0 <= 0 puts
// a knot where the envelope has a kink): on interval i, with t = (r - r_0) / h - i,
//   R_w(r) = c0 + t (c1 + t (c2 + t c3)),  dR_w/dr = (c1 + t (2 c2 + 3 t c3)) / h,
// the cubic that matches R_w and dR_w/dr (evaluated exactly in double) at both knots.
// Its error is h^4 / 384 max|R''''| (value) and O(h^3) (derivative): the builder
// (cpu/radial_table.cpp) refines h until both are below float32 rounding, and in a large
// table keeps the fine step only below the radius where a coarser one would do
// (radial_table_locate). Per edge this replaces the MLP (and its adjoint,
// dE/dr = sum_w dE/dR_w dR_w/dr) by one read of 4 coefficients per weight.
#pragma once

#include "ops/activation.h"

namespace e3fuse::ops {

// Interval and local coordinate of r (double in, so t keeps full precision). The knots are
// r_i = origin + i h (h = 1 / inv_step) for i <= fine_intervals; past them, with
// coarse_shift > 0, the step is 2^coarse_shift h (cpu/radial_table.cpp keeps the fine step only
// where the MLP needs it, at small r). t is always (r - r_i) / h, in [0, 2^coarse_shift) on a
// coarse interval, whose coefficients are stored as c_k / 2^(k coarse_shift): the same cubic in
// the same float operations scaled by powers of 2, so one inv_step serves every interval.
E3F_HD void radial_table_locate(double r, double origin, double inv_step, int intervals,
                                int fine_intervals, int coarse_shift, int& interval, double& t) {
  const double x = (r - origin) * inv_step;
  if (coarse_shift == 0 || x < fine_intervals) {
    int i = static_cast<int>(x);
    if (i < 0) i = 0;
    if (i > intervals - 1) i = intervals - 1;
    interval = i;
    t = x - i;
    return;
  }
  const double y = x - fine_intervals;
  const int ratio = 1 << coarse_shift;
  int j = static_cast<int>(y / ratio);
  if (j > intervals - fine_intervals - 1) j = intervals - fine_intervals - 1;
  interval = fine_intervals + j;
  t = y - static_cast<double>(j) * ratio;
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
