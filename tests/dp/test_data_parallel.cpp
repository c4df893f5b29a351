// Data parallel beside TP (dtensor/dp/replicate.h, fully_shard.h) on a small MLP: each dp rank trains on
// its rows of the batch, and after 3 AdamW steps the parameters equal single-process training on the whole
// batch; on a 2x2 ("dp", "tp") mesh after Colwise / Rowwise on mesh["tp"] too. (_StridedShard's geometry:
// tests/tensor/test_strided_shard.cpp.)
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include "dtensor/mesh/comm_hooks.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/dp/fully_shard.h"
#include "dtensor/nn/hooked_module.h"
#include "dtensor/tp/parallelize.h"
#include "dtensor/dp/replicate.h"
#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"
#include "harness/small_models.h"

using namespace dtensor;
using namespace dtensor::testing;

namespace {

constexpr int64_t kRows = 8;

void set_weights(torch::nn::Module& m) {
  c10::AutoGradMode no_grad(false);
  uint64_t seed = 1;
  for (auto& p : m.parameters()) p.copy_(seeded_randn(seed++, p.sizes()) * 0.3);
}

// 3 AdamW steps on rows [first, first + rows) of the batch; mean-squared loss.
void train(Mlp& mlp, int64_t first, int64_t rows) {
  std::vector<at::Tensor> params = mlp->parameters();
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  for (int step = 0; step < 3; ++step) {
    at::Tensor x = seeded_randn(100 + step, {kRows, 8}).narrow(0, first, rows);
    opt.zero_grad();
    at::Tensor out = mlp(x);
    at::Tensor loss = (is_dtensor(out) ? full_tensor(out) : out).pow(2).mean();
    loss.backward();
    opt.step();
  }
}

std::map<std::string, at::Tensor> full_params(Mlp& mlp) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : mlp->named_parameters()) {
    out[item.key()] = is_dtensor(item.value()) ? full_tensor(item.value()).detach() : item.value().detach();
  }
  return out;
}

const std::map<std::string, at::Tensor>& reference() {
  static const auto ref = [] {
    Mlp mlp;
    set_weights(*mlp);
    train(mlp, 0, kRows);
    return full_params(mlp);
  }();
  return ref;
}

void expect_reference(Mlp& mlp, const std::string& what) {
  for (const auto& [name, value] : full_params(mlp)) {
    EXPECT_TRUE(at::allclose(value, reference().at(name), 1e-5, 1e-6))
        << what << " " << name << ": max |diff| " << (value - reference().at(name)).abs().max().item<double>();
  }
}

enum class Kind { DDP, FSDP };

// dp ranks on a 1-D mesh (tp 1) or a 2-D ("dp", "tp") mesh with TP on mesh["tp"].
void run(Kind kind, int dp, int tp) {
  (void)reference();  // built before the ranks start
  run_ranks(dp * tp, [&](int, int world) {
    const DeviceMesh mesh = tp == 1 ? init_device_mesh("cpu", {world}, {"dp"}) : init_device_mesh("cpu", {dp, tp}, {"dp", "tp"});
    Mlp mlp;
    set_weights(*mlp);
    if (tp > 1) parallelize_module(*mlp, mesh["tp"], {{"in_proj", ColwiseParallel()}, {"out_proj", RowwiseParallel()}});
    if (kind == Kind::DDP) {
      replicate(*mlp, mesh);
    } else {
      fully_shard(*mlp->in_proj, mesh);
      fully_shard(*mlp->out_proj, mesh);
      for (const auto& p : mlp->parameters()) EXPECT_TRUE(is_fully_sharded(p));
      if (tp > 1) {  // Colwise weight: TP shards dim 0, so FSDP's dim-0 shard is strided
        EXPECT_EQ(placements(mlp->in_proj->weight), (Placements{_StridedShard(0, 2), Shard(0)}));
        EXPECT_EQ(placements(mlp->out_proj->weight), (Placements{Shard(0), Shard(1)}));
      }
    }
    const int64_t rows = kRows / dp;
    train(mlp, mesh.get_local_rank("dp") * rows, rows);
    expect_reference(mlp, kind == Kind::DDP ? "ddp" : "fsdp");
  });
}

}  // namespace

TEST(DataParallel, ReplicateMatchesOneProcess) { run(Kind::DDP, 2, 1); }
TEST(DataParallel, FullyShardMatchesOneProcess) { run(Kind::FSDP, 2, 1); }
TEST(DataParallel, ReplicateOverTensorParallelMatchesOneProcess) { run(Kind::DDP, 2, 2); }
TEST(DataParallel, FullyShardOverTensorParallelMatchesOneProcess) { run(Kind::FSDP, 2, 2); }

