// Every functional collective against a single-process reference: worlds 1, 2, 4; every tensor dim;
// even, uneven and empty pieces.
#include <gtest/gtest.h>

#include <numeric>

#include "dtensor/mesh/comm_hooks.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/tensor/shard_layout.h"
#include "harness/multi_rank.h"

using namespace dtensor;
using dtensor::testing::for_each_world;
using dtensor::testing::seeded_randn;

namespace {

std::vector<int64_t> with_dim(std::vector<int64_t> shape, int64_t d, int64_t size) {
  shape[d] = size;
  return shape;
}

// Per-rank sizes along a dim, uneven and sometimes empty.
std::vector<int64_t> uneven_sizes(int world, int variant) {
  std::vector<int64_t> sizes;
  for (int r = 0; r < world; ++r) sizes.push_back(variant == 0 ? 2 : (r * 3 + variant) % 4);
  return sizes;
}

}  // namespace

TEST(Collectives, ChunkSizesMatchTorchChunk) {
  for (int64_t n = 1; n <= 5; ++n) {
    for (int64_t size = 0; size <= 13; ++size) {
      auto sizes = chunk_sizes(size, n);
      auto chunks = at::arange(size).chunk(n);
      for (int64_t i = 0; i < n; ++i) {
        int64_t expected = i < static_cast<int64_t>(chunks.size()) ? chunks[i].size(0) : 0;
        EXPECT_EQ(sizes[i], expected) << "size " << size << " over " << n << ", chunk " << i;
      }
      EXPECT_EQ(std::accumulate(sizes.begin(), sizes.end(), int64_t{0}), size);
    }
  }
}

TEST(Collectives, AllReduceEveryOp) {
  for_each_world({1, 2, 4}, [](int rank, int world) {
    auto mesh = init_device_mesh("cpu", {world});
    std::vector<at::Tensor> inputs;
    for (int r = 0; r < world; ++r) inputs.push_back(seeded_randn(100 + r, {3, 5}));
    at::Tensor stacked = at::stack(inputs);
    for (auto [op, expected] : std::vector<std::pair<ReduceOp, at::Tensor>>{
             {ReduceOp::SUM, stacked.sum(0)},
             {ReduceOp::AVG, stacked.mean(0)},
             {ReduceOp::MAX, std::get<0>(stacked.max(0))},
             {ReduceOp::MIN, std::get<0>(stacked.min(0))}}) {
      at::Tensor input = inputs[rank].clone();
      at::Tensor out = all_reduce(input, op, mesh, 0);
      EXPECT_TRUE(at::allclose(out, expected, 1e-6, 1e-6)) << reduce_op_name(op) << " world " << world;
      EXPECT_TRUE(at::equal(input, inputs[rank])) << "input modified";
    }
  });
}

TEST(Collectives, AllGatherAnyDimUnevenAndEmpty) {
  for_each_world({1, 2, 4}, [](int rank, int world) {
    auto mesh = init_device_mesh("cpu", {world});
    const std::vector<int64_t> base{3, 4, 2};
    for (int64_t d = 0; d < 3; ++d) {
      for (int variant : {0, 1, 2}) {
        auto sizes = uneven_sizes(world, variant);
        std::vector<at::Tensor> inputs;
        for (int r = 0; r < world; ++r) inputs.push_back(seeded_randn(10 * d + r, with_dim(base, d, sizes[r])));
        at::Tensor expected = at::cat(inputs, d);
        at::Tensor exchanged = all_gather(inputs[rank], d, mesh, 0);  // sizes learnt by exchange
        at::Tensor given = all_gather(inputs[rank], d - 3, mesh, 0, sizes);  // negative dim, sizes known
        EXPECT_TRUE(at::equal(exchanged, expected)) << "dim " << d << " variant " << variant;
        EXPECT_TRUE(at::equal(given, expected)) << "dim " << d << " variant " << variant;
      }
    }
  });
}

TEST(Collectives, ReduceScatterAnyDimUneven) {
  for_each_world({1, 2, 4}, [](int rank, int world) {
    auto mesh = init_device_mesh("cpu", {world});
    for (int64_t d = 0; d < 2; ++d) {
      for (int64_t dim_size : {8, 7, 3, 1, 0}) {
        std::vector<int64_t> shape = with_dim({5, 6}, d, dim_size);
        std::vector<at::Tensor> inputs;
        for (int r = 0; r < world; ++r) inputs.push_back(seeded_randn(200 + r, shape));
        at::Tensor stacked = at::stack(inputs);
        auto sizes = chunk_sizes(dim_size, world);
        int64_t offset = std::accumulate(sizes.begin(), sizes.begin() + rank, int64_t{0});
        for (auto [op, reduced] : std::vector<std::pair<ReduceOp, at::Tensor>>{
                 {ReduceOp::SUM, stacked.sum(0)}, {ReduceOp::AVG, stacked.mean(0)},
                 {ReduceOp::MAX, std::get<0>(stacked.max(0))}}) {
          at::Tensor out = reduce_scatter(inputs[rank], op, d, mesh, 0);
          at::Tensor expected = reduced.narrow(d, offset, sizes[rank]);
          EXPECT_EQ(out.sizes(), expected.sizes()) << "dim " << d << " size " << dim_size;
          EXPECT_TRUE(at::allclose(out, expected, 1e-6, 1e-6)) << reduce_op_name(op) << " dim " << d << " size " << dim_size;
        }
      }
    }
  });
}

