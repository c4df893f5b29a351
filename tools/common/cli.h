// The command line of our programs, through CLI11 (Debian's libcli11-dev): each tool defines its options once, on a
// CLI::App, with their help text and their checks; `--help` prints the help CLI11 generates from them. The grammar
// is `--name value`, `--name=value` and bare `--flag` (a `--no-flag` twin where both exist). Anything else (an
// unknown option, a missing or malformed value, a stray argument, a failed check) is a UsageError: the tools print
// it as one `error:` line and exit 2, before any communication.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <memory>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace tools_cli {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The help's layout: `  --name VALUE   description (default D)`, descriptions wrapped at 100 columns, the value
// named by the option's option_text, else by its kind (N, X, DIR, FILE, TEXT) rather than CLI11's type and check
// names.
class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter() { column_width(30); }
  std::string make_option_name(const CLI::Option* opt, bool) const override {
    // "--x,--no-x{false}" (a flag and its negation) as "--x / --no-x".
    std::string name = opt->get_name(false, true), out;
    bool in_default = false;
    for (char c : name) {
      if (c == '{') in_default = true;
      if (!in_default) out += c == ',' ? std::string(" / ") : std::string(1, c);
      if (c == '}') in_default = false;
    }
    return out;
  }
  std::string make_option_opts(const CLI::Option* opt) const override {
    if (opt->get_expected_max() == 0) return "";  // a flag
    if (!opt->get_option_text().empty()) return " " + opt->get_option_text();  // ->option_text("IDS")
    const std::string type = opt->get_type_name();
    if (type.find("DIR") != std::string::npos) return " DIR";
    if (type.find("FILE") != std::string::npos) return " FILE";
    if (type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0) return " N";
    if (type.rfind("FLOAT", 0) == 0) return " X";
    return " TEXT";
  }
  std::string make_option_desc(const CLI::Option* opt) const override {
    std::string text = opt->get_description();
    const std::string def = opt->get_default_str();
    if (!def.empty() && opt->get_expected_max() != 0 && text.find("default") == std::string::npos) {
      text += " (default " + def + ")";  // (a description that names its default says it better)
    }
    // Greedy word wrap to the columns left after the names.
    const size_t width = 100 - get_column_width();
    std::string out, line, word;
    auto flush_word = [&] {
      if (word.empty()) return;
      if (!line.empty() && line.size() + 1 + word.size() > width) out += line + "\n", line.clear();
      line += (line.empty() ? "" : " ") + word;
      word.clear();
    };
    for (char c : text) {
      if (c == ' ') {
        flush_word();
      } else if (c == '\n') {
        flush_word();
        out += line + "\n", line.clear();
      } else {
        word += c;
      }
    }
    flush_word();
    return out + line;
  }
};

// An App with our conventions: `--help` only (no `-h`), the help layout above showing each option's built-in
// default, and an option given twice taking its last value (a repeatable option says so itself).
inline void configure(CLI::App& app, const std::string& program) {
  app.name(program);
  app.set_help_flag("--help", "print this help and exit");
  app.formatter(std::make_shared<HelpFormatter>());
  app.option_defaults()->always_capture_default();
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

// A repeatable option whose callback runs at each occurrence, in command-line order (several --prompt, --chat).
inline CLI::Option* each(CLI::Option* option) {
  return option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)->trigger_on_parse();
}

// A usage error found before any communication: one `error:` line, printed by rank 0 alone (every rank finds it and
// exits 2; tprun waits for them all, whichever exits first). Returns 2, the exit status.
// DTENSOR_TEST_USAGE_ERROR_DELAY_MS delays rank 0's print: the test of tprun's wait.
inline int usage_error_exit(int rank, const std::string& message) {
  if (rank != 0) return 2;
  if (const char* ms = std::getenv("DTENSOR_TEST_USAGE_ERROR_DELAY_MS"); ms && *ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(ms)));
  }
  std::fprintf(stderr, "error: %s\n", message.c_str());
  std::fflush(stderr);
  return 2;
}

