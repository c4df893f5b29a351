// Jinja2's filters and tests, with transformers' tojson (json.dumps with ensure_ascii=False by default, no HTML
// escaping). Names and parameters are Jinja2's; an unknown one is an Error naming it.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "tokenizer/jinja/builtins.h"

namespace tokenizer::jinja {
namespace {

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// attribute="a.b" of an item (Jinja2's make_attrgetter: dotted, integer parts index).
Value attribute_of(const Value& item, const std::string& path) {
  Value v = item;
  size_t pos = 0;
  for (;;) {
    const size_t dot = path.find('.', pos);
    const std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    v = digits ? get_item(v, Value(static_cast<int64_t>(std::atoll(part.c_str())))) : get_item(v, Value(part));
    if (dot == std::string::npos) return v;
    pos = dot + 1;
  }
}

Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) {
    Args a;
    return get_attr(v, "lower").as_function()(a);
  }
  return v;
}

// The rest of `args` after the first `skip` positional ones, for filters that pass them on to a test or filter.
Args rest(const Args& args, size_t skip, const std::string& callee) {
  Args r;
  r.callee = callee;
  r.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(std::min(skip, args.positional.size())),
                      args.positional.end());
  r.keyword = args.keyword;
  return r;
}

List select_items(const Value& subject, Args& args, bool by_attribute, bool keep_when) {
  List out;
  const std::string attribute = by_attribute ? args.get(0, "attribute").str() : "";
  const size_t skip = by_attribute ? 2 : 1;
  const Value test = args.get(skip - 1, "test");
  for (const auto& item : iterate(subject)) {
    const Value v = by_attribute ? attribute_of(item, attribute) : item;
    Args test_args = rest(args, skip, "test");
    const bool passed = test.is_undefined() ? v.truthy() : apply_test(test.str(), v, test_args);
    if (passed == keep_when) out.push_back(item);
  }
  return out;
}

int64_t length(const Value& v) {
  if (v.is_string()) return static_cast<int64_t>(code_points(v.as_string()).size());
  if (v.is_list()) return static_cast<int64_t>(v.as_list().size());
  if (v.is_dict()) return static_cast<int64_t>(v.as_dict().items.size());
  if (v.is_undefined()) return 0;
  throw Error("chat template: object of type '" + v.type_name() + "' has no len()");
}

}  // namespace

