// cpu/symmetric_contraction.cpp: MACE's product basis (symmetric contraction,
// Batatia et al. eq. 10-11) and the element-dependent linear layer, forward and
// adjoint with respect to node features. Node-level only: every node is one
// independent task (its features transposed to [i][c] in a per-thread scratch,
// channels innermost so each sparse row is a vector loop over channels).
//
//   out[c][m] = sum_terms sum_rows value * W[s][k][c] * prod_{j=1..nu} x[c][i_j]
#include <algorithm>
#include <vector>

#include "cpu/linear_row.h"
#include "cpu/mace.h"

namespace e3fuse::cpu {

namespace {

template <class T>
int max_mul(const ElementLinear<T>& lin) {
  int m = 1;
  for (const auto& l : lin.per_species) m = std::max(m, l.max_mul);
  return m;
}

// xt[i][c] = x[c][i] (mace's reshape_irreps view of a mul_ir vector).
template <class T>
void gather_transposed(const SymmetricContraction<T>& sc, const T* x, T* xt) {
  for (int i = 0; i < sc.num_ell; ++i) {
    const T* src = x + sc.ell_offset[i];
    const int stride = sc.ell_stride[i];
    T* dst = xt + static_cast<size_t>(i) * sc.C;
    for (int c = 0; c < sc.C; ++c) dst[c] = src[static_cast<int64_t>(c) * stride];
  }
}

}  // namespace

template <class T>
void element_linear_forward(const ElementLinear<T>& lin, int64_t num_nodes, const int32_t* species,
                            const T* x, T* out) {
  const int mm = max_mul(lin);
#pragma omp parallel
  {
    std::vector<T> xm(mm), acc(mm);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < num_nodes; ++n) {
      T* on = out + n * lin.dim_out;
      std::fill(on, on + lin.dim_out, T(0));
      linear_row(lin.of_species(species[n]), x + n * lin.dim_in, on, xm, acc);
    }
  }
}

template <class T>
void element_linear_backward(const ElementLinear<T>& lin, int64_t num_nodes, const int32_t* species,
                             const T* grad_out, T* grad_x, bool accumulate) {
  const int mm = max_mul(lin);
#pragma omp parallel
  {
    std::vector<T> gm(mm);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < num_nodes; ++n) {
      T* xn = grad_x + n * lin.dim_in;
      if (!accumulate) std::fill(xn, xn + lin.dim_in, T(0));
      linear_row_transpose(lin.of_species(species[n]), grad_out + n * lin.dim_out, xn, gm);
    }
  }
}

template <class T>
void symmetric_contraction_forward(const SymmetricContraction<T>& sc, int64_t num_nodes,
                                   const int32_t* species, const T* x, T* out) {
  const int C = sc.C;
#pragma omp parallel
  {
    std::vector<T> xt(static_cast<size_t>(sc.num_ell) * C), acc, prod(C);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < num_nodes; ++n) {
      gather_transposed(sc, x + n * sc.dim_in, xt.data());
      T* on = out + n * sc.dim_out;
      const int s = species[n];
      for (const auto& con : sc.contractions) {
        acc.assign(static_cast<size_t>(con.d) * C, T(0));
        for (const auto& t : con.terms) {
          const T* W = t.weights.data() + static_cast<size_t>(s) * t.num_params * C;
          const int width = t.nu + 2;
          for (int64_t r = 0; r < t.rows; ++r) {
            const int32_t* row = t.index.data() + r * width;
            const T v = t.values[r];
            const T* w = W + static_cast<size_t>(row[t.nu + 1]) * C;
            T* a = acc.data() + static_cast<size_t>(row[0]) * C;
            const T* x1 = xt.data() + static_cast<size_t>(row[1]) * C;
#pragma omp simd
            for (int c = 0; c < C; ++c) prod[c] = v * w[c] * x1[c];
            for (int j = 2; j <= t.nu; ++j) {
              const T* xj = xt.data() + static_cast<size_t>(row[j]) * C;
#pragma omp simd
              for (int c = 0; c < C; ++c) prod[c] *= xj[c];
            }
#pragma omp simd
            for (int c = 0; c < C; ++c) a[c] += prod[c];
          }
        }
        for (int c = 0; c < C; ++c)
          for (int m = 0; m < con.d; ++m)
            on[con.out_offset + c * con.d + m] = acc[static_cast<size_t>(m) * C + c];
      }
    }
  }
}

