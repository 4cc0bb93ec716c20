// neighbor_list.cpp: the cell-list neighbor search behind e3fuse::NeighborList
// (see e3fuse/neighbors.h).
//
// Outline of build():
//   1. Complete the periodic cell vectors into a full-rank basis (unit vectors
//      orthogonal to the periodic span stand in for non-periodic directions) and
//      take fractional coordinates in it. Periodic fractional coordinates are
//      wrapped into [0, 1); the integer wrap w_i of each atom is remembered.
//   2. Every atom gets the periodic images m (integer cell shifts) that can lie
//      within R = cutoff + skin of the wrapped cell: along periodic direction a
//      the fractional coordinate of a neighbor of a wrapped atom lies within
//      R / d_a of [0, 1), d_a being the spacing of the lattice planes.
//   3. All points (atoms and images) are binned on a Cartesian grid of bins at
//      least R / 2 wide; each wrapped atom scans the 5 x 5 x 5 bins around it.
//   4. A candidate j (image m) of receiver i has the cell shift n = m - w_j + w_i
//      relative to the positions as given. Whether |v| < R is decided on the
//      edge vector exactly as the engine computes it, v = (x_j - x_i) + shift(n)
//      (directly, or through a margin that rounding cannot cross), so that the
//      decisions for i <- j (n) and j <- i (-n) agree.
//   5. Distinct shifts are numbered ((0,0,0) first, the rest in lexicographic
//      order) and rows are written in CSR form sorted by (j, n).
// With set_num_owned(k), step 4 also drops the pairs of two atoms past the first k.
//
// The O(N) steps run serially; the scan, the CSR copy and the minimum-distance
// check run on OpenMP threads, and the list is the same for any number of them.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "e3fuse/error.h"
#include "e3fuse/neighbors.h"
#include "neighbors/lattice.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

