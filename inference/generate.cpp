#include "inference/generate.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "dtensor/core/error.h"
#include "inference/kv_cache.h"

namespace inference {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

void check_prompts(const llama::LlamaConfig& config, const std::vector<std::vector<int64_t>>& prompts, int64_t max_new_tokens) {
  DTENSOR_CHECK(!prompts.empty(), "llama generate: no prompts");
  DTENSOR_CHECK(max_new_tokens > 0, "llama generate: max_new_tokens must be positive, got ", max_new_tokens);
  for (size_t i = 0; i < prompts.size(); ++i) {
    DTENSOR_CHECK(!prompts[i].empty(), "llama generate: prompt ", i, " is empty");
    for (int64_t id : prompts[i]) {
      DTENSOR_CHECK(id >= 0 && id < config.vocab_size, "llama generate: prompt ", i, " has token id ", id,
                    ", outside the vocabulary [0, ", config.vocab_size, ")");
    }
  }
  // No limit at max_position_embeddings: as transformers' generate, positions past it take the rotary
  // embedding's frequencies for them (rope.h), whatever the rope kind.
}

}  // namespace

Decoder::Decoder(LlamaForCausalLM model, const std::vector<std::vector<int64_t>>& prompts, int64_t max_new_tokens,
                 int64_t pad_token_id, bool use_cache)
    : model_(std::move(model)), use_cache_(use_cache) {
  check_prompts(model_->config, prompts, max_new_tokens);
  const int64_t b = static_cast<int64_t>(prompts.size());
  prompt_length_ = 0;
  for (const auto& p : prompts) prompt_length_ = std::max<int64_t>(prompt_length_, static_cast<int64_t>(p.size()));
  // Left padding: each prompt ends in the last column.
  tokens_ = at::full({b, prompt_length_}, pad_token_id, at::kLong);
  attention_mask_ = at::zeros({b, prompt_length_}, at::kLong);
  for (int64_t i = 0; i < b; ++i) {
    const int64_t n = static_cast<int64_t>(prompts[i].size()), pad = prompt_length_ - n;
    tokens_[i].narrow(0, pad, n).copy_(at::tensor(prompts[i], at::kLong));
    attention_mask_[i].narrow(0, pad, n).fill_(1);
    context_.left_padding.push_back(pad);  // the mask is this padding and nothing else: the cache may attend itself
  }
  capacity_ = prompt_length_ + max_new_tokens;
  if (use_cache_) context_.kv_caches = make_kv_caches(model_->config, capacity_);
}

at::Tensor Decoder::last_logits(const at::Tensor& tokens, const at::Tensor& mask) {
  const models::ForwardContextGuard on(context_);
  at::Tensor hidden = model_->model(tokens, mask);  // [b, s, hidden]
  // lm_head on the last position only: under TP its gather moves [b, 1, vocab], not [b, s, vocab].
  return model_->logits(hidden.narrow(1, hidden.size(1) - 1, 1)).squeeze(1);
}

at::Tensor Decoder::prefill() { return last_logits(tokens_, attention_mask_); }

at::Tensor Decoder::step(const at::Tensor& next_tokens) {
  at::Tensor column = next_tokens.to(at::kLong).view({-1, 1});
  tokens_ = at::cat({tokens_, column}, 1);
  attention_mask_ = at::cat({attention_mask_, at::ones_like(column)}, 1);
  const llama::LlamaConfig& c = model_->config;
  if (use_cache_ && c.rotary.recompute_original_max > 0 && tokens_.size(1) >= c.rotary.recompute_original_max + 1 &&
      context_.past() <= c.rotary.recompute_original_max) {
    // Phi-3's prepare_inputs_for_generation: past original_max_position_embeddings the cache is dropped and
    // the whole sequence recomputed (longrope switches to its long factors for every position).
    context_.kv_caches = make_kv_caches(c, capacity_);
    return last_logits(tokens_, attention_mask_);
  }
  return use_cache_ ? last_logits(column, attention_mask_) : last_logits(tokens_, attention_mask_);
}

GenerateResult generate(LlamaForCausalLM model, const std::vector<std::vector<int64_t>>& prompts,
                        const GenerateOptions& options, const TokenCallback& on_token) {
  at::NoGradGuard no_grad;
  Sampler sampler(options.sampling);
  GenerateResult result;
  for (const auto& p : prompts) result.prompt_tokens += static_cast<int64_t>(p.size());
  const size_t b = prompts.size();
  result.new_tokens.resize(b);
  std::vector<bool> finished(b, false);

  const auto start = Clock::now();
  Decoder decoder(model, prompts, options.max_new_tokens, options.pad_token_id, options.use_cache);
  at::Tensor logits = decoder.prefill();
  Clock::time_point decode_start;
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    if (step > 0) {
      // Finished sequences get the pad token; their columns are never read back.
      std::vector<int64_t> column(b);
      for (size_t i = 0; i < b; ++i) column[i] = finished[i] ? options.pad_token_id : result.new_tokens[i].back();
      logits = decoder.step(at::tensor(column, at::kLong));
    }
    if (options.keep_logits) result.step_logits.push_back(logits.clone());
    at::Tensor drawn = sampler.sample(logits).contiguous();
    const int64_t* ids = drawn.data_ptr<int64_t>();
    std::vector<int64_t> reported(b, -1);
    for (size_t i = 0; i < b; ++i) {
      if (finished[i]) continue;
      reported[i] = ids[i];
      result.new_tokens[i].push_back(ids[i]);
      if (options.eos_token_id && ids[i] == *options.eos_token_id) finished[i] = true;
    }
    result.steps = step + 1;
    if (step == 0) {
      result.prefill_ms = ms_since(start);
      decode_start = Clock::now();
    }
    if (on_token) on_token(step, reported);
    if (std::all_of(finished.begin(), finished.end(), [](bool f) { return f; })) break;
  }
  result.decode_ms = result.steps > 1 ? ms_since(decode_start) : 0.0;
  return result;
}

}  // namespace inference
