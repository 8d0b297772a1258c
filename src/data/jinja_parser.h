// The Jinja parser for the subset of the language chat templates use, with Jinja2's operator
// precedence (lowest first): `a if c else b`, or, and, not, comparisons (== != < <= > >= in, not in),
// + -, ~, * / // %, **, unary - +, then postfix .attr [index] [a:b:c] (call) and the filters | f and
// tests `is [not] t`, which bind tighter than any operator. Statements: if / elif / else, for (with
// tuple targets, an `if` filter, else, break, continue), set (names, tuples, `ns.attr`, blocks),
// macro, and Hugging Face's generation. Anything else (include, import, extends, block, call,
// filter, with, raw, recursive loops) is refused by name. Nesting deeper than kMaxParseDepth is an
// error, not a stack overflow.
#pragma once

#include <string>

#include "data/jinja_ast.h"

namespace primus::data::jinja {

inline constexpr int kMaxParseDepth = 200;

// Parses a normalized source (normalize_source). Errors are primus::Error naming line and column.
Body parse_template(const std::string& source);

}  // namespace primus::data::jinja
