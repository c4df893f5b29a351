// The token mask's cost per decoding step (inference/structured/token_mask.h) at a Llama 3 sized vocabulary:
// 128,256 tokens made like a byte-level BPE's (every byte, then words with and without a leading space, JSON
// punctuation, digits, whitespace runs and multi-byte characters, then random lowercase pieces), in four grammar
// states, for the trie walk and the naive per-token reference.
//
//   build/bin/structured_mask_bench [--vocab 128256] [--iters 20]
//
// Prints a table and a `summary` line (ms per mask).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "inference/structured/json_schema.h"
#include "inference/structured/token_mask.h"

namespace {

std::vector<std::optional<std::string>> vocabulary(int64_t size, int64_t& eos) {
  std::vector<std::optional<std::string>> v;
  for (int b = 0; b < 256; ++b) v.emplace_back(std::string(1, static_cast<char>(b)));
  for (const char* s : {"{\"", "\":", "\": ", "\",", "\", \"", "\"}", "},", "}]", "[{", "[]", "{}", "true", "false", "null",
                        "  ", "    ", "\n", "\n  ", "\n    ", ",\n", "ü", "東", "é", "🙂", "\\n", "\\\""}) {
    v.emplace_back(std::string(s));
  }
  for (int i = 0; i < 10000; ++i) v.emplace_back(std::to_string(i));
  std::mt19937 rng(7);
  const std::string letters = "etaoinshrdlcumwfgypbvkjxqz";
  while (static_cast<int64_t>(v.size()) < size - 1) {
    std::string t = rng() % 2 ? " " : "";
    const int n = 2 + static_cast<int>(rng() % 8);
    for (int i = 0; i < n; ++i) t += letters[std::min<size_t>(rng() % 40, letters.size() - 1)];
    if (rng() % 5 == 0) t[t[0] == ' ' ? 1 : 0] = static_cast<char>(std::toupper(t[t[0] == ' ' ? 1 : 0]));
    v.emplace_back(t);
  }
  eos = static_cast<int64_t>(v.size());
  v.emplace_back(std::nullopt);
  return v;
}

double ms_per(const std::function<void()>& f, int iters) {
  f();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t size = 128256;
  int iters = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--vocab")) size = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[i + 1]);
    else { std::fprintf(stderr, "error: unknown flag %s\n", argv[i]); return 2; }
  }
  int64_t eos = 0;
  const auto vocab = vocabulary(size, eos);
  const auto t0 = std::chrono::steady_clock::now();
  const structured::TokenMask mask(vocab, {eos});
  const double build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const auto schema = nlohmann::ordered_json::parse(
      R"({"type": "object", "properties": {"name": {"type": "string"}, "bio": {"type": "string", "maxLength": 64},
          "age": {"type": "integer"}}, "required": ["name", "bio", "age"]})");
  const structured::Grammar g = structured::json_schema_grammar(schema);
  struct State { const char* label; std::string prefix; };
  const State states[] = {{"object start", ""},
                          {"inside a string", "{\"name\": \"Ada Love"},
                          {"inside a string of maxLength 64", "{\"name\": \"Ada\", \"bio\": \"Wrote the first"},
                          {"after integer digits", "{\"name\": \"Ada\", \"bio\": \"x\", \"age\": 36"}};
  std::printf("vocabulary %lld tokens, trie built in %.1f ms\n", static_cast<long long>(vocab.size()), build_ms);
  std::printf("| state | allowed | first mask (ms) | next 20 steps, each (ms) | naive (ms) |\n|---|---:|---:|---:|---:|\n");
  double worst = 0;
  for (const State& s : states) {
    structured::Matcher m(g);
    if (!m.accept(s.prefix)) { std::fprintf(stderr, "error: the grammar refuses %s\n", s.prefix.c_str()); return 1; }
    int64_t allowed = 0;
    {
      structured::GrammarStates dfa(g);
      for (uint8_t a : mask.allowed(dfa, m)) allowed += a;
    }
    // A request's first mask: a fresh DFA each time.
    const double first = ms_per([&] { structured::GrammarStates dfa(g); mask.allowed(dfa, m); }, iters);
    // Then decoding: one DFA, a one-byte token ("7" after digits, "e" elsewhere) drawn after each mask.
    structured::GrammarStates dfa(g);
    structured::Matcher walk = m;
    mask.allowed(dfa, walk);
    const char next = s.prefix.empty() ? '{' : (s.prefix.back() >= '0' && s.prefix.back() <= '9' ? '7' : 'e');
    const auto t0 = std::chrono::steady_clock::now();
    int steps = 0;
    for (; steps < 20; ++steps) {
      if (!walk.accept(static_cast<uint8_t>(next))) break;
      mask.allowed(dfa, walk);
    }
    const double each = steps ? std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps : 0;
    const double naive = ms_per([&] { mask.allowed_naive(m); }, std::max(1, iters / 10));
    worst = std::max(worst, first);
    std::printf("| %s | %lld | %.2f | %.3f (%d steps, %zu DFA states) | %.1f |\n", s.label, static_cast<long long>(allowed),
                first, each, steps, dfa.size(), naive);
  }
  std::printf("summary vocab=%lld worst_first_mask_ms=%.3f\n", static_cast<long long>(vocab.size()), worst);
}
