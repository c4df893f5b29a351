// Model code as torchtitan writes it, run unchanged on DTensors (what a new user hit): complex rotary
// embeddings, a reshape that splits a dim before a transpose, repeat_kv, attention with plain 4-D matmul on
// head-sharded tensors; strides of DTensors equal those of plain tensors of the global shape; plain labels
// under loss parallel; bad token ids under a vocab-sharded embedding; a KV cache written as plain code on
// head-sharded keys stays sharded with no communication.
#include <gtest/gtest.h>

#include <c10/core/GradMode.h>

#include <cmath>

#include "dtensor/core/error.h"
#include "dtensor/ops/loss_parallel.h"
#include "dtensor/debug/comm_debug_mode.h"
#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"

using namespace dtensor;
using dtensor::testing::error_of;
using dtensor::testing::run_ranks;
using dtensor::testing::seeded_randn;

namespace {

constexpr int64_t B = 2, S = 6, D = 32, H = 4, KV = 2, HD = D / H;

// torchtitan's precompute_freqs_cis: [S, HD/2] complex.
at::Tensor freqs_cis() {
  at::Tensor freqs = 1.0 / at::pow(10000.0, at::arange(0, HD, 2, at::kFloat) / HD);
  at::Tensor t = at::arange(S, at::kFloat);
  at::Tensor angles = at::outer(t, freqs);
  return at::polar(at::ones_like(angles), angles);
}

// torchtitan's apply_rotary_emb for one tensor [B, S, h, HD].
at::Tensor rotary(const at::Tensor& x, const at::Tensor& freqs) {
  auto shape = x.sizes().vec();
  at::Tensor xc = at::view_as_complex(x.to(at::kFloat).reshape({shape[0], shape[1], shape[2], -1, 2}));
  at::Tensor f = freqs.view({1, xc.size(1), 1, xc.size(3)});
  return at::view_as_real(xc * f).flatten(3).to(x.scalar_type());
}

// torchtitan's repeat_kv: [B, S, kv, HD] -> [B, S, kv * n_rep, HD].
at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  int64_t bs = x.size(0), slen = x.size(1), kv = x.size(2), hd = x.size(3);
  return x.unsqueeze(3).expand({bs, slen, kv, n_rep, hd}).reshape({bs, slen, kv * n_rep, hd});
}

at::Tensor causal_mask() { return at::full({S, S}, -INFINITY).triu(1); }

// The attention block, written for plain tensors (the rotary table and the mask are inputs, as torchtitan's); wq/wk/wv are colwise (their outputs' last dim sharded),
// wo rowwise. Views see global shapes (ColwiseParallel(use_local_output=false)).
at::Tensor attention(const at::Tensor& x, const at::Tensor& wq, const at::Tensor& wk, const at::Tensor& wv,
                     const at::Tensor& wo, const at::Tensor& freqs, const at::Tensor& mask) {
  int64_t bs = x.size(0), seqlen = x.size(1);
  at::Tensor xq = at::linear(x, wq).view({bs, seqlen, -1, HD});
  at::Tensor xk = at::linear(x, wk).view({bs, seqlen, -1, HD});
  at::Tensor xv = at::linear(x, wv).view({bs, seqlen, -1, HD});
  xq = rotary(xq, freqs);
  xk = rotary(xk, freqs);
  int64_t n_rep = xq.size(2) / xk.size(2);
  at::Tensor q = xq.transpose(1, 2);
  at::Tensor k = repeat_kv(xk, n_rep).transpose(1, 2);
  at::Tensor v = repeat_kv(xv, n_rep).transpose(1, 2);
  at::Tensor scores = at::matmul(q, k.transpose(2, 3)) / std::sqrt(static_cast<double>(HD));
  scores = at::softmax(scores + mask, -1);
  at::Tensor out = at::matmul(scores, v).transpose(1, 2).contiguous().view({bs, seqlen, -1});
  return at::linear(out, wo);
}

struct Weights {
  at::Tensor wq = seeded_randn(1, {H * HD, D}) * 0.2;
  at::Tensor wk = seeded_randn(2, {KV * HD, D}) * 0.2;
  at::Tensor wv = seeded_randn(3, {KV * HD, D}) * 0.2;
  at::Tensor wo = seeded_randn(4, {D, H * HD}) * 0.2;
  at::Tensor x = seeded_randn(5, {B, S, D});
};

}  // namespace

