#include "options.h"
#include "tools/common/dtype_option.h"
#include "inference/gguf_tokenizer.h"
#include "inference/serving/tool_parsers.h"

#include <filesystem>

namespace serve {

namespace {

// The options, defined once: parse_options reads them, help_text prints them.
void define(CLI::App& app, ServeOptions& o) {
  tools_cli::configure(app, "serve");
  app.description(
      "serve: an OpenAI-compatible HTTP server for a model under tensor parallelism (rank 0 listens)\n\n"
      "  tprun --nproc-per-node N serve --hf-dir DIR [options]");
  app.footer(
      "Endpoints: POST /v1/completions, POST /v1/chat/completions (stream: true for SSE), GET /v1/models,\n"
      "GET /health, GET /metrics (Prometheus text). Prints `serving http://HOST:PORT` when ready.");
  app.add_option("--hf-dir", o.hf_dir, "HF checkpoint (config.json, *.safetensors, tokenizer files)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--checkpoint", o.checkpoint, "our checkpoint (llama_train --checkpoint-dir), with --tokenizer")
      ->check(CLI::ExistingDirectory);
  app.add_option("--gguf", o.gguf, "a GGUF file of the llama architecture (llama.cpp's; its Q4_0 Linear weights kept "
                 "as int4, its other tensors dequantized to --dtype; its vocabulary unless --tokenizer)")
      ->check(CLI::ExistingFile);
  app.add_flag("--gguf-dequantize", o.gguf_dequantize, "--gguf's tensors all dequantized to --dtype, Q4_0 too "
               "(transformers' from_pretrained(gguf_file=...))");
  app.add_option("--tokenizer", o.tokenizer_dir, "the tokenizer's directory (default: --hf-dir's)")
      ->check(CLI::ExistingDirectory);
  tools_cli::add_dtype(app, o.dtype, /*random_init=*/false);
  tools_cli::add_quantize(app, o.quantize);
  tools_cli::add_weights_prepack(app, o.weights_prepack);
  tools_cli::add_device(app, o.device);
  tools_cli::add_inference_ep(app, o.ep);
  app.add_option("--host", o.host, "listen address")->check(tools_cli::non_empty());
  app.add_option("--port", o.port, "listen port (0: any free port, printed)")->check(CLI::Range(0, 65535));
  app.add_option("--model-name", o.model_name, "the model's id in /v1/models (default: the directory's name)")
      ->check(tools_cli::non_empty());
  app.add_option("--block-size", o.block_size, "KV cache positions per block")->check(tools_cli::positive());
  app.add_option("--num-blocks", o.num_blocks, "KV cache blocks (default: max-num-seqs x max-model-len worth, "
                 "within --kv-cache-space)")->check(tools_cli::positive());
  app.add_option("--kv-cache-space", o.kv_cache_space, "GiB of KV cache per rank when --num-blocks is not given "
                 "(vLLM CPU's VLLM_CPU_KVCACHE_SPACE; default: a quarter of MemAvailable over this host's ranks)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-num-seqs", o.max_num_seqs, "sequences decoded together")->check(tools_cli::positive());
  app.add_option("--max-num-batched-tokens", o.max_num_batched_tokens,
                 "tokens per forward; longer prompts are prefilled in chunks")->check(tools_cli::positive());
  app.add_option("--max-model-len", o.max_model_len, "prompt + completion limit (default: max_position_embeddings)")
      ->check(tools_cli::positive());
  app.add_option("--seed", o.seed, "seeds of requests that give none");
  app.add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", o.enable_prefix_caching,
               "share the KV blocks of common prompt prefixes between requests (default on)");
  app.add_option("--speculative-config", o.speculative_config,
                 "speculative decoding by prompt lookup for greedy requests, as vLLM's: '{\"method\": \"ngram\", "
                 "\"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4, \"prompt_lookup_min\": 1}'");
  app.add_flag("--enable-auto-tool-choice", o.enable_auto_tool_choice,
               "parse chat completions' text for tool calls when a request gives tools (needs --tool-call-parser)");
  app.add_option("--tool-call-parser", o.tool_call_parser, "the tool-call format: hermes (Qwen2.5, Hermes), llama3_json "
                 "(Llama 3.1/3.2), mistral")
      ->check(CLI::IsMember(serve::tool_parser_names()));
  app.add_option("--max-request-bytes", o.max_request_bytes, "a larger body is answered 413 unread")
      ->check(tools_cli::positive());
  app.add_option("--max-queued-requests", o.max_queued_requests,
                 "requests waiting beyond --max-num-seqs running; more are answered 429")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--shutdown-timeout", o.shutdown_timeout,
                 "on SIGTERM: stop taking requests, let the open ones finish within S seconds (those left get 503), "
                 "then exit 0; keep it below tprun's --grace-seconds (a second SIGTERM or SIGINT stops at once)")
      ->check(CLI::Range(0.0, 86400.0));
}

}  // namespace

std::string help_text() {
  ServeOptions d;
  CLI::App app;
  define(app, d);
  return app.help();
}

ServeOptions parse_options(const std::vector<std::string>& args, bool& help) {
  ServeOptions o;
  CLI::App app;
  define(app, o);
  help = tools_cli::parse(app, args);
  if (help) return o;
  if (!o.hf_dir.empty() + !o.checkpoint.empty() + !o.gguf.empty() != 1) {
    throw UsageError("give exactly one of --hf-dir, --checkpoint and --gguf");
  }
  if (o.enable_auto_tool_choice && o.tool_call_parser.empty()) {
    throw UsageError("--enable-auto-tool-choice needs --tool-call-parser (hermes, llama3_json, mistral)");
  }
  if (!o.speculative_config.empty()) {
    try {
      o.speculative = serve::parse_speculative_config(o.speculative_config);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
  }
  if (o.tokenizer_dir.empty()) {
    if (!o.gguf.empty()) {  // the file's own vocabulary (serve's main reads it)
      bool has = false;
      try {
        has = inference::gguf_has_tokenizer(o.gguf);
      } catch (const std::exception& e) {
        throw UsageError(e.what());
      }
      if (!has) throw UsageError("--gguf " + o.gguf + " carries no vocabulary (llama.cpp's no_vocab): give --tokenizer DIR");
    } else if (o.hf_dir.empty()) {
      throw UsageError("--checkpoint needs --tokenizer DIR (the server speaks text)");
    }
    o.tokenizer_dir = o.hf_dir;
  }
  if (o.model_name.empty()) {
    const std::filesystem::path p = std::filesystem::path(!o.gguf.empty() ? o.gguf : o.hf_dir.empty() ? o.checkpoint : o.hf_dir);
    o.model_name = !o.gguf.empty() ? p.stem().string() : (p.has_filename() ? p : p.parent_path()).filename().string();
  }
  return o;
}

}  // namespace serve
