// The syntax tree of a chat template: expressions and statements, each with the offset of its first
// token in the normalized source (for "line L, column C" in errors).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/jinja_value.h"

namespace primus::data::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class ExprKind {
  Literal,  // value
  Name,     // name
  List,     // items
  Tuple,    // items
  Dict,     // keys[i]: items[i]
  Attr,     // object.name
  Item,     // object[items[0]]
  Slice,    // object[items[0]:items[1]:items[2]] (null = omitted)
  Call,     // object(args...)
  Filter,   // object | name(args...)
  Test,     // object is [not] name(args...)
  Neg,      // -object
  Pos,      // +object
  Not,      // not object
  Binary,   // items[0] op items[1]: + - * / // % ** ~ and or
  Compare,  // items[0] ops[0] items[1] ops[1] items[2] ...: == != < <= > >= in notin
  Cond,     // items[0] if items[1] else items[2] (items[2] may be null)
};

struct Arg {
  std::string name;  // empty for positional
  ExprPtr value;
};

struct Expr {
  ExprKind kind;
  size_t offset = 0;
  Value value;
  std::string name;      // Name, Attr, Filter, Test; Binary's operator
  bool negated = false;  // Test: `is not`
  ExprPtr object;
  std::vector<ExprPtr> items;
  std::vector<ExprPtr> keys;
  std::vector<std::string> ops;
  std::vector<Arg> args;
};

enum class StmtKind {
  Text,      // text
  Output,    // {{ expr }}
  If,        // conditions[i] -> bodies[i]; else_body
  For,       // for targets in expr [if filter] body [else else_body]
  Set,       // set targets = expr, or set name.attr = expr
  SetBlock,  // set targets[0] %} body {% endset
  Macro,     // macro name(params) body
  Break,
  Continue,
  Generation,  // Hugging Face's {% generation %} body {% endgeneration %}
};

struct Param {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Stmt {
  StmtKind kind;
  size_t offset = 0;
  std::string text;                  // Text; Set: the attribute of `set ns.attr = ...`
  std::vector<std::string> targets;  // For, Set, SetBlock; Macro: its name
  ExprPtr expr;                      // Output, For (iterable), Set
  ExprPtr filter;                    // For's `if`
  std::vector<ExprPtr> conditions;   // If
  std::vector<Body> bodies;          // If: one per condition; For, SetBlock, Macro, Generation: bodies[0]
  Body else_body;                    // If, For
  std::vector<Param> params;         // Macro
};

}  // namespace primus::data::jinja
