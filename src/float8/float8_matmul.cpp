// The float8 matmul's three ways and `auto`'s measurement (src/float8/float8_matmul.h).
#include "float8/float8_matmul.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>

#include "dtensor/core/error.h"
#include "dtensor/core/fast_kernels.h"
#include "dtensor/mesh/process_group.h"

namespace dtensor {

std::string to_string(Float8MatmulKind kind) {
  switch (kind) {
    case Float8MatmulKind::auto_select: return "auto";
    case Float8MatmulKind::scaled_mm: return "scaled_mm";
    case Float8MatmulKind::emulated: return "emulated";
    case Float8MatmulKind::emulated_bf16: return "emulated_bf16";
  }
  return "?";
}

Float8MatmulKind float8_matmul_from_string(const std::string& name) {
  for (auto k : {Float8MatmulKind::auto_select, Float8MatmulKind::scaled_mm, Float8MatmulKind::emulated,
                 Float8MatmulKind::emulated_bf16}) {
    if (to_string(k) == name) return k;
  }
  throw DTENSOR_ERROR("dtensor: float8 matmul '", name, "' is not auto, scaled_mm, emulated or emulated_bf16");
}

std::string Float8MatmulTimings::to_string() const {
  std::ostringstream s;
  s.precision(2);
  s << std::fixed << dtensor::to_string(fastest) << " (scaled_mm " << (scaled_mm_estimated ? "~" : "") << scaled_mm_ms
    << " ms, emulated " << (emulated_estimated ? "~" : "") << emulated_ms << " ms, emulated_bf16 " << emulated_bf16_ms
    << " ms)";
  return s.str();
}

namespace float8 {
namespace detail {
// src/float8/widen_avx2.cpp: the first n / 16 * 16 bytes widened (to out32, else to out16's bf16 bits); returns them.
int64_t widen_avx2(const uint8_t* in, int64_t n, bool e4m3, float nan_pos, float nan_neg, float* out32,
                   uint16_t* out16);
}  // namespace detail
namespace {

// Every float8 value as fp32 and as bf16 bits, by its byte: [0] e4m3fn, [1] e5m2.
struct Tables {
  float f32[2][256];
  uint16_t bf16[2][256];
};

const Tables& tables() {
  static const Tables t = [] {
    Tables t{};
    for (int b = 0; b < 256; ++b) {
      t.f32[0][b] = static_cast<float>(c10::Float8_e4m3fn(static_cast<uint8_t>(b), c10::Float8_e4m3fn::from_bits()));
      t.f32[1][b] = static_cast<float>(c10::Float8_e5m2(static_cast<uint8_t>(b), c10::Float8_e5m2::from_bits()));
      for (int i = 0; i < 2; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &t.f32[i][b], 4);
        t.bf16[i][b] = static_cast<uint16_t>(bits >> 16);  // exact: a float8 value has at most 3 mantissa bits
      }
    }
    return t;
  }();
  return t;
}

// A rowwise scale ([M, 1] or [1, N]) with unit strides, as _scaled_mm checks them (a transposed [1, N] -> [N, 1] is
// "contiguous" with stride(1) == N).
at::Tensor unit_strides(const at::Tensor& s) { return s.dim() == 2 ? s.reshape({-1}).view(s.sizes()) : s; }

}  // namespace

bool has_vector_casts() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return yes;
}

at::Tensor column_major(const at::Tensor& t) { return t.t().contiguous().t(); }

at::Tensor widen(const at::Tensor& f8, at::ScalarType dtype) {
  DTENSOR_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "dtensor: float8::widen: to fp32 or bf16, not ", dtype);
  const auto type = f8.scalar_type();
  DTENSOR_CHECK(type == at::kFloat8_e4m3fn || type == at::kFloat8_e5m2, "dtensor: float8::widen: ", type,
                " is not float8_e4m3fn or float8_e5m2");
  if (!f8.device().is_cpu()) return f8.to(dtype);
  const at::Tensor src = f8.is_non_overlapping_and_dense() ? f8 : f8.contiguous();
  // The same strides: a dense tensor's elements fill [data, data + numel) in any order, the output's alike.
  at::Tensor out = at::empty_strided(src.sizes(), src.strides(), src.options().dtype(dtype));
  const auto* in = static_cast<const uint8_t*>(src.data_ptr());
  const int which = type == at::kFloat8_e4m3fn ? 0 : 1;
  const Tables& t = tables();
  // The vector kernel where the CPU has it and fast kernels are on; the table (the reference) for the rest.
  const bool vector = has_vector_casts() && fast_kernels_enabled();
  const float nan_pos = t.f32[which][0x7F], nan_neg = t.f32[which][0xFF];  // e4m3fn's NaNs (e5m2's: fp16's own)
  if (dtype == at::kFloat) {
    const float* table = t.f32[which];
    float* o = out.data_ptr<float>();
    at::parallel_for(0, src.numel(), 1 << 16, [&](int64_t b, int64_t e) {
      if (vector) b += detail::widen_avx2(in + b, e - b, which == 0, nan_pos, nan_neg, o + b, nullptr);
      for (int64_t i = b; i < e; ++i) o[i] = table[in[i]];
    });
  } else {
    const uint16_t* table = t.bf16[which];
    auto* o = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
    at::parallel_for(0, src.numel(), 1 << 16, [&](int64_t b, int64_t e) {
      if (vector) b += detail::widen_avx2(in + b, e - b, which == 0, nan_pos, nan_neg, nullptr, o + b);
      for (int64_t i = b; i < e; ++i) o[i] = table[in[i]];
    });
  }
  return out;
}

