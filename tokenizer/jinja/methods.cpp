// Attribute and item access with Jinja2's rules, the Python methods of str / dict that chat templates call,
// slicing, iteration, comparison, %-formatting and the globals.
#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/text.h"

namespace tokenizer::jinja {

Value Args::get(size_t index, const std::string& name, Value fallback) const {
  if (index < positional.size()) return positional[index];
  for (const auto& [key, value] : keyword) {
    if (key == name) return value;
  }
  return fallback;
}

bool Args::has(size_t index, const std::string& name) const {
  if (index < positional.size()) return true;
  for (const auto& kv : keyword) {
    if (kv.first == name) return true;
  }
  return false;
}

void Args::check(size_t max_positional, const std::vector<std::string>& names) const {
  if (positional.size() > max_positional) {
    throw Error("chat template: " + callee + " takes at most " + std::to_string(max_positional) +
                " positional arguments, got " + std::to_string(positional.size()));
  }
  for (const auto& kv : keyword) {
    if (std::find(names.begin(), names.end(), kv.first) == names.end()) {
      throw Error("chat template: " + callee + " got an unexpected keyword argument '" + kv.first + "'");
    }
  }
}

std::vector<std::string> code_points(const std::string& s) { return utf8_chars(s); }

bool is_python_space(const std::string& ch) {
  static const std::vector<std::string> kSpaces = {
      " ", "\t", "\n", "\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x1f", "\xc2\x85", "\xc2\xa0", "\xe1\x9a\x80",
      "\xe2\x80\x80", "\xe2\x80\x81", "\xe2\x80\x82", "\xe2\x80\x83", "\xe2\x80\x84", "\xe2\x80\x85", "\xe2\x80\x86",
      "\xe2\x80\x87", "\xe2\x80\x88", "\xe2\x80\x89", "\xe2\x80\x8a", "\xe2\x80\xa8", "\xe2\x80\xa9", "\xe2\x80\xaf",
      "\xe2\x81\x9f", "\xe3\x80\x80"};
  return std::find(kSpaces.begin(), kSpaces.end(), ch) != kSpaces.end();
}

std::string strip(const std::string& s, bool left, bool right, const Value& chars) {
  const auto cps = code_points(s);
  std::vector<std::string> set;
  const bool custom = chars.is_string();
  if (custom) set = code_points(chars.as_string());
  else if (!chars.is_undefined() && !chars.is_none()) throw Error("chat template: strip arg must be None or str");
  auto strippable = [&](const std::string& c) {
    return custom ? std::find(set.begin(), set.end(), c) != set.end() : is_python_space(c);
  };
  size_t begin = 0, end = cps.size();
  if (left) while (begin < end && strippable(cps[begin])) ++begin;
  if (right) while (end > begin && strippable(cps[end - 1])) --end;
  std::string out;
  for (size_t i = begin; i < end; ++i) out += cps[i];
  return out;
}

List split(const std::string& s, const Value& sep, int64_t maxsplit) {
  List out;
  if (sep.is_undefined() || sep.is_none()) {  // runs of whitespace, no empty pieces
    const auto cps = code_points(s);
    std::string piece;
    size_t i = 0;
    while (i < cps.size() && is_python_space(cps[i])) ++i;
    for (; i < cps.size(); ++i) {
      if (!is_python_space(cps[i])) { piece += cps[i]; continue; }
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) { piece += cps[i]; continue; }
      out.emplace_back(piece);
      piece.clear();
      while (i + 1 < cps.size() && is_python_space(cps[i + 1])) ++i;
    }
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) piece = strip(piece, false, true, Value());
    if (!piece.empty()) out.emplace_back(piece);
    return out;
  }
  if (!sep.is_string()) throw Error("chat template: split separator must be a str, got " + sep.type_name());
  const std::string& d = sep.as_string();
  if (d.empty()) throw Error("chat template: split: empty separator");
  size_t pos = 0;
  for (;;) {
    const size_t at = s.find(d, pos);
    if (at == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit)) break;
    out.emplace_back(s.substr(pos, at - pos));
    pos = at + d.size();
  }
  out.emplace_back(s.substr(pos));
  return out;
}

