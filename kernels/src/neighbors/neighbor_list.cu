// neighbors/neighbor_list.cu: the cell-list neighbor search on the GPU
// (see neighbor_list.cuh).
//
// Outline of build():
//   1. Host: complete the periodic cell vectors into a full-rank basis (as the CPU
//      list does) and take its reciprocal vectors. GPU: fractional coordinates per
//      atom; periodic ones are wrapped into [0, 1) and the integer wrap w_i is kept;
//      a reduction gives the bounds of open coordinates and of the wraps (one small
//      copy to the host).
//   2. Host: bins at least `search` (cutoff + skin + rounding margin) wide along
//      each direction (perpendicular widths for periodic directions, the bounding
//      box for open ones); along a periodic direction whose width is below the
//      search radius there is one bin and the stencil reaches R bins (images)
//      past it. The Cartesian shift table covers every n = m - w_j + w_i that the
//      stencil can produce.
//   3. GPU: bin index per atom, stable radix sort of the atoms by bin (CUB),
//      bin offsets by an exclusive scan of the bin counts, positions and wraps
//      gathered in bin order.
//   4. GPU: one thread per receiver i scans the (2 S + 1)^3 stencil; along a
//      periodic direction the unwrapped bin b + d maps to bin (b + d) mod nb and
//      image m = floor((b + d) / nb), so each (bin, image) pair is visited once.
//      Candidate j (image m) has the shift n = m - w_j + w_i relative to the
//      positions as given; it is kept when |v|^2 < (cutoff + skin)^2 for
//      v = (x_j - x_i) + shifts[code(n)], evaluated without contractions exactly
//      as the CPU list evaluates it, so decisions for i <- j (n) and j <- i (-n)
//      agree (the table holds exactly negated entries for n and -n).
//      A count pass, an exclusive scan into row_offsets (int64), a fill pass.

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cub/cub.cuh>
#include <limits>
#include <string>

#include "e3fuse/error.h"
#include "neighbors/lattice.h"
#include "neighbors/neighbor_list.cuh"

