// Rendering: statements write to the output, expressions evaluate with Python's semantics (value.h).
// Scopes are Jinja2's: each for-loop iteration and each macro call opens a scope whose assignments vanish
// with it (hence namespace()); if-blocks do not. `loop` is Jinja2's loop object.
#include <cmath>
#include <unordered_map>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/template.h"

namespace tokenizer::jinja {
namespace {

struct Scope {
  Scope* parent = nullptr;
  std::unordered_map<std::string, Value> vars;
  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent) {
      if (auto it = s->vars.find(name); it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

enum class Flow { Normal, Break, Continue };

[[noreturn]] void fail(int line, const std::string& what) {
  throw Error("chat template line " + std::to_string(line) + ": " + what);
}

int64_t floor_div(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

class Renderer {
 public:
  Renderer(Scope* root) : root_(root) {}

  Flow exec(const Body& body, Scope& scope, std::string& out) {
    for (const auto& s : body) {
      const Flow f = exec(*s, scope, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

 private:
  Flow exec(const Stmt& s, Scope& scope, std::string& out) {
    switch (s.kind) {
      case Stmt::Kind::Text: out += s.text; return Flow::Normal;
      case Stmt::Kind::Output: out += eval(*s.expr, scope).str(); return Flow::Normal;
      case Stmt::Kind::If:
        for (size_t i = 0; i < s.conditions.size(); ++i) {
          if (eval(*s.conditions[i], scope).truthy()) return exec(s.bodies[i], scope, out);
        }
        return s.bodies.size() > s.conditions.size() ? exec(s.bodies.back(), scope, out) : Flow::Normal;
      case Stmt::Kind::For: run_for(s, scope, out); return Flow::Normal;
      case Stmt::Kind::Set: {
        Value v;
        if (s.expr) {
          v = eval(*s.expr, scope);
        } else {
          std::string captured;
          exec(s.bodies[0], scope, captured);
          v = Value(captured);
        }
        assign(s, std::move(v), scope);
        return Flow::Normal;
      }
      case Stmt::Kind::Macro: define_macro(s, scope); return Flow::Normal;
      case Stmt::Kind::Break: return Flow::Break;
      case Stmt::Kind::Continue: return Flow::Continue;
      case Stmt::Kind::Generation: return exec(s.bodies[0], scope, out);
    }
    return Flow::Normal;
  }

  void bind(const std::vector<std::string>& targets, const Value& v, Scope& scope, int line) {
    if (targets.size() == 1) {
      scope.vars[targets[0]] = v;
      return;
    }
    const List items = iterate(v);
    if (items.size() != targets.size()) {
      fail(line, "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(targets.size()));
    }
    for (size_t i = 0; i < targets.size(); ++i) scope.vars[targets[i]] = items[i];
  }

  void assign(const Stmt& s, Value v, Scope& scope) {
    const std::string& target = s.targets[0];
    const size_t dot = target.find('.');
    if (dot == std::string::npos) return bind(s.targets, v, scope, s.line);
    const Value* ns = scope.find(target.substr(0, dot));
    if (ns == nullptr || !ns->is_namespace()) fail(s.line, "cannot assign attribute on non-namespace object '" + target.substr(0, dot) + "'");
    const std::string attribute = target.substr(dot + 1);
    if (!attribute.empty() && attribute[0] == '_') fail(s.line, "namespace attributes cannot start with '_': " + attribute);
    ns->as_dict().set(attribute, std::move(v));
  }

  void run_for(const Stmt& s, Scope& scope, std::string& out) {
    List items;
    for (auto& item : iterate(eval(*s.expr, scope))) {
      if (s.filter) {
        Scope probe{&scope, {}};
        bind(s.targets, item, probe, s.line);
        if (!eval(*s.filter, probe).truthy()) continue;
      }
      items.push_back(std::move(item));
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      Scope iteration{&scope, {}};
      Dict loop;
      loop.set("index0", Value(i));
      loop.set("index", Value(i + 1));
      loop.set("revindex0", Value(n - i - 1));
      loop.set("revindex", Value(n - i));
      loop.set("first", Value(i == 0));
      loop.set("last", Value(i == n - 1));
      loop.set("length", Value(n));
      loop.set("depth", Value(int64_t{1}));
      loop.set("depth0", Value(int64_t{0}));
      if (i > 0) loop.set("previtem", items[static_cast<size_t>(i - 1)]);
      if (i + 1 < n) loop.set("nextitem", items[static_cast<size_t>(i + 1)]);
      loop.set("cycle", Value([i](Args& a) {
                 if (a.positional.empty()) throw Error("chat template: loop.cycle needs at least one item");
                 return a.positional[static_cast<size_t>(i) % a.positional.size()];
               }, "loop.cycle"));
      iteration.vars["loop"] = Value(std::move(loop));
      bind(s.targets, items[static_cast<size_t>(i)], iteration, s.line);
      if (exec(s.bodies[0], iteration, out) == Flow::Break) break;
    }
    if (n == 0 && s.bodies.size() > 1) exec(s.bodies[1], scope, out);
  }

  void define_macro(const Stmt& s, Scope& scope) {
    const Stmt* macro = &s;
    Renderer* self = this;
    scope.vars[s.text] = Value([macro, self](Args& a) {
      Scope call{self->root_, {}};
      if (a.positional.size() > macro->targets.size()) fail(macro->line, "macro '" + macro->text + "' takes " +
                                                            std::to_string(macro->targets.size()) + " arguments");
      for (size_t i = 0; i < macro->targets.size(); ++i) {
        const std::string& p = macro->targets[i];
        if (a.has(i, p)) call.vars[p] = a.get(i, p);
        else call.vars[p] = macro->conditions[i] ? self->eval(*macro->conditions[i], call) : Value::undefined(p);
      }
      for (const auto& kv : a.keyword) {
        if (std::find(macro->targets.begin(), macro->targets.end(), kv.first) == macro->targets.end()) {
          fail(macro->line, "macro '" + macro->text + "' takes no keyword argument '" + kv.first + "'");
        }
      }
      std::string rendered;
      self->exec(macro->bodies[0], call, rendered);
      return Value(rendered);
    }, s.text);
  }

  Args call_args(const Expr& e, size_t first, Scope& scope) {
    Args a;
    for (size_t i = first; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i], scope));
    for (const auto& [key, value] : e.kwargs) a.keyword.emplace_back(key, eval(*value, scope));
    return a;
  }

  std::optional<int64_t> optional_int(const ExprPtr& e, Scope& scope) {
    if (!e) return std::nullopt;
    const Value v = eval(*e, scope);
    if (v.is_none()) return std::nullopt;
    return v.as_int();
  }

 public:
  Value eval(const Expr& e, Scope& scope) {
    switch (e.kind) {
      case Expr::Kind::Literal: return e.value;
      case Expr::Kind::Name: {
        const Value* v = scope.find(e.name);
        return v ? *v : Value::undefined(e.name);
      }
      case Expr::Kind::List: {
        List items;
        for (const auto& a : e.args) items.push_back(eval(*a, scope));
        return Value(std::move(items), e.tuple);
      }
      case Expr::Kind::Dict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value key = eval(*e.args[i], scope);
          if (!key.is_string()) fail(e.line, "dict keys must be strings, got " + key.type_name());
          d.set(key.as_string(), eval(*e.args[i + 1], scope));
        }
        return Value(std::move(d));
      }
      case Expr::Kind::Attr: return get_attr(eval(*e.args[0], scope), e.name);
      case Expr::Kind::Item: return get_item(eval(*e.args[0], scope), eval(*e.args[1], scope));
      case Expr::Kind::Slice:
        return slice(eval(*e.args[0], scope), optional_int(e.args[1], scope), optional_int(e.args[2], scope),
                     optional_int(e.args[3], scope));
      case Expr::Kind::Call: {
        const Value callee = eval(*e.args[0], scope);
        if (callee.is_undefined()) {
          fail(e.line, callee.as_string().find(' ') != std::string::npos ? callee.as_string()
                                                                          : "'" + callee.as_string() + "' is undefined");
        }
        if (!callee.is_callable()) fail(e.line, "'" + callee.type_name() + "' object is not callable");
        Args a = call_args(e, 1, scope);
        a.callee = callee.as_string();
        return callee.as_function()(a);
      }
      case Expr::Kind::Filter: {
        Args a = call_args(e, 1, scope);
        return apply_filter(e.name, eval(*e.args[0], scope), a);
      }
      case Expr::Kind::Test: {
        Args a = call_args(e, 1, scope);
        return Value(apply_test(e.name, eval(*e.args[0], scope), a) != e.negated);
      }
      case Expr::Kind::Unary: {
        const Value v = eval(*e.args[0], scope);
        if (e.name == "not") return Value(!v.truthy());
        if (!v.is_number()) fail(e.line, "bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
        if (e.name == "+") return v;
        return v.type() == Value::Type::Float ? Value(-v.as_float()) : Value(-v.as_int());
      }
      case Expr::Kind::Cond:
        if (eval(*e.args[0], scope).truthy()) return eval(*e.args[1], scope);
        return e.args[2] ? eval(*e.args[2], scope) : Value();
      case Expr::Kind::Binary: return binary(e, scope);
    }
    return Value();
  }

 private:
  Value binary(const Expr& e, Scope& scope) {
    const std::string& op = e.name;
    const Value a = eval(*e.args[0], scope);
    if (op == "and") return a.truthy() ? eval(*e.args[1], scope) : a;
    if (op == "or") return a.truthy() ? a : eval(*e.args[1], scope);
    const Value b = eval(*e.args[1], scope);
    if (op == "~") return Value(a.str() + b.str());
    if (op == "==") return Value(a == b);
    if (op == "!=") return Value(a != b);
    if (op == "<") return Value(less_than(a, b));
    if (op == ">") return Value(less_than(b, a));
    if (op == "<=") return Value(!less_than(b, a));
    if (op == ">=") return Value(!less_than(a, b));
    if (op == "in" || op == "not in") {
      bool found;
      if (b.is_string()) {
        if (!a.is_string()) fail(e.line, "'in <string>' requires string as left operand, not " + a.type_name());
        found = b.as_string().find(a.as_string()) != std::string::npos;
      } else if (b.is_dict()) {
        found = a.is_string() && b.as_dict().find(a.as_string()) != nullptr;
      } else if (b.is_list() || b.is_undefined()) {
        found = false;
        for (const auto& item : iterate(b)) found = found || item == a;
      } else {
        fail(e.line, "argument of type '" + b.type_name() + "' is not iterable");
      }
      return Value(found == (op == "in"));
    }
    if (a.is_undefined() || b.is_undefined()) {
      const Value& u = a.is_undefined() ? a : b;
      fail(e.line, u.as_string().find(' ') != std::string::npos ? u.as_string() : "'" + u.as_string() + "' is undefined");
    }
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
      if (a.is_list() && b.is_list()) {
        List items = a.as_list();
        items.insert(items.end(), b.as_list().begin(), b.as_list().end());
        return Value(std::move(items), a.is_tuple());
      }
    }
    if (op == "*" && (a.is_string() || a.is_list()) && b.type() == Value::Type::Int) {
      if (a.is_string()) {
        std::string s;
        for (int64_t i = 0; i < b.as_int(); ++i) s += a.as_string();
        return Value(s);
      }
      List items;
      for (int64_t i = 0; i < b.as_int(); ++i) items.insert(items.end(), a.as_list().begin(), a.as_list().end());
      return Value(std::move(items), a.is_tuple());
    }
    if (op == "%" && a.is_string()) return Value(percent_format(a.as_string(), b));
    if (!a.is_number() || !b.is_number()) {
      fail(e.line, "unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
    }
    const bool floats = a.type() == Value::Type::Float || b.type() == Value::Type::Float;
    if (op == "/") {
      if (b.as_float() == 0) fail(e.line, "division by zero");
      return Value(a.as_float() / b.as_float());
    }
    if ((op == "//" || op == "%") && b.as_float() == 0) fail(e.line, "integer division or modulo by zero");
    if (floats) {
      const double x = a.as_float(), y = b.as_float();
      if (op == "+") return Value(x + y);
      if (op == "-") return Value(x - y);
      if (op == "*") return Value(x * y);
      if (op == "//") return Value(std::floor(x / y));
      if (op == "%") return Value(x - std::floor(x / y) * y);
      if (op == "**") return Value(std::pow(x, y));
    } else {
      const int64_t x = a.as_int(), y = b.as_int();
      if (op == "+") return Value(x + y);
      if (op == "-") return Value(x - y);
      if (op == "*") return Value(x * y);
      if (op == "//") return Value(floor_div(x, y));
      if (op == "%") return Value(x - floor_div(x, y) * y);
      if (op == "**") {
        if (y < 0) return Value(std::pow(static_cast<double>(x), static_cast<double>(y)));
        int64_t r = 1;
        for (int64_t i = 0; i < y; ++i) r *= x;
        return Value(r);
      }
    }
    fail(e.line, "operator '" + op + "' is not supported");
  }

  Scope* root_;
};

}  // namespace

Template::Template(const std::string& source)
    : body_(std::make_shared<const std::vector<std::shared_ptr<Stmt>>>(parse(source))) {}

std::string Template::render(const nlohmann::ordered_json& context, std::optional<std::time_t> now) const {
  if (!context.is_object()) throw Error("chat template: the render context must be a JSON object");
  return render(Value::from_json(context).as_dict(), now);
}

std::string Template::render(const Dict& context, std::optional<std::time_t> now) const {
  Scope globals;
  for (auto& [name, value] : make_globals(now).items) globals.vars[name] = value;
  Scope root{&globals, {}};
  for (const auto& [name, value] : context.items) root.vars[name] = value;
  Renderer renderer(&root);
  std::string out;
  renderer.exec(*body_, root, out);
  return out;
}

}  // namespace tokenizer::jinja
