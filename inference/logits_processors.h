// What a request may do to the logits before the draw (vLLM's SamplingParams; the processors of transformers'
// generate where it has them), applied in vLLM's order on one sequence's raw logits:
//   logit_bias   logits[t] += bias                         (OpenAI's; transformers' SequenceBiasLogitsProcessor
//                                                           with one-token sequences)
//   min_tokens   logits[t] = -inf for each stop token t while fewer than min_tokens are drawn
//                                                          (transformers' MinNewTokensLengthLogitsProcessor)
//   repetition   over every token of prompt and output: s < 0 ? s * p : s / p
//                                                          (transformers' RepetitionPenaltyLogitsProcessor)
//   frequency    logits[t] -= frequency_penalty * count of t in the output   (OpenAI's, as vLLM applies them;
//   presence     logits[t] -= presence_penalty  * (t in the output)           transformers has no processor)
// Temperature, top-k and top-p come after (sampling.h). A naive reference of each is in
// tests/inference/serve_sampling_test.py (transformers' own processors where they exist).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace inference {

struct LogitsProcessing {
  std::vector<std::pair<int64_t, double>> logit_bias;  // (token, bias in [-100, 100])
  int64_t min_tokens = 0;
  std::vector<int64_t> stop_token_ids;  // masked while fewer than min_tokens are drawn (the end-of-sequence token)
  double repetition_penalty = 1.0;      // > 0; 1: off
  double frequency_penalty = 0.0;       // [-2, 2]; 0: off
  double presence_penalty = 0.0;        // [-2, 2]; 0: off
  bool active() const {
    return !logit_bias.empty() || min_tokens > 0 || repetition_penalty != 1.0 || frequency_penalty != 0.0 ||
           presence_penalty != 0.0;
  }
};

// logits [1, vocab] or [vocab] (float), the sequence's tokens (prompt, then output from `prompt_len`): the
// processed logits (a new tensor; the input is untouched).
at::Tensor process_logits(const LogitsProcessing& p, const at::Tensor& logits, const std::vector<int64_t>& tokens,
                          int64_t prompt_len);

}  // namespace inference
