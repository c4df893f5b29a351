// The op decision cache outlives the meshes it saw: a mesh that is gone must leave nothing a new mesh could hit, even
// at the same address (the cache keys by DeviceMesh::serial, never reused). Keyed by the address, a from_locals entry
// (an op without a meta kernel, whose output sizes exchange_sizes learns with a collective) learnt by the plan search's
// dry runs was hit by training's mesh on one rank and not the other: that rank skipped the collective and the ranks
// fell out of step (issue 63: PlanSearch.LlamaPlanSearchJsonAndLlamaTrainPlanAuto).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <set>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/ops/dispatch_options.h"
#include "dtensor/plan/fake_world.h"

namespace {

TEST(DecisionCacheMesh, ANewMeshNeverHitsADeadMeshsEntries) {
  std::set<uint64_t> serials;
  for (int i = 0; i < 50; ++i) {
    // Made and destroyed each time, as the plan search's dry-run meshes: the allocator hands a later one the same
    // address again and again.
    dtensor::DeviceMesh mesh("cpu", {2}, {0, 1}, {}, dtensor::fake_world(2, 0));
    EXPECT_TRUE(serials.insert(mesh.serial()).second) << "a serial was reused at iteration " << i;
    const at::Tensor local = at::randn({2, 4, 8, 16});
    const at::Tensor q = dtensor::DTensor::from_local(local, mesh, {dtensor::Shard(1)});
    const int64_t before = dtensor::dispatch_stats().cache_misses;
    // The CPU flash attention has no meta kernel: a from_locals entry (sizes exchanged on the mesh's group).
    const at::Tensor out = at::scaled_dot_product_attention(q, q, q);
    EXPECT_GT(dtensor::dispatch_stats().cache_misses, before) << "iteration " << i << " hit a dead mesh's entry";
    EXPECT_EQ(out.sizes(), (at::IntArrayRef{2, 8, 8, 16}));
  }
}

}  // namespace