// The known option closest to `given` (edit distance at most a third of its length, at least 2), or "".
inline std::string closest_option(const CLI::App& app, const std::string& given) {
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diag = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        const size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
        diag = up;
      }
    }
    return row[b.size()];
  };
  std::string best;
  size_t best_d = std::max<size_t>(2, given.size() / 3) + 1;
  for (const CLI::Option* o : app.get_options()) {
    for (const std::string& name : o->get_lnames()) {
      const size_t d = distance(given, "--" + name);
      if (d < best_d) best_d = d, best = "--" + name;
    }
  }
  return best;
}

// CLI11's "The following arguments were not expected: 5 --stepz" (its own order, the value first) as a message
// that names the first unknown option in command-line order and the closest known one.
inline std::string unexpected_arguments(const CLI::App& app, const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a.rfind("--", 0) != 0 || a == "--") continue;
    const std::string name = a.substr(0, a.find('='));
    bool known = false;
    for (const CLI::Option* o : app.get_options()) {
      for (const std::string& l : o->get_lnames()) known = known || "--" + l == name;
    }
    if (known) continue;
    const std::string near = closest_option(app, name);
    return "unknown option " + name + (near.empty() ? "" : " (did you mean " + near + "?)") + "; --help lists them";
  }
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].rfind("-", 0) != 0) {
      return "unexpected argument '" + args[i] + "'" + (i > 0 ? " after " + args[i - 1] : std::string()) +
             " (an option takes one value; --help lists them)";
    }
  }
  return "";
}

// Parses `args` (argv without argv[0]) into `app`. Returns true when --help was given (the caller prints app.help()
// and exits 0). A CLI11 parse error, and a UsageError or std::exception that an option's callback throws, become
// one UsageError whose message names the option.
inline bool parse(CLI::App& app, const std::vector<std::string>& args) {
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
  try {
    app.parse(std::move(reversed));
  } catch (const CLI::CallForHelp&) {
    return true;
  } catch (const CLI::ExtrasError& e) {
    const std::string better = unexpected_arguments(app, args);
    std::string what = e.what();
    if (!what.empty() && what.back() == '\n') what.pop_back();
    throw UsageError(better.empty() ? what : better);
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    if (!what.empty() && what.back() == '\n') what.pop_back();
    throw UsageError(what);
  }
  return false;
}

// The number `text` is, whole (no trailing characters), for an option's own parsing of a list item (--prompt-ids,
// --ranks); a UsageError naming `flag` otherwise.
template <typename T>
T parse_number(const std::string& flag, const std::string& text) {
  T value{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) throw UsageError(flag + ": '" + text + "' is not a valid number");
  return value;
}

// A check for CLI11's ->check(): the value is a whole number (then the option's own type converts it) that `ok`
// accepts; else the message `why` followed by the value.
inline CLI::Validator number_where(bool (*ok)(double), const std::string& why, const std::string& name) {
  return CLI::Validator(
      [ok, why](std::string& s) -> std::string {
        double v = 0;
        try {
          size_t used = 0;
          v = std::stod(s, &used);
          if (used != s.size()) return "'" + s + "' is not a number";
        } catch (const std::exception&) {
          return "'" + s + "' is not a number";
        }
        return ok(v) ? std::string() : why + s;
      },
      name);
}
inline CLI::Validator positive() {
  return number_where([](double v) { return v > 0; }, "must be positive, got ", "POSITIVE");
}
inline CLI::Validator non_negative() {
  return number_where([](double v) { return v >= 0; }, "must not be negative, got ", "NON-NEGATIVE");
}

// ... a value that is not empty.
inline CLI::Validator non_empty() {
  return CLI::Validator([](std::string& s) { return s.empty() ? std::string("must not be empty") : std::string(); }, "");
}

}  // namespace tools_cli
