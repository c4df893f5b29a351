// Float8 Linear layers (dtensor/float8/float8_linear.h). The reference is each recipe written out with plain ATen ops:
// quantize (amax -> scale -> clamp -> e4m3 / e5m2), dequantize, and the fp32 matmuls of forward and backward. The
// float8 layer equals it to fp32 rounding (the scaled GEMM accumulates in fp32 in another order); under TP 2 the
// Colwise layout is bit-equal to one device (each output column is the same dot product with the same scales: the
// amax all-reduce makes them global) and the Rowwise layout equal within the partial sums' rounding. The converter's
// filter, its errors, and the unsupported layouts.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"
#include "dtensor/float8/float8_linear.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/nn/layers.h"
#include <torch/nn/modules/container/sequential.h>
#include "dtensor/tp/parallelize.h"
#include "harness/multi_rank.h"
#include "harness/small_models.h"

using namespace dtensor;
using namespace dtensor::testing;

namespace {

// The recipe written out: `hp`'s float8 value (dequantized) with scales along `dim` (rowwise) or one (tensorwise).
at::Tensor quantized(const at::Tensor& hp, at::ScalarType fp8, Float8Recipe recipe, int64_t dim) {
  const double max = fp8 == at::kFloat8_e4m3fn ? 448.0 : 57344.0;
  const at::Tensor x = hp.to(at::kFloat);
  at::Tensor amax = recipe == Float8Recipe::rowwise ? x.abs().amax({dim}, true) : x.abs().max();
  at::Tensor scale = (max / amax.to(at::kDouble).clamp_min(1e-12)).to(at::kFloat);
  if (recipe == Float8Recipe::rowwise) scale = at::exp2(at::floor(at::log2(scale)));
  return (x * scale).clamp(-max, max).to(fp8).to(at::kFloat) / scale;
}

struct Grads {
  at::Tensor y, gx, gw;
};

Grads reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& g, Float8Recipe r) {
  const bool rw = r == Float8Recipe::rowwise;
  const auto e4 = at::kFloat8_e4m3fn;
  const auto eg = rw ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
  Grads out;
  out.y = at::mm(quantized(x, e4, r, 1), quantized(w, e4, r, 1).t());
  out.gx = at::mm(quantized(g, eg, r, 1), quantized(w, e4, r, 0));
  out.gw = at::mm(quantized(g, eg, r, 0).t(), quantized(x, e4, r, 0));
  return out;
}

Grads run_float8(const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& g, Float8Recipe r) {
  at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  at::Tensor y = float8_linear(x, w, {.recipe = r});
  y.backward(g);
  return {y.detach(), x.grad(), w.grad()};
}

double rel(const at::Tensor& a, const at::Tensor& b) {
  return ((a.to(at::kFloat) - b.to(at::kFloat)).abs().max() / b.to(at::kFloat).abs().max()).item<double>();
}

}  // namespace

TEST(Float8Linear, EachRecipeEqualsItsWrittenOutReference) {
  const at::Tensor x = seeded_randn(1, {32, 64}), w = seeded_randn(2, {48, 64}) * 0.1, g = seeded_randn(3, {32, 48});
  for (const Float8Recipe r : {Float8Recipe::tensorwise, Float8Recipe::rowwise}) {
    const Grads got = run_float8(x, w, g, r), want = reference(x, w, g, r);
    EXPECT_LT(rel(got.y, want.y), 1e-6) << to_string(r);
    EXPECT_LT(rel(got.gx, want.gx), 1e-6) << to_string(r);
    EXPECT_LT(rel(got.gw, want.gw), 1e-6) << to_string(r);
    // And float8 is not fp32: e4m3's 3 mantissa bits are visible, yet close.
    const at::Tensor exact = at::mm(x, w.t());
    EXPECT_GT(rel(got.y, exact), 1e-3) << to_string(r);
    EXPECT_LT(rel(got.y, exact), 0.1) << to_string(r);
  }
}

