// benchmarks/micro/conv_micro.cu: the convolution alone, forward and backward, timed with
// CUDA events, launched exactly as the CUDA engine launches it (cuda/engine_cuda.cu):
// the same Geometry / Conv device structs built from the model file (float32 with the radial
// table by default, as Radial::automatic), the same conv_forward / conv_backward entry points
// on one stream, a receiver-sorted graph from the engine's own GPU neighbor list (cutoff +
// skin; the kernels skip the edges beyond the cutoff as in a step), random node inputs.
//
//   e3fuse_conv_micro --model M.e3f --structure S.bin [--skin 0.5] [--radial auto|table|mlp]
//                     [--dtype float32|float64] [--warmup 3] [--repeats 20]
//                     [--edges-out E.bin] [--json-out R.json]
//
// S.bin (written by conv_micro.py): float64 little endian [n, cell (9, rows = lattice
// vectors), pbc (3, 0/1), positions (3 n)]. E.bin: the edges inside the cutoff in the list's
// order, int32 [E senders][E receivers], for the cuEquivariance side of the comparison.
// Prints one JSON object (also to --json-out): the graph, the device, and per layer its
// irreps, paths and the forward / backward milliseconds of every repeat.
// Built only with -DE3FUSE_MICROBENCH=ON (benchmarks/micro/README.md).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/typed_plan.h"
#include "cuda/common.cuh"
#include "cuda/conv.cuh"
#include "e3fuse/error.h"
#include "e3fuse/model.h"
#include "micro_common.h"
#include "micro_inputs.cuh"
#include "model/plan.h"
#include "neighbors/neighbor_list.cuh"