namespace {

std::string map_case(const std::string& s, int mode) {  // 0 lower, 1 upper, 2 title, 3 capitalize
  std::string out;
  bool previous_cased = false, first = true;
  for (const auto& ch : code_points(s)) {
    utf8proc_int32_t cp = 0;
    if (utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(ch.data()), static_cast<utf8proc_ssize_t>(ch.size()), &cp) < 0) {
      out += ch;
      continue;
    }
    const bool upper = mode == 1 || (mode == 2 && !previous_cased) || (mode == 3 && first);
    if (upper && cp == 0xdf) {  // SpecialCasing's ß -> SS (Ss in title case), as Python; utf8proc maps simply
      out += mode == 1 ? "SS" : "Ss";
      previous_cased = true;
      first = false;
      continue;
    }
    const utf8proc_int32_t mapped = upper ? (mode >= 2 ? utf8proc_totitle(cp) : utf8proc_toupper(cp)) : utf8proc_tolower(cp);
    const auto category = utf8proc_category(cp);
    previous_cased = category == UTF8PROC_CATEGORY_LU || category == UTF8PROC_CATEGORY_LL || category == UTF8PROC_CATEGORY_LT;
    first = false;
    utf8proc_uint8_t buf[4];
    out.append(reinterpret_cast<char*>(buf), static_cast<size_t>(utf8proc_encode_char(mapped, buf)));
  }
  return out;
}

int64_t count_code_points(const std::string& s, size_t bytes) {
  int64_t n = 0;
  for (size_t i = 0; i < bytes && i < s.size(); ++i) n += (static_cast<unsigned char>(s[i]) & 0xc0) != 0x80;
  return n;
}

bool affix_match(const std::string& s, const Value& affix, bool prefix, const std::string& method) {
  auto one = [&](const Value& a) {
    if (!a.is_string()) throw Error("chat template: " + method + " arg must be str or a tuple of str");
    const auto& x = a.as_string();
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_list()) {
    for (const auto& a : affix.as_list()) if (one(a)) return true;
    return false;
  }
  return one(affix);
}

Value string_method(const Value& self, const std::string& name) {
  const std::string s = self.as_string();
  const std::string callee = "str." + name;
  auto method = [&](size_t max_positional, std::vector<std::string> names, auto body) {
    return Value([=](Args& a) -> Value {
      a.callee = callee;
      a.check(max_positional, names);
      return body(a);
    }, callee);
  };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip", right = name != "lstrip";
    return method(1, {"chars"}, [=](Args& a) { return Value(strip(s, left, right, a.get(0, "chars"))); });
  }
  if (name == "split") {
    return method(2, {"sep", "maxsplit"}, [=](Args& a) {
      return Value(split(s, a.get(0, "sep"), a.get(1, "maxsplit", Value(int64_t{-1})).as_int()));
    });
  }
  if (name == "startswith" || name == "endswith") {
    const bool prefix = name == "startswith";
    return method(1, {}, [=](Args& a) { return Value(affix_match(s, a.get(0, "prefix"), prefix, callee)); });
  }
  if (name == "lower" || name == "upper" || name == "title" || name == "capitalize") {
    const int mode = name == "lower" ? 0 : name == "upper" ? 1 : name == "title" ? 2 : 3;
    return method(0, {}, [=](Args&) { return Value(mode == 3 ? map_case(map_case(s, 0), 3) : map_case(s, mode)); });
  }
  if (name == "replace") {
    return method(3, {"count"}, [=](Args& a) {
      const Value old_v = a.get(0, "old"), new_v = a.get(1, "new");
      if (!old_v.is_string() || !new_v.is_string()) throw Error("chat template: str.replace takes two str");
      int64_t count = a.get(2, "count", Value(int64_t{-1})).as_int();
      const std::string& from = old_v.as_string();
      std::string out;
      size_t pos = 0;
      if (from.empty()) return Value(s);
      for (size_t at; count != 0 && (at = s.find(from, pos)) != std::string::npos; --count) {
        out += s.substr(pos, at - pos) + new_v.as_string();
        pos = at + from.size();
      }
      return Value(out + s.substr(pos));
    });
  }
  if (name == "find" || name == "rfind" || name == "count") {
    return method(1, {}, [=](Args& a) {
      const Value sub = a.get(0, "sub");
      if (!sub.is_string()) throw Error("chat template: " + callee + " takes a str");
      if (name == "count") {
        int64_t n = 0;
        for (size_t pos = 0, at; (at = s.find(sub.as_string(), pos)) != std::string::npos; ++n) {
          pos = at + std::max<size_t>(1, sub.as_string().size());
          if (sub.as_string().empty() && at >= s.size()) { ++n; break; }
        }
        return Value(n);
      }
      const size_t at = name == "find" ? s.find(sub.as_string()) : s.rfind(sub.as_string());
      return Value(at == std::string::npos ? int64_t{-1} : count_code_points(s, at));
    });
  }
  if (name == "join") {
    return method(1, {}, [=](Args& a) {
      std::string out;
      bool first = true;
      for (const auto& item : iterate(a.get(0, "iterable"))) {
        if (!item.is_string()) throw Error("chat template: str.join: expected str items, got " + item.type_name());
        out += (first ? "" : s) + item.as_string();
        first = false;
      }
      return Value(out);
    });
  }
  if (name == "isdigit" || name == "isspace" || name == "isalpha") {
    return method(0, {}, [=](Args&) {
      const auto cps = code_points(s);
      if (cps.empty()) return Value(false);
      for (const auto& c : cps) {
        const bool ok = name == "isspace" ? is_python_space(c)
                        : name == "isdigit" ? (c.size() == 1 && c[0] >= '0' && c[0] <= '9')
                                            : (c.size() == 1 ? std::isalpha(static_cast<unsigned char>(c[0])) != 0 : true);
        if (!ok) return Value(false);
      }
      return Value(true);
    });
  }
  return Value::undefined("'str object' has no attribute '" + name + "'");
}

