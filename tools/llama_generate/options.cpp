#include "options.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "dtensor/core/error.h"
#include "inference/gguf_tokenizer.h"
#include "tokenizer/error.h"
#include "tools/common/dtype_option.h"

namespace llama_generate {
namespace {

// "1,2,3" -> {1, 2, 3}
std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto id = tools_cli::parse_number<int64_t>("--prompt-ids", item);
    if (id < 0) throw UsageError("--prompt-ids: token id " + item + " is negative");
    ids.push_back(id);
  }
  if (ids.empty()) throw UsageError("--prompt-ids: no token ids in '" + text + "'");
  return ids;
}

std::vector<int64_t> bytes_of(const std::string& text) {
  if (text.empty()) throw UsageError("--prompt is empty");
  std::vector<int64_t> ids;
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

// What parsing saw beyond the fields: which kinds of prompt were given.
struct Seen {
  bool text = false, ids = false;
};

// The options, defined once: parse_options reads them, help_text prints them.
void define(CLI::App& app, GenerateCliOptions& o, Seen& seen) {
  tools_cli::configure(app, "llama_generate");
  app.description(
      "llama_generate: generates from a Llama model under tensor parallelism (plain TP, KV cache sharded by heads).\n"
      "  tprun --nproc-per-node 2 llama_generate --random-init --prompt 'Hello' [options]");
  app.footer(
      "Rank 0 streams the tokens and ends with: summary prompt_tokens=.. new_tokens=.. prefill_ms=.. ms_per_token=.. "
      "tokens_per_s=.. comm_bytes=.. all_to_all_bytes=.. load_ms=.. dtype=.. collectives=.. comm_ms=.. quantize=..\n"
      "(comm_bytes, all_to_all_bytes, collectives: rank 0's collectives over prefill and decode; comm_ms: the time it "
      "spent in them, issuing and waiting)");
  const std::string weights = "weights (exactly one)", prompts = "prompts (one or more; several make a batch, left-padded)",
                    generation = "generation", sizes = "model sizes for --random-init";
  app.add_option("--checkpoint", o.checkpoint, "our checkpoint (llama_train --checkpoint-dir)")
      ->check(CLI::ExistingDirectory)->group(weights);
  app.add_option("--hf-dir", o.hf_dir, "HF weights (config.json + model.safetensors)")
      ->check(CLI::ExistingDirectory)->group(weights);
  app.add_option("--gguf", o.gguf, "a GGUF file of the llama architecture (llama.cpp's; its Q4_0 Linear weights kept "
                 "as int4, its other tensors dequantized to --dtype; its vocabulary unless --tokenizer)")
      ->check(CLI::ExistingFile)->group(weights);
  app.add_flag("--gguf-dequantize", o.gguf_dequantize, "--gguf's tensors all dequantized to --dtype, Q4_0 too "
               "(transformers' from_pretrained(gguf_file=...))")->group(weights);
  app.add_flag("--random-init", o.random_init, "random weights from --seed, sizes from the model flags below")->group(weights);
  app.add_option("--lora-adapter", o.lora_adapter,
                 "a PEFT adapter directory applied on the weights (as PeftModel.from_pretrained; llama_train --lora-rank "
                 "--save-hf writes one)")
      ->check(CLI::ExistingDirectory)->group(weights);
  tools_cli::add_dtype(app, o.dtype)->group(weights);
  tools_cli::add_quantize(app, o.quantize)->group(weights);
  tools_cli::add_weights_prepack(app, o.weights_prepack)->group(weights);
  tools_cli::add_device(app, o.device)->group(weights);
  tools_cli::each(app.add_option_function<std::string>(
                      "--prompt",
                      [&](const std::string& v) {
                        o.prompts.push_back(bytes_of(v));
                        o.prompt_texts.push_back(v);
                        seen.text = true;
                      },
                      "text: encoded with the tokenizer (--tokenizer, or --hf-dir's tokenizer.json), else bytes as "
                      "tokens (our byte-level models)"))
      ->group(prompts);
  tools_cli::each(app.add_option_function<std::string>(
                      "--chat",
                      [&](const std::string& v) {
                        if (v.empty()) throw UsageError("--chat is empty");
                        auto chat = nlohmann::ordered_json::array();
                        chat.push_back(nlohmann::ordered_json::object({{"role", "user"}, {"content", v}}));
                        o.chats.push_back(std::move(chat));
                      },
                      "a user message, rendered with the tokenizer's chat template (and a generation prompt)"))
      ->group(prompts);
  app.add_option("--system", o.system_prompt, "a system message before each --chat")->group(prompts);
  tools_cli::each(app.add_option_function<std::string>(
                      "--messages",
                      [&](const std::string& v) {
                        std::ifstream in(v);
                        if (!in) throw UsageError("--messages: cannot read '" + v + "'");
                        const auto j = nlohmann::ordered_json::parse(in, nullptr, /*allow_exceptions=*/false);
                        if (!j.is_array() || j.empty()) {
                          throw UsageError("--messages: '" + v + "' is not a non-empty JSON list of messages");
                        }
                        for (const auto& m : j) {
                          if (!m.is_object() || !m.contains("role")) {
                            throw UsageError("--messages: '" + v + "': each message needs a \"role\"");
                          }
                        }
                        o.chats.push_back(j);
                      },
                      "a conversation: a JSON list of {\"role\", \"content\"}, rendered as --chat"))
      ->option_text("FILE")->group(prompts);
  app.add_option("--tokenizer", o.tokenizer_dir,
                 "a Hugging Face tokenizer (tokenizer.json or tokenizer.model, and its configs) for --prompt, --chat "
                 "and the output")
      ->check(CLI::ExistingDirectory)->group(prompts);
  tools_cli::each(app.add_option_function<std::string>(
                      "--prompt-ids",
                      [&](const std::string& v) {
                        o.prompts.push_back(parse_ids(v));
                        seen.ids = true;
                      },
                      "token ids"))
      ->option_text("1,2,3")->group(prompts);
  app.add_option("--max-new-tokens", o.generate.max_new_tokens, "per sequence")->check(tools_cli::positive())->group(generation);
  app.add_option_function<int64_t>("--eos-id", [&](const int64_t& v) { o.generate.eos_token_id = v; },
                                   "a sequence stops after drawing N (default: none)")
      ->check(tools_cli::non_negative())->group(generation);
  app.add_option("--temperature", o.generate.sampling.temperature, "0 = greedy")
      ->check(tools_cli::non_negative())->group(generation);
  app.add_option("--top-k", o.generate.sampling.top_k, "0 = off")->check(tools_cli::non_negative())->group(generation);
  app.add_option("--top-p", o.generate.sampling.top_p, "1 = off")
      ->check(CLI::Validator(
          [](std::string& v) {
            const double p = std::strtod(v.c_str(), nullptr);
            return p > 0 && p <= 1 ? std::string() : "must be in (0, 1], got " + v;
          },
          "(0, 1]"))
      ->group(generation);
  app.add_option("--seed", o.seed, "sampling (and --random-init weights)")->group(generation);
  app.add_option("--batch", o.batch, "repeat the single prompt N times (default: one sequence per prompt)")
      ->check(tools_cli::positive())->group(generation);
  tools_cli::add_inference_ep(app, o.ep)->group(generation);
  app.add_option("--tp", o.tp, "TP degree (default: the world size)")->check(tools_cli::positive())->group(generation);
  app.add_flag_callback("--no-stream", [&] { o.stream = false; }, "print the outputs at the end only")->group(generation);
  app.add_option("--vocab", o.model.vocab_size, "vocabulary")->check(tools_cli::positive())->group(sizes);
  app.add_option("--dim", o.model.hidden_size, "hidden size")->check(tools_cli::positive())->group(sizes);
  app.add_option("--layers", o.model.num_hidden_layers, "decoder layers")->check(tools_cli::positive())->group(sizes);
  app.add_option("--heads", o.model.num_attention_heads, "query heads")->check(tools_cli::positive())->group(sizes);
  app.add_option("--kv-heads", o.model.num_key_value_heads, "key/value heads")->check(tools_cli::positive())->group(sizes);
  app.add_option("--ffn-dim", o.model.intermediate_size, "SwiGLU hidden size")->check(tools_cli::positive())->group(sizes);
}

}  // namespace

