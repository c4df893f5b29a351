// Speculative decoding by prompt lookup (vLLM's "ngram" method): the draft is what followed the most recent earlier
// occurrence of the sequence's last n tokens (n from prompt_lookup_max down to prompt_lookup_min), up to
// num_speculative_tokens of them. The target model then scores the last token and the draft in one forward; the
// serving loop keeps the draft's tokens while they equal the model's greedy choice, plus the model's next token, so
// the output is plain greedy decoding's, in fewer forwards where the text repeats itself.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace serve {

struct SpeculativeConfig {
  int64_t num_speculative_tokens = 0;  // 0: off
  int64_t prompt_lookup_max = 4;
  int64_t prompt_lookup_min = 1;
};

// vLLM's --speculative-config JSON, "ngram" method only: num_speculative_tokens in [1, 16], 1 <= prompt_lookup_min
// <= prompt_lookup_max. Throws std::invalid_argument naming the field (another method, an unknown key, a range).
SpeculativeConfig parse_speculative_config(const std::string& json_text);

// The draft for `tokens` (prompt and drawn), at most `limit` tokens; empty when no n-gram recurs.
std::vector<int64_t> propose_ngram(const std::vector<int64_t>& tokens, const SpeculativeConfig& config, int64_t limit);

}  // namespace serve
