// Training checkpoints (llama_train's --checkpoint-dir): <checkpoint-dir>/step-00000100
// (dtensor/checkpoint/step_checkpoints.h) holds everything a run needs to continue after step 100
// (dtensor::checkpoint, resharding: resume at any TP degree):
//
//   model weights        "<fqn>"                      (the model's own placements)
//   AdamW state          "state.<fqn>.exp_avg" ...    (PyTorch's flattened optimizer names)
//   data position        "train.step"                 int64: the next step (batches are drawn from
//                        "train.seed"                 int64: (seed, step) alone, so these fix the data)
//
// Each save is atomic (a killed run leaves the previous checkpoint); resume takes the newest committed one.
#pragma once

#include <torch/optim/adamw.h>

#include <cstdint>

#include "llama/model.h"
#include "train/options.h"

namespace train {

// Saves the state after `steps_done` steps into step_checkpoint_path(options.checkpoint_dir, steps_done).
void save_checkpoint(const TrainOptions& options, llama::LlamaForCausalLM& model, torch::optim::AdamW& optimizer,
                     int64_t steps_done);
// Loads the newest checkpoint into the model and optimizer; returns the step to continue from (0 when there
// is none). Throws dtensor::Error when the checkpoint was written with another seed.
int64_t resume_from_checkpoint(const TrainOptions& options, llama::LlamaForCausalLM& model,
                               torch::optim::AdamW& optimizer);

}  // namespace train
