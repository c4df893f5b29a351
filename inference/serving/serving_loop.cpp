#include "inference/serving/serving_loop.h"

#include <ATen/ATen.h>

#include "inference/logits_processors.h"

#include <cstdio>
#include <limits>
#include <stdexcept>
#include <utility>

#include "dtensor/core/error.h"

namespace serve {
namespace {
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

ServingLoop::ServingLoop(Engine& engine, const tokenizer::Tokenizer& tok, Metrics& metrics, const LoopOptions& options)
    : engine_(engine),
      tok_(tok),
      metrics_(metrics),
      options_(options),
      scheduler_(options.num_blocks, options.block_size, options.max_num_seqs, options.max_num_batched_tokens,
                 options.enable_prefix_caching),
      seeds_(options.seed) {}

bool ServingLoop::submit(std::shared_ptr<Request> request) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_ || stopping_) return false;
    incoming_.push_back(std::move(request));
  }
  cv_.notify_one();
  return true;
}

void ServingLoop::intake() {
  std::deque<std::shared_ptr<Request>> fresh;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fresh.swap(incoming_);
  }
  for (auto& r : fresh) {
    metrics_.tokens(static_cast<int64_t>(r->api.prompt_ids.size()), 0);
    // n choices: n sequences of the prompt (a request's seed gives choice i the seed + i).
    for (int64_t i = 0; i < r->api.params.n; ++i) scheduler_.add(std::make_unique<Sequence>(r, tok_, seeds_(), i));
  }
}

void ServingLoop::drop_cancelled() {
  for (Sequence* s : scheduler_.all()) {
    if (s->request->cancelled()) scheduler_.remove(s);
  }
}

void ServingLoop::finish(Sequence& seq, std::string text, const std::string& reason, std::vector<TokenLogprob> logprobs) {
  seq.request->push({std::move(text), reason, 0, "", std::move(logprobs), seq.index, std::exchange(seq.unsent_ids, {})});
  metrics_.latency(seconds_since(seq.request->arrival));
  ++finished_;
  scheduler_.remove(&seq);  // frees its blocks; `seq` is gone after this
}

TokenLogprob ServingLoop::logprob_of(const at::Tensor& raw_logits, int64_t token, int64_t top) const {
  // Of the model's raw logits (vLLM's default "raw_logprobs"): before penalties, bias and temperature.
  const at::Tensor lp = raw_logits.to(at::kFloat).reshape({-1}).log_softmax(0);
  auto text = [&](int64_t id) { return tok_.decode({id}, false, tokenizer::UnknownIds::kSkip); };
  TokenLogprob out{token, text(token), lp[token].item<double>(), {}};
  if (top > 0) {
    auto [values, ids] = lp.topk(std::min<int64_t>(top, lp.size(0)));
    for (int64_t i = 0; i < values.size(0); ++i) {
      out.top.emplace_back(text(ids[i].item<int64_t>()), values[i].item<double>());
    }
  }
  return out;
}

bool ServingLoop::emit(Sequence& seq, int64_t token, std::vector<TokenLogprob> logprobs) {
  seq.tokens.push_back(token);
  seq.unsent_ids.push_back(token);
  ++generated_;
  metrics_.tokens(0, 1);
  ++seq.request->completion_tokens;
  if (seq.drawn() == 1) metrics_.first_token(seconds_since(seq.request->arrival));
  const SamplingParams& p = seq.request->api.params;
  const auto eos = tok_.eos_token_id();
  // Under a grammar the end-of-sequence token is allowed only when the text is complete: it is the grammar's end and
  // stops the choice even with ignore_eos (never kept as text after the JSON).
  if ((!p.ignore_eos || seq.grammar) && eos && token == *eos) {
    return finish(seq, seq.text.end(), "stop", std::move(logprobs)), false;
  }
  std::string piece = seq.text.put(token);
  if (seq.text.stopped()) return finish(seq, std::move(piece), "stop", std::move(logprobs)), false;
  if (seq.drawn() >= p.max_tokens || static_cast<int64_t>(seq.tokens.size()) >= options_.max_model_len) {
    return finish(seq, piece + seq.text.end(), "length", std::move(logprobs)), false;
  }
  if (!piece.empty() || !logprobs.empty()) {
    seq.request->push({std::move(piece), "", 0, "", std::move(logprobs), seq.index, std::exchange(seq.unsent_ids, {})});
  }
  return true;
}

