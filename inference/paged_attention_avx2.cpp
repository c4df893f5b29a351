// paged_attention.h's CPU kernel: AVX2 + FMA (+ F16C for fp16 pools). Built with -mavx2 -mfma -mf16c; entered only on
// CPUs that have them (paged_attention.cpp checks).
#include "inference/paged_attention_kernel.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace inference::detail {
namespace {

constexpr int64_t kBlock = 64;  // keys per block of the online softmax: K and V of a block (fp32) stay in L1 / L2

template <Elem E>
constexpr int64_t elem_size() {
  return E == Elem::f32 ? 4 : 2;
}

// 8 elements at p (fp32, or bf16 / fp16 widened) as fp32.
template <Elem E>
inline __m256 load8(const char* p) {
  if constexpr (E == Elem::f32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (E == Elem::bf16) {  // bf16 is fp32's upper half: widen and shift
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
}

// 8 fp32 rounded (to nearest, ties to even) to the element type at p.
template <Elem E>
inline void store8(char* p, __m256 x) {
  if constexpr (E == Elem::f32) {
    _mm256_storeu_ps(reinterpret_cast<float*>(p), x);
  } else if constexpr (E == Elem::bf16) {
    __m256i u = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    u = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

// max of s[a .. b), b > a.
inline float max_of(const float* s, int64_t a, int64_t b) {
  int64_t j = a;
  float m = s[j];
  if (b - a >= 8) {
    __m256 mv = _mm256_loadu_ps(s + a);
    for (j = a + 8; j + 8 <= b; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + j));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    m = _mm_cvtss_f32(h);
  }
  for (; j < b; ++j) m = std::max(m, s[j]);
  return m;
}

// exp of 8 floats, Cephes' expf: x = n ln 2 + r, |r| <= ln 2 / 2, exp(r) by a degree-5 polynomial, times 2^n
// (relative error ~1e-7). Arguments below -87.3 give ~1e-38, not 0 (the softmax's exponents are <= 0: a term that
// small is nothing beside the running sum's >= 1).
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3365f)), _mm256_set1_ps(88.3762626647949f));
  const __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(x, x), x), _mm256_set1_ps(1.0f));
  const __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}

// s[j] = q . kf[j] for j in [a, b) (d a multiple of 8): eight keys at a time (eight independent FMA chains, the
// FMA's latency hidden), their sums folded by hadds: lanes [k0..k3 | k0..k3] and [k4..k7 | k4..k7], halves added.
inline void dots(const float* q, const float* kf, int64_t d, int64_t a, int64_t b, float* s) {
  int64_t j = a;
  for (; j + 8 <= b; j += 8) {
    const float* k = kf + j * d;
    __m256 acc[8];
    for (int u = 0; u < 8; ++u) acc[u] = _mm256_setzero_ps();
    for (int64_t c = 0; c < d; c += 8) {
      const __m256 qv = _mm256_loadu_ps(q + c);
      for (int u = 0; u < 8; ++u) acc[u] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + u * d + c), acc[u]);
    }
    const __m256 lo4 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
    const __m256 hi4 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
    _mm256_storeu_ps(s + j, _mm256_add_ps(_mm256_permute2f128_ps(lo4, hi4, 0x20), _mm256_permute2f128_ps(lo4, hi4, 0x31)));
  }
  for (; j < b; ++j) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t c = 0; c < d; c += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(kf + j * d + c), acc);
    s[j] = hsum(acc);
  }
}

// o[0 .. 8 NU) += sum_j p[j] vf[j][0 .. 8 NU) for j in [a, b): NU accumulators held in registers over the keys (one
// chain per 8 columns: independent, so the FMAs overlap).
template <int NU>
inline void weighted_rows(float* o, const float* p, const float* vf, int64_t d, int64_t a, int64_t b) {
  __m256 acc[NU];
  for (int u = 0; u < NU; ++u) acc[u] = _mm256_loadu_ps(o + 8 * u);
  for (int64_t j = a; j < b; ++j) {
    const __m256 pj = _mm256_broadcast_ss(p + j);
    const float* v = vf + j * d;
    for (int u = 0; u < NU; ++u) acc[u] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 8 * u), acc[u]);
  }
  for (int u = 0; u < NU; ++u) _mm256_storeu_ps(o + 8 * u, acc[u]);
}