namespace {

using e3fuse::Error;
using e3fuse::cuda::check;
using e3fuse::cuda::DeviceArray;
using e3fuse_micro::json_list;
using e3fuse_micro::LaunchTimer;
using e3fuse_micro::random_rows;

struct Options : e3fuse_micro::StructureOptions {
  std::string edges_out, radial = "auto";
};

Options parse(int argc, char** argv) {
  Options o;
  e3fuse_micro::parse_pairs(argc, argv, [&](const std::string& key, const std::string& value) {
    if (key == "--edges-out") {
      o.edges_out = value;
    } else if (key == "--radial") {
      o.radial = value;
    } else {
      return o.take(key, value);
    }
    return true;
  });
  o.validate();
  // as Radial::automatic: the table in float32, the MLP in float64
  if (o.radial == "auto") o.radial = o.dtype == "float32" ? "table" : "mlp";
  if (o.radial != "table" && o.radial != "mlp") throw Error("--radial must be auto, table or mlp");
  return o;
}

// The order in which the kernels' thread blocks take the rows (CONV_MICRO_ROW_ORDER, a
// measurement of the microbenchmark only): "natural" (the atoms' own order, no row list; the
// engine lists its rows in its neighbor list's bin order, spatial_rows in engine_cuda.cu; the
// cells of cases.py come unit cell by unit cell, so both orders are spatial), "morton" (rows sorted
// by the Morton code of their position, 10 bits per axis over the bounding box: rows near in space
// run at the same time, so that the rows they gather share the L2 cache), or "random" (a fixed
// shuffle: atoms in no spatial order).
std::vector<int32_t> row_order(const e3fuse_micro::Structure& s, const std::string& order) {
  std::vector<int32_t> rows(static_cast<size_t>(s.n));
  for (int64_t i = 0; i < s.n; ++i) rows[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  if (order == "random") {
    std::mt19937 rng(12345);
    std::shuffle(rows.begin(), rows.end(), rng);
  } else if (order == "morton") {
    double lo[3], hi[3];
    for (int a = 0; a < 3; ++a) lo[a] = hi[a] = s.positions[static_cast<size_t>(a)];
    for (int64_t i = 0; i < s.n; ++i)
      for (int a = 0; a < 3; ++a) {
        const double x = s.positions[static_cast<size_t>(3 * i + a)];
        lo[a] = std::min(lo[a], x);
        hi[a] = std::max(hi[a], x);
      }
    auto spread = [](uint64_t v) {  // bit b of v to bit 3 b
      uint64_t r = 0;
      for (int b = 0; b < 10; ++b) r |= ((v >> b) & 1u) << (3 * b);
      return r;
    };
    std::vector<uint64_t> code(static_cast<size_t>(s.n));
    for (int64_t i = 0; i < s.n; ++i) {
      uint64_t c = 0;
      for (int a = 0; a < 3; ++a) {
        const double f =
            (s.positions[static_cast<size_t>(3 * i + a)] - lo[a]) / std::max(hi[a] - lo[a], 1e-12);
        c |= spread(static_cast<uint64_t>(std::min(1023.0, std::floor(f * 1024.0)))) << a;
      }
      code[static_cast<size_t>(i)] = c;
    }
    std::stable_sort(rows.begin(), rows.end(),
                     [&](int32_t a, int32_t b) { return code[a] < code[b]; });
  } else if (order != "natural") {
    throw Error("CONV_MICRO_ROW_ORDER must be natural, morton or random, not " + order);
  }
  return rows;
}

std::string json_irreps(const e3fuse::Irreps& irreps) {
  std::ostringstream o;
  o << "[";
  for (size_t b = 0; b < irreps.blocks.size(); ++b) {
    const auto& x = irreps.blocks[b];
    o << (b ? ", " : "") << "[" << x.mul << ", " << x.l << ", " << x.parity << "]";
  }
  o << "]";
  return o.str();
}

template <class T>
void require_finite(const DeviceArray<T>& a, const std::string& what) {
  std::vector<T> h(a.size());
  a.download(h.data(), h.size());
  check(cudaDeviceSynchronize(), "download");
  bool nonzero = false;
  for (T x : h) {
    if (!std::isfinite(static_cast<double>(x))) throw Error(what + ": not finite");
    nonzero = nonzero || x != T(0);
  }
  if (!nonzero) throw Error(what + ": all zero (the convolution did nothing)");
}

template <class T>
int run(const Options& opt) {
  namespace cu = e3fuse::cuda;
  const auto model = e3fuse::Model::load(opt.model);
  const e3fuse::ModelPlan& plan = model->plan();
  const bool table = opt.radial == "table";
  const e3fuse_micro::Structure s = e3fuse_micro::read_structure(opt.structure);
  const int64_t n = s.n;

  const e3fuse_micro::DeviceStream ds;
  const cudaDeviceProp& prop = ds.prop;
  cudaStream_t stream = ds.stream;

  // The graph: the engine's GPU neighbor list (BackendImpl::compute_system).
  const e3fuse_micro::DeviceGraph graph(s, plan.cutoff, opt.skin, stream);
  const e3fuse::GraphView& g = graph.view;
  const cu::DeviceNeighborList& neighbors = graph.neighbors;
  const int64_t list_edges = neighbors.num_edges();
  const char* order_env = std::getenv("CONV_MICRO_ROW_ORDER");
  const std::string order = order_env && *order_env ? order_env : "natural";
  DeviceArray<int32_t> row_list;
  cu::ConvRows rows;
  if (order != "natural") {
    row_list.upload(row_order(s, order));
    rows.rows = row_list.data();
    rows.count = n;
  }

  // The edges inside the cutoff, decided as the kernels decide (edge_vector in conv_kernels.cuh).
  std::vector<int64_t> row_offsets(static_cast<size_t>(n + 1));
  std::vector<int32_t> nbr(static_cast<size_t>(list_edges)), shift_index(nbr.size());
  check(cudaMemcpy(row_offsets.data(), neighbors.row_offsets(), row_offsets.size() * 8,
                   cudaMemcpyDeviceToHost),
        "row offsets");
  check(cudaMemcpy(nbr.data(), neighbors.neighbors(), nbr.size() * 4, cudaMemcpyDeviceToHost),
        "neighbors");
  check(cudaMemcpy(shift_index.data(), neighbors.shift_index(), nbr.size() * 4,
                   cudaMemcpyDeviceToHost),
        "shift index");
  int32_t max_shift = 0;
  for (int32_t q : shift_index) max_shift = std::max(max_shift, q);
  std::vector<double> shifts(3 * static_cast<size_t>(max_shift + 1));
  check(cudaMemcpy(shifts.data(), neighbors.shifts(), shifts.size() * 8, cudaMemcpyDeviceToHost),
        "shifts");
  std::vector<int32_t> senders, receivers;
  const double cutoff2 = plan.cutoff * plan.cutoff;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t e = row_offsets[i]; e < row_offsets[i + 1]; ++e) {
      const int64_t j = nbr[e];
      double r2 = 0.0;
      for (int a = 0; a < 3; ++a) {
        const double v = s.positions[3 * j + a] - s.positions[3 * i + a] +
                         shifts[3 * static_cast<size_t>(shift_index[e]) + a];
        r2 += v * v;
      }
      if (r2 < cutoff2) {
        senders.push_back(static_cast<int32_t>(j));
        receivers.push_back(static_cast<int32_t>(i));
      }
    }
  const int64_t edges = static_cast<int64_t>(senders.size());
  if (!opt.edges_out.empty()) {
    std::ofstream f(opt.edges_out, std::ios::binary);
    f.write(reinterpret_cast<const char*>(senders.data()), edges * 4);
    f.write(reinterpret_cast<const char*>(receivers.data()), edges * 4);
    if (!f) throw Error("cannot write " + opt.edges_out);
  }

  // The engine's per-layer device structs (SevennetModel / MaceModel constructors): the
  // geometry from the typed plan, each layer's Conv from its ConvPlan, tabulated or not.
  const bool mace = plan.family == "mace";
  const e3fuse::cpu::TypedPlan<T> typed = e3fuse::cpu::make_typed_plan<T>(plan, table && !mace);
  const cu::Geometry<T> geom = cu::make_geometry<T>(typed);
  const std::vector<const e3fuse::ConvPlan*> conv_plans = e3fuse_micro::conv_plans(plan);

  DeviceArray<int64_t> error_node;
  error_node.resize(2);
  DeviceArray<double> forces, atom_virials;
  DeviceArray<unsigned long long> remote_forces;
  forces.resize(static_cast<size_t>(3 * n));
  atom_virials.resize(static_cast<size_t>(9 * n));
  remote_forces.resize(static_cast<size_t>(2 * 3 * n));
  // ASE asks for the stress: the engine passes per-atom virials to the backward, and no
  // receiver-side virial sums (BackendImpl::run: split_virials only for per-atom virials)
  const cu::RemoteForces remote{remote_forces.data(), nullptr, error_node.data() + 1};

  std::ostringstream layers;
  const int launches = opt.warmup + opt.repeats;
  for (size_t t = 0; t < conv_plans.size(); ++t) {
    const e3fuse::ConvPlan& cp = *conv_plans[t];
    const e3fuse::cpu::Conv<T> host_conv =
        mace ? e3fuse::cpu::make_conv<T>(cp, table ? &plan : nullptr) : typed.layers[t].conv;
    const cu::Conv<T> conv = cu::make_conv<T>(host_conv);
    const int64_t dim_in = conv.view.dim_in, dim_out = conv.view.dim_out;
    DeviceArray<T> x, y, grad_y, grad_x;
    x.upload(random_rows<T>(n, dim_in, 11 + t));
    grad_y.upload(random_rows<T>(n, dim_out, 23 + t));
    y.resize(static_cast<size_t>(n * dim_out));
    grad_x.resize(static_cast<size_t>(n * dim_in));
    error_node.zero();
    check(cudaDeviceSynchronize(), "inputs");

    LaunchTimer fwd(launches), bwd(launches);
    for (int r = 0; r < launches; ++r) {
      fwd.start(r, stream);
      cu::conv_forward(geom, conv, g, x.data(), y.data(), error_node.data(), stream, rows);
      fwd.stop(r, stream);
    }
    for (int r = 0; r < launches; ++r) {
      // zeroed once per step by the engine, outside the convolution: outside the timing
      forces.zero(stream);
      atom_virials.zero(stream);
      remote_forces.zero(stream);
      bwd.start(r, stream);
      cu::conv_backward(geom, conv, g, n, x.data(), grad_y.data(), grad_x.data(), forces.data(),
                        atom_virials.data(), remote, error_node.data(), stream, rows);
      bwd.stop(r, stream);
    }
    check(cudaStreamSynchronize(stream), "the timed convolutions");
    int64_t errors[2] = {0, 0};
    error_node.download(errors, 2);
    check(cudaDeviceSynchronize(), "error flags");
    if (errors[0] || errors[1])
      throw Error("layer " + std::to_string(t) + ": the kernels flagged node " +
                  std::to_string(std::max(errors[0], errors[1]) - 1));
    require_finite(y, "layer " + std::to_string(t) + " forward output");
    require_finite(grad_x, "layer " + std::to_string(t) + " backward dE/dx");

    std::ostringstream paths;
    for (size_t p = 0; p < cp.paths.size(); ++p) {
      const auto& q = cp.paths[p];
      paths << (p ? ", " : "") << "[" << cp.in.blocks[q.in_block].mul << ", " << q.l1 << ", "
            << q.l2 << ", " << q.l3 << "]";
    }
    layers << (t ? ",\n  " : "") << "{\"layer\": " << t << ", \"dim_in\": " << dim_in
           << ", \"dim_out\": " << dim_out << ", \"weight_numel\": " << conv.view.weight_numel
           << ", \"sparse_cg\": " << (conv.view.sparse_cg ? "true" : "false")
           << ", \"m_per_edge\": " << conv.view.m_per_edge
           << ", \"irreps_in\": " << json_irreps(cp.in) << ", \"irreps_sh\": " << json_irreps(cp.sh)
           << ", \"irreps_out\": " << json_irreps(cp.out) << ", \"paths_mul_l1_l2_l3\": ["
           << paths.str() << "], \"table_intervals\": " << host_conv.table.intervals
           << ", \"forward_ms\": " << json_list(fwd.ms(opt.warmup))
           << ", \"backward_ms\": " << json_list(bwd.ms(opt.warmup)) << "}";
  }

  std::ostringstream out;
  out.precision(10);
  out << "{\"tool\": \"e3fuse_conv_micro\", \"model\": \"" << opt.model << "\", \"family\": \""
      << plan.family << "\", \"dtype\": \"" << opt.dtype << "\", \"radial\": \"" << opt.radial
      << "\", \"device\": \"" << prop.name << "\", \"sm_count\": " << prop.multiProcessorCount
      << ", \"row_order\": \"" << order << "\", \"cutoff\": " << plan.cutoff
      << ", \"skin\": " << opt.skin << ", \"atoms\": " << n << ", \"edges_in_list\": " << list_edges
      << ", \"edges\": " << edges << ", \"warmup\": " << opt.warmup
      << ", \"repeats\": " << opt.repeats << ",\n \"layers\": [\n  " << layers.str() << "]}\n";
  e3fuse_micro::emit_json(out.str(), opt.json_out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return e3fuse_micro::run_main<Options>("e3fuse_conv_micro", argc, argv, parse, run<float>,
                                         run<double>);
}
