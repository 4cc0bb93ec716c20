// model/json.cpp: the strict JSON parser behind model/json.h.
#include "model/json.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <clocale>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <system_error>

#include "e3fuse/error.h"

namespace e3fuse {
namespace json {

struct Value::Payload {
  std::string str;
  std::vector<Value> arr;
  std::vector<std::pair<std::string, Value>> obj;
  std::vector<uint32_t> index;  // obj positions sorted by key, for lookup
};

namespace {

const std::string& empty_string() {
  static const std::string empty;
  return empty;
}

bool is_plain_key(const std::string& key) {
  if (key.empty()) return false;
  for (char c : key) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// Quotes a string for a message, escaping what would be unreadable.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string member_path(const std::string& parent, const std::string& key) {
  if (is_plain_key(key)) return parent.empty() ? key : parent + "." + key;
  return parent + "[" + quoted(key) + "]";
}

std::string element_path(const std::string& parent, size_t i) {
  return parent + "[" + std::to_string(i) + "]";
}

std::string describe(const std::string& path) {
  return path.empty() ? std::string("top-level value") : "'" + path + "'";
}

std::string format_number(double d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", d);
  return buf;
}

constexpr double kTwo63 = 9223372036854775808.0;

bool integral_in_range(double d) {
  return std::isfinite(d) && d == std::floor(d) && d >= -kTwo63 && d < kTwo63;
}

}  // namespace

// ---------------------------------------------------------------------------
// Parser

class Parser {
 public:
  Parser(const std::string& text, std::shared_ptr<const std::string> what)
      : begin_(text.data()),
        p_(text.data()),
        end_(text.data() + text.size()),
        what_(std::move(what)) {}

  Value parse_document() {
    Value root;
    skip_ws();
    parse_value(root, std::string(), 0);
    skip_ws();
    if (p_ != end_) fail("unexpected " + describe_char() + " after the JSON value");
    return root;
  }

