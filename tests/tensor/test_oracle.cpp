// Our DTensor against PyTorch's own: tests/oracle/dtensor_oracle.py runs torch.distributed.tensor (world 4,
// Gloo) on a fixed set of cases and records every rank's local shards and gradients; each case here is
// replayed on the same mesh and must give the same shards exactly.
//
// Where PyTorch refuses a case we either refuse too (same stage) or, for the transitions we support beyond
// PyTorch (Replicate -> Partial, Partial(sum) -> Partial(avg), ...), check the result's value instead.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"
#include "harness/oracle_json.h"

using namespace dtensor;
using json = nlohmann::json;

namespace {

std::string oracle_path() { return dtensor::testing::oracle_file("DTENSOR_ORACLE_JSON", "dtensor_cases.json"); }

using dtensor::testing::placements_of;
using dtensor::testing::tensor_of;

// The oracle's input convention: arange(numel) * 0.25 - 1 (+ offset * global rank).
at::Tensor oracle_input(const std::vector<int64_t>& shape, double rank_offset, int rank) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  return (at::arange(numel, at::kFloat).reshape(shape) * 0.25 - 1.0 + rank_offset * rank);
}

struct Outcome {
  int compared = 0;
  int refused_alike = 0;
  int beyond_pytorch = 0;
};

void replay(const json& c, int rank, const DeviceMesh& mesh, Outcome& outcome) {
  const std::string id = c["id"];
  auto shape = c["shape"].get<std::vector<int64_t>>();
  const json& mine = c.contains("ranks") ? c["ranks"][rank] : json();
  const std::string stage = c.value("stage", "");
  const bool refused = c.contains("error");
  std::optional<int> src_rank;
  if (!c["src_data_rank"].is_null()) src_rank = c["src_data_rank"].get<int>();

  // --- source
  at::Tensor src, from_local_leaf;
  try {
    Placements src_placements = placements_of(c["src"]);
    if (c.value("src_mode", "distribute") == "distribute") {
      at::Tensor input = oracle_input(shape, c["rank_input_offset"].get<double>(), mesh.get_rank());
      src = distribute_tensor(input.set_requires_grad(true), mesh, src_placements, src_rank);
    } else {
      // from_local: this rank's torch.chunk piece of the input, plus a per-rank delta.
      DTensorSpec spec(mesh, src_placements, TensorMeta{shape, {}, at::kFloat});
      LocalShard shard = local_shard(spec);
      at::Tensor local = oracle_input(shape, 0, 0);
      for (size_t d = 0; d < shape.size(); ++d) local = local.narrow(d, shard.offset[d], shard.shape[d]);
      local = local.clone();
      auto coord = *mesh.get_coordinate();
      double delta = 0;
      if (c["from_local_delta"] == "partial") {
        for (int64_t i = 0; i < mesh.ndim(); ++i) {
          if (spec.placements[i].is_partial()) delta += 10.0 * (i + 1) * (coord[i] + 1);
        }
      } else if (c["from_local_delta"] == "rank") {
        delta = 100.0 * mesh.get_rank();
      }
      from_local_leaf = (local + delta).set_requires_grad(true);
      std::optional<std::vector<int64_t>> global;
      if (c.value("from_local_pass_shape", false)) global = shape;
      src = DTensor::from_local(from_local_leaf, mesh, src_placements, c.value("run_check", false), global);
    }
  } catch (const std::exception& e) {
    if (refused && stage == "src") {
      ++outcome.refused_alike;
      return;
    }
    ADD_FAILURE() << id << ": our source failed: " << e.what();
    return;
  }
  if (refused && stage == "src") {
    // Cases PyTorch refuses at the source that we accept on purpose: run_check with uneven torch.chunk
    // shards (we infer the exact global shape), and distribute_tensor to a _StridedShard of uneven pieces
    // from a source rank (PyTorch's scatter wants even pieces; we broadcast). Check the values are right.
    const bool strided = c["src_mode"] == "distribute" && has_strided_shard(placements_of(c["src"]));
    EXPECT_TRUE(c["src_mode"] == "from_local" || strided) << id << ": accepted a source PyTorch refuses: " << c["error"];
    if (strided) {
      // The source is the rank at coordinate (s, s, ...) (no source: each rank cuts its own input).
      int source = src_rank ? 0 : mesh.get_rank();
      for (int64_t i = 0; src_rank && i < mesh.ndim(); ++i) source = source * static_cast<int>(mesh.size(i)) + *src_rank;
      const at::Tensor input = oracle_input(shape, c["rank_input_offset"].get<double>(), source);
      EXPECT_TRUE(at::equal(full_tensor(src).detach(), input)) << id << ": full_tensor of a source PyTorch refuses";
    }
    ++outcome.beyond_pytorch;
    return;
  }
  EXPECT_TRUE(at::equal(to_local(src).detach(), tensor_of(mine["src_local"]))) << id << " src_local";

  // --- redistribute
  Placements dst_placements = placements_of(c["dst"]);
  at::Tensor dst;
  try {
    dst = redistribute(src, mesh, dst_placements);
  } catch (const std::exception& e) {
    if (refused && stage == "redistribute") {
      ++outcome.refused_alike;
      return;
    }
    ADD_FAILURE() << id << ": our redistribute failed: " << e.what();
    return;
  }
  if (refused) {
    // A transition PyTorch's public API refuses (to Partial from Replicate, or between Partial kinds): ours
    // must still hold the same value.
    EXPECT_TRUE(at::allclose(full_tensor(dst).detach(), full_tensor(src).detach(), 1e-5, 1e-5)) << id;
    ++outcome.beyond_pytorch;
    return;
  }
  if (c.value("pytorch_wrong_value", false)) {
    // PyTorch's own redistribute gathers this _StridedShard layout to a wrong value (the oracle checked its
    // full_tensor against the input): ours must hold the input.
    EXPECT_TRUE(at::equal(full_tensor(dst).detach(), oracle_input(shape, 0, 0))) << id << ": wrong value";
    ++outcome.beyond_pytorch;
    return;
  }
  EXPECT_TRUE(at::equal(to_local(dst).detach(), tensor_of(mine["dst_local"])))
      << id << " dst_local: ours " << to_local(dst) << " PyTorch's " << tensor_of(mine["dst_local"]);
  auto meta = local_shard(dtensor_spec(dst));
  EXPECT_EQ(meta.shape, mine["dst_meta"]["local_shape"].get<std::vector<int64_t>>()) << id;
  EXPECT_EQ(meta.offset, mine["dst_meta"]["global_offset"].get<std::vector<int64_t>>()) << id;

  // --- backward: dst.to_local().backward(grad_out)
  if (mine.contains("src_grad") && !mine["src_grad"].is_null()) {
    to_local(dst).backward(tensor_of(mine["grad_out"]));
    at::Tensor grad = from_local_leaf.defined() ? from_local_leaf.grad() : src.grad();
    ASSERT_TRUE(grad.defined()) << id;
    at::Tensor grad_local = is_dtensor(grad) ? to_local(grad) : grad;
    EXPECT_TRUE(at::equal(grad_local, tensor_of(mine["src_grad"]))) << id << " src_grad: ours " << grad_local
                                                                     << " PyTorch's " << tensor_of(mine["src_grad"]);
    if (is_dtensor(grad) && mine["src_grad"].contains("placements")) {
      EXPECT_EQ(placements(grad), placements_of(mine["src_grad"]["placements"])) << id;
    }
  }
  ++outcome.compared;
}

}  // namespace

