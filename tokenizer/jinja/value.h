// The values a chat template computes with, with Python's semantics as Jinja2 gives them to templates:
// undefined (Jinja's default Undefined: prints as "", is false, iterates as empty; an attribute of it is an
// error), None, bool, int, float, str (UTF-8), list (tuples too), dict (insertion-ordered, string keys),
// callables (macros, methods, globals). A namespace() is a dict whose attributes can be set.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tokenizer::jinja {

class Value;
using List = std::vector<Value>;
struct Dict;
struct Args;  // a call's positional and keyword arguments (builtins.h)
using Function = std::function<Value(Args&)>;

class Value {
 public:
  enum class Type { Undefined, None, Bool, Int, Float, String, List, Dict, Function };

  Value() = default;  // undefined
  static Value undefined(std::string name = "") { Value v; v.str_ = std::move(name); return v; }
  static Value none() { Value v; v.type_ = Type::None; return v; }
  Value(bool b) : type_(Type::Bool), int_(b) {}
  Value(int v) : type_(Type::Int), int_(v) {}
  Value(int64_t v) : type_(Type::Int), int_(v) {}
  Value(double v) : type_(Type::Float), float_(v) {}
  Value(std::string s) : type_(Type::String), str_(std::move(s)) {}
  Value(const char* s) : type_(Type::String), str_(s) {}
  Value(List l, bool tuple = false);
  Value(Dict d, bool is_namespace = false);
  Value(Function f, std::string name);

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::Undefined; }
  bool is_none() const { return type_ == Type::None; }
  bool is_number() const { return type_ == Type::Int || type_ == Type::Float || type_ == Type::Bool; }
  bool is_string() const { return type_ == Type::String; }
  bool is_list() const { return type_ == Type::List; }
  bool is_dict() const { return type_ == Type::Dict; }
  bool is_callable() const { return type_ == Type::Function; }
  bool is_tuple() const { return tuple_; }
  bool is_namespace() const { return namespace_; }

  int64_t as_int() const;   // bool, int (float truncates as Python's int())
  double as_float() const;  // bool, int, float
  const std::string& as_string() const { return str_; }  // the string; an undefined's name
  List& as_list() const { return *list_; }
  Dict& as_dict() const { return *dict_; }
  const Function& as_function() const { return *fn_; }

  bool truthy() const;              // Python's bool()
  std::string str() const;          // Python's str() (Jinja's output of {{ value }})
  std::string repr() const;         // Python's repr()
  std::string type_name() const;    // "str", "list", ... for messages
  // Python's ==; ints, floats and bools compare by value.
  friend bool operator==(const Value& a, const Value& b);
  friend bool operator!=(const Value& a, const Value& b) { return !(a == b); }

  static Value from_json(const nlohmann::ordered_json& j);
  // Python's json.dumps(value, ensure_ascii, indent (<0: none), separators, sort_keys), as transformers' tojson.
  std::string to_json(int indent = -1, bool sort_keys = false, bool ensure_ascii = false,
                      const std::pair<std::string, std::string>* separators = nullptr) const;

 private:
  Type type_ = Type::Undefined;
  bool tuple_ = false, namespace_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::string str_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Function> fn_;
};

// A dict: insertion order kept, as Python's.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v);
};

// Python's repr of a float (the shortest text that reads back to the same double).
std::string float_repr(double v);

}  // namespace tokenizer::jinja
