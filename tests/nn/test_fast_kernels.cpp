// The bf16 decode matmul (dtensor/core/fast_kernels.h) against its reference: fp32 sums of the bf16 products (within
// fp32 rounding of a double-precision sum), the bf16 result within one bf16 rounding of PyTorch's at::linear, on the
// shapes it takes (1 row to its row limit, K with and without a tail of 32, N not a multiple of anything); nullopt where it does
// not apply; and dtensor::nn::Linear and a column- / row-wise sharded Linear at TP 2 give the reference's values.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <vector>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/fast_kernels.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/nn/layers.h"
#include "dtensor/tp/parallelize.h"
#include "dtensor/tp/style.h"
#include "harness/multi_rank.h"

namespace {

bool has_fast_path() {
  return dtensor::bf16_linear(at::ones({1, 32}, at::kBFloat16), at::ones({4, 32}, at::kBFloat16)).has_value();
}

TEST(FastKernels, Bf16LinearEqualsTheReferenceWithinOneRounding) {
  if (!has_fast_path()) GTEST_SKIP() << "this CPU has neither AVX-512 BF16 nor AVX2 + FMA (or DTENSOR_FAST_KERNELS=0)";
  std::printf("bf16_linear kernel: %s, up to %ld rows (-1: any)\n", dtensor::bf16_linear_kernel(),
              dtensor::bf16_linear_max_rows() == dtensor::kAnyRows ? -1L : static_cast<long>(dtensor::bf16_linear_max_rows()));
  at::manual_seed(0);
  // 4-row chunks and their tails, the AVX-512 kernel's limit, the AMX kernel's 16-row tiles and 32-row passes, the AVX2
  // kernel's slices of 256 rows.
  std::vector<int64_t> rows = {1, 2, 3, 4, 5, 8, 13, 16, 17, 32, 33, 48, 49, 64, 300};
  std::erase_if(rows, [](int64_t m) { return m > dtensor::bf16_linear_max_rows(); });
  for (int64_t m : rows) {
    // N odd (the AVX2 kernel's last row alone), K with and without a tail of 16 and of 32, in one chunk of 512 and in
    // several, one block and several, more than 64 pairs of rows of w in a block; for the AMX kernel no whole group
    // of 32 rows of w (N = 7), one and a rest (33), blocks of 32 and a last block of rest alone (130 at K = 2048).
    for (auto [n, k] : {std::pair<int64_t, int64_t>{7, 32}, {33, 100}, {130, 2048}, {64, 4131}, {1001, 16}}) {
      const at::Tensor x = at::randn({m, k}).to(at::kBFloat16), w = at::randn({n, k}).to(at::kBFloat16);
      const at::Tensor exact = at::matmul(x.to(at::kDouble), w.to(at::kDouble).t());
      const at::Tensor sums = *dtensor::bf16_linear(x, w, /*fp32_out=*/true);
      EXPECT_LE((sums.to(at::kDouble) - exact).abs().max().item<double>(), 1e-5 * exact.abs().max().item<double>())
          << m << "x" << k << " @ " << n;
      // bf16 out: the fp32 sum rounded once, as at::linear's; the two sums differ in order only.
      const at::Tensor got = *dtensor::bf16_linear(x, w), ref = at::linear(x, w);
      // One bf16 rounding apart, plus the two fp32 sums' difference (each within 1e-5 of the largest exact sum): a
      // value near 0 after cancellation may round on either side.
      const double slack = 2e-5 * exact.abs().max().item<double>();
      EXPECT_TRUE(((got.to(at::kFloat) - ref.to(at::kFloat)).abs() <= ref.to(at::kFloat).abs() * (1.0 / 128) + slack).all().item<bool>())
          << m << "x" << k << " @ " << n;
    }
  }
}

// Weight-only int8: the int8 rows widened block by block and run through the same kernels, for any row count (the
// AMX kernel's 32-row passes, the slices of 256 rows): bf16(scale * fp32 sums), one rounding of the exact scaled sum
// (plus the fp32 sums' error); the reference it stands beside (mm of the widened weight, then the scale: torchao's
// formula) within two roundings.
TEST(FastKernels, Int8WeightLinearEqualsTheExactSumWithinOneRounding) {
  if (!has_fast_path()) GTEST_SKIP() << "this CPU has neither AVX-512 BF16 nor AVX2 + FMA (or DTENSOR_FAST_KERNELS=0)";
  at::manual_seed(2);
  for (int64_t m : {1, 2, 3, 4, 5, 16, 33, 64, 70, 300}) {  // the fused kernel to 4 rows, then widened blocks
    for (auto [n, k] : {std::pair<int64_t, int64_t>{7, 32}, {33, 100}, {130, 2048}, {64, 4131}, {1001, 16}}) {
      const at::Tensor x = at::randn({m, k}).to(at::kBFloat16);
      // Scales that are bf16 values, as quantize_per_row's (computed in the weight's dtype).
      const at::Tensor q = at::randint(-128, 128, {n, k}, at::kChar), s = (at::rand({n}) * 0.01 + 1e-4).to(at::kBFloat16).to(at::kFloat);
      const at::Tensor exact = at::matmul(x.to(at::kDouble), q.to(at::kDouble).t()) * s.to(at::kDouble);
      const std::optional<at::Tensor> got = dtensor::int8_weight_linear(x, q, s);
      ASSERT_TRUE(got.has_value()) << m << "x" << k << " @ " << n;
      ASSERT_EQ(got->scalar_type(), at::kBFloat16);
      const at::Tensor g = got->to(at::kDouble);
      const double slack = 1e-5 * exact.abs().max().item<double>();
      EXPECT_TRUE(((g - exact).abs() <= exact.abs() * (1.0 / 256) + slack).all().item<bool>()) << m << "x" << k << " @ " << n;
      const at::Tensor ref = (at::mm(x, q.to(at::kBFloat16).t()) * s.to(at::kBFloat16)).to(at::kDouble);
      EXPECT_TRUE(((g - ref).abs() <= ref.abs() * (3.0 / 256) + 2 * slack).all().item<bool>()) << m << "x" << k << " @ " << n;
    }
  }
  // Not its inputs: a bf16 weight, fp32 x, scales of another length, autograd.
  const at::Tensor x = at::ones({2, 32}, at::kBFloat16), q = at::ones({4, 32}, at::kChar), s = at::ones({4});
  EXPECT_FALSE(dtensor::int8_weight_linear(x, q.to(at::kBFloat16), s));
  EXPECT_FALSE(dtensor::int8_weight_linear(x.to(at::kFloat), q, s));
  EXPECT_FALSE(dtensor::int8_weight_linear(x, q, at::ones({3})));
  {
    dtensor::FastKernelsGuard off(false);
    EXPECT_FALSE(dtensor::int8_weight_linear(x, q, s));
  }
}

TEST(FastKernels, OnlyWhereItApplies) {
  const at::Tensor w = at::ones({4, 32}, at::kBFloat16);
  if (dtensor::bf16_linear_max_rows() != dtensor::kAnyRows) {
    const int64_t over = dtensor::bf16_linear_max_rows() + 1;
    EXPECT_FALSE(dtensor::bf16_linear(at::ones({over, 32}, at::kBFloat16), w));          // more rows: PyTorch's GEMM
  }
  EXPECT_FALSE(dtensor::bf16_linear(at::ones({1, 32}), w.to(at::kFloat)));                 // fp32
  EXPECT_FALSE(dtensor::bf16_linear(at::ones({1, 32}, at::kBFloat16), w.t().contiguous().t()));  // w not contiguous
  EXPECT_FALSE(dtensor::bf16_linear(at::ones({1, 16}, at::kBFloat16), w));               // sizes differ
  dtensor::FastKernelsGuard off(false);
  EXPECT_FALSE(dtensor::bf16_linear(at::ones({1, 32}, at::kBFloat16), w));               // switched off
  EXPECT_STREQ(dtensor::bf16_linear_kernel(), "off");
  EXPECT_EQ(dtensor::bf16_linear_max_rows(), 0);
}

// nn::Linear on plain tensors and sharded at TP 2 (colwise then rowwise: the local mm of each rank through the
// DTensor kernel) give the reference's result within one bf16 rounding per matmul.
TEST(FastKernels, LinearAndShardedLinearUseItWithTheReferenceValues) {
  at::manual_seed(1);
  dtensor::nn::Linear up(torch::nn::LinearOptions(64, 96).bias(false)), down(torch::nn::LinearOptions(96, 64).bias(false));
  up->to(at::kBFloat16);
  down->to(at::kBFloat16);
  const at::Tensor x = at::randn({1, 1, 64}).to(at::kBFloat16);
  at::NoGradGuard no_grad;
  at::Tensor ref;
  {
    dtensor::FastKernelsGuard off(false);
    ref = down(up(x)).to(at::kFloat);
  }
  const at::Tensor plain = down(up(x)).to(at::kFloat);
  EXPECT_LE((plain - ref).abs().max().item<double>(), 2.0 / 128 * ref.abs().max().item<double>());
  dtensor::testing::run_ranks(2, [&](int, int world) {
    at::NoGradGuard no_grad_here;  // per thread
    auto mesh = dtensor::init_device_mesh("cpu", {world});
    dtensor::nn::Linear a(torch::nn::LinearOptions(64, 96).bias(false)), b(torch::nn::LinearOptions(96, 64).bias(false));
    a->to(at::kBFloat16);
    b->to(at::kBFloat16);
    a->weight.copy_(up->weight);
    b->weight.copy_(down->weight);
    dtensor::parallelize_module(*a, mesh, dtensor::ColwiseParallel());
    dtensor::parallelize_module(*b, mesh, dtensor::RowwiseParallel());
    const at::Tensor y = b(a(x)).to(at::kFloat);
    EXPECT_LE((y - ref).abs().max().item<double>(), 3.0 / 128 * ref.abs().max().item<double>());
  });
}

}  // namespace