namespace e3fuse::cuda {
namespace {

using namespace lattice;  // NOLINT: the shared cell geometry (neighbors/lattice.h)

constexpr int kBlock = 256;
// Blocks of the grid-stride kernels, and of the per-block reduction.
constexpr int64_t kMaxBlocks = 16384;
constexpr int64_t kMaxReduceBlocks = 1024;
// Largest shift table (entries of 24 bytes): positions spread over very many
// periodic cells need more and are refused.
constexpr int64_t kMaxShiftTable = int64_t{1} << 22;
constexpr int64_t kMaxBinsPerAxis = int64_t{1} << 20;
constexpr unsigned long long kNone = ~0ull;
constexpr long long kNoAtom = LLONG_MAX;

int grid_blocks(int64_t work, int64_t max_blocks = kMaxBlocks) {
  return static_cast<int>(std::max<int64_t>(1, std::min(blocks_for(work, kBlock), max_blocks)));
}

// Kernel parameters (passed by value).
struct FracParams {
  double recip[9];
  int periodic[3];
};

struct BinParams {
  int nb[3];
  int periodic[3];
  double origin[3];     // open directions: lower bound of the coordinate
  double inv_width[3];  // open directions: bins per unit of the coordinate
};

struct SearchParams {
  int64_t n;
  int64_t owned;  // pairs of two atoms >= owned are left out (NeighborList::set_num_owned)
  int nb[3];
  int reach[3];  // stencil half-width S along each direction
  int periodic[3];
  int K[3];  // shift table: |n_a| <= K_a
  double radius2;
};

// ---------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------

__global__ void reset_status_kernel(NeighborStatus* status) {
  status->first_nonfinite = kNone;
  status->first_close = kNone;
  status->moved = 0u;
  status->pad = 0u;
}

// compare: 0 none, 1 displacement above sqrt(limit2), 2 any change (skin 0).
__global__ void check_positions_kernel(int64_t n, const double* __restrict__ x,
                                       const double* __restrict__ ref, int compare, double limit2,
                                       NeighborStatus* status) {
  unsigned long long first_bad = kNone;
  int moved = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const double a = x[3 * i], b = x[3 * i + 1], c = x[3 * i + 2];
    if (!isfinite(a) || !isfinite(b) || !isfinite(c)) {
      first_bad = min(first_bad, static_cast<unsigned long long>(i));
    }
    if (compare == 1) {
      const double dx = a - ref[3 * i], dy = b - ref[3 * i + 1], dz = c - ref[3 * i + 2];
      moved |= (dx * dx + dy * dy + dz * dz > limit2) ? 1 : 0;
    } else if (compare == 2) {
      moved |= (a != ref[3 * i] || b != ref[3 * i + 1] || c != ref[3 * i + 2]) ? 1 : 0;
    }
  }
  if (first_bad != kNone) atomicMin(&status->first_nonfinite, first_bad);
  if (__syncthreads_or(moved) && threadIdx.x == 0) atomicOr(&status->moved, 1u);
}

__device__ void init_stats(FracStats& s) {
  for (int a = 0; a < 3; ++a) {
    s.fmin[a] = INFINITY;
    s.fmax[a] = -INFINITY;
    s.wmin[a] = INT_MAX;
    s.wmax[a] = INT_MIN;
  }
  s.max_abs = 0.0;
  s.first_far = kNoAtom;
}

__device__ void combine_stats(FracStats& s, const FracStats& o) {
  for (int a = 0; a < 3; ++a) {
    s.fmin[a] = fmin(s.fmin[a], o.fmin[a]);
    s.fmax[a] = fmax(s.fmax[a], o.fmax[a]);
    s.wmin[a] = min(s.wmin[a], o.wmin[a]);
    s.wmax[a] = max(s.wmax[a], o.wmax[a]);
  }
  s.max_abs = fmax(s.max_abs, o.max_abs);
  s.first_far = min(s.first_far, o.first_far);
}

// Reduces `local` over the block (kBlock threads) into out (thread 0).
__device__ void block_reduce_stats(const FracStats& local, FracStats* out) {
  __shared__ FracStats shared[kBlock];
  shared[threadIdx.x] = local;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s)
      combine_stats(shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = shared[0];
}

// Fractional coordinates (SoA), wrapped along periodic directions, and the wraps.
__global__ void __launch_bounds__(kBlock)
    frac_kernel(int64_t n, const double* __restrict__ x, FracParams p, double* __restrict__ frac,
                int32_t* __restrict__ wrap, FracStats* __restrict__ partial) {
  FracStats local;
  init_stats(local);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const double xi[3] = {x[3 * i], x[3 * i + 1], x[3 * i + 2]};
    for (int k = 0; k < 3; ++k) local.max_abs = fmax(local.max_abs, fabs(xi[k]));
    for (int a = 0; a < 3; ++a) {
      double f = xi[0] * p.recip[3 * a] + xi[1] * p.recip[3 * a + 1] + xi[2] * p.recip[3 * a + 2];
      int w = 0;
      if (p.periodic[a]) {
        if (!(fabs(f) < kMaxWraps)) {
          local.first_far = min(local.first_far, static_cast<long long>(i));
          f = 0.0;
        } else {
          double fw = floor(f);
          f -= fw;
          if (f >= 1.0) {  // f was a tiny negative number
            f = 0.0;
            fw += 1.0;
          }
          w = static_cast<int>(fw);
        }
        local.wmin[a] = min(local.wmin[a], w);
        local.wmax[a] = max(local.wmax[a], w);
      } else {
        local.fmin[a] = fmin(local.fmin[a], f);
        local.fmax[a] = fmax(local.fmax[a], f);
      }
      frac[a * n + i] = f;
      wrap[a * n + i] = w;
    }
  }
  block_reduce_stats(local, partial + blockIdx.x);
}

__global__ void __launch_bounds__(kBlock)
    finish_stats_kernel(const FracStats* __restrict__ partial, int count, FracStats* out) {
  FracStats local;
  init_stats(local);
  for (int b = threadIdx.x; b < count; b += blockDim.x) combine_stats(local, partial[b]);
  block_reduce_stats(local, out);
}

__device__ inline int bin_coord(double u, int nb) {
  // u >= 0 except for rounding; (int) truncates, which is floor for u > 0.
  return u <= 0.0 ? 0 : (u >= static_cast<double>(nb - 1) ? nb - 1 : static_cast<int>(u));
}

__global__ void bin_kernel(int64_t n, const double* __restrict__ frac, BinParams p,
                           uint32_t* __restrict__ keys, int32_t* __restrict__ atoms,
                           int32_t* __restrict__ bin_count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    int b[3];
    for (int a = 0; a < 3; ++a) {
      const double f = frac[a * n + i];
      const double u = p.periodic[a] ? f * p.nb[a] : (f - p.origin[a]) * p.inv_width[a];
      b[a] = bin_coord(u, p.nb[a]);
    }
    const uint32_t key =
        static_cast<uint32_t>((static_cast<int64_t>(b[2]) * p.nb[1] + b[1]) * p.nb[0] + b[0]);
    keys[i] = key;
    atoms[i] = static_cast<int32_t>(i);
    atomicAdd(bin_count + key, 1);
  }
}