 private:
  [[noreturn]] void fail_at(const char* at, const std::string& message) const {
    int64_t line = 1, column = 1;
    for (const char* q = begin_; q < at; ++q) {
      if (*q == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    throw Error(*what_ + ": invalid JSON at line " + std::to_string(line) + ", column " +
                std::to_string(column) + ": " + message);
  }
  [[noreturn]] void fail(const std::string& message) const { fail_at(p_, message); }

  std::string describe_char() const {
    if (p_ >= end_) return "end of input";
    unsigned char c = static_cast<unsigned char>(*p_);
    char buf[32];
    if (c >= 0x20 && c < 0x7f) {
      std::snprintf(buf, sizeof buf, "character '%c'", c);
    } else {
      std::snprintf(buf, sizeof buf, "byte 0x%02x", c);
    }
    return buf;
  }

  void skip_ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }

  void expect_literal(const char* word) {
    size_t n = std::strlen(word);
    if (static_cast<size_t>(end_ - p_) < n || std::memcmp(p_, word, n) != 0) {
      fail("invalid literal (expected '" + std::string(word) + "')");
    }
    p_ += n;
  }

  void parse_value(Value& out, std::string path, int depth) {
    out.what_ = what_;
    out.path_ = std::move(path);
    if (p_ >= end_) fail("unexpected end of input, expected a value");
    switch (*p_) {
      case '{':
        parse_object(out, depth + 1);
        return;
      case '[':
        parse_array(out, depth + 1);
        return;
      case '"': {
        auto payload = std::make_shared<Value::Payload>();
        parse_string(payload->str);
        out.type_ = Value::Type::string;
        out.payload_ = std::move(payload);
        return;
      }
      case 't':
        expect_literal("true");
        out.type_ = Value::Type::boolean;
        out.bool_ = true;
        return;
      case 'f':
        expect_literal("false");
        out.type_ = Value::Type::boolean;
        out.bool_ = false;
        return;
      case 'n':
        expect_literal("null");
        out.type_ = Value::Type::null;
        return;
      default:
        if (*p_ == '-' || (*p_ >= '0' && *p_ <= '9')) {
          parse_number(out);
          return;
        }
        fail("unexpected " + describe_char() + ", expected a value");
    }
  }

  void check_depth(int depth) const {
    if (depth > kMaxDepth) {
      fail("nesting deeper than " + std::to_string(kMaxDepth) + " arrays/objects");
    }
  }

  void parse_array(Value& out, int depth) {
    check_depth(depth);
    ++p_;  // '['
    auto payload = std::make_shared<Value::Payload>();
    skip_ws();
    if (p_ < end_ && *p_ == ']') {
      ++p_;
    } else {
      while (true) {
        skip_ws();
        payload->arr.emplace_back();
        parse_value(payload->arr.back(), element_path(out.path_, payload->arr.size() - 1), depth);
        skip_ws();
        if (p_ < end_ && *p_ == ',') {
          ++p_;
          continue;
        }
        if (p_ < end_ && *p_ == ']') {
          ++p_;
          break;
        }
        fail("unexpected " + describe_char() + " in array, expected ',' or ']'");
      }
    }
    out.type_ = Value::Type::array;
    out.payload_ = std::move(payload);
  }

  void parse_object(Value& out, int depth) {
    check_depth(depth);
    ++p_;  // '{'
    auto payload = std::make_shared<Value::Payload>();
    std::vector<const char*> key_positions;
    skip_ws();
    if (p_ < end_ && *p_ == '}') {
      ++p_;
    } else {
      while (true) {
        skip_ws();
        if (p_ >= end_ || *p_ != '"') {
          fail("unexpected " + describe_char() + " in object, expected a string key");
        }
        key_positions.push_back(p_);
        std::string key;
        parse_string(key);
        skip_ws();
        if (p_ >= end_ || *p_ != ':') {
          fail("unexpected " + describe_char() + " after object key, expected ':'");
        }
        ++p_;
        skip_ws();
        std::string child_path = member_path(out.path_, key);
        payload->obj.emplace_back(std::move(key), Value());
        parse_value(payload->obj.back().second, std::move(child_path), depth);
        skip_ws();
        if (p_ < end_ && *p_ == ',') {
          ++p_;
          continue;
        }
        if (p_ < end_ && *p_ == '}') {
          ++p_;
          break;
        }
        fail("unexpected " + describe_char() + " in object, expected ',' or '}'");
      }
    }
    // Sorted index for lookup; adjacent equal keys are duplicates.
    const auto& obj = payload->obj;
    payload->index.resize(obj.size());
    for (size_t i = 0; i < obj.size(); ++i) payload->index[i] = static_cast<uint32_t>(i);
    std::stable_sort(payload->index.begin(), payload->index.end(),
                     [&obj](uint32_t a, uint32_t b) { return obj[a].first < obj[b].first; });
    for (size_t i = 1; i < payload->index.size(); ++i) {
      uint32_t a = payload->index[i - 1], b = payload->index[i];
      if (obj[a].first == obj[b].first) {
        fail_at(key_positions[std::max(a, b)], "duplicate key " + quoted(obj[b].first));
      }
    }
    out.type_ = Value::Type::object;
    out.payload_ = std::move(payload);
  }

  unsigned parse_hex4() {
    if (end_ - p_ < 4) fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = p_[i];
      unsigned d;
      if (c >= '0' && c <= '9') {
        d = static_cast<unsigned>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        d = static_cast<unsigned>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        d = static_cast<unsigned>(c - 'A' + 10);
      } else {
        fail_at(p_ + i, "invalid hex digit in \\u escape");
      }
      v = v * 16 + d;
    }
    p_ += 4;
    return v;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // Validates one raw UTF-8 sequence starting at p_ (lead byte >= 0x80), appends it.
  void copy_utf8_sequence(std::string& out) {
    const unsigned char* s = reinterpret_cast<const unsigned char*>(p_);
    size_t avail = static_cast<size_t>(end_ - p_);
    unsigned c = s[0];
    size_t n;
    unsigned cp, min;
    if (c >= 0xC2 && c <= 0xDF) {
      n = 2, cp = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 3, cp = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 4, cp = c & 0x07, min = 0x10000;
    } else {
      fail("invalid UTF-8 byte in string");
    }
    if (avail < n) fail("truncated UTF-8 sequence in string");
    for (size_t i = 1; i < n; ++i) {
      if ((s[i] & 0xC0) != 0x80) fail("invalid UTF-8 sequence in string");
      cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      fail("invalid UTF-8 sequence in string");
    }
    out.append(p_, n);
    p_ += n;
  }

  void parse_string(std::string& out) {
    const char* start = p_;
    ++p_;  // opening quote
    while (true) {
      // Copy a run of plain ASCII characters at once.
      const char* run = p_;
      while (p_ < end_) {
        unsigned char c = static_cast<unsigned char>(*p_);
        if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
        ++p_;
      }
      out.append(run, p_);
      if (p_ >= end_) fail_at(start, "unterminated string");
      unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        ++p_;
        return;
      }
      if (c < 0x20) fail("unescaped control character in string");
      if (c >= 0x80) {
        copy_utf8_sequence(out);
        continue;
      }
      // Backslash escape.
      const char* escape = p_;
      ++p_;
      if (p_ >= end_) fail_at(start, "unterminated string");
      char e = *p_++;
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = parse_hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail_at(escape, "unpaired low surrogate escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') {
              fail_at(escape, "high surrogate escape not followed by a low surrogate");
            }
            p_ += 2;
            unsigned lo = parse_hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) {
              fail_at(escape, "high surrogate escape not followed by a low surrogate");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default:
          fail_at(escape, "invalid escape sequence in string");
      }
    }
  }

