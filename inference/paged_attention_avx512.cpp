// paged_attention.h's CPU kernel for bf16 pools on CPUs with AVX-512 BF16 (built with -mavx512f -mavx512bw
// -mavx512bf16; entered only where paged_attention.cpp found them, head_dim a multiple of 32). The AVX2 kernel
// beside it (paged_attention_avx2.cpp) widens every key and value row to fp32 and runs fp32 dot products: here the
// scores come from the bf16 rows as they lie in the pool, VDPBF16PS (pairs of bf16 products, exact, added in fp32),
// 32 elements a step, and only the values are widened (16 lanes an instruction) for the weighted sum in fp32. Same
// task, same blocks of keys, same online softmax (flash attention's running max and sum) as the AVX2 kernel; plain
// pointers, no ATen.
//
//   s[j] = scale * (q . k[j])   (q as stored: the scale multiplies the fp32 sum, not q)
#include "inference/paged_attention_kernel.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace inference::detail {
namespace {

constexpr int64_t kBlock = 64;  // keys per block of the online softmax: the block's values (fp32) stay in L1 / L2

// exp of 16 floats, Cephes' expf as the AVX2 kernel's exp8 (relative error ~1e-7; arguments clamped to [-87.3, 88.4]).
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3365f)), _mm512_set1_ps(88.3762626647949f));
  const __m512 fx = _mm512_floor_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)));
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 y = _mm512_set1_ps(1.9875691500E-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
  y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(x, x), x), _mm512_set1_ps(1.0f));
  const __m512i n = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(fx), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(n));
}

// The 16 lane sums of a[0 .. 16) as one vector (lane u: sum of a[u]'s lanes): pairs within 128-bit lanes, then quads,
// then across the 128-bit lanes.
inline __m512 lane_sums16(__m512* a) {
  __m512 t[8], u[4];
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane: a0+a2, b0+b2, a1+a3, b1+b3 of a = a[2i], b = a[2i+1]
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  }
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane l: the lane-l sums of a[4i .. 4i + 3]
    const __m512d x = _mm512_castps_pd(t[2 * i]), y = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // u[i]'s 128-bit lane l holds lane l's part of keys 4i..4i+3; fold the four lanes, keys 4i.. landing in lane i.
  const __m512 p01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
  const __m512 p23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(p01, p23, 0x88), _mm512_shuffle_f32x4(p01, p23, 0xDD));
}

// s[j] = q . k[j] for the n <= 16 keys at rows[0 .. n) (bf16, d a multiple of 32), as one vector (lanes past n: 0).
inline __m512 dots16(const uint16_t* q, const uint16_t* const* rows, int64_t n, int64_t d) {
  __m512 acc[16];
  for (int u = 0; u < 16; ++u) acc[u] = _mm512_setzero_ps();
  for (int64_t c = 0; c < d; c += 32) {
    const __m512bh qv = (__m512bh)_mm512_loadu_si512(q + c);
    for (int64_t u = 0; u < n; ++u) {
      acc[u] = _mm512_dpbf16_ps(acc[u], qv, (__m512bh)_mm512_loadu_si512(rows[u] + c));
    }
  }
  return lane_sums16(acc);
}

// o[0 .. 16 NU) += sum_j p[j] vf[j][0 .. 16 NU) for j in [a, b), NU accumulators in registers over the keys.
template <int NU>
inline void weighted_rows(float* o, const float* p, const float* vf, int64_t d, int64_t a, int64_t b) {
  __m512 acc[NU];
  for (int u = 0; u < NU; ++u) acc[u] = _mm512_loadu_ps(o + 16 * u);
  for (int64_t j = a; j < b; ++j) {
    const __m512 pj = _mm512_set1_ps(p[j]);
    const float* v = vf + j * d;
    for (int u = 0; u < NU; ++u) acc[u] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(v + 16 * u), acc[u]);
  }
  for (int u = 0; u < NU; ++u) _mm512_storeu_ps(o + 16 * u, acc[u]);
}

// o[0 .. d) += sum_j p[j] vf[j] for j in [a, b), 128 columns at a time (d a multiple of 32).
inline void accumulate(float* o, const float* p, const float* vf, int64_t d, int64_t a, int64_t b) {
  int64_t c = 0;
  for (; c + 128 <= d; c += 128) weighted_rows<8>(o + c, p, vf + c, d, a, b);
  switch ((d - c) / 16) {
    case 2: return weighted_rows<2>(o + c, p, vf + c, d, a, b);
    case 4: return weighted_rows<4>(o + c, p, vf + c, d, a, b);
    case 6: return weighted_rows<6>(o + c, p, vf + c, d, a, b);
    default: return;
  }
}

// The lanes of the 16 keys from u0 that lie in the visible range [b0, b1).
inline __mmask16 visible_lanes(int64_t b0, int64_t b1, int64_t u0) {
  const int64_t from = std::max<int64_t>(b0 - u0, 0), to = std::min<int64_t>(b1 - u0, 16);
  return static_cast<__mmask16>(((1u << to) - 1) & ~((1u << from) - 1));
}

// 16 fp32 rounded to bf16 (to nearest, ties to even) at p.
inline void store16_bf16(uint16_t* p, __m512 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(x));
}

}  // namespace