__global__ void gather_kernel(int64_t n, const int32_t* __restrict__ sorted_atoms,
                              const double* __restrict__ x, const int32_t* __restrict__ wrap,
                              double* __restrict__ sorted_pos, int32_t* __restrict__ sorted_wrap) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += stride) {
    const int64_t i = sorted_atoms[k];
    for (int a = 0; a < 3; ++a) {
      sorted_pos[a * n + k] = x[3 * i + a];
      sorted_wrap[a * n + k] = wrap[a * n + i];
    }
  }
}

// The bin and image of unwrapped bin coordinate t along a direction; false when
// t lies outside an open direction's bins.
__device__ inline bool stencil_bin(int t, int nb, int periodic, int& bin, int& image) {
  if (periodic) {
    int q = t / nb;
    int r = t - q * nb;
    if (r < 0) {
      r += nb;
      q -= 1;
    }
    bin = r;
    image = q;
    return true;
  }
  if (t < 0 || t >= nb) return false;
  bin = t;
  image = 0;
  return true;
}

// kFill == false: counts[i] = row length. kFill == true: writes row i from
// row_offsets[i] in the same order.
template <bool kFill>
__global__ void __launch_bounds__(kBlock)
    search_kernel(SearchParams p, const uint32_t* __restrict__ sorted_keys,
                  const int32_t* __restrict__ sorted_atoms, const double* __restrict__ sorted_pos,
                  const int32_t* __restrict__ sorted_wrap, const int32_t* __restrict__ bin_start,
                  const double* __restrict__ table, int64_t* __restrict__ counts,
                  const int64_t* __restrict__ row_offsets, int32_t* __restrict__ neighbors,
                  int32_t* __restrict__ shift_index) {
  const int64_t n = p.n;
  const int span1 = 2 * p.K[1] + 1;
  const int span2 = 2 * p.K[2] + 1;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += stride) {
    const int32_t i = sorted_atoms[k];
    const double xi = sorted_pos[k];
    const double yi = sorted_pos[n + k];
    const double zi = sorted_pos[2 * n + k];
    const int wi0 = sorted_wrap[k];
    const int wi1 = sorted_wrap[n + k];
    const int wi2 = sorted_wrap[2 * n + k];
    const uint32_t key = sorted_keys[k];
    const int home0 = static_cast<int>(key % static_cast<uint32_t>(p.nb[0]));
    const int home1 =
        static_cast<int>((key / static_cast<uint32_t>(p.nb[0])) % static_cast<uint32_t>(p.nb[1]));
    const int home2 =
        static_cast<int>(key / (static_cast<uint32_t>(p.nb[0]) * static_cast<uint32_t>(p.nb[1])));
    int64_t out = 0;
    if (kFill) out = row_offsets[i];
    int64_t count = 0;
    for (int d2 = -p.reach[2]; d2 <= p.reach[2]; ++d2) {
      int c2, m2;
      if (!stencil_bin(home2 + d2, p.nb[2], p.periodic[2], c2, m2)) continue;
      for (int d1 = -p.reach[1]; d1 <= p.reach[1]; ++d1) {
        int c1, m1;
        if (!stencil_bin(home1 + d1, p.nb[1], p.periodic[1], c1, m1)) continue;
        for (int d0 = -p.reach[0]; d0 <= p.reach[0]; ++d0) {
          int c0, m0;
          if (!stencil_bin(home0 + d0, p.nb[0], p.periodic[0], c0, m0)) continue;
          const int64_t bin = (static_cast<int64_t>(c2) * p.nb[1] + c1) * p.nb[0] + c0;
          const int q_end = bin_start[bin + 1];
          for (int q = bin_start[bin]; q < q_end; ++q) {
            const int32_t j = sorted_atoms[q];
            const int n0 = m0 - sorted_wrap[q] + wi0;
            const int n1 = m1 - sorted_wrap[n + q] + wi1;
            const int n2 = m2 - sorted_wrap[2 * n + q] + wi2;
            if (j == i && n0 == 0 && n1 == 0 && n2 == 0) continue;
            if (i >= p.owned && j >= p.owned) continue;
            const int code = ((n0 + p.K[0]) * span1 + (n1 + p.K[1])) * span2 + (n2 + p.K[2]);
            const double* s = table + 3 * static_cast<int64_t>(code);
            // v = (x_j - x_i) + shift, |v|^2 = (vx^2 + vy^2) + vz^2, without
            // contractions (the CPU list's arithmetic).
            const double vx = __dadd_rn(__dsub_rn(sorted_pos[q], xi), s[0]);
            const double vy = __dadd_rn(__dsub_rn(sorted_pos[n + q], yi), s[1]);
            const double vz = __dadd_rn(__dsub_rn(sorted_pos[2 * n + q], zi), s[2]);
            const double r2 =
                __dadd_rn(__dadd_rn(__dmul_rn(vx, vx), __dmul_rn(vy, vy)), __dmul_rn(vz, vz));
            if (r2 < p.radius2) {
              if (kFill) {
                neighbors[out + count] = j;
                shift_index[out + count] = code;
              }
              ++count;
            }
          }
        }
      }
    }
    if (!kFill) counts[i] = count;
  }
}

