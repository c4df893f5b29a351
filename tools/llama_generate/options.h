// llama_generate's command line: long options with built-in defaults (`--help` lists them).
#pragma once

#include "tools/common/cli.h"

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "llama/config.h"
#include "inference/generate.h"
#include "inference/weights.h"
#include "tokenizer/tokenizer.h"

namespace llama_generate {

// The weights (inference/weights.h's ModelSource: --checkpoint, --hf-dir or --random-init with the size flags; --seed,
// --ep), then the prompts and the generation.
struct GenerateCliOptions : inference::ModelSource {
  // Prompts: byte-level text (our byte-token models) or token ids; several --prompt / --prompt-ids make a batch.
  std::vector<std::vector<int64_t>> prompts;
  bool byte_prompts = false;  // the prompts came from --prompt without a tokenizer: bytes, printed as text
  // --tokenizer DIR, or --hf-dir's when it holds a tokenizer.json: --prompt is encoded with it (its special
  // tokens included, as transformers does), the output is decoded and streamed as text, and its eos stops a
  // sequence unless --eos-id says otherwise.
  std::string tokenizer_dir;
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer;
  std::vector<std::string> prompt_texts;  // --prompt's, as given
  // --chat TEXT (a user message; several make a batch), with --system TEXT before each, or --messages FILE (a
  // JSON list of {"role", "content"}): rendered with the tokenizer's chat template and a generation prompt,
  // then encoded without added special tokens, as transformers' apply_chat_template(tokenize=True).
  std::vector<nlohmann::ordered_json> chats;
  std::string system_prompt;
  int64_t batch = 0;          // 0: one sequence per prompt; else a single prompt repeated `batch` times
  inference::GenerateOptions generate;  // max_new_tokens, eos, sampling (seed: --seed)
  // seed (ModelSource's): sampling too
  int64_t tp = 0;             // 0: the world size
  bool stream = true;         // print rank 0's tokens as they come
};

// A bad command line: main prints "error: <what>" on rank 0 and exits 2 on every rank.
using UsageError = tools_cli::UsageError;  // bad flags: one `error:` line, exit 2

// Parses argv (without argv[0]). Sets `help` when --help is given. Throws UsageError.
GenerateCliOptions parse_options(const std::vector<std::string>& args, bool& help);
std::string help_text();
// Checks what needs the world size (tp == world). Throws UsageError.
void check_options(const GenerateCliOptions& options, int64_t world_size);

}  // namespace llama_generate
