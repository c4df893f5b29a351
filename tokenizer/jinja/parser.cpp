// Jinja2's parser for the statements chat templates use: for (with else, an `if` filter, loop controls), if /
// elif / else, set (names, tuples, namespace attributes, blocks), macro, raw, and transformers' generation.
// Expressions follow Jinja2's precedence, loosest first:
//   a if c else b  <  or  <  and  <  not  <  == != < <= > >= in, not in  <  + -  <  ~  <  * / // %  <  **
//   <  unary - +  <  primary with .attr [item] [a:b:c] (call) | filter  is test
// Anything else (include, extends, import, block, call, filter blocks, with, ...) is an Error naming it.
#include <algorithm>

#include "tokenizer/error.h"
#include "tokenizer/jinja/ast.h"

namespace tokenizer::jinja {
namespace {

using K = Token::Kind;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body parse_template() {
    std::string end;
    Body body = parse_body({}, end);
    return body;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().kind == K::Op && cur().text == op; }
  bool is_name(const char* name) const { return cur().kind == K::Name && cur().text == name; }
  bool skip_op(const char* op) { return is_op(op) ? (++i_, true) : false; }
  bool skip_name(const char* name) { return is_name(name) ? (++i_, true) : false; }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error("chat template line " + std::to_string(cur().line) + ": " + what);
  }
  std::string describe() const {
    switch (cur().kind) {
      case K::End: return "end of template";
      case K::VarEnd: return "'}}'";
      case K::BlockEnd: return "'%}'";
      case K::Text: return "text";
      default: return "'" + cur().text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(std::string("expected '") + op + "', got " + describe());
  }
  void expect(K kind, const char* what) {
    if (cur().kind != kind) fail(std::string("expected ") + what + ", got " + describe());
    ++i_;
  }
  std::string expect_name() {
    if (cur().kind != K::Name) fail("expected a name, got " + describe());
    return t_[i_++].text;
  }

  // Statements until one of `ends` opens a block tag; `found` names it (the tag's rest is the caller's).
  Body parse_body(const std::vector<std::string>& ends, std::string& found) {
    Body body;
    for (;;) {
      const Token& tok = cur();
      if (tok.kind == K::End) {
        if (!ends.empty()) fail("missing {% " + ends.back() + " %}");
        return body;
      }
      if (tok.kind == K::Text) {
        auto s = std::make_shared<Stmt>();
        s->kind = Stmt::Kind::Text;
        s->text = tok.text;
        body.push_back(s);
        ++i_;
      } else if (tok.kind == K::VarBegin) {
        ++i_;
        auto s = std::make_shared<Stmt>();
        s->kind = Stmt::Kind::Output;
        s->line = tok.line;
        s->expr = parse_tuple();
        expect(K::VarEnd, "'}}'");
        body.push_back(s);
      } else if (tok.kind == K::BlockBegin) {
        ++i_;
        const std::string name = cur().kind == K::Name ? cur().text : "";
        if (std::find(ends.begin(), ends.end(), name) != ends.end()) {
          ++i_;
          found = name;
          return body;
        }
        body.push_back(parse_statement());
      } else {
        fail("unexpected " + describe());
      }
    }
  }

  StmtPtr parse_statement() {
    auto s = std::make_shared<Stmt>();
    s->line = cur().line;
    const std::string tag = expect_name();
    std::string found;
    if (tag == "for") {
      s->kind = Stmt::Kind::For;
      do s->targets.push_back(expect_name()); while (skip_op(","));
      if (!skip_name("in")) fail("expected 'in' in for, got " + describe());
      s->expr = parse_tuple(/*with_condexpr=*/false);
      if (skip_name("if")) s->filter = parse_expression();
      if (is_name("recursive")) fail("template construct 'for ... recursive' is not supported");
      expect(K::BlockEnd, "'%}'");
      s->bodies.push_back(parse_body({"endfor", "else"}, found));
      if (found == "else") {
        expect(K::BlockEnd, "'%}'");
        s->bodies.push_back(parse_body({"endfor"}, found));
      }
    } else if (tag == "if") {
      s->kind = Stmt::Kind::If;
      s->conditions.push_back(parse_tuple());
      for (;;) {
        expect(K::BlockEnd, "'%}'");
        s->bodies.push_back(parse_body({"elif", "else", "endif"}, found));
        if (found == "elif") {
          s->conditions.push_back(parse_tuple());
        } else if (found == "else") {
          expect(K::BlockEnd, "'%}'");
          s->bodies.push_back(parse_body({"endif"}, found));
          break;
        } else {
          break;
        }
      }
    } else if (tag == "set") {
      s->kind = Stmt::Kind::Set;
      std::string target = expect_name();
      if (skip_op(".")) target += "." + expect_name();
      s->targets.push_back(target);
      while (skip_op(",")) s->targets.push_back(expect_name());
      if (skip_op("=")) {
        s->expr = parse_tuple();
      } else {
        if (s->targets.size() != 1) fail("expected '=' in set");
        if (is_op("|")) fail("template construct 'set ... | filter' block is not supported");
        expect(K::BlockEnd, "'%}'");
        s->bodies.push_back(parse_body({"endset"}, found));
      }
    } else if (tag == "macro") {
      s->kind = Stmt::Kind::Macro;
      s->text = expect_name();
      expect_op("(");
      while (!skip_op(")")) {
        if (!s->targets.empty()) expect_op(",");
        if (skip_op(")")) break;
        s->targets.push_back(expect_name());
        s->conditions.push_back(skip_op("=") ? parse_expression() : nullptr);
      }
      expect(K::BlockEnd, "'%}'");
      s->bodies.push_back(parse_body({"endmacro"}, found));
    } else if (tag == "break" || tag == "continue") {
      s->kind = tag == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue;
    } else if (tag == "generation") {
      s->kind = Stmt::Kind::Generation;
      expect(K::BlockEnd, "'%}'");
      s->bodies.push_back(parse_body({"endgeneration"}, found));
    } else if (tag.rfind("end", 0) == 0 || tag == "else" || tag == "elif") {
      fail("unexpected '{% " + tag + " %}'");
    } else {
      fail("template construct '{% " + tag + " %}' is not supported");
    }
    expect(K::BlockEnd, "'%}'");
    return s;
  }

  ExprPtr node(Expr::Kind kind, std::vector<ExprPtr> args = {}, std::string name = "") {
    auto e = std::make_shared<Expr>();
    e->kind = kind;
    e->args = std::move(args);
    e->name = std::move(name);
    e->line = cur().line;
    return e;
  }

  // expr (',' expr)*: a tuple when there is a comma.
  ExprPtr parse_tuple(bool with_condexpr = true) {
    std::vector<ExprPtr> items{with_condexpr ? parse_expression() : parse_or()};
    if (!is_op(",")) return items[0];
    while (skip_op(",")) {
      if (cur().kind == K::VarEnd || cur().kind == K::BlockEnd || is_op(")") || is_name("if")) break;
      items.push_back(with_condexpr ? parse_expression() : parse_or());
    }
    auto e = node(Expr::Kind::List, std::move(items));
    e->tuple = true;
    return e;
  }

  ExprPtr parse_expression() {
    ExprPtr expr = parse_or();
    while (skip_name("if")) {
      ExprPtr cond = parse_or();
      ExprPtr otherwise = skip_name("else") ? parse_expression() : nullptr;
      expr = node(Expr::Kind::Cond, {cond, expr, otherwise});
    }
    return expr;
  }
  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (skip_name("or")) left = node(Expr::Kind::Binary, {left, parse_and()}, "or");
    return left;
  }
  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (skip_name("and")) left = node(Expr::Kind::Binary, {left, parse_not()}, "and");
    return left;
  }
  ExprPtr parse_not() {
    if (skip_name("not")) return node(Expr::Kind::Unary, {parse_not()}, "not");
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr left = parse_math1();
    ExprPtr result;
    for (;;) {
      std::string op;
      if (cur().kind == K::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                  cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        op = t_[i_++].text;
      } else if (skip_name("in")) {
        op = "in";
      } else if (is_name("not") && peek().kind == K::Name && peek().text == "in") {
        i_ += 2;
        op = "not in";
      } else {
        break;
      }
      ExprPtr right = parse_math1();
      ExprPtr cmp = node(Expr::Kind::Binary, {left, right}, op);
      result = result ? node(Expr::Kind::Binary, {result, cmp}, "and") : cmp;  // a < b < c: a < b and b < c
      left = right;
    }
    return result ? result : left;
  }
  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = t_[i_++].text;
      left = node(Expr::Kind::Binary, {left, parse_concat()}, op);
    }
    return left;
  }
  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (skip_op("~")) left = node(Expr::Kind::Binary, {left, parse_math2()}, "~");
    return left;
  }
  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = t_[i_++].text;
      left = node(Expr::Kind::Binary, {left, parse_pow()}, op);
    }
    return left;
  }
  ExprPtr parse_pow() {
    ExprPtr left = parse_unary();
    while (skip_op("**")) left = node(Expr::Kind::Binary, {left, parse_unary()}, "**");
    return left;
  }
  ExprPtr parse_unary(bool with_filter = true) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const std::string op = t_[i_++].text;
      e = node(Expr::Kind::Unary, {parse_unary(false)}, op);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(e);
    return with_filter ? parse_filters(e) : e;
  }

  ExprPtr literal(Value v) {
    auto e = node(Expr::Kind::Literal);
    e->value = std::move(v);
    return e;
  }

  ExprPtr parse_primary() {
    const Token tok = cur();
    if (tok.kind == K::Name) {
      ++i_;
      if (tok.text == "true" || tok.text == "True") return literal(Value(true));
      if (tok.text == "false" || tok.text == "False") return literal(Value(false));
      if (tok.text == "none" || tok.text == "None") return literal(Value::none());
      return node(Expr::Kind::Name, {}, tok.text);
    }
    if (tok.kind == K::String) {
      std::string s;
      while (cur().kind == K::String) s += t_[i_++].text;  // adjacent literals join
      return literal(Value(s));
    }
    if (tok.kind == K::Int) { ++i_; return literal(Value(tok.int_value)); }
    if (tok.kind == K::Float) { ++i_; return literal(Value(tok.float_value)); }
    if (skip_op("(")) {
      if (skip_op(")")) { auto e = node(Expr::Kind::List); e->tuple = true; return e; }
      ExprPtr e = parse_tuple();
      expect_op(")");
      return e;
    }
    if (skip_op("[")) {
      std::vector<ExprPtr> items;
      while (!skip_op("]")) {
        if (!items.empty()) expect_op(",");
        if (skip_op("]")) break;
        items.push_back(parse_expression());
      }
      return node(Expr::Kind::List, std::move(items));
    }
    if (skip_op("{")) {
      std::vector<ExprPtr> items;
      while (!skip_op("}")) {
        if (!items.empty()) expect_op(",");
        if (skip_op("}")) break;
        items.push_back(parse_expression());
        expect_op(":");
        items.push_back(parse_expression());
      }
      return node(Expr::Kind::Dict, std::move(items));
    }
    fail("unexpected " + describe() + " in an expression");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      if (skip_op(".")) {
        if (cur().kind == K::Int) {
          e = node(Expr::Kind::Item, {e, literal(Value(t_[i_++].int_value))});
        } else {
          e = node(Expr::Kind::Attr, {e}, expect_name());
        }
      } else if (skip_op("[")) {
        e = parse_subscript(e);
      } else if (is_op("(")) {
        e = parse_call(e);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target) {
    ExprPtr first = is_op(":") ? nullptr : parse_expression();
    if (!is_op(":")) {
      expect_op("]");
      return node(Expr::Kind::Item, {target, first});
    }
    std::vector<ExprPtr> parts;
    parts.reserve(4);
    parts.push_back(target);
    parts.push_back(first);
    for (int k = 0; k < 2; ++k) {
      if (!skip_op(":")) { parts.push_back(nullptr); continue; }
      parts.push_back(is_op(":") || is_op("]") ? nullptr : parse_expression());
    }
    expect_op("]");
    return node(Expr::Kind::Slice, std::move(parts));
  }

  // '(' args ')' onto `e` (a call, or the arguments of a filter / test node).
  ExprPtr parse_call(ExprPtr e, ExprPtr onto = nullptr) {
    ExprPtr call = onto ? onto : node(Expr::Kind::Call, {e});
    expect_op("(");
    bool first = true;
    while (!skip_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (skip_op(")")) break;
      if (is_op("*") || is_op("**")) fail("template construct '*args' in a call is not supported");
      if (cur().kind == K::Name && peek().kind == K::Op && peek().text == "=") {
        const std::string key = t_[i_].text;
        i_ += 2;
        call->kwargs.emplace_back(key, parse_expression());
      } else {
        if (!call->kwargs.empty()) fail("a positional argument follows a keyword argument");
        call->args.push_back(parse_expression());
      }
    }
    return call;
  }

  ExprPtr parse_filters(ExprPtr e) {
    for (;;) {
      if (skip_op("|")) {
        std::string name = expect_name();
        while (skip_op(".")) name += "." + expect_name();
        auto f = node(Expr::Kind::Filter, {e}, name);
        e = is_op("(") ? parse_call(e, f) : f;
      } else if (skip_name("is")) {
        auto t = node(Expr::Kind::Test, {e});
        t->negated = skip_name("not");
        t->name = expect_name();
        while (skip_op(".")) t->name += "." + expect_name();
        if (is_op("(")) {
          parse_call(e, t);
        } else if ((cur().kind == K::Name || cur().kind == K::String || cur().kind == K::Int ||
                    cur().kind == K::Float || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) fail("you cannot chain multiple tests with 'is'");
          t->args.push_back(parse_postfix(parse_primary()));
        }
        e = t;
      } else if (is_op("(")) {
        e = parse_call(e);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
};

}  // namespace

Body parse(const std::string& source) { return Parser(lex(source)).parse_template(); }

}  // namespace tokenizer::jinja
