#include "data/jinja_strings.h"

#include <unicode/locid.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <algorithm>

#include "core/error.h"
#include "data/jinja_lexer.h"

namespace primus::data::jinja {

BoundArgs::BoundArgs(std::string_view fn, const CallArgs& args, std::initializer_list<const char*> names)
    : fn_(fn), values_(names.size()) {
  if (args.positional.size() > names.size())
    fail("{} takes at most {} argument(s), {} given", fn, names.size(), args.positional.size());
  for (size_t i = 0; i < args.positional.size(); ++i) values_[i] = args.positional[i];
  for (const auto& [name, v] : args.named) {
    const std::string& named = name;  // (clang 14 captures no structured binding)
    auto it = std::find_if(names.begin(), names.end(), [&](const char* n) { return named == n; });
    if (it == names.end()) fail("{} has no argument named '{}'", fn, name);
    const size_t i = size_t(it - names.begin());
    if (i < args.positional.size()) fail("{} got argument '{}' twice", fn, name);
    values_[i] = v;
  }
}

const std::string& BoundArgs::str(size_t i, const char* what) const {
  if (!values_[i].is_string()) fail("{}: {} must be a string, not {}", fn_, what, values_[i].type_name());
  return values_[i].str();
}

int64_t BoundArgs::integer(size_t i, const char* what) const {
  const Value& v = values_[i];
  if (v.kind() != Value::Kind::Int && v.kind() != Value::Kind::Bool)
    fail("{}: {} must be an integer, not {}", fn_, what, v.type_name());
  return v.as_int();
}

size_t code_point_count(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  return n;
}

std::string py_strip(const std::string& s, const Value& chars, StripSide side) {
  const std::u32string u = utf8_to_u32(s);
  const bool by_space = chars.is_undefined() || chars.is_none();
  if (!by_space && !chars.is_string()) fail("strip: the characters must be a string, not {}", chars.type_name());
  const std::u32string set = by_space ? U"" : utf8_to_u32(chars.str());
  auto strip = [&](char32_t c) { return by_space ? is_python_space(c) : set.find(c) != std::u32string::npos; };
  size_t b = 0, e = u.size();
  if (side != StripSide::Right)
    while (b < e && strip(u[b])) ++b;
  if (side != StripSide::Left)
    while (e > b && strip(u[e - 1])) --e;
  return u32_to_utf8(std::u32string_view(u).substr(b, e - b));
}

namespace {

Value split_on_space(const std::string& s, int64_t maxsplit) {
  const std::u32string u = utf8_to_u32(s);
  std::vector<Value> parts;
  size_t i = 0;
  for (;;) {
    while (i < u.size() && is_python_space(u[i])) ++i;
    if (i == u.size()) break;
    if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) {
      size_t e = u.size();
      while (e > i && is_python_space(u[e - 1])) --e;
      parts.emplace_back(u32_to_utf8(std::u32string_view(u).substr(i, e - i)));
      break;
    }
    size_t j = i;
    while (j < u.size() && !is_python_space(u[j])) ++j;
    parts.emplace_back(u32_to_utf8(std::u32string_view(u).substr(i, j - i)));
    i = j;
  }
  return Value::list(std::move(parts));
}

// ICU's full case mappings in the root locale, which are Python's.
template <typename F>
std::string icu_map(const std::string& s, F f) {
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(s);
  f(u);
  std::string out;
  u.toUTF8String(out);
  return out;
}

std::string upper_one(char32_t c) { return py_upper(u32_to_utf8(std::u32string(1, c))); }
std::string lower_one(char32_t c) { return py_lower(u32_to_utf8(std::u32string(1, c))); }
std::string title_one(char32_t c) {
  return icu_map(u32_to_utf8(std::u32string(1, c)),
                 [](icu::UnicodeString& u) { u.toTitle(nullptr, icu::Locale::getRoot()); });
}
bool cased(char32_t c) { return u_hasBinaryProperty(UChar32(c), UCHAR_CASED); }

}  // namespace

