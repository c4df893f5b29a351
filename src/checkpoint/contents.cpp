#include "checkpoint/contents.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/core/error.h"

namespace fs = std::filesystem;

namespace dtensor::checkpoint::detail {
namespace {

[[noreturn]] void fail(const std::string& dir, const std::string& what) {
  throw DTENSOR_ERROR("dtensor: checkpoint: ", dir, ": ", what);
}

std::string hex32(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof(buf), "%08x", v);
  return buf;
}

// Our index: {"metadata": {...}, "weight_map": {...}, "dtensor_checkpoint": {"format_version": 1,
// "files": {name: {"size": n, "crc32": "hex"}}, "tensors": {name: {"dtype": "F32", "shape": [..]}}}}.
struct OurIndex {
  std::map<std::string, std::pair<int64_t, std::string>> files;  // name -> (size, crc32 hex)
  std::map<std::string, std::pair<std::string, std::vector<int64_t>>> tensors;
};

std::optional<OurIndex> read_our_index(const std::string& dir) {
  const fs::path path = fs::path(dir) / kIndexFile;
  if (!fs::exists(path)) return std::nullopt;
  std::ifstream in(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    fail(dir, std::string(kIndexFile) + " is not JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains(kOurIndexKey)) return std::nullopt;  // a Hugging Face index: no checks to make
  const auto& ours = j[kOurIndexKey];
  try {
    const int version = ours.at("format_version").get<int>();
    if (version != kFormatVersion) {
      fail(dir, "unknown checkpoint format version " + std::to_string(version) + " (this library reads version " +
                    std::to_string(kFormatVersion) + ")");
    }
    OurIndex index;
    for (const auto& [name, f] : ours.at("files").items()) {
      index.files[name] = {f.at("size").get<int64_t>(), f.at("crc32").get<std::string>()};
    }
    for (const auto& [name, t] : ours.at("tensors").items()) {
      index.tensors[name] = {t.at("dtype").get<std::string>(), t.at("shape").get<std::vector<int64_t>>()};
    }
    return index;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail(dir, std::string(kIndexFile) + ": malformed \"" + kOurIndexKey + "\": " + e.what());
  }
}

// The distinct files of a Hugging Face index's weight_map, sorted; empty without such an index.
std::vector<std::string> hf_weight_map_files(const std::string& dir) {
  const fs::path path = fs::path(dir) / kIndexFile;
  if (!fs::exists(path)) return {};
  std::ifstream in(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    fail(dir, std::string(kIndexFile) + " is not JSON: " + e.what());
  }
  std::vector<std::string> files;
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) return files;
  for (const auto& [_, file] : j["weight_map"].items()) {
    if (file.is_string()) files.push_back(file.get<std::string>());
  }
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  return files;
}

}  // namespace

std::string shard_file_name(int rank) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "shard-%05d-model-00001-of-00001.safetensors", rank + 1);
  return buf;
}

