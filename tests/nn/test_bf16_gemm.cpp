// The bf16 GEMM's fp32 way (dtensor/core/bf16_gemm.h) against PyTorch's bf16 linear (fast kernels off: the reference):
// the output and the three gradients within one bf16 rounding (the sums' order differs), for a plain Linear with and
// without bias on a 3-d input, and for a column- then row-wise sharded pair at TP 2 against one rank's reference.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <string>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/bf16_gemm.h"
#include "dtensor/core/fast_kernels.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/nn/layers.h"
#include "dtensor/tp/parallelize.h"
#include "dtensor/tp/style.h"
#include "harness/multi_rank.h"

namespace {

using dtensor::Bf16GemmKind;

// |got - ref| <= ref's magnitude / 128 (one bf16 rounding, twice for safety on each side) + slack for values that
// cancel to near 0 (`slack` of the largest |ref|).
void expect_within_rounding(const at::Tensor& got, const at::Tensor& ref, const std::string& what, double slack_of_max = 1e-3) {
  ASSERT_EQ(got.sizes(), ref.sizes()) << what;
  EXPECT_EQ(got.scalar_type(), at::kBFloat16) << what;
  const at::Tensor g = got.to(at::kFloat), r = ref.to(at::kFloat);
  const double slack = slack_of_max * r.abs().max().item<double>();
  EXPECT_TRUE(((g - r).abs() <= r.abs() * (2.0 / 256) + slack).all().item<bool>())
      << what << ": max diff " << (g - r).abs().max().item<double>();
  EXPECT_GT(r.abs().max().item<double>(), 0) << what;
}

struct Grads {
  at::Tensor y, dx, dw, db;
};

// y = linear(x), loss = sum(y * t): y and the gradients of x, weight and bias.
Grads run(dtensor::nn::Linear& linear, const at::Tensor& x0, const at::Tensor& t) {
  at::Tensor x = x0.clone().requires_grad_();
  linear->zero_grad();
  at::Tensor y = linear(x);
  (y.to(at::kFloat) * t).sum().backward();
  return {y.detach(), x.grad(), linear->weight.grad().clone(),
          linear->bias.defined() ? linear->bias.grad().clone() : at::Tensor()};
}

TEST(Bf16Gemm, Fp32WayEqualsPyTorchsBf16LinearWithinOneRounding) {
  std::printf("%s\n", dtensor::bf16_gemm_report().c_str());
  for (const bool bias : {true, false}) {
    at::manual_seed(3);
    dtensor::nn::Linear linear(torch::nn::LinearOptions(48, 40).bias(bias));
    linear->to(at::kBFloat16);
    const at::Tensor x = at::randn({2, 5, 48}).to(at::kBFloat16), t = at::randn({2, 5, 40});
    Grads ref, got;
    {
      dtensor::FastKernelsGuard off(false);  // PyTorch's bf16 GEMM
      ASSERT_EQ(dtensor::bf16_gemm_choice(), Bf16GemmKind::native);
      ref = run(linear, x, t);
    }
    {
      dtensor::Bf16GemmGuard fp32(Bf16GemmKind::fp32);
      ASSERT_TRUE(dtensor::bf16_linear_via_fp32(x, linear->weight, linear->bias).has_value());
      got = run(linear, x, t);
      // Not for other dtypes: the caller runs at::linear.
      EXPECT_FALSE(dtensor::bf16_linear_via_fp32(x.to(at::kFloat), linear->weight.to(at::kFloat), at::Tensor()));
    }
    const std::string b = bias ? "with bias" : "no bias";
    expect_within_rounding(got.y, ref.y, "y " + b);
    expect_within_rounding(got.dx, ref.dx, "dx " + b);
    expect_within_rounding(got.dw, ref.dw, "dw " + b);
    if (bias) expect_within_rounding(got.db, ref.db, "db");
  }
  // Native: nothing taken.
  dtensor::Bf16GemmGuard native(Bf16GemmKind::native);
  EXPECT_FALSE(dtensor::bf16_linear_via_fp32(at::ones({2, 8}, at::kBFloat16), at::ones({4, 8}, at::kBFloat16), at::Tensor()));
}

// Colwise then rowwise at TP 2, the fp32 way on each rank's DTensors: y and the full gradients equal one rank's
// PyTorch reference within a rounding per matmul: y and dx pass through two GEMMs and the rowwise partial sums, each
// rounded to bf16 (on values up to the largest: 3/256 of it).
TEST(Bf16Gemm, ShardedLinearsTrainTheFp32WayWithTheReferenceValues) {
  at::manual_seed(4);
  dtensor::nn::Linear up(torch::nn::LinearOptions(32, 64).bias(true)), down(torch::nn::LinearOptions(64, 32).bias(false));
  up->to(at::kBFloat16);
  down->to(at::kBFloat16);
  const at::Tensor x0 = at::randn({3, 4, 32}).to(at::kBFloat16), t = at::randn({3, 4, 32});
  at::Tensor ref_y, ref_dx, ref_dup, ref_dbias, ref_ddown;
  {
    dtensor::FastKernelsGuard off(false);
    at::Tensor x = x0.clone().requires_grad_();
    ref_y = down(up(x));
    (ref_y.to(at::kFloat) * t).sum().backward();
    ref_dx = x.grad();
    ref_dup = up->weight.grad();
    ref_dbias = up->bias.grad();
    ref_ddown = down->weight.grad();
  }
  dtensor::Bf16GemmGuard fp32(Bf16GemmKind::fp32);
  dtensor::testing::run_ranks(2, [&](int, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world});
    dtensor::nn::Linear a(torch::nn::LinearOptions(32, 64).bias(true)), b(torch::nn::LinearOptions(64, 32).bias(false));
    a->to(at::kBFloat16);
    b->to(at::kBFloat16);
    {
      at::NoGradGuard no_grad;
      a->weight.copy_(up->weight);
      a->bias.copy_(up->bias);
      b->weight.copy_(down->weight);
    }
    dtensor::parallelize_module(*a, mesh, dtensor::ColwiseParallel());
    dtensor::parallelize_module(*b, mesh, dtensor::RowwiseParallel());
    at::Tensor x = x0.clone().requires_grad_();
    const at::Tensor y = b(a(x));
    (y.to(at::kFloat) * t).sum().backward();
    expect_within_rounding(y, ref_y, "y", 3.0 / 256);
    expect_within_rounding(x.grad(), ref_dx, "dx", 3.0 / 256);
    expect_within_rounding(dtensor::full_tensor(a->weight.grad()), ref_dup, "d up.weight", 3.0 / 256);
    expect_within_rounding(dtensor::full_tensor(a->bias.grad()), ref_dbias, "d up.bias", 3.0 / 256);
    expect_within_rounding(dtensor::full_tensor(b->weight.grad()), ref_ddown, "d down.weight", 3.0 / 256);
  });
}

}  // namespace
