// Evaluation (torchtitan's validation): the model's mean next-token loss over a held-out split (data.h's
// eval_batches), without gradients, under the same parallelism as training: each dp rank takes its rows of each batch
// (its cp rank its chunks), the loss is computed as training's (loss parallel on vocab-sharded logits, ring attention
// under cp) and averaged over the data ranks. Every batch holds as many tokens, so the mean of the batches' means is
// the mean over all the split's tokens, the same at every TP / DP / CP layout. A mixture of experts' load-balancing
// term is left out: the loss is the cross-entropy alone (transformers' eval loss of a dense model; perplexity = e^loss).
#pragma once

#include <cstdint>
#include <vector>

#include "common/parallel_dims.h"
#include "llama/model.h"
#include "train/data.h"
#include "train/step.h"

namespace train {

struct EvalResult {
  double loss = 0;      // mean over every token of the batches
  int64_t batches = 0;  // global batches
  int64_t tokens = 0;   // predicted tokens, over all ranks
};

// `batches`: global batches (the same on every rank). `context`: the step's (loss parallel, device, cp mesh, the
// loss's reduction over the data ranks); its optimizer is not touched.
EvalResult evaluate(llama::LlamaForCausalLM& model, const std::vector<Batch>& batches, const models::ParallelDims& dims,
                    const StepContext& context);

}  // namespace train
