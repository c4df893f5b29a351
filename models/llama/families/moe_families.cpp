// The mixture-of-experts families (transformers' modular_mixtral.py, modular_qwen2_moe.py, modular_qwen3_moe.py):
// Mistral's, Qwen2's and Qwen3's attention with a sparse MLP (config.h's MoeConfig, llama/moe.h) on every layer
// (Mixtral) or on the layers decoder_sparse_step and mlp_only_layers choose (Qwen).
#include "llama/families/families.h"

namespace llama::families {
namespace {

// What the three share: the router's fields.
void read_router(HfConfigReader& r, LlamaConfig& c, const char* experts_key) {
  r.read(experts_key, c.moe.num_experts);
  r.read("num_experts_per_tok", c.moe.top_k);
  r.read("router_aux_loss_coef", c.moe.router_aux_loss_coef);
}

void write_router(const LlamaConfig& c, nlohmann::ordered_json& j, const char* experts_key) {
  j[experts_key] = c.moe.num_experts;
  j["num_experts_per_tok"] = c.moe.top_k;
  j["router_aux_loss_coef"] = c.moe.router_aux_loss_coef;
  j["output_router_logits"] = false;
}

// Qwen2-MoE's and Qwen3-MoE's sparse layers and experts.
void read_qwen_moe(HfConfigReader& r, LlamaConfig& c) {
  r.read("moe_intermediate_size", c.moe.intermediate_size);
  r.read("norm_topk_prob", c.moe.norm_topk_prob);
  r.read("decoder_sparse_step", c.moe.decoder_sparse_step);
  r.read("mlp_only_layers", c.moe.mlp_only_layers);
}

void write_qwen_moe(const LlamaConfig& c, nlohmann::ordered_json& j) {
  j["moe_intermediate_size"] = c.moe.intermediate_size;
  j["norm_topk_prob"] = c.moe.norm_topk_prob;
  j["decoder_sparse_step"] = c.moe.decoder_sparse_step;
  j["mlp_only_layers"] = c.moe.mlp_only_layers;
}

}  // namespace

Family mixtral() {
  return {"mixtral", "MixtralForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            mistral().read(r, c);
            read_router(r, c, "num_local_experts");
            c.moe.intermediate_size = c.intermediate_size;  // every layer is sparse; experts take intermediate_size
            c.moe.norm_topk_prob = true;
            c.moe.router_weights_fp32 = true;
            c.moe.mixtral_names = true;
            double jitter = 0.0;
            if (r.read("router_jitter_noise", jitter) && jitter != 0.0) {
              r.fail("router_jitter_noise " + std::to_string(jitter) + " is not supported (0.0: no jitter)");
            }
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) {
            mistral().write(c, j);
            write_router(c, j, "num_local_experts");
            j["router_jitter_noise"] = 0.0;
          }};
}

Family qwen2_moe() {
  return {"qwen2_moe", "Qwen2MoeForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            c.qkv_bias = true;  // Qwen2MoeConfig's default
            r.read("qkv_bias", c.qkv_bias);
            if (r.has("use_sliding_window") && !r.has("layer_types")) {
              bool sliding = false;
              r.read("use_sliding_window", sliding);
              if (sliding) r.fail("use_sliding_window without layer_types (Qwen2-MoE derives another pattern than Qwen2)");
            }
            read_qwen2_sliding(r, c);
            read_router(r, c, "num_experts");
            read_qwen_moe(r, c);
            r.read("shared_expert_intermediate_size", c.moe.shared_expert_intermediate_size);
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) {
            j["qkv_bias"] = c.qkv_bias;
            write_qwen2_sliding(c, j);
            write_router(c, j, "num_experts");
            write_qwen_moe(c, j);
            j["shared_expert_intermediate_size"] = c.moe.shared_expert_intermediate_size;
          }};
}

Family qwen3_moe() {
  return {"qwen3_moe", "Qwen3MoeForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            c.qk_norm = true;
            r.read("head_dim", c.explicit_head_dim);  // absent: hidden / heads (not Qwen3's 128)
            r.read("attention_bias", c.attention_bias);
            bool use_sliding_window = false;
            int64_t window = 0;
            r.read("use_sliding_window", use_sliding_window);
            r.read("sliding_window", window);
            r.ignore("max_window_layers");  // unused by Qwen3-MoE: with use_sliding_window every layer slides
            c.sliding_window = use_sliding_window ? window : 0;
            // transformers 5 saves num_local_experts; the Hub's files say num_experts.
            read_router(r, c, r.has("num_local_experts") ? "num_local_experts" : "num_experts");
            read_qwen_moe(r, c);
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) {
            j["head_dim"] = c.head_dim();
            j["attention_bias"] = c.attention_bias;
            j["use_sliding_window"] = c.sliding_window > 0;
            j["sliding_window"] = c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window) : nullptr;
            write_router(c, j, "num_experts");
            write_qwen_moe(c, j);
          }};
}

}  // namespace llama::families
