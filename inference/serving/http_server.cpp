#include "inference/serving/http_server.h"

#include <httplib.h>

#include <sys/socket.h>

#include <ctime>

namespace serve {
namespace {

using json = nlohmann::ordered_json;

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& type,
                const std::string& param = "") {
  res.status = status;
  res.set_content(error_body(message, type, param, status), "application/json");
}

std::string sse(const json& chunk) { return "data: " + json_text(chunk) + "\n\n"; }

}  // namespace

HttpServer::HttpServer(ServingLoop& loop, Metrics& metrics, ApiLimits limits, HttpLimits http_limits)
    : loop_(loop),
      metrics_(metrics),
      limits_(std::move(limits)),
      http_limits_(http_limits),
      server_(std::make_unique<httplib::Server>()) {
  httplib::Server& s = *server_;
  // One thread per open request (a handler waits for its request's tokens), and room beyond the limit to answer
  // 429s, /health and /metrics while it is reached.
  const size_t threads = static_cast<size_t>(http_limits_.max_open_requests) + 32;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.set_payload_max_length(http_limits_.max_body_bytes);
  // Debian's cpp-httplib listens with a backlog of 5 (compiled in): a burst of clients overflows it and some see
  // their connection reset. The socket is remembered here and listened on again with room for the burst (bind()).
  // (httplib's default options set SO_REUSEPORT, which would let another process bind our port beside us and take
  // part of our connections: SO_REUSEADDR only, so a port in use is refused.)
  s.set_socket_options([this](int sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listen_fd_ = sock;
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (loop_.failed()) return send_error(res, 503, "the server has failed", "server_error");
    if (loop_.stopping()) return send_error(res, 503, "the server is shutting down", "server_error");
    res.set_content("{\"status\":\"ok\"}", "application/json");
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json model = {{"id", limits_.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "dtensor-cpp"},
                  {"max_model_len", limits_.max_model_len}};
    res.set_content(json_text(json{{"object", "list"}, {"data", json::array({model})}}), "application/json");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.text(), "text/plain; version=0.0.4");
  });
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { completions(req.body, false, &res); });
  s.Post("/v1/chat/completions",
         [this](const httplib::Request& req, httplib::Response& res) { completions(req.body, true, &res); });
  s.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    // Only where no handler answered (no such route, a body over the limit, a malformed request); a handler's own
    // error body stays.
    if (!res.body.empty()) return;
    if (res.status == 404) return send_error(res, 404, "no route " + req.method + " " + req.path, "not_found_error");
    if (res.status == 413) {
      metrics_.request_done(req.path, 413);
      return send_error(res, 413, "the body is larger than the server's limit of " +
                                      std::to_string(http_limits_.max_body_bytes) + " bytes (--max-request-bytes)",
                        "invalid_request_error");
    }
    send_error(res, res.status, "the request was refused (HTTP " + std::to_string(res.status) + ")", "invalid_request_error");
  });
}

HttpServer::~HttpServer() {
  // A handler waits for its request's events: those still open can no longer finish once the server goes.
  fail_open("the server is shutting down");
  if (thread_.joinable()) {
    server_->stop();
    thread_.join();
  }
}

int HttpServer::bind(const std::string& host, int port) {
  int bound = port;
  if (port == 0) {
    bound = server_->bind_to_any_port(host);
    if (bound <= 0) throw std::runtime_error("serve: cannot bind " + host + " (any port)");
  } else if (!server_->bind_to_port(host, port)) {
    throw std::runtime_error("serve: cannot bind " + host + ":" + std::to_string(port) +
                             " (in use, or not an address of this host; --port 0 takes a free port)");
  }
  if (listen_fd_ >= 0) ::listen(listen_fd_, 4096);  // a larger backlog than httplib's 5 (the kernel caps it)
  return bound;
}

void HttpServer::start() {
  thread_ = std::thread([this] { server_->listen_after_bind(); });
}

