#include "data/jinja_builtins.h"

#include <cmath>
#include <unordered_map>

#include "core/error.h"
#include "data/jinja_strings.h"

namespace primus::data::jinja {
namespace {

using K = Value::Kind;
using FilterFn = Value (*)(const Value& v, const CallArgs& a, const BuiltinContext& ctx);
using TestFn = bool (*)(const Value& v, const CallArgs& a);

CallArgs tail_args(const CallArgs& a, size_t from) {
  CallArgs rest;
  if (a.positional.size() > from) rest.positional.assign(a.positional.begin() + from, a.positional.end());
  rest.named = a.named;
  return rest;
}

// Jinja's environment.getattr for filters' `attribute=` arguments: "a.b" walks dict keys, "0" indexes.
Value attribute_path(const Value& v, const Value& path) {
  std::vector<std::string> parts;
  if (path.kind() == K::Int) {
    parts.push_back(std::to_string(path.as_int()));
  } else {
    if (!path.is_string()) fail("an attribute must be a string, not {}", path.type_name());
    Value split = py_split(path.str(), Value("."), -1);
    for (const Value& p : split.list().items) parts.push_back(p.str());
  }
  Value cur = v;
  for (const std::string& p : parts) {
    if (cur.is_dict() && cur.dict().find(p)) {
      cur = *cur.dict().find(p);
    } else if (cur.is_list() && !p.empty() && std::isdigit(static_cast<unsigned char>(p[0])) &&
               std::stoull(p) < cur.list().items.size()) {
      cur = cur.list().items[std::stoull(p)];
    } else {
      return Value::undefined(p);
    }
  }
  return cur;
}

size_t length(const Value& v) {
  switch (v.kind()) {
    case K::Undefined: return 0;
    case K::String: return code_point_count(v.str());
    case K::List: return v.list().items.size();
    case K::Dict:
      if (!v.dict().namespace_object) return v.dict().size();
      break;
    default: break;
  }
  fail("object of type '{}' has no len()", v.type_name());
}

// ---- filters ----

Value f_trim(const Value& v, const CallArgs& a, const BuiltinContext&) {
  BoundArgs b("trim", a, {"chars"});
  return Value(py_strip(to_str(v), b[0], StripSide::Both));
}

Value f_tojson(const Value& v, const CallArgs& a, const BuiltinContext&) {
  BoundArgs b("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  if (b[0].truthy()) fail("tojson: ensure_ascii=True is not supported");
  if (b.given(2) && !b[2].is_none()) fail("tojson: separators are not supported");
  if (b[3].truthy()) fail("tojson: sort_keys=True is not supported");
  const bool indented = b.given(1) && !b[1].is_none();
  const int64_t indent = indented ? b.integer(1, "indent") : -1;
  if (indented && (indent < 0 || indent > 64)) fail("tojson: indent must be between 0 and 64, not {}", indent);
  return Value(to_json_text(v, int(indent)));
}

Value f_length(const Value& v, const CallArgs& a, const BuiltinContext&) {
  BoundArgs("length", a, {});
  return Value(int64_t(length(v)));
}

Value f_upper(const Value& v, const CallArgs& a, const BuiltinContext&) {
  BoundArgs("upper", a, {});
  return Value(py_upper(to_str(v)));
}

Value f_lower(const Value& v, const CallArgs& a, const BuiltinContext&) {
  BoundArgs("lower", a, {});
  return Value(py_lower(to_str(v)));
}

Value f_title(const Value& v, const CallArgs& a, const BuiltinContext&) {
  BoundArgs("title", a, {});
  return Value(jinja_title(to_str(v)));
}

Value f_capitalize(const Value& v, const CallArgs& a, const BuiltinContext&) {
  BoundArgs("capitalize", a, {});
  return Value(py_capitalize(to_str(v)));
}

Value f_join(const Value& v, const CallArgs& a, const BuiltinContext& ctx) {
  BoundArgs b("join", a, {"d", "attribute"});
  const std::string sep = b.given(0) ? to_str(b[0]) : "";
  std::string out;
  bool first = true;
  for (const Value& x : iterate(v)) {
    out += (first ? "" : sep) + to_str(b.given(1) ? attribute_path(x, b[1]) : x);
    first = false;
    if (out.size() > ctx.max_value_bytes) fail("join makes a string larger than {} bytes", ctx.max_value_bytes);
  }
  return Value(std::move(out));
}

Value f_default(const Value& v, const CallArgs& a, const BuiltinContext&) {
  BoundArgs b("default", a, {"default_value", "boolean"});
  const bool use_default = v.is_undefined() || (b[1].truthy() && !v.truthy());
  if (!use_default) return v;
  return b.given(0) ? b[0] : Value(std::string());
}

Value f_items(const Value& v, const CallArgs& a, const BuiltinContext&) {
  BoundArgs("items", a, {});
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict() || v.dict().namespace_object) fail("items: can only get item pairs from a mapping");
  std::vector<Value> pairs;
  for (const auto& [k, x] : v.dict().entries()) pairs.push_back(Value::list({Value(k), x}, true));
  return Value::list(std::move(pairs));
}

Value f_first(const Value& v, const CallArgs& a, const BuiltinContext&) {
  BoundArgs("first", a, {});
  std::vector<Value> items = iterate(v);
  return items.empty() ? Value::undefined("first item") : items.front();
}

Value f_last(const Value& v, const CallArgs& a, const BuiltinContext&) {
  BoundArgs("last", a, {});
  std::vector<Value> items = iterate(v);
  return items.empty() ? Value::undefined("last item") : items.back();
}

Value f_string(const Value& v, const CallArgs& a, const BuiltinContext&) {
  BoundArgs("string", a, {});
  return Value(to_str(v));
}

Value f_replace(const Value& v, const CallArgs& a, const BuiltinContext& ctx) {
  BoundArgs b("replace", a, {"old", "new", "count"});
  const int64_t count = b.given(2) && !b[2].is_none() ? b.integer(2, "count") : -1;
  std::string out = py_replace(to_str(v), to_str(b[0]), to_str(b[1]), count);
  if (out.size() > ctx.max_value_bytes) fail("replace makes a string larger than {} bytes", ctx.max_value_bytes);
  return Value(std::move(out));
}

Value f_list(const Value& v, const CallArgs& a, const BuiltinContext&) {
  BoundArgs("list", a, {});
  return Value::list(iterate(v));
}

Value f_reverse(const Value& v, const CallArgs& a, const BuiltinContext&) {
  BoundArgs("reverse", a, {});
  if (v.is_string()) {
    std::u32string u = utf8_to_u32(v.str());
    return Value(u32_to_utf8(std::u32string(u.rbegin(), u.rend())));
  }
  std::vector<Value> items = iterate(v);
  return Value::list(std::vector<Value>(items.rbegin(), items.rend()));
}

// select / reject / selectattr / rejectattr: keep the items whose value (the item, or its attribute)
// passes the test (truthiness without a test) — or fails it, for the reject forms.
Value select_items(const Value& v, const CallArgs& a, const BuiltinContext& ctx, bool by_attr, bool keep) {
  const char* name = by_attr ? (keep ? "selectattr" : "rejectattr") : (keep ? "select" : "reject");
  if (!a.named.empty()) fail("{} takes no keyword arguments", name);
  const size_t test_at = by_attr ? 1 : 0;
  if (by_attr && a.positional.empty()) fail("{} needs the attribute's name", name);
  std::vector<Value> out;
  for (const Value& x : iterate(v)) {
    const Value subject = by_attr ? attribute_path(x, a.positional[0]) : x;
    bool pass;
    if (a.positional.size() > test_at) {
      if (!a.positional[test_at].is_string()) fail("{}: the test's name must be a string", name);
      pass = ctx.test(a.positional[test_at].str(), subject, tail_args(a, test_at + 1));
    } else {
      pass = subject.truthy();
    }
    if (pass == keep) out.push_back(x);
  }
  return Value::list(std::move(out));
}

Value f_select(const Value& v, const CallArgs& a, const BuiltinContext& c) {
  return select_items(v, a, c, false, true);
}
Value f_reject(const Value& v, const CallArgs& a, const BuiltinContext& c) {
  return select_items(v, a, c, false, false);
}
Value f_selectattr(const Value& v, const CallArgs& a, const BuiltinContext& c) {
  return select_items(v, a, c, true, true);
}
Value f_rejectattr(const Value& v, const CallArgs& a, const BuiltinContext& c) {
  return select_items(v, a, c, true, false);
}

Value f_map(const Value& v, const CallArgs& a, const BuiltinContext& ctx) {
  std::vector<Value> out;
  if (a.positional.empty()) {
    BoundArgs b("map", a, {"attribute", "default"});
    if (!b.given(0)) fail("map needs a filter's name or attribute=");
    for (const Value& x : iterate(v)) {
      Value y = attribute_path(x, b[0]);
      out.push_back(y.is_undefined() && b.given(1) ? b[1] : y);
    }
    return Value::list(std::move(out));
  }
  if (!a.positional[0].is_string()) fail("map: the filter's name must be a string");
  const CallArgs rest = tail_args(a, 1);
  for (const Value& x : iterate(v)) out.push_back(ctx.filter(a.positional[0].str(), x, rest));
  return Value::list(std::move(out));
}

Value f_abs(const Value& v, const CallArgs& a, const BuiltinContext&) {
  BoundArgs("abs", a, {});
  if (v.kind() == K::Float) return Value(std::fabs(v.as_double()));
  if (!v.is_number()) fail("bad operand type for abs(): '{}'", v.type_name());
  if (v.as_int() == INT64_MIN) fail("integer overflow in abs");
  return Value(std::abs(v.as_int()));
}

Value f_int(const Value& v, const CallArgs& a, const BuiltinContext&) {
  BoundArgs b("int", a, {"default", "base"});
  const Value fallback = b.given(0) ? b[0] : Value(int64_t(0));
  if (v.kind() == K::Float) return std::isfinite(v.as_double()) ? Value(int64_t(v.as_double())) : fallback;
  if (v.is_number()) return Value(v.as_int());
  if (!v.is_string()) return fallback;
  const std::string s = py_strip(v.str(), Value::none(), StripSide::Both);
  char* end = nullptr;
  errno = 0;
  const long long i = std::strtoll(s.c_str(), &end, 10);
  if (!s.empty() && end == s.c_str() + s.size() && errno == 0) return Value(int64_t(i));
  const double d = std::strtod(s.c_str(), &end);
  if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(d)) return Value(int64_t(d));
  return fallback;
}

Value f_float(const Value& v, const CallArgs& a, const BuiltinContext&) {
  BoundArgs b("float", a, {"default"});
  const Value fallback = b.given(0) ? b[0] : Value(0.0);
  if (v.is_number()) return Value(v.as_double());
  if (!v.is_string()) return fallback;
  const std::string s = py_strip(v.str(), Value::none(), StripSide::Both);
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size() ? Value(d) : fallback;
}

Value f_round(const Value& v, const CallArgs& a, const BuiltinContext&) {
  BoundArgs b("round", a, {"precision", "method"});
  const int64_t precision = b.given(0) ? b.integer(0, "precision") : 0;
  const std::string method = b.given(1) ? b.str(1, "method") : "common";
  if (!v.is_number()) fail("round: a number is required, not {}", v.type_name());
  const double scale = std::pow(10.0, double(precision)), x = v.as_double() * scale;
  double r;
  if (method == "common")
    r = std::round(x);
  else if (method == "ceil")
    r = std::ceil(x);
  else if (method == "floor")
    r = std::floor(x);
  else
    fail("round: method must be 'common', 'ceil' or 'floor', not '{}'", method);
  return Value(r / scale);
}

Value f_sum(const Value& v, const CallArgs& a, const BuiltinContext& ctx) {
  BoundArgs b("sum", a, {"attribute", "start"});
  Value total = b.given(1) ? b[1] : Value(int64_t(0));
  for (const Value& x : iterate(v)) total = binary_op("+", total, b.given(0) ? attribute_path(x, b[0]) : x, ctx);
  return total;
}

Value f_safe(const Value& v, const CallArgs& a, const BuiltinContext&) {
  BoundArgs("safe", a, {});
  return v;
}

Value f_format(const Value& v, const CallArgs& a, const BuiltinContext&) {
  if (!a.named.empty()) fail("format: keyword arguments are not supported");
  return Value(percent_format(to_str(v), Value::list(a.positional, true)));
}

Value f_indent(const Value& v, const CallArgs& a, const BuiltinContext&) {
  BoundArgs b("indent", a, {"width", "first", "blank"});
  const std::string pad = b[0].is_string() ? b[0].str()
                                           : std::string(size_t(b.given(0) ? b.integer(0, "width") : 4), ' ');
  std::vector<std::string> lines = py_splitlines(to_str(v) + "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    const bool indent_line = b[2].truthy() ? i > 0 : (i > 0 && !lines[i].empty());
    out += (i ? "\n" : "") + (indent_line ? pad : "") + lines[i];
  }
  return Value(b[1].truthy() ? pad + out : out);
}

const std::unordered_map<std::string_view, FilterFn>& filters() {
  static const std::unordered_map<std::string_view, FilterFn> table = {
      {"trim", f_trim},
      {"tojson", f_tojson},
      {"length", f_length},
      {"count", f_length},
      {"upper", f_upper},
      {"lower", f_lower},
      {"title", f_title},
      {"capitalize", f_capitalize},
      {"join", f_join},
      {"default", f_default},
      {"d", f_default},
      {"items", f_items},
      {"first", f_first},
      {"last", f_last},
      {"string", f_string},
      {"replace", f_replace},
      {"list", f_list},
      {"reverse", f_reverse},
      {"select", f_select},
      {"reject", f_reject},
      {"selectattr", f_selectattr},
      {"rejectattr", f_rejectattr},
      {"map", f_map},
      {"abs", f_abs},
      {"int", f_int},
      {"float", f_float},
      {"round", f_round},
      {"sum", f_sum},
      {"safe", f_safe},
      {"format", f_format},
      {"indent", f_indent},
  };
  return table;
}

// ---- tests ----

const Value& test_arg(const CallArgs& a, const char* test) {
  if (a.positional.size() != 1 || !a.named.empty()) fail("the test '{}' takes one argument", test);
  return a.positional[0];
}

bool is_integer(const Value& v) { return v.kind() == K::Int; }

const std::unordered_map<std::string_view, TestFn>& tests() {
  static const std::unordered_map<std::string_view, TestFn> table = {
      {"defined", [](const Value& v, const CallArgs&) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, const CallArgs&) { return v.is_undefined(); }},
      {"none", [](const Value& v, const CallArgs&) { return v.is_none(); }},
      {"boolean", [](const Value& v, const CallArgs&) { return v.kind() == K::Bool; }},
      {"true", [](const Value& v, const CallArgs&) { return v.kind() == K::Bool && v.as_bool(); }},
      {"false", [](const Value& v, const CallArgs&) { return v.kind() == K::Bool && !v.as_bool(); }},
      {"integer", [](const Value& v, const CallArgs&) { return is_integer(v); }},
      {"float", [](const Value& v, const CallArgs&) { return v.kind() == K::Float; }},
      {"number", [](const Value& v, const CallArgs&) { return v.is_number(); }},
      {"string", [](const Value& v, const CallArgs&) { return v.is_string(); }},
      {"mapping", [](const Value& v, const CallArgs&) { return v.is_dict() && !v.dict().namespace_object; }},
      {"iterable",
       [](const Value& v, const CallArgs&) {
         return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.dict().namespace_object);
       }},
      {"sequence",
       [](const Value& v, const CallArgs&) {
         return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.dict().namespace_object);
       }},
      {"callable", [](const Value& v, const CallArgs&) { return v.kind() == K::Callable; }},
      {"lower", [](const Value& v, const CallArgs&) { return v.is_string() && py_islower(v.str()); }},
      {"upper", [](const Value& v, const CallArgs&) { return v.is_string() && py_isupper(v.str()); }},
      {"odd", [](const Value& v, const CallArgs&) { return is_integer(v) && v.as_int() % 2 != 0; }},
      {"even", [](const Value& v, const CallArgs&) { return is_integer(v) && v.as_int() % 2 == 0; }},
      {"divisibleby",
       [](const Value& v, const CallArgs& a) {
         const Value& d = test_arg(a, "divisibleby");
         return equal(binary_op("%", v, d, BuiltinContext{}), Value(int64_t(0)));
       }},
      {"eq", [](const Value& v, const CallArgs& a) { return equal(v, test_arg(a, "eq")); }},
      {"ne", [](const Value& v, const CallArgs& a) { return !equal(v, test_arg(a, "ne")); }},
      {"lt", [](const Value& v, const CallArgs& a) { return less_than(v, test_arg(a, "lt")); }},
      {"gt", [](const Value& v, const CallArgs& a) { return less_than(test_arg(a, "gt"), v); }},
      {"le", [](const Value& v, const CallArgs& a) { return !less_than(test_arg(a, "le"), v); }},
      {"ge", [](const Value& v, const CallArgs& a) { return !less_than(v, test_arg(a, "ge")); }},
      {"in", [](const Value& v, const CallArgs& a) { return contains(test_arg(a, "in"), v); }},
      {"sameas",
       [](const Value& v, const CallArgs& a) {
         const Value& o = test_arg(a, "sameas");
         if (v.is_none() || v.kind() == K::Bool) return v.kind() == o.kind() && equal(v, o);
         if (v.is_list() && o.is_list()) return &v.list() == &o.list();
         if (v.is_dict() && o.is_dict()) return &v.dict() == &o.dict();
         return false;
       }},
  };
  return table;
}

