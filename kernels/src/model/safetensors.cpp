// model/safetensors.cpp: parsing, validation and dtype conversion for
// model/safetensors.h.
#include "model/safetensors.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <system_error>
#include <utility>

#include "e3fuse/error.h"
#include "model/json.h"

namespace e3fuse {

namespace {

struct DTypeInfo {
  const char* name;
  size_t size;
};

// Indexed by SafetensorsFile::DType.
constexpr DTypeInfo kDTypes[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},  {"I16", 2},
    {"I8", 1},  {"U64", 8}, {"U32", 4}, {"U16", 2},  {"U8", 1},  {"BOOL", 1},
};

template <typename U>
U load_le(const unsigned char* p) {
  U v = 0;
  for (size_t i = 0; i < sizeof(U); ++i) v = static_cast<U>(v | (static_cast<U>(p[i]) << (8 * i)));
  return v;
}

template <typename T, typename U>
T bit_cast_to(U u) {
  static_assert(sizeof(T) == sizeof(U), "size mismatch");
  T t;
  std::memcpy(&t, &u, sizeof(T));
  return t;
}

double half_to_double(uint16_t h) {
  double sign = (h & 0x8000) ? -1.0 : 1.0;
  int exponent = (h >> 10) & 0x1F;
  int mantissa = h & 0x3FF;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  if (exponent == 31) {
    return mantissa ? std::numeric_limits<double>::quiet_NaN()
                    : sign * std::numeric_limits<double>::infinity();
  }
  return sign * std::ldexp(mantissa + 1024, exponent - 25);
}

// What a file that is not safetensors is, told from its first bytes, for the error message:
// "" when nothing is recognized.
std::string other_file_kind(const std::string& b) {
  if (b.compare(0, 2, "PK") == 0) {
    return "a zip archive, e.g. a PyTorch model or checkpoint (torch.save) or TorchScript";
  }
  if (static_cast<unsigned char>(b[0]) == 0x80) {
    return "a Python pickle, e.g. a PyTorch file in torch.save's legacy format";
  }
  if (b[0] == '{' || b[0] == '[') return "a JSON file";
  return "";
}

}  // namespace

// ---------------------------------------------------------------------------
// Loading

SafetensorsFile SafetensorsFile::read(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    int err = errno;
    throw Error("cannot open model file '" + path + "': " + std::generic_category().message(err));
  }
  std::string bytes;
  char buffer[1 << 16];
  while (true) {
    size_t n = std::fread(buffer, 1, sizeof buffer, f);
    bytes.append(buffer, n);
    if (n < sizeof buffer) break;
  }
  bool failed = std::ferror(f) != 0;
  int err = errno;
  std::fclose(f);
  if (failed) {
    throw Error("cannot read model file '" + path + "': " + std::generic_category().message(err));
  }
  return parse(std::move(bytes), "model file '" + path + "'");
}

void SafetensorsFile::fail(const std::string& message) const {
  throw Error(origin_ + ": " + message);
}

