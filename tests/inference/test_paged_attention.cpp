// paged_attention (inference/paged_attention.h) against the reference it replaces: every sequence's keys gathered
// side by side and a block-diagonal causal mask over them (the model's route with fast kernels off), computed here in
// fp64. Sequences of 1, 3 and 16 new tokens (the kernel's rows) and of 20 and 33 (the per-sequence SDPA route), blocks
// handed out interleaved and out of order, grouped-query heads, q a transposed view as the model makes it; with a
// sliding window, soft-capping and an explicit scale; in fp32, bf16 and fp16; a head_dim the kernel does not take.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <string>
#include <tuple>
#include <vector>

#include "dtensor/core/error.h"
#include "dtensor/core/fast_kernels.h"
#include "dtensor/nn/attention.h"
#include "common/forward_context.h"
#include "inference/kv_cache.h"
#include "inference/paged_attention.h"
#include "inference/paged_kv_cache.h"

namespace {

constexpr int64_t kBlockSize = 4, kBlocks = 64;

struct Case {
  int64_t heads = 8, kv_heads = 2, d = 16;
  std::vector<int64_t> rows{1, 3, 20, 1, 16, 33};     // new tokens per sequence
  std::vector<int64_t> starts{10, 0, 5, 37, 2, 0};   // cached positions before them
  std::optional<double> scale;
  dtensor::nn::AttentionKwargs kwargs;
};

struct Inputs {
  inference::PagedStep step;
  at::Tensor q, pool_k, pool_v;  // q [1, heads, T, d] (a transposed view), pools [1, kv_heads, slots, d]
};

Inputs make_inputs(const Case& c, at::ScalarType dtype) {
  std::vector<inference::PagedChunk> chunks;
  int64_t next = kBlocks - 1;  // blocks from the pool's end, a sequence's interleaved with the next one's
  std::vector<std::vector<int64_t>> tables(c.rows.size());
  for (int64_t round = 0; round < kBlocks; ++round) {
    bool any = false;
    for (size_t i = 0; i < c.rows.size(); ++i) {
      if (static_cast<int64_t>(tables[i].size()) * kBlockSize < c.starts[i] + c.rows[i]) {
        tables[i].push_back(next--);
        any = true;
      }
    }
    if (!any) break;
  }
  for (size_t i = 0; i < c.rows.size(); ++i) chunks.push_back({std::vector<int64_t>(c.rows[i], 7), c.starts[i], tables[i], 1});
  Inputs in{inference::pack_step(chunks, kBlockSize), {}, {}, {}};
  const int64_t T = in.step.tokens.numel();
  at::manual_seed(3);
  in.q = at::randn({1, T, c.heads, c.d}).to(dtype).transpose(1, 2);
  in.pool_k = at::randn({1, c.kv_heads, kBlocks * kBlockSize, c.d}).to(dtype);
  in.pool_v = at::randn({1, c.kv_heads, kBlocks * kBlockSize, c.d}).to(dtype);
  return in;
}

// The reference in fp64: all the step's keys, the block-diagonal causal (windowed) mask, eager attention.
at::Tensor reference(const Inputs& in, const Case& c) {
  const auto& s = in.step;
  const at::Tensor k = in.pool_k.to(at::kDouble).index_select(2, s.key_slots);
  const at::Tensor v = in.pool_v.to(at::kDouble).index_select(2, s.key_slots);
  const int64_t T = s.tokens.numel(), K = s.key_slots.numel();
  const at::Tensor visible = (s.key_seq.view({1, K}) == s.query_seq.view({T, 1})) &
                             dtensor::nn::causal_visible(s.positions.view({T, 1}), s.key_pos.view({1, K}),
                                                         c.kwargs.sliding_window);
  const at::Tensor mask = dtensor::nn::additive_mask(visible, at::TensorOptions(at::kDouble)).view({1, 1, T, K});
  return dtensor::nn::eager_attention(in.q.to(at::kDouble), k, v, mask, false, c.scale, {0, c.kwargs.softcap});
}

// max |got - want| / max |want|.
double rel_err(const at::Tensor& got, const at::Tensor& want) {
  return (got.to(at::kDouble) - want).abs().max().item<double>() / want.abs().max().item<double>();
}

void expect_close(const Case& c, at::ScalarType dtype, double tol, const std::string& label) {
  at::NoGradGuard no_grad;
  const Inputs in = make_inputs(c, dtype);
  const at::Tensor want = reference(in, c);
  const at::Tensor got = inference::paged_attention(in.q, in.pool_k, in.pool_v, in.step, c.scale, c.kwargs);
  ASSERT_EQ(got.sizes(), in.q.sizes()) << label;
  EXPECT_EQ(got.scalar_type(), dtype) << label;
  EXPECT_LE(rel_err(got, want), tol) << label;
  // Row by row too: a sequence's rows must not borrow another's keys (a whole-tensor bound could hide one bad row).
  for (size_t i = 0; i + 1 < in.step.query_start.size(); ++i) {
    const int64_t q0 = in.step.query_start[i], n = in.step.query_start[i + 1] - q0;
    EXPECT_LE(rel_err(got.narrow(2, q0, n), want.narrow(2, q0, n)), tol)
        << label << " sequence " << i << " (" << n << " rows, route " << inference::paged_attention_route(in.q, in.pool_k, n) << ")";
  }
}

// One bf16 rounding of the output (2^-8 relative) and the inputs' products summed in another order.
constexpr double kHalfTol = 1e-2;

TEST(PagedAttention, EqualsTheBlockDiagonalMaskInFp32) {
  const Case c;
  expect_close(c, at::kFloat, 1e-5, "fp32");
  const dtensor::FastKernelsGuard off(false);  // every sequence by the per-sequence SDPA route
  expect_close(c, at::kFloat, 1e-5, "fp32, fast kernels off");
}

TEST(PagedAttention, SlidingWindowSoftcapAndScale) {
  Case c;
  c.kwargs.sliding_window = 5;
  c.kwargs.softcap = 2.0;  // small enough to bend the scores (randn q, k: |q . k| ~ 4)
  c.scale = 0.3;
  expect_close(c, at::kFloat, 1e-5, "window 5, softcap 2, scale 0.3");
  c.kwargs.sliding_window = 1;  // a query sees only itself
  expect_close(c, at::kFloat, 1e-5, "window 1");
}

TEST(PagedAttention, HalfPrecisionPoolsAndHeadLayouts) {
  expect_close(Case{}, at::kBFloat16, kHalfTol, "bf16");
  expect_close(Case{}, at::kHalf, kHalfTol, "fp16");
  Case mha;  // one query head per kv head, a wider head
  mha.heads = 4, mha.kv_heads = 4, mha.d = 64;
  expect_close(mha, at::kBFloat16, kHalfTol, "bf16 heads 4 kv_heads 4 d 64");
  // bf16 with head_dim a multiple of 32: the AVX-512 BF16 kernel where the CPU has it (scores from the bf16 rows),
  // grouped-query heads (4 and 3 query heads a kv head), with a window, soft-capping and a scale, head_dim 64 and 128.
  Case gqa;
  gqa.heads = 8, gqa.kv_heads = 2, gqa.d = 64;
  expect_close(gqa, at::kBFloat16, kHalfTol, "bf16 heads 8 kv_heads 2 d 64");
  gqa.heads = 6, gqa.d = 128, gqa.scale = 0.05;
  gqa.kwargs.sliding_window = 7, gqa.kwargs.softcap = 3.0;
  expect_close(gqa, at::kBFloat16, kHalfTol, "bf16 heads 6 kv_heads 2 d 128, window 7, softcap 3, scale 0.05");
  gqa.d = 96, gqa.kwargs = {};
  expect_close(gqa, at::kBFloat16, kHalfTol, "bf16 d 96");
  Case odd;  // head_dim 12: not the kernel's; the SDPA route for all
  odd.d = 12;
  expect_close(odd, at::kFloat, 1e-5, "d 12");
  EXPECT_STREQ(inference::paged_attention_route(at::zeros({1, 8, 4, 12}), at::zeros({1, 2, 8, 12}), 1), "sdpa");
}

TEST(PagedAttention, ASequenceReadsLongContextsAcrossManyBlocks) {
  const Case c;  // 2 sequences after 200 and 150 cached positions, 1 and 2 new tokens: keys over 89 blocks of 4
  at::NoGradGuard no_grad;
  std::vector<inference::PagedChunk> chunks{{{1}, 200, {}, 1}, {{1, 2}, 150, {}, 1}};
  for (int64_t b = 0; b < 51; ++b) chunks[0].block_table.push_back(2 * b + 1);  // odd blocks
  for (int64_t b = 0; b < 38; ++b) chunks[1].block_table.push_back(100 - 2 * b);  // even ones, backwards
  Inputs in{inference::pack_step(chunks, kBlockSize), {}, {}, {}};
  at::manual_seed(5);
  in.q = at::randn({1, 3, c.heads, c.d}).transpose(1, 2);
  in.pool_k = at::randn({1, c.kv_heads, 128 * kBlockSize, c.d});
  in.pool_v = at::randn({1, c.kv_heads, 128 * kBlockSize, c.d});
  const at::Tensor got = inference::paged_attention(in.q, in.pool_k, in.pool_v, in.step, c.scale, c.kwargs);
  EXPECT_LE(rel_err(got, reference(in, c)), 1e-5);
  // The same in bf16 with head_dim 64 (the AVX-512 BF16 kernel where the CPU has it): 4 blocks of 64 keys, the last
  // partial, and keys whose 16-key groups straddle the blocks' visible range.
  Case wide = c;
  wide.d = 64;
  in.q = at::randn({1, 3, wide.heads, wide.d}).to(at::kBFloat16).transpose(1, 2);
  in.pool_k = at::randn({1, wide.kv_heads, 128 * kBlockSize, wide.d}).to(at::kBFloat16);
  in.pool_v = at::randn({1, wide.kv_heads, 128 * kBlockSize, wide.d}).to(at::kBFloat16);
  const at::Tensor got16 = inference::paged_attention(in.q, in.pool_k, in.pool_v, in.step, wide.scale, wide.kwargs);
  EXPECT_LE(rel_err(got16, reference(in, wide)), kHalfTol);
}

TEST(PagedAttention, IndexSequencesFindsTheRunsAndRefusesOthers) {
  const inference::PagedStep s = inference::pack_step({{{1, 2, 3}, 0, {0}, 1}, {{4}, 5, {1, 2}, 1}}, kBlockSize);
  EXPECT_EQ(s.query_start, (std::vector<int64_t>{0, 3, 4}));
  EXPECT_EQ(s.key_start, (std::vector<int64_t>{0, 3, 9}));
  EXPECT_EQ(s.attention_from_pool, dtensor::fast_kernels_enabled());
  inference::PagedStep bad = s;
  bad.query_seq = at::tensor({1, 1, 1, 0}, at::kLong);  // sequences out of order
  EXPECT_THROW(inference::index_sequences(bad), dtensor::Error);
  bad = s;
  bad.positions = at::tensor({0, 1, 2, 4}, at::kLong);  // the last token is not the last key
  EXPECT_THROW(inference::index_sequences(bad), dtensor::Error);
  {
    const dtensor::FastKernelsGuard off(false);
    EXPECT_FALSE(inference::pack_step({{{1}, 0, {0}, 1}}, kBlockSize).attention_from_pool);
  }
}

// The dense cache of generate (inference/kv_cache.h) attends from its buffer by the same kernel when the forward's
// context says the mask is left padding only: rows padded by 3, 0 and 5 of 9 prompt positions, then 1 and 3 new
// tokens a row, against the keys the cache gives back under the padded causal mask, in fp64. A query in the padding
// (a prefill), no left_padding in the context, or fast kernels off: undefined, nothing stored.
TEST(PagedAttention, TheDenseCacheAttendsFromItsBufferUnderLeftPadding) {
  at::NoGradGuard no_grad;
  const std::vector<int64_t> pads{3, 0, 5};
  const int64_t b = 3, heads = 4, kv_heads = 2, prompt = 9;
  for (const auto& [dtype_, d_, tol_] : {std::tuple{at::kFloat, int64_t{16}, 1e-5}, {at::kBFloat16, int64_t{64}, kHalfTol}}) {
    const at::ScalarType dtype = dtype_;
    const int64_t d = d_;
    const double tol = tol_;
    at::manual_seed(5);
    inference::KVCache cache(/*max_len=*/16);
    models::ForwardContext ctx;
    const models::ForwardContextGuard on(ctx);
    const auto rand = [&](int64_t h, int64_t s) { return at::randn({b, s, h, d}).to(dtype).transpose(1, 2); };
    cache.update(rand(kv_heads, prompt), rand(kv_heads, prompt));
    EXPECT_FALSE(cache.attend(rand(heads, 1), rand(kv_heads, 1), rand(kv_heads, 1), std::nullopt, {}).defined());
    ctx.left_padding = pads;
    {
      const dtensor::FastKernelsGuard off(false);
      EXPECT_FALSE(cache.attend(rand(heads, 1), rand(kv_heads, 1), rand(kv_heads, 1), std::nullopt, {}).defined());
    }
    for (int64_t s : {1, 3}) {
      const at::Tensor q = rand(heads, s), k = rand(kv_heads, s), v = rand(kv_heads, s);
      const int64_t past = cache.length();
      const at::Tensor got = cache.attend(q, k, v, 0.3, {});
      ASSERT_TRUE(got.defined()) << "s " << s;
      ASSERT_EQ(cache.length(), past + s);
      const int64_t t = past + s;
      const at::Tensor qpos = at::arange(past, t).view({1, s, 1}), kpos = at::arange(t).view({1, 1, t});
      const at::Tensor visible = dtensor::nn::causal_visible(qpos, kpos, 0) &
                                 (kpos >= at::tensor(pads, at::kLong).view({b, 1, 1}));
      const at::Tensor mask = dtensor::nn::additive_mask(visible, at::TensorOptions(at::kDouble)).view({b, 1, s, t});
      const at::Tensor keys = cache.keys().narrow(2, 0, t), values = cache.values().narrow(2, 0, t);
      const at::Tensor want = dtensor::nn::eager_attention(q.to(at::kDouble), keys.to(at::kDouble),
                                                           values.to(at::kDouble), mask, false, 0.3, {});
      ASSERT_EQ(got.sizes(), q.sizes());
      EXPECT_EQ(got.scalar_type(), dtype);
      for (int64_t r = 0; r < b; ++r) EXPECT_LE(rel_err(got[r], want[r]), tol) << "s " << s << " row " << r;
    }
    // A row whose query is padding: the model's mask decides (no new cache).
    inference::KVCache fresh(16);
    fresh.update(rand(kv_heads, 2), rand(kv_heads, 2));
    EXPECT_FALSE(fresh.attend(rand(heads, 1), rand(kv_heads, 1), rand(kv_heads, 1), std::nullopt, {}).defined());
    EXPECT_EQ(fresh.length(), 2);
  }
}

}  // namespace
