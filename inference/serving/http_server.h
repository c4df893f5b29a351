// The HTTP side (cpp-httplib, Debian's libcpp-httplib): OpenAI's endpoints on rank 0. Each request is parsed and
// checked here (openai_api.h: 400 with OpenAI's error body for bad input), submitted to the serving loop, and
// answered when it finishes, or streamed as server-sent events (`data: {chunk}` lines, then `data: [DONE]`) as
// its text arrives. A streaming client that goes away cancels its request, which frees its slot.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "inference/serving/metrics.h"
#include "inference/serving/openai_api.h"
#include "inference/serving/serving_loop.h"

namespace httplib {
class Server;
}

namespace serve {

// What one client may ask of the server, checked before any work: a body over max_body_bytes is answered 413
// from its Content-Length (never read whole, never parsed); past max_open_requests requests being answered
// (running, queued, or streaming), a new one is answered 429 at once.
struct HttpLimits {
  size_t max_body_bytes = 4 << 20;
  int64_t max_open_requests = 144;
};

class HttpServer {
 public:
  HttpServer(ServingLoop& loop, Metrics& metrics, ApiLimits limits, HttpLimits http_limits = {});
  ~HttpServer();
  // Binds host:port (0: any free port) and returns the port. Throws std::runtime_error when it cannot.
  int bind(const std::string& host, int port);
  void start();  // serves on its own threads
  // Waits (up to `grace`) for open requests to be answered, then stops listening (the process is ending).
  void stop(std::chrono::milliseconds grace);
  // Ends every open request with a 503 and `message` (from any thread: the serving loop may be stuck in a
  // collective with a dead rank).
  void fail_open(const std::string& message);
  // Requests being answered now (running, queued or streaming).
  int64_t open_requests() const { return open_; }

 private:
  void completions(const std::string& body, bool chat, void* response);
  ServingLoop& loop_;
  Metrics& metrics_;
  ApiLimits limits_;
  HttpLimits http_limits_;
  std::unique_ptr<httplib::Server> server_;
  int listen_fd_ = -1;  // the listening socket (set by httplib's socket-options callback)
  std::thread thread_;
  std::atomic<int64_t> next_id_{0}, open_{0};
  std::mutex open_mu_;
  std::set<std::shared_ptr<Request>> open_requests_;
};

}  // namespace serve
