// dtensor::clip_grad_norm_ over a mix of DTensor gradients (Shard(0), Shard(1), Replicate, Partial, 2-D
// meshes) and plain ones equals single-process torch::nn::utils::clip_grad_norm_ on the full gradients:
// the same total norm and the same clipped gradients, for norm types 2, 1 and inf.
#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>

#include <cmath>
#include <limits>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/dp/clip_grad.h"
#include "dtensor/debug/comm_debug_mode.h"
#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"

using namespace dtensor;
using namespace dtensor::testing;

namespace {

struct GradCase {
  std::vector<int64_t> shape;
  Placements placements;  // empty: a plain parameter
  bool mesh_2d = false;
};

// Partial(sum) terms that add up to `full`: rank r holds full * (r + 1) / (1 + 2 + ... + n).
at::Tensor partial_term(const at::Tensor& full, int rank, int world) {
  return full * (rank + 1) / (world * (world + 1) / 2.0);
}

void check_against_torch(int rank, int world, const std::vector<GradCase>& cases, double norm_type,
                         double max_norm, int64_t expected_all_reduces) {
  auto mesh = init_device_mesh("cpu", {world});
  std::optional<DeviceMesh> mesh2;
  if (world == 4) mesh2 = init_device_mesh("cpu", {2, 2});
  std::vector<at::Tensor> params, reference;
  for (size_t i = 0; i < cases.size(); ++i) {
    const GradCase& c = cases[i];
    at::Tensor full_grad = seeded_randn(100 + i, c.shape);
    at::Tensor ref = at::zeros(c.shape).requires_grad_();
    ref.mutable_grad() = full_grad.clone();
    reference.push_back(ref);
    if (c.placements.empty()) {
      at::Tensor p = at::zeros(c.shape).requires_grad_();
      p.mutable_grad() = full_grad.clone();
      params.push_back(p);
      continue;
    }
    const DeviceMesh& m = c.mesh_2d ? *mesh2 : mesh;
    at::Tensor p = distribute_tensor(at::zeros(c.shape), m, c.placements).requires_grad_();
    bool partial = c.placements[0].is_partial();
    p.mutable_grad() = partial ? DTensor::from_local(partial_term(full_grad, rank, world), m, c.placements)
                               : distribute_tensor(full_grad, m, c.placements);
    params.push_back(p);
  }
  double expected = torch::nn::utils::clip_grad_norm_(reference, max_norm, norm_type);
  CommDebugMode comm;
  double total = dtensor::clip_grad_norm_(params, max_norm, norm_type);
  EXPECT_NEAR(total, expected, 1e-5 * expected) << "norm_type " << norm_type;
  if (expected_all_reduces >= 0) {
    EXPECT_EQ(comm.get_comm_counts()["all_reduce"], expected_all_reduces) << comm.table();
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    at::Tensor g = params[i].grad();
    at::Tensor full = is_dtensor(g) ? full_tensor(g) : g;
    EXPECT_TRUE(at::allclose(full, reference[i].grad(), 1e-5, 1e-6))
        << "gradient " << i << " norm_type " << norm_type;
  }
}

const double kNormTypes[] = {2.0, 1.0, std::numeric_limits<double>::infinity()};

}  // namespace

TEST(ClipGrad, ShardReplicatePlainMatchTorch) {
  // Uneven shards (7 rows over 4 ranks, 9 columns over 2 or 4) and an empty local shard at world 4 (3 rows).
  std::vector<GradCase> cases = {
      {{7, 6}, {Shard(0)}}, {{5, 9}, {Shard(1)}}, {{4}, {Replicate()}}, {{6}, {}}, {{3, 2}, {Shard(0)}}, {{2, 3}, {}},
  };
  for (double p : kNormTypes) {
    // One all-reduce for all the DTensor gradients on the mesh, none for the plain ones.
    for_each_world({2, 4}, [&](int rank, int world) { check_against_torch(rank, world, cases, p, 0.5, 1); });
  }
}

TEST(ClipGrad, PartialGradsAreReducedFirst) {
  std::vector<GradCase> cases = {{{4, 4}, {Partial()}}, {{6, 2}, {Shard(0)}}, {{5}, {}}};
  for (double p : kNormTypes) {
    // The Partial gradient's Partial -> Replicate all-reduce, then the one for the norms.
    for_each_world({2, 4}, [&](int rank, int world) { check_against_torch(rank, world, cases, p, 0.5, 2); });
  }
}

TEST(ClipGrad, TwoDimMeshCountsReplicasOnce) {
  // World 4 as a 2x2 mesh: a gradient Shard(0) over dim 0 and Replicate over dim 1 is held twice.
  std::vector<GradCase> cases = {
      {{6, 4}, {Shard(0), Replicate()}, true}, {{3, 8}, {Replicate(), Shard(1)}, true},
      {{4, 4}, {Shard(0), Shard(1)}, true},    {{5}, {Replicate(), Replicate()}, true},
      {{7}, {Shard(0)}},                        {{3}, {}},
  };
  for (double p : kNormTypes) {
    run_ranks(4, [&](int rank, int world) { check_against_torch(rank, world, cases, p, 0.5, -1); });
  }
}

TEST(ClipGrad, NoClippingBelowMaxNormAndNonFiniteError) {
  run_ranks(2, [](int, int) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor p = distribute_tensor(at::zeros({4}), mesh, {Shard(0)}).requires_grad_();
    p.mutable_grad() = distribute_tensor(at::full({4}, 0.5), mesh, {Shard(0)});
    EXPECT_NEAR(dtensor::clip_grad_norm_(p, 10.0), 1.0, 1e-6);
    EXPECT_TRUE(at::allclose(full_tensor(p.grad()), at::full({4}, 0.5)));
    at::Tensor q = at::zeros({2}).requires_grad_();
    q.mutable_grad() = at::full({2}, std::numeric_limits<float>::infinity());
    std::string err = error_of([&] { dtensor::clip_grad_norm_({p, q}, 1.0, 2.0, /*error_if_nonfinite=*/true); });
    EXPECT_NE(err.find("dtensor: clip_grad_norm_: the total norm of order 2"), std::string::npos) << err;
    EXPECT_NE(err.find("is non-finite"), std::string::npos) << err;
  });
}
