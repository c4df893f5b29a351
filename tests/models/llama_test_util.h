// Shared by the Llama tests: a small config, a corpus the repo ships, and TP runs with ranks as threads.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "train/data.h"
#include "train/options.h"
#include "train/loop.h"

namespace llama_test {

// vocab 256, hidden 64, 2 layers, 4 query heads, 2 key/value heads (GQA; replicated at TP 4), ffn 128,
// seq 16, batch 4, 20 steps, clipping at 1.
train::TrainOptions small_options();

// The repo's README.md as byte tokens: real text every checkout has.
const train::Corpus& test_corpus();

struct RunResult {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> step1_grads;  // full (unsharded) gradient of every parameter after step 1
  std::vector<train::StepRecord> steps;     // rank 0's
  int64_t param_bytes_per_rank = 0;               // rank 0's
  int64_t grad_bytes_per_rank = 0, optimizer_bytes_per_rank = 0;  // rank 0's, after the last step
};


// How a run builds its model: train::build_model (meta-first, llama_train's path), or the reference path
// train::make_model (the whole model on every rank) + train::parallelize.
enum class Build { meta_first, whole_then_shard };

// Trains `options` at TP `tp` (ranks as threads; tp 1 is the plain model). A rank's error throws, naming it.
RunResult run_tp(const train::TrainOptions& options, int tp, bool capture_grads = false, Build build = Build::meta_first);

// Trains `options` on a ("dp", "tp") mesh of dp * tp ranks (threads) with options.data_parallel over dp.
RunResult run_dp_tp(train::TrainOptions options, int dp, int tp, bool capture_grads = false,
                    Build build = Build::meta_first);

// Trains `options` with context parallelism: dp * cp * tp ranks (threads) on ParallelDims{dp, cp, tp}'s meshes.
RunResult run_dp_cp_tp(train::TrainOptions options, int dp, int cp, int tp, bool capture_grads = false);

// Trains `options` with pipeline parallelism: pp * dp * tp ranks (threads; options.pp_* choose the schedule), each
// stage on its ("dp", "tp") part of the mesh. step1_grads hold every stage's parameters.
RunResult run_pp(train::TrainOptions options, int pp, int dp, int tp, bool capture_grads = false);

// Loads the HF checkpoint `dir` with llama::from_pretrained at TP `tp` (ranks as threads) under `plan` and
// returns rank 0's full logits for tokens (and attention mask, when given).
at::Tensor pretrained_logits(const std::string& dir, int tp, const std::string& plan, const at::Tensor& tokens,
                             const at::Tensor& attention_mask = {},
                             const std::string& dtype = "float32");
// The largest |a - b| / |a| over the curve; a different length is infinity.
double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace llama_test
