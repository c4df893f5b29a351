// What a checkpoint directory holds, read and checked before anything is loaded: every file's header, the
// chunks of each tensor (global offsets from DCP_SHARDING_INFO, or 0 for plain Hugging Face files) and, when
// our index is there, the agreement of the files with it (format version, sizes, CRC-32).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "checkpoint/chunks.h"
#include "dtensor/checkpoint/safetensors.h"

namespace dtensor::checkpoint::detail {

// PyTorch's names (torch/distributed/checkpoint/_hf_utils.py).
inline constexpr const char* kShardingInfoKey = "DCP_SHARDING_INFO";
inline constexpr const char* kSavedOffsetsKey = "saved_offsets";
inline constexpr const char* kDcpVersionKey = "DCP_VERSION";
inline constexpr const char* kDcpVersion = "1.0";
// Ours, inside model.safetensors.index.json.
inline constexpr const char* kOurIndexKey = "dtensor_checkpoint";

// "shard-00003-model-00001-of-00001.safetensors" for rank 2 (HuggingFaceStorageWriter's name with
// save_distributed: shard index = rank + 1).
std::string shard_file_name(int rank);

struct SavedChunk {
  const SafetensorsFile* file = nullptr;
  const StoredTensor* stored = nullptr;
  Box box;
};
struct SavedEntry {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  std::vector<SavedChunk> chunks;
};

struct Contents {
  std::string dir;
  bool has_our_index = false;
  std::vector<SafetensorsFile> files;  // stable addresses: reserved before filling
  std::map<std::string, SavedEntry> entries;
};

// Reads `dir`. Checksums the files whose position i (in name order) has i % stride == offset (stride 0:
// none). Throws dtensor::Error naming the first fault: missing index entry or file, size, checksum, version,
// malformed header or sharding info, chunks that disagree on dtype or overlap past the index's shape.
Contents read_contents(const std::string& dir, int checksum_offset, int checksum_stride);

}  // namespace dtensor::checkpoint::detail