  void parse_number(Value& out) {
    const char* start = p_;
    auto digit = [this] { return p_ < end_ && *p_ >= '0' && *p_ <= '9'; };
    if (*p_ == '-') ++p_;
    if (!digit()) fail("invalid number: expected a digit");
    if (*p_ == '0') {
      ++p_;
      if (digit()) fail_at(start, "invalid number: leading zero");
    } else {
      while (digit()) ++p_;
    }
    bool integer = true;
    if (p_ < end_ && *p_ == '.') {
      integer = false;
      ++p_;
      if (!digit()) fail("invalid number: expected a digit after '.'");
      while (digit()) ++p_;
    }
    if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
      integer = false;
      ++p_;
      if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (!digit()) fail("invalid number: expected a digit in the exponent");
      while (digit()) ++p_;
    }
    out.type_ = Value::Type::number;
    out.number_ = to_double(start, p_);
    if (integer) {
      int64_t i = 0;
      auto r = std::from_chars(start, p_, i);
      if (r.ec == std::errc() && r.ptr == p_) {
        out.int_ = i;
        out.int_exact_ = true;
      }
    }
  }

  // Correctly rounded conversion of a validated JSON number token, independent of
  // the C locale. Underflow gives a (signed) zero or subnormal as strtod does;
  // overflow is an error.
  double to_double(const char* start, const char* stop) {
#if defined(__cpp_lib_to_chars) && __cpp_lib_to_chars >= 201611L
    double d = 0.0;
    auto r = std::from_chars(start, stop, d);
    if (r.ec == std::errc() && r.ptr == stop) return d;
    if (r.ec == std::errc::result_out_of_range && r.ptr == stop) {
      if (overflows(start, stop)) fail_at(start, "number out of range for a double");
      return *start == '-' ? -0.0 : 0.0;
    }
    fail_at(start, "invalid number");
#else
    std::string token(start, stop);
    const char* point = std::localeconv()->decimal_point;
    if (point && point[0] != '.' && point[0] != '\0') {
      size_t dot = token.find('.');
      if (dot != std::string::npos) token.replace(dot, 1, point);
    }
    errno = 0;
    char* endp = nullptr;
    double d = std::strtod(token.c_str(), &endp);
    if (endp != token.c_str() + token.size()) fail_at(start, "invalid number");
    if (errno == ERANGE && std::isinf(d)) fail_at(start, "number out of range for a double");
    return d;
#endif
  }

  // For an out-of-range token: true if its magnitude is >= 1 (overflow), false if
  // it is below 1 (underflow).
  static bool overflows(const char* s, const char* stop) {
    if (*s == '-') ++s;
    int64_t int_digits = 0, first_nonzero = -1, pos = 0;  // pos counts mantissa digits
    bool in_fraction = false;
    for (; s < stop && *s != 'e' && *s != 'E'; ++s) {
      if (*s == '.') {
        in_fraction = true;
        continue;
      }
      if (!in_fraction) ++int_digits;
      if (first_nonzero < 0 && *s != '0') first_nonzero = pos;
      ++pos;
    }
    if (first_nonzero < 0) return false;
    int64_t exponent = 0;
    bool negative = false;
    if (s < stop) {
      ++s;
      if (*s == '+' || *s == '-') negative = *s++ == '-';
      for (; s < stop; ++s) {
        exponent = std::min<int64_t>(exponent * 10 + (*s - '0'), int64_t(1) << 40);
      }
    }
    if (negative) exponent = -exponent;
    // Decimal exponent of the leading significant digit.
    return int_digits - 1 - first_nonzero + exponent >= 0;
  }

