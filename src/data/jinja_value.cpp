#include "data/jinja_value.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace primus::data::jinja {

const Value* Dict::find(std::string_view key) const {
  auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

void Dict::set(const std::string& key, Value v) {
  depth_ = std::max(depth_, 1 + v.nesting());
  if (depth_ > kMaxNesting) fail("lists and dicts nest more than {} levels deep", kMaxNesting);
  auto it = index_.find(key);
  if (it != index_.end()) {
    entries_[it->second].second = std::move(v);
    return;
  }
  index_.emplace(key, entries_.size());
  entries_.emplace_back(key, std::move(v));
}

Value Value::list(std::vector<Value> items, bool tuple) {
  int depth = 1;
  for (const Value& x : items) depth = std::max(depth, 1 + x.nesting());
  if (depth > kMaxNesting) fail("lists and dicts nest more than {} levels deep", kMaxNesting);
  Value v;
  v.data_ = std::make_shared<List>(List{std::move(items), tuple, depth});
  return v;
}

int Value::nesting() const {
  if (kind() == Kind::List) return list().depth;
  if (kind() == Kind::Dict) return dict().depth();
  return 0;
}

Value Value::callable(std::string name, std::function<Value(const CallArgs&)> f) {
  Value v;
  v.data_ = std::make_shared<Callable>(Callable{std::move(name), std::move(f)});
  return v;
}

Value::Kind Value::kind() const { return Kind(data_.index()); }

int64_t Value::as_int() const {
  if (kind() == Kind::Bool) return as_bool() ? 1 : 0;
  return std::get<int64_t>(data_);
}

double Value::as_double() const {
  if (kind() == Kind::Float) return std::get<double>(data_);
  return double(as_int());
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return as_bool();
    case Kind::Int: return as_int() != 0;
    case Kind::Float: return as_double() != 0.0;
    case Kind::String: return !str().empty();
    case Kind::List: return !list().items.empty();
    case Kind::Dict: return dict().namespace_object || dict().size() > 0;
    case Kind::Callable: return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::Undefined: return "undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return list().tuple ? "tuple" : "list";
    case Kind::Dict: return dict().namespace_object ? "Namespace" : "dict";
    case Kind::Callable: return "function";
  }
  return "?";
}

size_t Value::approx_bytes() const {
  switch (kind()) {
    case Kind::String: return str().size() + 32;
    case Kind::List: {
      size_t n = 32;
      for (const Value& x : list().items) n += x.approx_bytes();
      return n;
    }
    case Kind::Dict: {
      size_t n = 32;
      for (const auto& [k, x] : dict().entries()) n += k.size() + x.approx_bytes();
      return n;
    }
    default: return 32;
  }
}

bool equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind() == K::Float || b.kind() == K::Float) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::Undefined:
    case K::None: return true;
    case K::String: return a.str() == b.str();
    case K::List: {
      const auto &x = a.list().items, &y = b.list().items;
      if (x.size() != y.size() || a.list().tuple != b.list().tuple) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equal(x[i], y[i])) return false;
      return true;
    }
    case K::Dict: {
      if (&a.dict() == &b.dict()) return true;
      if (a.dict().namespace_object || b.dict().namespace_object || a.dict().size() != b.dict().size()) return false;
      for (const auto& [k, x] : a.dict().entries()) {
        const Value* y = b.dict().find(k);
        if (!y || !equal(x, *y)) return false;
      }
      return true;
    }
    case K::Callable: return &a.callable() == &b.callable();
    default: return false;
  }
}

// ---- UTF-8 ----

std::u32string utf8_to_u32(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) fail("text is not valid UTF-8 (byte {} of {})", i, s.size());
    char32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (int k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 2) fail("text is not valid UTF-8 (byte {} of {})", i + k, s.size());
      cp = (cp << 6) | (d & 0x3f);
    }
    out.push_back(cp);
    i += n;
  }
  return out;
}

std::string u32_to_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (c < 0x80) {
      out.push_back(char(c));
    } else if (c < 0x800) {
      out.push_back(char(0xc0 | (c >> 6)));
      out.push_back(char(0x80 | (c & 0x3f)));
    } else if (c < 0x10000) {
      out.push_back(char(0xe0 | (c >> 12)));
      out.push_back(char(0x80 | ((c >> 6) & 0x3f)));
      out.push_back(char(0x80 | (c & 0x3f)));
    } else {
      out.push_back(char(0xf0 | (c >> 18)));
      out.push_back(char(0x80 | ((c >> 12) & 0x3f)));
      out.push_back(char(0x80 | ((c >> 6) & 0x3f)));
      out.push_back(char(0x80 | (c & 0x3f)));
    }
  }
  return out;
}

// ---- str(), repr(), json.dumps() ----

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // -d.ddde+XX
  const size_t e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : sci.substr(0, e))
    if (c >= '0' && c <= '9') digits.push_back(c);
  const std::string sign = d < 0 ? "-" : "";
  if (exp < -4 || exp >= 16) {
    std::string m = digits.substr(0, 1);
    if (digits.size() > 1) m.append(".").append(digits, 1);
    return fmt::format("{}{}e{}{:02d}", sign, m, exp < 0 ? '-' : '+', std::abs(exp));
  }
  const int point = exp + 1;  // digits before the decimal point
  if (point <= 0) return sign + "0." + std::string(size_t(-point), '0') + digits;
  if (size_t(point) >= digits.size()) return sign + digits + std::string(point - digits.size(), '0') + ".0";
  return sign + digits.substr(0, point) + "." + digits.substr(point);
}