// The smallest edge e = i <- j with j >= i closer than sqrt(min2) (the edge
// j <- i has the exactly negated vector). kRowThreads consecutive threads share
// a row, so that the loads of a warp fall on few rows.
constexpr int kRowThreads = 8;

__global__ void min_distance_kernel(int64_t n, const double* __restrict__ x,
                                    const int64_t* __restrict__ row_offsets,
                                    const int32_t* __restrict__ neighbors,
                                    const int32_t* __restrict__ shift_index,
                                    const double* __restrict__ table, double min2,
                                    NeighborStatus* status) {
  unsigned long long first = kNone;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < n * kRowThreads;
       t += stride) {
    const int64_t i = t / kRowThreads;
    const double xi = x[3 * i], yi = x[3 * i + 1], zi = x[3 * i + 2];
    const int64_t end = row_offsets[i + 1];
    // Each lane stops at its first close edge; the smallest over the lanes is
    // the row's first.
    for (int64_t e = row_offsets[i] + t % kRowThreads; e < end; e += kRowThreads) {
      const int64_t j = neighbors[e];
      if (j < i) continue;
      const double* s = table + 3 * static_cast<int64_t>(shift_index[e]);
      const double vx = __dadd_rn(__dsub_rn(x[3 * j], xi), s[0]);
      const double vy = __dadd_rn(__dsub_rn(x[3 * j + 1], yi), s[1]);
      const double vz = __dadd_rn(__dsub_rn(x[3 * j + 2], zi), s[2]);
      const double r2 =
          __dadd_rn(__dadd_rn(__dmul_rn(vx, vx), __dmul_rn(vy, vy)), __dmul_rn(vz, vz));
      if (r2 < min2) {
        first = min(first, static_cast<unsigned long long>(e));
        break;
      }
    }
  }
  if (first != kNone) atomicMin(&status->first_close, first);
}

// Grows a device array to at least n elements (with slack 1/slack_div), never shrinks.
template <class T>
void grow(DeviceArray<T>& a, size_t n, size_t slack_div = 0) {
  if (a.bytes() / sizeof(T) < n) {
    a.resize(n + (slack_div ? n / slack_div : 0));
  } else {
    a.resize(n);
  }
}

NeighborStatus download_status(const DeviceArray<NeighborStatus>& status, cudaStream_t stream) {
  NeighborStatus st;
  check(cudaMemcpyAsync(&st, status.data(), sizeof(st), cudaMemcpyDeviceToHost, stream),
        "neighbor list status download");
  check(cudaStreamSynchronize(stream), "neighbor list synchronize");
  return st;
}

}  // namespace

// ---------------------------------------------------------------------------------
// DeviceNeighborList
// ---------------------------------------------------------------------------------

DeviceNeighborList::DeviceNeighborList(double cutoff, double skin) : cutoff_(cutoff), skin_(skin) {
  check_cutoff_and_skin(cutoff, skin);
}

void DeviceNeighborList::set_num_owned(int64_t num_owned) {
  if (num_owned < -1) throw Error("the number of owned atoms must be >= 0 (-1: every atom)");
  if (num_owned != num_owned_) valid_ = false;
  num_owned_ = num_owned;
}

DeviceNeighborList::~DeviceNeighborList() {
  if (pending_status_) cudaFreeHost(pending_status_);
}

size_t DeviceNeighborList::bytes() const {
  return reference_.bytes() + frac_.bytes() + wrap_.bytes() + keys_.bytes() + sorted_keys_.bytes() +
         atoms_.bytes() + sorted_atoms_.bytes() + sorted_pos_.bytes() + sorted_wrap_.bytes() +
         counts_.bytes() + row_offsets_.bytes() + bin_count_.bytes() + bin_start_.bytes() +
         neighbors_.bytes() + shift_index_.bytes() + table_.bytes() + partial_stats_.bytes() +
         status_.bytes() + temp_.bytes();
}

void DeviceNeighborList::ensure_temp(size_t bytes) { grow(temp_, std::max<size_t>(bytes, 1)); }

GraphView DeviceNeighborList::view(const double* positions, const int32_t* species) const {
  if (row_offsets_.size() == 0) throw Error("neighbor list used before its first update()");
  GraphView g;
  g.num_nodes = num_atoms_;
  g.num_energy_nodes = num_atoms_;
  g.positions = positions;
  g.species = species;
  g.row_offsets = row_offsets_.data();
  g.neighbors = neighbors_.data();
  g.num_edges = num_edges_;
  g.shift_index = shift_index_.data();
  g.shifts = table_.data();
  return g;
}

