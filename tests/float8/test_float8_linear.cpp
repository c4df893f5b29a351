// Float8 Linear layers (dtensor/float8/float8_linear.h). The reference is each recipe written out with plain ATen ops:
// quantize (amax -> scale -> clamp -> e4m3 / e5m2), dequantize, and the fp32 matmuls of forward and backward. The
// float8 layer equals it to fp32 rounding (the scaled GEMM accumulates in fp32 in another order); under TP 2 the
// Colwise layout is bit-equal to one device (each output column is the same dot product with the same scales: the
// amax all-reduce makes them global) and the Rowwise layout equal within the partial sums' rounding. The converter's
// filter, its errors, and the unsupported layouts.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"
#include "dtensor/core/fast_kernels.h"
#include "dtensor/float8/float8_linear.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/nn/layers.h"
#include <torch/nn/modules/container/sequential.h>
#include "dtensor/tp/parallelize.h"
#include "float8/float8_matmul.h"
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

Grads run_float8(const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& g, Float8Recipe r,
                 Float8MatmulKind kind = Float8MatmulKind::auto_select) {
  at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  at::Tensor y = float8_linear(x, w, {.recipe = r, .matmul = kind});
  y.backward(g);
  return {y.detach(), x.grad(), w.grad()};
}

constexpr Float8MatmulKind kKinds[] = {Float8MatmulKind::scaled_mm, Float8MatmulKind::emulated,
                                       Float8MatmulKind::emulated_bf16};

// How close each kind comes to the reference's fp32 products: the fp32 sums in another order, or (emulated_bf16) the
// sum rounded to bf16 (2^-9 relative) before the scales.
double tolerance(Float8MatmulKind kind) { return kind == Float8MatmulKind::emulated_bf16 ? 5e-3 : 1e-6; }

double rel(const at::Tensor& a, const at::Tensor& b) {
  return ((a.to(at::kFloat) - b.to(at::kFloat)).abs().max() / b.to(at::kFloat).abs().max()).item<double>();
}

}  // namespace

