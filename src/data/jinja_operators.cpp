// Python's operators on template values (binary_op, less_than, contains), iteration and `%`
// formatting; declared in jinja_builtins.h.
#include <cmath>
#include <limits>

#include "core/error.h"
#include "data/jinja_builtins.h"
#include "data/jinja_strings.h"

namespace primus::data::jinja {
namespace {

using K = Value::Kind;

[[noreturn]] void unsupported(std::string_view op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail("'{}' is undefined", a.undefined_name());
  if (b.is_undefined()) fail("'{}' is undefined", b.undefined_name());
  fail("unsupported operand types for {}: '{}' and '{}'", op, a.type_name(), b.type_name());
}

bool is_int(const Value& v) { return v.kind() == K::Int || v.kind() == K::Bool; }

template <typename F>
int64_t checked(F op_with_overflow, std::string_view op) {
  int64_t r = 0;
  if (op_with_overflow(&r)) fail("integer overflow in {}", op);
  return r;
}

int64_t floor_div(int64_t a, int64_t b) {
  if (b == 0) fail("integer division or modulo by zero");
  if (a == std::numeric_limits<int64_t>::min() && b == -1) fail("integer overflow in //");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t py_mod(int64_t a, int64_t b) {
  if (b == 0) fail("integer division or modulo by zero");
  if (b == -1) return 0;
  const int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

double py_fmod(double a, double b) {
  if (b == 0) fail("float modulo by zero");
  double r = std::fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

Value int_pow(int64_t base, int64_t exp) {
  if (exp < 0) return Value(std::pow(double(base), double(exp)));
  int64_t r = 1;
  for (int64_t i = 0; i < exp; ++i) {
    if (__builtin_mul_overflow(r, base, &r)) fail("integer overflow in **");
    if (r == 0 || r == 1) break;  // 0 and 1 stay; -1 alternates, handled below
  }
  if (base == -1) return Value(int64_t(exp % 2 ? -1 : 1));
  return Value(r);
}

Value arithmetic(std::string_view op, const Value& a, const Value& b) {
  if (is_int(a) && is_int(b)) {
    const int64_t x = a.as_int(), y = b.as_int();
    if (op == "+") return Value(checked([&](int64_t* r) { return __builtin_add_overflow(x, y, r); }, op));
    if (op == "-") return Value(checked([&](int64_t* r) { return __builtin_sub_overflow(x, y, r); }, op));
    if (op == "*") return Value(checked([&](int64_t* r) { return __builtin_mul_overflow(x, y, r); }, op));
    if (op == "//") return Value(floor_div(x, y));
    if (op == "%") return Value(py_mod(x, y));
    if (op == "**") return int_pow(x, y);
  }
  const double x = a.as_double(), y = b.as_double();
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  if (op == "%") return Value(py_fmod(x, y));
  if (op == "**") return Value(std::pow(x, y));
  if (y == 0) fail("division by zero");
  if (op == "/") return Value(x / y);
  return Value(std::floor(x / y));  // "//"
}

Value repeat(const Value& seq, int64_t n, size_t max_bytes) {
  if (n <= 0) return seq.is_string() ? Value(std::string()) : Value::list({}, seq.list().tuple);
  if (double(seq.approx_bytes()) * double(n) > double(max_bytes))
    fail("repeating a {} {} times makes a value larger than the {} bytes a template may build", seq.type_name(), n,
         max_bytes);
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value(std::move(out));
  }
  std::vector<Value> items;
  for (int64_t i = 0; i < n; ++i) items.insert(items.end(), seq.list().items.begin(), seq.list().items.end());
  return Value::list(std::move(items), seq.list().tuple);
}

Value concatenate(const Value& a, const Value& b, size_t max_bytes) {
  if (a.approx_bytes() + b.approx_bytes() > max_bytes)
    fail("+ makes a value larger than the {} bytes a template may build", max_bytes);
  if (a.is_string()) return Value(a.str() + b.str());
  std::vector<Value> items = a.list().items;
  items.insert(items.end(), b.list().items.begin(), b.list().items.end());
  return Value::list(std::move(items), a.list().tuple);
}

}  // namespace

Value binary_op(std::string_view op, const Value& a, const Value& b, const BuiltinContext& ctx) {
  if (a.is_number() && b.is_number()) {
    if (op == "/" && is_int(a) && is_int(b) && b.as_int() == 0) fail("division by zero");
    return arithmetic(op, a, b);
  }
  if (op == "+" && a.kind() == b.kind() && (a.is_string() || (a.is_list() && a.list().tuple == b.list().tuple)))
    return concatenate(a, b, ctx.max_value_bytes);
  if (op == "*" && (a.is_string() || a.is_list()) && is_int(b)) return repeat(a, b.as_int(), ctx.max_value_bytes);
  if (op == "*" && (b.is_string() || b.is_list()) && is_int(a)) return repeat(b, a.as_int(), ctx.max_value_bytes);
  if (op == "%" && a.is_string()) return Value(percent_format(a.str(), b));
  unsupported(op, a, b);
}

bool less_than(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (is_int(a) && is_int(b)) return a.as_int() < b.as_int();
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();  // UTF-8 order is code point order
  if (a.is_list() && b.is_list()) {
    const auto &x = a.list().items, &y = b.list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!equal(x[i], y[i])) return less_than(x[i], y[i]);
    return x.size() < y.size();
  }
  unsupported("<", a, b);
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case K::Undefined: return false;
    case K::String:
      if (!item.is_string()) fail("'in <string>' requires a string as left operand, not {}", item.type_name());
      return container.str().find(item.str()) != std::string::npos;
    case K::List:
      for (const Value& x : container.list().items)
        if (equal(x, item)) return true;
      return false;
    case K::Dict:
      if (container.dict().namespace_object) break;
      return item.is_string() && container.dict().find(item.str()) != nullptr;
    default: break;
  }
  fail("argument of type '{}' is not iterable", container.type_name());
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case K::Undefined: return {};
    case K::List: return v.list().items;
    case K::String: {
      std::vector<Value> chars;
      for (char32_t c : utf8_to_u32(v.str())) chars.emplace_back(u32_to_utf8(std::u32string(1, c)));
      return chars;
    }
    case K::Dict:
      if (!v.dict().namespace_object) {
        std::vector<Value> keys;
        for (const auto& [k, x] : v.dict().entries()) keys.emplace_back(k);
        return keys;
      }
      break;
    default: break;
  }
  fail("'{}' object is not iterable", v.type_name());
}

std::string percent_format(const std::string& fmt, const Value& args) {
  const std::vector<Value> values = args.is_list() && args.list().tuple ? args.list().items : std::vector<Value>{args};
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    const char conv = i + 1 < fmt.size() ? fmt[++i] : '\0';
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    if (conv != 's' && conv != 'd' && conv != 'r') fail("% formatting: only %s, %d, %r and %% are supported");
    if (next >= values.size()) fail("not enough arguments for format string");
    const Value& v = values[next++];
    if (conv == 'd' && !v.is_number()) fail("%d format: a number is required, not {}", v.type_name());
    if (conv == 's')
      out += to_str(v);
    else if (conv == 'r')
      out += to_repr(v);
    else
      out += std::to_string(is_int(v) ? v.as_int() : int64_t(v.as_double()));
  }
  if (next < values.size()) fail("not all arguments converted during string formatting");
  return out;
}

}  // namespace primus::data::jinja