TEST(ModelCode, TorchtitanAttentionTrainsLikeOneProcess) {
  // The reference: one process, plain tensors, three SGD steps.
  Weights w0;
  std::vector<at::Tensor> ref{w0.wq.clone(), w0.wk.clone(), w0.wv.clone(), w0.wo.clone()};
  std::vector<double> ref_losses;
  for (auto& p : ref) p.set_requires_grad(true);
  for (int step = 0; step < 3; ++step) {
    at::Tensor loss = attention(w0.x, ref[0], ref[1], ref[2], ref[3], freqs_cis(), causal_mask()).pow(2).mean();
    loss.backward();
    ref_losses.push_back(loss.item<double>());
    c10::AutoGradMode no_grad(false);
    for (auto& p : ref) {
      p.sub_(p.grad() * 0.5);
      p.grad().zero_();
    }
  }
  for (int world : {2, 4}) {
    run_ranks(world, [&](int, int) {
      auto mesh = init_device_mesh("cpu", {world});
      Weights w;
      std::vector<at::Tensor> params{distribute_tensor(w.wq, mesh, {Shard(0)}), distribute_tensor(w.wk, mesh, {Shard(0)}),
                                     distribute_tensor(w.wv, mesh, {Shard(0)}), distribute_tensor(w.wo, mesh, {Shard(1)})};
      for (auto& p : params) p.set_requires_grad(true);
      at::Tensor x = distribute_tensor(w.x, mesh, {Replicate()});
      at::Tensor f = distribute_tensor(freqs_cis(), mesh, {Replicate()});
      at::Tensor mask = distribute_tensor(causal_mask(), mesh, {Replicate()});
      for (int step = 0; step < 3; ++step) {
        at::Tensor out = attention(x, params[0], params[1], params[2], params[3], f, mask);
        at::Tensor loss = full_tensor(out).pow(2).mean();
        loss.backward();
        EXPECT_NEAR(loss.item<double>(), ref_losses[step], 1e-5 * std::abs(ref_losses[step]));
        c10::AutoGradMode no_grad(false);
        for (auto& p : params) {
          p.sub_(p.grad() * 0.5);
          p.grad().zero_();
        }
      }
      for (size_t k = 0; k < params.size(); ++k) {
        EXPECT_TRUE(at::allclose(full_tensor(params[k]), ref[k].detach(), 1e-4, 1e-5)) << "param " << k;
      }
    });
  }
}

TEST(ModelCode, StridesAreThoseOfPlainTensorsOfTheGlobalShape) {
  run_ranks(2, [](int, int) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor full = seeded_randn(9, {2, 4, 6, 8});
    for (auto p : {Shard(0), Shard(1), Shard(2), Shard(3), Replicate(), Partial()}) {
      at::Tensor dt = distribute_tensor(full, mesh, {p});
      at::Tensor t = dt.transpose(1, 2), plain_t = full.transpose(1, 2);
      EXPECT_EQ(t.strides(), plain_t.strides()) << p.to_string();
      at::Tensor c = t.contiguous();
      EXPECT_EQ(c.strides(), plain_t.contiguous().strides()) << p.to_string();
      EXPECT_TRUE(c.is_contiguous()) << p.to_string();
      at::Tensor r = t.reshape({2, 6, 32});  // needs a copy: the same as the plain reshape
      EXPECT_EQ(r.strides(), plain_t.reshape({2, 6, 32}).strides()) << p.to_string();
      EXPECT_TRUE(at::allclose(full_tensor(r), plain_t.reshape({2, 6, 32}))) << p.to_string();
      // A reshape that only splits a dim of a non-contiguous tensor is a view (reshape's _reshape_alias).
      at::Tensor v = t.reshape({2, 6, 2, 2, 8});
      EXPECT_EQ(v.strides(), plain_t.reshape({2, 6, 2, 2, 8}).strides()) << p.to_string();
      EXPECT_TRUE(at::allclose(full_tensor(v), plain_t.reshape({2, 6, 2, 2, 8}))) << p.to_string();
    }
  });
}

TEST(ModelCode, SplitReshapeThenTransposeTrainsThroughBackward) {
  // torchtitan's xq.view(bs, seqlen, -1, head_dim).transpose(1, 2), differentiated: the backward reshapes a
  // non-contiguous gradient.
  at::Tensor x = seeded_randn(10, {2, 3, 8}), w = seeded_randn(11, {8, 8});
  at::Tensor wr = w.clone().set_requires_grad(true);
  at::Tensor ref = at::linear(x, wr).view({2, 3, -1, 2}).transpose(1, 2).contiguous();
  (ref * ref).sum().backward();
  run_ranks(2, [&](int, int) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor wd = distribute_tensor(w, mesh, {Shard(0)}).set_requires_grad(true);
    at::Tensor out = at::linear(distribute_tensor(x, mesh, {Replicate()}), wd).view({2, 3, -1, 2}).transpose(1, 2).contiguous();
    EXPECT_EQ(placements(out), Placements{Shard(1)});
    (out * out).sum().backward();
    EXPECT_TRUE(at::allclose(full_tensor(wd.grad()), wr.grad(), 1e-5, 1e-6));
  });
}

