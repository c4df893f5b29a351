// The decoder's norm, of the kind the config chooses (config.h's NormKind). Parameters are HF's: weight
// (and bias for LayerNorm with bias); OLMo's has none. A plan hooks it as any layer (DTENSOR_MODULE):
// SequenceParallel runs it on sequence shards, ReplicateParallel on head shards.
//
// Over a sharded normalized dim (OLMo2's q_norm over all heads, with the heads Shard(-1) under TP) the
// statistics are a DTensor reduction: mean(x^2) over the shards is Partial until it is read, then one
// all-reduce of [b, s, 1]; the activations are never gathered.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <string>

#include "dtensor/nn/hooked_module.h"
#include "dtensor/nn/parameter_members.h"
#include "llama/config.h"

namespace llama {

struct NormImpl : torch::nn::Module, dtensor::nn::ParameterMembers {
  // written_out: RMSNorm as its separate ops even in fp32 (for a normalized dim that may be sharded).
  // rows > 0: the weight is [rows, dim], row h scaling the h-th of the input's rows (its dim -2), as Cohere's
  // per-head q/k norms (kinds layer_norm_weight_only). An input with k times as many rows (key/value heads each
  // replicated k times under TP: tp/head_replicated_colwise.h) meets each weight row k times.
  NormImpl(NormKind kind, int64_t dim, double eps, bool bias = false, bool written_out = false, int64_t rows = 0);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor* parameter_member(const std::string& name) override;
  NormKind kind;
  int64_t dim, rows;
  double eps;
  bool written_out;
  at::Tensor weight, bias;  // undefined where the kind has none
};
DTENSOR_MODULE(Norm);

}  // namespace llama
