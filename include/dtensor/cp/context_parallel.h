// Context parallelism (PyTorch's torch.distributed.tensor.experimental.context_parallel, as torchtitan uses it):
// the sequence is sharded over a "cp" mesh dim, and attention becomes ring attention, each rank's queries meeting
// every rank's keys and values in turn.
//
//   auto x = dtensor::cp::context_parallel_shard(tokens, /*seq_dim=*/1, cp_mesh);        // this rank's tokens
//   auto pos = dtensor::cp::context_parallel_positions(seq_len, cp_mesh);                // their positions (rotary)
//   dtensor::cp::ContextParallel cp(cp_mesh, {.rotate_method = dtensor::cp::RotateMethod::allgather});
//   at::Tensor loss = model(x, {}, pos) ...;                                              // attention: ring attention
//
// Layout (load balancing, PyTorch's _HeadTailLoadBalancer): the sequence is cut into 2 * cp chunks and rank r holds
// chunks r and 2 * cp - 1 - r, so that under a causal mask every rank computes the same number of query-key blocks.
// Without load balancing rank r holds chunk r of cp. A sequence length that the layout cannot cut is an error naming
// the divisor.
//
// Ring attention, per rank: out = merge over the visible (query chunk i, key chunk j) blocks of attention(q_i, k_j,
// v_j), where causal attention sees a block j < i whole, j == i causally and j > i not at all; a sliding window hides
// the blocks wholly beyond it and masks those it cuts (src/cp/block_attention.h). Each block gives its
// output o_j and log-sum-exp l_j; they merge as l = log(sum_j e^l_j), out = sum_j e^(l_j - l) o_j (in fp32). The
// backward of a block, given the merged out and l, is the block's own flash-attention backward: dq sums over blocks,
// dk and dv go back to the rank that owns the keys. The keys and values travel by
//   allgather  one all-gather of [k; v], overlapped with the rank's own blocks (backward: the same gather, then one
//              reduce-scatter of every block's [dk; dv] to its owner);
//   alltoall   a ring: cp - 1 rotations to the next rank (all_to_all_single with one peer), each overlapped with the
//              block it does not need, and the gradients' accumulators travelling with the blocks in the backward.
// The naive reference is the whole attention on one rank (the tests compare the two).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/nn/attention.h"

namespace dtensor::cp {

enum class RotateMethod { allgather, alltoall };
std::string to_string(RotateMethod m);
RotateMethod rotate_method_from_string(const std::string& name);  // "allgather" or "alltoall"; else dtensor::Error

// This rank's part of `buffer` along seq_dim (no communication). Throws dtensor::Error when the length is not a
// multiple of 2 * cp (load balancing) or cp.
at::Tensor context_parallel_shard(const at::Tensor& buffer, int64_t seq_dim, const DeviceMesh& cp_mesh,
                                  bool load_balance = true);
// The whole buffer from every rank's part (an all-gather along seq_dim, then the chunks in order).
at::Tensor context_parallel_unshard(const at::Tensor& local, int64_t seq_dim, const DeviceMesh& cp_mesh,
                                    bool load_balance = true);
// The positions of this rank's tokens in a sequence of seq_len: shard(arange(seq_len)) (Long, on cp_mesh's device).
at::Tensor context_parallel_positions(int64_t seq_len, const DeviceMesh& cp_mesh, bool load_balance = true);

struct RingAttentionOptions {
  RotateMethod rotate_method = RotateMethod::allgather;
  bool load_balance = true;  // the layout of the shards (above)
};

// Attention of this rank's queries over the whole sequence's keys and values. q [b, heads, s, d]; k, v
// [b, kv_heads, s, d] (this rank's shards, in the layout of `options`); kv_heads divides heads. Differentiable.
// kwargs: a sliding window over the global positions (causal only) and logit soft-capping, as the model's kernel.
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool is_causal,
                          std::optional<double> scale, const DeviceMesh& cp_mesh, const RingAttentionOptions& options = {},
                          const nn::AttentionKwargs& kwargs = {});

// While alive, model attention (dtensor::nn::scaled_dot_product_attention) on this thread is ring attention over
// cp_mesh (a 1-D mesh), sliding windows and soft-capping included. An attention mask (padding) is refused by name.
class ContextParallel {
 public:
  explicit ContextParallel(const DeviceMesh& cp_mesh, RingAttentionOptions options = {});

 private:
  nn::AttentionOverrideGuard guard_;
};

}  // namespace dtensor::cp