std::string help_text() {
  GenerateCliOptions d;
  Seen seen;
  CLI::App app;
  define(app, d, seen);
  return app.help();
}

GenerateCliOptions parse_options(const std::vector<std::string>& args, bool& help) {
  GenerateCliOptions o;
  Seen seen;
  CLI::App app;
  define(app, o, seen);
  help = tools_cli::parse(app, args);
  const bool has_text = seen.text, has_ids = seen.ids;
  if (help) return o;
  const int sources = !o.checkpoint.empty() + !o.hf_dir.empty() + !o.gguf.empty() + o.random_init;
  if (sources != 1) {
    throw UsageError("give exactly one of --checkpoint, --hf-dir, --gguf, --random-init (got " + std::to_string(sources) + ")");
  }
  // --gguf without --tokenizer: the file's own vocabulary, as transformers' AutoTokenizer(gguf_file=) makes it.
  bool gguf_vocab = false;
  try {
    gguf_vocab = !o.gguf.empty() && o.tokenizer_dir.empty() && inference::gguf_has_tokenizer(o.gguf);
  } catch (const dtensor::Error& e) {
    throw UsageError(e.what());
  }
  if (!o.gguf.empty() && o.tokenizer_dir.empty() && !gguf_vocab && (has_text || !o.chats.empty())) {
    throw UsageError("--gguf with a text prompt needs a tokenizer: the file carries no vocabulary (llama.cpp's "
                     "no_vocab); give --tokenizer DIR or --prompt-ids");
  }
  if (o.prompts.empty() && o.chats.empty()) throw UsageError("no prompt: give --prompt TEXT, --chat TEXT or --prompt-ids 1,2,3");
  if (has_text + has_ids + !o.chats.empty() > 1) throw UsageError("--prompt, --chat / --messages and --prompt-ids cannot be mixed");
  if (!o.system_prompt.empty() && o.chats.empty()) throw UsageError("--system needs --chat");
  const std::filesystem::path hf(o.hf_dir);
  if (o.tokenizer_dir.empty() && !o.hf_dir.empty() &&
      (std::filesystem::exists(hf / "tokenizer.json") || std::filesystem::exists(hf / "tokenizer.model"))) {
    o.tokenizer_dir = o.hf_dir;
  }
  if (!o.chats.empty() && o.tokenizer_dir.empty() && !gguf_vocab) {
    throw UsageError("--chat and --messages need a tokenizer: --tokenizer DIR or --hf-dir");
  }
  if (!o.tokenizer_dir.empty() || gguf_vocab) {
    try {
      o.tokenizer = std::make_shared<const tokenizer::Tokenizer>(
          gguf_vocab ? inference::load_gguf_tokenizer(o.gguf) : tokenizer::Tokenizer::from_pretrained(o.tokenizer_dir));
    } catch (const tokenizer::Error& e) {
      throw UsageError(e.what());
    } catch (const dtensor::Error& e) {
      throw UsageError(e.what());
    }
    for (size_t i = 0; i < o.prompt_texts.size(); ++i) o.prompts[i] = o.tokenizer->encode(o.prompt_texts[i]);
    for (auto& chat : o.chats) {
      if (!o.system_prompt.empty()) {
        chat.insert(chat.begin(), nlohmann::ordered_json::object({{"role", "system"}, {"content", o.system_prompt}}));
      }
      tokenizer::ChatOptions chat_options;
      chat_options.add_generation_prompt = true;
      try {
        o.prompts.push_back(o.tokenizer->encode(o.tokenizer->apply_chat_template(chat, chat_options), /*add_special_tokens=*/false));
      } catch (const tokenizer::Error& e) {
        throw UsageError(std::string("--chat: ") + e.what());
      }
    }
    if (!o.generate.eos_token_id) o.generate.eos_token_id = o.tokenizer->eos_token_id();
    if (const auto pad = o.tokenizer->pad_token_id()) o.generate.pad_token_id = *pad;
  }
  o.byte_prompts = has_text && !o.tokenizer;
  if (o.batch > 0) {
    if (o.prompts.size() != 1) throw UsageError("--batch repeats a single prompt; got " + std::to_string(o.prompts.size()) + " prompts");
    o.prompts.assign(static_cast<size_t>(o.batch), o.prompts[0]);
  }
  o.generate.sampling.seed = o.seed;
  try {
    o.model.validate();
    o.generate.sampling.validate();
  } catch (const std::exception& e) {
    throw UsageError(e.what());
  }
  return o;
}

void check_options(const GenerateCliOptions& o, int64_t world) {
  if (o.ep > 1) {
    if (o.tp > 1) throw UsageError("--ep with --tp " + std::to_string(o.tp) + ": generation runs expert parallelism alone (dense layers whole)");
    if (o.ep != world) throw UsageError("--ep " + std::to_string(o.ep) + " != world size " + std::to_string(world) +
                                        " (run with --nproc-per-node " + std::to_string(o.ep) + ")");
    return;
  }
  const int64_t tp = o.tp ? o.tp : world;
  if (tp != world) throw UsageError("--tp " + std::to_string(tp) + " != world size " + std::to_string(world) +
                                    " (run with --nproc-per-node " + std::to_string(tp) + ")");
}

}  // namespace llama_generate
