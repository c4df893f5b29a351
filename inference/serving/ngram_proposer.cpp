#include "inference/serving/ngram_proposer.h"

#include <algorithm>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace serve {

SpeculativeConfig parse_speculative_config(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw std::invalid_argument("--speculative-config must be a JSON object");
  SpeculativeConfig c;
  auto count = [&](const char* key, int64_t fallback) {
    if (!j.contains(key)) return fallback;
    if (!j[key].is_number_integer()) throw std::invalid_argument(std::string("--speculative-config: '") + key + "' must be an integer");
    return j[key].get<int64_t>();
  };
  for (const auto& [key, _] : j.items()) {
    if (key != "method" && key != "num_speculative_tokens" && key != "prompt_lookup_max" && key != "prompt_lookup_min") {
      throw std::invalid_argument("--speculative-config: unknown key '" + key + "'");
    }
  }
  const std::string method = j.value("method", std::string("ngram"));
  if (method != "ngram") {
    throw std::invalid_argument("--speculative-config: method '" + method + "' is not supported (only 'ngram': prompt lookup)");
  }
  c.num_speculative_tokens = count("num_speculative_tokens", 4);
  c.prompt_lookup_max = count("prompt_lookup_max", 4);
  c.prompt_lookup_min = count("prompt_lookup_min", 1);
  if (c.num_speculative_tokens < 1 || c.num_speculative_tokens > 16) {
    throw std::invalid_argument("--speculative-config: 'num_speculative_tokens' must be in [1, 16]");
  }
  if (c.prompt_lookup_min < 1 || c.prompt_lookup_max < c.prompt_lookup_min) {
    throw std::invalid_argument("--speculative-config: need 1 <= 'prompt_lookup_min' <= 'prompt_lookup_max'");
  }
  return c;
}

std::vector<int64_t> propose_ngram(const std::vector<int64_t>& tokens, const SpeculativeConfig& config, int64_t limit) {
  const int64_t size = static_cast<int64_t>(tokens.size());
  const int64_t k = std::min(config.num_speculative_tokens, limit);
  if (k <= 0) return {};
  for (int64_t n = std::min(config.prompt_lookup_max, size - 1); n >= config.prompt_lookup_min && n >= 1; --n) {
    // The latest start s < size - n with tokens[s, s + n) == the last n tokens (naive scan: prompts are short
    // next to a forward).
    for (int64_t s = size - n - 1; s >= 0; --s) {
      if (!std::equal(tokens.begin() + s, tokens.begin() + s + n, tokens.end() - n)) continue;
      const int64_t from = s + n, to = std::min(size, from + k);
      if (from < to) return std::vector<int64_t>(tokens.begin() + from, tokens.begin() + to);
    }
  }
  return {};
}

}  // namespace serve
