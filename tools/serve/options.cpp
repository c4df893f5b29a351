#include "options.h"

#include <filesystem>

namespace serve {

using tools_cli::parse_number;
using tools_cli::positive;

std::string help_text() {
  return "serve: an OpenAI-compatible HTTP server for a model under tensor parallelism (rank 0 listens)\n"
         "\n"
         "  tprun --nproc-per-node N serve --hf-dir DIR [options]\n"
         "\n"
         "  --hf-dir DIR                 HF checkpoint (config.json, *.safetensors, tokenizer files)\n"
         "  --checkpoint DIR             our checkpoint (llama_train --checkpoint-dir), with --tokenizer\n"
         "  --tokenizer DIR              the tokenizer's directory (default: --hf-dir's)\n"
         "  --host ADDR                  listen address (default 127.0.0.1)\n"
         "  --port N                     listen port (default 8000; 0: any free port, printed)\n"
         "  --model-name NAME            the model's id in /v1/models (default: the directory's name)\n"
         "  --block-size N               KV cache positions per block (default 16)\n"
         "  --num-blocks N               KV cache blocks (default: max-num-seqs x max-model-len worth)\n"
         "  --max-num-seqs N             sequences decoded together (default 16)\n"
         "  --max-num-batched-tokens N   tokens per forward; longer prompts are prefilled in chunks (default 256)\n"
         "  --max-model-len N            prompt + completion limit (default: max_position_embeddings)\n"
         "  --seed N                     seeds of requests that give none (default 0)\n"
         "  --help                       this text\n"
         "\n"
         "Endpoints: POST /v1/completions, POST /v1/chat/completions (stream: true for SSE), GET /v1/models,\n"
         "GET /health, GET /metrics (Prometheus text). Prints `serving http://HOST:PORT` when ready.\n";
}

ServeOptions parse_options(const std::vector<std::string>& args, bool& help) {
  ServeOptions o;
  help = false;
  auto dir = [](const std::string& flag, const std::string& v) {
    if (!std::filesystem::is_directory(v)) throw UsageError("--" + flag + ": no such directory '" + v + "'");
    return v;
  };
  const tools_cli::ValuedOptions valued = {
      {"hf-dir", [&](const std::string& v) { o.hf_dir = dir("hf-dir", v); }},
      {"checkpoint", [&](const std::string& v) { o.checkpoint = dir("checkpoint", v); }},
      {"tokenizer", [&](const std::string& v) { o.tokenizer_dir = dir("tokenizer", v); }},
      {"host", [&](const std::string& v) {
         if (v.empty()) throw UsageError("--host is empty");
         o.host = v;
       }},
      {"port", [&](const std::string& v) {
         const int p = parse_number<int>("port", v);
         if (p < 0 || p > 65535) throw UsageError("--port must be in [0, 65535], got " + v);
         o.port = p;
       }},
      {"model-name", [&](const std::string& v) {
         if (v.empty()) throw UsageError("--model-name is empty");
         o.model_name = v;
       }},
      {"block-size", [&](const std::string& v) { o.block_size = positive("block-size", v); }},
      {"num-blocks", [&](const std::string& v) { o.num_blocks = positive("num-blocks", v); }},
      {"max-num-seqs", [&](const std::string& v) { o.max_num_seqs = positive("max-num-seqs", v); }},
      {"max-num-batched-tokens", [&](const std::string& v) { o.max_num_batched_tokens = positive("max-num-batched-tokens", v); }},
      {"max-model-len", [&](const std::string& v) { o.max_model_len = positive("max-model-len", v); }},
      {"seed", [&](const std::string& v) { o.seed = parse_number<uint64_t>("seed", v); }},
  };
  const tools_cli::FlagOptions flags = {{"help", [&] { help = true; }}};
  tools_cli::parse_args(args, valued, flags);
  if (help) return o;
  if (o.hf_dir.empty() == o.checkpoint.empty()) throw UsageError("give exactly one of --hf-dir and --checkpoint");
  if (o.tokenizer_dir.empty()) {
    if (o.hf_dir.empty()) throw UsageError("--checkpoint needs --tokenizer DIR (the server speaks text)");
    o.tokenizer_dir = o.hf_dir;
  }
  if (o.model_name.empty()) {
    const std::filesystem::path p = std::filesystem::path(o.hf_dir.empty() ? o.checkpoint : o.hf_dir);
    o.model_name = (p.has_filename() ? p : p.parent_path()).filename().string();
  }
  return o;
}

}  // namespace serve
