// cpu/linear.cpp: e3nn o3.Linear on node features, forward and transpose.
#include <algorithm>
#include <vector>

#include "cpu/linear_row.h"
#include "cpu/ops.h"

namespace e3fuse::cpu {

template <class T>
void linear_forward(const Linear<T>& lin, int64_t num_nodes, const T* x, T* out) {
#pragma omp parallel
  {
    std::vector<T> xm(lin.max_mul), acc(lin.max_mul);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < num_nodes; ++n) {
      T* on = out + n * lin.dim_out;
      std::fill(on, on + lin.dim_out, T(0));
      for (const auto& b : lin.biases) {
        for (size_t w = 0; w < b.bias.size(); ++w) on[b.out_offset + w] += b.bias[w];
      }
      linear_row(lin, x + n * lin.dim_in, on, xm, acc);
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
      T* xn = grad_x + n * lin.dim_in;
      if (!accumulate) std::fill(xn, xn + lin.dim_in, T(0));
      linear_row_transpose(lin, grad_out + n * lin.dim_out, xn, gm);
    }
  }
}

template void linear_forward<float>(const Linear<float>&, int64_t, const float*, float*);
template void linear_forward<double>(const Linear<double>&, int64_t, const double*, double*);
template void linear_backward<float>(const Linear<float>&, int64_t, const float*, float*, bool);
template void linear_backward<double>(const Linear<double>&, int64_t, const double*, double*, bool);

}  // namespace e3fuse::cpu