// o[0 .. d) += sum_j p[j] vf[j] for j in [a, b), 64 columns at a time.
inline void accumulate(float* o, const float* p, const float* vf, int64_t d, int64_t a, int64_t b) {
  int64_t c = 0;
  for (; c + 64 <= d; c += 64) weighted_rows<8>(o + c, p, vf + c, d, a, b);
  switch ((d - c) / 8) {
    case 1: return weighted_rows<1>(o + c, p, vf + c, d, a, b);
    case 2: return weighted_rows<2>(o + c, p, vf + c, d, a, b);
    case 3: return weighted_rows<3>(o + c, p, vf + c, d, a, b);
    case 4: return weighted_rows<4>(o + c, p, vf + c, d, a, b);
    case 5: return weighted_rows<5>(o + c, p, vf + c, d, a, b);
    case 6: return weighted_rows<6>(o + c, p, vf + c, d, a, b);
    case 7: return weighted_rows<7>(o + c, p, vf + c, d, a, b);
    default: return;
  }
}

// Rows of the pool at the given slots, widened to fp32: out[j] = pool[slots[j]] for j < n.
template <Elem E>
void rows_to_fp32(const char* pool, int64_t slot_stride_bytes, const int64_t* slots, int64_t n, int64_t d, float* out) {
  for (int64_t j = 0; j < n; ++j) {
    const char* row = pool + slots[j] * slot_stride_bytes;
    for (int64_t c = 0; c < d; c += 8) _mm256_storeu_ps(out + j * d + c, load8<E>(row + c * elem_size<E>()));
  }
}

