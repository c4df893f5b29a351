// Save at TP 2, load at TP 1, TP 4, TP 2 with other placements and on a 2-D mesh: every rank ends up with
// exactly its shard of the saved values (bit-identical), whatever the placements on either side. Partial
// DTensors are saved as their reduced value; replicas are written once.
#include <gtest/gtest.h>

#include <filesystem>

#include "checkpoint_test_util.h"
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/checkpoint/safetensors.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"

using namespace dtensor;
using namespace dtensor::testing;
namespace ckpt = dtensor::checkpoint;
namespace fs = std::filesystem;

namespace {

// The saved values: uneven shapes on purpose (7 rows over 2 or 4 ranks).
struct Entry {
  std::string name;
  std::vector<int64_t> shape;
  at::ScalarType dtype;
};
const std::vector<Entry> kEntries = {
    {"a.weight", {7, 5}, at::kFloat}, {"b.bias", {6}, at::kFloat},     {"c.weight", {5, 9}, at::kBFloat16},
    {"d.partial", {4, 3}, at::kFloat}, {"e.plain", {3, 2}, at::kDouble}, {"f.step", {}, at::kFloat},
    {"g.ids", {10}, at::kLong}};

at::Tensor value_of(size_t i) {
  const Entry& e = kEntries[i];
  if (e.dtype == at::kLong) return at::arange(e.shape[0], at::kLong) * 7 + 3;
  return seeded_randn(1000 + i, e.shape).to(e.dtype);
}

// The state at TP 2 as a training job might hold it.
ckpt::StateDict state_tp2(int rank) {
  auto mesh = init_device_mesh("cpu", {2});
  ckpt::StateDict s;
  s["a.weight"] = distribute_tensor(value_of(0), mesh, {Shard(0)});
  s["b.bias"] = distribute_tensor(value_of(1), mesh, {Replicate()});
  s["c.weight"] = distribute_tensor(value_of(2), mesh, {Shard(1)});
  // Partial(sum): rank r holds value * (r + 1) / 3; the checkpoint must hold the sum.
  s["d.partial"] = DTensor::from_local(value_of(3) * (rank + 1) / 3.0, mesh, {Partial()}, false, kEntries[3].shape);
  s["e.plain"] = value_of(4);
  s["f.step"] = value_of(5);
  s["g.ids"] = distribute_tensor(value_of(6), mesh, {Shard(0)});
  return s;
}

// Zeroed targets with the given placements per entry (empty: a plain tensor) on `mesh`.
ckpt::StateDict zero_targets(const DeviceMesh* mesh, const std::vector<Placements>& placements) {
  ckpt::StateDict s;
  for (size_t i = 0; i < kEntries.size(); ++i) {
    at::Tensor zeros = at::zeros(kEntries[i].shape, at::TensorOptions().dtype(kEntries[i].dtype));
    s[kEntries[i].name] = placements[i].empty() ? zeros : distribute_tensor(zeros, *mesh, placements[i]);
  }
  return s;
}

void expect_loaded(const ckpt::StateDict& s) {
  for (size_t i = 0; i < kEntries.size(); ++i) {
    const at::Tensor got = full_value(s.at(kEntries[i].name));
    at::Tensor want = value_of(i);
    if (kEntries[i].name == "d.partial") {
      // The reduced value: the sum of the terms (equal to the value up to rounding of the thirds).
      want = (value_of(3) * 1 / 3.0 + value_of(3) * 2 / 3.0);
    }
    EXPECT_TRUE(at::equal(got, want)) << kEntries[i].name << "\n" << got << "\n" << want;
  }
}

std::string save_at_tp2(const std::string& tag) {
  const std::string dir = fresh_dir(tag) + "/ckpt";
  run_ranks(2, [&](int rank, int) { ckpt::save(dir, state_tp2(rank)); });
  return dir;
}

}  // namespace

TEST(CheckpointReshard, LayoutIsPyTorchsDistributedHuggingFaceLayout) {
  const std::string dir = save_at_tp2("layout");
  EXPECT_TRUE(ckpt::is_checkpoint(dir));
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(fs::path(dir).parent_path() / ".ckpt.partial"));
  // Each chunk once: a.weight's two row blocks, one copy of each replicated or plain tensor.
  std::map<std::string, int> copies;
  for (const char* name : {"shard-00001-model-00001-of-00001.safetensors", "shard-00002-model-00001-of-00001.safetensors"}) {
    auto f = ckpt::SafetensorsFile::open(dir + "/" + name);
    EXPECT_EQ(f.metadata().at("DCP_VERSION"), "1.0");
    EXPECT_TRUE(f.metadata().count("DCP_SHARDING_INFO"));
    for (const auto& t : f.tensors()) ++copies[t.info.name];
  }
  EXPECT_EQ(copies["a.weight"], 2);
  EXPECT_EQ(copies["c.weight"], 2);
  EXPECT_EQ(copies["g.ids"], 2);
  EXPECT_EQ(copies["b.bias"], 1);
  EXPECT_EQ(copies["d.partial"], 1);
  EXPECT_EQ(copies["e.plain"], 1);
  EXPECT_EQ(copies["f.step"], 1);
}

