// What a run keeps for others: the trained model as a Hugging Face checkpoint (llama_train --save-hf) and, beside it
// and beside the checkpoints, the model's tokenizer, so that transformers, serve and llama_generate read its text.
#pragma once

#include <string>

#include "llama/model.h"
#include "train/options.h"

namespace train {

// `dir`/`name` holding `text`, atomically and race-free: written to a temporary file of this process and thread, then
// renamed into place (every rank may write the same file).
void write_atomically(const std::string& dir, const std::string& name, const std::string& text);
// Whether the model's tokens are a text file's bytes (no tokenizer, no nanoGPT .bin).
bool bytes_are_tokens(const TrainOptions& options);
// The model's tokenizer into `dir`: tokenizer/byte_tokenizer.h's tokenizer.json when the tokens are bytes, else the
// tokenizer files of options.tokenizer_dir; nothing for a nanoGPT .bin (whose ids' tokenizer is not known). Every
// caller writes the same bytes (each file through its own temporary name, renamed into place).
void save_tokenizer(const TrainOptions& options, const std::string& dir);
// llama::save_hf_llama(dir) (collective: every rank gathers each weight, rank 0 writes) and save_tokenizer(dir). Under LoRA
// the adapter instead (dtensor/peft/adapter.h: what PeftModel.from_pretrained loads), or with --merge-lora the model
// with the adapters merged into its weights (PEFT's merge_and_unload, then save_pretrained).
void save_hf(const TrainOptions& options, llama::LlamaForCausalLM& model, const std::string& dir);
// Whether a run with these options keeps its trained weights anywhere (checkpoints or --save-hf).
bool keeps_weights(const TrainOptions& options);

}  // namespace train
