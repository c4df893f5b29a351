// Context parallelism's ring attention against the whole attention on one rank: each rank holds its shards of q, k,
// v (load-balanced or contiguous), and its output and its shards' gradients must equal the slices of the
// single-device result (scaled_dot_product_attention with the heads repeated, and autograd through it), for both
// rotation methods, causal and full attention, grouped-query heads, at cp 1, 2 and 4; the shards' unshard is the
// whole; a length the layout cannot cut is refused naming the divisor; under ContextParallel the model's kernel
// (dtensor::nn::scaled_dot_product_attention) is ring attention. Sliding windows (of every size against the chunks:
// inside one, across several, past the sequence) and logit soft-capping equal the attention written out in PyTorch
// ops (scores, tanh, the window's mask, softmax) on one rank, forward and backward.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>

#include "dtensor/cp/context_parallel.h"
#include "dtensor/mesh/device_mesh.h"
#include "harness/multi_rank.h"

using namespace dtensor;
using dtensor::testing::for_each_world;
using dtensor::testing::seeded_randn;

namespace {

at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep) {
  return x.unsqueeze(2).expand({x.size(0), x.size(1), n_rep, x.size(2), x.size(3)}).reshape({x.size(0), -1, x.size(2), x.size(3)});
}

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<double>(); }

// The oracle of the kwargs: attention written out in PyTorch ops over the whole sequence, heads repeated.
at::Tensor written_out(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window, double softcap) {
  const int64_t s = q.size(2), n_rep = q.size(1) / k.size(1);
  at::Tensor scores = at::matmul(q, repeat_kv(k, n_rep).transpose(-1, -2)) / std::sqrt(static_cast<double>(q.size(3)));
  if (softcap > 0) scores = softcap * at::tanh(scores / softcap);
  const at::Tensor distance = at::arange(s).view({s, 1}) - at::arange(s).view({1, s});
  const at::Tensor hidden = (distance < 0) | (window > 0 ? distance >= window : at::zeros_like(distance).to(at::kBool));
  return at::matmul(at::softmax(scores.masked_fill(hidden, -INFINITY), -1), repeat_kv(v, n_rep));
}

}  // namespace

TEST(RingAttention, SlidingWindowsAndSoftCappingEqualTheWrittenOutAttention) {
  for_each_world({1, 2, 4}, [](int rank, int world) {
    const DeviceMesh mesh = init_device_mesh("cpu", {world}, {"cp"});
    const int64_t b = 1, h = 4, kvh = 2, s = 16, d = 8;
    // Chunks are 8, 4 or 2 long (balanced at cp 1, 2, 4): windows inside one, across several, and past the sequence.
    for (int64_t window : {1, 3, 5, 11, 40}) {
      for (double softcap : {0.0, 0.7}) {
        for (cp::RotateMethod method : {cp::RotateMethod::allgather, cp::RotateMethod::alltoall}) {
          for (bool balance : {true, false}) {
            const std::string label = "window " + std::to_string(window) + " softcap " + std::to_string(softcap) + " " +
                                      cp::to_string(method) + (balance ? " balanced" : "") + " cp " + std::to_string(world);
            const at::Tensor q = seeded_randn(1, {b, h, s, d}).set_requires_grad(true);
            const at::Tensor k = seeded_randn(2, {b, kvh, s, d}).set_requires_grad(true);
            const at::Tensor v = seeded_randn(3, {b, kvh, s, d}).set_requires_grad(true);
            const at::Tensor w = seeded_randn(4, {b, h, s, d});
            const at::Tensor ref = written_out(q, k, v, window, softcap);
            (ref * w).sum().backward();
            auto shard = [&](const at::Tensor& x) { return cp::context_parallel_shard(x.detach(), 2, mesh, balance); };
            const at::Tensor ql = shard(q).set_requires_grad(true), kl = shard(k).set_requires_grad(true),
                             vl = shard(v).set_requires_grad(true);
            const at::Tensor out = cp::ring_attention(ql, kl, vl, true, std::nullopt, mesh, {method, balance}, {window, softcap});
            (out * shard(w)).sum().backward();
            EXPECT_LT(max_diff(out, shard(ref)), 2e-6) << label << " rank " << rank;
            EXPECT_LT(max_diff(ql.grad(), shard(q.grad())), 2e-6) << label;
            EXPECT_LT(max_diff(kl.grad(), shard(k.grad())), 2e-6) << label;
            EXPECT_LT(max_diff(vl.grad(), shard(v.grad())), 2e-6) << label;
          }
        }
      }
    }
    // The model's kernel without an override computes the same (its naive and SDPA paths), and refuses a window
    // outside causal attention.
    const at::Tensor q = seeded_randn(1, {b, h, s, d}), k = seeded_randn(2, {b, kvh, s, d}), v = seeded_randn(3, {b, kvh, s, d});
    EXPECT_LT(max_diff(nn::scaled_dot_product_attention(q, k, v, {}, true, std::nullopt, {5, 0.0}), written_out(q, k, v, 5, 0)), 2e-6);
    EXPECT_LT(max_diff(nn::scaled_dot_product_attention(q, k, v, {}, true, std::nullopt, {5, 0.7}), written_out(q, k, v, 5, 0.7)), 2e-6);
    const std::string err = dtensor::testing::error_of([&] { nn::scaled_dot_product_attention(q, k, v, {}, false, std::nullopt, {5, 0.0}); });
    EXPECT_NE(err.find("a sliding window is taken with is_causal and no mask"), std::string::npos) << err;
  });
}

