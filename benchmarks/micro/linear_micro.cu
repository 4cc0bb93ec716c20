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

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
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
#include "model/plan.h"

namespace {

using e3fuse::Error;
using e3fuse::cuda::check;
using e3fuse::cuda::DeviceArray;

struct Options {
  std::string model, json_out, dtype = "float32";
  int64_t atoms = 0;
  int warmup = 3, repeats = 20;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int a = 1; a < argc; ++a) {
    const std::string key = argv[a];
    if (a + 1 >= argc) throw Error("option " + key + " needs a value");
    const std::string value = argv[++a];
    if (key == "--model") {
      o.model = value;
    } else if (key == "--atoms") {
      o.atoms = std::stoll(value);
    } else if (key == "--json-out") {
      o.json_out = value;
    } else if (key == "--dtype") {
      o.dtype = value;
    } else if (key == "--warmup") {
      o.warmup = std::stoi(value);
    } else if (key == "--repeats") {
      o.repeats = std::stoi(value);
    } else {
      throw Error("unknown option " + key);
    }
  }
  if (o.model.empty() || o.atoms <= 0) throw Error("--model and --atoms (> 0) are required");
  if (o.dtype != "float32" && o.dtype != "float64")
    throw Error("--dtype must be float32 or float64");
  if (o.repeats < 1 || o.warmup < 0) throw Error("--repeats >= 1 and --warmup >= 0");
  return o;
}

// Uniform in [-1, 1), element i from splitmix64(seed, i): fast enough for 10^8 elements.
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <class T>
std::vector<T> random_rows(int64_t rows, int64_t width, unsigned seed) {
  std::vector<T> v(static_cast<size_t>(rows * width));
  const uint64_t base = splitmix64(seed);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<T>(static_cast<double>(splitmix64(base + i) >> 11) * 0x1p-52 - 1.0);
  return v;
}

// FNV-1a over the elements' bit patterns (one step per element); throws on a non-finite one.
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

double median_ms(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
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
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
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
      add_linear(p + "linear", b.linear);
      if (b.nonlinear_block) {
        add_linear(p + "linear_res", b.linear_res);
        add_linear(p + "linear_2", b.linear_2);
      }
      add_linear(p + "product_linear", b.product_linear);
      add_linear(p + "readout_1", b.readout_1);
      if (b.nonlinear) add_linear(p + "readout_2", b.readout_2);
    }
  } else {
    // the convolution's side of linear_1 / linear_2 in its ir_mul layout, as the engine wires it
    cpu::TypedPlan<T> typed = cpu::make_typed_plan<T>(plan, false);
    for (auto& layer : typed.layers)
      cpu::wire_conv_layout(layer.linear_1, layer.conv, layer.linear_2);
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
  std::vector<cudaEvent_t> events(2 * static_cast<size_t>(launches));
  for (auto& ev : events) check(cudaEventCreate(&ev), "cudaEventCreate");
  auto time = [&](const std::function<void()>& launch) {
    for (int r = 0; r < launches; ++r) {
      check(cudaEventRecord(events[2 * r], stream), "cudaEventRecord");
      launch();
      check(cudaEventRecord(events[2 * r + 1], stream), "cudaEventRecord");
    }
    check(cudaStreamSynchronize(stream), "the timed launches");
    std::vector<float> ms;
    for (int r = opt.warmup; r < launches; ++r) {
      float t = 0.0f;
      check(cudaEventElapsedTime(&t, events[2 * r], events[2 * r + 1]), "cudaEventElapsedTime");
      ms.push_back(t);
    }
    return ms;
  };
  auto list = [](const std::vector<float>& v) {
    std::ostringstream o;
    o.precision(6);
    o << "[";
    for (size_t i = 0; i < v.size(); ++i) o << (i ? ", " : "") << v[i];
    o << "]";
    return o.str();
  };
  double total_fwd = 0.0, total_bwd = 0.0;
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
    total_fwd += median_ms(fwd);
    total_bwd += median_ms(bwd);
    rows << (i ? ",\n  " : "") << "{\"linear\": \"" << e.layer_name
         << "\", \"dim_in\": " << e.dim_in << ", \"dim_out\": " << e.dim_out
         << ", \"macs_per_node\": " << e.macs_per_node << ", \"species_sets\": " << e.species_sets
         << ", \"forward_ms\": " << list(fwd) << ", \"transpose_ms\": " << list(bwd)
         << ", \"forward_hash\": \"" << output_hash(y, e.layer_name + " forward")
         << "\", \"transpose_hash\": \"" << output_hash(gx, e.layer_name + " transpose") << "\"}";
  }
  for (auto& ev : events) cudaEventDestroy(ev);

  std::ostringstream out;
  out.precision(10);
  out << "{\"tool\": \"e3fuse_linear_micro\", \"model\": \"" << opt.model << "\", \"family\": \""
      << plan.family << "\", \"dtype\": \"" << opt.dtype << "\", \"device\": \"" << prop.name
      << "\", \"sm_count\": " << prop.multiProcessorCount << ", \"atoms\": " << n
      << ", \"warmup\": " << opt.warmup << ", \"repeats\": " << opt.repeats
      << ", \"forward_ms_sum_of_medians\": " << total_fwd
      << ", \"transpose_ms_sum_of_medians\": " << total_bwd << ",\n \"linears\": [\n  "
      << rows.str() << "]}\n";
  std::fputs(out.str().c_str(), stdout);
  if (!opt.json_out.empty()) {
    std::ofstream f(opt.json_out);
    f << out.str();
    if (!f) throw Error("cannot write " + opt.json_out);
  }
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opt = parse(argc, argv);
    return opt.dtype == "float32" ? run<float>(opt) : run<double>(opt);
  } catch (const std::exception& err) {
    std::fprintf(stderr, "e3fuse_linear_micro: %s\n", err.what());
    return 1;
  }
}
