// cuda/conv.cuh: the fused convolution on the GPU (same math as cpu/conv.cpp).
//
// One thread block per receiver node. Its edges inside the cutoff are taken in
// chunks of EC: edge vector, spherical harmonics and the Bessel x envelope
// embedding (in double) are recomputed into shared memory, the radial MLP runs
// as a small GEMM over the chunk (weights from L2/L1; in float32 on the tensor
// cores with 3xTF32 products, as accurate as float32 FMAs), and the channelwise
// tensor product accumulates into the receiver's output row in shared memory.
// With a radial table (the default in float32), the MLP and its adjoint are replaced
// per edge by one read of its cubic coefficients (ops/radial_table.h), done by each
// lane for its own channel inside the tensor product: no MLP workspace at all.
// Nothing with a feature dimension ever goes to global memory per edge.
//
// The backward kernel is the same walk at node k for the messages k sends, k -> j
// (receiver j): it recomputes the chunk and writes dE/dx_k (a fixed summation order).
// Each message's force f = dE/dv, v = r_j - r_k, is computed once: +f goes to node k's
// force in double, -f to j's through RemoteForces, fixed-point sums. Integer
// additions are exact in any order, so the atomics keep the result bitwise deterministic;
// the CPU (cpu/conv.cpp) instead handles both directions of each pair at each end, which
// costs the force work twice.
//
// mace's non-linear block (Conv::radial_mlp): its RadialMLP depends on the ORDERED species
// pair (receiver, sender) and has LayerNorms; without tables it is evaluated exactly in double
// per edge (ops::radial_mlp_forward's math) by a kernel of its own before each convolution
// call, into a per-edge array that the convolution reads as a radial table of one interval per
// edge at t = 0 (coefficients {R, dR/dr, 0, 0}: the table path's own reads, exactly R and
// dR/dr). The forward pass's array holds R of the pair (s_i, s_j) for the edges of row i, the
// backward's R and dR/dr of the reverse pair (s_j, s_i) of the message k -> j. A stepping stone
// against the memory rule (DESIGN.md 2): E x weight_numel x 4 x sizeof(T) bytes, one array for
// all layers (the largest), e.g. 32 B per weight and edge in float64.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cpu/typed_plan.h"
#include "cuda/common.cuh"
#include "e3fuse/system.h"
#include "ops/radial.h"
#include "ops/radial_mlp.h"

