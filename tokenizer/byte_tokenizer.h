// The tokenizer of a model whose tokens are raw bytes (llama_train on a text file: token id = byte value, vocab 256),
// as a Hugging Face tokenizer.json: a byte-level BPE whose vocabulary is GPT-2's 256 byte symbols, symbol of byte b
// at id b, and no merges, so that encode gives each byte's value and decode the bytes back. llama_train writes it
// beside the model's config.json, so serve, llama_generate --tokenizer and transformers' AutoTokenizer read the
// model's text as it was trained.
#pragma once

#include <string>

namespace tokenizer {

std::string byte_tokenizer_json();

}  // namespace tokenizer
