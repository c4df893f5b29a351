#include "options.h"

#include <charconv>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "tokenizer/error.h"

namespace llama_generate {
namespace {

using tools_cli::parse_number;
using tools_cli::positive;

// "1,2,3" -> {1, 2, 3}
std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto id = parse_number<int64_t>("prompt-ids", item);
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

}  // namespace

std::string help_text() {
  GenerateCliOptions d;
  std::ostringstream s;
  s << "llama_generate: generates from a Llama model under tensor parallelism (plain TP, KV cache sharded by heads).\n"
    << "  tprun --nproc-per-node 2 llama_generate --random-init --prompt 'Hello' [options]\n\n"
    << "weights (exactly one):\n"
    << "  --checkpoint DIR          our checkpoint (llama_train --checkpoint-dir)\n"
    << "  --hf-dir DIR              HF Llama weights (config.json + model.safetensors)\n"
    << "  --random-init             random weights from --seed, sizes from the model flags below\n"
    << "prompts (one or more; several make a batch, left-padded):\n"
    << "  --prompt TEXT             text: encoded with the tokenizer (--tokenizer, or --hf-dir's tokenizer.json),\n"
    << "                            else bytes as tokens (our byte-level models)\n"
    << "  --chat TEXT               a user message, rendered with the tokenizer's chat template (and a generation prompt)\n"
    << "  --system TEXT             a system message before each --chat\n"
    << "  --messages FILE           a conversation: a JSON list of {\"role\", \"content\"}, rendered as --chat\n"
    << "  --tokenizer DIR           a Hugging Face tokenizer (tokenizer.json or tokenizer.model, and its configs)\n"
    << "                            for --prompt, --chat and the output\n"
    << "  --prompt-ids 1,2,3        token ids\n"
    << "generation:\n"
    << "  --max-new-tokens N        per sequence (default " << d.generate.max_new_tokens << ")\n"
    << "  --eos-id N                a sequence stops after drawing N (default: none)\n"
    << "  --temperature X           0 = greedy (default " << d.generate.sampling.temperature << ")\n"
    << "  --top-k N                 0 = off (default " << d.generate.sampling.top_k << ")\n"
    << "  --top-p X                 1 = off (default " << d.generate.sampling.top_p << ")\n"
    << "  --seed N                  sampling (and --random-init weights) (default " << d.seed << ")\n"
    << "  --batch N                 repeat the single prompt N times (default: one sequence per prompt)\n"
    << "  --ep N                    expert parallelism (a mixture of experts): the experts split over the N\n"
    << "                            ranks (N = the world size), dense layers whole; instead of TP\n"
    << "  --tp N                    TP degree (default: the world size)\n"
    << "  --no-stream               print the outputs at the end only\n"
    << "model sizes for --random-init:\n"
    << "  --vocab N (default " << d.model.vocab_size << ")  --dim N (" << d.model.hidden_size << ")  --layers N ("
    << d.model.num_hidden_layers << ")  --heads N (" << d.model.num_attention_heads << ")  --kv-heads N ("
    << d.model.num_key_value_heads << ")  --ffn-dim N (" << d.model.intermediate_size << ")\n"
    << "  --help\n"
    << "Rank 0 streams the tokens and ends with: summary prompt_tokens=.. new_tokens=.. prefill_ms=.. ms_per_token=.. tokens_per_s=.. comm_bytes=.. all_to_all_bytes=..\n"
    << "(comm_bytes, all_to_all_bytes: rank 0's collectives over prefill and decode)\n";
  return s.str();
}

GenerateCliOptions parse_options(const std::vector<std::string>& args, bool& help) {
  GenerateCliOptions o;
  help = false;
  bool has_text = false, has_ids = false;
  const tools_cli::ValuedOptions valued = {
      {"checkpoint", [&](const std::string& v) {
         if (!std::filesystem::is_directory(v)) throw UsageError("--checkpoint: no such directory '" + v + "'");
         o.checkpoint = v;
       }},
      {"hf-dir", [&](const std::string& v) {
         if (!std::filesystem::is_directory(v)) throw UsageError("--hf-dir: no such directory '" + v + "'");
         o.hf_dir = v;
       }},
      {"prompt", [&](const std::string& v) {
         o.prompts.push_back(bytes_of(v));
         o.prompt_texts.push_back(v);
         has_text = true;
       }},
      {"chat", [&](const std::string& v) {
         if (v.empty()) throw UsageError("--chat is empty");
         auto chat = nlohmann::ordered_json::array();
         chat.push_back(nlohmann::ordered_json::object({{"role", "user"}, {"content", v}}));
         o.chats.push_back(std::move(chat));
       }},
      {"system", [&](const std::string& v) { o.system_prompt = v; }},
      {"messages", [&](const std::string& v) {
         std::ifstream in(v);
         if (!in) throw UsageError("--messages: cannot read '" + v + "'");
         const auto j = nlohmann::ordered_json::parse(in, nullptr, /*allow_exceptions=*/false);
         if (!j.is_array() || j.empty()) throw UsageError("--messages: '" + v + "' is not a non-empty JSON list of messages");
         for (const auto& m : j) {
           if (!m.is_object() || !m.contains("role")) throw UsageError("--messages: '" + v + "': each message needs a \"role\"");
         }
         o.chats.push_back(j);
       }},
      {"tokenizer", [&](const std::string& v) {
         if (!std::filesystem::is_directory(v)) throw UsageError("--tokenizer: no such directory '" + v + "'");
         o.tokenizer_dir = v;
       }},
      {"prompt-ids", [&](const std::string& v) { o.prompts.push_back(parse_ids(v)); has_ids = true; }},
      {"max-new-tokens", [&](const std::string& v) { o.generate.max_new_tokens = positive("max-new-tokens", v); }},
      {"eos-id", [&](const std::string& v) {
         o.generate.eos_token_id = parse_number<int64_t>("eos-id", v);
         if (*o.generate.eos_token_id < 0) throw UsageError("--eos-id must not be negative, got " + v);
       }},
      {"temperature", [&](const std::string& v) {
         o.generate.sampling.temperature = parse_number<double>("temperature", v);
         if (o.generate.sampling.temperature < 0) throw UsageError("--temperature must not be negative, got " + v);
       }},
      {"top-k", [&](const std::string& v) {
         o.generate.sampling.top_k = parse_number<int64_t>("top-k", v);
         if (o.generate.sampling.top_k < 0) throw UsageError("--top-k must not be negative, got " + v);
       }},
      {"top-p", [&](const std::string& v) {
         o.generate.sampling.top_p = parse_number<double>("top-p", v);
         if (!(o.generate.sampling.top_p > 0 && o.generate.sampling.top_p <= 1)) throw UsageError("--top-p must be in (0, 1], got " + v);
       }},
      {"seed", [&](const std::string& v) { o.seed = parse_number<uint64_t>("seed", v); }},
      {"batch", [&](const std::string& v) { o.batch = positive("batch", v); }},
      {"tp", [&](const std::string& v) { o.tp = positive("tp", v); }},
      {"ep", [&](const std::string& v) { o.ep = positive("ep", v); }},
      {"vocab", [&](const std::string& v) { o.model.vocab_size = positive("vocab", v); }},
      {"dim", [&](const std::string& v) { o.model.hidden_size = positive("dim", v); }},
      {"layers", [&](const std::string& v) { o.model.num_hidden_layers = positive("layers", v); }},
      {"heads", [&](const std::string& v) { o.model.num_attention_heads = positive("heads", v); }},
      {"kv-heads", [&](const std::string& v) { o.model.num_key_value_heads = positive("kv-heads", v); }},
      {"ffn-dim", [&](const std::string& v) { o.model.intermediate_size = positive("ffn-dim", v); }},
  };
  const tools_cli::FlagOptions flags = {
      {"random-init", [&] { o.random_init = true; }},
      {"no-stream", [&] { o.stream = false; }},
      {"help", [&] { help = true; }},
  };
  tools_cli::parse_args(args, valued, flags);
  if (help) return o;
  const int sources = !o.checkpoint.empty() + !o.hf_dir.empty() + o.random_init;
  if (sources != 1) throw UsageError("give exactly one of --checkpoint, --hf-dir, --random-init (got " + std::to_string(sources) + ")");
  if (o.prompts.empty() && o.chats.empty()) throw UsageError("no prompt: give --prompt TEXT, --chat TEXT or --prompt-ids 1,2,3");
  if (has_text + has_ids + !o.chats.empty() > 1) throw UsageError("--prompt, --chat / --messages and --prompt-ids cannot be mixed");
  if (!o.system_prompt.empty() && o.chats.empty()) throw UsageError("--system needs --chat");
  const std::filesystem::path hf(o.hf_dir);
  if (o.tokenizer_dir.empty() && !o.hf_dir.empty() &&
      (std::filesystem::exists(hf / "tokenizer.json") || std::filesystem::exists(hf / "tokenizer.model"))) {
    o.tokenizer_dir = o.hf_dir;
  }
  if (!o.chats.empty() && o.tokenizer_dir.empty()) throw UsageError("--chat and --messages need a tokenizer: --tokenizer DIR or --hf-dir");
  if (!o.tokenizer_dir.empty()) {
    try {
      o.tokenizer = std::make_shared<const tokenizer::Tokenizer>(tokenizer::Tokenizer::from_pretrained(o.tokenizer_dir));
    } catch (const tokenizer::Error& e) {
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