TEST(CheckpointReshard, Tp2ToTp1) {
  const std::string dir = save_at_tp2("tp1");
  run_ranks(1, [&](int, int) {
    ckpt::StateDict s = zero_targets(nullptr, std::vector<Placements>(kEntries.size()));  // all plain
    ckpt::load(dir, s);
    expect_loaded(s);
  });
  // One process with no process group at all.
  ckpt::StateDict s = zero_targets(nullptr, std::vector<Placements>(kEntries.size()));
  ckpt::load(dir, s);
  expect_loaded(s);
}

TEST(CheckpointReshard, Tp2ToTp4) {
  const std::string dir = save_at_tp2("tp4");
  run_ranks(4, [&](int, int) {
    auto mesh = init_device_mesh("cpu", {4});
    ckpt::StateDict s = zero_targets(&mesh, {{Shard(0)}, {Shard(0)}, {Shard(1)}, {Replicate()}, {Shard(1)}, {}, {Shard(0)}});
    ckpt::load(dir, s);
    expect_loaded(s);
  });
}

TEST(CheckpointReshard, Tp2ToTp2OtherPlacements) {
  const std::string dir = save_at_tp2("tp2");
  run_ranks(2, [&](int, int) {
    auto mesh = init_device_mesh("cpu", {2});
    // Every entry changes placement: Shard(0) -> Shard(1), Replicate -> Shard, Shard(1) -> Shard(0), ...
    ckpt::StateDict s = zero_targets(&mesh, {{Shard(1)}, {Shard(0)}, {Shard(0)}, {Shard(1)}, {Replicate()}, {Replicate()}, {Replicate()}});
    ckpt::load(dir, s);
    expect_loaded(s);
  });
}

TEST(CheckpointReshard, Tp2ToTwoDimensionalMesh) {
  const std::string dir = save_at_tp2("mesh2d");
  run_ranks(4, [&](int, int) {
    auto mesh = init_device_mesh("cpu", {2, 2});
    ckpt::StateDict s = zero_targets(&mesh, {{Shard(0), Shard(1)}, {Replicate(), Shard(0)}, {Shard(1), Shard(1)},
                                             {Shard(0), Shard(0)}, {Replicate(), Replicate()}, {}, {Shard(0), Replicate()}});
    ckpt::load(dir, s);
    expect_loaded(s);
  });
}

TEST(CheckpointReshard, LoadIntoPartialKeepsTheValue) {
  const std::string dir = save_at_tp2("partial");
  run_ranks(2, [&](int, int) {
    auto mesh = init_device_mesh("cpu", {2});
    ckpt::StateDict s = zero_targets(&mesh, {{Partial()}, {Partial()}, {Shard(0)}, {Partial()}, {}, {}, {Replicate()}});
    ckpt::load(dir, s);
    expect_loaded(s);  // full_tensor reduces the Partials: the sum of the terms is the stored value
  });
}

TEST(CheckpointReshard, SaveAgainReplacesAtomically) {
  const std::string dir = save_at_tp2("resave");
  // A second save into the same directory at TP 4 replaces the first in one exchange.
  run_ranks(4, [&](int, int) {
    auto mesh = init_device_mesh("cpu", {4});
    ckpt::StateDict s = zero_targets(&mesh, {{Shard(0)}, {Replicate()}, {Shard(1)}, {Replicate()}, {}, {}, {Shard(0)}});
    ckpt::load(dir, s);
    ckpt::save(dir, s);
  });
  EXPECT_TRUE(ckpt::is_checkpoint(dir));
  EXPECT_FALSE(fs::exists(fs::path(dir).parent_path() / ".ckpt.partial"));
  EXPECT_TRUE(fs::exists(dir + "/shard-00004-model-00001-of-00001.safetensors"));
  ckpt::StateDict s = zero_targets(nullptr, std::vector<Placements>(kEntries.size()));
  ckpt::load(dir, s);
  expect_loaded(s);
}
