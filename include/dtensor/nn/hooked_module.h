// DTENSOR_MODULE(Name): TORCH_MODULE(Name) for a module of your own that a plan may target directly (rule 2
// of module_hooks.h), without writing call_with_hooks in its forward.
//
//   struct AttentionImpl : torch::nn::Module {
//     at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);  // no hooks here
//   };
//   DTENSOR_MODULE(Attention);
//   ...
//   h = x + attention(attention_norm(x), cos, sin);   // pre-hooks, AttentionImpl::forward, hooks
//
// The holder's operator() passes its tensor arguments positionally to call_with_hooks (an undefined
// at::Tensor is an absent optional input, PyTorch's None) and runs Impl::forward on the tensors the
// pre-hooks return. So the model reads as torchtitan's model.py: the call site is the ordinary
// `module(inputs...)` and the module's source has no parallel code. Calling `module->forward(...)`
// directly skips the hooks (and is caught by link_enclosing_hooks when a styled submodule runs).
#pragma once

#include <torch/nn/pimpl.h>

#include <cstddef>
#include <utility>

#include "dtensor/nn/module_hooks.h"

namespace dtensor::nn {

// Runs impl.forward(inputs...) through call_with_hooks: every input is an at::Tensor, and forward gets
// the hooked tensors in the same positions.
template <typename Impl, typename... Inputs>
at::Tensor forward_with_hooks(Impl& impl, const Inputs&... inputs) {
  static_assert((std::is_convertible_v<const Inputs&, const at::Tensor&> && ...),
                "DTENSOR_MODULE: forward inputs must be tensors (an undefined at::Tensor for None)");
  return call_with_hooks(impl, Tensors{at::Tensor(inputs)...}, [&impl](const Tensors& in) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return impl.forward(in[I]...);
    }(std::index_sequence_for<Inputs...>{});
  });
}

}  // namespace dtensor::nn

// A torch::nn::ModuleHolder<Name##Impl> (as TORCH_MODULE) whose call runs forward with the module's hooks.
#define DTENSOR_MODULE(Name)                                                          \
  class Name : public torch::nn::ModuleHolder<Name##Impl> {                           \
   public:                                                                            \
    using torch::nn::ModuleHolder<Name##Impl>::ModuleHolder;                          \
    using torch::nn::ModuleHolder<Name##Impl>::get;                                   \
    template <typename... Inputs>                                                     \
    at::Tensor operator()(const Inputs&... inputs) {                                  \
      return ::dtensor::nn::forward_with_hooks(*this->get(), inputs...);              \
    }                                                                                 \
  }
