#include "train/loop.h"

#include "llama/build.h"
#include "llama/hf_weights.h"

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <algorithm>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"
#include "dtensor/cp/context_parallel.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/nn/parameter_replacement.h"
#include "train/checkpointing.h"
#include "train/eval.h"
#include "train/pipeline.h"

namespace train {
namespace {

int64_t local_bytes(const at::Tensor& t) {
  if (!t.defined()) return 0;
  const at::Tensor local = dtensor::is_dtensor(t) ? dtensor::to_local(t) : t;
  return local.numel() * static_cast<int64_t>(local.element_size());
}

}  // namespace

int64_t local_param_bytes(llama::LlamaForCausalLM& model) {
  int64_t bytes = 0;
  for (const auto& p : model->parameters(/*recurse=*/true)) bytes += local_bytes(p);
  return bytes;
}

llama::LlamaForCausalLM make_model(const TrainOptions& o) {
  llama::LlamaForCausalLM model(o.model);
  model->to(param_dtype(o));  // before the values: the init's fp32 draws, the file's weights, cast once
  if (o.hf_dir.empty()) {
    model->init_weights(o.seed);
  } else {
    llama::load_hf_llama(o.hf_dir, model);  // every rank the whole checkpoint; the plan then shards it
  }
  return model;
}

llama::LlamaForCausalLM build_model(const TrainOptions& o, const models::ParallelDims& dims) {
  // Under LoRA the frozen base is mapped from the files in place where it can be (never written but by --merge-lora).
  const auto source = o.hf_dir.empty() ? llama::WeightSource::random(o.seed) : llama::WeightSource::hf(o.hf_dir, /*map_in_place=*/o.lora());
  std::optional<llama::LoraOptions> lora;
  if (o.lora()) lora = llama::LoraOptions{.config = *lora_config(o), .adapter_dir = o.lora_adapter, .seed = o.seed};
  std::optional<llama::StageLayers> stage;
  if (dims.pp_enabled()) stage = pipeline_stage_layers(o, dims.pp_rank());  // this rank's layers alone
  return llama::build_model(o.model, dims, source, {.parallelize = parallelize_config(o), .dtype = param_dtype(o),
                                                    .lora = lora, .pipeline_stage = stage, .before_allocation = {}});
}

models::ParallelDims parallelize(llama::LlamaForCausalLM& model, const TrainOptions& o, const dtensor::DeviceMesh& mesh) {
  const models::ParallelDims dims = models::ParallelDims::from_mesh(mesh, o.data_parallel);
  llama::parallelize_llama(model, dims, parallelize_config(o));
  return dims;
}

TrainResult run(llama::LlamaForCausalLM& model, const TrainOptions& o, const Corpus& corpus,
                const models::ParallelDims& dims, const TrainHooks& hooks, const Corpus* eval_corpus) {
  const int64_t dp = dims.dp;
  DTENSOR_CHECK(o.batch % dp == 0, "dtensor: llama_train: batch ", o.batch, " is not divisible by dp ", dp);
  TrainResult result;
  result.param_bytes_per_rank = local_param_bytes(model);

  // Each trainable parameter once: with tied embeddings lm_head.weight is model.embed_tokens.weight; under LoRA the
  // adapters alone (the base is frozen).
  std::vector<at::Tensor> params;
  for (const auto& p : dtensor::nn::unique_parameters(*model)) {
    if (p.requires_grad()) params.push_back(p);
  }
  for (const auto& p : params) result.num_params += p.numel();
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(o.lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
  StepContext context{.optimizer = optimizer,
                      .params = params,
                      .loss_parallel = llama::loss_parallel_enabled(dims, parallelize_config(o)),
                      .device = dims.tp_mesh().device(),
                      .max_norm = o.max_norm};
  if (dims.cp_enabled()) {
    context.cp_mesh = dims.cp_mesh();
    context.cp_options.rotate_method = dtensor::cp::rotate_method_from_string(o.cp_rotate_method);
  }
  // Each data rank's loss is its tokens' mean: the global batch's mean is their average (equal token counts).
  if (dims.dp_enabled()) {
    const dtensor::DeviceMesh data_mesh = dims.data_mesh();
    context.reduce_loss = [data_mesh](double loss) {
      return dtensor::all_reduce(at::full({1}, loss, at::kDouble), dtensor::ReduceOp::AVG, data_mesh, 0).item<double>();
    };
    context.sum_over_data_ranks = sum_over_data_ranks(dims);
  }
  std::optional<Pipeline> pipeline;
  if (dims.pp_enabled()) {
    pipeline.emplace(model, o, dims, next_token_loss);
    context.pipeline = &*pipeline;
  }
  const std::vector<Batch> eval = eval_corpus ? eval_batches(*eval_corpus, o.batch, o.seq_len, o.eval_batches)
                                              : std::vector<Batch>{};
  const int64_t accumulation = gradient_accumulation_steps(o);
  const int64_t start = o.resume ? resume_from_checkpoint(o, model, optimizer) : 0;
  result.start_step = start;
  const int64_t end = o.stop_after > 0 ? std::min(o.steps, o.stop_after) : o.steps;
  for (int64_t step = start; step < end; ++step) {
    StepRecord rec;
    rec.step = step;
    rec.lr = lr_at(o, step);
    // The step's global batch (the same on every rank), cut into micro-batches of o.batch rows in order, of each of
    // which this rank takes its data rank's rows and cp chunks.
    const Batch global = sample_batch(corpus, o.batch * accumulation, o.seq_len, o.seed, step);
    std::vector<Batch> micro;
    for (int64_t m = 0; m < accumulation; ++m) {
      micro.push_back(local_batch({global.inputs.narrow(0, m * o.batch, o.batch), global.labels.narrow(0, m * o.batch, o.batch),
                                   at::Tensor()},
                                  dims));
    }
    rec.microbatches = accumulation;
    std::function<void()> after_backward;
    if (hooks.after_backward) after_backward = [&] { hooks.after_backward(step, model); };
    train_step(model, micro, context, rec, after_backward);
    if (!eval.empty() && ((o.eval_every > 0 && (step + 1) % o.eval_every == 0) || step + 1 == end)) {
      const EvalResult e = evaluate(model, eval, dims, context);
      rec.eval_loss = e.loss;
      rec.eval_tokens = e.tokens;
    }
    result.steps.push_back(rec);
    if (hooks.after_step) hooks.after_step(rec);
    const bool stop = hooks.stop_requested && step + 1 < end && hooks.stop_requested(step);
    const bool periodic = o.checkpoint_every > 0 && ((step + 1) % o.checkpoint_every == 0 || step + 1 == end);
    if ((periodic || stop) && !o.checkpoint_dir.empty()) {
      save_checkpoint(o, model, optimizer, step + 1);
      result.saved_step = step + 1;
    }
    if (stop) {
      result.stopped_early = true;
      break;
    }
  }
  for (const auto& p : params) result.grad_bytes_per_rank += local_bytes(p.grad());
  for (const auto& [_, state] : optimizer.state()) {
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*state);
    result.optimizer_bytes_per_rank += local_bytes(s.exp_avg()) + local_bytes(s.exp_avg_sq());
  }
  return result;
}

}  // namespace train
