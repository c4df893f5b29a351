// Internal extensions of module_hooks.h, for passes that rewrite how a parallelized module computes
// (enable_async_tp.h, checkpoint_wrapper) rather than what it receives and returns.
#pragma once

#include <functional>
#include <optional>

#include "dtensor/nn/module_hooks.h"

namespace dtensor::nn::detail {

// PyTorch's register_forward_pre_hook(..., prepend=True): runs before the pre-hooks already registered.
void register_forward_pre_hook_first(torch::nn::Module& module, ForwardPreHook hook);

// Runs after the pre-hooks, with the inputs they return: an output replaces the forward body's (the body
// does not run; the forward hooks still do), nullopt runs the body. The first override with an output wins.
using ForwardOverride =
    std::function<std::optional<c10::IValue>(torch::nn::Module& module, const Args& args, const KwArgs& kwargs)>;
void register_forward_override(torch::nn::Module& module, ForwardOverride override_body);
bool has_forward_override(const torch::nn::Module& module);

// Runs the forward body itself, after the pre-hooks and before the hooks (when no override gave an output): gets the
// body as a callable it may keep and call again later (activation checkpointing recomputes it in backward). The body
// of a module called through forward_with_hooks (DTENSOR_MODULE) or call_with_hooks' tensor forms holds the module
// alone; a body that captured its caller's locals by reference must not be wrapped. One wrapper per module.
using ForwardBody = std::function<c10::IValue(const Args& args, const KwArgs& kwargs)>;
using ForwardWrapper =
    std::function<c10::IValue(torch::nn::Module& module, const Args& args, const KwArgs& kwargs, const ForwardBody& body)>;
void register_forward_wrapper(torch::nn::Module& module, ForwardWrapper wrapper);
bool has_forward_wrapper(const torch::nn::Module& module);

}  // namespace dtensor::nn::detail