  const char* begin_;
  const char* p_;
  const char* end_;
  std::shared_ptr<const std::string> what_;
};

Value parse(const std::string& text, const std::string& what) {
  Parser parser(text, std::make_shared<const std::string>(what));
  return parser.parse_document();
}

// ---------------------------------------------------------------------------
// Value

const char* Value::type_name(Type type) {
  switch (type) {
    case Type::null:
      return "null";
    case Type::boolean:
      return "a boolean";
    case Type::number:
      return "a number";
    case Type::string:
      return "a string";
    case Type::array:
      return "an array";
    case Type::object:
      return "an object";
  }
  return "?";
}

const std::string& Value::what() const { return what_ ? *what_ : empty_string(); }

void Value::fail(const std::string& message) const {
  const std::string& w = what();
  throw Error(w.empty() ? message : w + ": " + message);
}

void Value::type_error(const char* expected) const {
  std::string got = type_name(type_);
  if (type_ == Type::number) got += " (" + format_number(number_) + ")";
  fail(describe(path_) + " must be " + expected + ", got " + got);
}

bool Value::is_int() const {
  return type_ == Type::number && (int_exact_ || integral_in_range(number_));
}

bool Value::as_bool() const {
  if (type_ != Type::boolean) type_error("a boolean");
  return bool_;
}

double Value::as_double() const {
  if (type_ != Type::number) type_error("a number");
  return number_;
}

int64_t Value::as_int() const {
  if (type_ != Type::number) type_error("an integer");
  if (int_exact_) return int_;
  if (!integral_in_range(number_)) type_error("an integer");
  return static_cast<int64_t>(number_);
}

const std::string& Value::as_string() const {
  if (type_ != Type::string) type_error("a string");
  return payload().str;
}

size_t Value::size() const {
  if (type_ == Type::array) return payload().arr.size();
  if (type_ == Type::object) return payload().obj.size();
  type_error("an array or an object");
}

const std::vector<Value>& Value::array() const {
  if (type_ != Type::array) type_error("an array");
  return payload().arr;
}

const std::vector<std::pair<std::string, Value>>& Value::object() const {
  if (type_ != Type::object) type_error("an object");
  return payload().obj;
}

const Value& Value::operator[](size_t i) const {
  const auto& arr = array();
  if (i >= arr.size()) {
    fail("index " + std::to_string(i) + " out of range for " + describe(path_) + " (size " +
         std::to_string(arr.size()) + ")");
  }
  return arr[i];
}

const Value* Value::find(const std::string& key) const {
  if (type_ != Type::object) return nullptr;
  const Payload& p = payload();
  auto it = std::lower_bound(p.index.begin(), p.index.end(), key,
                             [&p](uint32_t i, const std::string& k) { return p.obj[i].first < k; });
  if (it == p.index.end() || p.obj[*it].first != key) return nullptr;
  return &p.obj[*it].second;
}

bool Value::contains(const std::string& key) const { return find(key) != nullptr; }

const Value& Value::operator[](const std::string& key) const {
  if (type_ != Type::object) type_error("an object");
  const Value* v = find(key);
  if (!v) fail("missing key '" + member_path(path_, key) + "'");
  return *v;
}

std::vector<double> Value::as_double_vector() const {
  const auto& arr = array();
  std::vector<double> out;
  out.reserve(arr.size());
  for (const Value& v : arr) out.push_back(v.as_double());
  return out;
}

std::vector<int64_t> Value::as_int_vector() const {
  const auto& arr = array();
  std::vector<int64_t> out;
  out.reserve(arr.size());
  for (const Value& v : arr) out.push_back(v.as_int());
  return out;
}

double Value::get_double(const std::string& key, double default_value) const {
  if (type_ != Type::object) type_error("an object");
  const Value* v = find(key);
  return v ? v->as_double() : default_value;
}

int64_t Value::get_int(const std::string& key, int64_t default_value) const {
  if (type_ != Type::object) type_error("an object");
  const Value* v = find(key);
  return v ? v->as_int() : default_value;
}

bool Value::get_bool(const std::string& key, bool default_value) const {
  if (type_ != Type::object) type_error("an object");
  const Value* v = find(key);
  return v ? v->as_bool() : default_value;
}

std::string Value::get_string(const std::string& key, const std::string& default_value) const {
  if (type_ != Type::object) type_error("an object");
  const Value* v = find(key);
  return v ? v->as_string() : default_value;
}

}  // namespace json
}  // namespace e3fuse
