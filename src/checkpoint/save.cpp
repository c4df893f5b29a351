// save(): agree on the entries, reduce Partials, write each rank's chunks into the staging directory, then
// rank 0 writes the index (the metadata, last) and commits the directory. Between phases the ranks agree, so
// an error anywhere is thrown everywhere and nothing is committed.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "checkpoint/agreement.h"
#include "checkpoint/atomic_dir.h"
#include "checkpoint/chunks.h"
#include "checkpoint/contents.h"
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/mesh/watchdog.h"
#include "dtensor/checkpoint/safetensors.h"
#include "dtensor/core/error.h"
#include "dtensor/mesh/process_group.h"
#include "dtensor/api/dtensor_api.h"

namespace fs = std::filesystem;

namespace dtensor::checkpoint {
namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// One line per entry: what every rank must agree on before any collective pairs their tensors.
std::string signature(const StateDict& state) {
  std::string s;
  for (const auto& [name, t] : state) {
    s += name + " " + c10::toString(t.scalar_type()) + " " + shape_str(t.sizes().vec()) + "\n";
  }
  return s;
}

std::string first_line_difference(const std::string& a, const std::string& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  const size_t start = a.rfind('\n', i == 0 ? 0 : i - 1);
  const size_t from = (start == std::string::npos || i == 0) ? 0 : start + 1;
  return a.substr(from, a.find('\n', from) - from);
}

std::string hex32(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof(buf), "%08x", v);
  return buf;
}

std::string error_text(const std::exception& e) { return e.what(); }

}  // namespace