Value py_split(const std::string& s, const Value& sep, int64_t maxsplit) {
  if (sep.is_undefined() || sep.is_none()) return split_on_space(s, maxsplit);
  if (!sep.is_string()) fail("split: the separator must be a string, not {}", sep.type_name());
  const std::string& d = sep.str();
  if (d.empty()) fail("split: empty separator");
  std::vector<Value> parts;
  size_t i = 0;
  for (;;) {
    const size_t j = s.find(d, i);
    if (j == std::string::npos || (maxsplit >= 0 && int64_t(parts.size()) == maxsplit)) break;
    parts.emplace_back(s.substr(i, j - i));
    i = j + d.size();
  }
  parts.emplace_back(s.substr(i));
  return Value::list(std::move(parts));
}

std::string py_upper(const std::string& s) {
  return icu_map(s, [](icu::UnicodeString& u) { u.toUpper(icu::Locale::getRoot()); });
}

std::string py_lower(const std::string& s) {
  return icu_map(s, [](icu::UnicodeString& u) { u.toLower(icu::Locale::getRoot()); });
}

std::string py_title(const std::string& s) {
  std::string out;
  bool previous_cased = false;
  for (char32_t c : utf8_to_u32(s)) {
    out += previous_cased ? lower_one(c) : title_one(c);
    previous_cased = cased(c);
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  const std::u32string u = utf8_to_u32(s);
  if (u.empty()) return "";
  return title_one(u[0]) + py_lower(u32_to_utf8(std::u32string_view(u).substr(1)));
}

std::string jinja_title(const std::string& s) {
  // Words begin after runs of whitespace, '-', '(', '{', '[' or '<'; each word's first character is
  // upper-cased and the rest lower-cased.
  std::string out;
  bool word_start = true;
  for (char32_t c : utf8_to_u32(s)) {
    const bool sep = is_python_space(c) || c == U'-' || c == U'(' || c == U'{' || c == U'[' || c == U'<';
    out += sep ? u32_to_utf8(std::u32string(1, c)) : word_start ? upper_one(c) : lower_one(c);
    word_start = sep;
  }
  return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& with, int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts `with` before each character and at the end
    const std::u32string u = utf8_to_u32(s);
    int64_t n = 0;
    for (char32_t c : u) {
      if (count < 0 || n++ < count) out += with;
      out += u32_to_utf8(std::u32string(1, c));
    }
    if (count < 0 || n < count) out += with;
    return out;
  }
  size_t i = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t j = s.find(old, i);
    if (j == std::string::npos) break;
    out += s.substr(i, j - i) + with;
    i = j + old.size();
  }
  return out + s.substr(i);
}

bool py_islower(const std::string& s) {
  bool any = false;
  for (char32_t c : utf8_to_u32(s)) {
    if (u_isupper(UChar32(c)) || u_istitle(UChar32(c))) return false;
    any = any || u_islower(UChar32(c));
  }
  return any;
}

bool py_isupper(const std::string& s) {
  bool any = false;
  for (char32_t c : utf8_to_u32(s)) {
    if (u_islower(UChar32(c)) || u_istitle(UChar32(c))) return false;
    any = any || u_isupper(UChar32(c));
  }
  return any;
}

std::vector<std::string> py_splitlines(const std::string& s) {
  const std::u32string u = utf8_to_u32(s);
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    const char32_t c = u[i];
    const bool brk = c == U'\n' || c == U'\r' || c == 0x0b || c == 0x0c || (c >= 0x1c && c <= 0x1e) || c == 0x85 ||
                     c == 0x2028 || c == 0x2029;
    if (!brk) continue;
    lines.push_back(u32_to_utf8(std::u32string_view(u).substr(start, i - start)));
    if (c == U'\r' && i + 1 < u.size() && u[i + 1] == U'\n') ++i;
    start = i + 1;
  }
  if (start < u.size()) lines.push_back(u32_to_utf8(std::u32string_view(u).substr(start)));
  return lines;
}

}  // namespace primus::data::jinja