SafetensorsFile SafetensorsFile::parse(std::string bytes, const std::string& origin) {
  SafetensorsFile file;
  file.origin_ = origin;
  file.bytes_ = std::move(bytes);
  const std::string& b = file.bytes_;
  const size_t size = b.size();

  if (size < 8) {
    file.fail("too short for a safetensors file (" + std::to_string(size) +
              " bytes, need at least 8)");
  }
  uint64_t header_len = load_le<uint64_t>(reinterpret_cast<const unsigned char*>(b.data()));
  // an implausible header length and known first bytes: another kind of file, not a cut one
  const std::string other = header_len > kMaxHeaderSize ? other_file_kind(b) : "";
  if (header_len > size - 8 && !other.empty()) {
    file.fail("not an e3fuse model file but " + other +
              "; convert the source model with `e3fuse convert` (e3fuse.Calculator converts it "
              "on first use)");
  }
  if (header_len > size - 8) {
    file.fail("safetensors header length " + std::to_string(header_len) +
              " exceeds the file size (" + std::to_string(size) + " bytes); truncated or not a " +
              "safetensors file?");
  }
  if (header_len > kMaxHeaderSize) {
    file.fail("safetensors header length " + std::to_string(header_len) + " exceeds the limit of " +
              std::to_string(kMaxHeaderSize) + " bytes");
  }
  const size_t data_start = 8 + static_cast<size_t>(header_len);
  const size_t data_size = size - data_start;

  json::Value header =
      json::parse(b.substr(8, static_cast<size_t>(header_len)), origin + " safetensors header");
  if (!header.is_object()) {
    file.fail(std::string("safetensors header must be a JSON object, got ") +
              json::Value::type_name(header.type()));
  }

  for (const auto& member : header.object()) {
    const std::string& name = member.first;
    const json::Value& entry = member.second;
    if (name == "__metadata__") {
      if (!entry.is_object()) {
        file.fail(std::string("safetensors __metadata__ must be an object, got ") +
                  json::Value::type_name(entry.type()));
      }
      for (const auto& kv : entry.object()) {
        if (!kv.second.is_string()) {
          file.fail("safetensors __metadata__ value '" + kv.first + "' must be a string, got " +
                    json::Value::type_name(kv.second.type()));
        }
        file.metadata_[kv.first] = kv.second.as_string();
      }
      continue;
    }

    const std::string where = "tensor '" + name + "': ";
    if (!entry.is_object()) {
      file.fail(where + "header entry must be an object, got " +
                json::Value::type_name(entry.type()));
    }
    for (const char* key : {"dtype", "shape", "data_offsets"}) {
      if (!entry.contains(key)) file.fail(where + "header entry lacks \"" + key + "\"");
    }

    Tensor t;
    const json::Value& dtype = entry["dtype"];
    if (!dtype.is_string()) {
      file.fail(where + "dtype must be a string, got " + json::Value::type_name(dtype.type()));
    }
    bool known = false;
    for (size_t i = 0; i < sizeof kDTypes / sizeof kDTypes[0]; ++i) {
      if (dtype.as_string() == kDTypes[i].name) {
        t.dtype = static_cast<DType>(i);
        known = true;
        break;
      }
    }
    if (!known) file.fail(where + "unknown or unsupported dtype '" + dtype.as_string() + "'");
    const size_t item_size = kDTypes[static_cast<size_t>(t.dtype)].size;

    const json::Value& shape = entry["shape"];
    if (!shape.is_array()) {
      file.fail(where + "shape must be an array, got " + json::Value::type_name(shape.type()));
    }
    bool zero = false, overflow = false;
    size_t numel = 1;
    for (const json::Value& d : shape.array()) {
      if (!d.is_int() || d.as_int() < 0) {
        file.fail(where + "shape entries must be non-negative integers");
      }
      uint64_t dim = static_cast<uint64_t>(d.as_int());
      t.shape.push_back(d.as_int());
      if (dim == 0) zero = true;
      if (overflow || zero) continue;
      if (dim > std::numeric_limits<size_t>::max() / numel) {
        overflow = true;
      } else {
        numel *= static_cast<size_t>(dim);
      }
    }
    if (zero) numel = 0;
    if (!zero && (overflow || numel > std::numeric_limits<size_t>::max() / item_size)) {
      file.fail(where + "shape is too large");
    }
    t.numel = numel;

    const json::Value& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_int() ||
        !offsets[1].is_int()) {
      file.fail(where + "data_offsets must be an array of two integers");
    }
    int64_t begin = offsets[0].as_int(), end = offsets[1].as_int();
    if (begin < 0 || end < begin) {
      file.fail(where + "invalid data_offsets [" + std::to_string(begin) + ", " +
                std::to_string(end) + "]");
    }
    if (static_cast<uint64_t>(end) > data_size) {
      file.fail(where + "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                "] exceed the data section (" + std::to_string(data_size) +
                " bytes); truncated file?");
    }
    const size_t nbytes = static_cast<size_t>(end - begin);
    if (nbytes != numel * item_size) {
      std::string shape_text;
      for (size_t i = 0; i < t.shape.size(); ++i) {
        shape_text += (i ? ", " : "") + std::to_string(t.shape[i]);
      }
      file.fail(where + "data_offsets span " + std::to_string(nbytes) + " bytes but shape [" +
                shape_text + "] of " + kDTypes[static_cast<size_t>(t.dtype)].name + " needs " +
                std::to_string(numel * item_size));
    }
    t.begin = data_start + static_cast<size_t>(begin);
    t.end = data_start + static_cast<size_t>(end);
    file.tensors_.emplace(name, std::move(t));
  }
  return file;
}

// ---------------------------------------------------------------------------
// Queries

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& kv : tensors_) out.push_back(kv.first);
  return out;
}

const SafetensorsFile::Tensor& SafetensorsFile::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it != tensors_.end()) return it->second;
  std::string message = "no tensor named '" + name + "'";
  if (tensors_.empty()) {
    message += " (the file has no tensors)";
  } else {
    message += " (the file has " + std::to_string(tensors_.size()) + " tensors: ";
    size_t shown = 0;
    for (const auto& kv : tensors_) {
      if (shown == 5) {
        message += ", ...";
        break;
      }
      message += (shown ? ", '" : "'") + kv.first + "'";
      ++shown;
    }
    message += ")";
  }
  fail(message);
}

std::vector<int64_t> SafetensorsFile::shape(const std::string& name) const {
  return tensor(name).shape;
}

int64_t SafetensorsFile::numel(const std::string& name) const {
  return static_cast<int64_t>(tensor(name).numel);
}

