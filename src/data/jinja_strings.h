// Python's str methods on UTF-8 strings, counted in code points as Python counts them: strip,
// split, case mapping (ICU's full mappings, as Python's: "ß".upper() is "SS"), title, replace, and
// the argument binding shared by filters, tests and methods.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "data/jinja_value.h"

namespace primus::data::jinja {

// Binds a call's arguments to a signature: positional first, then by name; unknown names, too many
// arguments, or a name given twice are errors naming `fn`. A missing argument is undefined.
class BoundArgs {
 public:
  BoundArgs(std::string_view fn, const CallArgs& args, std::initializer_list<const char*> names);
  const Value& operator[](size_t i) const { return values_[i]; }
  bool given(size_t i) const { return !values_[i].is_undefined(); }
  const std::string& str(size_t i, const char* what) const;  // the argument, which must be a string
  int64_t integer(size_t i, const char* what) const;         // the argument, which must be an int

 private:
  std::string fn_;
  std::vector<Value> values_;
};

enum class StripSide { Both, Left, Right };
// str.strip(chars): without chars (undefined or None) Python's whitespace.
std::string py_strip(const std::string& s, const Value& chars, StripSide side);
// str.split(sep, maxsplit): sep undefined/None splits on runs of whitespace.
Value py_split(const std::string& s, const Value& sep, int64_t maxsplit);
std::string py_upper(const std::string& s);
std::string py_lower(const std::string& s);
std::string py_title(const std::string& s);       // str.title()
std::string py_capitalize(const std::string& s);  // str.capitalize()
std::string jinja_title(const std::string& s);    // Jinja's title filter (words split at spaces, -, (, [, {, <)
std::string py_replace(const std::string& s, const std::string& old, const std::string& with, int64_t count);
bool py_islower(const std::string& s);
bool py_isupper(const std::string& s);
std::vector<std::string> py_splitlines(const std::string& s);
size_t code_point_count(const std::string& s);

}  // namespace primus::data::jinja
