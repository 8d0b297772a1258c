// The Jinja evaluator: runs a parsed template over values, with Jinja2's scoping (a for loop's body
// is a fresh scope each iteration; `set` inside `if` stays in the enclosing scope; a macro's body
// sees its arguments and the template's top-level variables), Python's semantics for values
// (jinja_builtins.h), and the limits of ChatTemplateLimits. The generation tag records the span of
// text its body wrote.
#pragma once

#include <string>

#include "data/chat_template.h"
#include "data/jinja_ast.h"

namespace primus::data::jinja {

// Renders `body` (parsed from the normalized `source`, which errors quote positions in) with the
// variables of `globals` (a dict), adding the built-in functions range, namespace, dict,
// raise_exception and strftime_now.
Rendered evaluate(const std::string& source, const Body& body, const Value& globals, const ChatTemplateLimits& limits);

}  // namespace primus::data::jinja
