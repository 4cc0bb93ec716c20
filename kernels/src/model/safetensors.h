// model/safetensors.h: reader for the safetensors format (the weights of an .e3f
// model file): an 8-byte little-endian header length, a JSON header describing
// each tensor, then the raw little-endian row-major data. The whole file is held
// in memory and validated on parse; tensors are converted on request.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace e3fuse {

class SafetensorsFile {
 public:
  // Largest JSON header accepted (the limit of the reference implementation).
  static constexpr uint64_t kMaxHeaderSize = 100000000;

  // Reads and validates a file. Throws e3fuse::Error, e.g. "cannot open model file
  // 'x': No such file or directory", or "model file 'x': <what is wrong>".
  static SafetensorsFile read(const std::string& path);
  // Validates an in-memory file; error messages start with 'origin'.
  static SafetensorsFile parse(std::string bytes, const std::string& origin);

  // The optional "__metadata__" string map of the header.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  std::vector<std::string> names() const;  // sorted
  std::vector<int64_t> shape(const std::string& name) const;
  int64_t numel(const std::string& name) const;  // product of the shape
  // "F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U64", "U32", "U16",
  // "U8" or "BOOL".
  std::string dtype(const std::string& name) const;
  // All elements in row-major order; every dtype converts (BOOL gives 0/1).
  std::vector<double> to_double(const std::string& name) const;
  // Integer and BOOL dtypes only; U64 values above INT64_MAX throw.
  std::vector<int64_t> to_int(const std::string& name) const;
  size_t file_size() const { return bytes_.size(); }
  const std::string& origin() const { return origin_; }

 private:
  enum class DType { f64, f32, f16, bf16, i64, i32, i16, i8, u64, u32, u16, u8, boolean };
  struct Tensor {
    DType dtype;
    std::vector<int64_t> shape;
    size_t numel = 0;
    size_t begin = 0;  // absolute byte offsets into bytes_
    size_t end = 0;
  };

  SafetensorsFile() = default;
  const Tensor& tensor(const std::string& name) const;
  [[noreturn]] void fail(const std::string& message) const;

  std::string origin_;
  std::string bytes_;
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace e3fuse