bool ServingLoop::mask_to_grammar(const Sequence& seq, at::Tensor& scores) {
  if (!token_mask_) {
    std::vector<std::optional<std::string>> bytes(static_cast<size_t>(tok_.vocab_size()));
    for (int64_t id = 0; id < tok_.vocab_size(); ++id) bytes[static_cast<size_t>(id)] = tok_.token_bytes(id);
    std::vector<int64_t> stops;
    if (auto eos = tok_.eos_token_id()) stops.push_back(*eos);
    token_mask_ = std::make_unique<structured::TokenMask>(bytes, stops);
  }
  const std::vector<uint8_t> allowed = token_mask_->allowed(*seq.request->api.structured.states, *seq.grammar);
  // The model's vocabulary may be padded past the tokenizer's: those rows are never allowed.
  at::Tensor keep = at::zeros({scores.size(-1)}, at::kBool);
  const int64_t n = std::min<int64_t>(scores.size(-1), static_cast<int64_t>(allowed.size()));
  bool any = false;
  auto k = keep.accessor<bool, 1>();
  for (int64_t id = 0; id < n; ++id) {
    k[id] = allowed[static_cast<size_t>(id)] != 0;
    any = any || k[id];
  }
  if (!any) return false;
  scores = scores.masked_fill(keep.logical_not(), -std::numeric_limits<float>::infinity());
  return true;
}

void ServingLoop::advance_grammar(Sequence& seq, int64_t token) {
  if (token_mask_->is_stop(token)) return;
  const auto& bytes = token_mask_->bytes(token);
  const bool ok = bytes && seq.grammar->accept(*bytes);
  DTENSOR_CHECK(ok, "serve: structured output drew token ", token, ", which its grammar refuses");  // the mask allowed it
}

void ServingLoop::propose_drafts() {
  // Greedy requests without processors or logprobs, decoding: the draft the scheduler scores after the last token.
  for (Sequence* s : scheduler_.all()) {
    s->draft.clear();
    const SamplingParams& p = s->request->api.params;
    const int64_t size = static_cast<int64_t>(s->tokens.size());
    if (p.temperature > 0 || p.logprobs || s->processing.active() || s->grammar || s->computed != size - 1) continue;
    // Room after the next token, within max_tokens and the context.
    const int64_t room = std::min(p.max_tokens - s->drawn(), options_.max_model_len - size) - 1;
    s->draft = propose_ngram(s->tokens, options_.speculative, room);
  }
}

void ServingLoop::fail_all(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed_ = true;
  }
  intake();
  for (Sequence* s : scheduler_.all()) {
    s->request->push({"", "", 503, message, {}, 0, {}});
    scheduler_.remove(s);
  }
}

std::string ServingLoop::run() {
  // Anything that escapes a step's own handling (a bug in scheduling or bookkeeping) leaves the loop's state
  // unknown: every open request is answered 503 and the server stops, saying why (never a hang, never silence).
  try {
    return run_steps();
  } catch (const std::exception& e) {
    const std::string why = std::string("the serving loop failed: ") + e.what();
    log_error(why);
    fail_all(why);
    return why;
  }
}

void ServingLoop::log_error(const std::string& message) const {
  std::fprintf(stderr, "error: serve: %s\n", message.c_str());
  std::fflush(stderr);
}

void ServingLoop::fail_request(const std::shared_ptr<Request>& request, const std::string& message,
                               std::set<std::shared_ptr<Request>>& failed) {
  if (!failed.insert(request).second) return;
  log_error("request " + request->id + " failed: " + message);
  request->push({"", "", 500, message, {}, 0, {}});
}

void ServingLoop::discard_failed(const std::set<std::shared_ptr<Request>>& failed, bool step_failed) {
  if (failed.empty()) return;
  for (Sequence* s : scheduler_.all()) {
    if (!failed.contains(s->request)) continue;
    if (step_failed) {
      scheduler_.discard(s);
    } else {
      scheduler_.remove(s);
    }
  }
}

