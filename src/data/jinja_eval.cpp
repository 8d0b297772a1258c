#include "data/jinja_eval.h"

#include <ctime>
#include <unordered_map>

#include "core/error.h"
#include "data/jinja_builtins.h"
#include "data/jinja_lexer.h"
#include "data/jinja_strings.h"

namespace primus::data::jinja {
namespace {

using K = Value::Kind;

struct Scope {
  Scope* parent = nullptr;
  std::unordered_map<std::string, Value> vars;

  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

enum class Flow { Normal, Break, Continue };

// The text being written: the template's output, with nested buffers for what `set` blocks and
// macros capture. Every byte counts against the one limit.
class Output {
 public:
  explicit Output(size_t limit) : limit_(limit), buffers_(1) {}
  void write(const std::string& s) {
    total_ += s.size();
    if (total_ > limit_) fail("the rendered text would exceed {} bytes", limit_);
    buffers_.back() += s;
  }
  void push() { buffers_.emplace_back(); }
  std::string pop() {
    std::string s = std::move(buffers_.back());
    buffers_.pop_back();
    total_ -= s.size();
    return s;
  }
  bool capturing() const { return buffers_.size() > 1; }
  size_t size() const { return buffers_[0].size(); }
  std::string take() { return std::move(buffers_[0]); }

 private:
  size_t limit_;
  size_t total_ = 0;
  std::vector<std::string> buffers_;
};

class Interpreter {
 public:
  Interpreter(const std::string& source, const ChatTemplateLimits& limits)
      : source_(source), limits_(limits), out_(limits.max_output_bytes) {
    ctx_.max_value_bytes = limits.max_output_bytes;
    ctx_.filter = [this](std::string_view f, const Value& v, const CallArgs& a) { return apply_filter(f, v, a, ctx_); };
    ctx_.test = [this](std::string_view t, const Value& v, const CallArgs& a) { return apply_test(t, v, a, ctx_); };
  }

  Rendered run(const Body& body, const Value& globals) {
    Scope root;
    root_ = &root;
    add_builtins(root);
    for (const auto& [k, v] : globals.dict().entries()) root.vars[k] = v;
    const Flow flow = exec_body(body, root);
    if (flow != Flow::Normal) fail("chat template: {{% break %}} or {{% continue %}} outside a for loop");
    return Rendered{out_.take(), std::move(spans_)};
  }

 private:
  const std::string& source_;
  ChatTemplateLimits limits_;
  Output out_;
  BuiltinContext ctx_;
  Scope* root_ = nullptr;
  int64_t steps_ = 0;
  int call_depth_ = 0;
  std::vector<std::pair<size_t, size_t>> spans_;

  [[noreturn]] void error_at(size_t offset, const std::string& what) const {
    throw TemplateError(fmt::format("chat template: {}: {}", source_position(source_, offset), what));
  }

  void step(size_t offset) {
    if (++steps_ > limits_.max_steps)
      error_at(offset,
               fmt::format("rendering takes more than {} steps (a loop that does not end?)", limits_.max_steps));
  }

  // ---- built-in functions ----

  void add_builtins(Scope& root) {
    root.vars["range"] = Value::callable("range", [](const CallArgs& a) { return range(a); });
    root.vars["namespace"] = Value::callable("namespace", [](const CallArgs& a) { return make_dict(a, true); });
    root.vars["dict"] = Value::callable("dict", [](const CallArgs& a) { return make_dict(a, false); });
    root.vars["raise_exception"] = Value::callable("raise_exception", [](const CallArgs& a) -> Value {
      BoundArgs b("raise_exception", a, {"message"});
      fail("the template raised an error: {}", to_str(b[0]));
    });
    root.vars["strftime_now"] = Value::callable("strftime_now", [](const CallArgs& a) {
      BoundArgs b("strftime_now", a, {"format"});
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof buf, b.str(0, "format").c_str(), &tm);
      return Value(std::string(buf, n));
    });
  }