at::Tensor matmul(Float8MatmulKind kind, const at::Tensor& a, const at::Tensor& b, const at::Tensor& inv_a,
                  const at::Tensor& inv_b, at::ScalarType out_dtype) {
  switch (kind) {
    case Float8MatmulKind::scaled_mm:
      return at::_scaled_mm(a.contiguous(), b, unit_strides(inv_a), unit_strides(inv_b), std::nullopt, std::nullopt,
                            out_dtype);
    case Float8MatmulKind::emulated: {
      // PyTorch's CPU _scaled_mm where it has no float8 GEMM, bit for bit: the operands scaled in fp32, then the GEMM.
      at::Tensor wa = widen(a, at::kFloat), wb = widen(b, at::kFloat);
      wa.mul_(inv_a), wb.mul_(inv_b);
      return at::mm(wa, wb).to(out_dtype);
    }
    case Float8MatmulKind::emulated_bf16: {
      // The float8 values exact in bf16, their products exact and summed in fp32 by the bf16 GEMM, the sum rounded to
      // bf16 once; the scales after it (tensorwise one product; rowwise powers of two: exact).
      at::Tensor y = at::mm(widen(a, at::kBFloat16), widen(b, at::kBFloat16));
      const bool one_scale = inv_a.numel() == 1 && inv_b.numel() == 1;
      if (out_dtype == at::kBFloat16 && y.device().is_cpu()) {
        // In place in bf16, the same numbers as through fp32 (PyTorch's bf16 mul computes in fp32 and rounds once):
        // the product of the scales as an fp32 scalar (a 0-dim tensor would be rounded to bf16 first); rowwise
        // scales are powers of two (exact).
        if (one_scale) return y.mul_((inv_a.reshape({}) * inv_b.reshape({})).item<float>());
        return y.mul_(inv_a).mul_(inv_b);
      }
      y = y.to(at::kFloat);
      if (one_scale) {
        y.mul_(inv_a.reshape({}) * inv_b.reshape({}));
      } else {
        y.mul_(inv_a).mul_(inv_b);
      }
      return y.to(out_dtype);
    }
    case Float8MatmulKind::auto_select: break;
  }
  throw DTENSOR_ERROR("dtensor: float8::matmul: 'auto' is resolved before the matmul (float8::resolve)");
}

}  // namespace float8