const char* test_alias(std::string_view name) {
  if (name == "==" || name == "equalto") return "eq";
  if (name == "!=") return "ne";
  if (name == "<" || name == "lessthan") return "lt";
  if (name == ">" || name == "greaterthan") return "gt";
  if (name == "<=") return "le";
  if (name == ">=") return "ge";
  return nullptr;
}

// ---- methods ----

Value bind(const Value& self, std::string name, Value (*fn)(const Value&, const CallArgs&, const BuiltinContext&),
           const BuiltinContext& ctx) {
  const size_t max_bytes = ctx.max_value_bytes;
  return Value::callable(self.type_name() + "." + name, [self, fn, max_bytes](const CallArgs& a) {
    BuiltinContext c;
    c.max_value_bytes = max_bytes;
    return fn(self, a, c);
  });
}

Value m_strip_side(const Value& s, const CallArgs& a, StripSide side, const char* name) {
  BoundArgs b(name, a, {"chars"});
  return Value(py_strip(s.str(), b[0], side));
}

bool affix_matches(const std::string& s, const Value& affix, bool prefix, const char* name) {
  auto one = [&](const Value& x) {
    if (!x.is_string()) fail("{}: the argument must be a string or a tuple of strings, not {}", name, x.type_name());
    const std::string& p = x.str();
    return p.size() <= s.size() && s.compare(prefix ? 0 : s.size() - p.size(), p.size(), p) == 0;
  };
  if (affix.is_list() && affix.list().tuple) {
    for (const Value& x : affix.list().items)
      if (one(x)) return true;
    return false;
  }
  return one(affix);
}