Value apply_filter(const std::string& name, const Value& subject, Args& args) {
  args.callee = "filter '" + name + "'";
  const Value& s = subject;
  if (name == "length" || name == "count") return Value(length(s));
  if (name == "trim") return Value(strip(s.str(), true, true, args.get(0, "chars")));
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    Args none;
    return get_attr(Value(s.str()), name).as_function()(none);
  }
  if (name == "string") return Value(s.str());
  if (name == "safe") return s;
  if (name == "escape" || name == "e" || name == "forceescape") return Value(html_escape(s.str()));
  if (name == "tojson") {
    args.check(4, {"ensure_ascii", "indent", "separators", "sort_keys"});
    const Value indent = args.get(1, "indent", Value::none());
    const Value separators = args.get(2, "separators", Value::none());
    std::pair<std::string, std::string> seps;
    if (!separators.is_none()) {
      if (!separators.is_list() || separators.as_list().size() != 2) throw Error("chat template: tojson separators must be a pair");
      seps = {separators.as_list()[0].str(), separators.as_list()[1].str()};
    }
    return Value(s.to_json(indent.is_none() ? -1 : static_cast<int>(indent.as_int()),
                           args.get(3, "sort_keys", Value(false)).truthy(),
                           args.get(0, "ensure_ascii", Value(false)).truthy(), separators.is_none() ? nullptr : &seps));
  }
  if (name == "default" || name == "d") {
    const bool boolean = args.get(1, "boolean", Value(false)).truthy();
    if (s.is_undefined() || (boolean && !s.truthy())) return args.get(0, "default_value", Value(""));
    return s;
  }
  if (name == "int") {
    if (s.is_number()) return Value(s.as_int());
    if (s.is_string()) {
      char* end = nullptr;
      const std::string t = strip(s.as_string(), true, true, Value());
      const long long v = std::strtoll(t.c_str(), &end, args.get(1, "base", Value(int64_t{10})).as_int());
      if (!t.empty() && end && *end == '\0') return Value(static_cast<int64_t>(v));
      const double f = std::strtod(t.c_str(), &end);
      if (!t.empty() && end && *end == '\0') return Value(static_cast<int64_t>(f));
    }
    return args.get(0, "default", Value(int64_t{0}));
  }
  if (name == "float") {
    if (s.is_number()) return Value(s.as_float());
    if (s.is_string()) {
      char* end = nullptr;
      const std::string t = strip(s.as_string(), true, true, Value());
      const double f = std::strtod(t.c_str(), &end);
      if (!t.empty() && end && *end == '\0') return Value(f);
    }
    return args.get(0, "default", Value(0.0));
  }
  if (name == "abs") {
    if (s.type() == Value::Type::Float) return Value(std::fabs(s.as_float()));
    return Value(static_cast<int64_t>(std::llabs(s.as_int())));
  }
  if (name == "round") {
    const int64_t precision = args.get(0, "precision", Value(int64_t{0})).as_int();
    const std::string method = args.get(1, "method", Value("common")).str();
    const double scale = std::pow(10.0, static_cast<double>(precision)), x = s.as_float() * scale;
    const double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::round(x);
    return Value(r / scale);
  }
  if (name == "join") {
    const std::string sep = args.get(0, "d", Value("")).str();
    const Value attribute = args.get(1, "attribute");
    std::string out;
    bool first = true;
    for (const auto& item : iterate(s)) {
      out += (first ? "" : sep) + (attribute.is_undefined() ? item : attribute_of(item, attribute.str())).str();
      first = false;
    }
    return Value(out);
  }
  if (name == "first" || name == "last") {
    const List items = iterate(s);
    if (items.empty()) return Value::undefined("No " + name + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value(iterate(s));
  if (name == "reverse") {
    if (s.is_string()) return slice(s, std::nullopt, std::nullopt, int64_t{-1});
    List items = iterate(s);
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "replace") {
    Args a = rest(args, 0, "str.replace");
    return get_attr(Value(s.str()), "replace").as_function()(a);
  }
  if (name == "items") {
    if (s.is_undefined()) return Value(List{});
    if (!s.is_dict()) throw Error("chat template: filter 'items' needs a mapping, got " + s.type_name());
    Args none;
    return get_attr(s, "items").as_function()(none);
  }
  if (name == "dictsort" || name == "sort" || name == "unique" || name == "min" || name == "max") {
    const bool dict = name == "dictsort";
    // sort(reverse, case_sensitive, attribute); dictsort(case_sensitive, by, reverse); the others
    // (case_sensitive, attribute).
    const bool case_sensitive = args.get(name == "sort" ? 1 : 0, "case_sensitive", Value(false)).truthy();
    const Value attribute = dict ? Value() : args.get(name == "sort" ? 2 : 1, "attribute");
    const bool by_value = dict && args.get(1, "by", Value("key")).str() == "value";
    List items = dict ? iterate(apply_filter("items", s, args)) : iterate(s);
    auto key = [&](const Value& item) {
      const Value k = dict ? item.as_list()[by_value ? 1 : 0] : attribute.is_undefined() ? item : attribute_of(item, attribute.str());
      return sort_key(k, case_sensitive);
    };
    if (name == "unique") {
      List out, seen;
      for (const auto& item : items) {
        const Value k = key(item);
        if (std::find(seen.begin(), seen.end(), k) == seen.end()) { seen.push_back(k); out.push_back(item); }
      }
      return Value(std::move(out));
    }
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) { return less_than(key(a), key(b)); });
    if (name == "min" || name == "max") {
      if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
      return name == "min" ? items.front() : items.back();
    }
    if (args.get(name == "sort" ? 0 : 2, "reverse", Value(false)).truthy()) std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "map") {
    List out;
    const Value attribute = args.get(99, "attribute");
    for (const auto& item : iterate(s)) {
      if (!attribute.is_undefined()) {
        Value v = attribute_of(item, attribute.str());
        out.push_back(v.is_undefined() ? args.get(99, "default", v) : v);
      } else {
        Args a = rest(args, 1, "filter");
        out.push_back(apply_filter(args.get(0, "filter").str(), item, a));
      }
    }
    return Value(std::move(out));
  }
  if (name == "select" || name == "reject") return Value(select_items(s, args, false, name == "select"));
  if (name == "selectattr" || name == "rejectattr") return Value(select_items(s, args, true, name == "selectattr"));
  if (name == "sum") {
    const Value attribute = args.get(0, "attribute");
    Value total = args.get(1, "start", Value(int64_t{0}));
    bool is_float = total.type() == Value::Type::Float;
    double f = total.as_float();
    int64_t i = total.as_int();
    for (const auto& item : iterate(s)) {
      const Value v = attribute.is_undefined() ? item : attribute_of(item, attribute.str());
      is_float = is_float || v.type() == Value::Type::Float;
      f += v.as_float();
      i += v.as_int();
    }
    return is_float ? Value(f) : Value(i);
  }
  if (name == "indent") {
    const Value width = args.get(0, "width", Value(int64_t{4}));
    const std::string pad = width.is_string() ? width.as_string() : std::string(static_cast<size_t>(width.as_int()), ' ');
    const bool first = args.get(1, "first", Value(false)).truthy(), blank = args.get(2, "blank", Value(false)).truthy();
    const List lines = split(s.str(), Value("\n"), -1);
    std::string out;
    for (size_t k = 0; k < lines.size(); ++k) {
      const std::string& line = lines[k].as_string();
      const bool indent = (k > 0 || first) && (blank || !strip(line, true, true, Value()).empty());
      out += (k ? "\n" : "") + (indent ? pad : "") + line;
    }
    return Value(out);
  }
  if (name == "wordcount") return Value(static_cast<int64_t>(split(s.str(), Value(), -1).size()));
  if (name == "format") return Value(percent_format(s.str(), Value(args.positional, /*tuple=*/true)));
  if (name == "attr") return get_attr(s, args.get(0, "name").str());
  throw Error("chat template: filter '" + name + "' is not supported");
}

