#include "train/checkpointing.h"
#include "train/export.h"

#include "common/dtype.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <unistd.h>

#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/checkpoint/state_dict.h"
#include "dtensor/checkpoint/step_checkpoints.h"
#include "dtensor/core/error.h"
#include "dtensor/peft/lora.h"
#include "llama/hf_config.h"

namespace fs = std::filesystem;
namespace ckpt = dtensor::checkpoint;

namespace train {
namespace {

// Model, optimizer and data position under one set of names; `step` and `seed` are the 0-d entries load fills.
// Under LoRA the model entries are the adapters alone: the frozen base comes from --hf-dir again.
ckpt::StateDict training_state(llama::LlamaForCausalLM& model, torch::optim::AdamW& optimizer, const at::Tensor& step,
                               const at::Tensor& seed, bool lora) {
  ckpt::StateDict state;
  for (auto& [name, t] : ckpt::module_state_dict(*model)) {
    if (!lora || dtensor::peft::is_lora_parameter(name)) state[name] = t;
  }
  for (auto& [name, t] : ckpt::adamw_state_dict(optimizer, *model)) state[name] = t;
  state["train.step"] = step;
  state["train.seed"] = seed;
  return state;
}

}  // namespace

void save_checkpoint(const TrainOptions& o, llama::LlamaForCausalLM& model, torch::optim::AdamW& optimizer,
                     int64_t steps_done) {
  const at::Tensor step = at::scalar_tensor(steps_done, at::kLong);
  const at::Tensor seed = at::scalar_tensor(static_cast<int64_t>(o.seed), at::kLong);
  // Pipeline stages hold their own layers (and their AdamW state): the checkpoint is the union, under the whole
  // model's names, so that it loads at any pp degree.
  ckpt::save(ckpt::step_checkpoint_path(o.checkpoint_dir, steps_done), training_state(model, optimizer, step, seed, o.lora()),
             {.entries_may_differ = o.pp > 1});
  // The model's sizes beside the checkpoints, in HF's config.json (llama_generate reads it; --dtype auto reads the
  // dtype back). Every rank (process or thread) writes the same bytes, each through its own temporary file.
  write_atomically(o.checkpoint_dir, "config.json", llama::config_to_hf_json(o.model, models::dtype_name(param_dtype(o))));
  save_tokenizer(o, o.checkpoint_dir);  // serve --checkpoint DIR --tokenizer DIR reads the model's text
}

int64_t resume_from_checkpoint(const TrainOptions& o, llama::LlamaForCausalLM& model, torch::optim::AdamW& optimizer) {
  const auto latest = ckpt::latest_step_checkpoint(o.checkpoint_dir);
  if (!latest) return 0;
  at::Tensor step = at::scalar_tensor(int64_t{-1}, at::kLong);
  at::Tensor seed = at::scalar_tensor(int64_t{-1}, at::kLong);
  // The data position first (two scalars), so that a checkpoint of another run fails before the model changes.
  ckpt::StateDict position = {{"train.step", step}, {"train.seed", seed}};
  ckpt::load(latest->path, position, {.allow_unused = true});
  DTENSOR_CHECK(seed.item<int64_t>() == static_cast<int64_t>(o.seed), "dtensor: llama_train: ", latest->path,
                " was written with --seed ", seed.item<int64_t>(), ", this run has --seed ", o.seed,
                " (the data position would not match)");
  ckpt::StateDict state = training_state(model, optimizer, step, seed, o.lora());
  // Across precisions: fp32 masters (--mixed-precision) resume as bf16 parameters (--dtype bfloat16
  // --mixed-precision off) and back, the values converted.
  // A pipeline stage reads its own entries; the other stages' stay unread.
  ckpt::load(latest->path, state, {.allow_unused = o.pp > 1, .allow_dtype_cast = true});
  ckpt::set_adamw_steps(optimizer, *model, state);
  return step.item<int64_t>();
}

}  // namespace train
