// LoRA's flags (PEFT's LoraConfig), declared once over train::TrainOptions for the tools that take a job: llama_train
// trains the adapters, llama_plan's dry run counts them (their bytes, their gradients' collectives, AdamW's state for
// them alone). Same names, defaults and checks in both.
#pragma once

#include <CLI/CLI.hpp>

#include "tools/common/cli.h"
#include "train/options.h"

namespace tools_cli {

inline void add_lora_flags(CLI::App& app, train::TrainOptions& o) {
  app.add_option("--lora-rank", o.lora_rank,
                 "LoRA (PEFT's r): freeze the model's weights (--hf-dir's mapped in place, in their dtype) and train "
                 "rank-R adapters in fp32 on --lora-targets; --save-hf then writes PEFT's adapter files")
      ->check(positive());
  app.add_option("--lora-alpha", o.lora_alpha, "LoRA's alpha: the adapters' branch is scaled by alpha / r")
      ->check(positive())->default_str("8");
  app.add_option("--lora-targets", o.lora_targets,
                 "LoRA's target modules, comma-separated (PEFT's names: q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,"
                 "down_proj; or all-linear)")
      ->delimiter(',')->default_str("q_proj,v_proj");
  app.add_option("--lora-dropout", o.lora_dropout, "dropout on the adapters' input (TP 1 only)")->default_str("0");
  app.add_flag("--use-rslora", o.use_rslora, "rank-stabilized LoRA: the branch scaled by alpha / sqrt(r)");
  app.add_option("--lora-adapter", o.lora_adapter,
                 "start from this PEFT adapter directory (adapter_config.json gives r, alpha and targets; "
                 "adapter_model.safetensors the values)")
      ->check(CLI::ExistingDirectory);
}

}  // namespace tools_cli