namespace e3fuse {
namespace {

using namespace lattice;  // NOLINT: the shared cell geometry (neighbors/lattice.h)

// Integer shifts are numbered through a dense table up to this size, through a
// hash map beyond it (positions spread over very many cells).
constexpr int64_t kMaxDenseShiftBox = int64_t{1} << 20;
// Below this many atoms the build runs on one thread.
constexpr int64_t kMinAtomsPerThread = 2048;

int NumThreads(int64_t work_items) {
#ifdef _OPENMP
  const int64_t wanted = std::max<int64_t>(1, work_items / kMinAtomsPerThread);
  return static_cast<int>(std::min<int64_t>(omp_get_max_threads(), wanted));
#else
  (void)work_items;
  return 1;
#endif
}

int ThreadId() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

int TeamSize() {
#ifdef _OPENMP
  return omp_get_num_threads();
#else
  return 1;
#endif
}

// Exceptions (running out of memory) must not leave an OpenMP region: the first
// one is kept and rethrown after the region.
class ParallelErrors {
 public:
  void Capture() {
#pragma omp critical(e3fuse_neighbor_list_errors)
    if (!error_) error_ = std::current_exception();
  }
  void Rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::exception_ptr error_;
};

// A point of the cell list: a wrapped atom or one of its periodic images.
struct Point {
  double x, y, z;
  uint64_t key;  // (atom << 32) | code
};

// An integer cell shift n.
struct ShiftKey {
  int32_t n[3];
  bool operator==(const ShiftKey& o) const {
    return n[0] == o.n[0] && n[1] == o.n[1] && n[2] == o.n[2];
  }
  bool operator<(const ShiftKey& o) const {
    return std::lexicographical_compare(n, n + 3, o.n, o.n + 3);
  }
};

struct ShiftKeyHash {
  size_t operator()(const ShiftKey& k) const {
    uint64_t h = static_cast<uint32_t>(k.n[0]);
    h = h * 0x9E3779B97F4A7C15ull ^ static_cast<uint32_t>(k.n[1]);
    h = h * 0x9E3779B97F4A7C15ull ^ static_cast<uint32_t>(k.n[2]);
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

// Numbers the integer shifts n of a box [lo, hi] in lexicographic order, when
// the box is small enough for dense tables (always, unless positions are spread
// over very many cells); otherwise dense() is false and shifts go through hash
// maps of ShiftKey.
class ShiftNumbering {
 public:
  ShiftNumbering(const int64_t lo[3], const int64_t hi[3]) {
    int64_t total = 1;
    for (int a = 0; a < 3; ++a) {
      lo_[a] = lo[a];
      size_[a] = hi[a] - lo[a] + 1;
      total = (total <= kMaxDenseShiftBox) ? total * size_[a] : total;
    }
    dense_ = total <= kMaxDenseShiftBox;
    if (dense_) total_ = total;
  }

  bool dense() const { return dense_; }
  int64_t dense_size() const { return total_; }
  int64_t stride(int a) const { return a == 0 ? size_[1] * size_[2] : (a == 1 ? size_[2] : 1); }

  int64_t Code(const int64_t n[3]) const {
    return ((n[0] - lo_[0]) * size_[1] + (n[1] - lo_[1])) * size_[2] + (n[2] - lo_[2]);
  }
  void Decode(int64_t code, int64_t n[3]) const {
    n[2] = code % size_[2] + lo_[2];
    code /= size_[2];
    n[1] = code % size_[1] + lo_[1];
    n[0] = code / size_[1] + lo_[0];
  }

 private:
  bool dense_ = false;
  int64_t lo_[3] = {};
  int64_t size_[3] = {};
  int64_t total_ = 0;
};

// Per-thread output of the neighbor scan.
struct ScanOutput {
  std::vector<uint64_t> keys;                              // sorted rows, concatenated
  std::vector<uint8_t> used_dense;                         // shifts seen (dense numbering)
  std::unordered_set<ShiftKey, ShiftKeyHash> used_sparse;  // shifts seen (hash numbering)
};

// Bins are at least search / kBinsPerRadius wide, so neighbors lie at most
// kBinsPerRadius bins away along each axis. Two bins per radius scan a
// 5 x 5 x 5 block of volume 15.6 R^3 instead of the 27 R^3 of bins R wide.
constexpr int kBinsPerRadius = 2;
constexpr int kStencil = 2 * kBinsPerRadius + 1;

// A flag in row keys during the scan (see there).
constexpr uint64_t kNeedsExactTest = uint64_t{1} << 31;

// The bin grid. Along each axis there are `cells` bins; when the grid would
// have too many bins (sparse systems with a huge extent), an axis is folded
// onto `dims` < `cells` bins by taking the bin index modulo `dims`. Folded bins
// mix far-apart points, which the distance test rejects; dims >= kStencil keeps
// the neighbor bins along a folded axis distinct.
struct Grid {
  double origin[3] = {};
  double inv_width[3] = {};
  int64_t cells[3] = {1, 1, 1};
  int64_t dims[3] = {1, 1, 1};

  int64_t Coord(int a, double x) const {
    const double t = std::floor((x - origin[a]) * inv_width[a]);
    int64_t c = t <= 0.0 ? 0
                         : (t >= static_cast<double>(cells[a] - 1) ? cells[a] - 1
                                                                   : static_cast<int64_t>(t));
    return folded(a) ? c % dims[a] : c;
  }
  int64_t Index(int64_t x, int64_t y, int64_t z) const { return (z * dims[1] + y) * dims[0] + x; }
  bool folded(int a) const { return dims[a] < cells[a]; }

  // The bins within kBinsPerRadius of `home` along axis a, in increasing order;
  // returns how many.
  int Near(int a, int64_t home, int64_t* out) const {
    int count = 0;
    for (int64_t d = -kBinsPerRadius; d <= kBinsPerRadius; ++d) {
      int64_t c = home + d;
      if (folded(a)) {
        out[count++] = (c + dims[a]) % dims[a];
      } else if (c >= 0 && c < dims[a]) {
        out[count++] = c;
      }
    }
    return count;
  }
  // The same bins along x as at most two runs of consecutive bins [first, last].
  int NearRuns(int64_t home, int64_t runs[2][2]) const {
    const int64_t lo = home - kBinsPerRadius;
    const int64_t hi = home + kBinsPerRadius;
    if (!folded(0)) {
      runs[0][0] = std::max<int64_t>(0, lo);
      runs[0][1] = std::min<int64_t>(dims[0] - 1, hi);
      return 1;
    }
    if (lo < 0) {
      runs[0][0] = lo + dims[0], runs[0][1] = dims[0] - 1;
      runs[1][0] = 0, runs[1][1] = hi;
      return 2;
    }
    if (hi >= dims[0]) {
      runs[0][0] = lo, runs[0][1] = dims[0] - 1;
      runs[1][0] = 0, runs[1][1] = hi - dims[0];
      return 2;
    }
    runs[0][0] = lo, runs[0][1] = hi;
    return 1;
  }
};

Grid MakeGrid(const double lo[3], const double hi[3], double width, int64_t max_bins) {
  Grid g;
  for (int a = 0; a < 3; ++a) {
    g.origin[a] = lo[a];
    const double extent = hi[a] - lo[a];
    // Bins a little wider than `width`, so that rounding in the bin coordinate
    // never puts points closer than kBinsPerRadius * width further apart.
    const double cells = std::floor(extent / (width * (1.0 + 1e-6)));
    g.cells[a] =
        cells < 1.0 ? 1 : (cells > 1e15 ? int64_t{1000000000000000} : static_cast<int64_t>(cells));
    g.inv_width[a] = extent > 0.0 ? static_cast<double>(g.cells[a]) / extent : 0.0;
    g.dims[a] = g.cells[a];
  }
  auto total = [&g] { return static_cast<double>(g.dims[0]) * g.dims[1] * g.dims[2]; };
  while (total() > static_cast<double>(max_bins)) {
    int a = 0;
    for (int b = 1; b < 3; ++b) {
      if (g.dims[b] > g.dims[a]) a = b;
    }
    g.dims[a] = std::max<int64_t>(kStencil, g.dims[a] / 2);
  }
  return g;
}

// Binned points in structure-of-arrays form, padded with kPointPadding unused
// entries so that vector loads may run past the last point.
constexpr int64_t kPointPadding = 4;

struct BinnedPoints {
  std::vector<double> x, y, z;
  std::vector<uint64_t> key;
  std::vector<uint8_t> original;  // the atom itself, not an image

  explicit BinnedPoints(int64_t count)
      : x(count + kPointPadding, 0.0),
        y(count + kPointPadding, 0.0),
        z(count + kPointPadding, 0.0),
        key(count + kPointPadding, 0),
        original(count, 0) {}
};

#ifdef __AVX2__
// For each 4-bit lane mask, the 32-bit lane indices that move the selected
// 64-bit lanes to the front (compress-store emulation).
struct CompressTable {
  alignas(32) int32_t lanes[16][8] = {};
  constexpr CompressTable() {
    for (int mask = 0; mask < 16; ++mask) {
      int out = 0;
      for (int l = 0; l < 4; ++l) {
        if (mask & (1 << l)) {
          lanes[mask][2 * out] = 2 * l;
          lanes[mask][2 * out + 1] = 2 * l + 1;
          ++out;
        }
      }
    }
  }
};
constexpr CompressTable kCompress;
#endif

// Appends to out[count...] the keys of points [first, last) closer than
// sqrt(search2) to (x, y, z), with kNeedsExactTest set on those not closer than
// sqrt(inner2), and returns the new count. out needs 4 entries of slack.
inline int64_t CollectCandidates(const BinnedPoints& p, int64_t first, int64_t last, double x,
                                 double y, double z, double inner2, double search2, uint64_t* out,
                                 int64_t count) {
#ifdef __AVX2__
  const __m256d cx = _mm256_set1_pd(x);
  const __m256d cy = _mm256_set1_pd(y);
  const __m256d cz = _mm256_set1_pd(z);
  const __m256d limit = _mm256_set1_pd(search2);
  const __m256d sure = _mm256_set1_pd(inner2);
  const __m256i flag = _mm256_set1_epi64x(static_cast<int64_t>(kNeedsExactTest));
  for (int64_t q = first; q < last; q += 4) {
    const __m256d dx = _mm256_sub_pd(_mm256_loadu_pd(p.x.data() + q), cx);
    const __m256d dy = _mm256_sub_pd(_mm256_loadu_pd(p.y.data() + q), cy);
    const __m256d dz = _mm256_sub_pd(_mm256_loadu_pd(p.z.data() + q), cz);
    const __m256d d2 = _mm256_add_pd(_mm256_add_pd(_mm256_mul_pd(dx, dx), _mm256_mul_pd(dy, dy)),
                                     _mm256_mul_pd(dz, dz));
    int mask = _mm256_movemask_pd(_mm256_cmp_pd(d2, limit, _CMP_LT_OQ));
    if (last - q < 4) mask &= (1 << (last - q)) - 1;
    __m256i keys = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.key.data() + q));
    const __m256d far = _mm256_cmp_pd(d2, sure, _CMP_GE_OQ);
    keys = _mm256_or_si256(keys, _mm256_and_si256(_mm256_castpd_si256(far), flag));
    const __m256i lanes =
        _mm256_load_si256(reinterpret_cast<const __m256i*>(kCompress.lanes[mask]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + count),
                        _mm256_permutevar8x32_epi32(keys, lanes));
    count += __builtin_popcount(static_cast<unsigned>(mask));
  }
#else
  for (int64_t q = first; q < last; ++q) {
    const double dx = p.x[q] - x;
    const double dy = p.y[q] - y;
    const double dz = p.z[q] - z;
    const double d2 = dx * dx + dy * dy + dz * dz;
    out[count] = p.key[q] | (d2 >= inner2 ? kNeedsExactTest : 0);
    count += d2 < search2;
  }
#endif
  return count;
}

// Sorts a row of distinct keys (j << 32) | code. Rows are short (tens of keys),
// where placing each key at its rank is branch-free and several times faster
// than std::sort. The ranks by j (the number of keys with a smaller j) are
// counted on 32-bit j for kRankBlock keys at a time, which compilers turn into a
// few vector compares per key of the row; keys of equal j (several images of
// one atom) share a rank and are placed one after the other, and a final
// insertion sort orders them by code, in one pass when there are none.
// js needs count + kRankBlock entries.
constexpr int64_t kMaxRankSort = 256;
constexpr int kRankBlock = 32;

void SortRow(uint64_t* keys, int64_t count, uint64_t* scratch, int32_t* js, int32_t* taken) {
  if (count > kMaxRankSort) {
    std::sort(keys, keys + count);
    return;
  }
  const int64_t padded = (count + kRankBlock - 1) / kRankBlock * kRankBlock;
  for (int64_t a = 0; a < count; ++a) {
    js[a] = static_cast<int32_t>(keys[a] >> 32);
    taken[a] = 0;
  }
  for (int64_t a = count; a < padded; ++a) js[a] = std::numeric_limits<int32_t>::max();
  for (int64_t a0 = 0; a0 < count; a0 += kRankBlock) {
    int32_t rank[kRankBlock] = {};
    int32_t ja[kRankBlock];
    for (int l = 0; l < kRankBlock; ++l) ja[l] = js[a0 + l];
    for (int64_t b = 0; b < count; ++b) {
      const int32_t j = js[b];
      for (int l = 0; l < kRankBlock; ++l) rank[l] += static_cast<int32_t>(j < ja[l]);
    }
    for (int64_t a = a0; a < std::min(count, a0 + kRankBlock); ++a) {
      const int32_t r = rank[a - a0];
      scratch[r + taken[r]++] = keys[a];
    }
  }
  for (int64_t a = 0; a < count; ++a) {
    const uint64_t key = scratch[a];
    int64_t b = a;
    for (; b > 0 && keys[b - 1] > key; --b) keys[b] = keys[b - 1];
    keys[b] = key;
  }
}

}  // namespace

NeighborList::NeighborList(double cutoff, double skin) : cutoff_(cutoff), skin_(skin) {
  check_cutoff_and_skin(cutoff, skin);
}

void NeighborList::set_num_owned(int64_t num_owned) {
  if (num_owned < -1) throw Error("the number of owned atoms must be >= 0 (-1: every atom)");
  if (num_owned != num_owned_) valid_ = false;
  num_owned_ = num_owned;
}

bool NeighborList::update(int64_t num_atoms, const double* positions, const double* cell,
                          const bool pbc[3]) {
  bool periodic[3];
  double cell_copy[9];
  check_update_arguments(num_atoms, positions, cell, pbc, periodic, cell_copy);
  check_finite_positions(num_atoms, positions);

  if (num_owned_ > num_atoms) {
    throw Error("more owned atoms (" + std::to_string(num_owned_) + ") than atoms (" +
                std::to_string(num_atoms) + ")");
  }
  const bool rebuild =
      !valid_ || num_atoms != num_atoms_ || periodic[0] != pbc_[0] || periodic[1] != pbc_[1] ||
      periodic[2] != pbc_[2] || std::memcmp(cell_copy, cell_, sizeof(cell_)) != 0 ||
      moved_past_half_skin(num_atoms, positions, reference_positions_.data(), skin_);
  if (rebuild) build(num_atoms, positions, cell_copy, periodic);
  check_min_distance(positions);
  return rebuild;
}

GraphView NeighborList::view(const double* positions, const int32_t* species) const {
  if (row_offsets_.empty()) throw Error("neighbor list used before its first update()");
  GraphView g;
  g.num_nodes = num_atoms_;
  g.num_energy_nodes = num_atoms_;
  g.positions = positions;
  g.species = species;
  g.row_offsets = row_offsets_.data();
  g.neighbors = neighbors_.data();
  g.shift_index = shift_index_.data();
  g.shifts = shifts_.data();
  return g;
}

void NeighborList::build(int64_t num_atoms, const double* positions, const double* cell,
                         const bool pbc[3]) {
  valid_ = false;
  const Lattice lat = make_lattice(cell, pbc);
  const int64_t n = num_atoms;
  const double radius = cutoff_ + skin_;
  const double radius2 = radius * radius;

  // 1. Fractional coordinates; wrap periodic ones into [0, 1).
  std::vector<double> frac(3 * n);
  std::vector<int32_t> wrap(3 * n, 0);
  double max_abs_position = 0.0;
  int64_t max_wrap[3] = {0, 0, 0};
  int64_t min_wrap[3] = {0, 0, 0};
  for (int64_t i = 0; i < n; ++i) {
    const double* x = positions + 3 * i;
    for (int a = 0; a < 3; ++a) {
      max_abs_position = std::max(max_abs_position, std::abs(x[a]));
      double f = dot3(x, lat.recip + 3 * a);
      if (lat.periodic[a]) {
        if (!(std::abs(f) < kMaxWraps)) {
          throw Error("atom " + std::to_string(i) + " lies " + format_number(f) +
                      " cell lengths from the cell along periodic direction " + std::to_string(a) +
                      "; wrap the positions");
        }
        double w = std::floor(f);
        f -= w;
        if (f >= 1.0) {  // f was a tiny negative number
          f = 0.0;
          w += 1.0;
        }
        wrap[3 * i + a] = static_cast<int32_t>(w);
        max_wrap[a] = std::max<int64_t>(max_wrap[a], wrap[3 * i + a]);
        min_wrap[a] = std::min<int64_t>(min_wrap[a], wrap[3 * i + a]);
      }
      frac[3 * i + a] = f;
    }
  }

  // The search radius of the approximate stages (image ranges, binning, first
  // distance test on wrapped coordinates) is a little larger than R to absorb
  // their rounding; the final test on the exact edge vector uses R.
  double cell_length_sum = 0.0;
  for (int a = 0; a < 3; ++a) {
    if (lat.periodic[a]) {
      // Bounds |w . cell| + |m . cell| along this direction.
      const double max_cells =
          static_cast<double>(std::max(max_wrap[a], -min_wrap[a])) + radius / lat.spacing[a] + 3.0;
      cell_length_sum += norm3(lat.cell + 3 * a) * max_cells;
    }
  }
  const double search = radius + 1e-9 * (radius + max_abs_position + cell_length_sum);
  const double search2 = search * search;

  // 2. Image offsets m lie in the box [-reach_a, reach_a].
  int64_t reach[3] = {0, 0, 0};
  int64_t box[3];
  int64_t box_size = 1;
  for (int a = 0; a < 3; ++a) {
    if (lat.periodic[a]) {
      const double k = std::ceil(search / lat.spacing[a]) + 1.0;
      if (!(k < static_cast<double>(kMaxImageBox))) {
        throw Error("cell is too small for the cutoff: direction " + std::to_string(a) +
                    " would need " + format_number(k) + " periodic images per side");
      }
      reach[a] = static_cast<int64_t>(k);
    }
    box[a] = 2 * reach[a] + 1;
    box_size *= box[a];
    if (box_size > kMaxImageBox) {
      throw Error("cell is too small for the cutoff: over " + std::to_string(kMaxImageBox) +
                  " periodic images per atom would be needed");
    }
  }

  // Per atom, the image range along each axis: a neighbor of a wrapped atom
  // has fractional coordinate within search / d_a of [0, 1).
  std::vector<int32_t> image_range(6 * n);
  std::vector<int64_t> point_begin(n + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t count = 1;
    for (int a = 0; a < 3; ++a) {
      int64_t lo = 0;
      int64_t hi = 0;
      if (lat.periodic[a]) {
        const double margin = search / lat.spacing[a];
        const double f = frac[3 * i + a];
        lo = std::max<int64_t>(-reach[a], static_cast<int64_t>(std::ceil(-margin - f)));
        hi = std::min<int64_t>(reach[a], static_cast<int64_t>(std::floor(1.0 + margin - f)));
        lo = std::min<int64_t>(lo, 0);  // the atom itself is always a point
        hi = std::max<int64_t>(hi, 0);
      }
      image_range[6 * i + 2 * a] = static_cast<int32_t>(lo);
      image_range[6 * i + 2 * a + 1] = static_cast<int32_t>(hi);
      count *= hi - lo + 1;
    }
    point_begin[i + 1] = point_begin[i] + count;
  }
  const int64_t num_points = point_begin[n];

  // Shifts n = m - w_j + w_i lie in a box known in advance. When the box is
  // small, n is numbered by its position in the box (dense numbering), and
  // code(n) splits into a part of the point (j, m) and a part of the receiver i:
  //   code(n) = sum_a (n_a - lo_a) stride_a
  //           = sum_a (m_a - w_ja + reach_a + max_wrap_a) stride_a     [point]
  //           + sum_a (w_ia - min_wrap_a) stride_a                      [receiver]
  // with both parts non-negative. Points then carry their part in their key,
  // and a receiver adds its own. Otherwise points carry their image code and
  // shifts go through hash maps.
  int64_t shift_lo[3];
  int64_t shift_hi[3];
  for (int a = 0; a < 3; ++a) {
    shift_lo[a] = -reach[a] + min_wrap[a] - max_wrap[a];
    shift_hi[a] = reach[a] + max_wrap[a] - min_wrap[a];
  }
  const ShiftNumbering numbering(shift_lo, shift_hi);
  const bool dense = numbering.dense();
  std::vector<int64_t> receiver_code(dense ? n : 0);
  for (int64_t i = 0; i < static_cast<int64_t>(receiver_code.size()); ++i) {
    for (int a = 0; a < 3; ++a) {
      receiver_code[i] += (wrap[3 * i + a] - min_wrap[a]) * numbering.stride(a);
    }
  }

  // Points: the wrapped atom x_i - w_i . cell plus m . cell, images in
  // lexicographic order of m.
  std::vector<Point> points(num_points);
  std::vector<uint8_t> point_original(num_points, 0);  // m == 0
  double lo_corner[3] = {0.0, 0.0, 0.0};
  double hi_corner[3] = {0.0, 0.0, 0.0};
  if (num_points > 0) {
    for (int a = 0; a < 3; ++a) {
      lo_corner[a] = std::numeric_limits<double>::infinity();
      hi_corner[a] = -std::numeric_limits<double>::infinity();
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t* w = wrap.data() + 3 * i;
    const int32_t* r = image_range.data() + 6 * i;
    double unwrap[3];
    shift_vector(w[0], w[1], w[2], lat.cell, unwrap);
    const double base[3] = {positions[3 * i] - unwrap[0], positions[3 * i + 1] - unwrap[1],
                            positions[3 * i + 2] - unwrap[2]};
    int64_t k = point_begin[i];
    for (int64_t m0 = r[0]; m0 <= r[1]; ++m0) {
      for (int64_t m1 = r[2]; m1 <= r[3]; ++m1) {
        for (int64_t m2 = r[4]; m2 <= r[5]; ++m2, ++k) {
          Point& p = points[k];
          double s[3];
          shift_vector(m0, m1, m2, lat.cell, s);
          p.x = base[0] + s[0];
          p.y = base[1] + s[1];
          p.z = base[2] + s[2];
          const int64_t m[3] = {m0, m1, m2};
          int64_t code = 0;
          for (int a = 0; a < 3; ++a) {
            code = dense ? code + (m[a] - w[a] + reach[a] + max_wrap[a]) * numbering.stride(a)
                         : code * box[a] + m[a] + reach[a];
          }
          p.key = (static_cast<uint64_t>(i) << 32) | static_cast<uint64_t>(code);
          point_original[k] = m0 == 0 && m1 == 0 && m2 == 0;
          const double c[3] = {p.x, p.y, p.z};
          for (int a = 0; a < 3; ++a) {
            lo_corner[a] = std::min(lo_corner[a], c[a]);
            hi_corner[a] = std::max(hi_corner[a], c[a]);
          }
        }
      }
    }
  }

  // 3. Bin the points (counting sort).
  const Grid grid = MakeGrid(lo_corner, hi_corner, search / kBinsPerRadius,
                             std::max<int64_t>(4096, 2 * num_points));
  const int64_t num_bins = grid.dims[0] * grid.dims[1] * grid.dims[2];
  std::vector<int64_t> bin_begin(num_bins + 1, 0);
  std::vector<int64_t> point_bin(num_points);
  for (int64_t k = 0; k < num_points; ++k) {
    point_bin[k] = grid.Index(grid.Coord(0, points[k].x), grid.Coord(1, points[k].y),
                              grid.Coord(2, points[k].z));
    ++bin_begin[point_bin[k] + 1];
  }
  for (int64_t b = 0; b < num_bins; ++b) bin_begin[b + 1] += bin_begin[b];
  BinnedPoints sorted(num_points);
  {
    std::vector<int64_t> fill(bin_begin.begin(), bin_begin.end() - 1);
    for (int64_t k = 0; k < num_points; ++k) {
      const int64_t to = fill[point_bin[k]]++;
      sorted.x[to] = points[k].x;
      sorted.y[to] = points[k].y;
      sorted.z[to] = points[k].z;
      sorted.key[to] = points[k].key;
      sorted.original[to] = point_original[k];
    }
  }
  std::vector<Point>().swap(points);
  std::vector<uint8_t>().swap(point_original);
  std::vector<int64_t>().swap(point_bin);

  // The shift n of receiver i and a key's low 32 bits (without flags).
  auto key_shift = [&](int64_t i, uint64_t key, int64_t shift[3]) {
    const uint64_t low = key & 0xffffffffu;
    if (dense) {
      numbering.Decode(static_cast<int64_t>(low) + receiver_code[i], shift);
    } else {  // the image code numbers the box of m in lexicographic order
      const int64_t code = static_cast<int64_t>(low);
      const int64_t m[3] = {code / (box[1] * box[2]) - reach[0],
                            (code / box[2]) % box[1] - reach[1], code % box[2] - reach[2]};
      const int32_t* wj = wrap.data() + 3 * (key >> 32);
      const int32_t* wi = wrap.data() + 3 * i;
      for (int a = 0; a < 3; ++a) shift[a] = m[a] - wj[a] + wi[a];
    }
  };

  // 4. Scan. Threads take contiguous ranges of binned points, so that a
  // thread's receivers are close in space; rows are written in atom order later.
  // Row keys are (j << 32) | code, code being the shift code (dense numbering)
  // or the image code (hash numbering); for a fixed (i, j) both increase with n
  // in lexicographic order, so sorting the keys sorts the row by (j, n).
  //
  // The wrapped coordinates differ from the exact edge vectors by rounding far
  // below `margin`, so a candidate within R - margin on the wrapped coordinates
  // is surely a neighbor and one beyond R + margin surely is not; only those in
  // between need the exact test.
  const double margin = search - radius;
  const double inner = std::max(0.0, radius - margin);
  // pairs of two atoms past the first `owned` are left out (set_num_owned)
  const uint64_t owned = num_owned_ < 0 ? uint64_t{1} << 32 : static_cast<uint64_t>(num_owned_);
  const double inner2 = inner * inner;
  const int num_threads = NumThreads(n);
  std::vector<ScanOutput> out(num_threads);
  std::vector<int32_t> row_thread(n);
  std::vector<int64_t> row_start(n);
  std::vector<int64_t> row_count(n);
  ParallelErrors errors;
  // A rebuild sizes the row buffers from the last list.
  const double edges_per_point =
      num_atoms_ == n && num_points > 0 ? static_cast<double>(neighbors_.size()) / num_points : 0.0;

#pragma omp parallel num_threads(num_threads)
  {
    try {
      const int t = ThreadId();
      const int team = TeamSize();  // may be smaller than num_threads
      ScanOutput& mine = out[t];
      if (dense) mine.used_dense.assign(numbering.dense_size(), 0);
      std::vector<uint64_t> candidate_buffer;
      std::vector<uint64_t> scratch;
      std::vector<int32_t> scratch_j;
      std::vector<int32_t> scratch_taken;
      const int64_t begin = num_points * t / team;
      const int64_t end = num_points * (t + 1) / team;
      mine.keys.reserve(static_cast<size_t>(1.05 * edges_per_point * (end - begin)));
      for (int64_t k = begin; k < end; ++k) {
        if (!sorted.original[k]) continue;
        const uint64_t self_key = sorted.key[k];
        const int64_t i = static_cast<int64_t>(self_key >> 32);
        const double self_x = sorted.x[k];
        const double self_y = sorted.y[k];
        const double self_z = sorted.z[k];

        // The surrounding bins as ranges of points: runs of consecutive bins
        // along x, for each pair of bins along y and z.
        int64_t near_y[kStencil];
        int64_t near_z[kStencil];
        int64_t runs[2][2];
        const int num_y = grid.Near(1, grid.Coord(1, self_y), near_y);
        const int num_z = grid.Near(2, grid.Coord(2, self_z), near_z);
        const int num_runs = grid.NearRuns(grid.Coord(0, self_x), runs);
        int64_t ranges[2 * kStencil * kStencil][2];
        int num_ranges = 0;
        int64_t total = 0;
        for (int z = 0; z < num_z; ++z) {
          for (int y = 0; y < num_y; ++y) {
            for (int r = 0; r < num_runs; ++r) {
              const int64_t first = bin_begin[grid.Index(runs[r][0], near_y[y], near_z[z])];
              const int64_t last = bin_begin[grid.Index(runs[r][1], near_y[y], near_z[z]) + 1];
              ranges[num_ranges][0] = first;
              ranges[num_ranges++][1] = last;
              total += last - first;
            }
          }
        }

        // Test on the wrapped coordinates. Bit 31 of a key (free: codes are below
        // 2^24) marks the candidates between R - margin and R + margin, which
        // need the exact test.
        if (static_cast<int64_t>(candidate_buffer.size()) < total + 4) {
          candidate_buffer.resize(total + 4);
          scratch.resize(total);
          scratch_j.resize(total + kRankBlock);
          scratch_taken.resize(total);
        }
        uint64_t* candidates = candidate_buffer.data();
        int64_t count = 0;
        for (int r = 0; r < num_ranges; ++r) {
          count = CollectCandidates(sorted, ranges[r][0], ranges[r][1], self_x, self_y, self_z,
                                    inner2, search2, candidates, count);
        }

        // Drop the atom itself (and, in a ghost's row, the other ghosts), decide the
        // marked candidates on the edge vector as the engine computes it, and complete
        // the shift codes.
        const double* xi = positions + 3 * i;
        const int64_t row_code = dense ? receiver_code[i] : 0;
        const bool ghost_row = static_cast<uint64_t>(i) >= owned;
        int64_t kept = 0;
        for (int64_t c = 0; c < count; ++c) {
          uint64_t key = candidates[c];
          if (ghost_row && (key >> 32) >= owned) continue;
          if (key & kNeedsExactTest) {
            key &= ~kNeedsExactTest;
            if (key == self_key) continue;
            int64_t shift[3];
            key_shift(i, key, shift);
            double s[3];
            shift_vector(shift[0], shift[1], shift[2], lat.cell, s);
            const double* xj = positions + 3 * (key >> 32);
            const double vx = (xj[0] - xi[0]) + s[0];
            const double vy = (xj[1] - xi[1]) + s[1];
            const double vz = (xj[2] - xi[2]) + s[2];
            if (!(vx * vx + vy * vy + vz * vz < radius2)) continue;
          } else if (key == self_key) {
            continue;
          }
          if (dense) {
            key += static_cast<uint64_t>(row_code);
            mine.used_dense[key & 0xffffffffu] = 1;
          }
          candidates[kept++] = key;
        }
        SortRow(candidates, kept, scratch.data(), scratch_j.data(), scratch_taken.data());
        row_thread[i] = t;
        row_start[i] = static_cast<int64_t>(mine.keys.size());
        row_count[i] = kept;
        mine.keys.insert(mine.keys.end(), candidates, candidates + kept);
      }
    } catch (...) {
      errors.Capture();
    }
  }
  errors.Rethrow();
  sorted = BinnedPoints(0);

  if (!dense) {  // collect the shifts in use
#pragma omp parallel num_threads(num_threads)
    {
      ScanOutput& mine = out[ThreadId()];
#pragma omp for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        const uint64_t* keys = out[row_thread[i]].keys.data() + row_start[i];
        try {
          for (int64_t c = 0; c < row_count[i]; ++c) {
            int64_t shift[3];
            key_shift(i, keys[c], shift);
            mine.used_sparse.insert(
                ShiftKey{{static_cast<int32_t>(shift[0]), static_cast<int32_t>(shift[1]),
                          static_cast<int32_t>(shift[2])}});
          }
        } catch (...) {
          errors.Capture();
        }
      }
    }
    errors.Rethrow();
  }

  // 5. Number the shifts: (0, 0, 0) first, then lexicographic order.
  std::vector<ShiftKey> used;
  if (dense) {
    std::vector<uint8_t> any(numbering.dense_size(), 0);
    for (const ScanOutput& o : out) {
      if (o.used_dense.empty()) continue;  // a thread that did not run
      for (int64_t c = 0; c < numbering.dense_size(); ++c) any[c] |= o.used_dense[c];
    }
    for (int64_t c = 0; c < numbering.dense_size(); ++c) {
      if (!any[c]) continue;
      int64_t s[3];
      numbering.Decode(c, s);
      used.push_back(ShiftKey{
          {static_cast<int32_t>(s[0]), static_cast<int32_t>(s[1]), static_cast<int32_t>(s[2])}});
    }
  } else {
    std::unordered_set<ShiftKey, ShiftKeyHash> all;
    for (const ScanOutput& o : out) all.insert(o.used_sparse.begin(), o.used_sparse.end());
    used.assign(all.begin(), all.end());
    std::sort(used.begin(), used.end());
  }
  const ShiftKey zero{{0, 0, 0}};
  used.erase(std::remove(used.begin(), used.end(), zero), used.end());
  used.insert(used.begin(), zero);
  const int64_t num_shifts = static_cast<int64_t>(used.size());

  shift_cells_.resize(3 * num_shifts);
  shifts_.resize(3 * num_shifts);
  std::vector<int32_t> dense_index;
  std::unordered_map<ShiftKey, int32_t, ShiftKeyHash> sparse_index;
  if (dense) dense_index.assign(numbering.dense_size(), -1);
  for (int64_t s = 0; s < num_shifts; ++s) {
    const int64_t c[3] = {used[s].n[0], used[s].n[1], used[s].n[2]};
    for (int a = 0; a < 3; ++a) shift_cells_[3 * s + a] = used[s].n[a];
    shift_vector(c[0], c[1], c[2], lat.cell, shifts_.data() + 3 * s);
    if (dense) {
      dense_index[numbering.Code(c)] = static_cast<int32_t>(s);
    } else {
      sparse_index.emplace(used[s], static_cast<int32_t>(s));
    }
  }

  // 6. CSR rows in atom order.
  row_offsets_.assign(n + 1, 0);
  for (int64_t i = 0; i < n; ++i) row_offsets_[i + 1] = row_offsets_[i] + row_count[i];
  const int64_t num_edges = row_offsets_[n];
  neighbors_.resize(num_edges);
  shift_index_.resize(num_edges);
#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t* keys = out[row_thread[i]].keys.data() + row_start[i];
    int32_t* neighbors = neighbors_.data() + row_offsets_[i];
    int32_t* shift_index = shift_index_.data() + row_offsets_[i];
    if (dense) {
      for (int64_t c = 0; c < row_count[i]; ++c) {
        neighbors[c] = static_cast<int32_t>(keys[c] >> 32);
        shift_index[c] = dense_index[keys[c] & 0xffffffffu];
      }
    } else {
      for (int64_t c = 0; c < row_count[i]; ++c) {
        neighbors[c] = static_cast<int32_t>(keys[c] >> 32);
        int64_t shift[3];
        key_shift(i, keys[c], shift);
        shift_index[c] =
            sparse_index
                .find(ShiftKey{{static_cast<int32_t>(shift[0]), static_cast<int32_t>(shift[1]),
                                static_cast<int32_t>(shift[2])}})
                ->second;
      }
    }
  }

