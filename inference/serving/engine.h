// The model side of the server, the same on every TP rank: rank 0 broadcasts each step's schedule (a packed
// inference::PagedStep) over the world group, and every rank runs the same forward on it, so the collectives of the
// TP plan line up. Followers (ranks > 0) loop on follow() until rank 0 says stop; rank 0 calls step() per
// forward, idle() while it has nothing to run (a heartbeat, so followers' waits never time out), and stop().
//
// On the wire, one int64 header [kind, T, K, n_out], then (for a step) one int64 tensor with the step's tensors
// back to back: tokens, positions, query_seq, write_slots (T each), key_slots, key_pos, key_seq (K each),
// logit_rows (n_out).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>

#include "dtensor/mesh/process_group.h"
#include "inference/paged_kv_cache.h"
#include "inference/serving/fault_injection.h"
#include "llama/model.h"

namespace serve {

class Engine {
 public:
  Engine(llama::LlamaForCausalLM model, std::shared_ptr<dtensor::ProcessGroup> group, int64_t num_blocks,
         int64_t block_size, c10::Device device);
  // Rank 0: the step's logits [n_out, vocab] (float, on the CPU), the same on every rank.
  at::Tensor step(const inference::PagedStep& step);
  void idle();
  void stop();
  // Ranks > 0: runs rank 0's steps until it says stop. Throws when a collective fails (a rank died) or the forward
  // throws.
  void follow();
  // The ranks running the model: at 1, a step that throws leaves nothing out of step.
  int world_size() const { return group_ ? group_->size() : 1; }
  // Steps run so far (the same count on every rank).
  int64_t steps() const { return steps_; }
  const FaultInjection& faults() const { return faults_; }

 private:
  at::Tensor forward(const inference::PagedStep& step);
  void send_header(int64_t kind, int64_t t, int64_t k, int64_t n_out);
  llama::LlamaForCausalLM model_;
  std::shared_ptr<dtensor::ProcessGroup> group_;
  c10::Device device_;
  // The paged pool's layer views (inference/paged_kv_cache.h: they share the pool), for each step's context.
  std::vector<std::shared_ptr<models::KVCacheLayer>> layers_;
  int64_t steps_ = 0;
  FaultInjection faults_ = FaultInjection::from_env();
};

}  // namespace serve