std::string SafetensorsFile::dtype(const std::string& name) const {
  return kDTypes[static_cast<size_t>(tensor(name).dtype)].name;
}

std::vector<double> SafetensorsFile::to_double(const std::string& name) const {
  const Tensor& t = tensor(name);
  const unsigned char* p = reinterpret_cast<const unsigned char*>(bytes_.data()) + t.begin;
  std::vector<double> out(t.numel);
  const size_t n = t.numel;
  switch (t.dtype) {
    case DType::f64:
      for (size_t i = 0; i < n; ++i) out[i] = bit_cast_to<double>(load_le<uint64_t>(p + 8 * i));
      break;
    case DType::f32:
      for (size_t i = 0; i < n; ++i) out[i] = bit_cast_to<float>(load_le<uint32_t>(p + 4 * i));
      break;
    case DType::f16:
      for (size_t i = 0; i < n; ++i) out[i] = half_to_double(load_le<uint16_t>(p + 2 * i));
      break;
    case DType::bf16:
      for (size_t i = 0; i < n; ++i) {
        uint32_t bits = static_cast<uint32_t>(load_le<uint16_t>(p + 2 * i)) << 16;
        out[i] = bit_cast_to<float>(bits);
      }
      break;
    case DType::i64:
      for (size_t i = 0; i < n; ++i) {
        out[i] = static_cast<double>(bit_cast_to<int64_t>(load_le<uint64_t>(p + 8 * i)));
      }
      break;
    case DType::i32:
      for (size_t i = 0; i < n; ++i) out[i] = bit_cast_to<int32_t>(load_le<uint32_t>(p + 4 * i));
      break;
    case DType::i16:
      for (size_t i = 0; i < n; ++i) out[i] = bit_cast_to<int16_t>(load_le<uint16_t>(p + 2 * i));
      break;
    case DType::i8:
      for (size_t i = 0; i < n; ++i) out[i] = bit_cast_to<int8_t>(p[i]);
      break;
    case DType::u64:
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<double>(load_le<uint64_t>(p + 8 * i));
      break;
    case DType::u32:
      for (size_t i = 0; i < n; ++i) out[i] = load_le<uint32_t>(p + 4 * i);
      break;
    case DType::u16:
      for (size_t i = 0; i < n; ++i) out[i] = load_le<uint16_t>(p + 2 * i);
      break;
    case DType::u8:
      for (size_t i = 0; i < n; ++i) out[i] = p[i];
      break;
    case DType::boolean:
      for (size_t i = 0; i < n; ++i) out[i] = p[i] ? 1.0 : 0.0;
      break;
  }
  return out;
}

std::vector<int64_t> SafetensorsFile::to_int(const std::string& name) const {
  const Tensor& t = tensor(name);
  const unsigned char* p = reinterpret_cast<const unsigned char*>(bytes_.data()) + t.begin;
  std::vector<int64_t> out(t.numel);
  const size_t n = t.numel;
  switch (t.dtype) {
    case DType::i64:
      for (size_t i = 0; i < n; ++i) out[i] = bit_cast_to<int64_t>(load_le<uint64_t>(p + 8 * i));
      break;
    case DType::i32:
      for (size_t i = 0; i < n; ++i) out[i] = bit_cast_to<int32_t>(load_le<uint32_t>(p + 4 * i));
      break;
    case DType::i16:
      for (size_t i = 0; i < n; ++i) out[i] = bit_cast_to<int16_t>(load_le<uint16_t>(p + 2 * i));
      break;
    case DType::i8:
      for (size_t i = 0; i < n; ++i) out[i] = bit_cast_to<int8_t>(p[i]);
      break;
    case DType::u64:
      for (size_t i = 0; i < n; ++i) {
        uint64_t v = load_le<uint64_t>(p + 8 * i);
        if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          fail("tensor '" + name + "': U64 value " + std::to_string(v) +
               " does not fit in a signed 64-bit integer");
        }
        out[i] = static_cast<int64_t>(v);
      }
      break;
    case DType::u32:
      for (size_t i = 0; i < n; ++i) out[i] = load_le<uint32_t>(p + 4 * i);
      break;
    case DType::u16:
      for (size_t i = 0; i < n; ++i) out[i] = load_le<uint16_t>(p + 2 * i);
      break;
    case DType::u8:
      for (size_t i = 0; i < n; ++i) out[i] = p[i];
      break;
    case DType::boolean:
      for (size_t i = 0; i < n; ++i) out[i] = p[i] ? 1 : 0;
      break;
    case DType::f64:
    case DType::f32:
    case DType::f16:
    case DType::bf16:
      fail("tensor '" + name + "' has dtype " + kDTypes[static_cast<size_t>(t.dtype)].name +
           "; an integer dtype is required");
  }
  return out;
}

}  // namespace e3fuse
