// neighbors/lattice.cpp: see lattice.h.
#include "neighbors/lattice.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "e3fuse/error.h"

namespace e3fuse::lattice {

void check_cutoff_and_skin(double cutoff, double skin) {
  if (!std::isfinite(cutoff) || cutoff <= 0.0) {
    throw Error("neighbor list cutoff must be positive and finite, got " + format_number(cutoff));
  }
  if (!std::isfinite(skin) || skin < 0.0) {
    throw Error("neighbor list skin must be non-negative and finite, got " + format_number(skin));
  }
}

void check_update_arguments(int64_t num_atoms, const double* positions, const double* cell,
                            const bool pbc[3], bool periodic[3], double cell_copy[9]) {
  if (num_atoms < 0) {
    throw Error("number of atoms must be non-negative, got " + std::to_string(num_atoms));
  }
  if (num_atoms > std::numeric_limits<int32_t>::max()) {
    throw Error("too many atoms for the neighbor list: " + std::to_string(num_atoms));
  }
  if (num_atoms > 0 && positions == nullptr) throw Error("positions are missing (null pointer)");
  for (int k = 0; k < 9; ++k) cell_copy[k] = 0.0;
  for (int a = 0; a < 3; ++a) periodic[a] = pbc != nullptr && pbc[a];
  if (cell != nullptr) {
    std::memcpy(cell_copy, cell, 9 * sizeof(double));
  } else if (periodic[0] || periodic[1] || periodic[2]) {
    throw Error("a periodic system needs a cell (got a null pointer)");
  }
  for (int a = 0; a < 3; ++a) {
    if (!periodic[a]) continue;
    for (int k = 0; k < 3; ++k) {
      if (!std::isfinite(cell_copy[3 * a + k])) {
        throw Error("cell vector " + std::to_string(a) + " (periodic) is not finite (NaN or inf)");
      }
    }
  }
}

void check_finite_positions(int64_t num_atoms, const double* positions) {
  for (int64_t i = 0; i < 3 * num_atoms; ++i) {
    if (!std::isfinite(positions[i])) {
      throw Error("position of atom " + std::to_string(i / 3) + " is not finite (NaN or inf)");
    }
  }
}

bool moved_past_half_skin(int64_t num_atoms, const double* positions, const double* reference,
                          double skin) {
  if (skin == 0.0) {
    for (int64_t i = 0; i < 3 * num_atoms; ++i)
      if (positions[i] != reference[i]) return true;
    return false;
  }
  const double limit2 = 0.25 * skin * skin;
  for (int64_t i = 0; i < num_atoms; ++i) {
    const double dx = positions[3 * i] - reference[3 * i];
    const double dy = positions[3 * i + 1] - reference[3 * i + 1];
    const double dz = positions[3 * i + 2] - reference[3 * i + 2];
    if (dx * dx + dy * dy + dz * dz > limit2) return true;
  }
  return false;
}

Lattice make_lattice(const double* cell, const bool pbc[3]) {
  Lattice lat;
  double basis[9] = {};
  int periodic_axes[3];
  int free_axes[3];
  int num_periodic = 0;
  int num_free = 0;
  for (int a = 0; a < 3; ++a) {
    lat.periodic[a] = pbc[a];
    if (pbc[a]) {
      periodic_axes[num_periodic++] = a;
      for (int k = 0; k < 3; ++k) lat.cell[3 * a + k] = basis[3 * a + k] = cell[3 * a + k];
    } else {
      free_axes[num_free++] = a;
    }
  }
  const std::string degenerate =
      "cell has zero volume along its periodic directions (the cell vectors of the periodic "
      "directions are zero or linearly dependent)";
  if (num_periodic == 0) {
    for (int a = 0; a < 3; ++a) basis[4 * a] = 1.0;
  } else if (num_periodic == 1) {
    // Two unit vectors orthogonal to the periodic vector and to each other.
    const double* v = basis + 3 * periodic_axes[0];
    const double length = norm3(v);
    if (!(length > 0.0)) throw Error(degenerate);
    const double u[3] = {v[0] / length, v[1] / length, v[2] / length};
    int least = 0;  // the Cartesian axis least aligned with u
    for (int k = 1; k < 3; ++k) {
      if (std::abs(u[k]) < std::abs(u[least])) least = k;
    }
    double axis[3] = {0.0, 0.0, 0.0};
    axis[least] = 1.0;
    double* e1 = basis + 3 * free_axes[0];
    double* e2 = basis + 3 * free_axes[1];
    cross3(u, axis, e1);
    const double n1 = norm3(e1);
    for (int k = 0; k < 3; ++k) e1[k] /= n1;
    cross3(u, e1, e2);
  } else if (num_periodic == 2) {
    const double* v1 = basis + 3 * periodic_axes[0];
    const double* v2 = basis + 3 * periodic_axes[1];
    double* e = basis + 3 * free_axes[0];
    cross3(v1, v2, e);
    const double area = norm3(e);
    if (!(area > kDegenerateCell * norm3(v1) * norm3(v2))) throw Error(degenerate);
    for (int k = 0; k < 3; ++k) e[k] /= area;
  } else {
    double c12[3];
    cross3(basis + 3, basis + 6, c12);
    const double volume = std::abs(dot3(basis, c12));
    if (!(volume > kDegenerateCell * norm3(basis) * norm3(basis + 3) * norm3(basis + 6))) {
      throw Error(degenerate);
    }
  }
  // Reciprocal vectors r_a = (b_{a+1} x b_{a+2}) / det; fractional coordinates
  // are f_a = x . r_a, and 1 / |r_a| is the spacing of the planes f_a = const.
  double c12[3];
  cross3(basis + 3, basis + 6, c12);
  const double det = dot3(basis, c12);
  for (int a = 0; a < 3; ++a) {
    cross3(basis + 3 * ((a + 1) % 3), basis + 3 * ((a + 2) % 3), lat.recip + 3 * a);
    for (int k = 0; k < 3; ++k) lat.recip[3 * a + k] /= det;
    lat.spacing[a] = 1.0 / norm3(lat.recip + 3 * a);
  }
  return lat;
}

}  // namespace e3fuse::lattice