Value m_strip(const Value& s, const CallArgs& a, const BuiltinContext&) {
  return m_strip_side(s, a, StripSide::Both, "str.strip");
}
Value m_lstrip(const Value& s, const CallArgs& a, const BuiltinContext&) {
  return m_strip_side(s, a, StripSide::Left, "str.lstrip");
}
Value m_rstrip(const Value& s, const CallArgs& a, const BuiltinContext&) {
  return m_strip_side(s, a, StripSide::Right, "str.rstrip");
}

Value m_split(const Value& s, const CallArgs& a, const BuiltinContext&) {
  BoundArgs b("str.split", a, {"sep", "maxsplit"});
  return py_split(s.str(), b[0], b.given(1) ? b.integer(1, "maxsplit") : -1);
}

Value m_startswith(const Value& s, const CallArgs& a, const BuiltinContext&) {
  BoundArgs b("str.startswith", a, {"prefix"});
  return Value(affix_matches(s.str(), b[0], true, "str.startswith"));
}

Value m_endswith(const Value& s, const CallArgs& a, const BuiltinContext&) {
  BoundArgs b("str.endswith", a, {"suffix"});
  return Value(affix_matches(s.str(), b[0], false, "str.endswith"));
}

// str.upper() and the other methods without arguments that map a string to a string.
template <std::string (*F)(const std::string&)>
Value m_mapped(const Value& s, const CallArgs& a, const BuiltinContext&) {
  BoundArgs("a str method", a, {});
  return Value(F(s.str()));
}

