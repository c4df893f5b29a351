// The safetensors file format (huggingface/safetensors), read through a memory map and written in one pass.
//
//   [8 bytes: header length n, little-endian u64][n bytes: JSON header, space-padded to 8][data]
//   header = {"__metadata__": {str: str}, "<name>": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ..}
//
// data_offsets are byte offsets into the data section; tensors are row-major, little-endian. PyTorch's
// distributed checkpoint (torch.distributed.checkpoint.HuggingFaceStorageWriter) stores each tensor's shard
// offsets in __metadata__["DCP_SHARDING_INFO"] (see checkpoint.h); this file knows nothing of that.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dtensor::checkpoint {

// "F32", "BF16", ... <-> at::ScalarType (the dtypes PyTorch's _hf_utils.DTYPE_MAP knows, plus BOOL).
std::string safetensors_dtype(at::ScalarType dtype);  // throws dtensor::Error for others
at::ScalarType scalar_type_from_safetensors(const std::string& name);  // throws dtensor::Error

struct TensorInfo {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  int64_t nbytes() const;
};

// A tensor's place in an open file: byte range [begin, end) of the data section.
struct StoredTensor {
  TensorInfo info;
  int64_t begin = 0, end = 0;
};

// A read-only safetensors file. open() reads and checks only the header (JSON well-formed, every dtype known,
// every byte range inside the file and of the size its shape says); the data stays on disk and is paged in by
// the memory map when a view is read.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);  // throws dtensor::Error naming the file and the fault

  const std::string& path() const;
  int64_t file_size() const;
  const std::vector<StoredTensor>& tensors() const;      // in data order
  const StoredTensor* find(const std::string& name) const;  // nullptr if absent
  const std::map<std::string, std::string>& metadata() const;  // __metadata__ ({} if absent)

  // The stored tensor as a CPU tensor over the mapping (no copy). The mapping is private: a write copies the page,
  // the file never changes. It keeps the mapping alive.
  at::Tensor view(const StoredTensor& stored) const;
  // Gives back this process's resident pages of the mapping under `stored` (madvise MADV_DONTNEED on the private
  // mapping: the page cache keeps them, a later read faults them in again; call it only where nothing was written), so that a rank that has copied
  // its slices out does not keep the file resident beside them. Views stay valid.
  void release_pages(const StoredTensor& stored) const;
  // CRC-32 (zlib's, as Python's zlib.crc32) of the whole file, read through the mapping.
  uint32_t crc32() const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// Writes one file in a single pass: the header from `layout` first, then each tensor in layout order.
// Peak memory is the caller's one tensor at a time (save_hf_llama streams gathered weights through it).
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, std::vector<TensorInfo> layout,
                    const std::map<std::string, std::string>& metadata);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next tensor of the layout (its dtype and shape must match; any strides, CPU).
  void write(const at::Tensor& tensor);
  struct Result {
    int64_t size = 0;     // bytes of the file
    uint32_t crc32 = 0;   // of the whole file
  };
  // Checks that every tensor was written, flushes, fsyncs (when `sync`) and closes.
  Result finish(bool sync = true);

 private:
  void write_bytes(const void* data, int64_t n);
  std::string path_;
  std::vector<TensorInfo> layout_;
  size_t next_ = 0;
  int fd_ = -1;
  int64_t written_ = 0;
  uint32_t crc_ = 0;
};

// zlib's CRC-32 (crc32_z), continued from `crc` (0 to start): Python's zlib.crc32 gives the same value.
uint32_t crc32_update(uint32_t crc, const void* data, size_t n);

}  // namespace dtensor::checkpoint
