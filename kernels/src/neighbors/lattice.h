// neighbors/lattice.h: cell geometry shared by the CPU and the GPU neighbor lists
// (host code): limits, small vector helpers, the shift n . cell and the periodic
// cell vectors completed into a full-rank basis with its reciprocal vectors.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace e3fuse::lattice {

// Cells whose periodic vectors span less than this fraction of the volume (area,
// length) of a box with the same edge lengths are considered degenerate.
constexpr double kDegenerateCell = 1e-10;
// Fractional coordinates beyond this many cell lengths are refused, which keeps
// every integer shift well inside int32.
constexpr double kMaxWraps = 268435456.0;  // 2^28
// Upper bound on the number of image offsets considered per atom.
constexpr int64_t kMaxImageBox = int64_t{1} << 24;

inline double dot3(const double* a, const double* b) {
  return a[0] * b[0] + a[1] * b[1] + a[2] * b[2];
}

inline void cross3(const double* a, const double* b, double* out) {
  out[0] = a[1] * b[2] - a[2] * b[1];
  out[1] = a[2] * b[0] - a[0] * b[2];
  out[2] = a[0] * b[1] - a[1] * b[0];
}

inline double norm3(const double* a) { return std::sqrt(dot3(a, a)); }

// The Cartesian shift of integer cell shift n, evaluated as
// n0 * cell[0..2] + n1 * cell[3..5] + n2 * cell[6..8] in this order. Integer
// negation is exact and so is every step here under negation, so the shift of
// -n is exactly the negation of the shift of n.
inline void shift_vector(int64_t n0, int64_t n1, int64_t n2, const double* cell, double* out) {
  const double a = static_cast<double>(n0);
  const double b = static_cast<double>(n1);
  const double c = static_cast<double>(n2);
  for (int k = 0; k < 3; ++k) out[k] = a * cell[k] + b * cell[3 + k] + c * cell[6 + k];
}

inline std::string format_number(double x, int precision = 6) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*g", precision, x);
  return buf;
}

// The lattice: the periodic cell vectors completed into a full-rank basis.
struct Lattice {
  double cell[9] = {};     // rows of periodic directions as given, other rows zero
  double recip[9] = {};    // rows r_a with r_a . basis_b = delta_ab
  double spacing[3] = {};  // distance between lattice planes of direction a
  bool periodic[3] = {false, false, false};
};

// The arguments of a neighbor list: a positive finite cutoff and a finite skin >= 0.
void check_cutoff_and_skin(double cutoff, double skin);

// Checks the arguments of NeighborList::update (atom count, positions pointer, cell
// and periodicity) and returns the periodicity and a copy of the cell (zeros where
// the cell is absent). Throws Error naming the problem.
void check_update_arguments(int64_t num_atoms, const double* positions, const double* cell,
                            const bool pbc[3], bool periodic[3], double cell_copy[9]);

// Throws Error naming the first atom with a non-finite position coordinate.
void check_finite_positions(int64_t num_atoms, const double* positions);

// Whether some atom moved more than skin / 2 from `reference` (any motion when
// skin == 0): a list built at `reference` with cutoff + skin no longer holds.
bool moved_past_half_skin(int64_t num_atoms, const double* positions, const double* reference,
                          double skin);

// Throws Error when the periodic vectors are zero or linearly dependent.
Lattice make_lattice(const double* cell, const bool pbc[3]);

}  // namespace e3fuse::lattice
