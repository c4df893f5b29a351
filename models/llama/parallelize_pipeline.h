// Pipeline parallelism for the Llama decoder (torchtitan's pipeline_llama / pipeline_module_split): the model is cut
// into stages, each a contiguous range of layers; the first stage also holds the embeddings, the last the final norm
// and lm_head. A stage is the factory's model with the rest removed (on meta, before anything is allocated): its
// parameters keep the whole model's names (model.layers.5.self_attn.q_proj.weight), so weights load and checkpoints
// save as at pp 1, and the TP plan applies to what the stage holds.
//
//   auto stages = llama::split_stages(config, /*num_stages=*/pp * v);
//   llama::keep_stage(meta_model, stages[s]);       // then the TP plan, to_empty, the weights, as build.h
//   dtensor::pp::PipelineStage stage(llama::stage_forward(model), params, s, pp * v, &pp_group, tp_mesh);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/pp/stage.h"
#include "llama/config.h"
#include "llama/model.h"

namespace llama {

struct StageLayers {
  int64_t first = 0, last = 0;  // layers [first, last)
  bool embeddings = false;      // model.embed_tokens (the first stage)
  bool head = false;            // model.norm and lm_head (the last stage)
};

// torchtitan's even split: num_hidden_layers over num_stages, the first (L mod S) stages one layer more; or at
// `split_points` (PyTorch's pipeline split points, as layer indices: the first layer of every stage but the first,
// increasing). Throws dtensor::Error for more stages than layers and for points that do not cut the model into
// num_stages non-empty ranges.
std::vector<StageLayers> split_stages(const LlamaConfig& config, int64_t num_stages,
                                      const std::vector<int64_t>& split_points = {});
// "2,4" -> {2, 4} (llama_train --pp-split-points); throws naming a bad entry.
std::vector<int64_t> split_points_from_string(const std::string& text);

// Removes from `model` what `stage` does not hold: the other layers, and embed_tokens, norm and lm_head where the
// stage has none. Throws dtensor::Error for tied embeddings (lm_head.weight is embed_tokens.weight) whose two uses fall
// on different stages, as torchtitan refuses them.
void keep_stage(LlamaForCausalLM& model, const StageLayers& stage);

// The stage's computation for dtensor::pp::PipelineStage: the first stage's input is the tokens [b, s], a later
// stage's the previous one's hidden states; the last returns logits, the others hidden states. Positions are
// 0..s-1 (the training forward: no cache, no padding). Under sequence parallel (torchtitan's plan) the hidden states
// between layers are each TP rank's plain shard of the sequence: give the TP mesh as `sequence_parallel_mesh`, and a
// later stage takes its input as the Shard(1) DTensor it is (so the model sees the whole sequence's length).
dtensor::pp::PipelineStage::Forward stage_forward(LlamaForCausalLM model,
                                                  std::optional<dtensor::DeviceMesh> sequence_parallel_mesh = std::nullopt);

}  // namespace llama
