// cpu/linear.cpp: e3nn o3.Linear on node features, forward and transpose.
#include <algorithm>
#include <vector>

#include "cpu/ops.h"

namespace e3fuse::cpu {

template <class T>
void linear_forward(const Linear<T>& lin, int64_t num_nodes, const T* x, T* out) {
#pragma omp parallel
  {
    std::vector<T> xm(lin.max_mul), acc(lin.max_mul);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < num_nodes; ++n) {
      const T* xn = x + n * lin.dim_in;
      T* on = out + n * lin.dim_out;
      std::fill(on, on + lin.dim_out, T(0));
      for (const auto& b : lin.biases) {
        for (size_t w = 0; w < b.bias.size(); ++w) on[b.out_offset + w] += b.bias[w];
      }
      for (const auto& p : lin.paths) {
        for (int m = 0; m < p.d; ++m) {
          if (lin.in_ir_mul)
            for (int u = 0; u < p.mul_in; ++u) xm[u] = xn[p.in_offset + m * p.mul_in + u];
          else
            for (int u = 0; u < p.mul_in; ++u) xm[u] = xn[p.in_offset + u * p.d + m];
          std::fill(acc.begin(), acc.begin() + p.mul_out, T(0));
          for (int u = 0; u < p.mul_in; ++u) {
            const T xu = xm[u];
            const T* wrow = p.weight.data() + static_cast<size_t>(u) * p.mul_out;
            T* a = acc.data();
#pragma omp simd
            for (int w = 0; w < p.mul_out; ++w) a[w] += wrow[w] * xu;
          }
          if (lin.out_ir_mul)
            for (int w = 0; w < p.mul_out; ++w) on[p.out_offset + m * p.mul_out + w] += acc[w];
          else
            for (int w = 0; w < p.mul_out; ++w) on[p.out_offset + w * p.d + m] += acc[w];
        }
      }
    }
  }
}

template <class T>
void linear_backward(const Linear<T>& lin, int64_t num_nodes, const T* grad_out, T* grad_x,
                     bool accumulate) {
#pragma omp parallel
  {
    std::vector<T> gm(lin.max_mul);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < num_nodes; ++n) {
      const T* gn = grad_out + n * lin.dim_out;
      T* xn = grad_x + n * lin.dim_in;
      if (!accumulate) std::fill(xn, xn + lin.dim_in, T(0));
      for (const auto& p : lin.paths) {
        for (int m = 0; m < p.d; ++m) {
          if (lin.out_ir_mul)
            for (int w = 0; w < p.mul_out; ++w) gm[w] = gn[p.out_offset + m * p.mul_out + w];
          else
            for (int w = 0; w < p.mul_out; ++w) gm[w] = gn[p.out_offset + w * p.d + m];
          for (int u = 0; u < p.mul_in; ++u) {
            const T* wrow = p.weight.data() + static_cast<size_t>(u) * p.mul_out;
            const T* g = gm.data();
            T s = T(0);
#pragma omp simd reduction(+ : s)
            for (int w = 0; w < p.mul_out; ++w) s += wrow[w] * g[w];
            xn[lin.in_ir_mul ? p.in_offset + m * p.mul_in + u : p.in_offset + u * p.d + m] += s;
          }
        }
      }
    }
  }
}

template void linear_forward<float>(const Linear<float>&, int64_t, const float*, float*);
template void linear_forward<double>(const Linear<double>&, int64_t, const double*, double*);
template void linear_backward<float>(const Linear<float>&, int64_t, const float*, float*, bool);
template void linear_backward<double>(const Linear<double>&, int64_t, const double*, double*, bool);

}  // namespace e3fuse::cpu
