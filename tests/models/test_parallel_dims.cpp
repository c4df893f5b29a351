// ParallelDims (models/common/parallel_dims.h): the mesh each degree makes, and the dims read back from a mesh.
#include <gtest/gtest.h>

#include "common/parallel_dims.h"
#include "dtensor/core/error.h"
#include "harness/multi_rank.h"

using dtensor::testing::error_of;
using dtensor::testing::run_ranks;

TEST(ParallelDims, DataParallelKindsByName) {
  EXPECT_EQ(models::data_parallel_from_string("ddp"), models::DataParallel::ddp);
  EXPECT_EQ(models::data_parallel_from_string("fsdp"), models::DataParallel::fsdp);
  EXPECT_EQ(models::to_string(models::DataParallel::fsdp), "fsdp");
  EXPECT_NE(error_of([] { models::data_parallel_from_string("zero3"); }).find("'zero3' is not ddp or fsdp"),
            std::string::npos);
}

TEST(ParallelDims, BuildsOneOrTwoDimMeshesAndReadsThemBack) {
  run_ranks(4, [](int rank, int) {
    models::ParallelDims none;
    EXPECT_NE(error_of([&] { none.world_mesh(); }).find("has no mesh"), std::string::npos);

    models::ParallelDims dims;
    dims.dp = 2;
    dims.tp = 2;
    dims.data_parallel = models::DataParallel::fsdp;
    const dtensor::DeviceMesh& mesh = dims.build_mesh();
    ASSERT_EQ(mesh.ndim(), 2);
    EXPECT_EQ(mesh.mesh_dim_names(), (std::vector<std::string>{"dp", "tp"}));
    EXPECT_EQ(dims.tp_mesh().size(), 2);
    EXPECT_EQ(mesh.get_local_rank("tp"), rank % 2);  // TP ranks adjacent: rank = dp_index * tp + tp_index
    EXPECT_EQ(mesh.get_local_rank("dp"), rank / 2);

    const models::ParallelDims back = models::ParallelDims::from_mesh(mesh, models::DataParallel::fsdp);
    EXPECT_EQ(back.dp, 2);
    EXPECT_EQ(back.tp, 2);
    EXPECT_TRUE(back.dp_enabled() && back.tp_enabled());

    models::ParallelDims flat;
    flat.tp = 4;
    EXPECT_EQ(flat.build_mesh().ndim(), 1);
    EXPECT_EQ(models::ParallelDims::from_mesh(flat.world_mesh()).tp, 4);
    EXPECT_FALSE(models::ParallelDims::from_mesh(flat.world_mesh()).dp_enabled());
  });
}