Contents read_contents(const std::string& dir, int checksum_offset, int checksum_stride) {
  if (!fs::is_directory(dir)) fail(dir, "no such checkpoint directory");
  const std::string base = fs::path(dir).lexically_normal().filename().string();
  if (base.size() > 9 && base[0] == '.' && base.compare(base.size() - 8, 8, ".partial") == 0) {
    fail(dir, "the staging directory of an unfinished save, not a checkpoint");
  }
  Contents c;
  c.dir = dir;
  const std::optional<OurIndex> index = read_our_index(dir);
  c.has_our_index = index.has_value();

  // The files: the index's list when we wrote it (each present, of its size), else every .safetensors file
  // (as PyTorch's HuggingFaceStorageReader takes them).
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  if (index) {
    for (const auto& [name, rec] : index->files) {
      if (!std::binary_search(names.begin(), names.end(), name)) fail(dir, "missing file " + name + " (listed in the index)");
      const auto size = static_cast<int64_t>(fs::file_size(fs::path(dir) / name));
      if (size != rec.first) {
        fail(dir, "file " + name + " has " + std::to_string(size) + " bytes, the index says " + std::to_string(rec.first) +
                      (size < rec.first ? " (truncated)" : ""));
      }
    }
    for (const auto& n : names) {
      if (!index->files.count(n)) fail(dir, "file " + n + " is not in the index (a stray file would be read by PyTorch)");
    }
  }
  if (!index) {
    // A Hugging Face sharded model: its index's weight_map names the files (other .safetensors files in the
    // directory are not part of the model).
    const std::vector<std::string> listed = hf_weight_map_files(dir);
    for (const auto& n : listed) {
      if (!std::binary_search(names.begin(), names.end(), n)) fail(dir, "missing file " + n + " (listed in the index's weight_map)");
    }
    if (!listed.empty()) names = listed;
  }
  if (names.empty()) fail(dir, "no .safetensors files");
  c.files.reserve(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    c.files.push_back(SafetensorsFile::open((fs::path(dir) / names[i]).string()));
    const SafetensorsFile& f = c.files.back();
    if (index && checksum_stride > 0 && static_cast<int>(i % static_cast<size_t>(checksum_stride)) == checksum_offset) {
      const std::string crc = hex32(f.crc32());
      if (crc != index->files.at(names[i]).second) {
        fail(dir, "checksum mismatch in " + names[i] + ": CRC-32 " + crc + ", the index says " + index->files.at(names[i]).second);
      }
    }
    const auto& md = f.metadata();
    if (auto v = md.find(kDcpVersionKey); v != md.end() && v->second != kDcpVersion) {
      fail(dir, names[i] + ": unknown DCP_VERSION " + v->second + " (this library reads " + kDcpVersion + ")");
    }
    nlohmann::json sharding;
    if (auto s = md.find(kShardingInfoKey); s != md.end()) {
      try {
        sharding = nlohmann::json::parse(s->second);
      } catch (const std::exception& e) {
        fail(dir, names[i] + ": DCP_SHARDING_INFO is not JSON: " + e.what());
      }
    }
    for (const StoredTensor& t : f.tensors()) {
      SavedChunk chunk{&f, &t, Box{std::vector<int64_t>(t.info.shape.size(), 0), t.info.shape}};
      if (!sharding.is_null()) {
        try {
          chunk.box.offsets = sharding.at(t.info.name).at(kSavedOffsetsKey).get<std::vector<int64_t>>();
        } catch (const std::exception& e) {
          fail(dir, names[i] + ": no saved_offsets for '" + t.info.name + "'");
        }
        if (chunk.box.offsets.size() != t.info.shape.size()) fail(dir, names[i] + ": saved_offsets of '" + t.info.name + "' have the wrong rank");
      }
      SavedEntry& e = c.entries[t.info.name];
      if (e.chunks.empty()) {
        e.dtype = t.info.dtype;
        e.shape = std::vector<int64_t>(t.info.shape.size(), 0);
      } else if (e.dtype != t.info.dtype || e.shape.size() != t.info.shape.size()) {
        fail(dir, "chunks of '" + t.info.name + "' disagree on dtype or rank");
      }
      // The global shape: the index's, else the extent of the chunks (as PyTorch's reader infers it).
      for (size_t d = 0; d < e.shape.size(); ++d) e.shape[d] = std::max(e.shape[d], chunk.box.offsets[d] + chunk.box.sizes[d]);
      e.chunks.push_back(std::move(chunk));
    }
  }
  if (index) {
    for (auto& [name, e] : c.entries) {
      auto it = index->tensors.find(name);
      if (it == index->tensors.end()) fail(dir, "tensor '" + name + "' is in the files but not in the index");
      if (scalar_type_from_safetensors(it->second.first) != e.dtype) fail(dir, "tensor '" + name + "': dtype differs from the index");
      for (size_t d = 0; d < e.shape.size() && d < it->second.second.size(); ++d) {
        if (e.shape[d] > it->second.second[d]) fail(dir, "tensor '" + name + "': a chunk lies outside the index's shape");
      }
      e.shape = it->second.second;
    }
    for (const auto& [name, t] : index->tensors) {
      if (c.entries.count(name)) continue;
      int64_t numel = 1;
      for (int64_t s : t.second) numel *= s;
      if (numel != 0) fail(dir, "tensor '" + name + "' is in the index but in no file");
      c.entries[name] = SavedEntry{scalar_type_from_safetensors(t.first), t.second, {}};  // empty: nothing stored
    }
  }
  return c;
}

}  // namespace dtensor::checkpoint::detail
