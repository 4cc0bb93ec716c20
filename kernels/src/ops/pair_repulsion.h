// ops/pair_repulsion.h: MACE's ZBL pair repulsion (mace-torch radial.py ZBLBasis),
// shared by the CPU and CUDA backends. Per directed edge j -> i (r < model cutoff),
// node i's energy gets half of
//     V(r) = coulomb Z_i Z_j / r * sum_k c_k exp(-d_k r / a_ij) * f_p(r / (R_i + R_j)),
//     a_ij = a_prefactor * bohr / (Z_i^a_exp + Z_j^a_exp),
// R the covalent radii and f_p the polynomial envelope (zero from R_i + R_j on). V is
// symmetric in the pair, so each node can gather its own force from its own edges
// (cpu/pair_repulsion.cpp; on the GPU the density blocks' edge walks, EdgeWalk in
// cuda/edge_density.cu, evaluate pair_repulsion_half per edge). Evaluated in double in both
// precisions: the values are large at short range and the work is a few exponentials per edge.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "e3fuse/system.h"
#include "model/plan.h"
#include "ops/edge_vector.h"
#include "ops/radial.h"

namespace e3fuse::ops {

constexpr int kMaxPairRepulsionTerms = 8;

// What a kernel reads (passed by value); `pair` points to host or device memory.
struct PairRepulsionView {
  int num_species = 0;
  int num_terms = 0;
  double cutoff2 = 0.0;  // edges at r >= the model cutoff are not the model's
  double p = 6.0;        // envelope exponent
  double c[kMaxPairRepulsionTerms] = {};
  double d[kMaxPairRepulsionTerms] = {};
  // [s_i][s_j][3]: a_ij, coulomb Z_i Z_j, R_i + R_j (see pair_repulsion_table)
  const double* pair = nullptr;
};

// The per-species-pair constants as mace-torch forms them, symmetric in the pair to the
// last bit (Z_i Z_j is an exact integer; mace-torch rounds coulomb Z_u first).
inline std::vector<double> pair_repulsion_table(const PairRepulsionPlan& p,
                                                const std::vector<int>& atomic_numbers) {
  const size_t s = atomic_numbers.size();
  std::vector<double> table(s * s * 3);
  for (size_t u = 0; u < s; ++u)
    for (size_t v = 0; v < s; ++v) {
      const double zu = atomic_numbers[u], zv = atomic_numbers[v];
      double* q = &table[3 * (u * s + v)];
      q[0] = p.a_prefactor * p.bohr / (std::pow(zu, p.a_exp) + std::pow(zv, p.a_exp));
      q[1] = p.coulomb * (zu * zv);
      q[2] = p.covalent_radii[u] + p.covalent_radii[v];
    }
  return table;
}

inline PairRepulsionView pair_repulsion_view(const PairRepulsionPlan& p, int num_species,
                                             double cutoff, const double* table) {
  PairRepulsionView view;
  view.num_species = num_species;
  view.num_terms = static_cast<int>(p.c.size());
  view.cutoff2 = cutoff * cutoff;
  view.p = p.p;
  for (int k = 0; k < view.num_terms; ++k) {
    view.c[k] = p.c[k];
    view.d[k] = p.exponents[k];
  }
  view.pair = table;
  return view;
}

// Half the pair energy of species (si, sj) at distance r, 0.5 V(r), and its derivative
// in r; both zero at r >= R_i + R_j (the envelope's cutoff).
E3F_HD void pair_repulsion_half(const PairRepulsionView& v, int si, int sj, double r, double& e,
                                double& de) {
  const double* q = v.pair + 3 * (static_cast<int64_t>(si) * v.num_species + sj);
  e = 0.0;
  de = 0.0;
  if (!(r < q[2])) return;
  const double a = q[0];
  double phi = 0.0, dphi = 0.0;  // screening function of r / a and its r-derivative
  for (int k = 0; k < v.num_terms; ++k) {
    const double t = v.c[k] * std::exp(-v.d[k] * (r / a));
    phi += t;
    dphi -= t * v.d[k] / a;
  }
  double f, df;
  envelope(EnvelopeParams{EnvelopeKind::polynomial, q[2], 0.0, v.p}, r, f, df);
  const double coulomb = q[1] / r;  // coulomb Z_i Z_j / r
  e = 0.5 * (coulomb * phi) * f;
  de = 0.5 * coulomb * ((dphi - phi / r) * f + phi * df);
}

// Node i's energy: the sum of 0.5 V over its edges inside the model cutoff.
E3F_HD double pair_repulsion_node_energy(const PairRepulsionView& zbl, const GraphView& g,
                                         int64_t i) {
  double energy = 0.0;
  for (int64_t e = g.row_offsets[i]; e < g.row_offsets[i + 1]; ++e) {
    double v[3];
    edge_vector(g, i, e, v);
    const double r2 = v[0] * v[0] + v[1] * v[1] + v[2] * v[2];
    if (r2 >= zbl.cutoff2 || r2 == 0.0) continue;  // r = 0 is reported by the convolution
    double half, dhalf;
    pair_repulsion_half(zbl, g.species[i], g.species[g.neighbors[e]], std::sqrt(r2), half, dhalf);
    energy += half;
  }
  return energy;
}

// Node k's force and per-atom virial from E = weight * sum over energy nodes i of their
// pair energies: pair (k, j) enters E through both directed edges, with 0.5 V each when
// its receiver is an energy node (a symmetric graph gives k both). The per-atom virial
// takes half of each pair's -v (x) f, as the convolution's does (cpu/conv.cpp).
E3F_HD void pair_repulsion_node_gradient(const PairRepulsionView& zbl, const GraphView& g,
                                         int64_t k, double weight, double force[3],
                                         double virial[9]) {
  for (int a = 0; a < 3; ++a) force[a] = 0.0;
  for (int q = 0; q < 9; ++q) virial[q] = 0.0;
  const bool k_counts = k < g.num_energy_nodes;
  for (int64_t e = g.row_offsets[k]; e < g.row_offsets[k + 1]; ++e) {
    const int64_t j = g.neighbors[e];
    const int count = (k_counts ? 1 : 0) + (j < g.num_energy_nodes ? 1 : 0);
    if (count == 0) continue;
    double v[3];
    edge_vector(g, k, e, v);
    const double r2 = v[0] * v[0] + v[1] * v[1] + v[2] * v[2];
    if (r2 >= zbl.cutoff2 || r2 == 0.0) continue;
    const double r = std::sqrt(r2);
    double half, dhalf;
    pair_repulsion_half(zbl, g.species[k], g.species[j], r, half, dhalf);
    // F_k = -dE/dr_k = weight * count * d(0.5 V)/dr * v / r   (dr/dr_k = -v / r)
    const double g_over_r = weight * count * dhalf / r;
    double f[3];
    for (int a = 0; a < 3; ++a) {
      f[a] = g_over_r * v[a];
      force[a] += f[a];
    }
    for (int a = 0; a < 3; ++a)
      for (int b = 0; b < 3; ++b) virial[3 * a + b] -= 0.5 * v[a] * f[b];
  }
}

}  // namespace e3fuse::ops