void paged_attention_avx512_bf16(const PagedAttentionArgs& a, int64_t g, int64_t r0, int64_t r1, int64_t k0,
                                 int64_t len) {
  const int64_t d = a.head_dim, rep = a.heads / a.kv_heads, nq = (r1 - r0) * rep;
  thread_local std::vector<float> acc, vf, p, m, l;
  thread_local std::vector<int64_t> lo, hi;
  thread_local std::vector<const uint16_t*> qrow, krow;
  acc.assign(nq * d, 0.0f), vf.resize(kBlock * d), p.resize(nq * kBlock), qrow.resize(nq), krow.resize(kBlock);
  m.assign(nq, -std::numeric_limits<float>::infinity()), l.assign(nq, 0.0f), lo.resize(nq), hi.resize(nq);

  // Query qi is (row r0 + qi / rep, head g * rep + qi % rep); it sees keys [lo, hi].
  int64_t first = len, end = 0;
  for (int64_t qi = 0; qi < nq; ++qi) {
    const int64_t r = r0 + qi / rep, h = g * rep + qi % rep;
    qrow[qi] = static_cast<const uint16_t*>(a.q) + h * a.q_head_stride + r * a.q_row_stride;
    const int64_t pos = a.positions[r];
    hi[qi] = std::min(pos, len - 1);
    lo[qi] = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
    first = std::min(first, lo[qi]);
    end = std::max(end, hi[qi] + 1);
  }

  const auto* kbase = static_cast<const uint16_t*>(a.k) + g * a.k_head_stride;
  const auto* vbase = static_cast<const uint16_t*>(a.v) + g * a.v_head_stride;
  const __m512 scale = _mm512_set1_ps(a.scale), neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j0 = first; j0 < end; j0 += kBlock) {
    const int64_t n = std::min(kBlock, end - j0);
    // The next block's rows are requested now (a sequence's blocks lie anywhere in the pool), as in the AVX2 kernel.
    const int64_t next = std::min(kBlock, end - j0 - n);
    for (int64_t jj = 0; jj < next; ++jj) {
      const int64_t slot = a.key_slots[k0 + j0 + n + jj];
      for (int64_t off = 0; off < d * 2; off += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(kbase + slot * a.k_slot_stride) + off, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(vbase + slot * a.v_slot_stride) + off, _MM_HINT_T0);
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      const int64_t slot = a.key_slots[k0 + j0 + j];
      krow[j] = kbase + slot * a.k_slot_stride;
      const uint16_t* v = vbase + slot * a.v_slot_stride;
      for (int64_t c = 0; c < d; c += 16) {  // bf16 is fp32's upper half: widen and shift
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + c));
        _mm512_storeu_ps(&vf[j * d + c], _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
      }
    }
    for (int64_t qi = 0; qi < nq; ++qi) {
      const int64_t b0 = std::max(lo[qi], j0) - j0, b1 = std::min(hi[qi] + 1, j0 + n) - j0;  // visible keys of the block
      if (b0 >= b1) continue;
      float* s = &p[qi * kBlock];
      // Scores of the 16-key groups covering [b0, b1); lanes outside it -inf (exp gives 0).
      __m512 block_max = neg_inf;
      for (int64_t u0 = b0 / 16 * 16; u0 < b1; u0 += 16) {
        const int64_t cnt = std::min<int64_t>(16, n - u0);
        __m512 sv = _mm512_mul_ps(scale, dots16(qrow[qi], &krow[u0], cnt, d));
        if (a.softcap > 0) {
          alignas(64) float t[16];
          _mm512_store_ps(t, sv);
          for (int i = 0; i < 16; ++i) t[i] = a.softcap * std::tanh(t[i] / a.softcap);
          sv = _mm512_load_ps(t);
        }
        const __mmask16 visible = visible_lanes(b0, b1, u0);
        sv = _mm512_mask_blend_ps(visible, neg_inf, sv);
        _mm512_storeu_ps(s + u0, sv);
        block_max = _mm512_max_ps(block_max, sv);
      }
      // Online softmax: the running sum and output rescaled to the new max.
      const float m_new = std::max(m[qi], _mm512_reduce_max_ps(block_max)), correction = std::exp(m[qi] - m_new);
      float* o = &acc[qi * d];
      if (correction != 1.0f) {
        const __m512 cv = _mm512_set1_ps(correction);
        for (int64_t c = 0; c < d; c += 16) _mm512_storeu_ps(o + c, _mm512_mul_ps(cv, _mm512_loadu_ps(o + c)));
      }
      const __m512 mv = _mm512_set1_ps(m_new);
      __m512 sum = _mm512_setzero_ps();
      for (int64_t u0 = b0 / 16 * 16; u0 < b1; u0 += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + u0), mv));
        const __mmask16 visible = visible_lanes(b0, b1, u0);
        const __m512 ev = _mm512_maskz_mov_ps(visible, e);  // exp16 clamps: -inf would give ~1e-38, not 0
        _mm512_storeu_ps(s + u0, ev);
        sum = _mm512_add_ps(sum, ev);
      }
      l[qi] = l[qi] * correction + _mm512_reduce_add_ps(sum);
      m[qi] = m_new;
      accumulate(o, s, vf.data(), d, b0, b1);  // o += sum_j s[j] v[j]
    }
  }
  for (int64_t qi = 0; qi < nq; ++qi) {
    const int64_t r = r0 + qi / rep, h = g * rep + qi % rep;
    uint16_t* dst = static_cast<uint16_t*>(a.out) + h * a.out_head_stride + r * a.out_row_stride;
    const __m512 inv = _mm512_set1_ps(1.0f / l[qi]);  // l >= 1: a query always sees its own key
    for (int64_t c = 0; c < d; c += 16) store16_bf16(dst + c, _mm512_mul_ps(inv, _mm512_loadu_ps(&acc[qi * d + c])));
  }
}

}  // namespace inference::detail
