// serve's command line: long options with built-in defaults (`--help` lists them).
#pragma once

#include "tools/common/cli.h"

#include <cstdint>

#include "inference/serving/ngram_proposer.h"
#include <string>
#include <vector>

namespace serve {

using UsageError = tools_cli::UsageError;  // bad flags: one `error:` line, exit 2

struct ServeOptions {
  // Weights: exactly one of --hf-dir (save_pretrained's layout, with its tokenizer), --checkpoint (ours,
  // llama_train --checkpoint-dir) and --gguf (llama.cpp's file); the latter two with --tokenizer.
  std::string hf_dir, checkpoint, gguf, tokenizer_dir;
  std::string device = "cpu";  // cpu, or cuda (cuda:LOCAL_RANK)
  int64_t ep = 1;              // > 1: expert parallelism over the world (== world size) instead of TP
  std::string dtype = "auto";  // the model's (models/common/dtype.h): parameters, activations, KV cache
  bool gguf_dequantize = false;  // inference::ModelSource::gguf_dequantize
  std::string quantize = "none";  // the Linear weights once loaded (inference::ModelSource::quantize)
  bool weights_prepack = true;    // inference::ModelSource::weights_prepack
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string model_name;  // /v1/models' id and the "model" requests name (default: the directory's name)
  // The paged KV cache and the scheduler (vLLM's names).
  int64_t block_size = 16;               // positions per KV block
  int64_t num_blocks = 0;                // 0: enough for max_num_seqs sequences of max_model_len, within kv_cache_space
  // GiB of KV cache per rank (vLLM CPU's VLLM_CPU_KVCACHE_SPACE); 0: a quarter of MemAvailable shared by this host's ranks.
  double kv_cache_space = 0;
  int64_t max_num_seqs = 16;             // sequences in the decode batch at once
  int64_t max_num_batched_tokens = 256;  // tokens per forward (prefill is chunked to fit)
  int64_t max_model_len = 0;             // 0: the model's max_position_embeddings
  uint64_t seed = 0;                     // requests without a seed draw theirs from this
  // What one client may ask (inference/serving/http_server.h): 413 past the body size, 429 past the open requests.
  int64_t max_request_bytes = 4 << 20;
  int64_t max_queued_requests = 128;
  // SIGTERM drains: no new requests, the open ones finish within this many seconds (then 503), exit 0 (uvicorn's
  // --timeout-graceful-shutdown). Below tprun's --grace-seconds (30), after which it sends SIGKILL.
  double shutdown_timeout = 20;
  bool enable_prefix_caching = true;  // vLLM's default
  // vLLM's --speculative-config: {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": N,
  // "prompt_lookup_min": M} (prompt lookup, for greedy requests). Empty: off.
  std::string speculative_config;
  // vLLM's: parse chat completions' text for tool calls (tool_choice "auto") with this parser (tool_parsers.h).
  bool enable_auto_tool_choice = false;
  std::string tool_call_parser;
  serve::SpeculativeConfig speculative;  // parsed from it  // beyond --max-num-seqs running (SGLang's --max-queued-requests)
};

ServeOptions parse_options(const std::vector<std::string>& args, bool& help);
std::string help_text();

}  // namespace serve
