// cpu/edge_density.cpp: the neighbor density of mace's density interaction blocks
// (RealAgnosticDensity[Residual]InteractionBlock), rho_i = sum_{j in N(i)} tanh((w . emb_ij)^2)
// (times the envelope when apply_cutoff is false; ops::edge_density), and its force/virial
// adjoint. Per edge the density and its r-derivative are read from their table in r
// (EdgeDensity, ops/radial_table.h; where the engine tabulates the radial MLP, the default in
// float32), or evaluated exactly in double (the basis, envelope and transform per edge).
// Nothing is stored per edge.
//
// Backward as in conv.cpp: node k visits each neighbor j once and takes both directed edges of
// the pair, which share r: dE/dr = (dE/drho_k + dE/drho_j) d(edge density)/dr; all writes go
// to node k.
//
// The non-linear block's density (ops::RadialMlpView overloads): rho_i = sum_j
// tanh(MLP(emb_ij, s_i, s_j)^2) (times the envelope when apply_cutoff is false), the MLP of
// the ordered species pair (receiver, sender): the two directed edges of a pair differ when
// their species do, dE/dr = dE/drho_k d_kj/dr + dE/drho_j d_jk/dr.
#include <cmath>
#include <vector>

#include "cpu/ops.h"
#include "ops/edge_vector.h"
#include "ops/radial.h"
#include "ops/radial_mlp.h"
#include "ops/radial_table.h"