Value m_replace(const Value& s, const CallArgs& a, const BuiltinContext& c) {
  BoundArgs b("str.replace", a, {"old", "new", "count"});
  std::string out = py_replace(s.str(), b.str(0, "old"), b.str(1, "new"), b.given(2) ? b.integer(2, "count") : -1);
  if (out.size() > c.max_value_bytes) fail("str.replace makes a string larger than {} bytes", c.max_value_bytes);
  return Value(std::move(out));
}

Value m_find(const Value& s, const CallArgs& a, const BuiltinContext&) {
  BoundArgs b("str.find", a, {"sub"});
  const size_t at = s.str().find(b.str(0, "sub"));
  return Value(at == std::string::npos ? int64_t(-1) : int64_t(code_point_count(s.str().substr(0, at))));
}

Value m_count(const Value& s, const CallArgs& a, const BuiltinContext&) {
  BoundArgs b("str.count", a, {"sub"});
  const std::string& sub = b.str(0, "sub");
  if (sub.empty()) return Value(int64_t(code_point_count(s.str()) + 1));
  int64_t n = 0;
  for (size_t at = s.str().find(sub); at != std::string::npos; at = s.str().find(sub, at + sub.size())) ++n;
  return Value(n);
}

Value m_join(const Value& s, const CallArgs& a, const BuiltinContext& c) {
  BoundArgs b("str.join", a, {"iterable"});
  std::string out;
  bool first = true;
  for (const Value& x : iterate(b[0])) {
    if (!x.is_string()) fail("str.join: expected str items, found {}", x.type_name());
    out += (first ? "" : s.str()) + x.str();
    first = false;
    if (out.size() > c.max_value_bytes) fail("str.join makes a string larger than {} bytes", c.max_value_bytes);
  }
  return Value(std::move(out));
}