// In bf16 (mixed precision's compute dtype): the outputs and gradients come back in bf16, equal to the reference
// rounded to bf16.
TEST(Float8Linear, ComputesInTheInputsDtype) {
  const at::Tensor x = seeded_randn(4, {16, 32}).to(at::kBFloat16), w = (seeded_randn(5, {16, 32}) * 0.1).to(at::kBFloat16);
  const at::Tensor g = seeded_randn(6, {16, 16}).to(at::kBFloat16);
  const Grads got = run_float8(x, w, g, Float8Recipe::tensorwise), want = reference(x, w, g, Float8Recipe::tensorwise);
  EXPECT_EQ(got.y.scalar_type(), at::kBFloat16);
  EXPECT_EQ(got.gw.scalar_type(), at::kBFloat16);
  EXPECT_LT(rel(got.y, want.y), 1e-2);  // bf16's rounding of the fp32 result
  EXPECT_LT(rel(got.gx, want.gx), 1e-2);
}

// TP 2 on a Linear under ColwiseParallel and RowwiseParallel: the same outputs and gradients as one device.
TEST(Float8Linear, TensorParallelLayoutsEqualOneDevice) {
  const at::Tensor x = seeded_randn(7, {4, 8, 64}), g = seeded_randn(8, {4, 8, 48});
  const at::Tensor w = seeded_randn(9, {48, 64}) * 0.1;
  for (const Float8Recipe r : {Float8Recipe::tensorwise, Float8Recipe::rowwise}) {
    const Grads one = run_float8(x, w, g, r);
    for (const bool colwise : {true, false}) {
      SCOPED_TRACE(to_string(r) + (colwise ? " colwise" : " rowwise"));
      run_ranks(2, [&](int, int world) {
        auto mesh = init_device_mesh("cpu", {world});
        dtensor::nn::Linear linear(torch::nn::LinearOptions(64, 48).bias(false));
        {
          c10::AutoGradMode no_grad(false);
          linear->weight.copy_(w);
        }
        convert_to_float8_training(*linear, {.recipe = r});
        ASSERT_TRUE(is_float8_linear(*linear));
        if (colwise) {
          parallelize_module(*linear, mesh, ColwiseParallel());
        } else {
          parallelize_module(*linear, mesh, RowwiseParallel());
        }
        const int64_t rank = mesh.get_local_rank(0);
        // Colwise takes the whole input and gives this rank's output columns; Rowwise the reverse.
        at::Tensor in = (colwise ? x : x.chunk(2, -1)[rank]).clone().requires_grad_(true);
        at::Tensor y = linear(in);
        ASSERT_TRUE(!is_dtensor(y));
        y.backward(colwise ? g.chunk(2, -1)[rank].contiguous() : g);
        const at::Tensor y_full = colwise ? all_gather(y.contiguous(), 2, mesh, 0) : y;
        const at::Tensor gx_want = colwise ? one.gx : one.gx.chunk(2, -1)[rank];
        const at::Tensor gw = full_tensor(linear->weight.grad());
        if (colwise && r == Float8Recipe::tensorwise) {
          EXPECT_TRUE(at::equal(y_full, one.y)) << rel(y_full, one.y);
        } else {
          EXPECT_LT(rel(y_full, one.y), 1e-5);
        }
        // The gradient scales are global too: e5m2 / e4m3 rounding agrees with one device up to the partial sums.
        EXPECT_LT(rel(in.grad(), gx_want), 1e-5);
        EXPECT_LT(rel(gw, one.gw), 1e-5);
      });
    }
  }
}

TEST(Float8Linear, ConverterFiltersAndRefusesWhatItCannotRun) {
  dtensor::nn::Linear ok(64, 32), odd(64, 24), head(64, 32);
  torch::nn::Sequential seq;
  seq->push_back("ok", ok);
  seq->push_back("lm_head", head);
  EXPECT_EQ(convert_to_float8_training(*seq, {}, default_float8_filter), std::vector<std::string>{"ok"});
  EXPECT_TRUE(is_float8_linear(*ok));
  EXPECT_FALSE(is_float8_linear(*head));
  EXPECT_TRUE(convert_to_float8_training(*seq, {}, default_float8_filter).empty());  // twice: a no-op
  torch::nn::Sequential bad;
  bad->push_back("proj", odd);
  const std::string err = error_of([&] { convert_to_float8_training(*bad); });
  EXPECT_NE(err.find("'proj' is 64 -> 24: float8 matmuls need in_features and out_features divisible by 16"),
            std::string::npos) << err;
  EXPECT_FALSE(is_float8_linear(*odd));
  EXPECT_THROW(float8_recipe_from_string("blockwise"), dtensor::Error);
}