TEST(Float8Linear, EachRecipeEqualsItsWrittenOutReference) {
  const at::Tensor x = seeded_randn(1, {32, 64}), w = seeded_randn(2, {48, 64}) * 0.1, g = seeded_randn(3, {32, 48});
  for (const Float8Recipe r : {Float8Recipe::tensorwise, Float8Recipe::rowwise}) for (const auto kind : kKinds) {
    SCOPED_TRACE(to_string(r) + " " + to_string(kind));
    const Grads got = run_float8(x, w, g, r, kind), want = reference(x, w, g, r);
    EXPECT_LT(rel(got.y, want.y), tolerance(kind));
    EXPECT_LT(rel(got.gx, want.gx), tolerance(kind));
    EXPECT_LT(rel(got.gw, want.gw), tolerance(kind));
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
  for (const Float8Recipe r : {Float8Recipe::tensorwise, Float8Recipe::rowwise}) for (const auto kind : kKinds) {
    const Grads one = run_float8(x, w, g, r, kind);
    for (const bool colwise : {true, false}) {
      SCOPED_TRACE(to_string(r) + " " + to_string(kind) + (colwise ? " colwise" : " rowwise"));
      // emulated_bf16 rounds each rank's partial sums to bf16 before they are added: measured 5.5e-3.
      const double tp_tolerance = kind == Float8MatmulKind::emulated_bf16 ? 1.5e-2 : 1e-5;
      run_ranks(2, [&](int, int world) {
        auto mesh = init_device_mesh("cpu", {world});
        dtensor::nn::Linear linear(torch::nn::LinearOptions(64, 48).bias(false));
        {
          c10::AutoGradMode no_grad(false);
          linear->weight.copy_(w);
        }
        convert_to_float8_training(*linear, {.recipe = r, .matmul = kind});
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
        if (colwise && r == Float8Recipe::tensorwise && kind == Float8MatmulKind::scaled_mm) {
          EXPECT_TRUE(at::equal(y_full, one.y)) << rel(y_full, one.y);
        } else {
          EXPECT_LT(rel(y_full, one.y), tp_tolerance);
        }
        // The gradient scales are global too: e5m2 / e4m3 rounding agrees with one device up to the partial sums.
        EXPECT_LT(rel(in.grad(), gx_want), tp_tolerance);
        EXPECT_LT(rel(gw, one.gw), tp_tolerance);
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
  const std::string kind_err = error_of([] { float8_matmul_from_string("fast"); });
  EXPECT_NE(kind_err.find("float8 matmul 'fast' is not auto, scaled_mm, emulated or emulated_bf16"), std::string::npos)
      << kind_err;
  for (const auto kind : kKinds) EXPECT_EQ(float8_matmul_from_string(to_string(kind)), kind);
}

// The emulation's widening: every byte of e4m3fn and e5m2 to exactly PyTorch's fp32 value (NaNs as NaNs) and to the
// bf16 of it; a column-major operand stays column-major (its GEMM then reads it transposed, uncopied).
// The fused cast (one scale, dense fp32 / bf16 on the CPU) against the reference's ATen ops, bit for bit: values
// across both formats' whole ranges (subnormals, the smallest normals, rounding ties at each exponent, past the
// clamp), zeros of both signs, infinities, NaNs inside a step and in the tail, a transposed input (strides kept).
TEST(Float8Cast, OnePassEqualsTheReferenceBitForBit) {
  std::vector<float> special = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 448.0f, 464.0f, 480.0f, 57344.0f, 61440.0f,
                                0x1p-6f, 0x1p-7f, 0x1p-9f, 0x1.8p-10f, 0x1p-10f, 0x1p-14f, 0x1p-16f, 0x1.8p-17f, 1e-30f,
                                1.0625f, 1.1875f, 1.125f, 0x1.14p0f, 1.3125f, -2.5625f, 3.0e-45f};
  at::Tensor values = at::cat({at::tensor(special), at::randn({3000}) * at::exp2(at::randint(-20, 20, {3000}).to(at::kFloat)),
                               at::tensor(special).neg()});
  // Every rounding tie of e4m3 and e5m2 near 1: k/16 and k/8 halfway points, and their neighbours.
  for (int k = 0; k < 64; ++k) {
    const float tie = 1.0f + (2 * k + 1) / 128.0f;
    values = at::cat({values, at::tensor({tie, std::nextafter(tie, 0.0f), std::nextafter(tie, 4.0f)})});
  }
  for (const auto hp_type : {at::kFloat, at::kBFloat16}) {
    for (const auto f8 : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
      for (const float s : {1.0f, 0.37f, 1e-3f, 3.0e4f}) {
        const at::Tensor hp = values.to(hp_type), scale = at::tensor(s);
        at::Tensor want;
        {
          FastKernelsGuard reference(false);
          want = float8::cast(hp, scale, f8);
        }
        const at::Tensor got = float8::cast(hp, scale, f8);
        ASSERT_EQ(got.scalar_type(), f8);
        EXPECT_TRUE(at::equal(got.view(at::kByte), want.view(at::kByte))) << hp_type << " -> " << f8 << " scale " << s;
        const at::Tensor t = hp.slice(0, 0, 3000).view({60, 50}).t();  // [50, 60], column-major
        const at::Tensor got_t = float8::cast(t, scale, f8);
        EXPECT_EQ(got_t.strides(), t.strides());
        FastKernelsGuard reference(false);
        EXPECT_TRUE(at::equal(got_t.view(at::kByte), float8::cast(t, scale, f8).view(at::kByte))) << "transposed";
      }
    }
  }
}

TEST(Float8Matmul, WidenGivesEveryFloat8ValueExactly) {
  const at::Tensor bytes = at::arange(256, at::kInt).to(at::kByte);
  for (const auto type : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
    const at::Tensor f8 = bytes.view(type);
    const at::Tensor want = f8.to(at::kFloat), got = float8::widen(f8, at::kFloat);
    EXPECT_TRUE(at::equal(got.isnan(), want.isnan())) << type;
    EXPECT_TRUE(at::equal(at::nan_to_num(got), at::nan_to_num(want))) << type;
    const at::Tensor got16 = float8::widen(f8, at::kBFloat16);
    EXPECT_EQ(got16.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(at::equal(at::nan_to_num(got16.to(at::kFloat)), at::nan_to_num(want))) << type;  // exact in bf16 too
  }
  // Every byte in every position of a 16-byte step, and a tail of 5 (the vector kernel's steps, then the table), by
  // both routes.
  const at::Tensor many = at::cat({bytes, bytes.roll(5), bytes.roll(11), bytes.slice(0, 0, 5)});
  for (const bool fast : {true, false}) {
    FastKernelsGuard kernels(fast);
    for (const auto type : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
      const at::Tensor f8 = many.view(type), want = f8.to(at::kFloat);
      for (const auto dtype : {at::kFloat, at::kBFloat16}) {
        const at::Tensor got = float8::widen(f8, dtype).to(at::kFloat);
        EXPECT_TRUE(at::equal(got.isnan(), want.isnan())) << type << " " << dtype << " fast " << fast;
        EXPECT_TRUE(at::equal(at::nan_to_num(got), at::nan_to_num(want))) << type << " " << dtype << " fast " << fast;
        EXPECT_TRUE(at::equal(got.signbit(), want.signbit())) << type << " " << dtype << " fast " << fast;  // -0, -NaN
      }
    }
  }
  const at::Tensor col = seeded_randn(10, {24, 40}).to(at::kFloat8_e4m3fn).t();  // [40, 24], column-major
  const at::Tensor wide = float8::widen(col, at::kBFloat16);
  EXPECT_EQ(wide.strides(), col.strides());
  EXPECT_TRUE(at::equal(wide.to(at::kFloat), col.to(at::kFloat)));
}

// `auto` on a mesh: every rank times the kinds, the timings are summed over the mesh's groups, and every rank takes
// the same kind (a replicated output computed two ways would drift apart silently). Each is one of the three.
TEST(Float8Matmul, AutoPicksOneKindOnEveryRankOfAMesh) {
  run_ranks(2, [&](int, int world) {
    auto mesh = init_device_mesh("cpu", {world});
    ProcessGroup& group = mesh.get_group(0);
    const auto bf16 = at::TensorOptions().dtype(at::kBFloat16);
    const Float8MatmulTimings t = time_float8_matmuls(64, 128, 96, bf16, &group);
    for (const double ms : {t.scaled_mm_ms, t.emulated_ms, t.emulated_bf16_ms}) EXPECT_GT(ms, 0);
    // In fp32 the bf16 GEMM is no candidate: it would round the sums.
    EXPECT_TRUE(std::isinf(time_float8_matmuls(64, 128, 96, at::TensorOptions(), &group).emulated_bf16_ms));
    const auto kind = float8::resolve(Float8MatmulKind::auto_select, 64, 128, 96, bf16, "a layer", {&group});
    EXPECT_NE(kind, Float8MatmulKind::auto_select);
    // Both ranks' choices and timings side by side: equal.
    const at::Tensor mine = at::tensor({static_cast<double>(kind), static_cast<double>(t.fastest), t.scaled_mm_ms,
                                        t.emulated_ms, t.emulated_bf16_ms}, at::kDouble);
    const at::Tensor both = all_gather(mine, 0, mesh, 0).view({2, 5});
    EXPECT_TRUE(at::equal(both[0], both[1])) << both;
    // Cached: the same class again measures nothing (no collective: a rank alone answers at once).
    EXPECT_EQ(float8::resolve(Float8MatmulKind::auto_select, 64, 128, 96, bf16, "a layer", {&group}), kind);
    // A forced kind is itself; meta (the dry run) takes scaled_mm without timing.
    EXPECT_EQ(float8::resolve(Float8MatmulKind::emulated, 64, 128, 96, at::TensorOptions(), "", {}), Float8MatmulKind::emulated);
    EXPECT_EQ(float8::resolve(Float8MatmulKind::auto_select, 64, 128, 96, at::TensorOptions(at::kMeta), "", {}),
              Float8MatmulKind::scaled_mm);
  });
}
