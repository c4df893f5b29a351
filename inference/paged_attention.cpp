#include "inference/paged_attention.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#include "dtensor/core/error.h"
#include "dtensor/core/fast_kernels.h"
#include "dtensor/tensor/dtensor.h"
#include "inference/paged_attention_kernel.h"

namespace inference {
namespace {

bool cpu_has_kernel() {
  static const bool ok =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return ok;
}

bool cpu_has_avx512_bf16() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512bf16");
  return ok;
}

std::optional<detail::Elem> elem_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return detail::Elem::f32;
    case at::kBFloat16: return detail::Elem::bf16;
    case at::kHalf: return detail::Elem::f16;
    default: return std::nullopt;
  }
}

bool kernel_applies(const at::Tensor& q, const at::Tensor& pool_k, const at::Tensor& pool_v) {
  return dtensor::fast_kernels_enabled() && cpu_has_kernel() && q.device().is_cpu() && pool_k.device().is_cpu() &&
         pool_v.device().is_cpu() && elem_of(q.scalar_type()) && pool_k.scalar_type() == q.scalar_type() &&
         pool_v.scalar_type() == q.scalar_type() && q.size(3) % 8 == 0 && q.stride(3) == 1 && pool_k.stride(3) == 1 &&
         pool_v.stride(3) == 1;
}

// Offsets of the consecutive runs 0, 1, ..., n - 1 of `seq` (int64 on any device): n + 1 of them.
std::vector<int64_t> run_offsets(const at::Tensor& seq, const char* what) {
  const at::Tensor s = seq.to(at::kCPU).contiguous();
  const int64_t* v = s.data_ptr<int64_t>();
  std::vector<int64_t> out;
  for (int64_t t = 0; t < s.numel(); ++t) {
    if (t > 0 && v[t] == v[t - 1]) continue;
    DTENSOR_CHECK(v[t] == static_cast<int64_t>(out.size()), "inference: a paged step's ", what, " sequences are not laid "
                  "out 0, 1, ... side by side (entry ", t, " belongs to sequence ", v[t], ")");
    out.push_back(t);
  }
  out.push_back(s.numel());
  return out;
}

// One sequence through ATen: its keys gathered from its slots, its rows' causal (and windowed) mask.
at::Tensor sequence_sdpa(const at::Tensor& q, const at::Tensor& pool_k, const at::Tensor& pool_v,
                         const models::PagedStep& step, size_t i, std::optional<double> scale,
                         const dtensor::nn::AttentionKwargs& kwargs) {
  const int64_t q0 = step.query_start[i], rows = step.query_start[i + 1] - q0;
  const int64_t k0 = step.key_start[i], len = step.key_start[i + 1] - k0;
  const at::Tensor slots = step.key_slots.narrow(0, k0, len).to(pool_k.device());
  const at::Tensor qpos = step.positions.narrow(0, q0, rows).to(q.device()).view({rows, 1});
  const at::Tensor kpos = at::arange(len, qpos.options()).view({1, len});
  const at::Tensor mask = dtensor::nn::additive_mask(dtensor::nn::causal_visible(qpos, kpos, kwargs.sliding_window),
                                                     q.options()).view({1, 1, rows, len});
  return dtensor::nn::scaled_dot_product_attention(q.narrow(2, q0, rows), pool_k.index_select(2, slots),
                                                   pool_v.index_select(2, slots), mask, /*is_causal=*/false, scale,
                                                   {/*sliding_window=*/0, kwargs.softcap});
}

}  // namespace

void index_sequences(models::PagedStep& step) {
  step.query_start = run_offsets(step.query_seq, "query");
  step.key_start = run_offsets(step.key_seq, "key");
  DTENSOR_CHECK(step.query_start.size() == step.key_start.size(), "inference: a paged step has ",
                step.query_start.size() - 1, " sequences of new tokens but ", step.key_start.size() - 1, " of keys");
  // Each sequence's keys are its positions 0 .. len - 1, the last its last new token's.
  const at::Tensor pos = step.positions.to(at::kCPU).contiguous();
  for (size_t i = 0; i + 1 < step.query_start.size(); ++i) {
    const int64_t last = pos.data_ptr<int64_t>()[step.query_start[i + 1] - 1];
    DTENSOR_CHECK(last == step.key_start[i + 1] - step.key_start[i] - 1, "inference: a paged step's sequence ", i,
                  " reads ", step.key_start[i + 1] - step.key_start[i], " keys but its last new token is at position ",
                  last);
  }
  step.attention_from_pool = dtensor::fast_kernels_enabled();
}

