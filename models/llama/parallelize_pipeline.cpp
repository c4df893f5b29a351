#include "llama/parallelize_pipeline.h"

#include <ATen/ATen.h>

#include <sstream>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"

namespace llama {

std::vector<StageLayers> split_stages(const LlamaConfig& config, int64_t num_stages,
                                      const std::vector<int64_t>& split_points) {
  const int64_t L = config.num_hidden_layers;
  DTENSOR_CHECK(num_stages >= 1 && num_stages <= L, "dtensor: pipeline: ", num_stages, " stages for a model of ", L,
                " layers (each stage holds at least one)");
  std::vector<int64_t> starts{0};
  if (split_points.empty()) {
    const int64_t base = L / num_stages, extra = L % num_stages;
    for (int64_t s = 1; s < num_stages; ++s) starts.push_back(starts.back() + base + (s - 1 < extra ? 1 : 0));
  } else {
    DTENSOR_CHECK(static_cast<int64_t>(split_points.size()) == num_stages - 1, "dtensor: pipeline: ",
                  split_points.size(), " split points for ", num_stages, " stages (one fewer than the stages)");
    for (int64_t p : split_points) {
      DTENSOR_CHECK(p > starts.back() && p < L, "dtensor: pipeline split point ", p, " must be a layer index in (",
                    starts.back(), ", ", L, "): the points increase and every stage holds a layer");
      starts.push_back(p);
    }
  }
  std::vector<StageLayers> out;
  for (int64_t s = 0; s < num_stages; ++s) {
    const int64_t last = s + 1 < num_stages ? starts[static_cast<size_t>(s + 1)] : L;
    out.push_back({starts[static_cast<size_t>(s)], last, s == 0, s == num_stages - 1});
  }
  return out;
}

std::vector<int64_t> split_points_from_string(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    size_t used = 0;
    int64_t v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    DTENSOR_CHECK(used == item.size() && !item.empty() && v > 0, "dtensor: pipeline split point '", item,
                  "' is not a positive layer index (--pp-split-points takes e.g. 2,4)");
    out.push_back(v);
  }
  return out;
}

void keep_stage(LlamaForCausalLM& model, const StageLayers& stage) {
  const LlamaConfig& c = model->config;
  DTENSOR_CHECK(!c.tie_word_embeddings || stage.embeddings == stage.head, "dtensor: pipeline: this model ties lm_head "
                "to embed_tokens (tie_word_embeddings), which would sit on different stages; pipeline parallelism "
                "needs untied embeddings (as torchtitan's)");
  DTENSOR_CHECK(stage.first >= 0 && stage.first < stage.last && stage.last <= c.num_hidden_layers,
                "dtensor: pipeline stage of layers [", stage.first, ", ", stage.last, ") in a model of ",
                c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (i >= stage.first && i < stage.last) continue;
    model->model->layers->pop(std::to_string(i));                // ModuleDict::pop keeps the registration (as
    model->model->layers->unregister_module(std::to_string(i));  // Python's): the child goes too
  }
  if (!stage.embeddings) {
    model->model->unregister_module("embed_tokens");
    model->model->embed_tokens = nullptr;
  }
  if (!stage.head) {
    model->model->unregister_module("norm");
    model->model->norm = nullptr;
    model->unregister_module("lm_head");
    model->lm_head = nullptr;
  }
}

dtensor::pp::PipelineStage::Forward stage_forward(LlamaForCausalLM model,
                                                  std::optional<dtensor::DeviceMesh> sequence_parallel_mesh) {
  const bool first = static_cast<bool>(model->model->embed_tokens);
  return [model, first, sp = std::move(sequence_parallel_mesh)](const at::Tensor& input) mutable {
    // A later stage under sequence parallel holds this rank's rows [b, s / tp, hidden] of the hidden states (the
    // plan's layers take them so): the rotary tables are the whole sequence's positions.
    if (!first && sp && !dtensor::is_dtensor(input)) {
      return model(input, at::Tensor(), at::arange(input.size(1) * sp->size(), input.options().dtype(at::kLong)));
    }
    return model(input);
  };
}

}  // namespace llama
