// tokenize: a checkpoint's tokenizer on lines of text, for scripts and tests.
//
//   tokenize --tokenizer DIR < text        each input line's ids, space-separated, one line per input line
//   tokenize --tokenizer DIR --decode < ids  each line of ids back to text
//
// --no-special-tokens: encode without the post-processor's bos / eos; decode skipping special tokens.
// --skip-unknown-ids: with --decode, ids outside the vocabulary decode to nothing (transformers' decode); without it
// they are an error. A --decode line holds decimal ids separated by spaces or tabs, nothing else.
// Ends with a `summary` line on stderr. A bad flag, a tokenizer that cannot be read, or a --decode line that is not
// ids (naming the line and the field) is one `error:` line and exit 2; nothing is printed for the bad line.
#include <charconv>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "tokenizer/error.h"
#include "tokenizer/tokenizer.h"
#include "tools/common/cli.h"

namespace {

// The ids of one --decode line: decimal integers separated by spaces or tabs; anything else is an error naming the
// line and the field.
std::vector<int64_t> parse_ids(const std::string& line, int64_t line_no) {
  std::vector<int64_t> ids;
  size_t i = 0;
  while (i < line.size()) {
    if (line[i] == ' ' || line[i] == '\t' || line[i] == '\r') {
      ++i;
      continue;
    }
    size_t end = line.find_first_of(" \t\r", i);
    if (end == std::string::npos) end = line.size();
    const std::string field = line.substr(i, end - i);
    int64_t id = 0;
    const auto [ptr, ec] = std::from_chars(field.data(), field.data() + field.size(), id);
    if (ec != std::errc() || ptr != field.data() + field.size()) {
      throw tokenizer::Error("--decode: line " + std::to_string(line_no) + ": '" + field +
                             "' is not a token id (a line holds decimal ids separated by spaces)");
    }
    ids.push_back(id);
    i = end;
  }
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  bool decode = false, special = true, help = false, skip_unknown = false;
  try {
    CLI::App app("tokenize: a checkpoint's tokenizer on lines of text (ids out, or text back with --decode)\n"
                 "  tokenize --tokenizer DIR [--decode] [--no-special-tokens] < lines");
    tools_cli::configure(app, "tokenize");
    app.add_option("--tokenizer", dir, "the tokenizer's directory (tokenizer.json or tokenizer.model)")->required();
    app.add_flag("--decode", decode, "each line of ids back to text");
    app.add_flag_callback("--no-special-tokens", [&] { special = false; },
                          "encode without the post-processor's bos / eos; decode skipping special tokens");
    app.add_flag("--skip-unknown-ids", skip_unknown,
                 "with --decode: ids outside the vocabulary (a model's padded rows) decode to nothing, as transformers' "
                 "decode; without it they are an error");
    help = tools_cli::parse(app, std::vector<std::string>(argv + 1, argv + argc));
    if (help) {
      std::fputs(app.help().c_str(), stdout);
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  try {
    const auto tok = tokenizer::Tokenizer::from_pretrained(dir);
    const auto start = std::chrono::steady_clock::now();
    std::string line;
    int64_t lines = 0, tokens = 0;
    while (std::getline(std::cin, line)) {
      ++lines;
      if (decode) {
        const std::vector<int64_t> ids = parse_ids(line, lines);
        tokens += static_cast<int64_t>(ids.size());
        std::string text;
        try {
          text = tok.decode(ids, /*skip_special_tokens=*/!special,
                            skip_unknown ? tokenizer::UnknownIds::kSkip : tokenizer::UnknownIds::kError);
        } catch (const tokenizer::Error& e) {
          throw tokenizer::Error("--decode: line " + std::to_string(lines) + ": " + e.what() +
                                 (skip_unknown ? "" : " (--skip-unknown-ids decodes such ids to nothing)"));
        }
        std::cout << text << '\n';
      } else {
        const auto ids = tok.encode(line, special);
        tokens += static_cast<int64_t>(ids.size());
        for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
        std::cout << '\n';
      }
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "summary lines=%lld tokens=%lld seconds=%.3f tokens_per_s=%.0f\n", static_cast<long long>(lines),
                 static_cast<long long>(tokens), s, s > 0 ? static_cast<double>(tokens) / s : 0.0);
    return 0;
  } catch (const tokenizer::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