bool DeviceNeighborList::update(int64_t num_atoms, const double* positions, const double* cell,
                                const bool pbc[3], double min_distance, cudaStream_t stream,
                                const double* host_positions) {
  bool periodic[3];
  double cell_copy[9];
  check_update_arguments(num_atoms, positions, cell, pbc, periodic, cell_copy);
  check_pending_ = false;
  if (num_owned_ > num_atoms) {
    throw Error("more owned atoms (" + std::to_string(num_owned_) + ") than atoms (" +
                std::to_string(num_atoms) + ")");
  }

  const int64_t n = num_atoms;
  bool rebuild = !valid_ || n != num_atoms_ || periodic[0] != pbc_[0] || periodic[1] != pbc_[1] ||
                 periodic[2] != pbc_[2] || std::memcmp(cell_copy, cell_, sizeof(cell_)) != 0;
  const double min2 = min_distance > 0.0 ? min_distance * min_distance : 0.0;
  grow(status_, 1);

  if (n > 0 && host_positions) {
    // On the host: no synchronization before the model runs.
    check_finite_positions(n, host_positions);
    rebuild = rebuild || reference_host_.size() != static_cast<size_t>(3 * n) ||
              moved_past_half_skin(n, host_positions, reference_host_.data(), skin_);
    if (!rebuild) {
      if (min2 > 0.0 && num_edges_ > 0) {
        if (!pending_status_)
          check(cudaMallocHost(&pending_status_, sizeof(NeighborStatus)),
                "cudaMallocHost (neighbor list status)");
        reset_status_kernel<<<1, 1, 0, stream>>>(status_.data());
        check_launch("reset_status_kernel");
        launch_min_distance(positions, min_distance, stream);
        check(cudaMemcpyAsync(pending_status_, status_.data(), sizeof(NeighborStatus),
                              cudaMemcpyDeviceToHost, stream),
              "neighbor list status download");
        check_pending_ = true;
        pending_min_distance_ = min_distance;
      }
      return false;
    }
  } else if (n > 0) {
    // Non-finite positions, the displacement since the last build, and (when
    // the list stays) the minimum distance on it: one copy of the status.
    reset_status_kernel<<<1, 1, 0, stream>>>(status_.data());
    check_launch("reset_status_kernel");
    const int compare = rebuild ? 0 : (skin_ > 0.0 ? 1 : 2);
    check_positions_kernel<<<grid_blocks(n), kBlock, 0, stream>>>(
        n, positions, reference_.data(), compare, 0.25 * skin_ * skin_, status_.data());
    check_launch("check_positions_kernel");
    const bool check_close = !rebuild && min2 > 0.0 && num_edges_ > 0;
    if (check_close) launch_min_distance(positions, min_distance, stream);
    const NeighborStatus st = download_status(status_, stream);
    if (st.first_nonfinite != kNone) {
      throw Error("position of atom " + std::to_string(st.first_nonfinite) +
                  " is not finite (NaN or inf)");
    }
    if (st.moved) rebuild = true;
    if (!rebuild) {
      if (check_close && st.first_close != kNone) {
        report_close_pair(st.first_close, positions, min_distance, stream);
      }
      return false;
    }
  } else if (!rebuild) {
    return false;
  }

  valid_ = false;
  num_atoms_ = n;
  std::memcpy(cell_, cell_copy, sizeof(cell_));
  for (int a = 0; a < 3; ++a) pbc_[a] = periodic[a];
  build(positions, stream);
  if (host_positions)
    reference_host_.assign(host_positions, host_positions + 3 * n);
  else
    reference_host_.clear();

  if (n > 0 && min2 > 0.0 && num_edges_ > 0) {
    reset_status_kernel<<<1, 1, 0, stream>>>(status_.data());
    check_launch("reset_status_kernel");
    launch_min_distance(positions, min_distance, stream);
    const NeighborStatus st = download_status(status_, stream);
    if (st.first_close != kNone) report_close_pair(st.first_close, positions, min_distance, stream);
  }
  return true;
}

void DeviceNeighborList::finish_checks(const double* positions, cudaStream_t stream) {
  if (!check_pending_) return;
  check_pending_ = false;
  if (pending_status_->first_close != kNone)
    report_close_pair(pending_status_->first_close, positions, pending_min_distance_, stream);
}

