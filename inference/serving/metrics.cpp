#include "inference/serving/metrics.h"

#include <cstdio>

namespace serve {

void Metrics::Histogram::observe(double v) {
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    if (v <= kBuckets[i]) ++counts[i];
  }
  ++count;
  sum += v;
}

void Metrics::request_done(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::tokens(int64_t prompt, int64_t generated) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += prompt;
  generated_tokens_ += generated;
}

void Metrics::latency(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  latency_.observe(seconds);
}

void Metrics::first_token(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  first_token_.observe(seconds);
}

void Metrics::prefix_cache(int64_t queried_tokens, int64_t hit_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  prefix_queries_ = queried_tokens;
  prefix_hits_ = hit_tokens;
}

void Metrics::open_requests(int64_t open) {
  std::lock_guard<std::mutex> lock(mu_);
  open_ = open;
}

void Metrics::speculation(int64_t drafted, int64_t accepted) {
  std::lock_guard<std::mutex> lock(mu_);
  drafted_ += drafted;
  accepted_ += accepted;
}

void Metrics::step(int64_t waiting, int64_t running, int64_t blocks_used, int64_t blocks_total, int64_t preemptions) {
  std::lock_guard<std::mutex> lock(mu_);
  waiting_ = waiting;
  running_ = running;
  blocks_used_ = blocks_used;
  blocks_total_ = blocks_total;
  preemptions_ = preemptions;
}

void Metrics::histogram_text(std::string& out, const std::string& name, const std::string& help, const Histogram& h) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  char buf[512];
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s_bucket{le=\"%g\"} %lld\n", name.c_str(), kBuckets[i], static_cast<long long>(h.counts[i]));
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "%s_bucket{le=\"+Inf\"} %lld\n%s_sum %.6f\n%s_count %lld\n", name.c_str(),
                static_cast<long long>(h.count), name.c_str(), h.sum, name.c_str(), static_cast<long long>(h.count));
  out += buf;
}

std::string Metrics::text() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  auto gauge = [&](const char* name, const char* type, const char* help, double v) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "# HELP %s %s\n# TYPE %s %s\n%s %.10g\n", name, help, name, type, name, v);
    out += buf;
  };
  out += "# HELP serve_requests_total Requests answered, by endpoint and HTTP status.\n# TYPE serve_requests_total counter\n";
  for (const auto& [key, n] : requests_) {
    out += "serve_requests_total{endpoint=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"} " +
           std::to_string(n) + "\n";
  }
  gauge("serve_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", static_cast<double>(prompt_tokens_));
  gauge("serve_generation_tokens_total", "counter", "Tokens generated.", static_cast<double>(generated_tokens_));
  histogram_text(out, "serve_request_latency_seconds", "End-to-end latency of finished requests.", latency_);
  histogram_text(out, "serve_time_to_first_token_seconds", "Time from arrival to the first generated token.", first_token_);
  gauge("serve_queue_length", "gauge", "Requests waiting to join the batch.", static_cast<double>(waiting_));
  gauge("serve_open_requests", "gauge", "Requests being answered (running, queued, streaming); past the limit: 429.",
        static_cast<double>(open_));
  gauge("serve_running_requests", "gauge", "Requests in the decode batch.", static_cast<double>(running_));
  gauge("serve_preemptions_total", "counter", "Sequences preempted for lack of KV blocks.", static_cast<double>(preemptions_));
  gauge("serve_prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
        static_cast<double>(prefix_queries_));
  gauge("serve_prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache (not computed again).",
        static_cast<double>(prefix_hits_));
  gauge("serve_spec_decode_draft_tokens_total", "counter", "Draft tokens scored by speculative decoding.",
        static_cast<double>(drafted_));
  gauge("serve_spec_decode_accepted_tokens_total", "counter", "Draft tokens kept (equal to the greedy choice).",
        static_cast<double>(accepted_));
  gauge("serve_kv_cache_blocks_used", "gauge", "KV cache blocks held by live sequences.", static_cast<double>(blocks_used_));
  gauge("serve_kv_cache_blocks_total", "gauge", "KV cache blocks in the pool.", static_cast<double>(blocks_total_));
  gauge("serve_kv_cache_usage_ratio", "gauge", "Fraction of the KV cache's blocks in use.",
        blocks_total_ ? static_cast<double>(blocks_used_) / static_cast<double>(blocks_total_) : 0.0);
  return out;
}

}  // namespace serve
