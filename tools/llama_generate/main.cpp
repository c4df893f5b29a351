// llama_generate: generation from a Llama model under tensor parallelism, one process per TP rank:
//
//   tprun --nproc-per-node 2 llama_generate --random-init --prompt 'The ' --max-new-tokens 32
//   tprun --nproc-per-node 2 llama_generate --help
//
// Every rank runs the same decode loop (llama/generate.h) under llama::inference_plan; rank 0 streams
// the tokens of the first sequence as they are drawn, prints every sequence at the end, and, last, a
// machine-readable `summary` line. A bad command line (or weights that do not fit the model) prints one
// `error:` line on rank 0 and exits 2 on every rank, before any communication.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "dtensor/mesh/launch_env.h"
#include "dtensor/mesh/fatal_signals.h"
#include "dtensor/debug/comm_debug_mode.h"
#include "dtensor/mesh/comm_clock.h"
#include "dtensor/mesh/device_mesh.h"
#include "tokenizer/streamer.h"
#include "inference/generate.h"
#include "inference/heap.h"
#include "options.h"
#include "tools/common/terminal.h"
#include "inference/weights.h"

namespace {

// A byte token as text (control bytes other than newline and tab escaped), or an id.
std::string show(int64_t token, bool bytes) {
  if (!bytes) return " " + std::to_string(token);
  if (token == '\n' || token == '\t' || (token >= 32 && token < 127) || token >= 128) return std::string(1, static_cast<char>(token));
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(token));
  return buf;
}

std::string show_all(const std::vector<int64_t>& tokens, bool bytes) {
  std::string s;
  for (int64_t t : tokens) s += show(t, bytes);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  dtensor::report_fatal_signals();  // a crash says where, on this rank's stderr
  inference::keep_freed_memory();  // a forward's large temporaries reuse pages (inference/heap.h)
  const dtensor::LaunchEnv launch = dtensor::LaunchEnv::peek();  // before the group: --help and usage errors on rank 0
  const int rank = launch.rank;
  const int world_size = launch.world_size;
  llama_generate::GenerateCliOptions options;
  llama::LlamaConfig config;
  try {
    bool help = false;
    options = llama_generate::parse_options(std::vector<std::string>(argv + 1, argv + argc), help);
    if (help) {
      if (rank == 0) std::fputs(llama_generate::help_text().c_str(), stdout);
      return 0;
    }
    llama_generate::check_options(options, world_size);
    config = inference::model_config(options, world_size);
    for (const auto& prompt : options.prompts) {
      for (int64_t id : prompt) {
        if (id >= config.vocab_size) {
          throw llama_generate::UsageError("prompt token id " + std::to_string(id) + " >= the model's vocabulary " +
                                           std::to_string(config.vocab_size));
        }
      }
    }
  } catch (const std::exception& e) {
    return tools_cli::usage_error_exit(rank, e.what());
  }
  try {
    auto world = dtensor::init_process_group();
    auto tp_mesh = dtensor::init_device_mesh(options.device, {world->size()}, {options.ep > 1 ? "ep" : "tp"});
    llama::LlamaForCausalLM model{nullptr};
    const auto load_start = std::chrono::steady_clock::now();
    try {
      model = inference::load_model(options, config, tp_mesh);
    } catch (const inference::SourceError& e) {
      return tools_cli::usage_error_exit(rank, e.what());
    }
    const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - load_start).count();
    const bool bytes = options.byte_prompts;
    const tokenizer::Tokenizer* tok = options.tokenizer.get();
    // A sequence as text: decoded by the tokenizer, else bytes or ids.
    auto text_of = [&](const std::vector<int64_t>& ids) {
      return tok ? tok->decode(ids, true, tokenizer::UnknownIds::kSkip) : show_all(ids, bytes);
    };
    if (rank == 0 && tok && tok->vocab_size() < config.vocab_size) {
      std::fprintf(stderr, "llama_generate: note: the model's vocabulary (%lld rows) is larger than the tokenizer's (%lld "
                           "tokens): ids past the tokenizer decode to nothing, as in transformers\n",
                   static_cast<long long>(config.vocab_size), static_cast<long long>(tok->vocab_size()));
    }
    if (rank == 0) {
      std::printf("llama_generate: %s=%lld batch=%zu | %s\n", options.ep > 1 ? "ep" : "tp", static_cast<long long>(tp_mesh.size()),
                  options.prompts.size(), config.to_string().c_str());
      if (options.stream) std::printf("%s", tools_cli::for_stdout(text_of(options.prompts[0])).c_str());
      std::fflush(stdout);
    }
    inference::TokenCallback stream;
    std::unique_ptr<tokenizer::TextStreamer> streamer;
    if (tok) {
      streamer = std::make_unique<tokenizer::TextStreamer>(*tok);
      streamer->prime(options.prompts[0]);  // the continuation's first word keeps its leading space
    }
    if (rank == 0 && options.stream) {
      stream = [&](int64_t, const std::vector<int64_t>& tokens) {
        if (tokens[0] < 0) return;
        // With a tokenizer: the text this token completes (a UTF-8 character split across tokens waits).
        std::printf("%s", tools_cli::for_stdout(streamer ? streamer->put(tokens[0]) : show(tokens[0], bytes)).c_str());
        std::fflush(stdout);
      };
    }
    dtensor::CommDebugMode comm;  // this rank's collectives over prefill and decode, for the summary
    const int64_t comm_start_ns = dtensor::exposed_comm_ns();  // and the time spent in them
    const auto result = inference::generate(model, options.prompts, options.generate, stream);
    const double comm_ms = static_cast<double>(dtensor::exposed_comm_ns() - comm_start_ns) / 1e6;
    int64_t comm_bytes = 0;
    for (const auto& [_, b] : comm.get_comm_bytes()) comm_bytes += b;
    const auto all_bytes = comm.get_comm_bytes();
    const int64_t all_to_all_bytes = all_bytes.contains("all_to_all") ? all_bytes.at("all_to_all") : 0;
    if (rank == 0) {
      if (options.stream) std::printf("%s\n", tools_cli::for_stdout(streamer ? streamer->end() : "").c_str());
      int64_t new_tokens = 0;
      for (size_t i = 0; i < result.new_tokens.size(); ++i) {
        new_tokens += static_cast<int64_t>(result.new_tokens[i].size());
        std::printf("[%zu] %s|%s\n", i, tools_cli::for_stdout(text_of(options.prompts[i])).c_str(),
                    tools_cli::for_stdout(text_of(result.new_tokens[i])).c_str());
      }
      const double ms_per_token = result.steps > 1 ? result.decode_ms / static_cast<double>(result.steps - 1) : 0.0;
      const double tokens_per_s = result.decode_ms > 0
                                      ? static_cast<double>(result.new_tokens.size() * (result.steps - 1)) / (result.decode_ms / 1000.0)
                                      : 0.0;
      std::printf("summary prompt_tokens=%lld new_tokens=%lld prefill_ms=%.3f ms_per_token=%.3f tokens_per_s=%.1f "
                  "comm_bytes=%lld all_to_all_bytes=%lld load_ms=%.1f dtype=%s collectives=%lld comm_ms=%.3f quantize=%s\n",
                  static_cast<long long>(result.prompt_tokens), static_cast<long long>(new_tokens), result.prefill_ms,
                  ms_per_token, tokens_per_s, static_cast<long long>(comm_bytes), static_cast<long long>(all_to_all_bytes),
                  load_ms, c10::toString(inference::model_dtype(options)), static_cast<long long>(comm.get_total_counts()),
                  comm_ms, options.quantize.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
