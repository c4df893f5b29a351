// ggml's block formats (ggml-common.h's block_* structs) and their dequantization (ggml-quants.c's
// dequantize_row_*), one row at a time in fp32. The layouts, per block of QK values (little-endian, fp16 scales):
//
//   Q8_0  (32)  d, int8 q[32]                          x = d q
//   Q4_0  (32)  d, u8 qs[16]                           x_j = d (lo4(qs_j) - 8), x_{j+16} = d (hi4(qs_j) - 8)
//   Q4_1  (32)  d, m, u8 qs[16]                        x = d q + m, q as Q4_0's without the -8
//   Q5_0  (32)  d, u32 qh, u8 qs[16]                   Q4_0's nibbles with bit 4 from qh (bit j, bit j+16), - 16
//   Q4_K (256)  d, dmin, u8 scales[12], u8 qs[128]     8 groups of 32: x = d sc_g q - dmin m_g, 6-bit sc/m packed
//   Q5_K (256)  d, dmin, scales[12], u8 qh[32], qs[128] Q4_K with bit 4 of each q from qh
//   Q6_K (256)  u8 ql[128], u8 qh[64], int8 sc[16], d  16 groups of 16: x = d sc_g (q - 32), q 6 bits (4 in ql, 2 in qh)
#include <c10/util/Half.h>

#include <cstring>

#include "dtensor/checkpoint/gguf.h"
#include "dtensor/core/error.h"

namespace dtensor::checkpoint {
namespace {

float half(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// Q4_K / Q5_K: the 6-bit scale and min of group j (0..7) from the 12 packed bytes.
void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void q8_0(const uint8_t* b, float* y) {
  const float d = half(b);
  const auto* q = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = d * q[j];
}

void q4_0(const uint8_t* b, float* y) {
  const float d = half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * ((qs[j] & 0xF) - 8);
    y[j + 16] = d * ((qs[j] >> 4) - 8);
  }
}

void q4_1(const uint8_t* b, float* y) {
  const float d = half(b), m = half(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * (qs[j] & 0xF) + m;
    y[j + 16] = d * (qs[j] >> 4) + m;
  }
}

void q5_0(const uint8_t* b, float* y) {
  const float d = half(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int hi0 = ((qh >> j) << 4) & 0x10, hi1 = (qh >> (j + 12)) & 0x10;
    y[j] = d * (((qs[j] & 0xF) | hi0) - 16);
    y[j + 16] = d * (((qs[j] >> 4) | hi1) - 16);
  }
}

void q4_k(const uint8_t* b, float* y) {
  const float d = half(b), dmin = half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (int g = 0; g < 8; g += 2, q += 32, y += 64) {
    uint8_t sc, m;
    scale_min_k4(g, scales, sc, m);
    const float d1 = d * sc, m1 = dmin * m;
    scale_min_k4(g + 1, scales, sc, m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) y[l] = d1 * (q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) y[l + 32] = d2 * (q[l] >> 4) - m2;
  }
}

void q5_k(const uint8_t* b, float* y) {
  const float d = half(b), dmin = half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  uint8_t u1 = 1, u2 = 2;
  for (int g = 0; g < 8; g += 2, ql += 32, y += 64, u1 <<= 2, u2 <<= 2) {
    uint8_t sc, m;
    scale_min_k4(g, scales, sc, m);
    const float d1 = d * sc, m1 = dmin * m;
    scale_min_k4(g + 1, scales, sc, m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) y[l] = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) y[l + 32] = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
  }
}

void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half(b + 208);
  for (int n = 0; n < 256; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * sc[is] * q1;
      y[l + 32] = d * sc[is + 2] * q2;
      y[l + 64] = d * sc[is + 4] * q3;
      y[l + 96] = d * sc[is + 6] * q4;
    }
  }
}

struct TypeInfo {
  uint32_t id;
  const char* name;
  int64_t block, bytes;
  void (*dequantize)(const uint8_t*, float*);
};

// The sizes are GGML_QUANT_SIZES (gguf-py's table, ggml's type_traits), so that every tensor's byte range is
// checked; a type without a dequantize function is refused by name when read.
const TypeInfo kTypes[] = {
    {0, "F32", 1, 4, nullptr}, {1, "F16", 1, 2, nullptr}, {2, "Q4_0", 32, 18, q4_0}, {3, "Q4_1", 32, 20, q4_1},
    {6, "Q5_0", 32, 22, q5_0}, {7, "Q5_1", 32, 24, nullptr}, {8, "Q8_0", 32, 34, q8_0}, {9, "Q8_1", 32, 40, nullptr},
    {10, "Q2_K", 256, 84, nullptr}, {11, "Q3_K", 256, 110, nullptr}, {12, "Q4_K", 256, 144, q4_k},
    {13, "Q5_K", 256, 176, q5_k}, {14, "Q6_K", 256, 210, q6_k}, {15, "Q8_K", 256, 292, nullptr},
    {16, "IQ2_XXS", 256, 66, nullptr}, {17, "IQ2_XS", 256, 74, nullptr}, {18, "IQ3_XXS", 256, 98, nullptr},
    {19, "IQ1_S", 256, 50, nullptr}, {20, "IQ4_NL", 32, 18, nullptr}, {21, "IQ3_S", 256, 110, nullptr},
    {22, "IQ2_S", 256, 82, nullptr}, {23, "IQ4_XS", 256, 136, nullptr}, {24, "I8", 1, 1, nullptr},
    {25, "I16", 1, 2, nullptr}, {26, "I32", 1, 4, nullptr}, {27, "I64", 1, 8, nullptr}, {28, "F64", 1, 8, nullptr},
    {29, "IQ1_M", 256, 56, nullptr}, {30, "BF16", 1, 2, nullptr}, {34, "TQ1_0", 256, 54, nullptr},
    {35, "TQ2_0", 256, 66, nullptr}, {39, "MXFP4", 32, 17, nullptr}, {40, "NVFP4", 64, 36, nullptr},
    {41, "Q1_0", 128, 18, nullptr},
};

const TypeInfo* info(uint32_t type) {
  for (const auto& t : kTypes) {
    if (t.id == type) return &t;
  }
  return nullptr;
}

}  // namespace

std::string ggml_type_name(uint32_t type) {
  const TypeInfo* t = info(type);
  return t ? t->name : "type " + std::to_string(type);
}

bool ggml_type_supported(uint32_t type) {
  const TypeInfo* t = info(type);
  return t != nullptr && (t->dequantize != nullptr || type == 0 || type == 1 || type == 30);
}

int64_t ggml_block_size(uint32_t type) {
  const TypeInfo* t = info(type);
  return t ? t->block : 0;
}

int64_t ggml_block_bytes(uint32_t type) {
  const TypeInfo* t = info(type);
  return t ? t->bytes : 0;
}

void dequantize_row(uint32_t type, const uint8_t* blocks, float* out, int64_t n) {
  const TypeInfo* t = info(type);
  DTENSOR_CHECK(t != nullptr && t->dequantize != nullptr, "dtensor: GGUF: no block dequantization for ",
                ggml_type_name(type));
  DTENSOR_CHECK(n % t->block == 0, "dtensor: GGUF: ", n, " values are not whole ", t->name, " blocks of ", t->block);
  for (int64_t i = 0; i < n / t->block; ++i) t->dequantize(blocks + i * t->bytes, out + i * t->block);
}

}  // namespace dtensor::checkpoint
