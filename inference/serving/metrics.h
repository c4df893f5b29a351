// The server's /metrics, in Prometheus' text format (vLLM's figures under serve_ names): requests by endpoint
// and status, prompt and generated tokens, end-to-end latency and time to first token (histograms), the queue,
// the running batch, preemptions, and the KV cache's blocks in use. Thread-safe: HTTP handlers and the serving
// loop update it; a scrape reads it whole.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace serve {

class Metrics {
 public:
  void request_done(const std::string& endpoint, int status);
  void tokens(int64_t prompt, int64_t generated);
  void latency(double seconds);
  void first_token(double seconds);
  void step(int64_t waiting, int64_t running, int64_t blocks_used, int64_t blocks_total, int64_t preemptions);
  // Prefix caching: prompt tokens looked up and found so far (vLLM's prefix_cache_queries / _hits, in tokens).
  void prefix_cache(int64_t queried_tokens, int64_t hit_tokens);
  // Speculative decoding: draft tokens scored and accepted (vLLM's spec_decode_num_draft / _accepted_tokens).
  void speculation(int64_t drafted, int64_t accepted);
  // Requests the HTTP side is answering (running, queued or streaming): what --max-queued-requests bounds.
  void open_requests(int64_t open);
  std::string text() const;

 private:
  static constexpr std::array<double, 12> kBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  struct Histogram {
    std::array<int64_t, kBuckets.size()> counts{};
    int64_t count = 0;
    double sum = 0;
    void observe(double v);
  };
  static void histogram_text(std::string& out, const std::string& name, const std::string& help, const Histogram& h);
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  Histogram latency_, first_token_;
  int64_t waiting_ = 0, running_ = 0, blocks_used_ = 0, blocks_total_ = 0, preemptions_ = 0;
  int64_t prefix_queries_ = 0, prefix_hits_ = 0, drafted_ = 0, accepted_ = 0, open_ = 0;
};

}  // namespace serve
