// A request between its HTTP handler (which waits) and the serving loop (which produces its text): the loop
// pushes events, the handler takes them. Either side may end it: the loop with a finish or an error, the
// handler by cancelling (a streaming client that went away), after which the loop frees its sequence.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "inference/serving/openai_api.h"

namespace serve {

using Clock = std::chrono::steady_clock;

struct Event {
  std::string text;           // new text (may be empty)
  std::string finish_reason;  // "stop" or "length" on the last event; empty before
  int error_status = 0;       // the last event of a failed request: 503 (a rank failed) or 500
  std::string error;
  std::vector<TokenLogprob> logprobs;  // of the tokens drawn since the last event (when the request asked)
  int64_t index = 0;                   // the choice (one of the request's n sequences)
  std::vector<int64_t> token_ids;      // the tokens drawn since the last event
};

class Request {
 public:
  Request(ApiRequest api, std::string id, int64_t created)
      : api(std::move(api)), id(std::move(id)), created(created), unfinished_(this->api.params.n) {}
  const ApiRequest api;
  const std::string id;
  const int64_t created;
  const Clock::time_point arrival = Clock::now();

  // The loop's side.
  void push(Event e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) return;
      // Done at an error, or once each of the n choices has finished.
      if (!e.finish_reason.empty()) --unfinished_;
      done_ = unfinished_ <= 0 || e.error_status != 0;
      events_.push_back(std::move(e));
    }
    cv_.notify_all();
  }
  std::atomic<int64_t> completion_tokens{0};  // over all choices

  // The handler's side: what arrived, waiting up to `timeout` when nothing has; false when nothing came.
  bool take(std::vector<Event>& out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !events_.empty(); });
    if (events_.empty()) return false;
    out.assign(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
    events_.clear();
    return true;
  }
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
  bool done_ = false;
  int64_t unfinished_;  // choices not yet finished
  std::atomic<bool> cancelled_{false};
};

}  // namespace serve
