// Generation: prefill on the prompts, then one token per step with the KV cache (kv_cache.h), which the decoder owns
// and hands to each forward through its context (common/forward_context.h).
// No parallel code: under llama::inference_plan the same loop runs on every rank of the TP group; the
// logits lm_head returns are replicated (gathered once per step, for the last position only), and each
// rank's Sampler, seeded alike, draws the same tokens.
//
// Prompts of different lengths are left-padded to the longest, with an attention mask (HF's layout), so
// every sequence's next token sits in the same column. A sequence stops at its end token (or the maximum
// new tokens); a finished sequence is fed the pad token until all stop, and its output ignores them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "llama/model.h"
#include "inference/sampling.h"

namespace inference {

using llama::LlamaForCausalLM;

// The step-by-step decoder under generate(): prefill() once, then step() per token. With use_cache it
// keeps a KVCache of prompt + max_new_tokens positions and feeds the model one new column per step; the
// naive reference (use_cache = false) feeds the whole sequence so far every step, as HF with
// use_cache=False. Either returns the logits [b, vocab] of each sequence's last position.
class Decoder {
 public:
  Decoder(LlamaForCausalLM model, const std::vector<std::vector<int64_t>>& prompts, int64_t max_new_tokens,
          int64_t pad_token_id = 0, bool use_cache = true);
  ~Decoder() = default;
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  at::Tensor prefill();
  at::Tensor step(const at::Tensor& next_tokens);  // next_tokens [b] (int64)

  const at::Tensor& tokens() const { return tokens_; }                  // [b, padded prompt + steps so far]
  const at::Tensor& attention_mask() const { return attention_mask_; }  // [b, same], 0 on left padding
  int64_t prompt_length() const { return prompt_length_; }              // padded
  // What each forward reads: the layers' caches (inference/kv_cache.h), none for the naive reference.
  const models::ForwardContext& context() const { return context_; }

 private:
  at::Tensor last_logits(const at::Tensor& tokens, const at::Tensor& mask);
  LlamaForCausalLM model_;
  bool use_cache_;
  int64_t capacity_ = 0;  // the cache's positions
  models::ForwardContext context_;  // the caches (none for the naive reference)
  int64_t prompt_length_;
  at::Tensor tokens_, attention_mask_;
};

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  std::optional<int64_t> eos_token_id;  // a sequence stops after drawing it (it is kept in the output)
  int64_t pad_token_id = 0;             // fills the left padding and finished sequences' columns
  SamplingOptions sampling;
  bool use_cache = true;  // false: the naive reference (Decoder's)
  bool keep_logits = false;  // GenerateResult::step_logits
};

struct GenerateResult {
  std::vector<std::vector<int64_t>> new_tokens;  // per sequence, up to and including its end token
  std::vector<at::Tensor> step_logits;           // [b, vocab] per drawn token (keep_logits)
  int64_t prompt_tokens = 0;                      // unpadded, all sequences
  int64_t steps = 0;                              // tokens drawn per sequence (columns)
  double prefill_ms = 0;                          // prompts' forward and the first draw
  double decode_ms = 0;                           // the steps after the first draw
};

// Called after each draw with the tokens drawn ([b]; -1 for a sequence already finished before it).
using TokenCallback = std::function<void(int64_t step, const std::vector<int64_t>& tokens)>;

// Throws dtensor::Error for empty prompts, token ids outside the vocabulary, or a total length beyond the
// model's max_position_embeddings.
GenerateResult generate(LlamaForCausalLM model, const std::vector<std::vector<int64_t>>& prompts,
                        const GenerateOptions& options, const TokenCallback& on_token = {});

}  // namespace inference