void DeviceNeighborList::launch_min_distance(const double* positions, double min_distance,
                                             cudaStream_t stream) {
  const int64_t n = num_atoms_;
  min_distance_kernel<<<grid_blocks(n * kRowThreads), kBlock, 0, stream>>>(
      n, positions, row_offsets_.data(), neighbors_.data(), shift_index_.data(), table_.data(),
      min_distance * min_distance, status_.data());
  check_launch("min_distance_kernel");
}

void DeviceNeighborList::report_close_pair(unsigned long long edge, const double* positions,
                                           double min_distance, cudaStream_t stream) const {
  const int64_t n = num_atoms_;
  const int64_t e = static_cast<int64_t>(edge);
  std::vector<int64_t> offsets(n + 1);
  row_offsets_.download(offsets.data(), n + 1, stream);
  int32_t j32 = 0;
  int32_t code = 0;
  check(cudaMemcpyAsync(&j32, neighbors_.data() + e, sizeof(j32), cudaMemcpyDeviceToHost, stream),
        "download");
  check(
      cudaMemcpyAsync(&code, shift_index_.data() + e, sizeof(code), cudaMemcpyDeviceToHost, stream),
      "download");
  check(cudaStreamSynchronize(stream), "neighbor list synchronize");
  const int64_t i = std::upper_bound(offsets.begin(), offsets.end(), e) - offsets.begin() - 1;
  const int64_t j = j32;
  double xi[3], xj[3];
  check(cudaMemcpyAsync(xi, positions + 3 * i, sizeof(xi), cudaMemcpyDeviceToHost, stream),
        "download");
  check(cudaMemcpyAsync(xj, positions + 3 * j, sizeof(xj), cudaMemcpyDeviceToHost, stream),
        "download");
  check(cudaStreamSynchronize(stream), "neighbor list synchronize");
  const double* s = table_host_.data() + 3 * static_cast<int64_t>(code);
  const int32_t* cells = table_cells_.data() + 3 * static_cast<int64_t>(code);
  double d2 = 0.0;
  for (int k = 0; k < 3; ++k) {
    const double v = (xj[k] - xi[k]) + s[k];
    d2 += v * v;
  }
  std::string message = "atoms " + std::to_string(i) + " and " + std::to_string(j) + " are " +
                        format_number(std::sqrt(d2)) + " Å apart, closer than the minimum " +
                        format_number(min_distance) + " Å";
  if (cells[0] != 0 || cells[1] != 0 || cells[2] != 0) {
    message += " (through the periodic image shifted by cell vectors (" + std::to_string(cells[0]) +
               ", " + std::to_string(cells[1]) + ", " + std::to_string(cells[2]) + "))";
  }
  throw Error(message);
}

