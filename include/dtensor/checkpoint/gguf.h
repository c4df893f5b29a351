// GGUF, ggml's one-file model format (what llama.cpp's convert_hf_to_gguf and llama-quantize write), read through a
// memory map. Version 2 and 3, little-endian:
//
//   "GGUF" u32 version  u64 n_tensors  u64 n_kv
//   n_kv      x  (string key, u32 value type, value)          general.architecture, llama.block_count, tokenizer.ggml.*
//   n_tensors x  (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset)
//   padding to general.alignment (32 when absent), then the data: each tensor at its offset from there
//
// A string is a u64 length and its bytes; an array is a u32 element type, a u64 count and the elements. ne[0] is the
// innermost dimension: the torch shape is ne reversed. A quantized type stores blocks of ne[0]'s elements (32 for
// Q8_0 / Q4_0, 256 for the K-quants), each with its scales; dequantize() gives the values as ggml's dequantize_row_*
// computes them (in fp32, then the requested dtype), which is what the `gguf` package and transformers' GGUF loading
// give.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dtensor::checkpoint {

// ggml's type ids (ggml.h's enum ggml_type) of the types dequantize() reads; any other id is refused by its name.
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q8_0 = 8,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  BF16 = 30,
};
// ggml's name of a type id ("Q4_K", "IQ2_XS", ...; "type 123" for an id ggml does not have).
std::string ggml_type_name(uint32_t type);
// Whether dequantize() reads the type.
bool ggml_type_supported(uint32_t type);

// One metadata value. Integers (any width, signed or not) are in `integer`, floats in `number`.
struct GgufValue {
  enum class Type : uint32_t { u8, i8, u16, i16, u32, i32, f32, boolean, string, array, u64, i64, f64 };
  Type type = Type::u32;
  int64_t integer = 0;
  double number = 0;
  bool boolean = false;
  std::string string;
  Type element_type = Type::u32;  // array
  std::vector<GgufValue> array;
};

struct GgufTensor {
  std::string name;
  uint32_t type = 0;            // GgmlType, or an id dequantize() refuses
  std::vector<int64_t> shape;   // torch order (ne reversed)
  int64_t offset = 0;           // from the start of the file
  int64_t nbytes = 0;
  int64_t numel() const;
};

// A read-only GGUF file. open() reads the header and the tensor infos and checks them (magic, version, every value
// type known, every tensor's bytes inside the file and of the size its type and shape say, no name twice); the data
// stays on disk until a tensor is read.
class GgufFile {
 public:
  static GgufFile open(const std::string& path);  // throws dtensor::Error naming the file and the fault

  const std::string& path() const;
  uint32_t version() const;
  const std::map<std::string, GgufValue>& metadata() const;
  const GgufValue* find_metadata(const std::string& key) const;  // nullptr if absent
  // Typed metadata: absent or of another kind throws dtensor::Error naming the file and the key.
  int64_t integer(const std::string& key) const;
  double number(const std::string& key) const;  // a float, or an integer
  const std::string& string(const std::string& key) const;
  const std::vector<GgufValue>& array(const std::string& key) const;

  const std::vector<GgufTensor>& tensors() const;  // in the file's order
  const GgufTensor* find(const std::string& name) const;  // nullptr if absent

  // The tensor's values in `dtype`, in its torch shape (a fresh CPU tensor); with a range, only indices
  // [begin, end) of dim 0 (a TP rank's rows: the others are never read). Throws for a type it does not read, naming
  // the tensor, its type and the types there are.
  at::Tensor dequantize(const GgufTensor& tensor, at::ScalarType dtype) const;
  at::Tensor dequantize(const GgufTensor& tensor, at::ScalarType dtype, int64_t begin, int64_t end) const;
  // The stored bytes (no copy, over the private mapping), a uint8 tensor of tensor.nbytes.
  at::Tensor raw(const GgufTensor& tensor) const;
  // A 2-D Q4_0 tensor's rows [begin, end) as its stored parts, bit for bit (fresh tensors): the 4-bit values
  // [rows, K / 2] uint8, each block's 16 bytes as stored (byte j: value j in the low nibble, j + 16 in the high one),
  // and the blocks' scales d [rows, K / 32] fp16; a value v means (v - 8) * d. Throws for another type or shape.
  std::pair<at::Tensor, at::Tensor> q4_0_parts(const GgufTensor& tensor, int64_t begin, int64_t end) const;
  // Drops the pages of the tensor's bytes that this process read from the mapping (madvise DONTNEED; read again
  // from the file if touched): once a tensor is copied out, its file pages no longer count in the process's RSS. Only
  // for bytes nothing aliases (every read above returns fresh tensors; raw()'s view must be dead).
  void release(const GgufTensor& tensor) const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// ggml's dequantize_row_*: `n` values (a multiple of the type's block size) from `blocks` into `out`, in fp32. The
// naive reference of every type dequantize() reads (there is no other path).
void dequantize_row(uint32_t type, const uint8_t* blocks, float* out, int64_t n);
// Elements per block and bytes per block of a type (1 and the element size for F32 / F16 / BF16).
int64_t ggml_block_size(uint32_t type);
int64_t ggml_block_bytes(uint32_t type);

}  // namespace dtensor::checkpoint