Value dict_method(const Value& self, const std::string& name) {
  const std::string callee = "dict." + name;
  if (name == "items" || name == "keys" || name == "values") {
    return Value([self, name, callee](Args& a) {
      a.callee = callee;
      a.check(0, {});
      List out;
      for (const auto& [key, value] : self.as_dict().items) {
        if (name == "items") out.emplace_back(List{Value(key), value}, /*tuple=*/true);
        else out.push_back(name == "keys" ? Value(key) : value);
      }
      return Value(std::move(out));
    }, callee);
  }
  if (name == "get") {
    return Value([self, callee](Args& a) {
      a.callee = callee;
      a.check(2, {});
      const Value key = a.get(0, "key");
      const Value* found = key.is_string() ? self.as_dict().find(key.as_string()) : nullptr;
      return found ? *found : a.get(1, "default", Value::none());
    }, callee);
  }
  return Value();
}

}  // namespace

Value get_attr(const Value& object, const std::string& name) {
  if (object.is_undefined()) {
    throw Error("chat template: " + (object.as_string().empty() ? std::string("a value is undefined")
                                     : object.as_string().front() == '\'' && object.as_string().find(' ') != std::string::npos
                                         ? object.as_string()
                                         : "'" + object.as_string() + "' is undefined"));
  }
  if (object.is_string()) return string_method(object, name);
  if (object.is_dict()) {
    if (!object.is_namespace()) {
      Value method = dict_method(object, name);
      if (method.is_callable()) return method;
    }
    if (const Value* found = object.as_dict().find(name)) return *found;
    return Value::undefined("'" + object.type_name() + " object' has no attribute '" + name + "'");
  }
  return Value::undefined("'" + object.type_name() + " object' has no attribute '" + name + "'");
}

Value get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) return get_attr(object, key.str());
  if (object.is_dict() && key.is_string()) {
    if (const Value* found = object.as_dict().find(key.as_string())) return *found;
  }
  if ((object.is_list() || object.is_string()) && (key.type() == Value::Type::Int || key.type() == Value::Type::Bool)) {
    const int64_t i = key.as_int();
    if (object.is_list()) {
      const auto n = static_cast<int64_t>(object.as_list().size());
      if (i >= -n && i < n) return object.as_list()[static_cast<size_t>(i < 0 ? i + n : i)];
    } else {
      const auto cps = code_points(object.as_string());
      const auto n = static_cast<int64_t>(cps.size());
      if (i >= -n && i < n) return Value(cps[static_cast<size_t>(i < 0 ? i + n : i)]);
    }
    return Value::undefined("'" + object.type_name() + " object' has no element " + key.repr());
  }
  if (key.is_string()) return get_attr(object, key.as_string());
  return Value::undefined("'" + object.type_name() + " object' has no element " + key.repr());
}

