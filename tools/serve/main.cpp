// serve: an OpenAI-compatible HTTP server for a model under tensor parallelism, one process per TP rank:
//
//   tprun --nproc-per-node 2 serve --hf-dir DIR            # rank 0 listens on 127.0.0.1:8000
//   curl localhost:8000/v1/completions -d '{"prompt": "The", "max_tokens": 16}'
//
// Rank 0 runs the HTTP server (http_server.h) and the serving loop (serving_loop.h: continuous batching over a
// paged KV cache); every rank runs the model on the steps rank 0 broadcasts (engine.h). A bad command line (or
// weights, tokenizer or cache sizes that do not fit) prints one `error:` line on rank 0 and exits 2 on every
// rank, before any communication.
//
// Stopping: SIGTERM drains (no new requests; the open ones finish within --shutdown-timeout, those left get 503;
// the other ranks are told to stop) and every rank exits 0, as uvicorn and vLLM do; the followers ignore SIGTERM
// and wait for rank 0's word. SIGINT (or a second signal) answers what is open with 503 and exits 0 at once. A
// failure that leaves the ranks out of step (a rank died, or threw inside the forward at TP > 1) answers what is
// open with 503 and exits 1 with an `error:` line; a failure that touches some requests (serving_loop.h) answers
// those 500 and the server goes on. Last, rank 0 prints a machine-readable `summary` line.
#include <c10/core/ScalarType.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dtensor/mesh/launch_env.h"
#include "dtensor/mesh/fatal_signals.h"
#include "inference/gguf_tokenizer.h"
#include "inference/heap.h"
#include "inference/weights.h"
#include "dtensor/mesh/device_mesh.h"
#include "inference/serving/http_server.h"
#include "llama/rope.h"
#include "options.h"
#include "inference/serving/serving_loop.h"

