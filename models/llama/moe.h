// Mixture of experts (transformers 5's MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock, Qwen3MoeSparseMoeBlock),
// with no parallel code: a router picks each token's top_k of num_experts gated MLPs and weighs their outputs;
// Qwen2-MoE adds a shared expert behind a sigmoid gate. The experts are two 3-D parameters, as transformers 5
// holds them (the checkpoint's per-expert weights are assembled on load: llama/hf_weights.cpp):
//   experts.gate_up_proj [E, 2I, H]: expert e's gate rows, then its up rows
//   experts.down_proj    [E, H, I]
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <string>
#include <vector>

#include "dtensor/nn/hooked_module.h"
#include "dtensor/nn/layers.h"
#include "dtensor/nn/parameter_members.h"
#include "llama/config.h"
#include "llama/feed_forward.h"

namespace llama {

// Named members (dtensor::nn::ParameterMembers), so that a style can point forward at the local shards.
struct MoeExpertsImpl : torch::nn::Module, dtensor::nn::ParameterMembers {
  MoeExpertsImpl(int64_t num_experts, int64_t hidden, int64_t intermediate, std::string act);
  at::Tensor* parameter_member(const std::string& name) override {
    return name == "gate_up_proj" ? &gate_up_proj : name == "down_proj" ? &down_proj : nullptr;
  }
  // x [T, H]; idx [T, k] expert ids; w [T, k] their weights -> [T, H] = sum over k of w * expert(x).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& idx, const at::Tensor& w);
  // The reference: transformers' eager loop (experts in ascending order, each adding its weighted output into
  // the result with index_add_, cast to x's dtype).
  at::Tensor forward_naive(const at::Tensor& x, const at::Tensor& idx, const at::Tensor& w);
  // The fast path: the (token, slot) pairs sorted by expert, one matmul per expert over its contiguous rows, the
  // weighted rows put back and summed over the k slots.
  at::Tensor forward_grouped(const at::Tensor& x, const at::Tensor& idx, const at::Tensor& w);
  at::Tensor gate_up_proj, down_proj;
  std::string act;
  bool grouped = true;  // forward's path
};
DTENSOR_MODULE(MoeExperts);

struct SparseMoeBlockImpl : torch::nn::Module {
  explicit SparseMoeBlockImpl(const LlamaConfig& config);
  // x [b, s, H] -> [b, s, H]. Keeps router_logits [b*s, E] for the load-balancing loss.
  at::Tensor forward(const at::Tensor& x);
  int64_t top_k;
  bool norm_topk_prob, router_weights_fp32;
  dtensor::nn::Linear gate;                               // the router, H -> E, no bias
  MoeExperts experts;
  FeedForward shared_expert{nullptr};                     // Qwen2-MoE
  dtensor::nn::Linear shared_expert_gate{nullptr};        // H -> 1
  at::Tensor router_logits;
};
DTENSOR_MODULE(SparseMoeBlock);

// transformers' load_balancing_loss_func (Switch Transformer's): over the sparse layers' router logits
// ([T, E] each) pooled, f_e = the share of top-k assignments to expert e and P_e = its mean router probability,
// both over the real tokens (attention_mask [b, s] flattened; undefined: all); the loss is E * sum_e f_e * P_e.
// Under data parallelism each rank holds some of the batch's tokens: `sum_over_ranks` (a sum over the data
// ranks whose backward sums the gradients too) pools the counts, the probabilities and the token count, so
// that the loss is the whole batch's, as on one device.
using SumOverRanks = std::function<at::Tensor(const at::Tensor&)>;
at::Tensor load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t num_experts, int64_t top_k,
                               const at::Tensor& attention_mask = {}, const SumOverRanks& sum_over_ranks = nullptr);

}  // namespace llama
