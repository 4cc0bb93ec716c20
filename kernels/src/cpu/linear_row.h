// cpu/linear_row.h: e3nn o3.Linear applied to one node's features (no bias), and its
// transpose; shared by the node-wise linear and the element-dependent linear.
// Scratch vectors hold at least lin.max_mul entries.
#pragma once

#include <algorithm>
#include <vector>

#include "cpu/typed_plan.h"

namespace e3fuse::cpu {

// out += linear(x) for one node, honouring the in/out layouts (mul_ir or ir_mul).
template <class T>
inline void linear_row(const Linear<T>& lin, const T* x, T* out, std::vector<T>& xm,
                       std::vector<T>& acc) {
  for (const auto& p : lin.paths) {
    for (int m = 0; m < p.d; ++m) {
      if (lin.in_ir_mul)
        for (int u = 0; u < p.mul_in; ++u) xm[u] = x[p.in_offset + m * p.mul_in + u];
      else
        for (int u = 0; u < p.mul_in; ++u) xm[u] = x[p.in_offset + u * p.d + m];
      std::fill(acc.begin(), acc.begin() + p.mul_out, T(0));
      for (int u = 0; u < p.mul_in; ++u) {
        const T xu = xm[u];
        const T* wrow = p.weight.data() + static_cast<size_t>(u) * p.mul_out;
        T* a = acc.data();
#pragma omp simd
        for (int w = 0; w < p.mul_out; ++w) a[w] += wrow[w] * xu;
      }
      if (lin.out_ir_mul)
        for (int w = 0; w < p.mul_out; ++w) out[p.out_offset + m * p.mul_out + w] += acc[w];
      else
        for (int w = 0; w < p.mul_out; ++w) out[p.out_offset + w * p.d + m] += acc[w];
    }
  }
}

// grad_x += linear^T(grad_out) for one node.
template <class T>
inline void linear_row_transpose(const Linear<T>& lin, const T* grad_out, T* grad_x,
                                 std::vector<T>& gm) {
  for (const auto& p : lin.paths) {
    for (int m = 0; m < p.d; ++m) {
      if (lin.out_ir_mul)
        for (int w = 0; w < p.mul_out; ++w) gm[w] = grad_out[p.out_offset + m * p.mul_out + w];
      else
        for (int w = 0; w < p.mul_out; ++w) gm[w] = grad_out[p.out_offset + w * p.d + m];
      for (int u = 0; u < p.mul_in; ++u) {
        const T* wrow = p.weight.data() + static_cast<size_t>(u) * p.mul_out;
        const T* g = gm.data();
        T s = T(0);
#pragma omp simd reduction(+ : s)
        for (int w = 0; w < p.mul_out; ++w) s += wrow[w] * g[w];
        grad_x[lin.in_ir_mul ? p.in_offset + m * p.mul_in + u : p.in_offset + u * p.d + m] += s;
      }
    }
  }
}

}  // namespace e3fuse::cpu