  num_atoms_ = n;
  std::memcpy(cell_, cell, sizeof(cell_));
  for (int a = 0; a < 3; ++a) pbc_[a] = pbc[a];
  reference_positions_.assign(positions, positions + 3 * n);
  ++num_builds_;
  valid_ = true;
}

void NeighborList::check_min_distance(const double* positions) const {
  if (!(min_distance_ > 0.0) || neighbors_.empty()) return;
  const double min2 = min_distance_ * min_distance_;
  const int64_t n = num_atoms_;
  int64_t first_bad = std::numeric_limits<int64_t>::max();  // smallest offending edge
  // The edge j <- i (-n) has exactly the negated vector of i <- j (n), so edges
  // with j >= i suffice; rows are sorted by j.
#pragma omp parallel for num_threads(NumThreads(n)) schedule(static) reduction(min : first_bad)
  for (int64_t i = 0; i < n; ++i) {
    const double* xi = positions + 3 * i;
    const int64_t row_end = row_offsets_[i + 1];
    const int64_t row_half =
        std::lower_bound(neighbors_.begin() + row_offsets_[i], neighbors_.begin() + row_end, i) -
        neighbors_.begin();
    for (int64_t e = row_half; e < row_end; ++e) {
      const double* xj = positions + 3 * static_cast<int64_t>(neighbors_[e]);
      const double* s = shifts_.data() + 3 * static_cast<int64_t>(shift_index_[e]);
      const double vx = (xj[0] - xi[0]) + s[0];
      const double vy = (xj[1] - xi[1]) + s[1];
      const double vz = (xj[2] - xi[2]) + s[2];
      if (vx * vx + vy * vy + vz * vz < min2) {
        first_bad = std::min(first_bad, e);
        break;
      }
    }
  }
  if (first_bad == std::numeric_limits<int64_t>::max()) return;

  const int64_t e = first_bad;
  const int64_t i =
      std::upper_bound(row_offsets_.begin(), row_offsets_.end(), e) - row_offsets_.begin() - 1;
  const int64_t j = neighbors_[e];
  const double* s = shifts_.data() + 3 * static_cast<int64_t>(shift_index_[e]);
  const int32_t* cells = shift_cells_.data() + 3 * static_cast<int64_t>(shift_index_[e]);
  double d2 = 0.0;
  for (int k = 0; k < 3; ++k) {
    const double v = (positions[3 * j + k] - positions[3 * i + k]) + s[k];
    d2 += v * v;
  }
  std::string message = "atoms " + std::to_string(i) + " and " + std::to_string(j) + " are " +
                        format_number(std::sqrt(d2)) + " Å apart, closer than the minimum " +
                        format_number(min_distance_) + " Å";
  if (cells[0] != 0 || cells[1] != 0 || cells[2] != 0) {
    message += " (through the periodic image shifted by cell vectors (" + std::to_string(cells[0]) +
               ", " + std::to_string(cells[1]) + ", " + std::to_string(cells[2]) + "))";
  }
  throw Error(message);
}

}  // namespace e3fuse
