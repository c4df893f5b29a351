#include "dtensor/nn/parameter_replacement.h"
#include "dtensor/nn/parameter_members.h"
#include "dtensor/core/error.h"

#include <algorithm>

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include "dtensor/nn/layers.h"

namespace dtensor::nn {
namespace {

// torch::nn::Module keeps parameters_ protected and buffers_ private. An explicit template instantiation may
// name private members (its arguments are exempt from access checking): these accessors hand out pointers
// to the two maps.
using TensorDict = torch::OrderedDict<std::string, at::Tensor>;
TensorDict torch::nn::Module::*parameters_member();
TensorDict torch::nn::Module::*buffers_member();
template <TensorDict torch::nn::Module::*Member>
struct ParametersAccess {
  friend TensorDict torch::nn::Module::*parameters_member() { return Member; }
};
template <TensorDict torch::nn::Module::*Member>
struct BuffersAccess {
  friend TensorDict torch::nn::Module::*buffers_member() { return Member; }
};
template struct ParametersAccess<&torch::nn::Module::parameters_>;
template struct BuffersAccess<&torch::nn::Module::buffers_>;

// The standard layers' public handles to what they registered, read by their forward: the member holding `name`, or
// null (not one of these layers, or not one of its names). *known: whether the module is one of these layers.
at::Tensor* member_handle(torch::nn::Module& module, const std::string& name, bool* known) {
  *known = true;
  auto pick = [&](std::initializer_list<std::pair<at::Tensor*, const char*>> members) -> at::Tensor* {
    for (const auto& [member, member_name] : members) {
      if (name == member_name) return member;
    }
    return nullptr;
  };
  if (auto* m = dynamic_cast<torch::nn::LinearImpl*>(&module)) return pick({{&m->weight, "weight"}, {&m->bias, "bias"}});
  if (auto* m = dynamic_cast<torch::nn::EmbeddingImpl*>(&module)) return pick({{&m->weight, "weight"}});
  if (auto* m = dynamic_cast<torch::nn::LayerNormImpl*>(&module)) return pick({{&m->weight, "weight"}, {&m->bias, "bias"}});
  if (auto* m = dynamic_cast<torch::nn::MultiheadAttentionImpl*>(&module)) {
    return pick({{&m->in_proj_weight, "in_proj_weight"}, {&m->in_proj_bias, "in_proj_bias"}, {&m->bias_k, "bias_k"},
                 {&m->bias_v, "bias_v"}, {&m->q_proj_weight, "q_proj_weight"}, {&m->k_proj_weight, "k_proj_weight"},
                 {&m->v_proj_weight, "v_proj_weight"}});
  }
  if (auto* m = dynamic_cast<RMSNormImpl*>(&module)) return pick({{&m->weight, "weight"}});
  if (auto* m = dynamic_cast<ParameterMembers*>(&module)) return m->parameter_member(name);  // a layer of the user's
  *known = false;
  return nullptr;
}

// Returns whether the module is one of these layers (and, for a layer of the user's, names `name`).
bool sync_member_handles(torch::nn::Module& module, const std::string& name, const at::Tensor& value) {
  bool known = false;
  at::Tensor* member = member_handle(module, name, &known);
  if (member != nullptr) *member = value;
  return known && (member != nullptr || dynamic_cast<ParameterMembers*>(&module) == nullptr);
}

void replace_entry(TensorDict& dict, const char* kind, torch::nn::Module& module, const std::string& name,
                   at::Tensor value) {
  DTENSOR_CHECK(dict.contains(name), "dtensor: module ", module.name(), " has no ", kind, " '", name, "'");
  dict[name] = std::move(value);
}

}  // namespace

void replace_parameter(torch::nn::Module& module, const std::string& name, at::Tensor value) {
  replace_entry(module.*parameters_member(), "parameter", module, name, value);
  sync_member_handles(module, name, value);
}

void set_forward_parameter(torch::nn::Module& module, const std::string& name, at::Tensor value) {
  DTENSOR_CHECK((module.*parameters_member()).contains(name) && sync_member_handles(module, name, value),
                "dtensor: module ", module.name(), " has no parameter '", name,
                "' held in a layer's member (Linear, Embedding, LayerNorm, RMSNorm, ParameterMembers): fully_shard cannot "
                "point its forward at the gathered parameter");
}

at::Tensor forward_parameter(torch::nn::Module& module, const std::string& name) {
  bool known = false;
  if (at::Tensor* member = member_handle(module, name, &known)) return *member;
  const TensorDict& params = module.*parameters_member();
  DTENSOR_CHECK(params.contains(name), "dtensor: module '", module.name(), "' has no parameter '", name, "'");
  return params[name];
}

void replace_buffer(torch::nn::Module& module, const std::string& name, at::Tensor value) {
  replace_entry(module.*buffers_member(), "buffer", module, name, std::move(value));
}

std::vector<at::Tensor> unique_parameters(torch::nn::Module& module) {
  std::vector<at::Tensor> out;
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    if (std::none_of(out.begin(), out.end(), [&](const at::Tensor& q) { return q.is_same(p); })) out.push_back(p);
  }
  return out;
}

}  // namespace dtensor::nn
