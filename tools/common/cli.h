// The command-line grammar of our programs (llama_train through train/options.h, llama_generate, llama_plan,
// fault_soak): `--name value`, `--name=value` and bare `--flag`; anything else is a UsageError (the tools print it as one `error:` line and exit 2).
#pragma once

#include <charconv>
#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace tools_cli {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using Setter = std::function<void(const std::string&)>;
using ValuedOptions = std::map<std::string, Setter>;                // --name VALUE / --name=VALUE
using FlagOptions = std::map<std::string, std::function<void()>>;  // --name

// The number `text` is, whole (no trailing characters), for option --flag.
template <typename T>
T parse_number(const std::string& flag, const std::string& text) {
  T value{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) throw UsageError("--" + flag + ": '" + text + "' is not a valid number");
  return value;
}

inline int64_t positive(const std::string& flag, const std::string& text) {
  auto v = parse_number<int64_t>(flag, text);
  if (v <= 0) throw UsageError("--" + flag + " must be positive, got " + text);
  return v;
}

// Runs the setter of every option in `args` (argv without argv[0]), in order.
inline void parse_args(const std::vector<std::string>& args, const ValuedOptions& valued, const FlagOptions& flags) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) throw UsageError("unexpected argument '" + a + "' (options start with --; see --help)");
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (auto f = flags.find(name); f != flags.end()) {
      if (has_value) throw UsageError("--" + name + " takes no value");
      f->second();
      continue;
    }
    auto v = valued.find(name);
    if (v == valued.end()) throw UsageError("unknown option '" + a + "' (see --help)");
    if (!has_value) {
      if (i + 1 >= args.size()) throw UsageError("--" + name + " needs a value");
      value = args[++i];
    }
    v->second(value);
  }
}

}  // namespace tools_cli