  static Value range(const CallArgs& a) {
    BoundArgs b("range", a, {"start", "stop", "step"});
    int64_t start = 0, stop = b.integer(0, "stop"), stride = 1;
    if (b.given(1)) {
      start = stop;
      stop = b.integer(1, "stop");
    }
    if (b.given(2)) stride = b.integer(2, "step");
    if (stride == 0) fail("range() arg 3 must not be zero");
    const int64_t n = stride > 0 ? (stop > start ? (stop - start + stride - 1) / stride : 0)
                                 : (start > stop ? (start - stop - stride - 1) / -stride : 0);
    constexpr int64_t kMaxRange = 100000;  // Jinja's sandbox refuses larger ranges too
    if (n > kMaxRange) fail("range() of {} items; the sandbox allows at most {}", n, kMaxRange);
    std::vector<Value> items;
    for (int64_t i = 0; i < n; ++i) items.emplace_back(start + i * stride);
    return Value::list(std::move(items));
  }

  static Value make_dict(const CallArgs& a, bool is_namespace) {
    auto d = std::make_shared<Dict>();
    d->namespace_object = is_namespace;
    if (a.positional.size() > 1) fail("{} takes at most one positional argument", is_namespace ? "namespace" : "dict");
    if (!a.positional.empty()) {
      const Value& init = a.positional[0];
      if (!init.is_dict()) fail("{}: the positional argument must be a dict", is_namespace ? "namespace" : "dict");
      for (const auto& [k, v] : init.dict().entries()) d->set(k, v);
    }
    for (const auto& [k, v] : a.named) d->set(k, v);
    return Value::dict(std::move(d));
  }

  // ---- statements ----

