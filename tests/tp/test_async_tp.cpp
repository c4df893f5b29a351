// Async TP's fused ops (dtensor/tp/async_tp.h) against their unfused reference paths and against the
// whole computation on one rank, at TP 2 and 4 (ranks as threads, real process groups), for sequence
// parallel's shapes ([b, s, h], gather / scatter over the sequence dim 1) and plain [m, k] (dim 0); their
// gradients; and the pass (enable_async_tp.h) on a block of the user's own.
#include <gtest/gtest.h>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/tp/async_tp.h"
#include "dtensor/debug/comm_debug_mode.h"
#include "dtensor/tp/enable_async_tp.h"
#include "dtensor/nn/hooked_module.h"
#include "dtensor/nn/layers.h"
#include "dtensor/tp/parallelize.h"
#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"

using namespace dtensor;
using namespace dtensor::testing;

namespace {

double max_rel(const at::Tensor& a, const at::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item<double>();
}

}  // namespace

// all_gather(A) @ B for each B, with A gathered too: equal to the reference (one all_gather, then the
// matmuls) and to the full computation, on every rank.
TEST(AsyncTP, FusedAllGatherMatmulEqualsGatherThenMatmul) {
  for_each_world({2, 4}, [](int rank, int world) {
    const DeviceMesh mesh = init_device_mesh("cpu", {world});
    ProcessGroup& group = mesh.get_group(0);
    for (const auto& [shape, dim] : std::vector<std::pair<std::vector<int64_t>, int64_t>>{{{2, 16, 24}, 1}, {{32, 24}, 0}}) {
      const at::Tensor full = seeded_randn(1, shape);
      const at::Tensor shard = full.chunk(world, dim)[rank].contiguous();
      const std::vector<at::Tensor> Bs{seeded_randn(2, {24, 40}), seeded_randn(3, {24, 8})};
      const auto [gathered, outs] = fused_all_gather_matmul(shard, Bs, dim, group);
      const auto [ref_gathered, ref_outs] = reference::all_gather_matmul(shard, Bs, dim, group);
      EXPECT_TRUE(at::equal(gathered, full));
      EXPECT_TRUE(at::equal(ref_gathered, full));
      ASSERT_EQ(outs.size(), 2u);
      for (size_t i = 0; i < Bs.size(); ++i) {
        EXPECT_LE(max_rel(outs[i], ref_outs[i]), 1e-6) << "B " << i << " dim " << dim;
        EXPECT_LE(max_rel(outs[i], at::matmul(full, Bs[i])), 1e-6) << "B " << i << " dim " << dim;
      }
    }
  });
}

// reduce_scatter(A @ B): each rank's A is its rowwise-TP partial (its K slice); the sum over ranks,
// scattered over the rows, equals the reference and this rank's rows of the full product. SUM and AVG,
// in 1, 2 and 3 slices per block.
TEST(AsyncTP, FusedMatmulReduceScatterEqualsMatmulThenReduceScatter) {
  for_each_world({2, 4}, [](int rank, int world) {
    const DeviceMesh mesh = init_device_mesh("cpu", {world});
    ProcessGroup& group = mesh.get_group(0);
    for (const auto& [shape, dim] : std::vector<std::pair<std::vector<int64_t>, int64_t>>{{{2, 16, 32}, 1}, {{24, 32}, 0}}) {
      const at::Tensor A_full = seeded_randn(4, shape), B_full = seeded_randn(5, {32, 12});
      // Rowwise TP: rank r holds A's columns and B's rows of its K slice; the products are partial sums.
      const at::Tensor A = A_full.chunk(world, -1)[rank].contiguous(), B = B_full.chunk(world, 0)[rank].contiguous();
      const at::Tensor expected = at::matmul(A_full, B_full).chunk(world, dim)[rank];
      for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG}) {
        const at::Tensor ref = reference::matmul_reduce_scatter(A, B, op, dim, group);
        for (int64_t chunks : {1, 2, 3}) {
          const at::Tensor out = fused_matmul_reduce_scatter(A, B, op, dim, group, chunks);
          ASSERT_EQ(out.sizes(), ref.sizes());
          EXPECT_LE(max_rel(out, ref), 1e-6) << "chunks " << chunks << " dim " << dim;
          EXPECT_LE(max_rel(op == ReduceOp::AVG ? out * world : out, expected), 1e-5) << "chunks " << chunks;
        }
      }
    }
  });
}

