#include "inference/serving/engine.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "dtensor/core/error.h"
#include "inference/paged_attention.h"

#include <stdexcept>
#include <string>

namespace serve {
namespace {
enum Kind : int64_t { kIdle = 0, kStep = 1, kStop = 2 };
}

Engine::Engine(llama::LlamaForCausalLM model, std::shared_ptr<dtensor::ProcessGroup> group, int64_t num_blocks,
               int64_t block_size, c10::Device device)
    : model_(std::move(model)), group_(std::move(group)), device_(device) {
  // The layers' pools, made here; each step's forward reads them through its context (common/forward_context.h).
  // The layer views hold the pool: the engine keeps only them.
  layers_ = std::make_shared<inference::PagedKVCache>(model_->config.num_hidden_layers, num_blocks, block_size)->layers();
}

void Engine::send_header(int64_t kind, int64_t t, int64_t k, int64_t n_out) {
  if (!group_ || group_->size() == 1) return;
  at::Tensor header = at::tensor({kind, t, k, n_out}, at::kLong);
  group_->broadcast_(header, 0);
}

at::Tensor Engine::forward(const inference::PagedStep& s) {
  ++steps_;
  if (faults_.forward_fault(steps_, group_ ? group_->rank() : 0)) {
    throw std::runtime_error("DTENSOR_SERVE_FAULT: injected failure in the forward of step " + std::to_string(steps_) +
                             " on rank " + std::to_string(group_ ? group_->rank() : 0));
  }
  at::NoGradGuard no_grad;
  auto on = [&](const at::Tensor& x) { return x.to(device_); };
  inference::PagedStep d = s;  // its sequences' offsets and attention route, the tensors on the model's device
  for (at::Tensor* t : {&d.tokens, &d.positions, &d.query_seq, &d.write_slots, &d.key_slots, &d.key_pos, &d.key_seq,
                        &d.logit_rows}) {
    *t = on(*t);
  }
  // The step goes to the model by one route, its forward's context: the mask and positions, and the caches' slots.
  const models::ForwardContext context{layers_, &d};
  const models::ForwardContextGuard in_context(context);
  at::Tensor hidden = model_->model(d.tokens.view({1, -1}));  // [1, T, hidden]
  // lm_head on the rows whose logits are wanted: under TP its gather moves [1, n_out, vocab] only.
  at::Tensor logits = model_->logits(hidden.index_select(1, d.logit_rows));
  return logits[0].to(at::kCPU, at::kFloat);
}

at::Tensor Engine::step(const inference::PagedStep& s) {
  const int64_t t = s.tokens.numel(), k = s.key_slots.numel(), n = s.logit_rows.numel();
  send_header(kStep, t, k, n);
  if (group_ && group_->size() > 1) {
    at::Tensor payload = at::cat({s.tokens, s.positions, s.query_seq, s.write_slots, s.key_slots, s.key_pos, s.key_seq,
                                  s.logit_rows});
    group_->broadcast_(payload, 0);
  }
  return forward(s);
}

void Engine::idle() { send_header(kIdle, 0, 0, 0); }

void Engine::stop() { send_header(kStop, 0, 0, 0); }

void Engine::follow() {
  while (true) {
    at::Tensor header = at::zeros({4}, at::kLong);
    group_->broadcast_(header, 0);
    const int64_t kind = header[0].item<int64_t>();
    if (kind == kStop) return;
    if (kind == kIdle) continue;
    DTENSOR_CHECK(kind == kStep, "serve: unknown step kind ", kind, " from rank 0");
    const int64_t t = header[1].item<int64_t>(), k = header[2].item<int64_t>(), n = header[3].item<int64_t>();
    at::Tensor payload = at::empty({4 * t + 3 * k + n}, at::kLong);
    group_->broadcast_(payload, 0);
    auto parts = payload.split_with_sizes({t, t, t, t, k, k, k, n});
    inference::PagedStep step{parts[0], parts[1], parts[2], parts[3], parts[4], parts[5], parts[6], parts[7], {}, {}, false};
    inference::index_sequences(step);  // as rank 0's pack_step did
    forward(step);
  }
}

}  // namespace serve