template <class T>
void symmetric_contraction_backward(const SymmetricContraction<T>& sc, int64_t num_nodes,
                                    const int32_t* species, const T* x, const T* grad_out,
                                    T* grad_x) {
  const int C = sc.C;
#pragma omp parallel
  {
    std::vector<T> xt(static_cast<size_t>(sc.num_ell) * C), gxt(xt.size()), g, base(C), part(C);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < num_nodes; ++n) {
      gather_transposed(sc, x + n * sc.dim_in, xt.data());
      std::fill(gxt.begin(), gxt.end(), T(0));
      const T* gn = grad_out + n * sc.dim_out;
      const int s = species[n];
      for (const auto& con : sc.contractions) {
        g.resize(static_cast<size_t>(con.d) * C);
        for (int c = 0; c < C; ++c)
          for (int m = 0; m < con.d; ++m)
            g[static_cast<size_t>(m) * C + c] = gn[con.out_offset + c * con.d + m];
        for (const auto& t : con.terms) {
          const T* W = t.weights.data() + static_cast<size_t>(s) * t.num_params * C;
          const int width = t.nu + 2;
          for (int64_t r = 0; r < t.rows; ++r) {
            const int32_t* row = t.index.data() + r * width;
            const T v = t.values[r];
            const T* w = W + static_cast<size_t>(row[t.nu + 1]) * C;
            const T* gm = g.data() + static_cast<size_t>(row[0]) * C;
#pragma omp simd
            for (int c = 0; c < C; ++c) base[c] = v * w[c] * gm[c];
            for (int j = 1; j <= t.nu; ++j) {  // d/dx[i_j]: product of the other factors
              std::copy(base.begin(), base.end(), part.begin());
              for (int q = 1; q <= t.nu; ++q) {
                if (q == j) continue;
                const T* xq = xt.data() + static_cast<size_t>(row[q]) * C;
#pragma omp simd
                for (int c = 0; c < C; ++c) part[c] *= xq[c];
              }
              T* gx = gxt.data() + static_cast<size_t>(row[j]) * C;
#pragma omp simd
              for (int c = 0; c < C; ++c) gx[c] += part[c];
            }
          }
        }
      }
      T* gxn = grad_x + n * sc.dim_in;
      for (int i = 0; i < sc.num_ell; ++i) {
        const int stride = sc.ell_stride[i];
        const T* src = gxt.data() + static_cast<size_t>(i) * C;
        for (int c = 0; c < C; ++c)
          gxn[sc.ell_offset[i] + static_cast<int64_t>(c) * stride] = src[c];
      }
    }
  }
}

#define E3FUSE_INSTANTIATE(T)                                                                \
  template void element_linear_forward<T>(const ElementLinear<T>&, int64_t, const int32_t*,  \
                                          const T*, T*);                                     \
  template void element_linear_backward<T>(const ElementLinear<T>&, int64_t, const int32_t*, \
                                           const T*, T*, bool);                              \
  template void symmetric_contraction_forward<T>(const SymmetricContraction<T>&, int64_t,    \
                                                 const int32_t*, const T*, T*);              \
  template void symmetric_contraction_backward<T>(const SymmetricContraction<T>&, int64_t,   \
                                                  const int32_t*, const T*, const T*, T*);
E3FUSE_INSTANTIATE(float)
E3FUSE_INSTANTIATE(double)
#undef E3FUSE_INSTANTIATE

}  // namespace e3fuse::cpu
