// Weight-only int4 Linear layers (dtensor/quant/int4_weight_only.h): torchao's group-wise numbers and its CPU kernel's
// outputs on known values, the packed layout, the layer's forward on the fast path and the reference, a Colwise /
// Rowwise pair at TP 2 whose shards are exactly TP 1's, and the refusals (a group size that does not divide
// in_features, a TP degree that cuts a group). GGUF Q4_0 files through the same layers: tests/models/test_llama_gguf.cpp.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/modules/container/sequential.h>

#include <mutex>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"
#include "dtensor/core/fast_kernels.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/nn/layers.h"
#include "dtensor/quant/int4_weight_only.h"
#include "dtensor/tp/parallelize.h"
#include "dtensor/tp/style.h"
#include "harness/multi_rank.h"
#include "tp_pair.h"

namespace {

namespace quant = dtensor::quant;

at::Tensor buffer(torch::nn::Module& m, const char* name) { return m.named_buffers(false)[name]; }

// w[n][k] = ((31 n + 17 k) mod 29 - 14) / 8, + 0.3 at k mod 32 == 5: exact in bf16, no RNG.
at::Tensor known_weight(int64_t N, int64_t K) {
  at::Tensor w = at::empty({N, K});
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      w[n][k] = ((n * 31 + k * 17) % 29 - 14) / 8.0 + (k % 32 == 5 ? 0.3 : 0.0);
    }
  }
  return w.to(at::kBFloat16);
}

TEST(Int4WeightOnly, TorchaosNumbersAndKernelOnKnownValues) {
  const at::Tensor w = known_weight(16, 64);
  const quant::Int4Weight q = quant::quantize_groupwise(w, 32);
  ASSERT_EQ(q.q.sizes(), (at::IntArrayRef{16, 32}));
  ASSERT_EQ(q.scale.scalar_type(), at::kBFloat16);
  // torchao 0.18: _choose_qparams_affine_tinygemm + _quantize_affine_tinygemm (PrototypeInt4WeightOnlyConfig's) on w.
  const std::vector<std::vector<int64_t>> want_v = {
      {0, 9, 3, 11, 5, 15, 8, 2, 10, 4, 13, 7, 1, 9, 3, 12, 6, 14, 8, 2, 11, 5, 13, 7, 1, 10, 4, 12, 6, 0, 9, 3,
       12, 5, 14, 8, 2, 12, 4, 13, 7, 1, 10, 3, 12, 6, 15, 9, 2, 11, 5, 14, 8, 1, 10, 4, 13, 6, 0, 9, 3, 12, 5, 14},
      {1, 10, 3, 13, 6, 1, 9, 2, 12, 5, 14, 8, 1, 11, 4, 13, 7, 0, 9, 3, 12, 6, 15, 8, 2, 11, 4, 14, 7, 1, 10, 3,
       13, 6, 0, 9, 3, 13, 5, 14, 8, 2, 11, 4, 13, 7, 1, 10, 3, 12, 6, 15, 9, 2, 11, 5, 14, 8, 1, 10, 4, 13, 6, 0}};
  const std::vector<std::vector<float>> want_s = {{0.2451171875f, 0.2333984375f}, {0.224609375f, 0.2333984375f}};
  const std::vector<std::vector<float>> want_z = {{0.2109375f, 0.1171875f}, {0.171875f, 0.1171875f}};
  const at::Tensor v = quant::unpack_int4(q.q);
  for (int64_t n = 0; n < 2; ++n) {
    for (int64_t k = 0; k < 64; ++k) EXPECT_EQ(v[n][k].item<int64_t>(), want_v[n][k]) << n << "," << k;
    for (int64_t g = 0; g < 2; ++g) {
      EXPECT_EQ(q.scale[n][g].item<float>(), want_s[n][g]) << n << "," << g;
      EXPECT_EQ(q.zero[n][g].item<float>(), want_z[n][g]) << n << "," << g;
    }
  }
  // The layout: byte j of a chunk of 32 holds value j (low nibble) and value j + 16 (high nibble).
  EXPECT_EQ(q.q[0][0].item<int64_t>(), want_v[0][0] | (want_v[0][16] << 4));
  EXPECT_EQ(q.q[1][17].item<int64_t>(), want_v[1][33] | (want_v[1][49] << 4));
  EXPECT_TRUE(at::equal(quant::pack_int4(v), q.q));
  // torchao's quantized Linear (Int4OpaqueTensor: LibTorch's _weight_int4pack_mm_for_cpu) on x[k] = (k mod 7 - 3) / 4.
  const std::vector<float> want_y = {1.3359375f, -1.7265625f, 0.2041015625f, 2.328125f, -0.54296875f, -0.263671875f,
                                     2.25f,      -0.90625f,   -2.828125f,    2.296875f, 1.078125f,   -2.59375f,
                                     1.78125f,   1.4296875f,  -4.03125f,     0.64453125f};
  at::Tensor x = at::empty({1, 64});
  for (int64_t k = 0; k < 64; ++k) x[0][k] = (k % 7 - 3) / 4.0;
  x = x.to(at::kBFloat16);
  at::NoGradGuard no_grad;
  for (bool fast : {true, false}) {
    dtensor::FastKernelsGuard guard(fast);
    const at::Tensor y = quant::int4_weight_only_linear(x, q).to(at::kFloat);
    for (int64_t n = 0; n < 16; ++n) {
      // Within a bf16 rounding of the output (and, on the reference, of w to bf16: |w| < 2.5, x's sum of |x| < 48).
      EXPECT_NEAR(y[0][n].item<float>(), want_y[n], fast ? 1.0 / 64 : 0.25) << n << " fast=" << fast;
    }
  }
  EXPECT_THROW(quant::quantize_groupwise(w, 48), dtensor::Error);
  EXPECT_THROW(quant::quantize_groupwise(known_weight(4, 48), 32), dtensor::Error);
}

