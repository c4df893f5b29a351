#include "llama/moe.h"

#include <ATen/ATen.h>

#include "dtensor/core/chunking.h"
#include "dtensor/nn/default_device.h"
#include "dtensor/core/moe_combine.h"

namespace llama {

MoeExpertsImpl::MoeExpertsImpl(int64_t num_experts, int64_t hidden, int64_t intermediate, std::string act_)
    : act(std::move(act_)) {
  // On the layers' default device (the dry run's meta), as dtensor::nn's layers.
  const at::TensorOptions options = at::TensorOptions().device(dtensor::nn::DefaultDeviceGuard::current().value_or(at::kCPU));
  gate_up_proj = register_parameter("gate_up_proj", at::empty({num_experts, 2 * intermediate, hidden}, options));
  down_proj = register_parameter("down_proj", at::empty({num_experts, hidden, intermediate}, options));
  at::NoGradGuard no_grad;
  gate_up_proj.normal_(0.0, 0.02);
  down_proj.normal_(0.0, 0.02);
}

at::Tensor MoeExpertsImpl::forward(const at::Tensor& x, const at::Tensor& idx, const at::Tensor& w) {
  return grouped ? forward_grouped(x, idx, w) : forward_naive(x, idx, w);
}

namespace {

// One expert on its rows: down(act(gate(x)) * up(x)).
at::Tensor expert(const std::string& act, const at::Tensor& x, const at::Tensor& gate_up, const at::Tensor& down) {
  auto gu = at::linear(x, gate_up).chunk(2, -1);
  return at::linear(activation(act, gu[0]) * gu[1], down);
}

}  // namespace

at::Tensor MoeExpertsImpl::forward_naive(const at::Tensor& x, const at::Tensor& idx, const at::Tensor& w) {
  at::Tensor out = at::zeros_like(x);
  const int64_t num_experts = gate_up_proj.size(0);
  for (int64_t e = 0; e < num_experts; ++e) {
    auto where = at::where(idx.t() == e);  // slot-major, as transformers' where over [k, T]
    const at::Tensor& slot = where[0];
    const at::Tensor& token = where[1];
    if (token.numel() == 0) continue;
    at::Tensor y = expert(act, x.index_select(0, token), gate_up_proj[e], down_proj[e]);
    y = y * w.index({token, slot}).unsqueeze(-1);
    out.index_add_(0, token, y.to(out.scalar_type()));
  }
  return out;
}

at::Tensor MoeExpertsImpl::forward_grouped(const at::Tensor& x, const at::Tensor& idx, const at::Tensor& w) {
  const int64_t tokens = x.size(0), k = idx.size(1), num_experts = gate_up_proj.size(0);
  const at::Tensor flat = idx.reshape(-1);                           // pair p = token * k + slot
  const at::Tensor order = at::argsort(flat, /*stable=*/true);       // pairs grouped by expert
  // Rows per expert. A meta tensor (the dry run) carries no routing: balanced, torch.chunk of the rows.
  std::vector<int64_t> count = dtensor::chunk_sizes(flat.numel(), num_experts);
  if (!flat.is_meta()) {
    const at::Tensor counts = at::bincount(flat, {}, num_experts).cpu();
    count.assign(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + num_experts);
  }
  const at::Tensor rows = x.index_select(0, at::div(order, k, "floor"));
  std::vector<at::Tensor> outs;
  int64_t begin = 0;
  for (int64_t e = 0; e < num_experts; ++e) {
    if (count[e] == 0) continue;
    outs.push_back(expert(act, rows.narrow(0, begin, count[e]), gate_up_proj[e], down_proj[e]));
    begin += count[e];
  }
  at::Tensor y = outs.empty() ? rows.new_zeros({0, down_proj.size(1)}) : at::cat(outs, 0);
  y = y * w.reshape(-1).index_select(0, order).unsqueeze(-1);  // in fp32 where the weights are (Mixtral)
  at::Tensor unsorted = at::empty_like(y).index_copy_(0, order, y);  // back to pair order
  return dtensor::sum_expert_shares(unsorted.view({tokens, k, y.size(-1)}), idx, x.scalar_type());
}

SparseMoeBlockImpl::SparseMoeBlockImpl(const LlamaConfig& c)
    : top_k(c.moe.top_k),
      norm_topk_prob(c.moe.norm_topk_prob),
      router_weights_fp32(c.moe.router_weights_fp32),
      gate(register_module("gate", linear(c.hidden_size, c.moe.num_experts))),
      experts(register_module("experts", MoeExperts(c.moe.num_experts, c.hidden_size, c.moe.intermediate_size, c.mlp.hidden_act))) {
  if (c.moe.shared_expert_intermediate_size > 0) {
    shared_expert = register_module("shared_expert", FeedForward(c, c.moe.shared_expert_intermediate_size));
    shared_expert_gate = register_module("shared_expert_gate", linear(c.hidden_size, 1));
  }
}

at::Tensor SparseMoeBlockImpl::forward(const at::Tensor& x) {
  const at::Tensor h = x.reshape({-1, x.size(-1)});
  router_logits = gate(h);
  // Mixtral: softmax in fp32, weights kept in fp32; Qwen: softmax in fp32, weights back in the logits' dtype.
  const at::Tensor probs = at::softmax(router_logits, -1, at::kFloat);
  auto [weights, index] = at::topk(probs, top_k, -1);
  if (norm_topk_prob) weights = weights / weights.sum(-1, /*keepdim=*/true);
  if (!router_weights_fp32) weights = weights.to(router_logits.scalar_type());
  at::Tensor out = experts(h, index, weights);
  if (shared_expert) out = out + at::sigmoid(shared_expert_gate(h)) * shared_expert(h);
  return out.view(x.sizes());
}

at::Tensor load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t num_experts, int64_t top_k,
                               const at::Tensor& attention_mask, const SumOverRanks& sum_over_ranks) {
  const auto opts = router_logits.at(0).options().dtype(at::kFloat);
  at::Tensor tokens_per_expert = at::zeros({num_experts}, opts), prob_sum = at::zeros({num_experts}, opts);
  at::Tensor rows = at::zeros({}, opts);
  const at::Tensor mask = attention_mask.defined() ? attention_mask.reshape(-1).to(at::kFloat) : at::Tensor();
  for (const at::Tensor& logits : router_logits) {
    const at::Tensor probs = at::softmax(logits, -1);  // in the logits' dtype, as transformers
    const at::Tensor selected = std::get<1>(at::topk(probs, top_k, -1)).reshape(-1);
    const at::Tensor m = mask.defined() ? mask : at::ones({logits.size(0)}, opts);
    tokens_per_expert = tokens_per_expert + at::zeros({num_experts}, opts).scatter_add_(0, selected, m.repeat_interleave(top_k));
    prob_sum = prob_sum + (probs.to(at::kFloat) * m.unsqueeze(-1)).sum(0);
    rows = rows + m.sum();
  }
  if (sum_over_ranks) {
    tokens_per_expert = sum_over_ranks(tokens_per_expert);
    prob_sum = sum_over_ranks(prob_sum);
    rows = sum_over_ranks(rows);
  }
  return (tokens_per_expert / rows * (prob_sum / rows)).sum() * static_cast<double>(num_experts);
}

}  // namespace llama