void save(const std::string& dir, const StateDict& state, const SaveOptions& options) {
  const watchdog::Phase phase("checkpoint save", std::chrono::minutes(30));  // the peers wait for the slowest writer
  const auto group_ptr = detail::checkpoint_group();
  ProcessGroup* group = group_ptr.get();
  const int rank = detail::group_rank(group);
  const int world = detail::group_size(group);

  // 1. The same entries everywhere (else the reductions below would pair different tensors); with entries that may
  // differ (pipeline stages, whose reductions stay within a stage's mesh), one dtype and shape per name.
  const std::string mine = signature(state);
  const auto all = detail::all_gather_strings(group, mine);
  std::map<std::string, std::pair<std::string, int>> seen;  // name -> (its line, the lowest rank holding it)
  for (int r = 0; r < world; ++r) {
    if (!options.entries_may_differ) {
      DTENSOR_CHECK(all[r] == all[0], "dtensor: checkpoint: save('", dir, "'): rank ", r,
                    "'s state differs from rank 0's near entry '", first_line_difference(all[r], all[0]), "'");
      continue;
    }
    std::stringstream lines(all[static_cast<size_t>(r)]);
    for (std::string line; std::getline(lines, line);) {
      const std::string name = line.substr(0, line.find(' '));
      const auto [it, fresh] = seen.emplace(name, std::make_pair(line, r));
      DTENSOR_CHECK(fresh || it->second.first == line, "dtensor: checkpoint: save('", dir, "'): rank ", r, " holds '",
                    line, "' where rank ", it->second.second, " holds '", it->second.first, "'");
    }
  }

  // 2. Values to store: a Partial DTensor is stored as its reduced value (Partial -> Replicate = all-reduce),
  // as PyTorch's DCP does.
  std::vector<std::pair<std::string, at::Tensor>> values;
  {
    at::NoGradGuard no_grad;
    for (const auto& [name, t] : state) {
      at::Tensor v = t.detach();
      if (is_dtensor(v)) {
        const Placements& p = placements(v);
        if (std::any_of(p.begin(), p.end(), [](const Placement& q) { return q.is_partial(); })) {
          v = redistribute(v, reduce_partials(p));
        }
      }
      values.emplace_back(name, v);
    }
  }

  // 3. This rank's chunks: one holder per distinct chunk writes it. writes_chunk picks one holder among the
  // ranks of the tensor's own mesh; ranks outside it may hold the same chunk too (a DTensor on the "tp" dim
  // under DDP: each dp replica holds it), so, as DCP's dedup_save_plans, a chunk some lower rank also offers
  // is left to that rank (one exchange of the chunk keys).
  std::vector<std::pair<size_t, detail::Held>> offered;
  nlohmann::json keys = nlohmann::json::array();
  for (size_t i = 0; i < values.size(); ++i) {
    const auto& [name, v] = values[i];
    // Entries that differ by rank: a plain tensor's holders all offer it, and the lowest keeps it (below).
    const bool offer = options.entries_may_differ && !is_dtensor(v) ? v.numel() > 0 : detail::writes_chunk(v, i, rank, world);
    if (!offer) continue;
    auto h = detail::held(v);
    keys.push_back(name + "@" + nlohmann::json(h->box.offsets).dump());
    offered.emplace_back(i, std::move(*h));
  }
  std::set<std::string> taken;  // keys a lower rank writes
  const std::vector<std::string> all_keys = detail::all_gather_strings(group, keys.dump());
  for (int r = 0; r < rank; ++r) {
    for (const auto& k : nlohmann::json::parse(all_keys[static_cast<size_t>(r)])) taken.insert(k.get<std::string>());
  }
  std::vector<TensorInfo> layout;
  std::vector<at::Tensor> data;
  nlohmann::json sharding = nlohmann::json::object();
  for (size_t j = 0; j < offered.size(); ++j) {
    const auto& [i, h] = offered[j];
    if (taken.contains(keys[j].get<std::string>())) continue;
    const auto& [name, v] = values[i];
    layout.push_back({name, v.scalar_type(), h.box.sizes});
    data.push_back(h.data);
    sharding[name] = {{detail::kSavedOffsetsKey, h.box.offsets}};
  }

  const std::string staging = detail::staging_dir_for(dir);
  std::string err;
  try {
    if (rank == 0) detail::make_empty_dir(staging);
  } catch (const std::exception& e) {
    err = error_text(e);
  }
  detail::agree_or_throw(group, err);

  // 4. Each rank writes and fsyncs its file; its record (file, size, CRC-32, chunks) goes to every rank.
  nlohmann::json record = nlohmann::json::object();
  try {
    if (!layout.empty()) {
      const std::string file = detail::shard_file_name(rank);
      SafetensorsWriter writer((fs::path(staging) / file).string(), layout,
                               {{detail::kShardingInfoKey, sharding.dump()}, {detail::kDcpVersionKey, detail::kDcpVersion}, {"format", "pt"}});
      int64_t bytes = 0;
      for (size_t i = 0; i < data.size(); ++i) {
        writer.write(data[i].cpu());  // a no-op for CPU tensors; CUDA chunks are copied to the host
        bytes += layout[i].nbytes();
      }
      const auto result = writer.finish(options.sync);
      // Test hook: DTENSOR_CHECKPOINT_KILL_RANK=r kills rank r here, after its file and before the index (the
      // atomicity tests: a killed save must leave the previous checkpoint whole).
      if (const char* kill_rank = std::getenv("DTENSOR_CHECKPOINT_KILL_RANK"); kill_rank && *kill_rank && std::atoi(kill_rank) == rank) {
        ::raise(SIGKILL);
      }
      record = {{"file", file}, {"size", result.size}, {"crc32", hex32(result.crc32)}, {"bytes", bytes}, {"chunks", sharding}};
    }
    // What rank 0 cannot see for itself when ranks hold different entries: each entry's global dtype and shape.
    if (options.entries_may_differ) {
      nlohmann::json held = nlohmann::json::object();
      for (const auto& [name, v] : values) held[name] = {{"dtype", safetensors_dtype(v.scalar_type())}, {"shape", v.sizes().vec()}};
      record["tensors"] = held;
    }
  } catch (const std::exception& e) {
    err = error_text(e);
  }
  std::vector<std::string> records;
  try {
    detail::agree_or_throw(group, err);
    records = detail::all_gather_strings(group, record.dump());
  } catch (...) {
    if (rank == 0) fs::remove_all(staging);
    throw;
  }

  // 5. Rank 0 writes the index last, then commits the directory.
  try {
    if (rank == 0) {
      nlohmann::json files = nlohmann::json::object(), weight_map = nlohmann::json::object(), tensors = nlohmann::json::object();
      int64_t total = 0;
      for (const auto& [name, v] : values) tensors[name] = {{"dtype", safetensors_dtype(v.scalar_type())}, {"shape", v.sizes().vec()}};
      for (const auto& text : records) {
        const auto r = nlohmann::json::parse(text);
        if (r.contains("tensors")) {
          for (const auto& [name, info] : r["tensors"].items()) tensors[name] = info;
        }
        if (!r.contains("file")) continue;
        files[r["file"].get<std::string>()] = {{"size", r["size"]}, {"crc32", r["crc32"]}};
        total += r["bytes"].get<int64_t>();
        for (const auto& [name, chunk] : r["chunks"].items()) {
          const auto offsets = chunk[detail::kSavedOffsetsKey].get<std::vector<int64_t>>();
          if (std::all_of(offsets.begin(), offsets.end(), [](int64_t o) { return o == 0; })) weight_map[name] = r["file"];
        }
      }
      nlohmann::json index = {
          {"metadata", {{"total_size", total}}},
          {"weight_map", weight_map},
          {detail::kOurIndexKey, {{"format_version", kFormatVersion}, {"files", files}, {"tensors", tensors}}}};
      const std::string index_path = (fs::path(staging) / kIndexFile).string();
      if (options.sync) {
        detail::write_file_synced(index_path, index.dump(1));
        detail::commit_dir(staging, dir);
      } else {
        std::ofstream(index_path) << index.dump(1);
        detail::commit_dir(staging, dir);
      }
    }
  } catch (const std::exception& e) {
    err = error_text(e);
  }
  detail::agree_or_throw(group, err);  // also the barrier: no rank returns before the checkpoint is in place
}

bool is_checkpoint(const std::string& dir) {
  const fs::path path = fs::path(dir) / kIndexFile;
  if (!fs::exists(path)) return false;
  try {
    std::ifstream in(path);
    const auto j = nlohmann::json::parse(in);
    return j.contains(detail::kOurIndexKey) && j[detail::kOurIndexKey].value("format_version", 0) == kFormatVersion;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace dtensor::checkpoint
