// model/json.h: a small strict JSON (RFC 8259) parser for model metadata and
// safetensors headers. Values are immutable after parsing and remember their JSON
// path, so every type or lookup error names the exact offending entry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace e3fuse {
namespace json {

class Value {
 public:
  enum class Type { null, boolean, number, string, array, object };

  Value() = default;  // a null value with an empty path

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::null; }
  bool is_bool() const { return type_ == Type::boolean; }
  bool is_number() const { return type_ == Type::number; }
  bool is_string() const { return type_ == Type::string; }
  bool is_array() const { return type_ == Type::array; }
  bool is_object() const { return type_ == Type::object; }
  // A number with an integral value representable as int64_t.
  bool is_int() const;

  // Accessors throw e3fuse::Error naming the path and the expected type.
  bool as_bool() const;
  double as_double() const;
  int64_t as_int() const;  // also throws if the number is not integral
  const std::string& as_string() const;

  size_t size() const;                      // number of elements (array) or members (object)
  const Value& operator[](size_t i) const;  // array element
  const Value& operator[](const std::string& key) const;  // object member
  bool contains(const std::string& key) const;            // false for non-objects
  const Value* find(const std::string& key) const;        // nullptr if absent

  const std::vector<Value>& array() const;
  // Members in document order (duplicate keys are rejected by the parser).
  const std::vector<std::pair<std::string, Value>>& object() const;

  std::vector<double> as_double_vector() const;  // array of numbers
  std::vector<int64_t> as_int_vector() const;    // array of integers

  // Optional members of an object: the default when the key is absent, otherwise
  // the member converted as by as_double() etc. (a wrong type still throws).
  double get_double(const std::string& key, double default_value) const;
  int64_t get_int(const std::string& key, int64_t default_value) const;
  bool get_bool(const std::string& key, bool default_value) const;
  std::string get_string(const std::string& key, const std::string& default_value) const;

  // JSON path of this value, e.g. "layers[2].conv"; empty for the document root.
  const std::string& path() const { return path_; }
  // The 'what' given to parse(), e.g. "model file foo.e3f metadata".
  const std::string& what() const;

  static const char* type_name(Type type);

 private:
  friend class Parser;
  struct Payload;  // string / array / object contents, shared between copies

  [[noreturn]] void type_error(const char* expected) const;
  [[noreturn]] void fail(const std::string& message) const;
  const Payload& payload() const { return *payload_; }

  Type type_ = Type::null;
  bool bool_ = false;
  bool int_exact_ = false;  // int_ holds the exact value of an integer token
  double number_ = 0.0;
  int64_t int_ = 0;
  std::shared_ptr<const Payload> payload_;
  std::shared_ptr<const std::string> what_;
  std::string path_;
};

// Parses a complete JSON document. 'what' describes the source for error messages;
// malformed input throws e3fuse::Error with the line and column (1-based, bytes).
// Nesting is limited to kMaxDepth arrays/objects.
constexpr int kMaxDepth = 256;
Value parse(const std::string& text, const std::string& what);

}  // namespace json
}  // namespace e3fuse