TEST(DataParallel, BadMeshesAreRefused) {
  run_ranks(2, [](int, int world) {
    const DeviceMesh flat = init_device_mesh("cpu", {world}, {"tp"});
    const DeviceMesh two_d = init_device_mesh("cpu", {1, world}, {"tp", "dp"});
    Mlp mlp;
    EXPECT_NE(error_of([&] { fully_shard(*mlp, two_d); }).find("(\"dp\", \"tp\")"), std::string::npos);
    EXPECT_NE(error_of([&] { replicate(*mlp, init_device_mesh("cpu", {1, world}, {"a", "b"})); }).find("\"dp\" dim"),
              std::string::npos);
    parallelize_module(*mlp, flat, {{"in_proj", ColwiseParallel()}});
    // A TP DTensor with a 1-D dp mesh: fully_shard needs the 2-D mesh to know the tp dim.
    EXPECT_NE(error_of([&] { fully_shard(*mlp->in_proj, flat); }).find("takes plain parameters or DTensors on its tp dim"),
              std::string::npos);
  });
}

namespace {

// A root with a layer of its own (`first`) before four fully_shard'ed layers, as Llama's embedding before
// its blocks.
struct StackImpl : torch::nn::Module {
  StackImpl() {
    first = register_module("first", nn::Linear(8, 8));
    for (int i = 0; i < 4; ++i) layers.push_back(register_module("l" + std::to_string(i), nn::Linear(8, 8)));
  }
  at::Tensor forward(at::Tensor x) {
    x = first(x);
    for (auto& l : layers) x = torch::tanh(l(x));
    return x;
  }
  nn::Linear first{nullptr};
  std::vector<nn::Linear> layers;
};
DTENSOR_MODULE(Stack);  // the root's hooks run on stack(x)

struct GatherCounts {
  int blocking = 0, async = 0;
};

// 3 AdamW steps of the stack under fully_shard at dp 2; the dp all-gathers of each step, and
// the parameters after the last step.
std::pair<std::vector<GatherCounts>, std::map<std::string, at::Tensor>> run_stack(bool prefetch, int rank) {
  const DeviceMesh mesh = init_device_mesh("cpu", {2}, {"dp"});
  Stack stack;
  set_weights(*stack);
  FullyShardOptions options;
  options.prefetch = prefetch;
  for (auto& l : stack->layers) fully_shard(*l, mesh, options);
  fully_shard(*stack, mesh, options);
  std::vector<at::Tensor> params = stack->parameters();
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-2));
  std::vector<GatherCounts> counts;
  for (int step = 0; step < 3; ++step) {
    GatherCounts c;
    CommObserverGuard observe([&](const CommEvent& e) {
      if (std::string(e.collective) == "all_gather") ++(e.async_op ? c.async : c.blocking);
    });
    opt.zero_grad();
    stack(seeded_randn(100 + step, {kRows, 8}).narrow(0, rank * kRows / 2, kRows / 2)).pow(2).mean().backward();
    opt.step();
    counts.push_back(c);
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& item : stack->named_parameters()) out[item.key()] = full_tensor(item.value()).detach();
  return {counts, out};
}

}  // namespace

// Prefetch: the first forward learns the order (root, l0..l3) and gathers on demand; from then on each
// layer's all-gather over dp is started asynchronously by the module after it in backward (l3 -> l2 -> l1
// -> l0: 3 of 4; the root keeps its parameters), and from step 2 by the one before it in forward (root ->
// l0 -> ... -> l3: 4 of 5). Same count of gathers, and the same parameters bit for bit as gathering on demand.
TEST(DataParallel, FullyShardPrefetchesTheNextModulesAllGather) {
  run_ranks(2, [&](int rank, int) {
    const auto [eager_counts, eager] = run_stack(/*prefetch=*/false, rank);
    const auto [counts, prefetched] = run_stack(/*prefetch=*/true, rank);
    for (size_t step = 0; step < 3; ++step) {
      EXPECT_EQ(eager_counts[step].blocking, 9) << "step " << step;
      EXPECT_EQ(eager_counts[step].async, 0) << "step " << step;
      EXPECT_EQ(counts[step].blocking, step == 0 ? 5 + 1 : 1 + 1) << "step " << step;  // forward + backward
      EXPECT_EQ(counts[step].async, step == 0 ? 0 + 3 : 4 + 3) << "step " << step;
    }
    for (const auto& [name, value] : eager) EXPECT_TRUE(at::equal(value, prefetched.at(name))) << name;
  });
}