namespace {

std::atomic<int> g_signal{0}, g_signals{0};
void on_signal(int sig) {
  if (g_signal == 0) g_signal = sig;
  ++g_signals;
}

struct Setup {
  serve::ServeOptions options;
  inference::ModelSource weights;
  llama::LlamaConfig config;
  std::unique_ptr<tokenizer::Tokenizer> tok;
};

// Everything that can be checked before any communication; throws UsageError.
Setup check(const std::vector<std::string>& args, int world_size, bool& help) {
  Setup s;
  s.options = serve::parse_options(args, help);
  if (help) return s;
  serve::ServeOptions& o = s.options;
  s.weights.hf_dir = o.hf_dir;
  s.weights.checkpoint = o.checkpoint;
  s.weights.gguf = o.gguf;
  s.weights.dtype = o.dtype;
  s.weights.quantize = o.quantize;
  s.weights.gguf_dequantize = o.gguf_dequantize;
  s.weights.weights_prepack = o.weights_prepack;
  s.weights.device = o.device;
  s.weights.ep = o.ep;
  if (o.ep > 1 && o.ep != world_size) {
    throw serve::UsageError("--ep " + std::to_string(o.ep) + " != world size " + std::to_string(world_size) +
                            " (run with --nproc-per-node " + std::to_string(o.ep) + ")");
  }
  s.config = inference::model_config(s.weights, world_size);
  const llama::LlamaConfig& c = s.config;
  if (llama::rope_depends_on_length(c)) {
    throw serve::UsageError("this model's rope_type '" + c.rotary.rope_scaling.rope_type +
                            "' follows each sequence's length; continuous batching does not support it");
  }
  try {
    s.tok = std::make_unique<tokenizer::Tokenizer>(o.tokenizer_dir.empty() ? inference::load_gguf_tokenizer(o.gguf)
                                                                           : tokenizer::Tokenizer::from_pretrained(o.tokenizer_dir));
  } catch (const std::exception& e) {
    throw serve::UsageError((o.tokenizer_dir.empty() ? "--gguf " + o.gguf : "--tokenizer " + o.tokenizer_dir) + ": " + e.what());
  }
  if (s.tok->vocab_size() > c.vocab_size) {
    throw serve::UsageError("the tokenizer in " + o.tokenizer_dir + " has " + std::to_string(s.tok->vocab_size()) +
                            " tokens; the model's vocabulary has only " + std::to_string(c.vocab_size));
  }
  const bool default_len = o.max_model_len == 0;
  if (default_len) o.max_model_len = c.max_position_embeddings;
  if (o.max_model_len > c.max_position_embeddings) {
    throw serve::UsageError("--max-model-len " + std::to_string(o.max_model_len) + " exceeds the model's max_position_embeddings " +
                            std::to_string(c.max_position_embeddings));
  }
  int64_t per_seq = (o.max_model_len + o.block_size - 1) / o.block_size;
  const bool given_blocks = o.num_blocks > 0;
  if (!given_blocks) {
    // As many blocks as max_num_seqs sequences of max_model_len need, within the KV budget (vLLM sizes its cache by
    // memory the same way): a block holds K and V of block_size positions for every layer, this rank's kv heads.
    const int64_t tp = o.ep > 1 ? 1 : world_size, kv_heads = (c.num_key_value_heads + tp - 1) / tp;
    const int64_t block_bytes = 2 * c.num_hidden_layers * kv_heads * c.head_dim() * o.block_size *
                                static_cast<int64_t>(c10::elementSize(inference::model_dtype(s.weights)));
    const char* local = std::getenv("LOCAL_WORLD_SIZE");
    const int64_t local_ranks = std::max<int64_t>(1, local ? std::atoll(local) : 1);
    const int64_t available = inference::available_memory();
    const double budget = o.kv_cache_space > 0 ? o.kv_cache_space * double(int64_t{1} << 30)
                          : available > 0      ? 0.25 * static_cast<double>(available) / static_cast<double>(local_ranks)
                                               : 4.0 * double(int64_t{1} << 30);
    const int64_t fit = static_cast<int64_t>(budget / static_cast<double>(block_bytes));
    o.num_blocks = std::min(per_seq * o.max_num_seqs, fit);
    if (o.num_blocks < per_seq && default_len && o.num_blocks > 0) {
      // The model's whole context does not fit: serve a shorter one, as vLLM asks its users to (--max-model-len).
      o.max_model_len = o.num_blocks * o.block_size;
      per_seq = o.num_blocks;
      std::fprintf(stderr, "serve: note: KV cache of %.2f GiB a rank holds %lld positions: --max-model-len %lld (the "
                   "model's %lld does not fit; raise --kv-cache-space or give --max-model-len)\n",
                   budget / double(int64_t{1} << 30), static_cast<long long>(o.max_model_len),
                   static_cast<long long>(o.max_model_len), static_cast<long long>(c.max_position_embeddings));
    }
  }
  if (o.num_blocks < per_seq) {
    throw serve::UsageError((given_blocks ? "--num-blocks " : "the KV cache's budget (--kv-cache-space), ") +
                            std::to_string(o.num_blocks) + " blocks, cannot hold one sequence of --max-model-len " +
                            std::to_string(o.max_model_len) + " (" + std::to_string(per_seq) + " blocks of " +
                            std::to_string(o.block_size) + ")");
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  dtensor::report_fatal_signals();  // a crash says where, on this rank's stderr
  inference::keep_freed_memory();  // a forward's large temporaries reuse pages (inference/heap.h)
  const dtensor::LaunchEnv launch = dtensor::LaunchEnv::peek();  // before the group: --help and usage errors on rank 0
  const int rank = launch.rank;
  const int world_size = launch.world_size;
  Setup s;
  try {
    bool help = false;
    s = check(std::vector<std::string>(argv + 1, argv + argc), world_size, help);
    if (help) {
      if (rank == 0) std::fputs(serve::help_text().c_str(), stdout);
      return 0;
    }
  } catch (const std::exception& e) {
    return tools_cli::usage_error_exit(rank, e.what());
  }
  const serve::ServeOptions& o = s.options;
  if (rank == 0 && s.tok->vocab_size() < s.config.vocab_size) {
    std::fprintf(stderr, "serve: note: the model's vocabulary (%lld rows) is larger than the tokenizer's (%lld tokens): "
                         "ids past the tokenizer decode to nothing, as in transformers\n",
                 static_cast<long long>(s.config.vocab_size), static_cast<long long>(s.tok->vocab_size()));
  }
  std::signal(SIGPIPE, SIG_IGN);
  try {
    auto world = dtensor::init_process_group();
    auto mesh = dtensor::init_device_mesh(o.device, {world->size()}, {o.ep > 1 ? "ep" : "tp"});
    llama::LlamaForCausalLM model{nullptr};
    try {
      model = inference::load_model(s.weights, s.config, mesh);
    } catch (const inference::SourceError& e) {
      return tools_cli::usage_error_exit(rank, e.what());
    }
    serve::Engine engine(model, world->world_group(), o.num_blocks, o.block_size, mesh.device());
    if (rank != 0) {
      // SIGTERM (tprun forwards it to every rank) is rank 0's to act on: it drains, then says stop.
      std::signal(SIGTERM, SIG_IGN);
      try {
        engine.follow();
      } catch (const std::exception& e) {
        // Out of step with rank 0: say why and end now (the world's teardown would wait on peers mid-collective).
        std::fprintf(stderr, "error: serve: rank %d: %s\n", rank, e.what());
        std::fflush(stderr);
        std::_Exit(1);
      }
      return 0;
    }
    serve::Metrics metrics;
    serve::ServingLoop loop(engine, *s.tok, metrics,
                            {o.num_blocks, o.block_size, o.max_num_seqs, o.max_num_batched_tokens, o.max_model_len, o.seed,
                             o.enable_prefix_caching, o.speculative});
    serve::HttpServer http(loop, metrics, {s.tok.get(), o.model_name, o.max_model_len, s.config.vocab_size, 64,
                                           o.enable_auto_tool_choice ? o.tool_call_parser : std::string()},
                           {static_cast<size_t>(o.max_request_bytes), o.max_num_seqs + o.max_queued_requests});
    int port = 0;
    try {
      port = http.bind(o.host, o.port);
    } catch (const std::exception& e) {
      engine.stop();
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
    // The one way out of a serving rank 0, whoever comes first (a signal, the loop after a failure, a drain): open
    // requests answered, the summary, then _Exit (the world's teardown would wait on a dead rank).
    auto shut_down = [&](const std::string& why) {
      static std::atomic<bool> once{false};
      if (once.exchange(true)) {
        while (true) std::this_thread::sleep_for(std::chrono::seconds(1));  // the first caller ends the process
      }
      loop.refuse_new();
      http.fail_open("the server is shutting down" + (why.empty() ? std::string() : ": " + why));
      http.stop(std::chrono::milliseconds(3000));
      std::printf("summary requests=%lld generated_tokens=%lld failed=%d\n", static_cast<long long>(loop.requests_finished()),
                  static_cast<long long>(loop.tokens_generated()), why.empty() ? 0 : 1);
      std::fflush(stdout);
      if (!why.empty()) std::fprintf(stderr, "error: serve: %s; open requests were answered 503\n", why.c_str());
      std::fflush(stderr);
      std::_Exit(why.empty() ? 0 : 1);
    };
    // Signals: handled on a thread of their own, since the loop may be waiting in a collective on a rank that
    // died. SIGINT: open requests get a 503, then the process ends. SIGTERM: a drain, bounded by
    // --shutdown-timeout; the loop then stops and tells the other ranks to stop (main thread, below).
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    std::thread([&] {
      while (g_signal == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (g_signal == SIGTERM) {
        loop.refuse_new();
        std::fprintf(stderr, "serve: SIGTERM: draining %lld open requests (at most %.0f s), taking no new ones\n",
                     static_cast<long long>(http.open_requests()), o.shutdown_timeout);
        std::fflush(stderr);
        const auto deadline = std::chrono::steady_clock::now() +
                              std::chrono::milliseconds(static_cast<int64_t>(o.shutdown_timeout * 1000));
        while (http.open_requests() > 0 && g_signals == 1 && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        loop.request_stop();
        // The loop normally returns within a step; one stuck in a collective with a dead rank gets a bound.
        const auto bound = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (g_signals == 1 && std::chrono::steady_clock::now() < bound) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        if (g_signals == 1) shut_down("the serving loop did not stop within 10 s of the drain");
      }
      shut_down("");  // SIGINT, or a second signal
    }).detach();
    http.start();
    std::printf("serving http://%s:%d model=%s %s=%d device=%s kv_blocks=%lld block_size=%lld max_num_seqs=%lld max_model_len=%lld\n",
                o.host.c_str(), port, o.model_name.c_str(), o.ep > 1 ? "ep" : "tp", world->size(), mesh.device().str().c_str(), static_cast<long long>(o.num_blocks),
                static_cast<long long>(o.block_size), static_cast<long long>(o.max_num_seqs),
                static_cast<long long>(o.max_model_len));
    std::fflush(stdout);
    std::string why = loop.run();  // a failure's reason, or "" after a drain
    if (why.empty()) {
      try {
        engine.stop();  // the followers exit 0
      } catch (const std::exception& e) {
        why = std::string("telling the other ranks to stop failed: ") + e.what();
      }
    }
    shut_down(why);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: serve: %s\n", e.what());
    std::fflush(stderr);
    std::_Exit(1);  // never the destructors: an HTTP handler may wait on a request no loop will finish
  }
}
