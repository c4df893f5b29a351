// Continuous batching (vLLM's scheduler, simplified): which sequences run in the next forward and which of their
// tokens. Every step, each running sequence computes what it has not yet computed (one token when decoding; a
// prompt is prefilled in chunks within the step's token budget), then waiting sequences are admitted in arrival
// order while there is room (max_num_seqs, the token budget, free KV blocks). Sequences join and leave the batch
// at token boundaries.
//
// With prefix caching, a sequence admitted with nothing computed first takes the cached blocks that begin its
// tokens (block_pool.h) and computes from there; at least its last token is always computed (its logits).
// KV blocks (llama/paged_kv_cache.h) are handed out as positions need them and taken back when a sequence ends.
// When a running sequence needs a block and none is free, the youngest running sequence is preempted: its blocks
// are freed and it goes back to the front of the queue, to be recomputed (prompt and drawn tokens) when it is
// admitted again (vLLM's recompute preemption).
//
// Rank 0 only; plain bookkeeping, no tensors.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "inference/paged_kv_cache.h"
#include "inference/serving/block_pool.h"
#include "inference/sampling.h"
#include "inference/serving/request.h"
#include "inference/structured/grammar.h"
#include "inference/serving/text_output.h"

namespace serve {


struct Sequence {
  Sequence(std::shared_ptr<Request> request, const tokenizer::Tokenizer& tok, uint64_t seed, int64_t index = 0);
  std::shared_ptr<Request> request;
  int64_t index = 0;  // which of the request's n choices
  std::vector<int64_t> tokens;  // prompt, then the drawn tokens
  int64_t prompt_len = 0;
  int64_t computed = 0;  // tokens whose keys and values are in the cache
  std::vector<int64_t> blocks;
  inference::Sampler sampler;
  inference::LogitsProcessing processing;  // the request's, with the end-of-sequence token for min_tokens
  std::vector<int64_t> draft;  // speculative tokens to score after the last one (set before schedule(), then used)
  std::optional<structured::Matcher> grammar;  // structured output: where the drawn text is in the request's grammar
  TextOutput text;
  std::vector<int64_t> unsent_ids;  // drawn tokens not yet in an event
  int64_t drawn() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }  // tokens generated so far
};

class Scheduler {
 public:
  // prefix_caching: admitted sequences start after the longest run of cached blocks of their tokens (block_pool.h).
  Scheduler(int64_t num_blocks, int64_t block_size, int64_t max_num_seqs, int64_t max_num_batched_tokens,
            bool prefix_caching = false);

  void add(std::unique_ptr<Sequence> seq);  // to the back of the queue

  struct Batch {
    std::vector<inference::PagedChunk> chunks;
    std::vector<Sequence*> seqs;  // chunk i's sequence
  };
  Batch schedule();
  // Removes `seq` (finished, cancelled or failed) and frees its blocks.
  void remove(Sequence* seq);
  // Removes `seq` after the step that scheduled it failed: as remove, and its blocks are forgotten by the prefix
  // cache (schedule() cached them for the step to write).
  void discard(Sequence* seq);
  // Every sequence, running then waiting (for cancellation checks and failure).
  std::vector<Sequence*> all() const;

  int64_t waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t running() const { return static_cast<int64_t>(running_.size()); }
  const BlockAllocator& blocks() const { return blocks_; }
  int64_t preemptions() const { return preemptions_; }
  int64_t block_size() const { return block_size_; }

 private:
  bool grow(Sequence& seq, int64_t positions);  // blocks for `positions`; false when none is free
  void preempt(size_t running_index);
  void drop(Sequence* seq, bool uncached);

  BlockAllocator blocks_;
  int64_t block_size_, max_num_seqs_, max_num_batched_tokens_;
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order
  std::deque<std::unique_ptr<Sequence>> waiting_;
  int64_t preemptions_ = 0;
};

}  // namespace serve
