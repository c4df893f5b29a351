// Distributed checkpoints that reshard (PyTorch's torch.distributed.checkpoint with its Hugging Face storage).
//
//   dtensor::checkpoint::StateDict state = dtensor::checkpoint::module_state_dict(*model);
//   dtensor::checkpoint::save("ckpt/step-100", state);   // collective: every rank of the world calls it
//   ...                                                  // later, at any TP degree and any placements:
//   dtensor::checkpoint::load("ckpt/step-100", state);   // each rank reads only the chunks its shards overlap
//
// On disk (docs/design/checkpoint.md): the layout of torch.distributed.checkpoint's HuggingFaceStorageWriter
// with save_distributed=True: one safetensors file per writing rank, "shard-0000{r+1}-model-00001-of-00001
// .safetensors", holding that rank's shard of each tensor under the tensor's name, with the shard's global
// offsets in the file's __metadata__["DCP_SHARDING_INFO"]; plus "model.safetensors.index.json", whose extra
// "dtensor_checkpoint" key holds our format version, each file's size and CRC-32, and each tensor's global
// shape and dtype. PyTorch's HuggingFaceStorageReader loads it (it reads only the .safetensors files), and
// load() reads PyTorch's (without an index there is no checksum to verify).
//
// Which tensors: a DTensor with any placements on any mesh (Partial is reduced first: the stored value is the
// DTensor's value), or a plain tensor, taken to be the same on every rank. Every replica is written by one
// rank only. Optimizer step counts are 0-d tensors, as PyTorch's AdamW keeps them.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

namespace dtensor::checkpoint {

// Name -> tensor, in name order. load() writes into the tensors in place (their local shards for DTensors).
using StateDict = std::map<std::string, at::Tensor>;

// The format version this library writes and reads (index key "dtensor_checkpoint"."format_version").
inline constexpr int kFormatVersion = 1;
inline constexpr const char* kIndexFile = "model.safetensors.index.json";

struct SaveOptions {
  bool sync = true;  // fsync files and directories (off only for benchmarks of the write itself)
  // Ranks hold different entries (pipeline stages: each its own layers, as PyTorch's DCP takes them): the checkpoint
  // is the union; an entry held by several ranks must have one dtype and shape, and a plain one is written by the
  // lowest rank holding it. Off: every rank must hold the same entries (a difference is an error naming it).
  bool entries_may_differ = false;
};

// Saves `state` into `dir`, atomically: written into "<parent>/.<name>.partial", files fsynced, the index
// written last, then renamed into place (replacing a previous `dir` in one atomic exchange). Collective over
// the world (every rank calls it with the same names, shapes and dtypes, unless options.entries_may_differ; plain
// tensors alone need no world).
// Any rank's error is thrown on every rank, and `dir` is left as it was.
void save(const std::string& dir, const StateDict& state, const SaveOptions& options = {});

struct LoadOptions {
  // Checkpoint entries absent from `state` are an error naming them, as are entries of `state` absent from the
  // checkpoint (always), unless they are named here: exact names, or prefixes written with a trailing '*'
  // ("state.*": a model-only load from a training checkpoint; "lm_head.weight": a tied head stored anyway).
  std::vector<std::string> allow_unused_names = {};
  // Every checkpoint entry absent from `state` is ignored (prefer allow_unused_names: it ignores only what it names).
  bool allow_unused = false;
  // The stored dtype may differ from the state's: values are converted (HF bf16 weights into an fp32 model).
  bool allow_dtype_cast = false;
  // Verify each file's CRC-32 against the index (each file is read once across the job, files split among
  // ranks). Sizes are always checked.
  bool verify_checksums = true;
  // A tensor whose part on this rank is one contiguous byte range of one file, stored in its own dtype, takes that
  // range of the file's private mapping as its storage instead of a copy (transformers' and llama.cpp's mmap
  // loading): nothing is copied or zeroed, pages are read on first use from the page cache, which ranks on one host
  // share. A write copies the page (MAP_PRIVATE): the file never changes. The mapping lives while a tensor uses it.
  // Other parts (a Shard(1) slice, a dtype cast, pieces of several chunks) are copied as without it.
  bool map_in_place = false;
};

// Loads `dir` into `state`, resharding: each rank computes which saved chunks overlap the shards it holds
// under the state's placements and copies only those byte ranges out of memory-mapped files. Collective over
// the world. Everything is checked first (index, file sizes and checksums, format version, names, shapes,
// dtypes, coverage); any fault gives one dtensor::Error on every rank and leaves `state` untouched.
void load(const std::string& dir, StateDict& state, const LoadOptions& options = {});

// True when `dir` holds a committed checkpoint of ours (its index names our format; staging directories never
// do).
bool is_checkpoint(const std::string& dir);

}  // namespace dtensor::checkpoint
