// bf16 GEMMs with autograd on CPUs whose PyTorch bf16 GEMM is slow, chosen by measurement.
//
// PyTorch's CPU bf16 matmul is oneDNN's where the CPU has AVX-512 (BW, VL, DQ) or AMX; elsewhere (an AMD Zen 3, AVX2
// + FMA only) it falls back to ATen's reference GEMM, one thread, ~0.5 GFLOP/s, where the fp32 GEMM of the same
// values runs at ~100: a bf16 training step there took minutes. The other way computes
//
//   y = bf16( fp32(x) @ fp32(w)^T + fp32(b) )          (forward)
//   dx = bf16( fp32(dy) @ fp32(w) ),  dw = bf16( fp32(dy)^T @ fp32(x) ),  db = bf16( sum fp32(dy) )   (backward)
//
// which are PyTorch's numerics (bf16 products are exact in fp32, PyTorch's bf16 GEMM also sums in fp32 and rounds
// once) up to the order of the sums: equal within one bf16 rounding. Autograd saves x and w in bf16, as PyTorch's
// linear does; the fp32 copies live for one GEMM. On DTensors the same ops run through the DTensor rules (the casts
// keep placements; the GEMMs' placements are those of PyTorch's own linear backward).
//
// `auto` (the default) times both on a small linear's three GEMMs (forward, dx, dw) at bf16_gemm_choice()'s first
// call and takes `fp32` only where it is 4x faster: the kinds measured so far are 14x apart (Zen 3) or the other way (AMX: native 8x faster, AVX-512 BF16: 2x), so a rank's choice is not left to timing
// noise. DTENSOR_BF16_GEMM=auto|native|fp32 forces one; with DTENSOR_FAST_KERNELS=0 it is native (the reference).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

namespace dtensor {

enum class Bf16GemmKind { native, fp32 };

// This process's choice (measured once; thread-safe), or a Bf16GemmGuard's; native while fast kernels are off.
Bf16GemmKind bf16_gemm_choice();
// Forces a kind while alive, for every thread (tests: each way on any CPU); restores the old setting.
struct Bf16GemmGuard {
  explicit Bf16GemmGuard(Bf16GemmKind kind);
  ~Bf16GemmGuard();
  Bf16GemmGuard(const Bf16GemmGuard&) = delete;
  Bf16GemmGuard& operator=(const Bf16GemmGuard&) = delete;

 private:
  int previous_;
};
// The choice and its measurement for a run's first lines, e.g.
// "bf16_gemm=auto: fp32 (native 8.09 ms, fp32 0.58 ms: a linear's 3 GEMMs at 64x256x256)".
std::string bf16_gemm_report();

// at::linear(x, w, b) for bf16 CPU tensors (plain or DTensor) when the choice is fp32 and the call needs the
// GEMM's other way (autograd on, or any call: the inference fast kernel, core/fast_kernels.h, is tried first by
// nn::Linear); nullopt otherwise (other dtypes or devices, native chosen): the caller runs at::linear.
std::optional<at::Tensor> bf16_linear_via_fp32(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);

}  // namespace dtensor
