// benchmarks/micro/linear_micro.cu: every linear layer of a model alone, forward and
// transpose, timed with CUDA events and launched as the CUDA engine launches it
// (cuda/engine_cuda.cu): the same device tables from the same host structs (SevenNet's typed
// plan, MACE's blocks with the convolution's ir_mul side wired in), the same entry points
// on one stream, random node rows in [-1, 1].
//
//   e3fuse_linear_micro --model M.e3f --atoms N [--dtype float32|float64] [--warmup 3]
//                       [--repeats 20] [--json-out R.json]
//
// Prints one JSON object: the device and, per linear, its layer, name, dims, multiply-adds
// per node, the forward / transpose milliseconds of every repeat, and a hash of each output's
// bytes (two builds whose sums run in the same order print the same hashes).
// Built only with -DE3FUSE_MICROBENCH=ON (benchmarks/micro/README.md).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/mace.h"
#include "cpu/typed_plan.h"
#include "cuda/common.cuh"
#include "cuda/node_ops.cuh"
#include "e3fuse/error.h"
#include "e3fuse/model.h"
#include "micro_common.h"
#include "model/plan.h"

namespace {

using e3fuse::Error;
using e3fuse::cuda::check;
using e3fuse::cuda::DeviceArray;
using e3fuse_micro::json_list;
using e3fuse_micro::LaunchTimer;
using e3fuse_micro::random_rows;

struct Options : e3fuse_micro::CommonOptions {
  int64_t atoms = 0;
};

Options parse(int argc, char** argv) {
  Options o;
  e3fuse_micro::parse_pairs(argc, argv, [&](const std::string& key, const std::string& value) {
    if (key != "--atoms") return o.take(key, value);
    o.atoms = std::stoll(value);
    return true;
  });
  o.validate();
  if (o.atoms <= 0) throw Error("--atoms (> 0) is required");
  return o;
}

template <class T>
std::string output_hash(const DeviceArray<T>& a, const std::string& what) {
  std::vector<T> h(a.size());
  a.download(h.data(), h.size());
  check(cudaDeviceSynchronize(), "download");
  uint64_t hash = 1469598103934665603ull;
  for (T x : h) {
    if (!std::isfinite(static_cast<double>(x))) throw Error(what + ": not finite");
    uint64_t bits = 0;
    std::memcpy(&bits, &x, sizeof(T));
    hash = (hash ^ bits) * 1099511628211ull;
  }
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

// One linear of the model: its launches (forward writes out, transpose writes grad_in).
struct Entry {
  std::string layer_name;
  int64_t dim_in = 0, dim_out = 0, macs_per_node = 0;
  int species_sets = 1;
  std::function<void(const void* x, void* out, cudaStream_t)> forward;
  std::function<void(const void* g, void* grad_in, cudaStream_t)> transpose;
};

template <class T>
int64_t macs(const e3fuse::cpu::Linear<T>& l) {
  int64_t sum = 0;
  for (const auto& p : l.paths) sum += static_cast<int64_t>(p.mul_in) * p.mul_out * p.d;
  return sum;
}

template <class T>
int run(const Options& opt) {
  namespace cu = e3fuse::cuda;
  namespace cpu = e3fuse::cpu;
  const auto model = e3fuse::Model::load(opt.model);
  const e3fuse::ModelPlan& plan = model->plan();
  const int64_t n = opt.atoms;
  const e3fuse_micro::DeviceStream ds;
  const cudaDeviceProp& prop = ds.prop;
  cudaStream_t stream = ds.stream;
  DeviceArray<int32_t> species;
  species.upload(std::vector<int32_t>(static_cast<size_t>(n), 0));

  // The device structs live as long as the entries that launch them.
  std::vector<std::unique_ptr<cu::Linear<T>>> linears;
  std::vector<std::unique_ptr<cu::ElementLinear<T>>> element_linears;
  std::vector<Entry> entries;
  auto add_linear = [&](const std::string& name, const cpu::Linear<T>& host) {
    if (host.paths.empty()) return;
    linears.push_back(std::make_unique<cu::Linear<T>>(cu::make_linear<T>(host)));
    const cu::Linear<T>* lin = linears.back().get();
    Entry e;
    e.layer_name = name;
    e.dim_in = host.dim_in;
    e.dim_out = host.dim_out;
    e.macs_per_node = macs(host);
    e.forward = [lin, n](const void* x, void* out, cudaStream_t s) {
      cu::linear_forward(*lin, n, static_cast<const T*>(x), static_cast<T*>(out), s);
    };
    e.transpose = [lin, n](const void* g, void* grad_in, cudaStream_t s) {
      cu::linear_backward(*lin, n, static_cast<const T*>(g), static_cast<T*>(grad_in), false, s);
    };
    entries.push_back(std::move(e));
  };
  auto add_element_linear = [&](const std::string& name, const cpu::ElementLinear<T>& host) {
    if (host.per_species.empty() || host.per_species.front().paths.empty()) return;
    element_linears.push_back(
        std::make_unique<cu::ElementLinear<T>>(cu::make_element_linear<T>(host)));
    const cu::ElementLinear<T>* lin = element_linears.back().get();
    const int32_t* sp = species.data();
    Entry e;
    e.layer_name = name;
    e.dim_in = lin->dim_in;
    e.dim_out = lin->dim_out;
    e.macs_per_node = macs(host.per_species.front());
    e.species_sets = lin->num_species;
    e.forward = [lin, n, sp](const void* x, void* out, cudaStream_t s) {
      cu::element_linear_forward(*lin, n, sp, static_cast<const T*>(x), static_cast<T*>(out), s);
    };
    e.transpose = [lin, n, sp](const void* g, void* grad_in, cudaStream_t s) {
      cu::element_linear_backward(*lin, n, sp, static_cast<const T*>(g), static_cast<T*>(grad_in),
                                  false, s);
    };
    entries.push_back(std::move(e));
  };
  if (plan.family == "mace") {
    for (size_t t = 0; t < plan.mace_layers.size(); ++t) {
      const cpu::MaceBlock<T> b = cpu::make_mace_block<T>(plan.mace_layers[t]);
      const std::string p = std::to_string(t) + ".";
      add_element_linear(p + "skip", b.skip);
      add_linear(p + "linear_up", b.linear_up);
      if (!b.skip_reads_conv) add_linear(p + "linear", b.linear);  // else composed into skip
      if (b.nonlinear_block) {
        add_linear(p + "linear_res", b.linear_res);
        add_linear(p + "linear_2", b.linear_2);
      }
      add_linear(p + "product_linear", b.product_linear);
      add_linear(p + "readout_1", b.readout_1);
      if (b.nonlinear) add_linear(p + "readout_2", b.readout_2);
    }
  } else {
    // linear_1 / linear_2 with the convolution's side in its ir_mul layout (make_typed_plan)
    const cpu::TypedPlan<T> typed = cpu::make_typed_plan<T>(plan, false);
    for (size_t t = 0; t < typed.layers.size(); ++t) {
      const std::string p = std::to_string(t) + ".";
      add_linear(p + "self_connection", typed.layers[t].self_connection);
      add_linear(p + "linear_1", typed.layers[t].linear_1);
      add_linear(p + "linear_2", typed.layers[t].linear_2);
    }
    for (size_t r = 0; r < typed.readout.size(); ++r)
      add_linear("readout." + std::to_string(r), typed.readout[r]);
  }

  std::ostringstream rows;
  const int launches = opt.warmup + opt.repeats;
  auto time = [&](const std::function<void()>& launch) {
    LaunchTimer timer(launches);
    for (int r = 0; r < launches; ++r) {
      timer.start(r, stream);
      launch();
      timer.stop(r, stream);
    }
    check(cudaStreamSynchronize(stream), "the timed launches");
    return timer.ms(opt.warmup);
  };
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    DeviceArray<T> x, y, g, gx;
    x.upload(random_rows<T>(n, e.dim_in, 11 + static_cast<unsigned>(i)));
    g.upload(random_rows<T>(n, e.dim_out, 23 + static_cast<unsigned>(i)));
    y.resize(static_cast<size_t>(n * e.dim_out));
    gx.resize(static_cast<size_t>(n * e.dim_in));
    check(cudaDeviceSynchronize(), "inputs");
    const auto fwd = time([&] { e.forward(x.data(), y.data(), stream); });
    const auto bwd = time([&] { e.transpose(g.data(), gx.data(), stream); });
    rows << (i ? ",\n  " : "") << "{\"linear\": \"" << e.layer_name
         << "\", \"dim_in\": " << e.dim_in << ", \"dim_out\": " << e.dim_out
         << ", \"macs_per_node\": " << e.macs_per_node << ", \"species_sets\": " << e.species_sets
         << ", \"forward_ms\": " << json_list(fwd) << ", \"transpose_ms\": " << json_list(bwd)
         << ", \"forward_hash\": \"" << output_hash(y, e.layer_name + " forward")
         << "\", \"transpose_hash\": \"" << output_hash(gx, e.layer_name + " transpose") << "\"}";
  }

  std::ostringstream out;
  out.precision(10);
  out << "{\"tool\": \"e3fuse_linear_micro\", \"model\": \"" << opt.model << "\", \"family\": \""
      << plan.family << "\", \"dtype\": \"" << opt.dtype << "\", \"device\": \"" << prop.name
      << "\", \"sm_count\": " << prop.multiProcessorCount << ", \"atoms\": " << n
      << ", \"warmup\": " << opt.warmup << ", \"repeats\": " << opt.repeats
      << ",\n \"linears\": [\n  " << rows.str() << "]}\n";
  e3fuse_micro::emit_json(out.str(), opt.json_out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return e3fuse_micro::run_main<Options>("e3fuse_linear_micro", argc, argv, parse, run<float>,
                                         run<double>);
}