Value m_removeprefix(const Value& s, const CallArgs& a, const BuiltinContext&) {
  BoundArgs b("str.removeprefix", a, {"prefix"});
  const std::string& p = b.str(0, "prefix");
  return Value(s.str().compare(0, p.size(), p) == 0 ? s.str().substr(p.size()) : s.str());
}

Value m_removesuffix(const Value& s, const CallArgs& a, const BuiltinContext&) {
  BoundArgs b("str.removesuffix", a, {"suffix"});
  const std::string& p = b.str(0, "suffix");
  const bool ends = p.size() <= s.str().size() && s.str().compare(s.str().size() - p.size(), p.size(), p) == 0;
  return Value(ends && !p.empty() ? s.str().substr(0, s.str().size() - p.size()) : s.str());
}

const std::unordered_map<std::string_view, FilterFn>& string_methods() {
  static const std::unordered_map<std::string_view, FilterFn> table = {
      {"strip", m_strip},
      {"lstrip", m_lstrip},
      {"rstrip", m_rstrip},
      {"split", m_split},
      {"startswith", m_startswith},
      {"endswith", m_endswith},
      {"upper", m_mapped<py_upper>},
      {"lower", m_mapped<py_lower>},
      {"title", m_mapped<py_title>},
      {"capitalize", m_mapped<py_capitalize>},
      {"replace", m_replace},
      {"find", m_find},
      {"count", m_count},
      {"join", m_join},
      {"removeprefix", m_removeprefix},
      {"removesuffix", m_removesuffix},
  };
  return table;
}