namespace {

// The fastest of the timings; ties go to the exact emulation, then to scaled_mm.
Float8MatmulKind fastest(const Float8MatmulTimings& t) {
  if (t.emulated_bf16_ms < std::min(t.emulated_ms, t.scaled_mm_ms)) return Float8MatmulKind::emulated_bf16;
  if (t.scaled_mm_ms < t.emulated_ms) return Float8MatmulKind::scaled_mm;
  return Float8MatmulKind::emulated;
}

Float8MatmulTimings measure(int64_t m, int64_t k, int64_t n, const at::TensorOptions& options,
                            const std::vector<ProcessGroup*>& agree) {
  // Shapes capped (a scalar reference loop at full size could take minutes), multiples of 16 (float8 GEMM tiles).
  auto cap = [](int64_t v, int64_t most) { return std::max<int64_t>(16, (std::min(v, most) + 15) / 16 * 16); };
  m = cap(m, 256), k = cap(k, 2048), n = cap(n, 2048);
  // A generator of its own: the run's RNG stream (initialization, dropout) is left as it was.
  at::Generator gen = at::detail::createCPUGenerator(/*seed_in=*/0);
  // emulated_bf16 rounds the sums to bf16: a candidate only where the layer's results are bf16 anyway.
  const bool bf16_out = options.dtype() == at::kBFloat16;
  const auto o = options.dtype(at::kFloat);
  const at::ScalarType out = bf16_out ? at::kBFloat16 : at::kFloat;
  auto f8 = [&](int64_t r, int64_t c) {
    return at::randn({r, c}, gen, o.device(at::kCPU)).to(o.device()).to(at::kFloat8_e4m3fn);
  };
  const at::Tensor one = at::ones({}, o);
  // The three matmuls of a layer's step at [mm, kk, nn], timed once.
  auto step = [&](Float8MatmulKind kind, int64_t mm, int64_t kk, int64_t nn) {
    const at::Tensor x = f8(mm, kk), w = f8(nn, kk), g = f8(mm, nn);
    const at::Tensor w_col = float8::column_major(w), x_col = float8::column_major(x);
    const auto start = std::chrono::steady_clock::now();
    double sink = 0;
    sink += float8::matmul(kind, x, w.t(), one, one, out).sum().item<double>();      // x @ w^T
    sink += float8::matmul(kind, g, w_col, one, one, out).sum().item<double>();      // g @ w
    sink += float8::matmul(kind, g.t(), x_col, one, one, out).sum().item<double>();  // g^T @ x
    (void)sink;
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  };
  // A kind after the first is timed on a probe shape first, its time scaled by the FLOPs to the capped shape: one
  // already 4x slower than the best keeps that estimate and is not run at size (oneDNN's scalar float8 loop on Intel
  // AMX machines took 33 s for the capped shape's three matmuls; the probe takes ~1/100 of that).
  const int64_t pm = std::min<int64_t>(m, 32), pk = std::min<int64_t>(k, 256), pn = std::min<int64_t>(n, 256);
  const double flop_ratio = static_cast<double>(m) * k * n / (static_cast<double>(pm) * pk * pn);
  const Float8MatmulKind kinds[3] = {Float8MatmulKind::emulated_bf16, Float8MatmulKind::emulated,
                                     Float8MatmulKind::scaled_mm};
  std::vector<double> ms(3);
  bool estimated[3] = {false, false, false};
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < 3; ++i) {
    if (kinds[i] == Float8MatmulKind::emulated_bf16 && !bf16_out) {
      ms[i] = std::numeric_limits<double>::infinity();
      continue;
    }
    try {
      if (std::isfinite(best)) {
        step(kinds[i], 16, 16, 16);  // a library's first use (oneDNN's kernel generation) out of the probe's time
        const double guess = step(kinds[i], pm, pk, pn) * flop_ratio;
        if (guess >= 4 * best) {
          ms[i] = guess, estimated[i] = true;
          continue;
        }
      }
      double t = step(kinds[i], m, k, n);  // the first call (allocation, a library's first use)
      if (t < 4 * best) {
        for (int r = 0; r < 2; ++r) t = std::min(t, step(kinds[i], m, k, n));
      }
      ms[i] = t;
    } catch (const std::exception&) {
      ms[i] = std::numeric_limits<double>::infinity();  // this device's build has no such kernel
    }
    best = std::min(best, ms[i]);
  }
  // Summed over each group in turn, then the mean: after the last, every rank of them holds the same numbers and
  // picks the same kind.
  double ranks = 1;
  for (ProcessGroup* group : agree) {
    at::Tensor t = at::tensor(ms, at::TensorOptions().dtype(at::kDouble));
    group->all_reduce_(t, ReduceOp::SUM);
    for (int i = 0; i < 3; ++i) ms[i] = t[i].item<double>();
    ranks *= group->size();
  }
  Float8MatmulTimings r{.scaled_mm_ms = ms[2] / ranks, .emulated_ms = ms[1] / ranks, .emulated_bf16_ms = ms[0] / ranks,
                        .scaled_mm_estimated = estimated[2], .emulated_estimated = estimated[1]};
  r.fastest = fastest(r);
  return r;
}

}  // namespace

Float8MatmulTimings time_float8_matmuls(int64_t m, int64_t k, int64_t n, const at::TensorOptions& options,
                                        ProcessGroup* agree) {
  return measure(m, k, n, options, agree == nullptr ? std::vector<ProcessGroup*>{} : std::vector<ProcessGroup*>{agree});
}

namespace float8 {

Float8MatmulKind resolve(Float8MatmulKind kind, int64_t m, int64_t k, int64_t n, const at::TensorOptions& options,
                         const std::string& key, const std::vector<ProcessGroup*>& agree) {
  if (kind != Float8MatmulKind::auto_select) return kind;
  // On a GPU, its float8 GEMM; on the meta device (the dry run) nothing runs.
  if (!options.device().is_cpu()) return Float8MatmulKind::scaled_mm;
  auto pow2 = [](int64_t v) {
    int64_t p = 1;
    while (p < v) p <<= 1;
    return p;
  };
  std::ostringstream id;
  id << options.dtype() << " ";
  if (key.empty()) {
    id << pow2(m) << "x" << pow2(k) << "x" << pow2(n);
  } else {
    id << key;
  }
  // The groups are per rank (threads as ranks share this process): part of the key, so that every rank measures.
  for (const ProcessGroup* g : agree) id << "@" << static_cast<const void*>(g);
  static std::mutex mu;
  static std::map<std::string, Float8MatmulKind> chosen;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (const auto it = chosen.find(id.str()); it != chosen.end()) return it->second;
  }
  const Float8MatmulKind kind_here = measure(m, k, n, options, agree).fastest;
  std::lock_guard<std::mutex> lock(mu);
  return chosen.emplace(id.str(), kind_here).first->second;
}

}  // namespace float8
}  // namespace dtensor
