#include "dtensor/nn/parameter_replacement.h"
#include "dtensor/nn/parameter_members.h"
#include "dtensor/core/error.h"

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

// The standard layers' public handles to what they registered, read by their forward.
// Returns whether the module is one of these layers.
bool sync_member_handles(torch::nn::Module& module, const std::string& name, const at::Tensor& value) {
  auto set = [&](at::Tensor& member, const char* member_name) {
    if (name == member_name) member = value;
  };
  if (auto* m = dynamic_cast<torch::nn::LinearImpl*>(&module)) {
    set(m->weight, "weight");
    set(m->bias, "bias");
  } else if (auto* m = dynamic_cast<torch::nn::EmbeddingImpl*>(&module)) {
    set(m->weight, "weight");
  } else if (auto* m = dynamic_cast<torch::nn::LayerNormImpl*>(&module)) {
    set(m->weight, "weight");
    set(m->bias, "bias");
  } else if (auto* m = dynamic_cast<torch::nn::MultiheadAttentionImpl*>(&module)) {
    set(m->in_proj_weight, "in_proj_weight");
    set(m->in_proj_bias, "in_proj_bias");
    set(m->bias_k, "bias_k");
    set(m->bias_v, "bias_v");
    set(m->q_proj_weight, "q_proj_weight");
    set(m->k_proj_weight, "k_proj_weight");
    set(m->v_proj_weight, "v_proj_weight");
  } else if (auto* m = dynamic_cast<RMSNormImpl*>(&module)) {
    set(m->weight, "weight");
  } else if (auto* m = dynamic_cast<ParameterMembers*>(&module)) {  // a layer of the user's (parameter_members.h)
    at::Tensor* member = m->parameter_member(name);
    if (member == nullptr) return false;
    *member = value;
  } else {
    return false;
  }
  return true;
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

void replace_buffer(torch::nn::Module& module, const std::string& name, at::Tensor value) {
  replace_entry(module.*buffers_member(), "buffer", module, name, std::move(value));
}

}  // namespace dtensor::nn
