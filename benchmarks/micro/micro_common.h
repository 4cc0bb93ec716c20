// benchmarks/micro/micro_common.h: what the microbenchmark executables share (conv_micro.cu,
// linear_micro.cu, radial_micro.cu): the "--key value" command line and its common options,
// CUDA-event timing per launch, random node rows, the JSON list of times and the result's
// output.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/common.cuh"
#include "e3fuse/error.h"

namespace e3fuse_micro {

// Calls take(key, value) for each "--key value" pair; take returns false for a key it does
// not know.
inline void parse_pairs(int argc, char** argv,
                        const std::function<bool(const std::string&, const std::string&)>& take) {
  for (int a = 1; a < argc; ++a) {
    const std::string key = argv[a];
    if (a + 1 >= argc) throw e3fuse::Error("option " + key + " needs a value");
    if (!take(key, argv[++a])) throw e3fuse::Error("unknown option " + key);
  }
}

// The options both tools take: --model, --json-out, --dtype, --warmup, --repeats.
struct CommonOptions {
  std::string model, json_out, dtype = "float32";
  int warmup = 3, repeats = 20;
  // false: not one of these keys
  bool take(const std::string& key, const std::string& value) {
    if (key == "--model") {
      model = value;
    } else if (key == "--json-out") {
      json_out = value;
    } else if (key == "--dtype") {
      dtype = value;
    } else if (key == "--warmup") {
      warmup = std::stoi(value);
    } else if (key == "--repeats") {
      repeats = std::stoi(value);
    } else {
      return false;
    }
    return true;
  }
  void validate() const {
    if (model.empty()) throw e3fuse::Error("--model is required");
    if (dtype != "float32" && dtype != "float64")
      throw e3fuse::Error("--dtype must be float32 or float64");
    if (repeats < 1 || warmup < 0) throw e3fuse::Error("--repeats >= 1 and --warmup >= 0");
  }
};

// Milliseconds between event pairs, one pair per launch.
class LaunchTimer {
 public:
  explicit LaunchTimer(int count) : start_(count), stop_(count) {
    for (int i = 0; i < count; ++i) {
      e3fuse::cuda::check(cudaEventCreate(&start_[i]), "cudaEventCreate");
      e3fuse::cuda::check(cudaEventCreate(&stop_[i]), "cudaEventCreate");
    }
  }
  ~LaunchTimer() {
    for (size_t i = 0; i < start_.size(); ++i) {
      cudaEventDestroy(start_[i]);
      cudaEventDestroy(stop_[i]);
    }
  }
  LaunchTimer(const LaunchTimer&) = delete;
  LaunchTimer& operator=(const LaunchTimer&) = delete;
  void start(int i, cudaStream_t s) {
    e3fuse::cuda::check(cudaEventRecord(start_[i], s), "cudaEventRecord");
  }
  void stop(int i, cudaStream_t s) {
    e3fuse::cuda::check(cudaEventRecord(stop_[i], s), "cudaEventRecord");
  }
  // the launches from `first` on (after the warm-up), once the stream has finished them
  std::vector<double> ms(int first) const {
    std::vector<double> out;
    for (size_t i = static_cast<size_t>(first); i < start_.size(); ++i) {
      float t = 0.0f;
      e3fuse::cuda::check(cudaEventElapsedTime(&t, start_[i], stop_[i]), "cudaEventElapsedTime");
      out.push_back(t);
    }
    return out;
  }

 private:
  std::vector<cudaEvent_t> start_, stop_;
};

inline std::string json_list(const std::vector<double>& v) {
  std::ostringstream o;
  o.precision(6);
  o << "[";
  for (size_t i = 0; i < v.size(); ++i) o << (i ? ", " : "") << v[i];
  o << "]";
  return o.str();
}

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// rows x width values uniform in [-1, 1), element i from splitmix64 of (seed, i): fast enough
// for 10^8 elements.
template <class T>
std::vector<T> random_rows(int64_t rows, int64_t width, unsigned seed) {
  std::vector<T> v(static_cast<size_t>(rows * width));
  const uint64_t base = splitmix64(seed);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<T>(static_cast<double>(splitmix64(base + i) >> 11) * 0x1p-52 - 1.0);
  return v;
}

// The result: to stdout, and to `path` unless it is empty.
inline void emit_json(const std::string& text, const std::string& path) {
  std::fputs(text.c_str(), stdout);
  if (path.empty()) return;
  std::ofstream f(path);
  f << text;
  if (!f) throw e3fuse::Error("cannot write " + path);
}

// The current device's properties and a non-blocking stream for the timed launches.
struct DeviceStream {
  cudaDeviceProp prop{};
  cudaStream_t stream = nullptr;
  DeviceStream() {
    int device = 0;
    e3fuse::cuda::check(cudaGetDevice(&device), "cudaGetDevice");
    e3fuse::cuda::check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    e3fuse::cuda::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  }
  ~DeviceStream() { cudaStreamDestroy(stream); }
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;
};

// main's body: the options, then the float32 or float64 run; an error is printed under the
// tool's name, with exit code 1.
template <class Options>
int run_main(const char* tool, int argc, char** argv, Options (*parse)(int, char**),
             int (*run_float32)(const Options&), int (*run_float64)(const Options&)) {
  try {
    const Options opt = parse(argc, argv);
    return opt.dtype == "float32" ? run_float32(opt) : run_float64(opt);
  } catch (const std::exception& err) {
    std::fprintf(stderr, "%s: %s\n", tool, err.what());
    return 1;
  }
}

}  // namespace e3fuse_micro
