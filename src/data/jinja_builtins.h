// What a chat template can call: Jinja's filters (`x | trim`), tests (`x is string`), the methods
// of Python's str and dict that templates use (`s.strip()`, `d.get(k)`), Python's operators on
// values, and Hugging Face's tojson. Each follows Python / Jinja2 3.1 as Hugging Face runs it; each
// refusal is a primus::Error naming the filter, test, method or operator (the interpreter adds the
// template's line and column).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "data/jinja_value.h"

namespace primus::data::jinja {

// Hooks back into the interpreter, for the filters that apply other filters or tests
// (map('upper'), select('odd')), and the limit on the size of a value a filter or operator builds.
struct BuiltinContext {
  std::function<Value(std::string_view filter, const Value& v, const CallArgs& args)> filter;
  std::function<bool(std::string_view test, const Value& v, const CallArgs& args)> test;
  size_t max_value_bytes = 0;
};

Value apply_filter(std::string_view name, const Value& v, const CallArgs& args, const BuiltinContext& ctx);
bool apply_test(std::string_view name, const Value& v, const CallArgs& args, const BuiltinContext& ctx);

// `obj.name` when it names a method of obj's type (a callable bound to obj); undefined otherwise.
Value method_of(const Value& obj, std::string_view name, const BuiltinContext& ctx);

// Python's operators: + - * / // % ** (op names these), and <, <=, >, >= as "<" etc.
Value binary_op(std::string_view op, const Value& a, const Value& b, const BuiltinContext& ctx);
bool less_than(const Value& a, const Value& b);
bool contains(const Value& container, const Value& item);  // `item in container`

// The items a for loop or a filter walks: a list's items, a string's characters, a dict's keys;
// undefined walks nothing. Other types are an error.
std::vector<Value> iterate(const Value& v);

// Python's `fmt % args` for the %s / %d / %r / %% conversions templates use.
std::string percent_format(const std::string& fmt, const Value& args);

}  // namespace primus::data::jinja
