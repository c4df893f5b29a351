// Swapping a registered parameter or buffer of a torch::nn::Module for another tensor (a DTensor, or this
// rank's local shard), which LibTorch 2.x does not offer. distribute_module's partition functions and the
// styles use it; model code does not.
//
// What it relies on in LibTorch 2.x (torch/csrc/api/include/torch/nn/module.h):
//   - Module::register_parameter / register_buffer refuse a name that is already registered, so the entry
//     is replaced in place: Module::parameters_ (protected) and Module::buffers_ (private), both
//     torch::OrderedDict<std::string, at::Tensor>, are reached through pointers to members formed in an
//     explicit template instantiation, whose arguments the standard exempts from access checking.
//   - The standard layers keep a public member handle to what they registered and read it in forward
//     (LinearImpl::weight/bias, EmbeddingImpl::weight, LayerNormImpl::weight/bias, MultiheadAttentionImpl's
//     in_proj_weight/in_proj_bias/bias_k/bias_v/q,k,v_proj_weight, and our RMSNormImpl's weight): the handle is replaced with the entry. A layer of the user's names its members through
//     dtensor::nn::ParameterMembers (parameter_members.h); a layer of another kind that caches a parameter in a member
//     keeps the old tensor there.
// If a LibTorch release renames these members, parameter_replacement.cpp stops compiling: the one place
// to adapt.
#pragma once

#include <torch/nn/module.h>

#include <string>
#include <vector>

namespace dtensor::nn {

// Replaces the parameter `name` registered directly on `module` (and the layer's member handle, above).
// Throws naming the module when it has no such parameter.
void replace_parameter(torch::nn::Module& module, const std::string& name, at::Tensor value);
// Only the layer's member handle (what its forward reads), leaving the registered parameter as it is:
// fully_shard points forward at the gathered parameter while the module keeps its shard registered (for
// the optimizer and checkpoints). Throws naming the module when it is not one of the layers above.
void set_forward_parameter(torch::nn::Module& module, const std::string& name, at::Tensor value);
// What the module's forward reads for parameter `name`: the layer's member handle (above), else the registered
// parameter. Throws naming the module when it has no such parameter.
at::Tensor forward_parameter(torch::nn::Module& module, const std::string& name);
// The same for a buffer.
void replace_buffer(torch::nn::Module& module, const std::string& name, at::Tensor value);

// The parameters of `module` and its submodules, each tensor once, in registration order: a tensor registered in two
// places (tied embeddings: lm_head.weight is embed_tokens.weight) is listed at its first.
std::vector<at::Tensor> unique_parameters(torch::nn::Module& module);

}  // namespace dtensor::nn
