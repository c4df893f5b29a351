#include "plan.h"

#include <ATen/ATen.h>

#include "dtensor/error.h"
#include "dtensor/parallel/loss_parallel.h"
#include "llama/model.h"
#include "trainer.h"

namespace llama_plan {

namespace {

// The llama_train options whose parallelize() the dry run plans with: the same code, so the same plan.
llama_train::TrainOptions train_options_of(const PlanOptions& o) {
  llama_train::TrainOptions t;
  t.model = o.model;
  t.dp = o.dp;
  t.data_parallel = o.data_parallel;
  t.sequence_parallel = o.sequence_parallel;
  t.loss_parallel = o.loss_parallel;
  t.async_tp = o.async_tp;
  return t;
}

}  // namespace

dtensor::DryRunReport dry_run_llama(const PlanOptions& o) {
  if (o.tp < 1 || o.dp < 1) throw dtensor::Error("llama_plan: --tp and --dp must be >= 1");
  if (o.batch % o.dp != 0) {
    throw dtensor::Error("llama_plan: batch " + std::to_string(o.batch) + " is not divisible by dp " +
                         std::to_string(o.dp));
  }
  o.model.validate();
  const bool two_d = o.dp > 1;
  const std::vector<int64_t> shape = two_d ? std::vector<int64_t>{o.dp, o.tp} : std::vector<int64_t>{o.tp};
  dtensor::DryRunOptions options;
  options.mesh_dim_names = two_d ? std::vector<std::string>{"dp", "tp"} : std::vector<std::string>{"tp"};
  options.ranks = o.ranks;
  if (!o.optimizer) options.optimizer = nullptr;
  const bool loss_parallel = o.loss_parallel && o.tp > 1;
  if (o.data_parallel != "ddp" && o.data_parallel != "fsdp") {
    throw dtensor::Error("llama_plan: data parallel kind '" + o.data_parallel + "' is not ddp or fsdp");
  }
  const llama_train::TrainOptions train_options = train_options_of(o);
  // Held over forward and backward, as llama_train holds it.
  if (loss_parallel) options.step_guard = [] { return std::make_shared<dtensor::LossParallelGuard>(); };
  return dtensor::dry_run<llama::LlamaForCausalLM>(
      [&] { return llama::LlamaForCausalLM(o.model); }, shape,
      [&](llama::LlamaForCausalLM& model, const dtensor::DeviceMesh& mesh) {
        llama_train::parallelize(model, train_options, mesh);
      },
      [&](llama::LlamaForCausalLM& model, const dtensor::DeviceMesh&) {
        // Token ids: where the forward reads DTensors (TP > 1), plain tensors beside them stay on the CPU
        // (b·s longs; ops/op_call.cpp says why); with TP 1 the forward is plain and all of it is meta. The
        // model's own plain tensors (rotary tables, masks) follow the tokens' device.
        const at::Tensor tokens =
            at::zeros({o.batch / o.dp, o.seq_len}, at::TensorOptions(at::kLong).device(o.tp > 1 ? at::kCPU : at::kMeta));
        return llama_train::next_token_loss(model(tokens), tokens);
      },
      options);
}

}  // namespace llama_plan
