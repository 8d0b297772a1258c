#include "data/jinja_parser.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <initializer_list>

#include "core/error.h"
#include "data/jinja_lexer.h"

namespace primus::data::jinja {
namespace {

ExprPtr make_expr(ExprKind kind, size_t offset) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->offset = offset;
  return e;
}

StmtPtr make_stmt(StmtKind kind, size_t offset) {
  auto s = std::make_unique<Stmt>();
  s->kind = kind;
  s->offset = offset;
  return s;
}

std::string describe(const Token& t) {
  switch (t.type) {
    case Tok::Data: return "text";
    case Tok::VarBegin: return "'{{'";
    case Tok::VarEnd: return "'}}'";
    case Tok::BlockBegin: return "'{%'";
    case Tok::BlockEnd: return "'%}'";
    case Tok::End: return "the end of the template";
    case Tok::String: return "a string";
    default: return "'" + t.text + "'";
  }
}

class Parser {
 public:
  Parser(const std::string& src, std::vector<Token> tokens) : src_(src), toks_(std::move(tokens)) {}

  Body parse() {
    Body body = parse_body({}, 0);
    return body;
  }

 private:
  const std::string& src_;
  std::vector<Token> toks_;
  size_t i_ = 0;
  int depth_ = 0;

  // Counts nesting (blocks and sub-expressions) so that hostile input fails cleanly.
  class Nest {
   public:
    explicit Nest(Parser* p) : p_(p) {
      if (++p_->depth_ > kMaxParseDepth)
        p_->error(p_->cur(), fmt::format("the template nests more than {} levels deep", kMaxParseDepth));
    }
    ~Nest() { --p_->depth_; }

   private:
    Parser* p_;
  };

  const Token& cur() const { return toks_[i_]; }
  const Token& peek(size_t k = 1) const { return toks_[std::min(i_ + k, toks_.size() - 1)]; }
  const Token& next() { return toks_[i_ < toks_.size() - 1 ? i_++ : i_]; }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* name) const { return cur().type == Tok::Name && cur().text == name; }
  bool skip_op(const char* op) { return is_op(op) ? (next(), true) : false; }
  bool skip_name(const char* name) { return is_name(name) ? (next(), true) : false; }