template <Elem E>
void run(const PagedAttentionArgs& a, int64_t g, int64_t r0, int64_t r1, int64_t k0, int64_t len) {
  constexpr int64_t es = elem_size<E>();
  const int64_t d = a.head_dim, rep = a.heads / a.kv_heads, nq = (r1 - r0) * rep;
  // Scratch per thread, grown to the largest task it met.
  thread_local std::vector<float> qf, acc, kf, vf, p, m, l;
  thread_local std::vector<int64_t> lo, hi;
  qf.resize(nq * d), acc.assign(nq * d, 0.0f), kf.resize(kBlock * d), vf.resize(kBlock * d), p.resize(nq * kBlock);
  m.assign(nq, -std::numeric_limits<float>::infinity()), l.assign(nq, 0.0f), lo.resize(nq), hi.resize(nq);

  // Query qi is (row r0 + qi / rep, head g * rep + qi % rep), in fp32 times the scale; it sees keys [lo, hi].
  int64_t first = len, end = 0;
  for (int64_t qi = 0; qi < nq; ++qi) {
    const int64_t r = r0 + qi / rep, h = g * rep + qi % rep;
    const char* src = static_cast<const char*>(a.q) + (h * a.q_head_stride + r * a.q_row_stride) * es;
    const __m256 scale = _mm256_set1_ps(a.scale);
    for (int64_t c = 0; c < d; c += 8) _mm256_storeu_ps(&qf[qi * d + c], _mm256_mul_ps(scale, load8<E>(src + c * es)));
    const int64_t pos = a.positions[r];
    hi[qi] = std::min(pos, len - 1);
    lo[qi] = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
    first = std::min(first, lo[qi]);
    end = std::max(end, hi[qi] + 1);
  }

  const char* kbase = static_cast<const char*>(a.k) + g * a.k_head_stride * es;
  const char* vbase = static_cast<const char*>(a.v) + g * a.v_head_stride * es;
  for (int64_t j0 = first; j0 < end; j0 += kBlock) {
    const int64_t n = std::min(kBlock, end - j0);
    // The next block's rows are requested now, while this one is computed: a sequence's blocks lie anywhere in the
    // pool (2 KB runs at head_dim 64), where the hardware's prefetchers do not follow.
    const int64_t next = std::min(kBlock, end - j0 - n);
    for (int64_t jj = 0; jj < next; ++jj) {
      const int64_t slot = a.key_slots[k0 + j0 + n + jj];
      for (int64_t off = 0; off < d * es; off += 64) {
        _mm_prefetch(kbase + slot * a.k_slot_stride * es + off, _MM_HINT_T0);
        _mm_prefetch(vbase + slot * a.v_slot_stride * es + off, _MM_HINT_T0);
      }
    }
    rows_to_fp32<E>(kbase, a.k_slot_stride * es, a.key_slots + k0 + j0, n, d, kf.data());
    rows_to_fp32<E>(vbase, a.v_slot_stride * es, a.key_slots + k0 + j0, n, d, vf.data());
    for (int64_t qi = 0; qi < nq; ++qi) {
      const int64_t b0 = std::max(lo[qi], j0) - j0, b1 = std::min(hi[qi] + 1, j0 + n) - j0;  // visible keys of the block
      if (b0 >= b1) continue;
      float* s = &p[qi * kBlock];
      dots(&qf[qi * d], kf.data(), d, b0, b1, s);
      if (a.softcap > 0) {
        for (int64_t j = b0; j < b1; ++j) s[j] = a.softcap * std::tanh(s[j] / a.softcap);
      }
      float block_max = max_of(s, b0, b1);
      // Online softmax: the running sum and output rescaled to the new max.
      const float m_new = std::max(m[qi], block_max), correction = std::exp(m[qi] - m_new);
      float* o = &acc[qi * d];
      if (correction != 1.0f) {
        const __m256 cv = _mm256_set1_ps(correction);
        for (int64_t c = 0; c < d; c += 8) _mm256_storeu_ps(o + c, _mm256_mul_ps(cv, _mm256_loadu_ps(o + c)));
      }
      float sum = 0.0f;
      int64_t j = b0;
      const __m256 mv = _mm256_set1_ps(m_new);
      __m256 sv = _mm256_setzero_ps();
      for (; j + 8 <= b1; j += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
        _mm256_storeu_ps(s + j, e);
        sv = _mm256_add_ps(sv, e);
      }
      sum = hsum(sv);
      for (; j < b1; ++j) sum += (s[j] = std::exp(s[j] - m_new));
      l[qi] = l[qi] * correction + sum;
      m[qi] = m_new;
      accumulate(o, s, vf.data(), d, b0, b1);  // o += sum_j s[j] v[j]
    }
  }
  for (int64_t qi = 0; qi < nq; ++qi) {
    const int64_t r = r0 + qi / rep, h = g * rep + qi % rep;
    char* dst = static_cast<char*>(a.out) + (h * a.out_head_stride + r * a.out_row_stride) * es;
    const __m256 inv = _mm256_set1_ps(1.0f / l[qi]);  // l >= 1: a query always sees its own key
    for (int64_t c = 0; c < d; c += 8) store8<E>(dst + c * es, _mm256_mul_ps(inv, _mm256_loadu_ps(&acc[qi * d + c])));
  }
}

}  // namespace

void paged_attention_avx2(const PagedAttentionArgs& a, int64_t g, int64_t r0, int64_t r1, int64_t k0, int64_t len) {
  switch (a.elem) {
    case Elem::f32: return run<Elem::f32>(a, g, r0, r1, k0, len);
    case Elem::bf16: return run<Elem::bf16>(a, g, r0, r1, k0, len);
    case Elem::f16: return run<Elem::f16>(a, g, r0, r1, k0, len);
  }
}

}  // namespace inference::detail
