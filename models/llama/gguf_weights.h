// GGUF files of llama.cpp's "llama" architecture (convert_hf_to_gguf's output for Llama and Mistral checkpoints, and
// llama-quantize's of those) as a source of the one factory (llama/build.h): the metadata read as the config.json
// transformers makes of it, each tensor dequantized (dtensor/checkpoint/gguf.h) into the model's dtype and cut to
// this rank's shard, as transformers' from_pretrained(dir, gguf_file=...) loads it.
//
//   GGUF                          HF (the rows of attn_q / attn_k are in llama.cpp's rotary order: un-permuted here)
//   token_embd, output_norm, output          model.embed_tokens, model.norm, lm_head (absent: tied)
//   blk.N.attn_norm / ffn_norm               model.layers.N.input_layernorm / post_attention_layernorm
//   blk.N.attn_q / _k / _v / _output         model.layers.N.self_attn.q_proj / k_proj / v_proj / o_proj
//   blk.N.ffn_gate / _up / _down             model.layers.N.mlp.gate_proj / up_proj / down_proj
//   rope_freqs                               Llama 3's rope scaling as llama.cpp applies it: inv_freq / rope_freqs
//
// A metadata key of the architecture that we do not know, a tensor that maps to no parameter, a tensor type we do not
// read and any other architecture are each one error naming it: nothing loads silently wrong.
#pragma once

#include <set>
#include <string>

#include "llama/config.h"
#include "llama/model.h"

namespace llama {

// A regular file that starts with GGUF's magic.
bool is_gguf_file(const std::string& path);

// config.json's text for the file (model_type "llama"), as transformers' GGUF loading fills it.
std::string hf_config_json_from_gguf(const std::string& path);
// That config, read and checked as config.json is (config_from_hf_json_text); a rope_freqs tensor becomes
// rope_scaling.freq_factors.
LlamaConfig config_from_gguf(const std::string& path);
// What dtype "auto" is for the file (common/dtype.h's names): its token embedding's when that is F32, F16 or BF16;
// "bfloat16" for a quantized file.
std::string gguf_dtype(const std::string& path);

// The HF names of the file's Linear weights stored in Q4_0 (what load_gguf_llama keeps as int4 with keep_q4_0).
std::set<std::string> q4_0_linear_weights(const std::string& path);

// Loads the file's tensors into `model` (plain or parallelized, or a pipeline stage's layers): each rank reads the
// rows of its shard (whole heads for attn_q / attn_k), dequantized into the parameter's dtype, and keeps its part (one
// such tensor at a time beside the model). With `keep_q4_0`, a Linear weight stored in Q4_0 is not dequantized: its
// blocks become the layer's int4 weight (dtensor/quant/int4_weight_only.h, group 32, zero 0: the same numbers), the
// parameter's pages never touched; a TP layout that cuts a block of 32 along in_features is refused naming the
// degrees that do not. Checks first that the file's config equals the model's and that every tensor maps to a
// parameter of the right shape. Collective over nothing: each rank reads the file itself.
void load_gguf_llama(const std::string& path, LlamaForCausalLM& model, bool keep_q4_0 = false);

}  // namespace llama
