// Wrong input never leaves a half-loaded state: a missing or truncated file, a checksum mismatch, a name
// missing or extra, a shape or dtype that differs, an unknown format version each give one clear error on
// every rank, and the state keeps its previous values. A failed save leaves the previous checkpoint.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "checkpoint_test_util.h"
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"

using namespace dtensor;
using namespace dtensor::testing;
namespace ckpt = dtensor::checkpoint;
namespace fs = std::filesystem;

namespace {

const std::string kShard1 = "shard-00001-model-00001-of-00001.safetensors";
const std::string kShard2 = "shard-00002-model-00001-of-00001.safetensors";

ckpt::StateDict make_state(const DeviceMesh& mesh, double scale) {
  ckpt::StateDict s;
  s["w"] = distribute_tensor(seeded_randn(1, {8, 4}) * scale, mesh, {Shard(0)});
  s["v"] = distribute_tensor(seeded_randn(2, {4, 6}) * scale, mesh, {Shard(1)});
  s["step"] = at::scalar_tensor(3.0 * scale, at::kFloat);
  return s;
}

std::string save_good(const std::string& tag) {
  const std::string dir = fresh_dir(tag) + "/ckpt";
  run_ranks(2, [&](int, int) {
    auto mesh = init_device_mesh("cpu", {2});
    ckpt::save(dir, make_state(mesh, 1.0));
  });
  return dir;
}

// Loads `dir` at TP 2 into a state holding other values (scale 5) after `edit(state)`; expects the same error
// containing `expected` on both ranks and the state unchanged.
void expect_load_fails(const std::string& dir, const std::string& expected,
                       const std::function<void(ckpt::StateDict&, const DeviceMesh&)>& edit = nullptr) {
  RunOptions options;
  options.expect_all_succeed = false;
  std::vector<std::string> errors = run_ranks(2, [&](int, int) {
    auto mesh = init_device_mesh("cpu", {2});
    ckpt::StateDict s = make_state(mesh, 5.0);
    if (edit) edit(s, mesh);
    std::map<std::string, at::Tensor> before;
    for (const auto& [k, v] : s) before[k] = full_value(v).clone();
    std::string err = error_of([&] { ckpt::load(dir, s); });
    for (const auto& [k, v] : s) EXPECT_TRUE(at::equal(full_value(v), before[k])) << "changed: " << k;
    if (!err.empty()) throw std::runtime_error(err);
  }, options);
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0], errors[1]) << "ranks disagree";
  EXPECT_NE(errors[0].find(expected), std::string::npos) << "error: " << errors[0];
}

void truncate_file(const std::string& path, int64_t drop) { fs::resize_file(path, fs::file_size(path) - drop); }

}  // namespace

TEST(CheckpointErrors, MissingFile) {
  const std::string dir = save_good("missing");
  fs::remove(dir + "/" + kShard2);
  expect_load_fails(dir, "missing file " + kShard2);
}

TEST(CheckpointErrors, TruncatedFile) {
  const std::string dir = save_good("trunc");
  truncate_file(dir + "/" + kShard1, 5);
  expect_load_fails(dir, "(truncated)");
}

