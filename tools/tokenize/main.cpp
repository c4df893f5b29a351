// tokenize: a checkpoint's tokenizer on lines of text, for scripts and tests.
//
//   tokenize --tokenizer DIR < text        each input line's ids, space-separated, one line per input line
//   tokenize --tokenizer DIR --decode < ids  each line of ids back to text
//
// --no-special-tokens: encode without the post-processor's bos / eos; decode skipping special tokens.
// Ends with a `summary` line on stderr. A bad flag, or a tokenizer that cannot be read, is one `error:` line and
// exit 2.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/error.h"
#include "tokenizer/tokenizer.h"
#include "tools/common/cli.h"

int main(int argc, char** argv) {
  std::string dir;
  bool decode = false, special = true, help = false;
  try {
    CLI::App app("tokenize: a checkpoint's tokenizer on lines of text (ids out, or text back with --decode)\n"
                 "  tokenize --tokenizer DIR [--decode] [--no-special-tokens] < lines");
    tools_cli::configure(app, "tokenize");
    app.add_option("--tokenizer", dir, "the tokenizer's directory (tokenizer.json or tokenizer.model)")->required();
    app.add_flag("--decode", decode, "each line of ids back to text");
    app.add_flag_callback("--no-special-tokens", [&] { special = false; },
                          "encode without the post-processor's bos / eos; decode skipping special tokens");
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
        std::istringstream in(line);
        std::vector<int64_t> ids;
        for (int64_t id; in >> id;) ids.push_back(id);
        tokens += static_cast<int64_t>(ids.size());
        std::cout << tok.decode(ids, /*skip_special_tokens=*/!special) << '\n';
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
