// Gradients of the autograd collectives against single-process autograd on the full tensors.
//
// Each rank r holds x_r and computes a local loss l_r = <f(x)_r, w_r> with a rank-specific weight. The
// job's loss is L = sum_r l_r; each rank's x_r.grad must equal dL/dx_r computed in one process.
#include <gtest/gtest.h>

#include <numeric>

#include "dtensor/mesh/autograd_collectives.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/tensor/shard_layout.h"
#include "harness/multi_rank.h"

using namespace dtensor;
using dtensor::testing::for_each_world;
using dtensor::testing::seeded_randn;

namespace {
std::vector<at::Tensor> leaves(int world, uint64_t seed, const std::function<std::vector<int64_t>(int)>& shape) {
  std::vector<at::Tensor> xs;
  for (int r = 0; r < world; ++r) xs.push_back(seeded_randn(seed + r, shape(r)).set_requires_grad(true));
  return xs;
}
}  // namespace

TEST(AutogradCollectives, AllReduceSumAndAvg) {
  for_each_world({1, 2, 4}, [](int rank, int world) {
    auto& group = init_device_mesh("cpu", {world}).get_group(0);
    for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG}) {
      auto xs = leaves(world, 10, [](int) { return std::vector<int64_t>{3, 2}; });
      auto ws = leaves(world, 50, [](int) { return std::vector<int64_t>{3, 2}; });
      // Reference: y = sum_r x_r (or mean) seen by every rank, L = sum_r <y, w_r>.
      at::Tensor y_ref = op == ReduceOp::SUM ? at::stack(xs).sum(0) : at::stack(xs).mean(0);
      at::Tensor loss_ref = at::zeros({});
      for (int r = 0; r < world; ++r) loss_ref = loss_ref + (y_ref * ws[r].detach()).sum();
      loss_ref.backward();

      at::Tensor x = xs[rank].detach().clone().set_requires_grad(true);
      at::Tensor y = all_reduce_autograd(x, op, group);
      EXPECT_TRUE(at::allclose(y, y_ref, 1e-6, 1e-6));
      (y * ws[rank].detach()).sum().backward();
      // The backward is local (identity, or 1/n for avg): each rank's grad is its own loss term's share,
      // a Partial gradient whose sum over ranks is dL/dx_r.
      at::Tensor expected = op == ReduceOp::SUM ? ws[rank].detach() : ws[rank].detach() / world;
      EXPECT_TRUE(at::allclose(x.grad(), expected, 1e-6, 1e-6));
      EXPECT_TRUE(at::allclose(all_reduce(x.grad(), ReduceOp::SUM, group), xs[rank].grad(), 1e-5, 1e-6));
    }
  });
}

TEST(AutogradCollectives, AllGatherBackwardIsReduceScatter) {
  for_each_world({1, 2, 4}, [](int rank, int world) {
    auto& group = init_device_mesh("cpu", {world}).get_group(0);
    for (int64_t d : {0, 1}) {
      auto sizes = std::vector<int64_t>();
      for (int r = 0; r < world; ++r) sizes.push_back((r * 2 + 1) % 3);  // uneven, some empty
      auto xs = leaves(world, 60, [&](int r) { return d == 0 ? std::vector<int64_t>{sizes[r], 3}
                                                              : std::vector<int64_t>{3, sizes[r]}; });
      at::Tensor full = at::cat(xs, d);
      std::vector<at::Tensor> ws;
      for (int r = 0; r < world; ++r) ws.push_back(seeded_randn(90 + r, full.sizes()));
      at::Tensor loss_ref = at::zeros({});
      for (int r = 0; r < world; ++r) loss_ref = loss_ref + (full * ws[r]).sum();
      loss_ref.backward();

      at::Tensor x = xs[rank].detach().clone().set_requires_grad(true);
      at::Tensor y = all_gather_autograd(x, d, group);
      EXPECT_TRUE(at::equal(y, full.detach()));
      (y * ws[rank]).sum().backward();
      EXPECT_TRUE(at::allclose(x.grad(), xs[rank].grad(), 1e-5, 1e-6)) << "dim " << d << " world " << world;
    }
  });
}

TEST(AutogradCollectives, ReduceScatterBackwardIsAllGather) {
  for_each_world({1, 2, 4}, [](int rank, int world) {
    auto& group = init_device_mesh("cpu", {world}).get_group(0);
    for (int64_t size : {8, 5}) {
      auto xs = leaves(world, 70, [&](int) { return std::vector<int64_t>{size, 2}; });
      at::Tensor sum = at::stack(xs).sum(0);
      auto sizes = chunk_sizes(size, world);
      std::vector<at::Tensor> ws;
      at::Tensor loss_ref = at::zeros({});
      int64_t off = 0;
      for (int r = 0; r < world; ++r) {
        ws.push_back(seeded_randn(95 + r, {sizes[r], 2}));
        loss_ref = loss_ref + (sum.narrow(0, off, sizes[r]) * ws[r]).sum();
        off += sizes[r];
      }
      loss_ref.backward();

      at::Tensor x = xs[rank].detach().clone().set_requires_grad(true);
      at::Tensor y = reduce_scatter_autograd(x, ReduceOp::SUM, 0, group);
      (y * ws[rank]).sum().backward();
      EXPECT_TRUE(at::allclose(x.grad(), xs[rank].grad(), 1e-5, 1e-6)) << "size " << size;
    }
  });
}

