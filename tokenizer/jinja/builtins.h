// What a template can call: Jinja2's filters and tests, the Python methods of str / dict / list that chat
// templates use (through Jinja2's getattr and getitem), and transformers' globals (raise_exception,
// strftime_now, namespace, dict) with Jinja2's range. An unknown filter, test or global is an Error naming it;
// an unknown attribute is undefined, as in Jinja2.
#pragma once

#include <ctime>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/error.h"
#include "tokenizer/jinja/value.h"

namespace tokenizer::jinja {

// raise_exception(message): the template's own error, its message as the template wrote it.
struct TemplateRaised : Error {
  explicit TemplateRaised(const std::string& message) : Error(message) {}
};

// A call's arguments: Python's positional-or-keyword binding against a signature.
struct Args {
  std::string callee;  // for messages
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The parameter at position `index` called `name`, or `fallback` when not given.
  Value get(size_t index, const std::string& name, Value fallback = Value()) const;
  bool has(size_t index, const std::string& name) const;
  // Errors on more than `max_positional` positional arguments or a keyword not in `names`.
  void check(size_t max_positional, const std::vector<std::string>& names) const;
};

Value apply_filter(const std::string& name, const Value& subject, Args& args);
bool apply_test(const std::string& name, const Value& subject, Args& args);

// Jinja2's getattr (`x.name`: a method or attribute first, then the item) and getitem (`x[key]`: the item
// first, then the attribute). Missing ones are undefined, with a message for when they are used.
Value get_attr(const Value& object, const std::string& name);
Value get_item(const Value& object, const Value& key);
// x[start:stop:step] for lists, tuples and str (by code point), as Python.
Value slice(const Value& object, const std::optional<int64_t>& start, const std::optional<int64_t>& stop,
            const std::optional<int64_t>& step);

// The globals: range, dict, namespace, raise_exception, strftime_now (local time at `now`, or the clock).
Dict make_globals(std::optional<std::time_t> now);

// Python's iteration of a value: list / tuple items, dict keys, str code points; undefined is empty.
List iterate(const Value& v);
// The code points of a str as one-character strings, and Python's whitespace test for one of them.
std::vector<std::string> code_points(const std::string& s);
bool is_python_space(const std::string& ch);
std::string strip(const std::string& s, bool left, bool right, const Value& chars);
// Python's str.split(sep, maxsplit).
List split(const std::string& s, const Value& sep, int64_t maxsplit);
// Python's printf-style `format % args`.
std::string percent_format(const std::string& format, const Value& args);
// Python's < for numbers, strings and lists; an Error for anything else.
bool less_than(const Value& a, const Value& b);

}  // namespace tokenizer::jinja