bool apply_test(const std::string& name, const Value& v, Args& args) {
  using T = Value::Type;
  const Value other = args.get(0, "other");
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.type() == T::Bool;
  if (name == "true" || name == "false") return v.type() == T::Bool && v.truthy() == (name == "true");
  if (name == "integer") return v.type() == T::Int;
  if (name == "float") return v.type() == T::Float;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict() && !v.is_namespace();
  if (name == "sequence") return v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace());
  if (name == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "callable") return v.is_callable();
  if (name == "odd" || name == "even") return (v.as_int() % 2 != 0) == (name == "odd");
  if (name == "divisibleby") return other.as_int() != 0 && v.as_int() % other.as_int() == 0;
  if (name == "eq" || name == "equalto" || name == "==") return v == other;
  if (name == "ne" || name == "!=") return v != other;
  if (name == "sameas") return v == other && v.type() == other.type();
  if (name == "lt" || name == "lessthan" || name == "<") return less_than(v, other);
  if (name == "le" || name == "<=") return !less_than(other, v);
  if (name == "gt" || name == "greaterthan" || name == ">") return less_than(other, v);
  if (name == "ge" || name == ">=") return !less_than(v, other);
  if (name == "in") {
    for (const auto& item : iterate(other)) {
      if (item == v) return true;
    }
    return other.is_string() && v.is_string() && other.as_string().find(v.as_string()) != std::string::npos;
  }
  if (name == "lower" || name == "upper") {
    Args none;
    return v.is_string() && get_attr(v, name).as_function()(none).as_string() == v.as_string();
  }
  throw Error("chat template: test '" + name + "' is not supported");
}

}  // namespace tokenizer::jinja
