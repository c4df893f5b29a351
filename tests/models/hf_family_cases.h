// The HF family checkpoints of tests/oracle/hf_family_oracle.py (made with transformers' own config classes
// and save_pretrained, once per test process, all cases in one Python run) and their references: HF's logits
// on a left-padded batch and HF's greedy tokens. Shared by the family tests and the MoE-parallel tests.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "harness/subprocess.h"

namespace hf_cases {

// Runs hf_family_oracle.py with `args` (offline, one thread).
dtensor::testing::ProcessResult oracle(const std::vector<std::string>& args);
// The oracle's case names (hf_family_oracle.py list): its CASES are the one list, so a new family's case is an entry
// there and its tests follow. Throws when the oracle cannot be run.
std::vector<std::string> case_names();
// The directory holding every case (made on first use).
const std::string& root();

struct Reference {
  at::Tensor tokens, mask, logits, prompt, greedy_one, batch, batch_mask, greedy_batch;
  // HF in bfloat16: logits (as fp32), greedy tokens, and each greedy step's top-1 minus top-2 logit [rows, steps].
  at::Tensor logits_bf16, greedy_one_bf16, gaps_one_bf16, greedy_batch_bf16, gaps_batch_bf16;
};
Reference reference(const std::string& name);

// max |got - want| / max |want| over the real positions (HF's rows on left padding are not meaningful).
double masked_rel(const at::Tensor& got, const at::Tensor& want, const at::Tensor& mask);
// The unpadded prompts of a left-padded batch.
std::vector<std::vector<int64_t>> prompts_of(const at::Tensor& ids, const at::Tensor& mask);
// Greedy generation from checkpoint `dir` on `world` ranks (threads) under from_pretrained's `plan`
// ("inference": TP; "ep": expert parallelism), in `dtype`; rank 0's new tokens, a row per prompt.
at::Tensor greedy_at(const std::string& dir, int world, const std::vector<std::vector<int64_t>>& prompts,
                     int64_t new_tokens, const std::string& plan = "inference", const std::string& dtype = "float32");

}  // namespace hf_cases