bool sharded_by_heads_alike(const at::Tensor& q, const at::Tensor& cache) {
  if (!dtensor::is_dtensor(q) || !dtensor::is_dtensor(cache)) return false;
  const dtensor::Placements& p = dtensor::placements(q);
  bool heads_only = dtensor::placements(cache) == p;
  for (const auto& pl : p) heads_only = heads_only && (pl.is_replicate() || pl.is_shard(1));
  return heads_only;
}

const char* paged_attention_route(const at::Tensor& q, const at::Tensor& pool_k, int64_t rows) {
  return kernel_applies(q, pool_k, pool_k) && rows <= kKernelRows ? "kernel" : "sdpa";
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& pool_k, const at::Tensor& pool_v,
                           const models::PagedStep& step, std::optional<double> scale,
                           const dtensor::nn::AttentionKwargs& kwargs) {
  DTENSOR_CHECK(q.dim() == 4 && q.size(0) == 1 && pool_k.dim() == 4 && pool_k.sizes() == pool_v.sizes() &&
                    pool_k.size(3) == q.size(3) && pool_k.size(1) > 0 && q.size(1) % pool_k.size(1) == 0,
                "inference: paged_attention takes q [1, heads, T, d] and pools [1, kv_heads, slots, d] with kv_heads "
                "dividing heads; got ", q.sizes(), " and ", pool_k.sizes());
  const size_t n = step.query_start.size() ? step.query_start.size() - 1 : 0;
  DTENSOR_CHECK(n > 0 && step.key_start.size() == n + 1 && step.query_start.back() == q.size(2),
                "inference: paged_attention needs the step's sequences indexed (index_sequences) for its ", q.size(2),
                " tokens");
  const int64_t heads = q.size(1), kv_heads = pool_k.size(1), T = q.size(2), d = q.size(3);
  // [1, T, heads, d] in memory: the model's transpose back to [1, T, heads * d] is then a view.
  at::Tensor out = at::empty({1, T, heads, d}, q.options()).transpose(1, 2);
  const bool kernel = kernel_applies(q, pool_k, pool_v);
  std::vector<size_t> short_seqs;
  for (size_t i = 0; i < n; ++i) {
    const int64_t rows = step.query_start[i + 1] - step.query_start[i];
    if (kernel && rows <= kKernelRows) {
      short_seqs.push_back(i);
    } else {
      out.narrow(2, step.query_start[i], rows).copy_(sequence_sdpa(q, pool_k, pool_v, step, i, scale, kwargs));
    }
  }
  if (short_seqs.empty()) return out;

  const at::Tensor positions = step.positions.contiguous(), key_slots = step.key_slots.contiguous();
  detail::PagedAttentionArgs a;
  a.elem = *elem_of(q.scalar_type());
  a.q = q.data_ptr(), a.q_head_stride = q.stride(1), a.q_row_stride = q.stride(2);
  a.k = pool_k.data_ptr(), a.k_head_stride = pool_k.stride(1), a.k_slot_stride = pool_k.stride(2);
  a.v = pool_v.data_ptr(), a.v_head_stride = pool_v.stride(1), a.v_slot_stride = pool_v.stride(2);
  a.out = out.data_ptr(), a.out_head_stride = out.stride(1), a.out_row_stride = out.stride(2);
  a.heads = heads, a.kv_heads = kv_heads, a.head_dim = d;
  a.positions = positions.data_ptr<int64_t>(), a.key_slots = key_slots.data_ptr<int64_t>();
  a.scale = static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(d)));
  a.window = kwargs.sliding_window, a.softcap = static_cast<float>(kwargs.softcap);
  // bf16 pools on a CPU with AVX-512 BF16: scores straight from the bf16 rows (paged_attention_avx512.cpp).
  const auto kernel_fn = a.elem == detail::Elem::bf16 && d % 32 == 0 && cpu_has_avx512_bf16()
                             ? detail::paged_attention_avx512_bf16
                             : detail::paged_attention_avx2;
  // One task per (sequence, kv head); a task reads its sequence's keys once for its rows and rep query heads.
  const int64_t tasks = static_cast<int64_t>(short_seqs.size()) * kv_heads;
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const size_t i = short_seqs[static_cast<size_t>(t / kv_heads)];
      kernel_fn(a, t % kv_heads, step.query_start[i], step.query_start[i + 1], step.key_start[i],
                step.key_start[i + 1] - step.key_start[i]);
    }
  });
  return out;
}

}  // namespace inference
