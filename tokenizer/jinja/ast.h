// The parsed template: Jinja2's lexer output (lex) and its statement and expression trees (parse).
//
// Whitespace is Jinja2's with transformers' environment (trim_blocks, lstrip_blocks, no trailing newline kept):
// the lexer applies it, so the tree holds the text exactly as it is output.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace tokenizer::jinja {

struct Token {
  enum class Kind { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };
  Kind kind = Kind::End;
  std::string text;  // the text, name, string's value or operator
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

std::vector<Token> lex(const std::string& source);

struct Expr;
using ExprPtr = std::shared_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,  // value
    Name,     // name
    List,     // args (a tuple when tuple)
    Dict,     // args: key, value, key, value, ...
    Attr,     // args[0].name
    Item,     // args[0][args[1]]
    Slice,    // args[0][args[1]:args[2]:args[3]] (null: omitted)
    Call,     // args[0](args[1..], kwargs)
    Filter,   // args[0] | name(args[1..], kwargs)
    Test,     // args[0] is [not] name(args[1..])
    Unary,    // name ("-", "+", "not") args[0]
    Binary,   // args[0] name args[1]: + - * / // % ** ~ == != < <= > >= in "not in" and or
    Cond,     // args[1] if args[0] else args[2] (args[2] null: undefined)
  };
  Kind kind = Kind::Literal;
  Value value;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool tuple = false, negated = false;
  int line = 1;
};

struct Stmt;
using StmtPtr = std::shared_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    Text,        // text
    Output,      // {{ expr }}
    If,          // conditions[i] -> bodies[i]; bodies.back() is the else when bodies.size() > conditions.size()
    For,         // for targets in expr [if cond]: bodies[0], else bodies[1]
    Set,         // set targets = expr (targets: names, or one "ns.attr"); with no expr, bodies[0] captured
    Macro,       // macro name(params = defaults): bodies[0]
    Break,
    Continue,
    Generation,  // transformers' {% generation %}: bodies[0] rendered as is
  };
  Kind kind = Kind::Text;
  std::string text;                  // Text; Macro's name
  ExprPtr expr;                      // Output, For's iterable, Set's value
  ExprPtr filter;                    // For's `if`
  std::vector<std::string> targets;  // For / Set names; Macro's parameters
  std::vector<ExprPtr> conditions;   // If; Macro's defaults (null: required), aligned with targets
  std::vector<Body> bodies;
  int line = 1;
};

// The statements of a template; throws tokenizer::Error naming the construct and line it cannot parse.
Body parse(const std::string& source);

}  // namespace tokenizer::jinja