Value slice(const Value& object, const std::optional<int64_t>& start, const std::optional<int64_t>& stop,
            const std::optional<int64_t>& step_opt) {
  const int64_t step = step_opt.value_or(1);
  if (step == 0) throw Error("chat template: slice step cannot be zero");
  List items;
  if (object.is_list()) items = object.as_list();
  else if (object.is_string()) for (auto& c : code_points(object.as_string())) items.emplace_back(c);
  else throw Error("chat template: '" + object.type_name() + "' object is not subscriptable");
  const auto n = static_cast<int64_t>(items.size());
  auto clamp = [&](std::optional<int64_t> v, int64_t fallback) {
    if (!v) return fallback;
    int64_t x = *v < 0 ? *v + n : *v;
    return step > 0 ? std::clamp<int64_t>(x, 0, n) : std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t begin = clamp(start, step > 0 ? 0 : n - 1), end = clamp(stop, step > 0 ? n : -1);
  List out;
  for (int64_t i = begin; step > 0 ? i < end : i > end; i += step) out.push_back(items[static_cast<size_t>(i)]);
  if (!object.is_string()) return Value(std::move(out), object.is_tuple());
  std::string s;
  for (const auto& c : out) s += c.as_string();
  return Value(s);
}

List iterate(const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined: return {};
    case Value::Type::List: return v.as_list();
    case Value::Type::Dict: {
      List keys;
      for (const auto& kv : v.as_dict().items) keys.emplace_back(kv.first);
      return keys;
    }
    case Value::Type::String: {
      List chars;
      for (auto& c : code_points(v.as_string())) chars.emplace_back(c);
      return chars;
    }
    default: throw Error("chat template: '" + v.type_name() + "' object is not iterable");
  }
}

bool less_than(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_float() < b.as_float();
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 order is code point order
  if (a.is_list() && b.is_list()) {
    const auto &x = a.as_list(), &y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (x[i] != y[i]) return less_than(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  throw Error("chat template: '<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
}

std::string percent_format(const std::string& format, const Value& args) {
  const List values = args.is_tuple() ? args.as_list() : List{args};
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') { out += format[i]; continue; }
    if (++i >= format.size()) throw Error("chat template: incomplete format");
    const char c = format[i];
    if (c == '%') { out += '%'; continue; }
    if (next >= values.size()) throw Error("chat template: not enough arguments for format string");
    const Value& v = values[next++];
    if (c == 's') out += v.str();
    else if (c == 'r') out += v.repr();
    else if (c == 'd' || c == 'i') out += std::to_string(v.as_int());
    else if (c == 'f') { char buf[64]; std::snprintf(buf, sizeof buf, "%f", v.as_float()); out += buf; }
    else throw Error(std::string("chat template: format conversion '%") + c + "' is not supported");
  }
  if (next < values.size()) throw Error("chat template: not all arguments converted during string formatting");
  return out;
}

Dict make_globals(std::optional<std::time_t> now) {
  Dict g;
  g.set("raise_exception", Value([](Args& a) -> Value { throw TemplateRaised(a.get(0, "message").str()); }, "raise_exception"));
  g.set("strftime_now", Value([now](Args& a) {
          const std::time_t t = now ? *now : std::time(nullptr);
          std::tm tm{};
          localtime_r(&t, &tm);
          char buf[256];
          const size_t n = std::strftime(buf, sizeof buf, a.get(0, "format").str().c_str(), &tm);
          return Value(std::string(buf, n));
        }, "strftime_now"));
  auto make_dict = [](bool ns) {
    return [ns](Args& a) {
      Dict d;
      if (!a.positional.empty()) {
        const Value& init = a.positional[0];
        if (init.is_dict()) d = init.as_dict();
        else throw Error("chat template: dict()/namespace() takes a mapping or keyword arguments");
      }
      for (const auto& [key, value] : a.keyword) d.set(key, value);
      return Value(std::move(d), ns);
    };
  };
  g.set("namespace", Value(make_dict(true), "namespace"));
  g.set("dict", Value(make_dict(false), "dict"));
  g.set("range", Value([](Args& a) {
          int64_t start = 0, stop = 0, step = 1;
          if (a.positional.size() == 1) stop = a.positional[0].as_int();
          else if (a.positional.size() >= 2) {
            start = a.positional[0].as_int();
            stop = a.positional[1].as_int();
            if (a.positional.size() > 2) step = a.positional[2].as_int();
          }
          if (step == 0) throw Error("chat template: range() arg 3 must not be zero");
          List out;
          for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (out.size() >= 1000000) throw Error("chat template: range() too large");
            out.emplace_back(i);
          }
          return Value(std::move(out));
        }, "range"));
  return g;
}

}  // namespace tokenizer::jinja