const std::unordered_map<std::string_view, FilterFn>& dict_methods() {
  static const std::unordered_map<std::string_view, FilterFn> table = {
      {"get",
       [](const Value& d, const CallArgs& a, const BuiltinContext&) {
         BoundArgs b("dict.get", a, {"key", "default"});
         const Value* v = b[0].is_string() ? d.dict().find(b[0].str()) : nullptr;
         return v ? *v : b.given(1) ? b[1] : Value::none();
       }},
      {"items", [](const Value& d, const CallArgs& a, const BuiltinContext& c) { return f_items(d, a, c); }},
      {"keys",
       [](const Value& d, const CallArgs& a, const BuiltinContext&) {
         BoundArgs("dict.keys", a, {});
         return Value::list(iterate(d));
       }},
      {"values",
       [](const Value& d, const CallArgs& a, const BuiltinContext&) {
         BoundArgs("dict.values", a, {});
         std::vector<Value> values;
         for (const auto& [k, x] : d.dict().entries()) values.push_back(x);
         return Value::list(std::move(values));
       }},
  };
  return table;
}

bool is_mutator(const Value& obj, std::string_view name) {
  static const char* const kList[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"};
  static const char* const kDict[] = {"update", "pop", "popitem", "setdefault", "clear"};
  if (obj.is_list()) return std::any_of(std::begin(kList), std::end(kList), [&](const char* m) { return name == m; });
  if (obj.is_dict()) return std::any_of(std::begin(kDict), std::end(kDict), [&](const char* m) { return name == m; });
  return false;
}

}  // namespace

