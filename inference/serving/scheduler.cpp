#include "inference/serving/scheduler.h"

#include <algorithm>

#include "dtensor/core/error.h"

namespace serve {

namespace {
inference::SamplingOptions sampling_of(const SamplingParams& p, uint64_t seed) {
  inference::SamplingOptions o;
  o.temperature = p.temperature;
  o.top_k = p.top_k;
  o.top_p = p.top_p;
  o.seed = seed;
  return o;
}
}  // namespace

Sequence::Sequence(std::shared_ptr<Request> req, const tokenizer::Tokenizer& tok, uint64_t seed, int64_t index)
    : request(std::move(req)),
      index(index),
      tokens(request->api.prompt_ids),
      prompt_len(static_cast<int64_t>(tokens.size())),
      sampler(sampling_of(request->api.params, request->api.params.seed ? *request->api.params.seed + index : seed)),
      processing(request->api.params.processing),
      text(tok, request->api.prompt_ids, request->api.params.stop) {
  if (auto eos = tok.eos_token_id(); eos && !request->api.params.ignore_eos) processing.stop_token_ids.push_back(*eos);
  if (request->api.structured.grammar) grammar.emplace(*request->api.structured.grammar);
}

Scheduler::Scheduler(int64_t num_blocks, int64_t block_size, int64_t max_num_seqs, int64_t max_num_batched_tokens,
                     bool prefix_caching)
    : blocks_(num_blocks, prefix_caching),
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
  seq->draft.clear();
  ++preemptions_;
  waiting_.push_front(std::move(seq));
}

Scheduler::Batch Scheduler::schedule() {
  Batch batch;
  int64_t budget = max_num_batched_tokens_;
  // n of the sequence's tokens; when it decodes (one token), its draft after it, each position wanting logits.
  auto add_chunk = [&](Sequence& s, int64_t n, int64_t drafted) {
    const int64_t total = static_cast<int64_t>(s.tokens.size());
    std::vector<int64_t> toks(s.tokens.begin() + s.computed, s.tokens.begin() + s.computed + n);
    toks.insert(toks.end(), s.draft.begin(), s.draft.begin() + drafted);
    batch.chunks.push_back({std::move(toks), s.computed, s.blocks, s.computed + n == total ? 1 + drafted : 0});
    batch.seqs.push_back(&s);
    s.computed += n + drafted;  // the serving loop takes back the positions of draft tokens it rejects
    s.draft.resize(static_cast<size_t>(drafted));
    budget -= n + drafted;
  };
  auto drafted_of = [&](const Sequence& s, int64_t n) {
    const bool decoding = s.computed + n == static_cast<int64_t>(s.tokens.size()) && n == 1;
    return decoding ? std::min<int64_t>(static_cast<int64_t>(s.draft.size()), budget - n) : 0;
  };
  // Running sequences first, oldest first; one without a free block preempts the youngest (maybe itself).
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence& s = *running_[i];
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(s.tokens.size()) - s.computed, budget);
    int64_t drafted = drafted_of(s, n);
    if (drafted > 0 && !grow(s, s.computed + n + drafted)) drafted = 0;  // no block for the draft: decode plainly
    bool fits = grow(s, s.computed + n);
    while (!fits && running_.size() - 1 > i) {
      preempt(running_.size() - 1);
      fits = grow(s, s.computed + n);
    }
    if (!fits) {
      preempt(i);
      break;
    }
    add_chunk(s, n, drafted);
    ++i;
  }
  // Then the queue, in order, while there is room.
  while (!waiting_.empty() && budget > 0 && static_cast<int64_t>(running_.size()) < max_num_seqs_) {
    Sequence& s = *waiting_.front();
    const int64_t total = static_cast<int64_t>(s.tokens.size());
    const bool fresh = s.computed == 0 && s.blocks.empty();
    if (fresh) {  // the cached blocks that begin its tokens, leaving at least the last token to compute
      s.blocks = blocks_.match(s.tokens, block_size_, (total - 1) / block_size_);
      s.computed = static_cast<int64_t>(s.blocks.size()) * block_size_;
    }
    const int64_t n = std::min<int64_t>(total - s.computed, budget);
    const int64_t need = (s.computed + n + block_size_ - 1) / block_size_ - static_cast<int64_t>(s.blocks.size());
    if (need > blocks_.free()) {
      if (fresh) {  // not admitted: it holds nothing while it waits
        blocks_.release(s.blocks);
        s.computed = 0;
      }
      break;
    }
    grow(s, s.computed + n);
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    add_chunk(*running_.back(), n, 0);
  }
  // The blocks this step fills are findable from the next schedule() on, once the step has written them.
  // (Only real tokens' positions: a draft's are not known to be kept.)
  for (Sequence* seq : batch.seqs) {
    blocks_.cache(seq->tokens, seq->blocks, block_size_, std::min<int64_t>(seq->computed, static_cast<int64_t>(seq->tokens.size())));
  }
  return batch;
}

void Scheduler::remove(Sequence* seq) { drop(seq, false); }

void Scheduler::discard(Sequence* seq) { drop(seq, true); }

void Scheduler::drop(Sequence* seq, bool uncached) {
  auto drop = [&](auto& list) {
    for (auto it = list.begin(); it != list.end(); ++it) {
      if (it->get() == seq) {
        if (uncached) {
          blocks_.release_uncached((*it)->blocks);
        } else {
          blocks_.release((*it)->blocks);
        }
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