TEST(Collectives, ReduceScatterExplicitSizes) {
  for_each_world({2, 4}, [](int rank, int world) {
    auto mesh = init_device_mesh("cpu", {world});
    auto sizes = uneven_sizes(world, 1);
    int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
    std::vector<at::Tensor> inputs;
    for (int r = 0; r < world; ++r) inputs.push_back(seeded_randn(300 + r, {2, total}));
    at::Tensor sum = at::stack(inputs).sum(0);
    int64_t offset = std::accumulate(sizes.begin(), sizes.begin() + rank, int64_t{0});
    at::Tensor out = reduce_scatter(inputs[rank], ReduceOp::SUM, 1, mesh.get_group(0), sizes);
    EXPECT_TRUE(at::allclose(out, sum.narrow(1, offset, sizes[rank]), 1e-6, 1e-6));
  });
}

TEST(Collectives, AllToAllShardToShard) {
  for_each_world({1, 2, 4}, [](int rank, int world) {
    auto mesh = init_device_mesh("cpu", {world});
    // Global tensor G; rank r holds G's piece r along concat dim c; afterwards it holds piece r along s.
    for (auto [s, c] : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 0}, {2, 0}, {0, 2}}) {
      for (int64_t split_size : {8, 6, 3, 0}) {
        for (int variant : {0, 1}) {
          auto concat_sizes = uneven_sizes(world, variant);
          int64_t concat_total = std::accumulate(concat_sizes.begin(), concat_sizes.end(), int64_t{0});
          std::vector<int64_t> shape{4, 3, 2};
          shape[s] = split_size;
          shape[c] = concat_total;
          at::Tensor global = seeded_randn(400 + s * 10 + c, shape);
          int64_t c_off = std::accumulate(concat_sizes.begin(), concat_sizes.begin() + rank, int64_t{0});
          at::Tensor mine = global.narrow(c, c_off, concat_sizes[rank]);
          auto split_sizes = chunk_sizes(split_size, world);
          int64_t s_off = std::accumulate(split_sizes.begin(), split_sizes.begin() + rank, int64_t{0});
          at::Tensor expected = global.narrow(s, s_off, split_sizes[rank]);
          EXPECT_TRUE(at::equal(all_to_all(mine, s, c, mesh, 0), expected))
              << "split " << s << " concat " << c << " size " << split_size << " variant " << variant;
          EXPECT_TRUE(at::equal(all_to_all(mine, s, c, mesh, 0, concat_sizes), expected));
        }
      }
    }
  });
}

TEST(Collectives, BroadcastFromEveryRank) {
  for_each_world({1, 2, 4}, [](int rank, int world) {
    auto mesh = init_device_mesh("cpu", {world});
    for (int src = 0; src < world; ++src) {
      at::Tensor mine = seeded_randn(500 + rank, {3, 2});
      at::Tensor out = broadcast(mine, src, mesh, 0);
      EXPECT_TRUE(at::equal(out, seeded_randn(500 + src, {3, 2})));
    }
  });
}

TEST(Collectives, CollectivesOnA2x2MeshDim) {
  dtensor::testing::run_ranks(4, [](int rank, int) {
    auto mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
    at::Tensor mine = at::full({1, 2}, double(rank));
    at::Tensor g = all_gather(mine, 0, mesh, 1);  // along tp: the row's ranks
    EXPECT_TRUE(at::equal(g.select(1, 0), at::tensor({rank / 2 * 2, rank / 2 * 2 + 1}, at::kFloat)));
    g = all_gather(mine, 0, mesh, 0);  // along dp: the column's ranks
    EXPECT_TRUE(at::equal(g.select(1, 0), at::tensor({rank % 2, rank % 2 + 2}, at::kFloat)));
  });
}

TEST(Collectives, EveryCollectivePassesTheCommHook) {
  dtensor::testing::run_ranks(2, [](int, int) {
    auto mesh = init_device_mesh("cpu", {2});
    std::vector<std::pair<std::string, int64_t>> seen;
    {
      CommObserverGuard guard([&](const CommEvent& e) { seen.emplace_back(e.collective, e.bytes); });
      at::Tensor x = at::ones({4, 2});
      all_reduce(x, ReduceOp::SUM, mesh, 0);
      all_gather(x, 0, mesh, 0, std::vector<int64_t>{4, 4});
      reduce_scatter(x, ReduceOp::SUM, 0, mesh, 0);
      all_to_all(x, 0, 1, mesh, 0, std::vector<int64_t>{2, 2});
    }
    all_reduce(at::ones({1}), ReduceOp::SUM, mesh, 0);  // after the guard: not seen
    std::vector<std::pair<std::string, int64_t>> expected{
        {"all_reduce", 32}, {"all_gather", 32}, {"reduce_scatter", 32}, {"all_to_all", 32}};
    EXPECT_EQ(seen, expected);
  });
}