namespace e3fuse::cuda {

constexpr int kMaxMlpLayers = 8;
constexpr int kConvWarps = 8;  // warps per block of the convolution kernels
// warps per block of the wide forward kernel (launch_largest_chunk's `wide`)
constexpr int kWideConvWarps = 16;
constexpr int kMaxBasis = 32;

// Radial basis and spherical harmonics, as flat device tables.
template <class T>
struct Geometry {
  struct View {
    double cutoff = 0.0;
    int num_basis = 0;
    double coeffs[kMaxBasis] = {};
    double prefactor = 0.0;
    ops::EnvelopeParams envelope{};
    bool normalize = true;
    int lmax = 0, sh_dim = 0;
    const int* term_begin = nullptr;  // sh_dim + 1
    const int* exps = nullptr;        // per term: e0 | e1 << 8 | e2 << 16
    const T* sh_coeffs = nullptr;     // per term
    // MACE radial options (cpu::TypedPlan): ops::mace_edge_embedding with r_0 =
    // pair_r0[s_i * num_species + s_j] under a distance transform
    bool mace_embedding = false, apply_cutoff = true;
    ops::TransformParams transform{};
    int num_species = 0;
    const double* pair_r0 = nullptr;
  };
  View view;
  DeviceArray<int> term_begin, exps;
  DeviceArray<T> sh_coeffs;
  DeviceArray<double> pair_r0;
};

// The forward's M layout (Conv::Path::mf_offset): row a of a path starts at entry
// a x forward_m_row(d3), rows padded to a multiple of 4 entries for 16-byte loads (with
// d3 = 1 the path's column [d1] is one padded row), and a path takes forward_m_size(d1, d3)
// entries, a multiple of 4. make_conv lays M out and tp_forward_task reads it by these.
E3F_HD constexpr int forward_m_row(int d3) { return d3 == 1 ? 1 : (d3 + 3) / 4 * 4; }
E3F_HD constexpr int forward_m_size(int d1, int d3) { return (d1 * forward_m_row(d3) + 3) / 4 * 4; }

// In the float32 convolution backward of a small graph, two thread blocks per row for the rows
// of the last, partial wave of blocks (split_rows in conv_kernels.cuh says which): one block
// per row would leave most SMs idle while those rows finish. Each of the two walks half of the
// row's neighbor list, and the one that finishes second adds its sums to those the first
// stored. a + b has the same bits as b + a, so the results stay bitwise reproducible whichever
// finishes first; whether a row is split depends on its index and the graph's size only, not
// on the rows of one call (ConvRows).
struct RowSplit {
  int64_t from = INT64_MAX;  // graph rows at or past it take two blocks
  bool listed = false;       // ConvRows: two blocks per listed row, the second idle if whole
  int* state = nullptr;  // per split row {blocks finished, first's sums stored}, 0 between launches
  double* sums = nullptr;  // per split row the first block's node force and virial [12]
};
// The device memory behind RowSplit, one per convolution layer (grown when a graph needs more).
struct RowSplitScratch {
  DeviceArray<int> state;
  DeviceArray<double> sums;
};

template <class T>
struct Conv {
  // One input irrep block and its paths (paths[path_begin .. path_end)).
  struct InBlock {
    int in_offset, mul, d1, path_begin, path_end;
  };
  // gx_offset: the path's slot [d1][mul] of dE/dx partial sums in the backward pass.
  // alpha: the path's Clebsch-Gordan block is alpha x w3j(l1, l2, l3) (ops/wigner3j_table.h).
  // m_offset: the path's entries [d1][d3] in the backward's {M, K} rows; mf_offset: in the
  // forward's padded M rows (View::m_stride_fwd, forward_m_row).
  // m_transposed: the path (l1, l2, l3), l1 < l3, reads the rows of its partner (l3, l2, l1)
  // transposed: cg[a][b][k] = m_scale cg_partner[k][b][a] (w3j(l1, l2, l3)[a][b][k] =
  // (-1)^(l1 + l2 + l3) w3j(l3, l2, l1)[k][b][a]), so M[a][k] = m_scale M_partner[k][a] and
  // likewise K; m_scale is 1 for a path with rows of its own.
  struct Path {
    int out_offset, weight_offset, sh_offset, d2, d3, parity, m_offset, gx_offset;
    T alpha;
    int mf_offset;
    int m_transposed;
    T m_scale;
  };
  // The tensor product is dealt to the warps as tasks: path `path` for the 32 x C channels
  // u0 .. u0 + 32 C - 1 of its input block, C = lane_channels adjacent channels per lane:
  // 1, or 2 read as one 8-byte vector (float32, 64-channel blocks, small paths; see
  // lane_channels() in conv.cu), so that both share the per-edge {M, K} reads, the edge's
  // bookkeeping and the force partials. Tasks are balanced over the warps by their cost
  // (d1 x d3 x C) once, at load time, so no warp waits on another carrying the high-l
  // paths alone.
  struct Task {
    int block, path, u0, lane_channels;
  };
  // Column `out` of M (m_entries: of the backward's rows; m_entries_balanced: of the
  // forward's padded rows): M[e][out] = sum_b cg[a][b][k] Y[e][sh_offset + b] (ops/tp.h) over
  // the column's nonzero coefficients only, in increasing b, so the same sum as over every b
  // (a zero term adds nothing): sum_t w[t] Y[e][y[t]]. A real Wigner 3j column (a, k) has at
  // most two nonzero coefficients (kInlineTerms); a longer column keeps the others in
  // View::extra_y / extra_w from `extra` on. Over SevenNet-l3i5's 34 paths, 611 of 3,436
  // coefficients are nonzero, and 197 of its 738 columns have none: those are not stored,
  // their M stays the zero each block writes once. The entries are stored in the order the
  // threads take them (chunk_contract_sh in conv_kernels.cuh).
  static constexpr int kInlineTerms = 2;
  struct MEntry {
    int out, terms, extra;
    int y[kInlineTerms];
    T w[kInlineTerms];
  };
  // The same column summed over every b (cg[cg_base + b d3] Y[e][sh_offset + b]): the {M, K}
  // rows of the backward kernels compiled for l = 3 inputs, which the float64 and radial-MLP
  // layers run too (dense_columns in conv_kernels.cuh).
  struct DenseEntry {
    int cg_base, d2, d3, sh_offset, out;
  };
  struct View {
    int dim_in = 0, dim_out = 0, weight_numel = 0;
    int num_blocks = 0;
    int max_d1 = 1;             // the largest input irrep dimension
    int max_d3 = 1;             // the largest output irrep dimension
    int max_lane_channels = 1;  // over the tasks: 2 asks rows aligned to 2 elements
    const InBlock* blocks = nullptr;
    const Path* paths = nullptr;  // grouped by input block
    const Task* tasks = nullptr;  // warp w runs tasks[task_begin[w] .. task_begin[w + 1])
    int task_begin[kConvWarps + 1] = {};
    const Task* wide_tasks = nullptr;  // the same dealt to kWideConvWarps warps
    int wide_task_begin[kWideConvWarps + 1] = {};
    int gx_slots = 0;                   // sum over paths of d1 x mul
    int m_per_edge = 0;                 // the backward's {M, K} row (shared by transposed partners)
    int m_columns = 0;                  // its stored columns (m_entries; the others are zero)
    int m_columns_fwd = 0;              // the forward's stored columns (m_entries_balanced)
    int m_stride_fwd = 0;               // the forward's M per edge, padded (Path::mf_offset)
    const MEntry* m_entries = nullptr;  // in path order (the backward's)
    const DenseEntry* m_dense_entries = nullptr;  // all m_per_edge of them, in path order
    const T* cg = nullptr;                        // the paths' blocks, for DenseEntry
    const MEntry* m_entries_balanced = nullptr;   // contraction_order (the forward's)
    const int* extra_y = nullptr;                 // MEntry's terms past kInlineTerms
    const T* extra_w = nullptr;
    // Every path is alpha x w3j(l1, l2, l3) (Path::alpha): the forward tensor product may
    // run from the compile-time Wigner 3j entries (conv_kernels.cuh, sparse_forward).
    bool sparse_cg = false;
    int mlp_layers = 0;
    int dims[kMaxMlpLayers + 1] = {};
    const T* w[kMaxMlpLayers] = {};   // [dims[l]][dims[l+1]]
    const T* wt[kMaxMlpLayers] = {};  // [dims[l+1]][dims[l]]
    Activation act = Activation::identity;
    T act_scale = T(1);
    T inv_denominator = T(1);
    int max_hidden = 0;  // max over dims[0..mlp_layers-1]
    // float32 only (null otherwise): the MLP's weights as
    // tensor-core operands, W^T for the forward product and W for the adjoint, each
    // split into TF32 high and low parts (3xTF32 products, see mma_tf32.cuh)
    const float4* frag_fwd[kMaxMlpLayers] = {};
    const float4* frag_bwd[kMaxMlpLayers] = {};
    // The radial MLP as a table in r (cpu::RadialTable, ops/radial_table.h), used instead
    // of the MLP when not null: [table_intervals][weight_numel][4] cubic coefficients.
    const T* table = nullptr;
    int table_intervals = 0;
    double table_origin = 0.0, table_inv_step = 0.0;
    int table_fine_intervals = 0, table_coarse_shift = 0;  // ops::radial_table_locate
    // Tables per species pair (cpu::Conv::pair_tables, one grid): `table` holds them one
    // after the other, pair (a, b) at pair_slot[a * num_species + b] x table_intervals.
    const int* pair_slot = nullptr;
    int num_species = 0;
  };
  View view;
  DeviceArray<InBlock> blocks;
  DeviceArray<Path> paths;
  DeviceArray<Task> tasks, wide_tasks;
  DeviceArray<MEntry> m_entries, m_entries_balanced;
  DeviceArray<DenseEntry> m_dense_entries;
  DeviceArray<T> cg;
  DeviceArray<int> extra_y;
  DeviceArray<T> extra_w, mlp, table;
  DeviceArray<float> mlp_fragments;
  DeviceArray<int> pair_slot;
  // mace's non-linear block without tables (see the top of this file): its RadialMLP in
  // double on the device (radial_mlp.params points into radial_mlp_params; layers 0: none),
  // and the per-edge array of its weights, shared by the layers of one model.
  DeviceArray<double> radial_mlp_params;
  ops::RadialMlpView radial_mlp;
  int radial_mlp_hidden = 0;  // the widest of its inputs and hidden layers
  std::shared_ptr<DeviceArray<T>> edge_weights;
  std::shared_ptr<RowSplitScratch> row_split = std::make_shared<RowSplitScratch>();
};

// Forces and per-atom virials on the receivers of the convolution's messages, as
// fixed-point sums in two 64-bit words per value (two's complement): a contribution x is
// split into hi = rint(x 2^24) and lo = rint((x - hi 2^-24) 2^56), so it is kept to
// 2^-57 (7e-18 eV/A, or eV), and hi and lo are summed as integers, exactly in any order.
// A contribution of kFixedLimit or more (or not finite) sets *overflow_node = node + 1.
constexpr double kFixedHiScale = 0x1p24;
constexpr double kFixedLoScale = 0x1p56;
constexpr double kFixedLimit = 0x1p29;
struct RemoteForces {
  unsigned long long* forces = nullptr;  // num_nodes x 3 x {hi, lo}
  // num_nodes x 9 x {hi, lo}, or null: then the sender takes each edge's whole virial term
  unsigned long long* virials = nullptr;
  int64_t* overflow_node = nullptr;
};

// The rows one convolution call runs (pair_style e3fuse comm exchange overlaps the halo
// exchange with the rows that need no exchanged data, cuda/halo.cuh): thread block b runs
// row rows[b] instead of row b. Each row's sums are those of the call over every row, so
// results do not depend on how the rows are split over calls.
struct ConvRows {
  const int32_t* rows = nullptr;  // device, `count` row indices (count >= 0)
  int64_t count = -1;             // -1: every row of the graph, in order
  // the non-linear block's per-edge RadialMLP weights of this graph and call kind were
  // written by the call on the other rows just before: not computed again
  bool edge_weights_ready = false;
  bool all() const { return count < 0; }
};

template <class T>
Geometry<T> make_geometry(const cpu::TypedPlan<T>& plan);
// `edge_weights`: the per-edge array a non-linear block's exact RadialMLP writes (shared
// by a model's layers; null: a new one when needed).
template <class T>
Conv<T> make_conv(const cpu::Conv<T>& conv, std::shared_ptr<DeviceArray<T>> edge_weights = nullptr);
// (Re)uploads the pair tables of `host` (after cpu::ensure_pair_tables built some).
template <class T>
void upload_pair_tables(Conv<T>& c, const cpu::Conv<T>& host);

// y_i = (1/D) sum_j TP(x_j, Y(v_ij), MLP(emb(r_ij))) for every node of the device
// graph `g` (ir_mul layouts, as on the CPU), or for `rows` of them. Sets *error_node = i + 1
// if two atoms coincide.
template <class T>
void conv_forward(const Geometry<T>& geom, const Conv<T>& conv, const GraphView& g, const T* x,
                  T* y, int64_t* error_node, cudaStream_t stream, const ConvRows& rows = {});

// Adjoint: grad_x overwritten for the g.num_nodes senders; their side of the forces
// (num_nodes x 3) and atom_virials (num_nodes x 9, may be null) accumulated, the receivers'
// side added to `remote` (add_remote_forces finishes; together as cpu::conv_backward).
// Receivers at or past receiver_rows have dE/dy = 0 and are skipped. `rows`: the senders
// this call runs (default all of g's nodes).
template <class T>
void conv_backward(const Geometry<T>& geom, const Conv<T>& conv, const GraphView& g,
                   int64_t receiver_rows, const T* x, const T* grad_y, T* grad_x, double* forces,
                   double* atom_virials, const RemoteForces& remote, int64_t* error_node,
                   cudaStream_t stream, const ConvRows& rows = {});

// forces[i] += remote.forces[i] (and the virials, when both are given) for every node.
void add_remote_forces(int64_t num_nodes, const RemoteForces& remote, double* forces,
                       double* atom_virials, cudaStream_t stream);

}  // namespace e3fuse::cuda