  [[noreturn]] void error(const Token& at, const std::string& what) const {
    fail("chat template: {}: {}", source_position(src_, at.offset), what);
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) error(cur(), fmt::format("expected '{}', found {}", op, describe(cur())));
  }
  void expect(Tok type, const char* what) {
    if (cur().type != type) error(cur(), fmt::format("expected {}, found {}", what, describe(cur())));
    next();
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) error(cur(), fmt::format("expected a name, found {}", describe(cur())));
    return next().text;
  }

  // ---- statements ----

  // Statements up to `{% <one of end_tags>`, leaving the parser on that name (after `{%`).
  Body parse_body(std::initializer_list<const char*> end_tags, size_t opened_at) {
    Nest nest(this);
    Body body;
    for (;;) {
      const Token& t = cur();
      if (t.type == Tok::End) {
        if (end_tags.size() == 0) return body;
        error(toks_[opened_at], fmt::format("this block is never closed with {{% {} %}}", *(end_tags.end() - 1)));
      }
      if (t.type == Tok::Data) {
        auto s = make_stmt(StmtKind::Text, t.offset);
        s->text = next().text;
        body.push_back(std::move(s));
      } else if (t.type == Tok::VarBegin) {
        next();
        auto s = make_stmt(StmtKind::Output, t.offset);
        s->expr = parse_tuple(true);
        expect(Tok::VarEnd, "'}}'");
        body.push_back(std::move(s));
      } else {
        expect(Tok::BlockBegin, "'{%'");
        if (cur().type == Tok::Name &&
            std::any_of(end_tags.begin(), end_tags.end(), [&](const char* e) { return cur().text == e; }))
          return body;
        body.push_back(parse_statement());
      }
    }
  }

  StmtPtr parse_statement() {
    const Token& t = cur();
    const size_t at = i_ - 1;  // the tag's '{%'
    const std::string kw = expect_name();
    if (kw == "if") return parse_if(at);
    if (kw == "for") return parse_for(at);
    if (kw == "set") return parse_set(at);
    if (kw == "macro") return parse_macro(at);
    if (kw == "generation") return parse_simple_block(StmtKind::Generation, "endgeneration", at);
    if (kw == "break" || kw == "continue") {
      expect(Tok::BlockEnd, "'%}'");
      return make_stmt(kw == "break" ? StmtKind::Break : StmtKind::Continue, t.offset);
    }
    static const char* const kRefused[] = {"include", "import", "from", "extends", "block",      "call",
                                           "filter",  "with",   "raw",  "do",      "autoescape", "trans"};
    for (const char* r : kRefused)
      if (kw == r) error(t, fmt::format("the '{{% {} %}}' tag is not supported in chat templates", kw));
    error(t, fmt::format("unknown tag '{}'", kw));
  }

  void end_tag(const char* name) {
    expect_name();  // the end tag's name, already checked by parse_body
    expect(Tok::BlockEnd, "'%}'");
    (void)name;
  }

  StmtPtr parse_if(size_t at) {
    auto s = make_stmt(StmtKind::If, toks_[at].offset);
    for (;;) {
      s->conditions.push_back(parse_tuple(true));
      expect(Tok::BlockEnd, "'%}'");
      s->bodies.push_back(parse_body({"elif", "else", "endif"}, at));
      const std::string tag = expect_name();
      if (tag == "elif") continue;
      expect(Tok::BlockEnd, "'%}'");
      if (tag == "endif") return s;
      s->else_body = parse_body({"endif"}, at);
      end_tag("endif");
      return s;
    }
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names{expect_name()};
    while (skip_op(",")) names.push_back(expect_name());
    return names;
  }

  StmtPtr parse_for(size_t at) {
    auto s = make_stmt(StmtKind::For, toks_[at].offset);
    const bool paren = skip_op("(");
    s->targets = parse_targets();
    if (paren) expect_op(")");
    if (!skip_name("in")) error(cur(), fmt::format("expected 'in' in the for loop, found {}", describe(cur())));
    s->expr = parse_tuple(false);
    if (skip_name("if")) s->filter = parse_expression(true);
    if (is_name("recursive")) error(cur(), "recursive for loops are not supported");
    expect(Tok::BlockEnd, "'%}'");
    s->bodies.push_back(parse_body({"else", "endfor"}, at));
    if (expect_name() == "else") {
      expect(Tok::BlockEnd, "'%}'");
      s->else_body = parse_body({"endfor"}, at);
      expect_name();
    }
    expect(Tok::BlockEnd, "'%}'");
    return s;
  }

  StmtPtr parse_set(size_t at) {
    auto s = make_stmt(StmtKind::Set, toks_[at].offset);
    s->targets = parse_targets();
    if (s->targets.size() == 1 && skip_op(".")) s->text = expect_name();
    if (cur().type == Tok::BlockEnd && s->targets.size() == 1 && s->text.empty()) {
      next();
      s->kind = StmtKind::SetBlock;
      s->bodies.push_back(parse_body({"endset"}, at));
      end_tag("endset");
      return s;
    }
    expect_op("=");
    s->expr = parse_tuple(true);
    expect(Tok::BlockEnd, "'%}'");
    return s;
  }

  StmtPtr parse_macro(size_t at) {
    auto s = make_stmt(StmtKind::Macro, toks_[at].offset);
    s->targets = {expect_name()};
    expect_op("(");
    while (!skip_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (skip_op(")")) break;
      Param p{expect_name(), nullptr};
      if (skip_op("=")) p.default_value = parse_expression(true);
      s->params.push_back(std::move(p));
    }
    expect(Tok::BlockEnd, "'%}'");
    s->bodies.push_back(parse_body({"endmacro"}, at));
    end_tag("endmacro");
    return s;
  }

  StmtPtr parse_simple_block(StmtKind kind, const char* end, size_t at) {
    auto s = make_stmt(kind, toks_[at].offset);
    expect(Tok::BlockEnd, "'%}'");
    s->bodies.push_back(kind == StmtKind::Generation ? parse_body({"endgeneration"}, at) : Body{});
    end_tag(end);
    return s;
  }

  // ---- expressions ----

  // An expression, or several separated by commas (a tuple without parentheses).
  ExprPtr parse_tuple(bool with_cond) {
    const size_t at = cur().offset;
    ExprPtr first = parse_expression(with_cond);
    if (!is_op(",")) return first;
    auto t = make_expr(ExprKind::Tuple, at);
    t->items.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd) break;
      t->items.push_back(parse_expression(with_cond));
    }
    return t;
  }

  ExprPtr parse_expression(bool with_cond) {
    Nest nest(this);
    ExprPtr e = parse_or();
    if (!with_cond) return e;
    while (is_name("if")) {
      auto c = make_expr(ExprKind::Cond, cur().offset);
      next();
      c->items.push_back(std::move(e));
      c->items.push_back(parse_or());
      c->items.push_back(skip_name("else") ? parse_expression(true) : nullptr);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(std::string op, ExprPtr l, ExprPtr r, size_t at) {
    auto b = make_expr(ExprKind::Binary, at);
    b->name = std::move(op);
    b->items.push_back(std::move(l));
    b->items.push_back(std::move(r));
    return b;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const size_t at = next().offset;
      e = binary("or", std::move(e), parse_and(), at);
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const size_t at = next().offset;
      e = binary("and", std::move(e), parse_not(), at);
    }
    return e;
  }

  ExprPtr parse_not() {
    if (!is_name("not")) return parse_compare();
    Nest nest(this);
    auto n = make_expr(ExprKind::Not, next().offset);
    n->object = parse_not();
    return n;
  }

  ExprPtr parse_compare() {
    const size_t at = cur().offset;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    for (;;) {
      std::string op;
      if (cur().type == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == "<=" || cur().text == ">" || cur().text == ">="))
        op = next().text;
      else if (skip_name("in"))
        op = "in";
      else if (is_name("not") && peek().type == Tok::Name && peek().text == "in")
        op = (next(), next(), "notin");
      else
        break;
      if (!cmp) {
        cmp = make_expr(ExprKind::Compare, at);
        cmp->items.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->items.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      e = binary(t.text == "+" ? "+" : "-", std::move(e), parse_concat(), t.offset);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const size_t at = next().offset;
      e = binary("~", std::move(e), parse_math2(), at);
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      const std::string op = t.text;
      e = binary(op == "*" ? "*" : op == "/" ? "/" : op == "//" ? "//" : "%", std::move(e), parse_pow(), t.offset);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const size_t at = next().offset;
      e = binary("**", std::move(e), parse_unary(true), at);
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    Nest nest(this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      e = make_expr(t.text == "-" ? ExprKind::Neg : ExprKind::Pos, t.offset);
      e->object = parse_unary(false);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    return with_filter ? parse_filters(std::move(e)) : std::move(e);
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    switch (t.type) {
      case Tok::Name: return parse_name();
      case Tok::String: {
        auto e = make_expr(ExprKind::Literal, t.offset);
        std::string s;
        while (cur().type == Tok::String) s += next().text;  // adjacent literals concatenate
        e->value = Value(std::move(s));
        return e;
      }
      case Tok::Int: return parse_int();
      case Tok::Float: {
        auto e = make_expr(ExprKind::Literal, t.offset);
        e->value = Value(std::strtod(next().text.c_str(), nullptr));
        return e;
      }
      case Tok::Op:
        if (t.text == "(") return parse_paren();
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        [[fallthrough]];
      default: error(t, fmt::format("expected an expression, found {}", describe(t)));
    }
  }

  ExprPtr parse_name() {
    const Token& t = next();
    auto e = make_expr(ExprKind::Literal, t.offset);
    if (t.text == "true" || t.text == "True")
      e->value = Value(true);
    else if (t.text == "false" || t.text == "False")
      e->value = Value(false);
    else if (t.text == "none" || t.text == "None")
      e->value = Value::none();
    else {
      e->kind = ExprKind::Name;
      e->name = t.text;
    }
    return e;
  }

  ExprPtr parse_int() {
    const Token& t = next();
    int64_t v = 0;
    auto [p, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
    if (ec != std::errc()) error(t, fmt::format("the integer {} is too large", t.text));
    auto e = make_expr(ExprKind::Literal, t.offset);
    e->value = Value(v);
    return e;
  }

  ExprPtr parse_paren() {
    const size_t at = next().offset;
    auto t = make_expr(ExprKind::Tuple, at);
    if (skip_op(")")) return t;
    ExprPtr first = parse_expression(true);
    if (skip_op(")")) return first;
    t->items.push_back(std::move(first));
    while (skip_op(",")) {
      if (is_op(")")) break;
      t->items.push_back(parse_expression(true));
    }
    expect_op(")");
    return t;
  }

  ExprPtr parse_list() {
    auto l = make_expr(ExprKind::List, next().offset);
    while (!skip_op("]")) {
      if (!l->items.empty()) expect_op(",");
      if (skip_op("]")) break;
      l->items.push_back(parse_expression(true));
    }
    return l;
  }

  ExprPtr parse_dict() {
    auto d = make_expr(ExprKind::Dict, next().offset);
    while (!skip_op("}")) {
      if (!d->items.empty()) expect_op(",");
      if (skip_op("}")) break;
      d->keys.push_back(parse_expression(true));
      expect_op(":");
      d->items.push_back(parse_expression(true));
    }
    return d;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      if (is_op(".")) {
        e = parse_attribute(std::move(e));
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_attribute(ExprPtr object) {
    const size_t at = next().offset;
    if (cur().type == Tok::Int) {  // x.0 is x[0]
      auto item = make_expr(ExprKind::Item, at);
      item->object = std::move(object);
      item->items.push_back(parse_int());
      return item;
    }
    auto a = make_expr(ExprKind::Attr, at);
    a->object = std::move(object);
    a->name = expect_name();
    return a;
  }

  ExprPtr parse_subscript(ExprPtr object) {
    Nest nest(this);
    const size_t at = next().offset;
    ExprPtr start = is_op(":") ? nullptr : parse_expression(true);
    if (skip_op("]")) {
      auto item = make_expr(ExprKind::Item, at);
      item->object = std::move(object);
      item->items.push_back(std::move(start));
      return item;
    }
    auto s = make_expr(ExprKind::Slice, at);
    s->object = std::move(object);
    expect_op(":");
    s->items.push_back(std::move(start));
    s->items.push_back(is_op(":") || is_op("]") ? nullptr : parse_expression(true));
    s->items.push_back(skip_op(":") && !is_op("]") ? parse_expression(true) : nullptr);
    expect_op("]");
    return s;
  }

  std::vector<Arg> parse_args() {
    expect_op("(");
    std::vector<Arg> args;
    while (!skip_op(")")) {
      if (!args.empty()) expect_op(",");
      if (skip_op(")")) break;
      if (is_op("*") || is_op("**")) error(cur(), "*args and **kwargs in calls are not supported");
      Arg a;
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        a.name = next().text;
        next();
      } else if (!args.empty() && !args.back().name.empty()) {
        error(cur(), "a positional argument follows a keyword argument");
      }
      a.value = parse_expression(true);
      args.push_back(std::move(a));
    }
    return args;
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto c = make_expr(ExprKind::Call, cur().offset);
    c->object = std::move(callee);
    c->args = parse_args();
    return c;
  }

  ExprPtr parse_filters(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        auto f = make_expr(ExprKind::Filter, next().offset);
        f->name = expect_name();
        f->object = std::move(e);
        if (is_op("(")) f->args = parse_args();
        e = std::move(f);
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_test(ExprPtr object) {
    auto t = make_expr(ExprKind::Test, next().offset);
    t->negated = skip_name("not");
    t->name = expect_name();
    t->object = std::move(object);
    const Token& c = cur();
    const bool arg_follows = c.type == Tok::String || c.type == Tok::Int || c.type == Tok::Float ||
                             (c.type == Tok::Name && c.text != "else" && c.text != "or" && c.text != "and" &&
                              c.text != "is") ||
                             (c.type == Tok::Op && (c.text == "[" || c.text == "{"));
    if (is_op("(")) {
      t->args = parse_args();
    } else if (arg_follows) {
      Arg a;
      a.value = parse_postfix(parse_primary());
      t->args.push_back(std::move(a));
    }
    return t;
  }
};

}  // namespace

Body parse_template(const std::string& source) { return Parser(source, tokenize(source)).parse(); }

}  // namespace primus::data::jinja
