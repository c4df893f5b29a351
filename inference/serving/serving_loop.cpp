#include "inference/serving/serving_loop.h"

#include <ATen/ATen.h>


namespace serve {
namespace {
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

ServingLoop::ServingLoop(Engine& engine, const tokenizer::Tokenizer& tok, Metrics& metrics, const LoopOptions& options)
    : engine_(engine),
      tok_(tok),
      metrics_(metrics),
      options_(options),
      scheduler_(options.num_blocks, options.block_size, options.max_num_seqs, options.max_num_batched_tokens),
      seeds_(options.seed) {}

bool ServingLoop::submit(std::shared_ptr<Request> request) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_) return false;
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
    scheduler_.add(std::make_unique<Sequence>(std::move(r), tok_, seeds_()));
  }
}

void ServingLoop::drop_cancelled() {
  for (Sequence* s : scheduler_.all()) {
    if (s->request->cancelled()) scheduler_.remove(s);
  }
}

void ServingLoop::finish(Sequence& seq, std::string text, const std::string& reason) {
  seq.request->push({std::move(text), reason, 0, ""});
  metrics_.latency(seconds_since(seq.request->arrival));
  ++finished_;
  scheduler_.remove(&seq);  // frees its blocks; `seq` is gone after this
}

void ServingLoop::emit(Sequence& seq, int64_t token) {
  seq.tokens.push_back(token);
  ++generated_;
  metrics_.tokens(0, 1);
  seq.request->completion_tokens = seq.drawn();
  if (seq.drawn() == 1) metrics_.first_token(seconds_since(seq.request->arrival));
  const SamplingParams& p = seq.request->api.params;
  const auto eos = tok_.eos_token_id();
  if (!p.ignore_eos && eos && token == *eos) return finish(seq, seq.text.end(), "stop");
  std::string piece = seq.text.put(token);
  if (seq.text.stopped()) return finish(seq, std::move(piece), "stop");
  if (seq.drawn() >= p.max_tokens || static_cast<int64_t>(seq.tokens.size()) >= options_.max_model_len) {
    return finish(seq, piece + seq.text.end(), "length");
  }
  if (!piece.empty()) seq.request->push({std::move(piece), "", 0, ""});
}

void ServingLoop::fail_all(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed_ = true;
  }
  intake();
  for (Sequence* s : scheduler_.all()) {
    s->request->push({"", "", 503, message});
    scheduler_.remove(s);
  }
}

std::string ServingLoop::run() {
  auto last_broadcast = Clock::now();
  while (true) {
    intake();
    drop_cancelled();
    Scheduler::Batch batch = scheduler_.schedule();
    metrics_.step(scheduler_.waiting(), scheduler_.running(), scheduler_.blocks().used(), scheduler_.blocks().total(),
                  scheduler_.preemptions());
    if (batch.chunks.empty()) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return !incoming_.empty(); });
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
      const std::string why = std::string("a rank failed: ") + e.what();
      fail_all(why);
      return why;
    }
    last_broadcast = Clock::now();
    int64_t row = 0;
    for (size_t i = 0; i < batch.chunks.size(); ++i) {
      if (!batch.chunks[i].logits) continue;
      Sequence& seq = *batch.seqs[i];
      const int64_t token = seq.sampler.sample(logits[row++].unsqueeze(0))[0].item<int64_t>();
      emit(seq, token);
    }
  }
}

}  // namespace serve