TEST(Oracle, EveryCaseMatchesPyTorchDTensor) {
  std::ifstream in(oracle_path());
  ASSERT_TRUE(in.good()) << "no oracle results at " << oracle_path()
                         << "; generate them with .venv/bin/python tests/oracle/dtensor_oracle.py " << oracle_path();
  json doc = json::parse(in);
  ASSERT_EQ(doc["world_size"].get<int>(), 4);
  const json& cases = doc["cases"];
  std::vector<Outcome> outcomes(4);
  dtensor::testing::run_ranks(4, [&](int rank, int) {
    auto mesh_1d = init_device_mesh("cpu", {4});
    auto mesh_2d = init_device_mesh("cpu", {2, 2});
    for (const auto& c : cases) {
      replay(c, rank, c["mesh_shape"].size() == 1 ? mesh_1d : mesh_2d, outcomes[rank]);
    }
  });
  const Outcome& o = outcomes[0];
  std::cout << "[oracle] torch " << doc["torch_version"].get<std::string>() << ": " << cases.size() << " cases, "
            << o.compared << " compared exactly, " << o.refused_alike << " refused like PyTorch, " << o.beyond_pytorch
            << " supported beyond PyTorch (values checked)" << std::endl;
  EXPECT_EQ(o.compared + o.refused_alike + o.beyond_pytorch, static_cast<int>(cases.size()));
  EXPECT_GT(o.compared, 200);
}