void DeviceNeighborList::build(const double* positions, cudaStream_t stream) {
  const int64_t n = num_atoms_;
  const Lattice lat = make_lattice(cell_, pbc_);
  const double radius = cutoff_ + skin_;

  // The shift table for |n_a| <= K_a (kept when neither K nor the cell changed).
  auto set_table = [&](const int K[3]) {
    if (std::equal(K, K + 3, table_reach_) &&
        std::memcmp(lat.cell, table_cell_, sizeof(table_cell_)) == 0 && table_.size() > 0) {
      return;
    }
    const int64_t span[3] = {2 * int64_t{K[0]} + 1, 2 * int64_t{K[1]} + 1, 2 * int64_t{K[2]} + 1};
    const int64_t entries = span[0] * span[1] * span[2];
    table_cells_.resize(3 * entries);
    table_host_.resize(3 * entries);
    for (int64_t c = 0; c < entries; ++c) {
      const int64_t m[3] = {c / (span[1] * span[2]) - K[0], (c / span[2]) % span[1] - K[1],
                            c % span[2] - K[2]};
      for (int a = 0; a < 3; ++a) table_cells_[3 * c + a] = static_cast<int32_t>(m[a]);
      shift_vector(m[0], m[1], m[2], lat.cell, table_host_.data() + 3 * c);
    }
    table_.upload(table_host_.data(), table_host_.size(), stream);
    for (int a = 0; a < 3; ++a) table_reach_[a] = K[a];
    std::memcpy(table_cell_, lat.cell, sizeof(table_cell_));
  };

  grow(row_offsets_, n + 1);
  if (n == 0) {
    check(cudaMemsetAsync(row_offsets_.data(), 0, sizeof(int64_t), stream), "memset");
    const int K[3] = {0, 0, 0};
    set_table(K);
    num_edges_ = 0;
    ++num_builds_;
    valid_ = true;
    return;
  }

  // 1. Fractional coordinates, wraps, and their bounds.
  FracParams fp;
  for (int k = 0; k < 9; ++k) fp.recip[k] = lat.recip[k];
  for (int a = 0; a < 3; ++a) fp.periodic[a] = lat.periodic[a] ? 1 : 0;
  grow(frac_, 3 * n);
  grow(wrap_, 3 * n);
  const int reduce_blocks = grid_blocks(n, kMaxReduceBlocks);
  grow(partial_stats_, reduce_blocks + 1);
  frac_kernel<<<reduce_blocks, kBlock, 0, stream>>>(n, positions, fp, frac_.data(), wrap_.data(),
                                                    partial_stats_.data());
  check_launch("frac_kernel");
  finish_stats_kernel<<<1, kBlock, 0, stream>>>(partial_stats_.data(), reduce_blocks,
                                                partial_stats_.data() + reduce_blocks);
  check_launch("finish_stats_kernel");
  FracStats st;
  check(cudaMemcpyAsync(&st, partial_stats_.data() + reduce_blocks, sizeof(st),
                        cudaMemcpyDeviceToHost, stream),
        "neighbor list bounds download");
  check(cudaStreamSynchronize(stream), "neighbor list synchronize");
  if (st.first_far != kNoAtom) {
    throw Error("atom " + std::to_string(st.first_far) +
                " lies more than 2^28 cell lengths from the cell along a periodic direction; "
                "wrap the positions");
  }

  // 2. The grid. The search radius absorbs the rounding of the fractional
  // coordinates (binning only; edges are decided on the exact edge vector).
  double cell_length_sum = 0.0;
  for (int a = 0; a < 3; ++a) {
    if (lat.periodic[a]) {
      const double max_cells =
          static_cast<double>(std::max(st.wmax[a], -st.wmin[a])) + radius / lat.spacing[a] + 3.0;
      cell_length_sum += norm3(lat.cell + 3 * a) * max_cells;
    }
  }
  const double search = radius + 1e-9 * (radius + st.max_abs + cell_length_sum);
  int64_t nb[3];
  double extent[3];
  for (int a = 0; a < 3; ++a) {
    extent[a] = lat.periodic[a] ? lat.spacing[a] : std::max(0.0, st.fmax[a] - st.fmin[a]);
    const double cells = std::floor(extent[a] / search);
    nb[a] = !(cells >= 1.0)
                ? 1
                : (cells >= static_cast<double>(kMaxBinsPerAxis) ? kMaxBinsPerAxis
                                                                 : static_cast<int64_t>(cells));
  }
  // At most max(64, n) bins: coarser bins along the finest direction first.
  const int64_t max_bins = std::max<int64_t>(64, n);
  while (nb[0] * nb[1] * nb[2] > max_bins) {
    int a = 0;
    for (int b = 1; b < 3; ++b) {
      if (nb[b] > nb[a]) a = b;
    }
    nb[a] = (nb[a] + 1) / 2;
  }
  SearchParams sp;
  BinParams bp;
  sp.n = n;
  sp.owned = num_owned_ < 0 ? n : num_owned_;
  sp.radius2 = radius * radius;
  int K[3];
  int64_t image_box = 1;
  int64_t table_size = 1;
  for (int a = 0; a < 3; ++a) {
    sp.nb[a] = bp.nb[a] = static_cast<int>(nb[a]);
    sp.periodic[a] = bp.periodic[a] = lat.periodic[a] ? 1 : 0;
    bp.origin[a] = lat.periodic[a] ? 0.0 : st.fmin[a];
    bp.inv_width[a] = (!lat.periodic[a] && extent[a] > 0.0) ? nb[a] / extent[a] : 0.0;
    if (lat.periodic[a]) {
      const double reach = std::ceil(search * nb[a] / lat.spacing[a]);
      if (!(reach < static_cast<double>(kMaxImageBox))) {
        throw Error("cell is too small for the cutoff: direction " + std::to_string(a) +
                    " would need " + format_number(reach) + " periodic images per side");
      }
      sp.reach[a] = std::max(1, static_cast<int>(reach));
      const int64_t images = (sp.reach[a] + nb[a] - 1) / nb[a];
      const int64_t k = images + (static_cast<int64_t>(st.wmax[a]) - st.wmin[a]);
      table_size *= 2 * k + 1;
      if (table_size > kMaxShiftTable) {
        throw Error(
            "positions are spread over too many periodic cells for the GPU neighbor list (wraps " +
            std::to_string(st.wmin[a]) + " to " + std::to_string(st.wmax[a]) + " along direction " +
            std::to_string(a) + "); wrap the positions");
      }
      K[a] = static_cast<int>(k);
    } else {
      sp.reach[a] = 1;
      K[a] = 0;
    }
    image_box *= 2 * sp.reach[a] + 1;
    if (image_box > kMaxImageBox) {
      throw Error("cell is too small for the cutoff: over " + std::to_string(kMaxImageBox) +
                  " periodic images per atom would be needed");
    }
    sp.K[a] = K[a];
  }
  set_table(K);

  // 3. Bin the atoms, sort them by bin (stable), bin offsets, gather.
  const int64_t num_bins = nb[0] * nb[1] * nb[2];
  int end_bit = 1;
  while ((int64_t{1} << end_bit) < num_bins) ++end_bit;
  grow(keys_, n);
  grow(sorted_keys_, n);
  grow(atoms_, n);
  grow(sorted_atoms_, n);
  grow(bin_count_, num_bins + 1);
  grow(bin_start_, num_bins + 1);
  grow(sorted_pos_, 3 * n);
  grow(sorted_wrap_, 3 * n);
  grow(counts_, n + 1);
  size_t sort_bytes = 0, bin_scan_bytes = 0, row_scan_bytes = 0;
  check(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys_.data(), sorted_keys_.data(),
                                        atoms_.data(), sorted_atoms_.data(), n, 0, end_bit, stream),
        "cub::DeviceRadixSort::SortPairs");
  check(cub::DeviceScan::ExclusiveSum(nullptr, bin_scan_bytes, bin_count_.data(), bin_start_.data(),
                                      num_bins + 1, stream),
        "cub::DeviceScan::ExclusiveSum");
  check(cub::DeviceScan::ExclusiveSum(nullptr, row_scan_bytes, counts_.data(), row_offsets_.data(),
                                      n + 1, stream),
        "cub::DeviceScan::ExclusiveSum");
  ensure_temp(std::max({sort_bytes, bin_scan_bytes, row_scan_bytes}));

  check(cudaMemsetAsync(bin_count_.data(), 0, (num_bins + 1) * sizeof(int32_t), stream), "memset");
  bin_kernel<<<grid_blocks(n), kBlock, 0, stream>>>(n, frac_.data(), bp, keys_.data(),
                                                    atoms_.data(), bin_count_.data());
  check_launch("bin_kernel");
  size_t temp_bytes = temp_.bytes();
  check(cub::DeviceRadixSort::SortPairs(temp_.data(), temp_bytes, keys_.data(), sorted_keys_.data(),
                                        atoms_.data(), sorted_atoms_.data(), n, 0, end_bit, stream),
        "cub::DeviceRadixSort::SortPairs");
  temp_bytes = temp_.bytes();
  check(cub::DeviceScan::ExclusiveSum(temp_.data(), temp_bytes, bin_count_.data(),
                                      bin_start_.data(), num_bins + 1, stream),
        "cub::DeviceScan::ExclusiveSum");
  gather_kernel<<<grid_blocks(n), kBlock, 0, stream>>>(
      n, sorted_atoms_.data(), positions, wrap_.data(), sorted_pos_.data(), sorted_wrap_.data());
  check_launch("gather_kernel");

  // 4. Count, scan into row offsets, fill.
  check(cudaMemsetAsync(counts_.data() + n, 0, sizeof(int64_t), stream), "memset");
  search_kernel<false><<<grid_blocks(n), kBlock, 0, stream>>>(
      sp, sorted_keys_.data(), sorted_atoms_.data(), sorted_pos_.data(), sorted_wrap_.data(),
      bin_start_.data(), table_.data(), counts_.data(), nullptr, nullptr, nullptr);
  check_launch("search_kernel<count>");
  temp_bytes = temp_.bytes();
  check(cub::DeviceScan::ExclusiveSum(temp_.data(), temp_bytes, counts_.data(), row_offsets_.data(),
                                      n + 1, stream),
        "cub::DeviceScan::ExclusiveSum");
  int64_t num_edges = 0;
  check(cudaMemcpyAsync(&num_edges, row_offsets_.data() + n, sizeof(num_edges),
                        cudaMemcpyDeviceToHost, stream),
        "neighbor list edge count download");
  check(cudaStreamSynchronize(stream), "neighbor list synchronize");
  grow(neighbors_, num_edges, 16);
  grow(shift_index_, num_edges, 16);
  if (num_edges > 0) {
    search_kernel<true><<<grid_blocks(n), kBlock, 0, stream>>>(
        sp, sorted_keys_.data(), sorted_atoms_.data(), sorted_pos_.data(), sorted_wrap_.data(),
        bin_start_.data(), table_.data(), nullptr, row_offsets_.data(), neighbors_.data(),
        shift_index_.data());
    check_launch("search_kernel<fill>");
  }

  // 5. Reference positions for the displacement check.
  grow(reference_, 3 * n);
  check(cudaMemcpyAsync(reference_.data(), positions, 3 * n * sizeof(double),
                        cudaMemcpyDeviceToDevice, stream),
        "neighbor list reference copy");
  num_edges_ = num_edges;
  ++num_builds_;
  valid_ = true;
}

}  // namespace e3fuse::cuda
