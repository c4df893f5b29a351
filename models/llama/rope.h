// Rotary position embeddings with every scaling HF Llama-family checkpoints use (transformers'
// modeling_rope_utils.py: default, linear, dynamic NTK, YaRN, LongRoPE, Llama 3.1), computed as transformers
// computes them, in fp32, so that cos and sin match its bit for bit where the formulas allow.
//
// Two kinds depend on the forward's length (the largest position + 1, HF's `max(position_ids) + 1`):
// dynamic (the base grows past max_position_embeddings) and longrope (long_factor past
// original_max_position_embeddings, short_factor before). A cached decode step uses the frequencies of
// its own length, as HF's rotary module does: keys cached earlier keep the rotation they got then.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

#include "llama/config.h"

namespace llama {

struct RopeFrequencies {
  at::Tensor inv_freq;            // [head_dim / 2], fp32
  double attention_scaling = 1.0;  // multiplies cos and sin (yarn, longrope)
};

// The frequencies for a forward whose positions reach seq_len - 1.
RopeFrequencies rope_frequencies(const LlamaConfig& config, int64_t seq_len, c10::Device device = c10::kCPU);
// Whether rope_frequencies depends on seq_len (dynamic, longrope).
bool rope_depends_on_length(const LlamaConfig& config);

// cos and sin tables [table_len, rotary_dim] (head_dim, or its partial_rotary_factor part) for positions 0..table_len-1, with the frequencies of a forward
// of length freq_len (-1: table_len), already multiplied by the attention scaling.
std::pair<at::Tensor, at::Tensor> rotary_tables(const LlamaConfig& config, int64_t table_len,
                                                 c10::Device device = c10::kCPU, int64_t freq_len = -1);

// x [b, heads, s, head_dim] rotated by position: x * cos + rotate_half(x) * sin; with tables narrower than
// head_dim (partial rotary) only the first cos.size(-1) dims (interleaved: Cohere's and GLM's rotation of pairs
// (2i, 2i+1); its tables come from config.rotary.interleaved). In the wider of x's and the tables' dtypes (fp32 for
// x upcast first with `in_fp32`), the result in x's.
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool interleaved = false,
                        bool in_fp32 = false);

// Gemma 3's sliding layers: the config with rope_theta = rope_local_theta and no scaling.
LlamaConfig local_rope_config(const LlamaConfig& config);

}  // namespace llama