TEST(Int4WeightOnly, LayersComputeTheDequantizedProductOnBothPaths) {
  at::manual_seed(3);
  // Groups of 32 with a hidden size of 96 (down's in_features not a multiple of 64: the fp32 kernel even for bf16 x),
  // groups of 64 with 128 (the bf16 dot-product kernel's loop over a group's steps).
  for (const auto& [g, hidden] : std::vector<std::pair<int64_t, int64_t>>{{32, 96}, {64, 128}}) {
  for (at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    dtensor::nn::Linear up(torch::nn::LinearOptions(128, hidden).bias(false)),
        down(torch::nn::LinearOptions(hidden, 64).bias(true));
    up->to(dtype);
    down->to(dtype);
    const at::Tensor w_up = up->weight.detach().clone(), w_down = down->weight.detach().clone();
    torch::nn::Sequential model(up, down);
    const std::vector<std::string> names = quant::quantize_(*model, quant::Int4WeightOnlyConfig{.group_size = g});
    EXPECT_EQ(names, (std::vector<std::string>{"0", "1"}));
    EXPECT_TRUE(quant::is_int4_weight_only(*up));
    EXPECT_EQ(up->weight.scalar_type(), at::kByte);
    EXPECT_EQ(up->weight.sizes(), (at::IntArrayRef{hidden, 64}));
    EXPECT_FALSE(up->weight.requires_grad());
    const quant::Int4Weight want = quant::quantize_groupwise(w_up, g);
    EXPECT_TRUE(at::equal(up->weight, want.q) && at::equal(buffer(*up, "weight_scale"), want.scale) &&
                at::equal(buffer(*up, "weight_zero"), want.zero));
    EXPECT_TRUE(quant::quantize_(*model, quant::Int4WeightOnlyConfig{.group_size = g}).empty());
    // The dequantized weight is within half a step of the group of the original.
    const at::Tensor deq = quant::dequantize_int4(want, at::kFloat);
    EXPECT_LE((deq - w_up.to(at::kFloat)).abs().max().item<float>(),
              0.5001 * want.scale.to(at::kFloat).max().item<float>() + 1e-2);
    at::NoGradGuard no_grad;
    auto weight = [g = g](torch::nn::Module& m, const at::Tensor& q) {
      return quant::Int4Weight{q, buffer(m, "weight_scale"), buffer(m, "weight_zero"), g};
    };
    for (int64_t rows : {1, 3, 4, 40}) {
      const at::Tensor x = at::randn({rows, 128}).to(dtype);
      // The reference by hand: the weights dequantized into x's dtype, mm, the bias.
      const at::Tensor h = at::mm(x, quant::dequantize_int4(weight(*up, up->weight), dtype).t());
      const at::Tensor by_hand = at::mm(h, quant::dequantize_int4(weight(*down, down->weight), dtype).t()) + down->bias;
      at::Tensor ref;
      {
        dtensor::FastKernelsGuard off(false);
        ref = down(up(x));
        EXPECT_TRUE(at::equal(ref, by_hand)) << rows;
      }
      const at::Tensor fast = down(up(x));
      const double bound = (dtype == at::kFloat ? 1e-5 : 4.0 / 256) * ref.abs().max().item<double>();
      EXPECT_LE((fast - ref).abs().max().item<double>(), bound) << rows << " " << dtype << " group " << g;
    }
  }
  }
}