std::string ServingLoop::run_steps() {
  auto last_broadcast = Clock::now();
  while (true) {
    if (stop_requested_) {
      fail_all("the server is shutting down");
      return "";
    }
    intake();
    drop_cancelled();
    if (options_.speculative.num_speculative_tokens > 0) propose_drafts();
    Scheduler::Batch batch = scheduler_.schedule();
    metrics_.step(scheduler_.waiting(), scheduler_.running(), scheduler_.blocks().used(), scheduler_.blocks().total(),
                  scheduler_.preemptions());
    metrics_.prefix_cache(scheduler_.blocks().queried_tokens(), scheduler_.blocks().hit_tokens());
    if (batch.chunks.empty()) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return !incoming_.empty() || stop_requested_; });
      lock.unlock();
      if (seconds_since(last_broadcast) >= 1.0) {  // the followers' heartbeat
        try {
          engine_.idle();
        } catch (const std::exception& e) {
          const std::string why = std::string("a rank failed: ") + e.what();
          fail_all(why);
          return why;
        }
        last_broadcast = Clock::now();
      }
      continue;
    }
    at::Tensor logits;
    try {
      logits = engine_.step(inference::pack_step(batch.chunks, scheduler_.block_size()));
    } catch (const std::exception& e) {
      if (engine_.world_size() > 1) {
        // A collective failed (a rank died), or this rank's forward threw between collectives: the ranks are out of
        // step, and no step can run again.
        const std::string why = std::string("a step failed, the ranks are out of step: ") + e.what();
        fail_all(why);
        return why;
      }
      // One rank is never out of step: the step's requests fail (500), their blocks are forgotten, the rest go on.
      std::set<std::shared_ptr<Request>> failed;
      for (Sequence* s : batch.seqs) fail_request(s->request, std::string("the model's forward failed: ") + e.what(), failed);
      discard_failed(failed, /*step_failed=*/true);
      last_broadcast = Clock::now();
      continue;
    }
    last_broadcast = Clock::now();
    // A sequence whose output throws (its tokenizer, processors, grammar) fails its request (500) alone: the step's
    // collectives are over, so the ranks stay in step. Its sequences are removed after the batch (the batch's
    // pointers stay valid until then).
    std::set<std::shared_ptr<Request>> failed;
    int64_t row = 0;
    bool inject = engine_.faults().output_fault(engine_.steps());
    for (size_t i = 0; i < batch.chunks.size(); ++i) {
      const int64_t scored = batch.chunks[i].logits;
      if (scored == 0) continue;
      const int64_t first = row;
      row += scored;
      Sequence& seq = *batch.seqs[i];
      if (failed.contains(seq.request)) continue;
      try {
        if (inject) {
          inject = false;
          throw std::runtime_error("DTENSOR_SERVE_FAULT: injected failure in the output of step " +
                                   std::to_string(engine_.steps()));
        }
        output(seq, logits.narrow(0, first, scored), scored);
      } catch (const std::exception& e) {
        fail_request(seq.request, e.what(), failed);
      }
    }
    discard_failed(failed, /*step_failed=*/false);
  }
}

void ServingLoop::output(Sequence& seq, const at::Tensor& logits, int64_t scored) {
  if (scored > 1) {  // the last token and a draft: keep the greedy tokens while the draft agrees, then one more
    const std::vector<int64_t> draft = seq.draft;
    const at::Tensor targets = logits.argmax(-1);
    int64_t accepted = 0;
    bool alive = true;
    for (int64_t j = 0; j < scored && alive; ++j) {
      const int64_t t = targets[j].item<int64_t>();
      alive = emit(seq, t, {});
      if (j == scored - 1 || t != draft[static_cast<size_t>(j)]) break;
      ++accepted;
    }
    metrics_.speculation(scored - 1, accepted);
    if (alive) {  // positions past the kept tokens held rejected draft tokens: computed again later
      seq.computed = static_cast<int64_t>(seq.tokens.size()) - 1;
      seq.draft.clear();
    }
    return;
  }
  const at::Tensor raw = logits[0].unsqueeze(0);
  // The request's processors (bias, min_tokens, penalties), then the sampler's temperature, top-k, top-p.
  at::Tensor scores =
      seq.processing.active() ? inference::process_logits(seq.processing, raw, seq.tokens, seq.prompt_len) : raw;
  // Structured output: only the tokens that keep the text a prefix of the grammar's language.
  if (seq.grammar && !mask_to_grammar(seq, scores)) {
    throw std::runtime_error("structured output: no token of the vocabulary continues the text");
  }
  const int64_t token = seq.sampler.sample(scores)[0].item<int64_t>();
  if (seq.grammar) advance_grammar(seq, token);
  const SamplingParams& p = seq.request->api.params;
  std::vector<TokenLogprob> logprobs;
  if (p.logprobs) logprobs.push_back(logprob_of(raw, token, p.top_logprobs));
  // A grammar that admits nothing more ends the choice here ("stop"), as its end-of-sequence token would.
  if (emit(seq, token, std::move(logprobs)) && seq.grammar && seq.grammar->finished()) {
    finish(seq, seq.text.end(), "stop");
  }
}

}  // namespace serve
