// The bf16 GEMM's two ways and auto's measurement (include/dtensor/core/bf16_gemm.h).
#include "dtensor/core/bf16_gemm.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "dtensor/core/error.h"
#include "dtensor/core/fast_kernels.h"

namespace dtensor {

namespace {

struct Choice {
  Bf16GemmKind kind = Bf16GemmKind::native;
  std::string report;
};

// The fastest of 3 calls after one warm-up, in ms.
template <typename F>
double best_ms(F&& f) {
  f();
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

Choice measure() {
  Choice c;
  const char* env = std::getenv("DTENSOR_BF16_GEMM");
  const std::string_view forced = env ? env : "auto";
  DTENSOR_CHECK(forced == "auto" || forced == "native" || forced == "fp32", "dtensor: DTENSOR_BF16_GEMM=", forced,
                " is not one of auto, native, fp32");
  if (forced != "auto") {
    c.kind = forced == "fp32" ? Bf16GemmKind::fp32 : Bf16GemmKind::native;
    c.report = "bf16_gemm=" + std::string(forced) + " (DTENSOR_BF16_GEMM)";
    return c;
  }
  if (!fast_kernels_enabled()) {
    c.report = "bf16_gemm=auto: native (fast kernels off)";
    return c;
  }
  // A CPU with bf16 instructions (AVX-512 BF16, AMX) runs oneDNN's native bf16 GEMMs: native, not timed. Every such
  // CPU measured so far was faster native (2x AVX-512 BF16, 8x AMX), and on an AMD Zen 5 the timing below flipped
  // between the two from one process to the next, which made llama_plan's dry run answer differently run to run.
  if (__builtin_cpu_supports("avx512bf16")) {
    c.report = "bf16_gemm=auto: native (the CPU has AVX-512 BF16)";
    return c;
  }
  constexpr int64_t M = 64, K = 256, N = 256;
  at::NoGradGuard no_grad;
  // A linear's three GEMMs: y = x w^T, dx = dy w, dw = dy^T x (PyTorch's reference GEMM is 7-10x slower on the
  // second layout than on the first here: timing the forward alone would miss most of a training step's cost).
  const at::Tensor x = at::randn({M, K}).to(at::kBFloat16), w = at::randn({N, K}).to(at::kBFloat16),
                   g = at::randn({M, N}).to(at::kBFloat16);
  const double native = best_ms([&] {
    (void)at::mm(x, w.t());
    (void)at::mm(g, w);
    (void)at::mm(g.t(), x);
  });
  const double fp32 = best_ms([&] {
    const at::Tensor xf = x.to(at::kFloat), wf = w.to(at::kFloat), gf = g.to(at::kFloat);
    (void)at::mm(xf, wf.t()).to(at::kBFloat16);
    (void)at::mm(gf, wf).to(at::kBFloat16);
    (void)at::mm(gf.t(), xf).to(at::kBFloat16);
  });
  c.kind = native > 4 * fp32 ? Bf16GemmKind::fp32 : Bf16GemmKind::native;
  char line[160];
  std::snprintf(line, sizeof line, "bf16_gemm=auto: %s (native %.2f ms, fp32 %.2f ms: a linear's 3 GEMMs at %lldx%lldx%lld)",
                c.kind == Bf16GemmKind::fp32 ? "fp32" : "native", native, fp32, static_cast<long long>(M),
                static_cast<long long>(K), static_cast<long long>(N));
  c.report = line;
  return c;
}

const Choice& choice() {
  static const Choice c = measure();
  return c;
}

// A Bf16GemmGuard's kind (-1: none).
std::atomic<int>& forced_kind() {
  static std::atomic<int> kind{-1};
  return kind;
}

at::Tensor widen(const at::Tensor& t) { return t.to(at::kFloat); }

// dx, dw and db (undefined where not needed; db only with a bias) from the saved bf16 x and w.
torch::autograd::tensor_list backward_of(torch::autograd::AutogradContext* ctx, const torch::autograd::tensor_list& grads,
                                         bool bias) {
  const auto saved = ctx->get_saved_variables();
  const at::Tensor &x = saved[0], &w = saved[1];
  const at::Tensor g = widen(grads[0]);
  const int64_t N = w.size(0), K = w.size(1);
  at::Tensor gx, gw, gb;
  if (ctx->needs_input_grad(0)) gx = at::matmul(g, widen(w)).to(x.scalar_type());
  if (ctx->needs_input_grad(1)) gw = at::mm(g.reshape({-1, N}).t(), widen(x).reshape({-1, K})).to(w.scalar_type());
  if (bias && ctx->needs_input_grad(2)) gb = g.reshape({-1, N}).sum(0).to(w.scalar_type());
  return {gx, gw, gb};
}

// y = x w^T (+ b) in fp32 from bf16 operands, the backward's GEMMs in fp32 too (the header's formulas). Two
// functions: autograd's apply takes no undefined tensor for a missing bias.
struct LinearViaFp32 : torch::autograd::Function<LinearViaFp32> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w) {
    ctx->save_for_backward({x, w});
    return at::linear(widen(x), widen(w)).to(x.scalar_type());
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    auto g = backward_of(ctx, grads, /*bias=*/false);
    g.pop_back();
    return g;
  }
};

struct LinearViaFp32WithBias : torch::autograd::Function<LinearViaFp32WithBias> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor& b) {
    ctx->save_for_backward({x, w});
    return at::linear(widen(x), widen(w), widen(b)).to(x.scalar_type());
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    return backward_of(ctx, grads, /*bias=*/true);
  }
};

}  // namespace

Bf16GemmKind bf16_gemm_choice() {
  if (const int forced = forced_kind().load(std::memory_order_relaxed); forced >= 0) {
    return static_cast<Bf16GemmKind>(forced);
  }
  return fast_kernels_enabled() ? choice().kind : Bf16GemmKind::native;
}

Bf16GemmGuard::Bf16GemmGuard(Bf16GemmKind kind) : previous_(forced_kind().exchange(static_cast<int>(kind))) {}
Bf16GemmGuard::~Bf16GemmGuard() { forced_kind().store(previous_); }

std::string bf16_gemm_report() { return choice().report; }

std::optional<at::Tensor> bf16_linear_via_fp32(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  if (x.scalar_type() != at::kBFloat16 || w.scalar_type() != at::kBFloat16 || !x.device().is_cpu() ||
      !w.device().is_cpu() || w.dim() != 2 || x.dim() < 1) {
    return std::nullopt;
  }
  if (b.defined() && (b.scalar_type() != at::kBFloat16 || !b.device().is_cpu())) return std::nullopt;
  if (bf16_gemm_choice() != Bf16GemmKind::fp32) return std::nullopt;
  return b.defined() ? LinearViaFp32WithBias::apply(x, w, b) : LinearViaFp32::apply(x, w);
}

}  // namespace dtensor