// Many blocks of weight rows (a partial last one), more rows of x than a slice (300 > 256), Q4_0's form (fp16
// scales, no zero) and torchao's (bf16 scales and zeros): the fast paths (the fused kernel at few rows; from 4 bf16
// rows on a CPU without AVX-512 BF16, the weight dequantized into bf16 block by block for the bf16 kernel) are the
// reference's product within one bf16 rounding.
TEST(Int4WeightOnly, EveryRowCountAndBlockGivesTheReference) {
  at::manual_seed(6);
  const int64_t N = 1100, K = 256;
  const quant::Int4Weight torchao = quant::quantize_groupwise(at::randn({N, K}).to(at::kBFloat16), 64);
  const quant::Int4Weight q4_0{torchao.q, (at::rand({N, K / 32}) * 0.1 + 0.01).to(at::kHalf), at::Tensor(), 32};
  at::NoGradGuard no_grad;
  for (const quant::Int4Weight* w : {&torchao, &q4_0}) {
    for (int64_t rows : {1, 4, 9, 300}) {
      const at::Tensor x = at::randn({rows, K}).to(at::kBFloat16);
      const at::Tensor ref = at::mm(x, quant::dequantize_int4(*w, at::kBFloat16).t()).to(at::kDouble);
      const at::Tensor y = quant::int4_weight_only_linear(x, *w).to(at::kDouble);
      EXPECT_EQ(y.sizes(), ref.sizes());
      const double bound = 2.0 / 256 * ref.abs().max().item<double>();
      EXPECT_LE((y - ref).abs().max().item<double>(), bound) << rows << " rows, group " << w->group_size;
    }
  }
}

TEST(Int4WeightOnly, ColwiseAndRowwiseShardsAreTp1sWithItsOutputs) {
  at::manual_seed(4);
  dtensor::nn::Linear up(torch::nn::LinearOptions(64, 128).bias(false)), down(torch::nn::LinearOptions(128, 64).bias(false));
  up->to(at::kBFloat16);
  down->to(at::kBFloat16);
  const at::Tensor w_up = up->weight.detach().clone(), w_down = down->weight.detach().clone();
  torch::nn::Sequential one(up, down);
  quant::quantize_(*one, quant::Int4WeightOnlyConfig{.group_size = 64});
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
    quant::quantize_(*two, quant::Int4WeightOnlyConfig{.group_size = 64});
    EXPECT_EQ(dtensor::placements(buffer(*a, "weight_scale"))[0], dtensor::Shard(0));
    EXPECT_EQ(dtensor::placements(buffer(*b, "weight_zero"))[0], dtensor::Shard(1));
    const at::Tensor qa = dtensor::full_tensor(a->weight), qb = dtensor::full_tensor(b->weight);
    const at::Tensor sb = dtensor::full_tensor(buffer(*b, "weight_scale")), zb = dtensor::full_tensor(buffer(*b, "weight_zero"));
    const at::Tensor y = b(a(x)).to(at::kFloat);
    std::lock_guard<std::mutex> lock(mu);
    // Each rank quantized its own whole groups: TP 1's values, scales and zeros.
    EXPECT_TRUE(at::equal(qa, up->weight) && at::equal(qb, down->weight));
    EXPECT_TRUE(at::equal(sb, buffer(*down, "weight_scale")) && at::equal(zb, buffer(*down, "weight_zero")));
    EXPECT_LE((y - ref).abs().max().item<double>(), 3.0 / 256 * ref.abs().max().item<double>());
  });
}

TEST(Int4WeightOnly, RefusesAGroupSizeOrATpDegreeThatCutsGroups) {
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const dtensor::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  dtensor::nn::Linear l(torch::nn::LinearOptions(96, 32).bias(false));
  const std::string m1 = message([&] { quant::quantize_(*l, quant::Int4WeightOnlyConfig{.group_size = 64}); });
  EXPECT_NE(m1.find("in_features 96, not a multiple of group_size 64 (group sizes that divide it: 32)"),
            std::string::npos) << m1;
  EXPECT_FALSE(quant::is_int4_weight_only(*l));
  EXPECT_NE(message([&] { quant::quantize_(*l, quant::Int4WeightOnlyConfig{.group_size = 48}); }).find("group_size 48"),
            std::string::npos);
  std::mutex mu;
  dtensor::testing::run_ranks(2, [&](int, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world});
    dtensor::nn::Linear down(torch::nn::LinearOptions(128, 64).bias(false));
    dtensor::parallelize_module(*down, mesh, dtensor::RowwiseParallel());
    // 128 in_features in groups of 128: one group a row, which k's shards at degree 2 would cut.
    const std::string m = message([&] { quant::quantize_(*down, quant::Int4WeightOnlyConfig{.group_size = 128}); });
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_NE(m.find("split over k by a degree of 2, which cuts a group between ranks; degrees that keep whole "
                     "groups: 1"), std::string::npos) << m;
  });
}

}  // namespace