TEST(AsyncTP, BadDimsAreRefused) {
  run_ranks(2, [](int, int world) {
    const DeviceMesh mesh = init_device_mesh("cpu", {world});
    ProcessGroup& group = mesh.get_group(0);
    const at::Tensor a = at::ones({6, 4});
    EXPECT_NE(error_of([&] { fused_all_gather_matmul(a, {at::ones({4, 2})}, 1, group); }).find("not one of its row dims"),
              std::string::npos);
    EXPECT_NE(error_of([&] { fused_matmul_reduce_scatter(at::ones({5, 4}), at::ones({4, 2}), ReduceOp::SUM, 0, group); })
                  .find("does not split evenly"),
              std::string::npos);
  });
}

// Autograd: each fused op's backward (the other fused op, plus plain weight-gradient matmuls) gives the
// gradients of the unfused path (the autograd collectives), for A's shard and every B, with the gathered A
// also read directly (its gradient reduce-scattered); fp64, so any indexing slip shows.
TEST(AsyncTP, GradientsEqualTheUnfusedPaths) {
  for_each_world({2, 4}, [](int rank, int world) {
    const DeviceMesh mesh = init_device_mesh("cpu", {world});
    ProcessGroup& group = mesh.get_group(0);
    const std::vector<int64_t> shape{2, 8 * world, 12};  // [b, s, h], gathered / scattered over s
    auto leaf = [&](int seed, std::vector<int64_t> s) { return seeded_randn(seed, s, at::kDouble).requires_grad_(); };
    {  // all-gather + matmul
      const at::Tensor full = seeded_randn(11, shape, at::kDouble);
      std::vector<at::Tensor> grads[2];
      for (int fused = 0; fused < 2; ++fused) {
        at::Tensor shard = full.chunk(world, 1)[rank].contiguous().requires_grad_();
        std::vector<at::Tensor> Bs{leaf(12, {12, 6}), leaf(13, {12, 10})};
        auto [gathered, outs] = fused ? fused_all_gather_matmul(shard, Bs, 1, mesh, 0)
                                      : reference::all_gather_matmul(shard, Bs, 1, group);
        // Weights that differ per rank: each rank's loss reads its own columns (as Colwise ranks do).
        at::Tensor loss = (outs[0] * seeded_randn(20 + rank, outs[0].sizes(), at::kDouble)).sum() +
                          (outs[1] * seeded_randn(30 + rank, outs[1].sizes(), at::kDouble)).sum() +
                          (gathered * gathered).sum() * 0.5;
        loss.backward();
        grads[fused] = {shard.grad(), Bs[0].grad(), Bs[1].grad()};
      }
      for (size_t i = 0; i < 3; ++i) EXPECT_LE(max_rel(grads[1][i], grads[0][i]), 1e-12) << "all-gather input " << i;
    }
    {  // matmul + reduce-scatter, SUM and AVG
      for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG}) {
        std::vector<at::Tensor> grads[2];
        for (int fused = 0; fused < 2; ++fused) {
          at::Tensor A = leaf(40 + rank, {2, 8 * world, 12}), B = leaf(50 + rank, {12, 7});
          at::Tensor z = fused ? fused_matmul_reduce_scatter(A, B, op, 1, mesh, 0, 3) : reference::matmul_reduce_scatter(A, B, op, 1, group);
          (z * seeded_randn(60 + rank, z.sizes(), at::kDouble)).sum().backward();
          grads[fused] = {A.grad(), B.grad()};
        }
        for (size_t i = 0; i < 2; ++i) EXPECT_LE(max_rel(grads[1][i], grads[0][i]), 1e-12) << "reduce-scatter input " << i;
      }
    }
  });
}