TEST(ModelCode, LossParallelTakesPlainLabels) {
  at::Tensor logits = seeded_randn(12, {6, 10});
  at::Tensor labels = at::tensor(std::vector<int64_t>{1, 9, 0, 4, 4, 7}, at::kLong);
  at::Tensor ref = at::cross_entropy_loss(logits, labels);
  run_ranks(2, [&](int, int) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor sharded = distribute_tensor(logits, mesh, {Shard(1)}).set_requires_grad(true);
    {
      LossParallelGuard guard;
      at::Tensor loss = at::cross_entropy_loss(sharded, labels);  // plain labels, as PyTorch's loss_parallel
      EXPECT_TRUE(at::allclose(full_tensor(loss), ref, 1e-5, 1e-6));
      loss.backward();
    }
    EXPECT_EQ(placements(sharded.grad()), Placements{Shard(1)});
    // Without loss parallel, a replicated or batch-sharded DTensor with plain labels works too.
    for (auto p : {Replicate(), Shard(0)}) {
      at::Tensor loss = at::cross_entropy_loss(distribute_tensor(logits, mesh, {p}), labels);
      EXPECT_TRUE(at::allclose(full_tensor(loss), ref, 1e-5, 1e-6)) << p.to_string();
    }
  });
}

TEST(ModelCode, TokenIdOutsideTheVocabularyRaisesOnEveryRank) {
  auto errors = run_ranks(2, [](int, int) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor weight = distribute_tensor(seeded_randn(13, {10, 4}), mesh, {Shard(0)});  // vocab-sharded
    at::Tensor ids = at::tensor(std::vector<int64_t>{1, 3, 10, 2}, at::kLong).view({2, 2});
    (void)at::embedding(weight, distribute_tensor(ids, mesh, {Replicate()}));
  }, {.expect_all_succeed = false});
  ASSERT_EQ(errors.size(), 2u);
  for (const auto& e : errors) {
    EXPECT_NE(e.find("index out of range in self"), std::string::npos) << e;
    EXPECT_NE(e.find("token id 10"), std::string::npos) << e;
  }
}

// gpt-fast's KV cache as plain code: new_zeros at the maximum length keeps the heads' Shard(1) (the dim
// keeps its size), narrow on the length dim and copy_ write this rank's heads in place, and nothing
// communicates. Other dims and other shapes: Replicate, as PyTorch's new_zeros.
TEST(ModelCode, KVCacheOnHeadShardedKeysStaysShardedWithoutComm) {
  constexpr int64_t MAX = 10;
  at::Tensor k1 = seeded_randn(14, {B, H, 3, HD}), k2 = seeded_randn(15, {B, H, 1, HD});
  at::Tensor expected = at::zeros({B, H, MAX, HD});
  expected.narrow(2, 0, 3).copy_(k1);
  expected.narrow(2, 3, 1).copy_(k2);
  run_ranks(2, [&](int, int) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor k = distribute_tensor(k1, mesh, {Shard(1)}), k_next = distribute_tensor(k2, mesh, {Shard(1)});
    CommDebugMode comm;  // after distribute_tensor, which scatters
    at::Tensor cache = k.new_zeros({B, H, MAX, HD});
    EXPECT_EQ(placements(cache), Placements{Shard(1)});
    EXPECT_EQ(to_local(cache).sizes(), (std::vector<int64_t>{B, H / 2, MAX, HD}));
    cache.narrow(2, 0, 3).copy_(k);
    cache.narrow(2, 3, 1).copy_(k_next);
    at::Tensor filled = cache.narrow(2, 0, 4);
    EXPECT_EQ(placements(filled), Placements{Shard(1)});
    EXPECT_EQ(comm.get_total_counts(), 0);
    EXPECT_TRUE(at::equal(full_tensor(cache), expected));
    // A factory whose sharded dim changes size, or from a Partial: Replicate.
    EXPECT_EQ(placements(k.new_zeros({B, 2 * H, 1, HD})), Placements{Replicate()});
    EXPECT_EQ(placements(k.new_ones({4})), Placements{Replicate()});
    EXPECT_EQ(placements(distribute_tensor(k1, mesh, {Partial()}).new_empty({B, H, MAX, HD})), Placements{Replicate()});
  });
}
