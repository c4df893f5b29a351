// Values with Python's semantics: truth, str / repr, equality, and JSON both ways (json.dumps's text).
#include "tokenizer/jinja/value.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "tokenizer/error.h"
#include "tokenizer/text.h"

namespace tokenizer::jinja {

Value::Value(List l, bool tuple) : type_(Type::List), tuple_(tuple), list_(std::make_shared<List>(std::move(l))) {}
Value::Value(Dict d, bool is_namespace)
    : type_(Type::Dict), namespace_(is_namespace), dict_(std::make_shared<Dict>(std::move(d))) {}
Value::Value(Function f, std::string name)
    : type_(Type::Function), str_(std::move(name)), fn_(std::make_shared<Function>(std::move(f))) {}

int64_t Value::as_int() const {
  if (type_ == Type::Float) return static_cast<int64_t>(float_);
  if (type_ == Type::Int || type_ == Type::Bool) return int_;
  throw Error("chat template: expected a number, got " + type_name());
}

double Value::as_float() const {
  if (type_ == Type::Float) return float_;
  if (type_ == Type::Int || type_ == Type::Bool) return static_cast<double>(int_);
  throw Error("chat template: expected a number, got " + type_name());
}

bool Value::truthy() const {
  switch (type_) {
    case Type::Undefined:
    case Type::None: return false;
    case Type::Bool:
    case Type::Int: return int_ != 0;
    case Type::Float: return float_ != 0;
    case Type::String: return !str_.empty();
    case Type::List: return !list_->empty();
    case Type::Dict: return !dict_->items.empty();
    case Type::Function: return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (type_) {
    case Type::Undefined: return "undefined";
    case Type::None: return "NoneType";
    case Type::Bool: return "bool";
    case Type::Int: return "int";
    case Type::Float: return "float";
    case Type::String: return "str";
    case Type::List: return tuple_ ? "tuple" : "list";
    case Type::Dict: return namespace_ ? "Namespace" : "dict";
    case Type::Function: return "function";
  }
  return "?";
}

std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  int precision = 1;
  for (; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*e", precision - 1, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  // buf is d.ddde±XX with `precision` significant digits; Python writes fixed notation for -4 <= exp < 16.
  std::string s(buf);
  const auto e = s.find('e');
  const int exp = std::atoi(s.c_str() + e + 1);
  std::string mantissa = s.substr(0, e);
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) if (c != '.') digits += c;
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(static_cast<size_t>(exp) + 1);
    }
  } else {
    out = digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "");
    char e_buf[16];
    std::snprintf(e_buf, sizeof e_buf, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += e_buf;
  }
  return negative ? "-" + out : out;
}

namespace {

std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == quote) out += std::string("\\") + static_cast<char>(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + quote;
}

void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': out += "\\\""; ++i; continue;
      case '\\': out += "\\\\"; ++i; continue;
      case '\n': out += "\\n"; ++i; continue;
      case '\r': out += "\\r"; ++i; continue;
      case '\t': out += "\\t"; ++i; continue;
      case '\b': out += "\\b"; ++i; continue;
      case '\f': out += "\\f"; ++i; continue;
      default: break;
    }
    char buf[16];
    if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      ++i;
      continue;
    }
    const size_t n = std::max<size_t>(1, utf8_length(c));
    if (!ensure_ascii || c < 0x80) {
      out.append(s, i, n);
      i += n;
      continue;
    }
    // \uXXXX, with a surrogate pair above the BMP, as Python's ensure_ascii.
    uint32_t cp = c & (0xff >> (n + 1));
    for (size_t k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    if (cp >= 0x10000) {
      cp -= 0x10000;
      std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
    } else {
      std::snprintf(buf, sizeof buf, "\\u%04x", cp);
    }
    out += buf;
    i += n;
  }
  out += '"';
}

