// The values a chat template computes with, shaped after the Python objects Jinja2 hands around
// (Hugging Face renders chat templates with Python's Jinja2, so its output is the specification):
// undefined, None, bool, int, float, str, list / tuple, dict, Jinja's namespace and callables.
// Lists and dicts are shared, as Python's are: `ns.x = ...` changes the one namespace every copy
// sees. Strings are UTF-8; what Python counts in characters (len, slicing, indexing) is counted in
// code points here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace primus::data::jinja {

// An error that already names where in the template it happened ("chat template: line L, column
// C: ..."); other primus::Errors from the value code get that prefix where they are caught.
class TemplateError : public Error {
 public:
  using Error::Error;
};

class Value;

// Lists and dicts nest at most this deep: a template that wraps a value in itself in a loop gets an
// error, not a stack overflow in the code that prints, compares or frees the value.
inline constexpr int kMaxNesting = 128;

struct List {
  std::vector<Value> items;
  bool tuple = false;  // prints as (a, b)
  int depth = 1;
};

// A dict in insertion order (Python's), string keys only (what JSON gives and templates use).
class Dict {
 public:
  bool namespace_object = false;  // Jinja's namespace(): attributes may be assigned
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }
  size_t size() const;  // defined below Value (clang needs Value complete for the vector's size)
  int depth() const { return depth_; }

 private:
  int depth_ = 1;
  std::vector<std::pair<std::string, Value>> entries_;
  std::unordered_map<std::string, size_t> index_;
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
};

// A callable: a global such as range() or namespace(), a macro, or a method bound to its object.
struct Callable {
  std::string name;
  std::function<Value(const CallArgs&)> call;
};

class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Callable };

  Value() = default;  // undefined
  static Value undefined(std::string name) {
    Value v;
    v.data_ = UndefinedName{std::move(name)};
    return v;
  }
  static Value none() {
    Value v;
    v.data_ = nullptr;
    return v;
  }
  Value(bool b) : data_(b) {}                      // NOLINT: implicit, as Python's literals
  Value(int64_t i) : data_(i) {}                   // NOLINT
  Value(int i) : data_(int64_t(i)) {}              // NOLINT
  Value(double f) : data_(f) {}                    // NOLINT
  Value(std::string s) : data_(std::move(s)) {}    // NOLINT
  Value(const char* s) : data_(std::string(s)) {}  // NOLINT
  static Value list(std::vector<Value> items, bool tuple = false);
  static Value dict(std::shared_ptr<Dict> d) {
    Value v;
    v.data_ = std::move(d);
    return v;
  }
  static Value callable(std::string name, std::function<Value(const CallArgs&)> f);

  Kind kind() const;
  bool is_undefined() const { return kind() == Kind::Undefined; }
  bool is_none() const { return kind() == Kind::None; }
  bool is_string() const { return kind() == Kind::String; }
  bool is_number() const { return kind() == Kind::Int || kind() == Kind::Float || kind() == Kind::Bool; }
  bool is_list() const { return kind() == Kind::List; }
  bool is_dict() const { return kind() == Kind::Dict; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const;    // bool or int
  double as_double() const;  // bool, int or float
  const std::string& str() const { return std::get<std::string>(data_); }
  const List& list() const { return *std::get<std::shared_ptr<List>>(data_); }
  const Dict& dict() const { return *std::get<std::shared_ptr<Dict>>(data_); }
  Dict& mutable_dict() const { return *std::get<std::shared_ptr<Dict>>(data_); }
  const Callable& callable() const { return *std::get<std::shared_ptr<Callable>>(data_); }
  const std::string& undefined_name() const { return std::get<UndefinedName>(data_).name; }

  bool truthy() const;            // Python's bool(x); undefined is false
  std::string type_name() const;  // Python's type name, for error messages
  size_t approx_bytes() const;    // a bound on the memory the value holds, for the size limits
  int nesting() const;            // 0 for scalars, 1 + the deepest item for lists and dicts

 private:
  struct UndefinedName {
    std::string name;
  };
  std::variant<UndefinedName, std::nullptr_t, bool, int64_t, double, std::string, std::shared_ptr<List>,
               std::shared_ptr<Dict>, std::shared_ptr<Callable>>
      data_;
};

inline size_t Dict::size() const { return entries_.size(); }

// Python's ==, which never fails (1 == 1.0 == True; different types are unequal).
bool equal(const Value& a, const Value& b);

// Python's str(x) and repr(x) ({{ x }} prints str(x); containers print their items' repr).
std::string to_str(const Value& v);
std::string to_repr(const Value& v);
// repr(float): the shortest digits that read back, scientific below 1e-4 and from 1e16.
std::string float_repr(double d);

// json.dumps(v, ensure_ascii=False, indent=indent) as Hugging Face's tojson filter calls it: key
// order kept, separators ", " / ": " (no indent) or "," / ": " with newlines (indent >= 0).
std::string to_json_text(const Value& v, int indent = -1);

// JSON in (nlohmann's ordered_json keeps the file's key order, which tojson must reproduce; plain
// json sorts keys, as its std::map does).
Value from_json(const nlohmann::ordered_json& j);
Value from_json(const nlohmann::json& j);

// UTF-8 helpers: code points of a string and back (invalid UTF-8 is an error).
std::u32string utf8_to_u32(std::string_view s);
std::string u32_to_utf8(std::u32string_view s);

}  // namespace primus::data::jinja
