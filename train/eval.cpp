#include "train/eval.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <optional>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"
#include "dtensor/tp/loss_parallel.h"

namespace train {

EvalResult evaluate(llama::LlamaForCausalLM& model, const std::vector<Batch>& batches, const models::ParallelDims& dims,
                    const StepContext& c) {
  DTENSOR_CHECK(!batches.empty(), "dtensor: evaluate: no batch");
  at::NoGradGuard no_grad;
  std::optional<dtensor::LossParallelGuard> guard;
  if (c.loss_parallel) guard.emplace();
  std::optional<dtensor::cp::ContextParallel> context_parallel;
  if (c.cp_mesh) context_parallel.emplace(*c.cp_mesh, c.cp_options);
  EvalResult r;
  double sum = 0;
  for (const Batch& global : batches) {
    const Batch b = local_batch(global, dims);
    const at::Tensor positions = b.positions.defined() ? b.positions.to(c.device) : at::Tensor();
    const at::Tensor loss = next_token_loss(model(b.inputs.to(c.device), at::Tensor(), positions), b.labels.to(c.device));
    sum += loss_value(loss);
    r.tokens += global.labels.numel();
    ++r.batches;
  }
  r.loss = sum / static_cast<double>(r.batches);
  if (c.reduce_loss) r.loss = c.reduce_loss(r.loss);  // the data ranks' rows: equal token counts, so their mean
  return r;
}

}  // namespace train
