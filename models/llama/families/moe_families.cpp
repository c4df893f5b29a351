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
  r.read_or("mlp_only_layers", c.moe.mlp_only_layers, std::vector<int64_t>{});  // null: none
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
            read_mistral_common(r, c);  // (head_dim null: hidden / heads; sliding_window null: full attention)
            c.moe.num_experts = 8, c.moe.top_k = 2;  // MixtralConfig's defaults
            read_router(r, c, "num_local_experts");
            c.moe.intermediate_size = c.intermediate_size;  // every layer is sparse; experts take intermediate_size
            c.moe.norm_topk_prob = true;
            c.moe.router_weights_fp32 = true;
            double jitter = 0.0;
            if (r.read("router_jitter_noise", jitter) && jitter != 0.0) {
              r.fail("router_jitter_noise " + std::to_string(jitter) + " is not supported (0.0: no jitter)");
            }
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) {
            family("mistral").write(c, j);
            write_router(c, j, "num_local_experts");
            j["router_jitter_noise"] = 0.0;
          },
          {.rope_theta = 1000000.0, .rms_norm_eps = 1e-5, .max_position_embeddings = 131072, .num_key_value_heads = 8},
          {.mixtral_experts = true}};
}
DTENSOR_REGISTER_FAMILY(mixtral);

Family qwen2_moe() {
  return {"qwen2_moe", "Qwen2MoeForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            c.attention.qkv_bias = true;  // Qwen2MoeConfig's default
            r.read("qkv_bias", c.attention.qkv_bias);
            // Qwen2MoeConfig keeps a null num_key_value_heads, which its attention cannot run with.
            if (r.is_null("num_key_value_heads")) r.fail("field 'num_key_value_heads' is null (Qwen2-MoE's attention needs it)");
            read_qwen2_sliding(r, c, QwenSliding::qwen2_moe);
            // Qwen2MoeConfig's defaults
            c.moe.num_experts = 60, c.moe.top_k = 4, c.moe.norm_topk_prob = false, c.moe.intermediate_size = 1408;
            c.moe.shared_expert_intermediate_size = 5632;
            read_router(r, c, "num_experts");
            read_qwen_moe(r, c);
            r.read("shared_expert_intermediate_size", c.moe.shared_expert_intermediate_size);
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) {
            j["qkv_bias"] = c.attention.qkv_bias;
            write_qwen2_sliding(c, j);
            write_router(c, j, "num_experts");
            write_qwen_moe(c, j);
            j["shared_expert_intermediate_size"] = c.moe.shared_expert_intermediate_size;
          },
          {.max_position_embeddings = 32768, .num_key_value_heads = 16}};
}
DTENSOR_REGISTER_FAMILY(qwen2_moe);

Family qwen3_moe() {
  return {"qwen3_moe", "Qwen3MoeForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            c.attention.qk_norm = true;
            r.read("head_dim", c.attention.head_dim);  // absent: hidden / heads (not Qwen3's 128)
            r.read("attention_bias", c.attention.attention_bias);
            // Qwen3MoeConfig: sliding_window (4096 when absent; null: none) if use_sliding_window, and then every
            // layer slides.
            bool use_sliding_window = false;
            int64_t window = 4096;
            r.read("use_sliding_window", use_sliding_window);
            r.read_or("sliding_window", window, 0);
            r.ignore("max_window_layers");  // unused by Qwen3-MoE
            c.attention.sliding_window = use_sliding_window ? window : 0;
            // Qwen3MoeConfig's defaults; transformers 5 saves num_local_experts, the Hub's files say num_experts.
            c.moe.num_experts = 128, c.moe.top_k = 8, c.moe.norm_topk_prob = false, c.moe.intermediate_size = 768;
            read_router(r, c, r.json().contains("num_local_experts") ? "num_local_experts" : "num_experts");
            read_qwen_moe(r, c);
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) {
            j["head_dim"] = c.head_dim();
            j["attention_bias"] = c.attention.attention_bias;
            j["use_sliding_window"] = c.attention.sliding_window > 0;
            j["sliding_window"] = c.attention.sliding_window > 0 ? nlohmann::ordered_json(c.attention.sliding_window) : nullptr;
            write_router(c, j, "num_experts");
            write_qwen_moe(c, j);
          },
          {.max_position_embeddings = 32768, .num_key_value_heads = 4}};
}
DTENSOR_REGISTER_FAMILY(qwen3_moe);

}  // namespace llama::families
