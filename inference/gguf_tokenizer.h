// A GGUF file's own vocabulary (tokenizer.ggml.*) as the Hugging Face tokenizer transformers makes of it
// (AutoTokenizer.from_pretrained(dir, gguf_file=...)): tokenizer.json and tokenizer_config.json written to a directory,
// which tokenizer::Tokenizer::from_pretrained then reads like any checkpoint's.
//
//   tokenizer.ggml.model "gpt2"   byte-level BPE: tokens in id order (spelled in GPT-2's byte alphabet; others
//                                 respelled from their UTF-8 bytes), merges "left right", token_type 3 (control)
//                                 as special added tokens and 4 (user-defined) as plain ones
//   tokenizer.ggml.pre            the split regex the merges were learned with (llama-bpe and its kin: Llama 3's;
//                                 qwen2's), then bytes
//   bos / eos ids, add_bos_token  tokenizer_config.json's bos_token / eos_token, BOS prepended when asked
//   tokenizer.chat_template       tokenizer_config.json's chat_template
//
// Any other tokenizer model (SentencePiece "llama", "t5", ...) or pre-tokenizer is one error naming it.
#pragma once

#include <string>

#include "tokenizer/tokenizer.h"

namespace inference {

// Whether the file carries a vocabulary (tokenizer.ggml.tokens).
bool gguf_has_tokenizer(const std::string& gguf_path);

// Writes the file's tokenizer as tokenizer.json + tokenizer_config.json into `dir` (made if absent). Throws
// dtensor::Error naming what it does not read.
void save_gguf_tokenizer(const std::string& gguf_path, const std::string& dir);

// The file's tokenizer loaded (saved to a fresh temporary directory, read by Tokenizer::from_pretrained, removed).
tokenizer::Tokenizer load_gguf_tokenizer(const std::string& gguf_path);

}  // namespace inference
