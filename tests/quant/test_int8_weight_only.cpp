// Weight-only int8 Linear layers (dtensor/quant/int8_weight_only.h): torchao's per-row numbers on known values, the
// layer's forward on the fast path and the reference, and a Colwise / Rowwise pair at TP 2 whose int8 shards and
// scales are exactly TP 1's (the row maxima all-reduced over the columns' shards) with TP 1's outputs. The model
// against torchao itself: tests/models/test_llama_quantized.cpp.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/modules/container/sequential.h>

#include <mutex>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"
#include "dtensor/core/fast_kernels.h"
#include "dtensor/float8/float8_linear.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/nn/layers.h"
#include "dtensor/quant/int8_weight_only.h"
#include "dtensor/tp/parallelize.h"
#include "dtensor/tp/style.h"
#include "harness/multi_rank.h"
#include "tp_pair.h"

namespace {

namespace quant = dtensor::quant;

at::Tensor scale_of(torch::nn::Module& m) { return m.named_buffers(false)["weight_scale"]; }

TEST(Int8WeightOnly, TorchaosNumbersOnKnownValues) {
  // Row 0: amax 2.55 -> scale bf16(2.55 / 127.5); row 1: all zero -> fp32 eps (in bf16); row 2: a negative amax (its
  // bf16 scale rounds up: -3 becomes -127, not -128).
  const at::Tensor w = at::tensor({2.55f, -1.0f, 0.01f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, -3.0f, 1.5f, 0.5f, 0.0f}).view({3, 4});
  const at::Tensor wb = w.to(at::kBFloat16);
  auto [q, s] = quant::quantize_per_row(wb);
  ASSERT_EQ(q.scalar_type(), at::kChar);
  ASSERT_EQ(s.scalar_type(), at::kFloat);
  // torchao 0.18's Int8Tensor.from_hp(w, PerRow()) on these values: its qdata and scale.
  const std::vector<std::vector<int64_t>> want_q = {{127, -50, 0, 0}, {0, 0, 0, 0}, {-127, 64, 21, 0}};
  const std::vector<float> want_s = {0.02001953125f, 1.1920928955078125e-07f, 0.0235595703125f};
  for (int64_t n = 0; n < 3; ++n) {
    EXPECT_EQ(s[n].item<float>(), want_s[n]) << n;
    for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(q[n][k].item<int64_t>(), want_q[n][k]) << n << "," << k;
  }
  EXPECT_THROW(quant::quantize_per_row(at::ones({4}, at::kBFloat16)), dtensor::Error);
  EXPECT_THROW(quant::quantize_per_row(at::ones({2, 2}, at::kInt)), dtensor::Error);
}

TEST(Int8WeightOnly, LayersComputeTheScaledProductOnBothPaths) {
  at::manual_seed(3);
  dtensor::nn::Linear up(torch::nn::LinearOptions(64, 96).bias(false)), down(torch::nn::LinearOptions(96, 64).bias(true));
  up->to(at::kBFloat16);
  down->to(at::kBFloat16);
  const at::Tensor w_up = up->weight.detach().clone(), w_down = down->weight.detach().clone();
  torch::nn::Sequential model(up, down);
  const std::vector<std::string> names = quant::quantize_(*model, quant::Int8WeightOnlyConfig{});
  EXPECT_EQ(names, (std::vector<std::string>{"0", "1"}));
  EXPECT_TRUE(quant::is_int8_weight_only(*up));
  EXPECT_EQ(up->weight.scalar_type(), at::kChar);
  EXPECT_FALSE(up->weight.requires_grad());
  EXPECT_TRUE(at::equal(up->weight, quant::quantize_per_row(w_up).first));
  EXPECT_TRUE(at::equal(scale_of(*up), quant::quantize_per_row(w_up).second));
  // Converting twice changes nothing; float8 afterwards is refused (one override).
  EXPECT_TRUE(quant::quantize_(*model, quant::Int8WeightOnlyConfig{}).empty());
  at::NoGradGuard no_grad;
  for (int64_t rows : {1, 3, 40}) {
    const at::Tensor x = at::randn({rows, 64}).to(at::kBFloat16);
    // torchao's formula by hand: mm with the int8 values in bf16, then the scale in bf16.
    auto by_hand = [](const at::Tensor& in, torch::nn::Module& m, const at::Tensor& q) {
      return at::mm(in, q.to(at::kBFloat16).t()) * scale_of(m).to(at::kBFloat16);
    };
    const at::Tensor h = by_hand(x, *up, up->weight);
    const at::Tensor want = by_hand(h, *down, down->weight) + down->bias;
    at::Tensor ref;
    {
      dtensor::FastKernelsGuard off(false);
      ref = down(up(x));
      EXPECT_TRUE(at::equal(ref, want)) << rows;  // the reference is torchao's formula exactly
    }
    const at::Tensor fast = down(up(x));
    EXPECT_LE((fast - ref).abs().max().item<float>(), 4.0 / 256 * ref.abs().max().item<float>()) << rows;
    // A quantized layer is not the bf16 one: the int8 rounding shows.
    const at::Tensor bf16 = at::linear(at::linear(x, w_up), w_down, down->bias);
    EXPECT_GT((ref - bf16).abs().max().item<float>(), 0.0f);
  }
}

TEST(Int8WeightOnly, ColwiseAndRowwiseShardsAreTp1sWithItsOutputs) {
  at::manual_seed(4);
  dtensor::nn::Linear up(torch::nn::LinearOptions(64, 96).bias(false)), down(torch::nn::LinearOptions(96, 64).bias(false));
  up->to(at::kBFloat16);
  down->to(at::kBFloat16);
  const at::Tensor w_up = up->weight.detach().clone(), w_down = down->weight.detach().clone();
  torch::nn::Sequential one(up, down);
  quant::quantize_(*one, quant::Int8WeightOnlyConfig{});
  const at::Tensor x = at::randn({1, 5, 64}).to(at::kBFloat16);
  at::Tensor ref;
  {
    at::NoGradGuard no_grad;
    ref = down(up(x)).to(at::kFloat);
  }
  std::mutex mu;
  dtensor::testing::run_ranks(2, [&](int, int world) {
    at::NoGradGuard no_grad;
    auto mesh = dtensor::init_device_mesh("cpu", {world});
    auto [a, b, two] = dtensor::testing::colwise_rowwise_pair(mesh, w_up, w_down);
    quant::quantize_(*two, quant::Int8WeightOnlyConfig{});
    // Rowwise: each rank sees half of a row; the all-reduced maxima give TP 1's scales, hence its int8 values.
    const at::Tensor qa = dtensor::full_tensor(a->weight), qb = dtensor::full_tensor(b->weight);
    const at::Tensor sa = dtensor::full_tensor(scale_of(*a)), sb = dtensor::full_tensor(scale_of(*b));
    EXPECT_EQ(dtensor::placements(scale_of(*a))[0], dtensor::Shard(0));
    EXPECT_EQ(dtensor::placements(scale_of(*b))[0], dtensor::Replicate());
    const at::Tensor y = b(a(x)).to(at::kFloat);
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(at::equal(qa, up->weight) && at::equal(sa, scale_of(*up)));
    EXPECT_TRUE(at::equal(qb, down->weight) && at::equal(sb, scale_of(*down)));
    // The Rowwise partial sums rounded to bf16 before their reduction: within two roundings of TP 1's.
    EXPECT_LE((y - ref).abs().max().item<double>(), 3.0 / 256 * ref.abs().max().item<double>());
  });
}

TEST(Int8WeightOnly, RefusesWhatItCannotQuantize) {
  dtensor::nn::Linear l(torch::nn::LinearOptions(32, 32).bias(false));
  dtensor::convert_to_float8_training(*l, {});
  try {
    quant::quantize_(*l, quant::Int8WeightOnlyConfig{});
    FAIL() << "a float8 layer was quantized";
  } catch (const dtensor::Error& e) {
    EXPECT_NE(std::string(e.what()).find("another override"), std::string::npos) << e.what();
  }
}

}  // namespace
