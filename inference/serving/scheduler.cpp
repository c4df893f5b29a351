#include "inference/serving/scheduler.h"

#include <algorithm>

#include "dtensor/core/error.h"

namespace serve {

BlockAllocator::BlockAllocator(int64_t num_blocks) : total_(num_blocks) {
  // Handed out from the lowest index: a LIFO free list, so a freed block is reused first.
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

std::optional<int64_t> BlockAllocator::allocate() {
  if (free_.empty()) return std::nullopt;
  const int64_t b = free_.back();
  free_.pop_back();
  return b;
}

void BlockAllocator::release(std::vector<int64_t>& blocks) {
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) free_.push_back(*it);
  blocks.clear();
}

namespace {
inference::SamplingOptions sampling_of(const SamplingParams& p, uint64_t seed) {
  inference::SamplingOptions o;
  o.temperature = p.temperature;
  o.top_k = p.top_k;
  o.top_p = p.top_p;
  o.seed = p.seed.value_or(seed);
  return o;
}
}  // namespace

Sequence::Sequence(std::shared_ptr<Request> req, const tokenizer::Tokenizer& tok, uint64_t seed)
    : request(std::move(req)),
      tokens(request->api.prompt_ids),
      prompt_len(static_cast<int64_t>(tokens.size())),
      sampler(sampling_of(request->api.params, seed)),
      processing(request->api.params.processing),
      text(tok, request->api.prompt_ids, request->api.params.stop) {
  if (auto eos = tok.eos_token_id(); eos && !request->api.params.ignore_eos) processing.stop_token_ids.push_back(*eos);
}

Scheduler::Scheduler(int64_t num_blocks, int64_t block_size, int64_t max_num_seqs, int64_t max_num_batched_tokens)
    : blocks_(num_blocks),
      block_size_(block_size),
      max_num_seqs_(max_num_seqs),
      max_num_batched_tokens_(max_num_batched_tokens) {}

void Scheduler::add(std::unique_ptr<Sequence> seq) { waiting_.push_back(std::move(seq)); }

bool Scheduler::grow(Sequence& seq, int64_t positions) {
  while (static_cast<int64_t>(seq.blocks.size()) * block_size_ < positions) {
    auto b = blocks_.allocate();
    if (!b) return false;
    seq.blocks.push_back(*b);
  }
  return true;
}

void Scheduler::preempt(size_t i) {
  std::unique_ptr<Sequence> seq = std::move(running_[i]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
  blocks_.release(seq->blocks);
  seq->computed = 0;  // recomputed from its prompt and drawn tokens when admitted again
  ++preemptions_;
  waiting_.push_front(std::move(seq));
}

Scheduler::Batch Scheduler::schedule() {
  Batch batch;
  int64_t budget = max_num_batched_tokens_;
  auto add_chunk = [&](Sequence& s, int64_t n) {
    const int64_t total = static_cast<int64_t>(s.tokens.size());
    std::vector<int64_t> toks(s.tokens.begin() + s.computed, s.tokens.begin() + s.computed + n);
    batch.chunks.push_back({std::move(toks), s.computed, s.blocks, s.computed + n == total});
    batch.seqs.push_back(&s);
    s.computed += n;
    budget -= n;
  };
  // Running sequences first, oldest first; one without a free block preempts the youngest (maybe itself).
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence& s = *running_[i];
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(s.tokens.size()) - s.computed, budget);
    bool fits = grow(s, s.computed + n);
    while (!fits && running_.size() - 1 > i) {
      preempt(running_.size() - 1);
      fits = grow(s, s.computed + n);
    }
    if (!fits) {
      preempt(i);
      break;
    }
    add_chunk(s, n);
    ++i;
  }
  // Then the queue, in order, while there is room.
  while (!waiting_.empty() && budget > 0 && static_cast<int64_t>(running_.size()) < max_num_seqs_) {
    Sequence& s = *waiting_.front();
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(s.tokens.size()) - s.computed, budget);
    const int64_t need = (s.computed + n + block_size_ - 1) / block_size_ - static_cast<int64_t>(s.blocks.size());
    if (need > blocks_.free()) break;
    grow(s, s.computed + n);
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    add_chunk(*running_.back(), n);
  }
  return batch;
}

void Scheduler::remove(Sequence* seq) {
  auto drop = [&](auto& list) {
    for (auto it = list.begin(); it != list.end(); ++it) {
      if (it->get() == seq) {
        blocks_.release((*it)->blocks);
        list.erase(it);
        return true;
      }
    }
    return false;
  };
  if (!drop(running_)) drop(waiting_);
}

std::vector<Sequence*> Scheduler::all() const {
  std::vector<Sequence*> out;
  for (const auto& s : running_) out.push_back(s.get());
  for (const auto& s : waiting_) out.push_back(s.get());
  return out;
}

}  // namespace serve
