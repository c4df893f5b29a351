#include "inference/logits_processors.h"

#include <ATen/ATen.h>

#include <limits>

namespace inference {

at::Tensor process_logits(const LogitsProcessing& p, const at::Tensor& logits, const std::vector<int64_t>& tokens,
                          int64_t prompt_len) {
  at::Tensor s = logits.to(at::kFloat).clone();
  if (!p.active()) return s;
  at::Tensor row = s.view({-1});
  const int64_t vocab = row.size(0);
  const int64_t drawn = static_cast<int64_t>(tokens.size()) - prompt_len;
  for (const auto& [token, bias] : p.logit_bias) {
    if (token >= 0 && token < vocab) row[token] += bias;
  }
  if (drawn < p.min_tokens) {
    for (int64_t t : p.stop_token_ids) {
      if (t >= 0 && t < vocab) row[t] = -std::numeric_limits<float>::infinity();
    }
  }
  if (p.repetition_penalty != 1.0 && !tokens.empty()) {
    // Each distinct token once (transformers gathers with repeats and scatters back the same value).
    at::Tensor ids = std::get<0>(at::_unique(at::tensor(tokens, at::kLong)));
    at::Tensor seen = row.index_select(0, ids);
    seen = at::where(seen < 0, seen * p.repetition_penalty, seen / p.repetition_penalty);
    row.index_copy_(0, ids, seen);
  }
  if ((p.frequency_penalty != 0.0 || p.presence_penalty != 0.0) && drawn > 0) {
    std::vector<int64_t> output(tokens.begin() + prompt_len, tokens.end());
    at::Tensor counts = at::zeros({vocab}, at::kFloat);
    counts.index_add_(0, at::tensor(output, at::kLong), at::ones({drawn}, at::kFloat));
    row -= counts * static_cast<float>(p.frequency_penalty);
    row -= (counts > 0).to(at::kFloat) * static_cast<float>(p.presence_penalty);
  }
  return s;
}

}  // namespace inference