  Flow exec_body(const Body& body, Scope& scope) {
    for (const StmtPtr& s : body) {
      const Flow f = exec(*s, scope);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec(const Stmt& s, Scope& scope) {
    step(s.offset);
    switch (s.kind) {
      case StmtKind::Text: write(s.text, s.offset); return Flow::Normal;
      case StmtKind::Output: write(to_str(eval(*s.expr, scope)), s.offset); return Flow::Normal;
      case StmtKind::If: return exec_if(s, scope);
      case StmtKind::For: return exec_for(s, scope);
      case StmtKind::Set: exec_set(s, scope); return Flow::Normal;
      case StmtKind::SetBlock: {
        out_.push();
        const Flow f = exec_body(s.bodies[0], scope);
        scope.vars[s.targets[0]] = Value(out_.pop());
        return f;
      }
      case StmtKind::Macro: define_macro(s, scope); return Flow::Normal;
      case StmtKind::Break: return Flow::Break;
      case StmtKind::Continue: return Flow::Continue;
      case StmtKind::Generation: return exec_generation(s, scope);
    }
    return Flow::Normal;
  }

  void write(const std::string& text, size_t offset) {
    try {
      out_.write(text);
    } catch (const TemplateError&) {
      throw;
    } catch (const Error& e) {
      error_at(offset, e.what());
    }
  }

  Flow exec_if(const Stmt& s, Scope& scope) {
    for (size_t i = 0; i < s.conditions.size(); ++i)
      if (eval(*s.conditions[i], scope).truthy()) return exec_body(s.bodies[i], scope);
    return exec_body(s.else_body, scope);
  }

  void bind_targets(const std::vector<std::string>& targets, const Value& v, Scope& scope, size_t offset) {
    if (targets.size() == 1) {
      scope.vars[targets[0]] = v;
      return;
    }
    if (!v.is_list() && !v.is_string() && !v.is_dict())
      error_at(offset, fmt::format("cannot unpack a {}", v.type_name()));
    const std::vector<Value> items = guarded([&] { return iterate(v); }, offset);
    if (items.size() != targets.size())
      error_at(offset, fmt::format("cannot unpack {} values into {} names", items.size(), targets.size()));
    for (size_t i = 0; i < items.size(); ++i) scope.vars[targets[i]] = items[i];
  }

  std::vector<Value> loop_items(const Stmt& s, Scope& scope) {
    const Value seq = eval(*s.expr, scope);
    std::vector<Value> items = guarded([&] { return iterate(seq); }, s.expr->offset);
    if (!s.filter) return items;
    std::vector<Value> kept;
    for (const Value& item : items) {
      step(s.offset);
      Scope probe{&scope, {}};
      bind_targets(s.targets, item, probe, s.offset);
      if (eval(*s.filter, probe).truthy()) kept.push_back(item);
    }
    return kept;
  }

  static Value loop_object(const std::vector<Value>& items, size_t i) {
    auto d = std::make_shared<Dict>();
    const int64_t n = int64_t(items.size()), k = int64_t(i);
    d->set("index", Value(k + 1));
    d->set("index0", Value(k));
    d->set("revindex", Value(n - k));
    d->set("revindex0", Value(n - k - 1));
    d->set("first", Value(k == 0));
    d->set("last", Value(k == n - 1));
    d->set("length", Value(n));
    d->set("depth", Value(int64_t(1)));
    d->set("depth0", Value(int64_t(0)));
    d->set("previtem", k > 0 ? items[i - 1] : Value::undefined("previtem"));
    d->set("nextitem", k + 1 < n ? items[i + 1] : Value::undefined("nextitem"));
    return Value::dict(std::move(d));
  }

  Flow exec_for(const Stmt& s, Scope& scope) {
    const std::vector<Value> items = loop_items(s, scope);
    for (size_t i = 0; i < items.size(); ++i) {
      step(s.offset);
      Scope iteration{&scope, {}};
      bind_targets(s.targets, items[i], iteration, s.offset);
      iteration.vars["loop"] = loop_object(items, i);
      if (exec_body(s.bodies[0], iteration) == Flow::Break) break;
    }
    if (!items.empty()) return Flow::Normal;
    Scope otherwise{&scope, {}};
    return exec_body(s.else_body, otherwise);
  }

  void exec_set(const Stmt& s, Scope& scope) {
    Value v = eval(*s.expr, scope);
    if (s.text.empty()) return bind_targets(s.targets, v, scope, s.offset);
    const Value* ns = scope.find(s.targets[0]);
    if (!ns || !ns->is_dict() || !ns->dict().namespace_object)
      error_at(s.offset,
               fmt::format("cannot assign attribute '{}' on '{}', which is not a namespace()", s.text, s.targets[0]));
    guarded(
        [&] {
          ns->mutable_dict().set(s.text, std::move(v));
          return 0;
        },
        s.offset);
  }

  Flow exec_generation(const Stmt& s, Scope& scope) {
    if (out_.capturing()) error_at(s.offset, "{% generation %} inside a macro or a {% set %} block is not supported");
    const size_t begin = out_.size();
    const Flow f = exec_body(s.bodies[0], scope);
    spans_.emplace_back(begin, out_.size());
    return f;
  }

  void define_macro(const Stmt& s, Scope& scope) {
    const Stmt* macro = &s;
    scope.vars[s.targets[0]] = Value::callable(s.targets[0],
                                               [this, macro](const CallArgs& a) { return call_macro(*macro, a); });
  }

  Value call_macro(const Stmt& m, const CallArgs& a) {
    if (++call_depth_ > limits_.max_call_depth)
      error_at(m.offset, fmt::format("macros call each other more than {} deep", limits_.max_call_depth));
    if (a.positional.size() > m.params.size())
      fail("macro '{}' takes not more than {} argument(s)", m.targets[0], m.params.size());
    Scope frame{root_, {}};
    for (size_t i = 0; i < m.params.size(); ++i) {
      const Param& p = m.params[i];
      if (i < a.positional.size())
        frame.vars[p.name] = a.positional[i];
      else
        frame.vars[p.name] = p.default_value ? eval(*p.default_value, frame) : Value::undefined(p.name);
    }
    for (const auto& [name, v] : a.named) {
      const std::string& named = name;  // (clang 14 captures no structured binding)
      if (std::none_of(m.params.begin(), m.params.end(), [&](const Param& p) { return p.name == named; }))
        fail("macro '{}' has no argument named '{}'", m.targets[0], name);
      frame.vars[name] = v;
    }
    out_.push();
    exec_body(m.bodies[0], frame);
    --call_depth_;
    return Value(out_.pop());
  }

  // ---- expressions ----

  // Runs f, giving a primus::Error from the value code the position of the expression at `offset`.
  template <typename F>
  auto guarded(F&& f, size_t offset) -> decltype(f()) {
    try {
      return f();
    } catch (const TemplateError&) {
      throw;
    } catch (const Error& e) {
      error_at(offset, e.what());
    }
  }

  Value eval(const Expr& e, Scope& scope) {
    return guarded([&] { return eval_node(e, scope); }, e.offset);
  }

  Value eval_node(const Expr& e, Scope& scope) {
    switch (e.kind) {
      case ExprKind::Literal: return e.value;
      case ExprKind::Name: {
        const Value* v = scope.find(e.name);
        return v ? *v : Value::undefined(e.name);
      }
      case ExprKind::List:
      case ExprKind::Tuple: return Value::list(eval_all(e.items, scope), e.kind == ExprKind::Tuple);
      case ExprKind::Dict: return eval_dict(e, scope);
      case ExprKind::Attr: return attribute(eval(*e.object, scope), e.name);
      case ExprKind::Item: return item(eval(*e.object, scope), eval(*e.items[0], scope));
      case ExprKind::Slice: return slice(e, scope);
      case ExprKind::Call: return call(e, scope);
      case ExprKind::Filter: return apply_filter(e.name, eval(*e.object, scope), eval_args(e.args, scope), ctx_);
      case ExprKind::Test: {
        const bool r = apply_test(e.name, eval(*e.object, scope), eval_args(e.args, scope), ctx_);
        return Value(r != e.negated);
      }
      case ExprKind::Neg:
      case ExprKind::Pos: return unary(e, scope);
      case ExprKind::Not: return Value(!eval(*e.object, scope).truthy());
      case ExprKind::Binary: return binary(e, scope);
      case ExprKind::Compare: return compare(e, scope);
      case ExprKind::Cond:
        if (eval(*e.items[1], scope).truthy()) return eval(*e.items[0], scope);
        return e.items[2] ? eval(*e.items[2], scope) : Value::undefined("else");
    }
    return Value();
  }

  std::vector<Value> eval_all(const std::vector<ExprPtr>& exprs, Scope& scope) {
    std::vector<Value> out;
    for (const ExprPtr& x : exprs) out.push_back(eval(*x, scope));
    return out;
  }

  CallArgs eval_args(const std::vector<Arg>& args, Scope& scope) {
    CallArgs a;
    for (const Arg& x : args) {
      if (x.name.empty())
        a.positional.push_back(eval(*x.value, scope));
      else
        a.named.emplace_back(x.name, eval(*x.value, scope));
    }
    return a;
  }

  Value eval_dict(const Expr& e, Scope& scope) {
    auto d = std::make_shared<Dict>();
    for (size_t i = 0; i < e.keys.size(); ++i) {
      const Value k = eval(*e.keys[i], scope);
      if (!k.is_string()) fail("dict keys must be strings in chat templates, not {}", k.type_name());
      d->set(k.str(), eval(*e.items[i], scope));
    }
    return Value::dict(std::move(d));
  }

  // Jinja's getattr: an attribute (a method of str or dict, a namespace's field), else the item.
  Value attribute(const Value& obj, const std::string& name) {
    if (obj.is_undefined()) fail("'{}' is undefined", obj.undefined_name());
    Value m = method_of(obj, name, ctx_);
    if (!m.is_undefined()) return m;
    if (obj.is_dict()) {
      const Value* v = obj.dict().find(name);
      return v ? *v : Value::undefined(name);
    }
    return Value::undefined(name);
  }

  // Jinja's getitem: the item, else the attribute; a missing one is undefined.
  Value item(const Value& obj, const Value& key) {
    if (obj.is_undefined()) fail("'{}' is undefined", obj.undefined_name());
    if (obj.is_dict() && !obj.dict().namespace_object && key.is_string()) {
      if (const Value* v = obj.dict().find(key.str())) return *v;
    }
    if ((obj.is_list() || obj.is_string()) && (key.kind() == K::Int || key.kind() == K::Bool)) {
      const std::vector<Value> items = obj.is_list() ? obj.list().items : iterate(obj);
      int64_t i = key.as_int();
      if (i < 0) i += int64_t(items.size());
      if (i >= 0 && i < int64_t(items.size())) return items[size_t(i)];
      return Value::undefined(to_str(key));
    }
    if (key.is_string()) return attribute(obj, key.str());
    return Value::undefined(to_str(key));
  }

  Value slice(const Expr& e, Scope& scope) {
    const Value obj = eval(*e.object, scope);
    auto bound = [&](const ExprPtr& x) -> std::optional<int64_t> {
      if (!x) return std::nullopt;
      const Value v = eval(*x, scope);
      if (v.is_none()) return std::nullopt;
      if (v.kind() != K::Int && v.kind() != K::Bool)
        fail("slice indices must be integers or None, not {}", v.type_name());
      return v.as_int();
    };
    const auto start = bound(e.items[0]), stop = bound(e.items[1]), stride = bound(e.items[2]);
    if (obj.is_undefined()) fail("'{}' is undefined", obj.undefined_name());
    if (!obj.is_list() && !obj.is_string()) fail("a {} cannot be sliced", obj.type_name());
    const std::vector<Value> items = obj.is_list() ? obj.list().items : iterate(obj);
    const std::vector<Value> picked = python_slice(items, start, stop, stride.value_or(1));
    if (obj.is_list()) return Value::list(picked, obj.list().tuple);
    std::string s;
    for (const Value& c : picked) s += c.str();
    return Value(std::move(s));
  }

  static std::vector<Value> python_slice(const std::vector<Value>& items, std::optional<int64_t> start,
                                         std::optional<int64_t> stop, int64_t stride) {
    if (stride == 0) fail("slice step cannot be zero");
    const int64_t n = int64_t(items.size());
    auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
      if (!v) return dflt;
      int64_t x = *v < 0 ? *v + n : *v;
      return stride > 0 ? std::clamp<int64_t>(x, 0, n) : std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t b = clamp(start, stride > 0 ? 0 : n - 1), e = clamp(stop, stride > 0 ? n : -1);
    std::vector<Value> out;
    for (int64_t i = b; stride > 0 ? i < e : i > e; i += stride) out.push_back(items[size_t(i)]);
    return out;
  }

  Value call(const Expr& e, Scope& scope) {
    const Value callee = eval(*e.object, scope);
    const CallArgs args = eval_args(e.args, scope);
    step(e.offset);
    if (callee.kind() == K::Callable) return callee.callable().call(args);
    if (callee.is_undefined()) fail("'{}' is undefined", callee.undefined_name());
    fail("'{}' object is not callable", callee.type_name());
  }

  Value unary(const Expr& e, Scope& scope) {
    const Value v = eval(*e.object, scope);
    if (!v.is_number()) fail("bad operand type for unary {}: '{}'", e.kind == ExprKind::Neg ? '-' : '+', v.type_name());
    if (e.kind == ExprKind::Pos) return v.kind() == K::Bool ? Value(v.as_int()) : v;
    if (v.kind() == K::Float) return Value(-v.as_double());
    if (v.as_int() == INT64_MIN) fail("integer overflow in unary -");
    return Value(-v.as_int());
  }

  Value binary(const Expr& e, Scope& scope) {
    const std::string& op = e.name;
    if (op == "and") {
      Value l = eval(*e.items[0], scope);
      return l.truthy() ? eval(*e.items[1], scope) : l;
    }
    if (op == "or") {
      Value l = eval(*e.items[0], scope);
      return l.truthy() ? l : eval(*e.items[1], scope);
    }
    const Value l = eval(*e.items[0], scope), r = eval(*e.items[1], scope);
    if (op == "~") {
      std::string s = to_str(l) + to_str(r);
      if (s.size() > limits_.max_output_bytes) fail("~ makes a string larger than {} bytes", limits_.max_output_bytes);
      return Value(std::move(s));
    }
    if (l.is_undefined()) fail("'{}' is undefined", l.undefined_name());
    if (r.is_undefined()) fail("'{}' is undefined", r.undefined_name());
    return binary_op(op, l, r, ctx_);
  }

  Value compare(const Expr& e, Scope& scope) {
    Value left = eval(*e.items[0], scope);
    for (size_t i = 0; i < e.ops.size(); ++i) {
      Value right = eval(*e.items[i + 1], scope);
      const std::string& op = e.ops[i];
      bool r;
      if (op == "==")
        r = equal(left, right);
      else if (op == "!=")
        r = !equal(left, right);
      else if (op == "<")
        r = less_than(left, right);
      else if (op == ">")
        r = less_than(right, left);
      else if (op == "<=")
        r = !less_than(right, left);
      else if (op == ">=")
        r = !less_than(left, right);
      else if (op == "in")
        r = contains(right, left);
      else
        r = !contains(right, left);  // notin
      if (!r) return Value(false);
      left = std::move(right);
    }
    return Value(true);
  }
};

}  // namespace

Rendered evaluate(const std::string& source, const Body& body, const Value& globals, const ChatTemplateLimits& limits) {
  Interpreter interpreter(source, limits);
  try {
    return interpreter.run(body, globals);
  } catch (const TemplateError&) {
    throw;
  } catch (const Error& e) {
    throw TemplateError(fmt::format("chat template: {}", e.what()));
  }
}

}  // namespace primus::data::jinja