Value apply_filter(std::string_view name, const Value& v, const CallArgs& args, const BuiltinContext& ctx) {
  auto it = filters().find(name);
  if (it == filters().end()) fail("no filter named '{}'", name);
  return it->second(v, args, ctx);
}

bool apply_test(std::string_view name, const Value& v, const CallArgs& args, const BuiltinContext&) {
  if (const char* alias = test_alias(name)) name = alias;
  auto it = tests().find(name);
  if (it == tests().end()) fail("no test named '{}'", name);
  return it->second(v, args);
}

Value method_of(const Value& obj, std::string_view name, const BuiltinContext& ctx) {
  const std::unordered_map<std::string_view, FilterFn>* table = nullptr;
  if (obj.is_string()) table = &string_methods();
  if (obj.is_dict() && !obj.dict().namespace_object) table = &dict_methods();
  if (table) {
    auto it = table->find(name);
    if (it != table->end()) return bind(obj, std::string(name), it->second, ctx);
  }
  if (is_mutator(obj, name)) {
    const std::string what = obj.type_name() + "." + std::string(name);
    return Value::callable(what, [what](const CallArgs&) -> Value {
      fail("{}(): a chat template may not change a list or dict (Hugging Face renders in an immutable sandbox)", what);
    });
  }
  return Value::undefined(std::string(name));
}

}  // namespace primus::data::jinja
