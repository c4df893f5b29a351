// Rank 0's serving loop: takes the requests HTTP handlers submit, schedules them (scheduler.h), runs each step on
// every rank (engine.h), draws each sequence's next token with its own sampler (temperature, top_k, top_p, seed),
// turns tokens into text (text_output.h) and hands the text to the request's handler, token by token.
//
// A sequence ends at the tokenizer's end-of-sequence token (unless ignore_eos), at a stop string, at max_tokens,
// or at max_model_len. A cancelled request (its streaming client went away) is dropped at the next step, freeing
// its KV blocks.
//
// Failures (each logged on the spot as an `error: serve:` line):
//   - a sequence's output throws (its tokenizer, logits processors, grammar): its request alone is answered 500
//     (a stream: an error event); the ranks are in step (the forward's collectives are over), the rest go on;
//   - the forward throws at TP 1: the step's requests are answered 500, their KV blocks forgotten by the prefix
//     cache, the rest go on;
//   - the forward or the broadcast throws at TP > 1 (a rank died, or threw between collectives): the ranks are out
//     of step, every open request is answered 503, and run() returns why (the server stops);
//   - anything else escaping a step: as at TP > 1.
// (Signals are main.cpp's: the loop may then be stuck in a collective.)
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>

#include "inference/serving/engine.h"
#include "inference/serving/metrics.h"
#include "inference/serving/ngram_proposer.h"
#include "inference/serving/request.h"
#include "inference/serving/scheduler.h"
#include "inference/structured/token_mask.h"
#include "tokenizer/tokenizer.h"

namespace serve {

struct LoopOptions {
  int64_t num_blocks = 0, block_size = 16, max_num_seqs = 16, max_num_batched_tokens = 256, max_model_len = 0;
  uint64_t seed = 0;
  bool enable_prefix_caching = true;  // vLLM's --enable-prefix-caching (its default since v1)
  SpeculativeConfig speculative;      // prompt lookup for greedy requests (ngram_proposer.h); off by default
};

class ServingLoop {
 public:
  ServingLoop(Engine& engine, const tokenizer::Tokenizer& tok, Metrics& metrics, const LoopOptions& options);
  // From any thread. False when the server has failed or is stopping (answer 503).
  bool submit(std::shared_ptr<Request> request);
  // Runs until a step fails (a rank died: a collective threw) and returns why, every open request answered 503; or
  // until request_stop(), returning "".
  std::string run();
  // From any thread: submit() refuses from now on (the server is stopping).
  void refuse_new() { stopping_ = true; }
  // From any thread: run() answers what is still open 503 and returns "" at its next step (a graceful stop).
  void request_stop() {
    stopping_ = true;
    stop_requested_ = true;
    cv_.notify_one();
  }
  bool failed() const { return failed_; }
  bool stopping() const { return stopping_; }
  int64_t requests_finished() const { return finished_; }
  int64_t tokens_generated() const { return generated_; }

 private:
  void intake();
  void drop_cancelled();
  // Hands `token` to the request; false when it ended the sequence (which is then gone).
  bool emit(Sequence& seq, int64_t token, std::vector<TokenLogprob> logprobs);
  void propose_drafts();
  void finish(Sequence& seq, std::string text, const std::string& reason, std::vector<TokenLogprob> logprobs = {});
  TokenLogprob logprob_of(const at::Tensor& raw_logits, int64_t token, int64_t top) const;
  // Structured output: `scores` with the tokens the sequence's grammar refuses at -inf (the vocabulary's bytes are
  // read once, at the first such request); false when no token of the vocabulary continues the text.
  bool mask_to_grammar(const Sequence& seq, at::Tensor& scores);
  // After `token` is drawn: the grammar follows its bytes.
  void advance_grammar(Sequence& seq, int64_t token);
  void fail_all(const std::string& message);
  std::string run_steps();
  // A scored sequence's logits ([scored, vocab]) into its next token(s), its text and its request's events. Throws
  // when its tokenizer, processors or grammar fail: that fails its request alone.
  void output(Sequence& seq, const at::Tensor& logits, int64_t scored);
  // Answers `request` 500 with `message` once (logged on the spot) and adds it to `failed`.
  void fail_request(const std::shared_ptr<Request>& request, const std::string& message,
                    std::set<std::shared_ptr<Request>>& failed);
  // Removes every sequence of the failed requests (discarded from the prefix cache when their step failed).
  void discard_failed(const std::set<std::shared_ptr<Request>>& failed, bool step_failed);
  void log_error(const std::string& message) const;

  Engine& engine_;
  const tokenizer::Tokenizer& tok_;
  Metrics& metrics_;
  LoopOptions options_;
  Scheduler scheduler_;
  std::mt19937_64 seeds_;
  std::unique_ptr<structured::TokenMask> token_mask_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> incoming_;
  std::atomic<bool> failed_{false}, stopping_{false}, stop_requested_{false};
  std::atomic<int64_t> finished_{0}, generated_{0};
};

}  // namespace serve