void dump(const Value& v, int indent, int depth, bool sort_keys, bool ensure_ascii, const std::string& item_sep,
          const std::string& key_sep, std::string& out) {
  const auto newline = [&](int d) {
    if (indent >= 0) out += "\n" + std::string(static_cast<size_t>(indent * d), ' ');
  };
  switch (v.type()) {
    case Value::Type::Undefined:
    case Value::Type::Function:
      throw Error("chat template: tojson cannot serialize a value of type " + v.type_name());
    case Value::Type::None: out += "null"; return;
    case Value::Type::Bool: out += v.truthy() ? "true" : "false"; return;
    case Value::Type::Int: out += std::to_string(v.as_int()); return;
    case Value::Type::Float: {
      const double f = v.as_float();
      out += std::isnan(f) ? "NaN" : std::isinf(f) ? (f > 0 ? "Infinity" : "-Infinity") : float_repr(f);
      return;
    }
    case Value::Type::String: json_string(v.as_string(), ensure_ascii, out); return;
    case Value::Type::List: {
      if (v.as_list().empty()) { out += "[]"; return; }
      out += '[';
      bool first = true;
      for (const auto& item : v.as_list()) {
        if (!first) out += item_sep;
        first = false;
        newline(depth + 1);
        dump(item, indent, depth + 1, sort_keys, ensure_ascii, item_sep, key_sep, out);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::Type::Dict: {
      if (v.as_dict().items.empty()) { out += "{}"; return; }
      auto items = v.as_dict().items;
      if (sort_keys) std::stable_sort(items.begin(), items.end(), [](auto& a, auto& b) { return a.first < b.first; });
      out += '{';
      bool first = true;
      for (const auto& [key, item] : items) {
        if (!first) out += item_sep;
        first = false;
        newline(depth + 1);
        json_string(key, ensure_ascii, out);
        out += key_sep;
        dump(item, indent, depth + 1, sort_keys, ensure_ascii, item_sep, key_sep, out);
      }
      newline(depth);
      out += '}';
      return;
    }
  }
}

}  // namespace

std::string Value::str() const {
  switch (type_) {
    case Type::Undefined: return "";
    case Type::String: return str_;
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (type_) {
    case Type::Undefined: return "Undefined";
    case Type::None: return "None";
    case Type::Bool: return int_ ? "True" : "False";
    case Type::Int: return std::to_string(int_);
    case Type::Float: return float_repr(float_);
    case Type::String: return repr_string(str_);
    case Type::List: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) out += (i ? ", " : "") + (*list_)[i].repr();
      if (tuple_ && list_->size() == 1) out += ",";
      return out + (tuple_ ? ")" : "]");
    }
    case Type::Dict: {
      std::string out = namespace_ ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [key, item] : dict_->items) {
        out += (first ? "" : ", ") + repr_string(key) + ": " + item.repr();
        first = false;
      }
      return out + (namespace_ ? "}>" : "}");
    }
    case Type::Function: return "<function " + str_ + ">";
  }
  return "";
}

bool operator==(const Value& a, const Value& b) {
  using T = Value::Type;
  if (a.is_number() && b.is_number()) {
    if (a.type() == T::Float || b.type() == T::Float) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case T::Undefined:
    case T::None: return true;
    case T::String: return a.as_string() == b.as_string();
    case T::List: return a.is_tuple() == b.is_tuple() && a.as_list() == b.as_list();
    case T::Dict: {
      const auto& x = a.as_dict().items;
      const auto& y = b.as_dict().items;
      if (x.size() != y.size()) return false;
      for (const auto& [key, item] : x) {
        const Value* other = b.as_dict().find(key);
        if (other == nullptr || !(*other == item)) return false;
      }
      return true;
    }
    case T::Function: return a.fn_ == b.fn_;
    default: return false;
  }
}

const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) { old = std::move(v); return; }
  }
  items.emplace_back(key, std::move(v));
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      for (const auto& item : j) l.push_back(from_json(item));
      return Value(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [key, item] : j.items()) d.items.emplace_back(key, from_json(item));
      return Value(std::move(d));
    }
    default: throw Error("chat template: cannot pass a JSON value of type " + std::string(j.type_name()));
  }
}

std::string Value::to_json(int indent, bool sort_keys, bool ensure_ascii,
                           const std::pair<std::string, std::string>* separators) const {
  const std::string item_sep = separators ? separators->first : indent >= 0 ? "," : ", ";
  const std::string key_sep = separators ? separators->second : ": ";
  std::string out;
  dump(*this, indent, 0, sort_keys, ensure_ascii, item_sep, key_sep, out);
  return out;
}

}  // namespace tokenizer::jinja