namespace e3fuse::cpu {

template <class T>
void edge_density_at(const TypedPlan<T>& plan, const EdgeDensity<T>& density, int pair, double r,
                     double& value, double& grad) {
  if (density.tabulated()) {
    const RadialTable<T>& table = density.table_for_pair(pair);
    int interval = 0;
    double t = 0.0;
    ops::radial_table_locate(r, table.origin, table.inv_step, table.intervals, table.fine_intervals,
                             table.coarse_shift, interval, t);
    const T* c = table.coeffs.data() + 4 * static_cast<size_t>(interval);
    value = static_cast<double>(ops::radial_table_value(c, static_cast<T>(t)));
    grad = static_cast<double>(
        ops::radial_table_grad(c, static_cast<T>(t), static_cast<T>(table.inv_step)));
    return;
  }
  const int nb = plan.num_basis;
  double emb[64], demb[64], f = 1.0, df = 0.0;
  if (plan.mace_embedding) {
    const double r0 = plan.pair_dependent ? plan.pair_r0[static_cast<size_t>(pair)] : 1.0;
    ops::mace_edge_embedding(nb, plan.radial_coeffs_f64.data(), plan.radial_prefactor_f64,
                             plan.envelope, plan.transform, plan.apply_cutoff, r, r0, emb, demb, f,
                             df);
  } else {
    ops::edge_embedding(nb, plan.radial_coeffs_f64.data(), plan.radial_prefactor_f64, plan.envelope,
                        r, emb, demb);
  }
  ops::edge_density(nb, density.weights.data(), emb, demb, plan.apply_cutoff, f, df, value, grad);
}

namespace {

// The non-linear block's RadialMLP density of the ordered species pair `pair` at r: value,
// d/dr (work: 4 * max_dim doubles); always exact, in double.
template <class T>
void edge_density_at(const TypedPlan<T>& plan, const ops::RadialMlpView& mlp, int pair, double r,
                     double* work, double& value, double& grad) {
  const int nb = plan.num_basis;
  double emb[64], demb[64], f = 1.0, df = 0.0;
  const double r0 = plan.pair_dependent ? plan.pair_r0[static_cast<size_t>(pair)] : 1.0;
  ops::mace_edge_embedding(nb, plan.radial_coeffs_f64.data(), plan.radial_prefactor_f64,
                           plan.envelope, plan.transform, plan.apply_cutoff, r, r0, emb, demb, f,
                           df);
  double s, ds;
  ops::radial_mlp_forward(mlp, pair, emb, demb, &s, &ds, work);
  const double one = 1.0;  // ops::edge_density of the one "basis function" s
  ops::edge_density(1, &one, &s, &ds, plan.apply_cutoff, f, df, value, grad);
}

// The edge density of the density blocks, the same for both directions of a pair.
template <class T>
struct LinearDensity {
  const TypedPlan<T>& plan;
  const EdgeDensity<T>& density;
  static constexpr bool kSymmetric = true;
  void operator()(int pair, double r, double& value, double& grad) const {
    edge_density_at(plan, density, pair, r, value, grad);
  }
};

// The non-linear block's density, of the ordered species pair, with its own workspace (one
// per thread).
template <class T>
struct MlpDensity {
  const TypedPlan<T>& plan;
  const ops::RadialMlpView& mlp;
  std::vector<double> work;
  static constexpr bool kSymmetric = false;
  MlpDensity(const TypedPlan<T>& p, const ops::RadialMlpView& m)
      : plan(p), mlp(m), work(4 * static_cast<size_t>(m.max_dim)) {}
  void operator()(int pair, double r, double& value, double& grad) {
    edge_density_at(plan, mlp, pair, r, work.data(), value, grad);
  }
};

// rho_i = sum over i's edges inside the cutoff of density(pair (i, j), r_ij); make_density()
// gives each thread its evaluator.
template <class T, class MakeDensity>
void density_forward(const TypedPlan<T>& plan, const GraphView& g, double* rho,
                     MakeDensity make_density) {
  const double cutoff2 = plan.cutoff * plan.cutoff;
#pragma omp parallel
  {
    auto density = make_density();
#pragma omp for schedule(dynamic, 16)
    for (int64_t i = 0; i < g.num_nodes; ++i) {
      double sum = 0.0;
      for (int64_t e = g.row_offsets[i]; e < g.row_offsets[i + 1]; ++e) {
        double v[3];
        ops::edge_vector(g, i, e, v);
        const double r2 = v[0] * v[0] + v[1] * v[1] + v[2] * v[2];
        if (r2 >= cutoff2 || r2 == 0.0) continue;  // r == 0 is reported by the convolution
        const int pair = g.species[i] * plan.num_species + g.species[g.neighbors[e]];
        double value, grad;
        density(pair, std::sqrt(r2), value, grad);
        sum += value;
      }
      rho[i] = sum;
    }
  }
}

// Node k takes both directed edges of each pair (k, j): dE/dr = dE/drho_k d_kj/dr +
// dE/drho_j d_jk/dr (one evaluation when the density is symmetric), f = (dE/dr) v / r, and
// half of the per-atom virial; all writes go to node k.
template <class T, class MakeDensity>
void density_backward(const TypedPlan<T>& plan, const GraphView& g, const double* grad_rho,
                      double* forces, double* atom_virials, MakeDensity make_density) {
  const double cutoff2 = plan.cutoff * plan.cutoff;
  const int S = plan.num_species;
#pragma omp parallel
  {
    auto density = make_density();
#pragma omp for schedule(dynamic, 16)
    for (int64_t k = 0; k < g.num_nodes; ++k) {
      double fk[3] = {0, 0, 0}, wk[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t e = g.row_offsets[k]; e < g.row_offsets[k + 1]; ++e) {
        const int32_t j = g.neighbors[e];
        if (grad_rho[k] == 0.0 && grad_rho[j] == 0.0) continue;
        double v[3];
        ops::edge_vector(g, k, e, v);
        const double r2 = v[0] * v[0] + v[1] * v[1] + v[2] * v[2];
        if (r2 >= cutoff2 || r2 == 0.0) continue;
        const double r = std::sqrt(r2);
        const int kj = g.species[k] * S + g.species[j];
        double value, grad_kj;
        density(kj, r, value, grad_kj);
        double dr;
        if constexpr (decltype(density)::kSymmetric) {
          dr = (grad_rho[k] + grad_rho[j]) * grad_kj;
        } else {
          const int jk = g.species[j] * S + g.species[k];
          double grad_jk = grad_kj;
          if (jk != kj) density(jk, r, value, grad_jk);
          dr = grad_rho[k] * grad_kj + grad_rho[j] * grad_jk;
        }
        for (int a = 0; a < 3; ++a) {
          const double f = dr * v[a] / r;
          fk[a] += f;
          if (atom_virials)
            for (int b = 0; b < 3; ++b) wk[3 * b + a] -= 0.5 * v[b] * f;
        }
      }
      for (int a = 0; a < 3; ++a) forces[3 * k + a] += fk[a];
      if (atom_virials)
        for (int q = 0; q < 9; ++q) atom_virials[9 * k + q] += wk[q];
    }
  }
}

}  // namespace

template <class T>
void edge_density_forward(const TypedPlan<T>& plan, const ops::RadialMlpView& mlp,
                          const GraphView& g, double* rho) {
  density_forward(plan, g, rho, [&] { return MlpDensity<T>(plan, mlp); });
}

template <class T>
void edge_density_backward(const TypedPlan<T>& plan, const ops::RadialMlpView& mlp,
                           const GraphView& g, const double* grad_rho, double* forces,
                           double* atom_virials) {
  density_backward(plan, g, grad_rho, forces, atom_virials,
                   [&] { return MlpDensity<T>(plan, mlp); });
}

template <class T>
void edge_density_forward(const TypedPlan<T>& plan, const EdgeDensity<T>& density,
                          const GraphView& g, double* rho) {
  density_forward(plan, g, rho, [&] { return LinearDensity<T>{plan, density}; });
}

template <class T>
void edge_density_backward(const TypedPlan<T>& plan, const EdgeDensity<T>& density,
                           const GraphView& g, const double* grad_rho, double* forces,
                           double* atom_virials) {
  density_backward(plan, g, grad_rho, forces, atom_virials,
                   [&] { return LinearDensity<T>{plan, density}; });
}

template void edge_density_at<float>(const TypedPlan<float>&, const EdgeDensity<float>&, int,
                                     double, double&, double&);
template void edge_density_at<double>(const TypedPlan<double>&, const EdgeDensity<double>&, int,
                                      double, double&, double&);
template void edge_density_forward<float>(const TypedPlan<float>&, const EdgeDensity<float>&,
                                          const GraphView&, double*);
template void edge_density_forward<double>(const TypedPlan<double>&, const EdgeDensity<double>&,
                                           const GraphView&, double*);
template void edge_density_backward<float>(const TypedPlan<float>&, const EdgeDensity<float>&,
                                           const GraphView&, const double*, double*, double*);
template void edge_density_backward<double>(const TypedPlan<double>&, const EdgeDensity<double>&,
                                            const GraphView&, const double*, double*, double*);
template void edge_density_forward<float>(const TypedPlan<float>&, const ops::RadialMlpView&,
                                          const GraphView&, double*);
template void edge_density_forward<double>(const TypedPlan<double>&, const ops::RadialMlpView&,
                                           const GraphView&, double*);
template void edge_density_backward<float>(const TypedPlan<float>&, const ops::RadialMlpView&,
                                           const GraphView&, const double*, double*, double*);
template void edge_density_backward<double>(const TypedPlan<double>&, const ops::RadialMlpView&,
                                            const GraphView&, const double*, double*, double*);

}  // namespace e3fuse::cpu
