// Mesh math: coordinates, slicing, per-dim groups and flattening on 1-D, 2x2 and 4x1 meshes.
#include <gtest/gtest.h>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/functional_collectives.h"
#include "harness/multi_rank.h"

using dtensor::DeviceMesh;
using dtensor::init_device_mesh;
using dtensor::testing::for_each_world;
using dtensor::testing::run_ranks;

TEST(DeviceMesh, OneDimensional) {
  for_each_world({1, 2, 4}, [](int rank, int world) {
    auto mesh = init_device_mesh("cpu", {world}, {"tp"});
    EXPECT_EQ(mesh.ndim(), 1);
    EXPECT_EQ(mesh.size(), world);
    EXPECT_EQ(mesh.size("tp"), world);
    EXPECT_EQ(mesh.get_rank(), rank);
    EXPECT_EQ(mesh.get_local_rank(0), rank);
    EXPECT_EQ(*mesh.get_coordinate(), std::vector<int64_t>{rank});
    EXPECT_EQ(mesh.get_group("tp").size(), world);
    EXPECT_EQ(mesh.get_group(0).rank(), rank);
  });
}

TEST(DeviceMesh, TwoByTwoCoordinatesSlicesAndGroups) {
  run_ranks(4, [](int rank, int) {
    auto mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
    EXPECT_EQ(mesh.to_string(), "DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'tp'))");
    std::vector<int64_t> coord{rank / 2, rank % 2};
    EXPECT_EQ(*mesh.get_coordinate(), coord);
    EXPECT_EQ(mesh.get_local_rank("dp"), rank / 2);
    EXPECT_EQ(mesh.get_local_rank("tp"), rank % 2);
    // tp groups are rows, dp groups are columns.
    std::vector<int> tp_ranks{rank / 2 * 2, rank / 2 * 2 + 1};
    std::vector<int> dp_ranks{rank % 2, rank % 2 + 2};
    EXPECT_EQ(mesh.get_group("tp").ranks(), tp_ranks);
    EXPECT_EQ(mesh.get_group("dp").ranks(), dp_ranks);

    DeviceMesh tp = mesh["tp"];
    EXPECT_EQ(tp.ndim(), 1);
    EXPECT_EQ(tp.ranks(), tp_ranks);
    EXPECT_EQ(tp.mesh_dim_names(), std::vector<std::string>{"tp"});
    EXPECT_EQ(tp.get_local_rank(0), rank % 2);
    EXPECT_EQ(&tp.get_group(0), &mesh.get_group("tp"));  // slicing reuses the parent's groups
    EXPECT_EQ(mesh["dp"].ranks(), dp_ranks);

    // The groups really are those ranks: a sum over tp adds the row's ranks.
    at::Tensor x = at::full({1}, double(rank));
    EXPECT_EQ(dtensor::all_reduce(x, dtensor::ReduceOp::SUM, mesh, 1).item<double>(), tp_ranks[0] + tp_ranks[1]);
    EXPECT_EQ(dtensor::all_reduce(x, dtensor::ReduceOp::SUM, mesh, 0).item<double>(), dp_ranks[0] + dp_ranks[1]);

    DeviceMesh both = mesh.slice({"dp", "tp"});
    EXPECT_EQ(both.shape(), (std::vector<int64_t>{2, 2}));
    DeviceMesh flat = both.flatten();
    EXPECT_EQ(flat.mesh_dim_names(), std::vector<std::string>{"dp_tp"});
    EXPECT_EQ(flat.ranks(), (std::vector<int>{0, 1, 2, 3}));
    EXPECT_EQ(flat.get_local_rank(0), rank);
    EXPECT_EQ(dtensor::all_reduce(x, dtensor::ReduceOp::SUM, flat, 0).item<double>(), 6.0);
  });
}

TEST(DeviceMesh, FourByOne) {
  run_ranks(4, [](int rank, int) {
    auto mesh = init_device_mesh("cpu", {4, 1}, {"dp", "tp"});
    EXPECT_EQ(*mesh.get_coordinate(), (std::vector<int64_t>{rank, 0}));
    EXPECT_EQ(mesh.size("tp"), 1);
    EXPECT_EQ(mesh.get_group("tp").ranks(), std::vector<int>{rank});
    EXPECT_EQ(mesh.get_group("dp").ranks(), (std::vector<int>{0, 1, 2, 3}));
    EXPECT_EQ(mesh["tp"].get_local_rank(0), 0);
  });
}

TEST(DeviceMesh, ExplicitLayoutAndNonMembers) {
  run_ranks(4, [](int rank, int) {
    // Ranks laid out column-major on purpose; rank 3 is not in the 1-D mesh below.
    DeviceMesh mesh("cpu", {2, 2}, {0, 2, 1, 3}, {"a", "b"});
    // Layout [[0, 2], [1, 3]]: "b" groups are rows, "a" groups are columns.
    EXPECT_EQ(mesh.get_group("b").ranks(), (rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3}));
    EXPECT_EQ(*mesh.get_coordinate(), (std::vector<int64_t>{rank % 2, rank / 2}));
    EXPECT_EQ(mesh.get_group("a").ranks(), (rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}));
    DeviceMesh partial("cpu", {3}, {0, 1, 2});
    EXPECT_EQ(partial.get_coordinate().has_value(), rank != 3);
    if (rank == 3) {
      EXPECT_THROW(partial.get_group(0), std::runtime_error);
    } else {
      EXPECT_EQ(partial.get_local_rank(0), rank);
    }
  });
}

TEST(DeviceMesh, BadInputGivesClearErrors) {
  run_ranks(2, [](int, int) {
    auto expect_error = [](const std::function<void()>& f, const std::string& needle) {
      try {
        f();
        ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
      } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      }
    };
    expect_error([] { init_device_mesh("cpu", {3}); }, "holds 3 ranks but the world has 2");
    expect_error([] { init_device_mesh("xpu", {2}); }, "device_type 'xpu' is not supported");
    expect_error([] { init_device_mesh("cpu", {2, 1}, {"dp"}); }, "has 2 dims but 1 names");
    expect_error([] { init_device_mesh("cpu", {2, 1}, {"x", "x"}); }, "must be unique");
    expect_error([] { DeviceMesh("cpu", {2}, {0, 0}); }, "distinct");
    auto mesh = init_device_mesh("cpu", {2, 1}, {"dp", "tp"});
    expect_error([&] { mesh["pp"]; }, "mesh dim 'pp' not found; the mesh's dims are ('dp', 'tp')");
    expect_error([&] { mesh.slice({"tp", "dp"}); }, "in the mesh's order");
    expect_error([&] { mesh.size(2); }, "out of range");
  });
}
