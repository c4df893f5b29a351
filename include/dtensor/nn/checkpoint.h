// Activation checkpointing (PyTorch's torch.utils.checkpoint with use_reentrant=False semantics for hooks, and
// torch.distributed's checkpoint_wrapper): a wrapped module's forward keeps none of its activations, only its inputs;
// its backward runs the forward again, with gradients on, and differentiates that.
//
//   checkpoint_wrapper(*layer);        // torchtitan's apply_ac, mode "full": every transformer block
//
// What runs where. Forward: the module's pre-hooks (fully_shard gathers, the styles lay out inputs), then its body
// under no_grad (the styles of its submodules run as usual: the same TP plan, the same collectives), then its
// hooks. The output gets one autograd node whose inputs are the body's tensor inputs and the parameters its forward
// read (fully_shard's gathered ones, mixed precision's casts: whatever the layers' members held). Backward of that
// node: the CPU random generator set to its state at the forward (dropout draws the same masks), every parameter the
// body read swapped for a leaf on the same storage, the body run again with gradients on (its submodules' hooks and
// collectives again, in the same order on every rank), and torch::autograd::grad of the output with respect to the
// inputs and those leaves. The gradients go back through the node's edges, so parameters accumulate them and their
// post-accumulate-grad hooks (gradient sync, FSDP's reduce-scatter, DDP's buckets) fire in the outer backward, as
// without checkpointing: losses and gradients are bit-equal to the unwrapped module's in fp32.
//
// Memory: per wrapped module, its inputs (saved) instead of every intermediate; during its backward, its own
// intermediates once. Costs one more forward of the module per backward.
//
// The module must be called through its hooks (DTENSOR_MODULE, forward_with_hooks, or call_with_hooks' tensor forms)
// and return one tensor. Not done: PyTorch's selective (op-level) checkpointing, which keeps chosen ops' outputs (a
// dispatch-level policy); the CUDA generator's state (a CUDA module with dropout would draw new masks: untested).
#pragma once

#include <torch/nn/module.h>

namespace dtensor::nn {

// Wraps `module` (once; a second call throws naming it).
void checkpoint_wrapper(torch::nn::Module& module);
bool is_checkpointed(const torch::nn::Module& module);

}  // namespace dtensor::nn
