// State dicts from a module and from an AdamW optimizer, named as PyTorch names them, so that a checkpoint
// is interchangeable with torch.distributed.checkpoint's state_dict() helpers:
//
//   module:  "<fqn>"                        parameters and buffers (get_model_state_dict)
//   AdamW:   "state.<fqn>.exp_avg"          DTensor with the parameter's placements
//            "state.<fqn>.exp_avg_sq"
//            "state.<fqn>.step"             0-d float32, as torch.optim.AdamW keeps it
//   (get_optimizer_state_dict with flatten_optimizer_state_dict=True)
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include "dtensor/checkpoint/checkpoint.h"

namespace dtensor::checkpoint {

// The module's parameters and buffers under their full names (the tensors themselves: load writes into
// them). A tensor reachable under two names (tied embeddings) appears once, under the first.
StateDict module_state_dict(const torch::nn::Module& module);

// AdamW's per-parameter state under each parameter's name in `module` (parameters the optimizer does not
// hold are skipped). Missing state (before the first step) is created as step() would: zeros, step 0.
// exp_avg / exp_avg_sq are the optimizer's own tensors; the steps are 0-d copies: after load(), call
// set_adamw_steps to put them back.
StateDict adamw_state_dict(torch::optim::AdamW& optimizer, const torch::nn::Module& module);
void set_adamw_steps(torch::optim::AdamW& optimizer, const torch::nn::Module& module, const StateDict& state);

}  // namespace dtensor::checkpoint
