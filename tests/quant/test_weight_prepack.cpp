// bf16 weights packed for the batched GEMM (dtensor/core/packed_linear.h, dtensor/quant/weight_prepack.h): the packing
// is a permutation (unpacked bit for bit), the packed kernel equals the exact sum within one bf16 rounding for any
// number of rows of x (its 6-row tiles and their tails, slices of k, several panels per thread) and equals the
// reference (DTENSOR_FAST_KERNELS off) within it, and a Colwise / Rowwise pair at TP 2 packs each rank's shard and
// gives TP 1's outputs; a weight tied to an Embedding is packed once for both (the lookup's rows bit for bit, at TP 1
// and 2); one tied to another Linear, one already converted, an fp32 one and one of another shape stay as they are.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/modules/container/sequential.h>

#include <mutex>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"
#include "dtensor/core/fast_kernels.h"
#include "dtensor/core/packed_linear.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/nn/layers.h"
#include "dtensor/nn/parameter_replacement.h"
#include "dtensor/quant/int8_weight_only.h"
#include "dtensor/quant/weight_prepack.h"
#include "dtensor/tp/parallelize.h"
#include "dtensor/tp/style.h"
#include "harness/multi_rank.h"
#include "tp_pair.h"

namespace {

namespace quant = dtensor::quant;

// y within one bf16 rounding of the exact sums (plus fp32's error on the largest, where cancellation leaves a value
// near 0 that may round either way).
void expect_within_one_rounding(const at::Tensor& y, const at::Tensor& exact, const std::string& what) {
  const double slack = 2e-5 * exact.abs().max().item<double>();
  EXPECT_TRUE(((y.to(at::kDouble) - exact).abs() <= exact.abs() * (1.0 / 256) + slack).all().item<bool>()) << what;
}

TEST(WeightPrepack, PackingIsAPermutationUndoneBitForBit) {
  at::manual_seed(0);
  const at::Tensor w = at::randn({128, 96}).to(at::kBFloat16);
  const at::Tensor p = dtensor::bf16_pack_weight(w);
  EXPECT_EQ(p.scalar_type(), at::kUInt16);
  EXPECT_EQ(p.sizes(), w.sizes());
  EXPECT_TRUE(at::equal(dtensor::bf16_unpack_weight(p), w));
  // Row 1's pair 0 is the second 32-bit lane of panel 0's first line: the layout, not just any permutation.
  const at::Tensor flat = p.view(at::kBFloat16).reshape({-1});
  EXPECT_TRUE(at::equal(flat.slice(0, 2, 4), w[1].slice(0, 0, 2)));
  EXPECT_TRUE(at::equal(flat.slice(0, 128, 130), w[0].slice(0, 2, 4)));
  EXPECT_THROW(dtensor::bf16_pack_weight(at::randn({100, 96}).to(at::kBFloat16)), dtensor::Error);  // rows
  EXPECT_THROW(dtensor::bf16_pack_weight(at::randn({128, 40}).to(at::kBFloat16)), dtensor::Error);  // columns
  EXPECT_THROW(dtensor::bf16_pack_weight(at::randn({128, 96})), dtensor::Error);                    // fp32
  EXPECT_THROW(dtensor::bf16_packed_linear(at::randn({2, 96}).to(at::kBFloat16), w), dtensor::Error);  // not packed
}

TEST(WeightPrepack, PackedLinearEqualsTheExactSumWithinOneRounding) {
  std::printf("packed kernel here: %s (bf16_linear kernel %s)\n",
              dtensor::bf16_packed_linear_available() ? "yes" : "no, the reference runs", dtensor::bf16_linear_kernel());
  at::manual_seed(1);
  // Rows: 1 to a 6-row tile and past it, uneven tiles (13, 33), many (300); on AMX also 16-row tiles from 4 rows,
  // zero-padded (4, 13, 17, 33), 16 and 32 rows a pass (48), 64-row chunks and their rest (65, 300); k: one slice, a
  // slice of 1024 pairs and a rest (4160); panels: one, several per thread.
  for (int64_t m : {1, 2, 4, 5, 6, 7, 13, 16, 17, 32, 33, 48, 64, 65, 300}) {
    for (auto [n, k] : {std::pair<int64_t, int64_t>{64, 32}, {192, 96}, {128, 4160}, {1024, 256}}) {
      const at::Tensor x = at::randn({m, k}).to(at::kBFloat16), w = at::randn({n, k}).to(at::kBFloat16);
      const at::Tensor exact = at::matmul(x.to(at::kDouble), w.to(at::kDouble).t());
      const at::Tensor p = dtensor::bf16_pack_weight(w);
      const std::string what = std::to_string(m) + "x" + std::to_string(k) + " @ " + std::to_string(n);
      expect_within_one_rounding(dtensor::bf16_packed_linear(x, p), exact, what);
      dtensor::FastKernelsGuard off(false);
      const at::Tensor ref = dtensor::bf16_packed_linear(x, p);
      EXPECT_TRUE(at::equal(ref, at::linear(x, w))) << what << ": the reference is at::linear on the unpacked weight";
    }
  }
  // Leading dims kept.
  const at::Tensor x = at::randn({2, 3, 64}).to(at::kBFloat16), w = at::randn({128, 64}).to(at::kBFloat16);
  EXPECT_EQ(dtensor::bf16_packed_linear(x, dtensor::bf16_pack_weight(w)).sizes(), (std::vector<int64_t>{2, 3, 128}));
}

// The choice and the forwards, on any CPU: where the packed kernel does not run, only_where_fast = false packs all the
// same and the reference computes.
constexpr bool kAnyCpu = false;

TEST(WeightPrepack, ChoosesOnlyTheLayersThatCanRunPacked) {
  at::manual_seed(2);
  const auto linear = [](int64_t in, int64_t out) {
    dtensor::nn::Linear l(torch::nn::LinearOptions(in, out).bias(true));
    l->to(at::kBFloat16);
    return l;
  };
  dtensor::nn::Linear a = linear(64, 128), odd = linear(128, 100), quantized = linear(100, 64), tied = linear(64, 64),
                      tied_to = linear(64, 64);
  dtensor::nn::Linear fp32(torch::nn::LinearOptions(64, 64));
  dtensor::nn::replace_parameter(*tied, "weight", tied_to->weight);  // shares its storage
  torch::nn::Sequential model(a, odd, quantized, tied, tied_to, fp32);
  quant::quantize_(*model, quant::Int8WeightOnlyConfig{}, [&](const std::string&, torch::nn::Module& m) {
    return &m == quantized.get();
  });
  const at::Tensor wa = a->weight.detach().clone();
  if (!dtensor::bf16_packed_linear_available()) EXPECT_TRUE(quant::prepack_linear_weights_(*model).empty());
  const auto names = quant::prepack_linear_weights_(*model, {}, kAnyCpu);
  EXPECT_EQ(names, (std::vector<std::string>{"0"}));
  EXPECT_TRUE(quant::is_prepacked(*a));
  EXPECT_FALSE(quant::is_prepacked(*odd) || quant::is_prepacked(*tied) || quant::is_prepacked(*fp32));
  EXPECT_EQ(a->weight.scalar_type(), at::kUInt16);
  EXPECT_FALSE(a->weight.requires_grad());
  at::NoGradGuard no_grad;
  const at::Tensor x = at::randn({3, 64}).to(at::kBFloat16);
  const at::Tensor exact = at::matmul(x.to(at::kDouble), wa.to(at::kDouble).t());
  // The product rounded to bf16, then the bias added in bf16: two roundings.
  const at::Tensor b = a->bias.to(at::kDouble);
  EXPECT_TRUE(((a(x).to(at::kDouble) - exact - b).abs() <= (exact.abs() + b.abs()) * (2.0 / 256) + 1e-3).all().item<bool>());
  // Packing again changes nothing.
  EXPECT_TRUE(quant::prepack_linear_weights_(*model, {}, kAnyCpu).empty());
}

TEST(WeightPrepack, ColwiseAndRowwiseShardsGiveTp1sOutputs) {
  at::manual_seed(4);
  dtensor::nn::Linear up(torch::nn::LinearOptions(64, 256).bias(false)), down(torch::nn::LinearOptions(256, 128).bias(false));
  up->to(at::kBFloat16);
  down->to(at::kBFloat16);
  const at::Tensor w_up = up->weight.detach().clone(), w_down = down->weight.detach().clone();
  const at::Tensor x = at::randn({2, 9, 64}).to(at::kBFloat16);
  at::Tensor ref;
  {
    at::NoGradGuard no_grad;
    ref = at::linear(at::linear(x, w_up), w_down).to(at::kFloat);
  }
  std::mutex mu;
  dtensor::testing::run_ranks(2, [&](int, int world) {
    at::NoGradGuard no_grad;
    auto mesh = dtensor::init_device_mesh("cpu", {world});
    auto [a, b, two] = dtensor::testing::colwise_rowwise_pair(mesh, w_up, w_down);
    const auto names = quant::prepack_linear_weights_(*two, {}, kAnyCpu);
    const at::Tensor y = b(a(x)).to(at::kFloat);
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(names.size(), 2u);
    EXPECT_EQ(dtensor::placements(a->weight)[0], dtensor::Shard(0));
    EXPECT_EQ(dtensor::placements(b->weight)[0], dtensor::Shard(1));
    // Each rank packed its own shard: unpacked, the shards are TP 1's weight's.
    EXPECT_TRUE(at::equal(dtensor::bf16_unpack_weight(dtensor::to_local(a->weight)),
                          w_up.chunk(world, 0)[dtensor::device_mesh(a->weight).get_local_rank(0)]));
    // The Rowwise partial sums rounded to bf16 before their reduction: within two roundings of TP 1's.
    EXPECT_LE((y - ref).abs().max().item<double>(), 3.0 / 256 * ref.abs().max().item<double>());
  });
}

// An lm_head tied to its embedding (Llama 3.2): one packed tensor for both; the lookup gives the weight's rows bit for
// bit and the head TP 1's logits within one rounding, plain and at TP 2 (the vocab-parallel lookup Partial, reduced).
TEST(WeightPrepack, TiedEmbeddingAndHeadArePackedOnce) {
  at::manual_seed(5);
  const int64_t vocab = 256, hidden = 64;
  const at::Tensor w = at::randn({vocab, hidden}).to(at::kBFloat16);
  const at::Tensor ids = at::randint(0, vocab, {2, 7}, at::kLong);
  const at::Tensor h = at::randn({2, 7, hidden}).to(at::kBFloat16);
  const at::Tensor exact = at::matmul(h.to(at::kDouble), w.to(at::kDouble).t());
  const auto tied_pair = [&] {
    dtensor::nn::Embedding emb(vocab, hidden);
    dtensor::nn::Linear head(torch::nn::LinearOptions(hidden, vocab).bias(false));
    emb->to(at::kBFloat16);
    at::NoGradGuard no_grad;
    emb->weight.copy_(w);
    dtensor::nn::replace_parameter(*head, "weight", emb->weight);
    return std::make_pair(emb, head);
  };
  {
    auto [emb, head] = tied_pair();
    torch::nn::Sequential model(emb, head);
    EXPECT_EQ(quant::prepack_linear_weights_(*model, {}, kAnyCpu), (std::vector<std::string>{"1"}));
    EXPECT_TRUE(quant::is_prepacked(*emb) && quant::is_prepacked(*head));
    EXPECT_TRUE(emb->weight.is_same(head->weight)) << "one packed tensor, no second copy";
    EXPECT_EQ(emb->weight.scalar_type(), at::kUInt16);
    at::NoGradGuard no_grad;
    EXPECT_TRUE(at::equal(emb(ids), at::embedding(w, ids)));
    EXPECT_TRUE(at::equal(dtensor::bf16_packed_rows(emb->weight, ids), at::embedding(w, ids)));
    expect_within_one_rounding(head(h), exact, "tied head, TP 1");
    EXPECT_THROW(dtensor::bf16_packed_rows(emb->weight, at::full({1}, vocab, at::kLong)), dtensor::Error);
  }
  std::mutex mu;
  dtensor::testing::run_ranks(2, [&](int, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world});
    auto [emb, head] = tied_pair();
    dtensor::parallelize_module(*emb, mesh, dtensor::RowwiseParallel({.input_layouts = dtensor::Replicate()}));
    dtensor::parallelize_module(*head, mesh, dtensor::ColwiseParallel({.output_layouts = dtensor::Replicate()}));
    dtensor::nn::replace_parameter(*head, "weight", emb->weight);  // tied again after the plan, as llama's parallelize
    torch::nn::Sequential model(emb, head);
    const auto names = quant::prepack_linear_weights_(*model, {}, kAnyCpu);
    at::NoGradGuard no_grad;
    const at::Tensor rows = emb(ids), logits = head(h);
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(names, (std::vector<std::string>{"1"}));
    EXPECT_EQ(dtensor::placements(emb->weight)[0], dtensor::Shard(0));
    EXPECT_TRUE(at::equal(dtensor::is_dtensor(rows) ? dtensor::full_tensor(rows) : rows, at::embedding(w, ids)));
    expect_within_one_rounding(dtensor::is_dtensor(logits) ? dtensor::full_tensor(logits) : logits, exact,
                               "tied head, TP 2");
  });
}

}  // namespace