namespace {

// Python's str.isprintable(), through ICU's general categories (Cc, Cf, Cs, Co, Cn, Zl, Zp, and
// Zs other than the space are not printable).
bool printable(char32_t c) {
  if (c == ' ') return true;
  switch (u_charType(UChar32(c))) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_SURROGATE:
    case U_PRIVATE_USE_CHAR:
    case U_UNASSIGNED:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
    case U_SPACE_SEPARATOR: return false;
    default: return true;
  }
}

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::u32string out;
  out.push_back(quote);
  for (char32_t c : utf8_to_u32(s)) {
    if (c == U'\\' || c == char32_t(quote)) {
      out += U'\\';
      out += c;
    } else if (c == U'\n') {
      out += U"\\n";
    } else if (c == U'\r') {
      out += U"\\r";
    } else if (c == U'\t') {
      out += U"\\t";
    } else if (!printable(c)) {
      const std::string esc = c <= 0xff     ? fmt::format("\\x{:02x}", uint32_t(c))
                              : c <= 0xffff ? fmt::format("\\u{:04x}", uint32_t(c))
                                            : fmt::format("\\U{:08x}", uint32_t(c));
      out += utf8_to_u32(esc);
    } else {
      out += c;
    }
  }
  out.push_back(quote);
  return u32_to_utf8(out);
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          out += fmt::format("\\u{:04x}", unsigned(c));
        else
          out.push_back(c);
    }
  }
  return out + "\"";
}

std::string sequence_repr(const List& l) {
  std::string out = l.tuple ? "(" : "[";
  for (size_t i = 0; i < l.items.size(); ++i) out += (i ? ", " : "") + to_repr(l.items[i]);
  if (l.tuple && l.items.size() == 1) out += ",";
  return out + (l.tuple ? ")" : "]");
}

std::string dict_repr(const Dict& d) {
  std::string out = "{";
  bool first = true;
  for (const auto& [k, x] : d.entries()) {
    out += (first ? "" : ", ") + string_repr(k) + ": " + to_repr(x);
    first = false;
  }
  out += "}";
  return d.namespace_object ? "<Namespace " + out + ">" : out;
}

class JsonWriter {
 public:
  explicit JsonWriter(int indent) : indent_(indent) {}
  std::string out;

  void write(const Value& v, int level) {
    using K = Value::Kind;
    switch (v.kind()) {
      case K::None: out += "null"; return;
      case K::Bool: out += v.as_bool() ? "true" : "false"; return;
      case K::Int: out += std::to_string(v.as_int()); return;
      case K::Float: out += json_float(v.as_double()); return;
      case K::String: out += json_string(v.str()); return;
      case K::List: return write_list(v.list(), level);
      case K::Dict:
        if (!v.dict().namespace_object) return write_dict(v.dict(), level);
        [[fallthrough]];
      default: fail("tojson: an object of type {} is not JSON serializable", v.type_name());
    }
  }

 private:
  int indent_;

  static std::string json_float(double d) {
    if (std::isnan(d)) return "NaN";
    if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
    return float_repr(d);
  }
  void newline(int level) {
    if (indent_ < 0) return;
    out.push_back('\n');
    out.append(size_t(indent_) * level, ' ');
  }
  const char* item_separator() const { return indent_ >= 0 ? "," : ", "; }

  void write_list(const List& l, int level) {
    if (l.items.empty()) {
      out += "[]";
      return;
    }
    out += "[";
    for (size_t i = 0; i < l.items.size(); ++i) {
      if (i) out += item_separator();
      newline(level + 1);
      write(l.items[i], level + 1);
    }
    newline(level);
    out += "]";
  }
  void write_dict(const Dict& d, int level) {
    if (d.size() == 0) {
      out += "{}";
      return;
    }
    out += "{";
    bool first = true;
    for (const auto& [k, x] : d.entries()) {
      if (!first) out += item_separator();
      first = false;
      newline(level + 1);
      out += json_string(k) + ": ";
      write(x, level + 1);
    }
    newline(level);
    out += "}";
  }
};

template <typename J>
Value value_from_json(const J& j) {
  switch (j.type()) {
    case J::value_t::null: return Value::none();
    case J::value_t::boolean: return Value(j.template get<bool>());
    case J::value_t::number_integer: return Value(j.template get<int64_t>());
    case J::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) fail("the integer {} is too large", u);
      return Value(int64_t(u));
    }
    case J::value_t::number_float: return Value(j.template get<double>());
    case J::value_t::string: return Value(j.template get<std::string>());
    case J::value_t::array: {
      std::vector<Value> items;
      for (const auto& x : j) items.push_back(value_from_json(x));
      return Value::list(std::move(items));
    }
    case J::value_t::object: {
      auto d = std::make_shared<Dict>();
      for (auto it = j.begin(); it != j.end(); ++it) d->set(it.key(), value_from_json(it.value()));
      return Value::dict(std::move(d));
    }
    default: fail("unsupported JSON value (binary)");
  }
}

}  // namespace

std::string to_repr(const Value& v) {
  if (v.is_string()) return string_repr(v.str());
  return to_str(v);
}

std::string to_str(const Value& v) {
  using K = Value::Kind;
  switch (v.kind()) {
    case K::Undefined: return "";
    case K::None: return "None";
    case K::Bool: return v.as_bool() ? "True" : "False";
    case K::Int: return std::to_string(v.as_int());
    case K::Float: return float_repr(v.as_double());
    case K::String: return v.str();
    case K::List: return sequence_repr(v.list());
    case K::Dict: return dict_repr(v.dict());
    case K::Callable: return "<function " + v.callable().name + ">";
  }
  return "";
}

std::string to_json_text(const Value& v, int indent) {
  JsonWriter w(indent);
  w.write(v, 0);
  return std::move(w.out);
}

Value from_json(const nlohmann::ordered_json& j) { return value_from_json(j); }
Value from_json(const nlohmann::json& j) { return value_from_json(j); }

}  // namespace primus::data::jinja