TEST(CheckpointErrors, ChecksumMismatch) {
  const std::string dir = save_good("crc");
  {
    std::fstream f(dir + "/" + kShard2, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  expect_load_fails(dir, "checksum mismatch in " + kShard2);
}

TEST(CheckpointErrors, NameMissingFromCheckpoint) {
  const std::string dir = save_good("name");
  expect_load_fails(dir, "not in the checkpoint: 'u'", [](ckpt::StateDict& s, const DeviceMesh&) { s["u"] = at::zeros({2}); });
}

TEST(CheckpointErrors, ExtraNameInCheckpoint) {
  const std::string dir = save_good("extra");
  expect_load_fails(dir, "in the checkpoint but not in the state: 'v'", [](ckpt::StateDict& s, const DeviceMesh&) { s.erase("v"); });
}

TEST(CheckpointErrors, ShapeDiffers) {
  const std::string dir = save_good("shape");
  expect_load_fails(dir, "'v' has shape [4, 6] in the checkpoint, [4, 8] in the state", [](ckpt::StateDict& s, const DeviceMesh& mesh) {
    s["v"] = distribute_tensor(at::ones({4, 8}), mesh, {Shard(1)});
  });
}

TEST(CheckpointErrors, DtypeDiffers) {
  const std::string dir = save_good("dtype");
  expect_load_fails(dir, "'step' is Float in the checkpoint, Double in the state", [](ckpt::StateDict& s, const DeviceMesh&) {
    s["step"] = at::scalar_tensor(1.0, at::kDouble);
  });
}

TEST(CheckpointErrors, UnknownFormatVersion) {
  const std::string dir = save_good("version");
  const std::string index_path = dir + "/model.safetensors.index.json";
  nlohmann::json j = nlohmann::json::parse(std::ifstream(index_path));
  j["dtensor_checkpoint"]["format_version"] = 99;
  std::ofstream(index_path) << j.dump();
  expect_load_fails(dir, "unknown checkpoint format version 99");
}

TEST(CheckpointErrors, StagingDirectoryIsNeverACheckpoint) {
  const std::string dir = save_good("staging");
  // What a save killed after writing its files leaves: a staging directory with shards and no index.
  const std::string staging = (fs::path(dir).parent_path() / ".ckpt.partial").string();
  fs::create_directories(staging);
  fs::copy_file(dir + "/" + kShard1, staging + "/" + kShard1);
  EXPECT_FALSE(ckpt::is_checkpoint(staging));
  EXPECT_TRUE(ckpt::is_checkpoint(dir));
  ckpt::StateDict plain = {{"w", at::zeros({8, 4})}};
  const std::string err = error_of([&] { ckpt::load(staging, plain, {.allow_unused = true}); });
  EXPECT_NE(err.find("staging directory of an unfinished save"), std::string::npos) << err;
  // The next save clears it and commits.
  run_ranks(2, [&](int, int) {
    auto mesh = init_device_mesh("cpu", {2});
    ckpt::save(dir, make_state(mesh, 2.0));
  });
  EXPECT_FALSE(fs::exists(staging));
  run_ranks(2, [&](int, int) {
    auto mesh = init_device_mesh("cpu", {2});
    ckpt::StateDict s = make_state(mesh, 0.0);
    ckpt::load(dir, s);
    EXPECT_TRUE(at::equal(full_value(s["w"]), seeded_randn(1, {8, 4}) * 2.0));
  });
}

TEST(CheckpointErrors, SaveWithDifferentStatesFailsEverywhereAndKeepsThePrevious) {
  const std::string dir = save_good("mismatch");
  RunOptions options;
  options.expect_all_succeed = false;
  auto errors = run_ranks(2, [&](int rank, int) {
    auto mesh = init_device_mesh("cpu", {2});
    ckpt::StateDict s = make_state(mesh, 2.0);
    if (rank == 1) s["extra"] = at::zeros({1});
    ckpt::save(dir, s);
  }, options);
  EXPECT_NE(errors[0].find("rank 1's state differs from rank 0's"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[0], errors[1]);
  ckpt::StateDict s = {{"w", at::zeros({8, 4})}, {"v", at::zeros({4, 6})}, {"step", at::zeros({})}};
  ckpt::load(dir, s);
  EXPECT_TRUE(at::equal(s["w"], seeded_randn(1, {8, 4})));
}

// A _StridedShard whose shards are not boxes (7 rows, sf=3 on 2x2: rank (0, 0) holds rows {0, 1, 3}) cannot be
// written as box chunks: every rank refuses with the same error, before writing anything.
TEST(CheckpointErrors, StridedShardsThatAreNotBoxesAreRefused) {
  const std::string dir = fresh_dir("strided_not_box") + "/ckpt";
  RunOptions options;
  options.expect_all_succeed = false;
  std::vector<std::string> errors = run_ranks(4, [&](int, int) {
    auto mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
    ckpt::StateDict s;
    s["w"] = distribute_tensor(seeded_randn(1, {7, 3}), mesh, {_StridedShard(0, 3), Shard(0)});
    ckpt::save(dir, s);
  }, options);
  ASSERT_EQ(errors.size(), 4u);
  for (const std::string& e : errors) EXPECT_NE(e.find("not one box"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dir));
}