TEST(RingAttention, EqualsWholeAttentionForwardAndBackward) {
  for_each_world({1, 2, 4}, [](int rank, int world) {
    const DeviceMesh mesh = init_device_mesh("cpu", {world}, {"cp"});
    const int64_t b = 2, h = 4, kvh = 2, s = 16, d = 8;
    for (cp::RotateMethod method : {cp::RotateMethod::allgather, cp::RotateMethod::alltoall}) {
      for (bool causal : {true, false}) {
        for (bool balance : {true, false}) {
          const std::string label = cp::to_string(method) + (causal ? " causal" : " full") + (balance ? " balanced" : "") +
                                    " cp " + std::to_string(world);
          const at::Tensor q = seeded_randn(1, {b, h, s, d}).set_requires_grad(true);
          const at::Tensor k = seeded_randn(2, {b, kvh, s, d}).set_requires_grad(true);
          const at::Tensor v = seeded_randn(3, {b, kvh, s, d}).set_requires_grad(true);
          const at::Tensor w = seeded_randn(4, {b, h, s, d});
          const at::Tensor ref = at::scaled_dot_product_attention(q, repeat_kv(k, h / kvh), repeat_kv(v, h / kvh),
                                                                  std::nullopt, 0.0, causal);
          (ref * w).sum().backward();

          auto shard = [&](const at::Tensor& x) { return cp::context_parallel_shard(x.detach(), 2, mesh, balance); };
          const at::Tensor ql = shard(q).set_requires_grad(true), kl = shard(k).set_requires_grad(true),
                           vl = shard(v).set_requires_grad(true);
          const at::Tensor out = cp::ring_attention(ql, kl, vl, causal, std::nullopt, mesh, {method, balance});
          (out * shard(w)).sum().backward();
          EXPECT_LT(max_diff(out, shard(ref)), 2e-6) << label << " rank " << rank;
          EXPECT_LT(max_diff(ql.grad(), shard(q.grad())), 2e-6) << label;
          EXPECT_LT(max_diff(kl.grad(), shard(k.grad())), 2e-6) << label;
          EXPECT_LT(max_diff(vl.grad(), shard(v.grad())), 2e-6) << label;
          EXPECT_LT(max_diff(cp::context_parallel_unshard(out.detach(), 2, mesh, balance), ref), 2e-6) << label;
        }
      }
    }
  });
}

TEST(RingAttention, Bfloat16WithinItsRounding) {
  for_each_world({2}, [](int, int world) {
    const DeviceMesh mesh = init_device_mesh("cpu", {world}, {"cp"});
    const at::Tensor q = seeded_randn(1, {1, 4, 32, 16}).to(at::kBFloat16), k = seeded_randn(2, {1, 4, 32, 16}).to(at::kBFloat16),
                     v = seeded_randn(3, {1, 4, 32, 16}).to(at::kBFloat16);
    const at::Tensor ref = at::scaled_dot_product_attention(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat),
                                                            std::nullopt, 0.0, true);
    auto shard = [&](const at::Tensor& x) { return cp::context_parallel_shard(x, 2, mesh); };
    const at::Tensor out = cp::ring_attention(shard(q), shard(k), shard(v), true, std::nullopt, mesh,
                                              {cp::RotateMethod::alltoall, true});
    EXPECT_EQ(out.scalar_type(), at::kBFloat16);
    EXPECT_LT(max_diff(out, shard(ref)), 2e-2);
  });
}

TEST(RingAttention, ShardsPositionsAndRefusals) {
  for_each_world({4}, [](int rank, int world) {
    const DeviceMesh mesh = init_device_mesh("cpu", {world}, {"cp"});
    // Load balanced: rank r holds chunks r and 7 - r of 8.
    const at::Tensor pos = cp::context_parallel_positions(16, mesh);
    EXPECT_TRUE(at::equal(pos, at::cat({at::arange(2 * rank, 2 * rank + 2), at::arange(2 * (7 - rank), 2 * (7 - rank) + 2)})));
    EXPECT_TRUE(at::equal(cp::context_parallel_positions(16, mesh, false), at::arange(4 * rank, 4 * rank + 4)));
    const std::string err = dtensor::testing::error_of([&] { cp::context_parallel_shard(at::zeros({2, 12}), 1, mesh); });
    EXPECT_NE(err.find("sequence length 12 is not divisible by 2 * cp = 8"), std::string::npos) << err;
    // Under ContextParallel the model's kernel is ring attention; a mask is refused by name.
    const at::Tensor q = cp::context_parallel_shard(seeded_randn(5, {1, 2, 16, 4}), 2, mesh);
    const at::Tensor want = cp::ring_attention(q, q, q, true, std::nullopt, mesh);
    {
      cp::ContextParallel guard(mesh);
      EXPECT_TRUE(nn::attention_overridden());
      EXPECT_TRUE(at::equal(nn::scaled_dot_product_attention(q, q, q, {}, true, std::nullopt), want));
      const std::string masked = dtensor::testing::error_of(
          [&] { nn::scaled_dot_product_attention(q, q, q, at::zeros({1, 1, 4, 4}), false, std::nullopt); });
      EXPECT_NE(masked.find("attention with a mask (padding)"), std::string::npos) << masked;
    }
    EXPECT_FALSE(nn::attention_overridden());
  });
}