TEST(AutogradCollectives, AllToAllBackwardIsReverseAllToAll) {
  for_each_world({1, 2, 4}, [](int rank, int world) {
    auto& group = init_device_mesh("cpu", {world}).get_group(0);
    // Rank r holds rows (dim 0) piece r of G (uneven); afterwards column piece r (dim 1).
    std::vector<int64_t> rows;
    for (int r = 0; r < world; ++r) rows.push_back(r % 2 + 1);
    int64_t total_rows = std::accumulate(rows.begin(), rows.end(), int64_t{0});
    at::Tensor global = seeded_randn(80, {total_rows, 5}).set_requires_grad(true);
    auto cols = chunk_sizes(5, world);
    at::Tensor loss_ref = at::zeros({});
    std::vector<at::Tensor> ws;
    int64_t c_off = 0;
    for (int r = 0; r < world; ++r) {
      ws.push_back(seeded_randn(85 + r, {total_rows, cols[r]}));
      loss_ref = loss_ref + (global.narrow(1, c_off, cols[r]) * ws[r]).sum();
      c_off += cols[r];
    }
    loss_ref.backward();

    int64_t r_off = std::accumulate(rows.begin(), rows.begin() + rank, int64_t{0});
    at::Tensor x = global.detach().narrow(0, r_off, rows[rank]).clone().set_requires_grad(true);
    at::Tensor y = all_to_all_autograd(x, 1, 0, group);
    (y * ws[rank]).sum().backward();
    EXPECT_TRUE(at::allclose(x.grad(), global.grad().narrow(0, r_off, rows[rank]), 1e-6, 1e-6));
  });
}

TEST(AutogradCollectives, BroadcastBackwardSumsToSource) {
  for_each_world({1, 2, 4}, [](int rank, int world) {
    auto& group = init_device_mesh("cpu", {world}).get_group(0);
    int src = world - 1;
    at::Tensor x = seeded_randn(120 + rank, {4}).set_requires_grad(true);
    at::Tensor y = broadcast_autograd(x, src, group);
    EXPECT_TRUE(at::equal(y, seeded_randn(120 + src, {4})));
    (y * (rank + 1)).sum().backward();
    double expected = rank == src ? world * (world + 1) / 2.0 : 0.0;
    EXPECT_TRUE(at::allclose(x.grad(), at::full({4}, expected))) << x.grad();
  });
}

// Expert parallelism's token dispatch: rank r sends (r + k) % 3 rows to rank k (some 0, some ranks send nothing
// to anyone at world 1 or 2), each row naming its source, destination and index; every rank receives exactly
// those rows in rank order, and the backward sends each row's gradient back to where the row came from.
TEST(AutogradCollectives, AllToAllSingleMovesUnevenRowsAndBackwardSendsGradientsHome) {
  for_each_world({1, 2, 4}, [](int rank, int world) {
    auto& group = init_device_mesh("cpu", {world}).get_group(0);
    auto rows_from_to = [](int src, int dst) { return static_cast<int64_t>((src + dst) % 3); };
    std::vector<int64_t> in_splits, out_splits;
    std::vector<at::Tensor> rows;
    for (int k = 0; k < world; ++k) {
      in_splits.push_back(rows_from_to(rank, k));
      out_splits.push_back(rows_from_to(k, rank));
      for (int64_t i = 0; i < rows_from_to(rank, k); ++i) {
        rows.push_back(at::tensor({static_cast<float>(rank), static_cast<float>(k), static_cast<float>(i)}));
      }
    }
    at::Tensor x = (rows.empty() ? at::zeros({0, 3}) : at::stack(rows)).set_requires_grad(true);
    at::Tensor y = all_to_all_single_autograd(x, out_splits, in_splits, group);
    ASSERT_EQ(y.size(0), std::accumulate(out_splits.begin(), out_splits.end(), int64_t{0}));
    int64_t row = 0;
    for (int src = 0; src < world; ++src) {
      for (int64_t i = 0; i < rows_from_to(src, rank); ++i, ++row) {
        EXPECT_TRUE(at::equal(y[row].detach(), at::tensor({static_cast<float>(src), static_cast<float>(rank),
                                                           static_cast<float>(i)})))
            << "rank " << rank << " row " << row;
      }
    }
    // Loss sum(y * (10 * receiver + 1)): each sent row's gradient is its receiver's weight.
    (y * (10.0 * rank + 1.0)).sum().backward();
    row = 0;
    for (int k = 0; k < world; ++k) {
      for (int64_t i = 0; i < rows_from_to(rank, k); ++i, ++row) {
        EXPECT_TRUE(at::allclose(x.grad()[row], at::full({3}, 10.0 * k + 1.0))) << "rank " << rank << " row " << row;
      }
    }
  });
}