void HttpServer::stop(std::chrono::milliseconds grace) {
  const auto deadline = Clock::now() + grace;
  while (open_ > 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  server_->stop();
  // Not joined: a kept-alive connection's thread waits out its read timeout; the process is ending.
  if (thread_.joinable()) thread_.detach();
}

void HttpServer::fail_open(const std::string& message) {
  std::lock_guard<std::mutex> lock(open_mu_);
  for (const auto& r : open_requests_) r->push({"", "", 503, message, {}, 0, {}});
}

void HttpServer::completions(const std::string& body, bool chat, void* response) {
  httplib::Response& res = *static_cast<httplib::Response*>(response);
  const std::string endpoint = chat ? "/v1/chat/completions" : "/v1/completions";
  ApiRequest api;
  try {
    api = parse_request(body, chat, limits_);
  } catch (const ApiError& e) {
    metrics_.request_done(endpoint, e.status);
    return send_error(res, e.status, e.what(), e.type, e.param);
  } catch (const std::exception& e) {  // the tokenizer or the template failing on this input
    metrics_.request_done(endpoint, 400);
    return send_error(res, 400, e.what(), "invalid_request_error");
  }
  // A slot among the open requests, or 429 at once (vLLM's and OpenAI's status for "try again later").
  const int64_t before = open_.fetch_add(1);
  if (before >= http_limits_.max_open_requests) {
    metrics_.open_requests(--open_);
    metrics_.request_done(endpoint, 429);
    return send_error(res, 429, "the server is at its limit of " + std::to_string(http_limits_.max_open_requests) +
                                    " open requests (--max-num-seqs + --max-queued-requests): retry later",
                      "rate_limit_error");
  }
  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
  auto request = std::make_shared<Request>(api, id, static_cast<int64_t>(std::time(nullptr)));
  metrics_.open_requests(before + 1);
  if (!loop_.submit(request)) {
    metrics_.open_requests(--open_);
    metrics_.request_done(endpoint, 503);
    return send_error(res, 503, "the server has failed or is shutting down", "server_error");
  }
  {
    std::lock_guard<std::mutex> lock(open_mu_);
    open_requests_.insert(request);
  }
  auto close = [this, request] {
    std::lock_guard<std::mutex> lock(open_mu_);
    open_requests_.erase(request);
    metrics_.open_requests(--open_);
  };
  const std::string model = limits_.model_name;
  const int64_t prompt_tokens = static_cast<int64_t>(api.prompt_ids.size());
  if (!api.stream) {
    std::vector<Choice> choices(static_cast<size_t>(api.params.n));
    int64_t unfinished = api.params.n;
    std::vector<Event> events;
    while (unfinished > 0) {
      if (!request->take(events, std::chrono::milliseconds(200))) continue;
      for (Event& e : events) {
        if (e.error_status) {
          metrics_.request_done(endpoint, e.error_status);
          send_error(res, e.error_status, e.error, "server_error");
          close();
          return;
        }
        Choice& c = choices[static_cast<size_t>(e.index)];
        c.text += e.text;
        c.logprobs.insert(c.logprobs.end(), e.logprobs.begin(), e.logprobs.end());
        c.token_ids.insert(c.token_ids.end(), e.token_ids.begin(), e.token_ids.end());
        if (!e.finish_reason.empty()) {
          c.finish_reason = e.finish_reason;
          --unfinished;
        }
      }
    }
    res.set_content(json_text(completion_response(api, id, request->created, model, choices, prompt_tokens,
                                                  request->completion_tokens)),
                    "application/json");
    metrics_.request_done(endpoint, 200);
    close();
    return;
  }
  auto finished = std::make_shared<bool>(false);
  auto started = std::make_shared<bool>(false);
  // Per choice: completions' text_offset of its next token; how many choices have not finished.
  auto offsets = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(api.params.n), 0);
  auto unfinished = std::make_shared<int64_t>(api.params.n);
  // With a tool parser a choice's text is held and sent whole when it finishes (content and tool_calls).
  auto held = std::make_shared<std::vector<Choice>>(static_cast<size_t>(api.params.n));
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, request, api, id, model, prompt_tokens, finished, started, offsets, unfinished, held](size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
        if (!*started) {
          *started = true;
          for (int64_t i = 0; api.chat && i < api.params.n; ++i) {
            if (!write(sse(stream_chunk(api, id, request->created, model, "", "", /*role_chunk=*/true, {}, 0, i)))) return false;
          }
        }
        std::vector<Event> events;
        if (!request->take(events, std::chrono::milliseconds(200))) return sink.is_writable();
        for (const Event& e : events) {
          if (e.error_status) {
            json err = json::parse(error_body(e.error, "server_error", "", e.error_status));
            write(sse(err));
            write("data: [DONE]\n\n");
            *finished = true;
            sink.done();
            return true;
          }
          if (api.parses_tool_calls()) {
            Choice& c = (*held)[static_cast<size_t>(e.index)];
            c.text += e.text;
            if (!e.finish_reason.empty() &&
                !write(sse(tool_calls_chunk(api, id, request->created, model, e.index, parsed_choice(api, c), e.finish_reason)))) {
              return false;
            }
          } else if (!e.text.empty() || !e.finish_reason.empty() || !e.logprobs.empty()) {
            int64_t& offset = (*offsets)[static_cast<size_t>(e.index)];
            const json chunk =
                stream_chunk(api, id, request->created, model, e.text, e.finish_reason, false, e.logprobs, offset, e.index);
            for (const TokenLogprob& t : e.logprobs) offset += static_cast<int64_t>(t.text.size());
            if (!write(sse(chunk))) return false;
          }
          if (!e.finish_reason.empty() && --*unfinished == 0) {
            if (api.include_usage) write(sse(usage_chunk(api, id, request->created, model, prompt_tokens, request->completion_tokens)));
            write("data: [DONE]\n\n");
            *finished = true;
            sink.done();
            return true;
          }
        }
        return true;
      },
      [this, request, finished, endpoint, close](bool) {
        // Counted first, so that /metrics shows the 499 by the time the freed slot shows.
        metrics_.request_done(endpoint, *finished ? 200 : 499);
        // The client went away (or the write failed) before the end: free its slot.
        if (!*finished) request->cancel();
        close();
      });
}

}  // namespace serve