namespace {

// A feed-forward block as a user writes it (biases), for the pass.
struct GatedImpl : torch::nn::Module {
  GatedImpl()
      : a(register_module("a", nn::Linear(torch::nn::LinearOptions(12, 8)))),
        b(register_module("b", nn::Linear(torch::nn::LinearOptions(12, 8)))),
        out(register_module("out", nn::Linear(torch::nn::LinearOptions(8, 12)))) {}
  at::Tensor forward(const at::Tensor& x) { return out(a(x) * b(x)); }
  nn::Linear a, b, out;
};
DTENSOR_MODULE(Gated);

}  // namespace

// enable_async_tp on a plan of the user's own (PrepareModuleInput on the block itself, Colwise a and b with
// biases, Rowwise out with a bias and output Shard(1)): outputs and every gradient equal the synchronous
// plan's, at TP 2 and 4, and the fused ops replace the collectives.
TEST(AsyncTP, EnableAsyncTPMatchesTheSynchronousPlan) {
  for_each_world({2, 4}, [](int rank, int world) {
    const DeviceMesh mesh = init_device_mesh("cpu", {world});
    const ParallelizePlan plan = {
        {"", PrepareModuleInput({.input_layouts = {Shard(1)}, .desired_input_layouts = {Replicate()}})},
        {"a", ColwiseParallel()},
        {"b", ColwiseParallel()},
        {"out", RowwiseParallel({.output_layouts = Shard(1)})},
    };
    const at::Tensor x_full = seeded_randn(70, {2, 4 * world, 12});
    std::map<std::string, at::Tensor> grads[2];
    at::Tensor outputs[2], input_grads[2];
    std::map<std::string, int64_t> counts[2];
    for (int async = 0; async < 2; ++async) {
      Gated model;
      {  // the same weights in both runs (seeded per tensor: the global RNG is shared by the rank threads)
        at::NoGradGuard no_grad;
        int64_t seed = 100;
        for (auto& p : model->parameters()) p.copy_(seeded_randn(seed++, p.sizes()));
      }
      parallelize_module(*model, mesh, plan);
      if (async) {
        EXPECT_EQ(enable_async_tp(*model, mesh, plan), 2);  // the block's gather and out's scatter
        const std::string twice = dtensor::testing::error_of([&] { enable_async_tp(*model, mesh, plan); });
        EXPECT_NE(twice.find("enable_async_tp was already applied to this model"), std::string::npos) << twice;
      }
      at::Tensor x = x_full.chunk(world, 1)[rank].contiguous().requires_grad_();
      CommDebugMode comm;
      at::Tensor y = model(x);  // this rank's Shard(1) rows, local
      (y * seeded_randn(80 + rank, y.sizes())).sum().backward();
      counts[async] = comm.get_comm_counts();
      outputs[async] = y.detach();
      input_grads[async] = x.grad();
      for (const auto& p : model->named_parameters()) grads[async][p.key()] = full_tensor(p.value().grad());
    }
    EXPECT_LE(max_rel(outputs[1], outputs[0]), 1e-6);
    EXPECT_LE(max_rel(input_grads[1], input_grads[0]), 1e-6);
    for (const auto& [name, g] : grads[0]) EXPECT_LE(max_rel(grads[1].at(name), g), 1e-6) << name;
    EXPECT_EQ(counts[1]["fused_all_gather_matmul"], 2);      // forward a+b; backward of out
    EXPECT_EQ(counts[1]["fused_matmul_reduce_scatter"], 2);  // forward out; backward of a+b
    EXPECT_EQ(counts[1]["all_gather"] + counts[1]["reduce_scatter"], 0);
    EXPECT_EQ(counts[0]["all_gather"], 2);
  });
}
