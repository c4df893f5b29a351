// The tensor-parallel API on C++ models: the seeds' ToyModel under {in_proj: Colwise, out_proj: Rowwise}
// trains like the single-device model; plans that do not fit give clear errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtensor/debug/comm_debug_mode.h"
#include "dtensor/tp/head_replicated_colwise.h"
#include "dtensor/tp/loss_parallel.h"
#include "dtensor/tp/parallelize.h"
#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"
#include "harness/subprocess.h"
#include "toy_model.h"

using namespace dtensor;
using dtensor::testing::error_of;
using dtensor::testing::run_ranks;

namespace {

// The seeds' example: manual_seed(45), ToyModel, AdamW lr 0.05, `steps` steps of (output - target).var().
std::vector<double> toy_losses(int world, int steps) {
  std::vector<double> losses;
  std::mutex m;
  run_ranks(world, [&](int rank, int) {
    // Ranks are threads sharing LibTorch's global generator: seed and draw under a lock.
    ToyModel model{nullptr};
    at::Tensor input, target;
    {
      std::lock_guard<std::mutex> lock(m);
      torch::manual_seed(45);
      model = ToyModel();
      input = torch::randn({20, 10});
      target = torch::randn({20, 5});
    }
    auto mesh = init_device_mesh("cpu", {1, world}, {"dp", "tp"});
    parallelize_module(*model, mesh["tp"],
                       {{"in_proj", ColwiseParallel()}, {"out_proj", RowwiseParallel()}});
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(0.05));
    for (int i = 0; i < steps; ++i) {
      opt.zero_grad();
      at::Tensor loss = (model(input) - target).var();
      if (rank == 0) losses.push_back(loss.item<double>());
      loss.backward();
      opt.step();
    }
  });
  return losses;
}

}  // namespace

TEST(Parallelize, ToyModelLossesAtTp2EqualTp1) {
  auto tp1 = toy_losses(1, 10);
  auto tp2 = toy_losses(2, 10);
  ASSERT_EQ(tp1.size(), 10u);
  ASSERT_EQ(tp2.size(), 10u);
  for (size_t i = 0; i < tp1.size(); ++i) EXPECT_NEAR(tp2[i], tp1[i], 1e-5 * std::abs(tp1[i])) << "step " << i;
  EXPECT_LT(tp1.back(), tp1.front());  // it trains
}

TEST(Parallelize, ParametersAreShardedAndCollectivesAreAsSeedsTable) {
  run_ranks(2, [](int, int) {
    ToyModel model;
    auto mesh = init_device_mesh("cpu", {2});
    parallelize_module(*model, mesh, {{"in_proj", ColwiseParallel()}, {"out_proj", RowwiseParallel()}});
    EXPECT_EQ(placements(model->in_proj->weight), Placements{Shard(0)});
    EXPECT_EQ(placements(model->in_proj->bias), Placements{Shard(0)});
    EXPECT_EQ(placements(model->out_proj->weight), Placements{Shard(1)});
    EXPECT_EQ(placements(model->out_proj->bias), Placements{Replicate()});
    EXPECT_EQ(model->in_proj->weight.sizes(), (at::IntArrayRef{32, 10}));  // global shape
    CommDebugMode comm;
    at::Tensor out = model(torch::ones({4, 10}));
    // Colwise with replicated input: no collective; Rowwise to Replicate: one all-reduce, in out_proj.
    EXPECT_EQ(comm.get_comm_counts(), (std::map<std::string, int64_t>{{"all_reduce", 1}}));
    EXPECT_EQ(comm.get_comm_module_counts().at("out_proj").at("all_reduce"), 1);
    EXPECT_EQ(comm.get_comm_bytes().at("all_reduce"), 4 * 5 * 4);  // [4, 5] float32
    out.sum().backward();
    // Backward: Rowwise's all-reduce has an identity backward; Colwise's replicated input gets its
    // gradient all-reduced (Partial -> Replicate) only if someone asks for it: nobody does here.
    EXPECT_EQ(comm.get_total_counts(), 1);
  });
}

TEST(Parallelize, BadPlansGiveClearErrors) {
  run_ranks(2, [](int, int) {
    auto mesh2d = init_device_mesh("cpu", {1, 2}, {"dp", "tp"});
    ToyModel model;
    std::string e = error_of([&] { parallelize_module(*model, mesh2d, {{"in_proj", ColwiseParallel()}}); });
    EXPECT_NE(e.find("Tensor Parallel only accepts a 1D DeviceMesh, but found 2D"), std::string::npos) << e;
    auto mesh = mesh2d["tp"];
    e = error_of([&] { parallelize_module(*model, mesh, {{"in_prj", ColwiseParallel()}}); });
    EXPECT_NE(e.find("'in_prj' matches no submodule; the closest module paths are 'in_proj'"), std::string::npos) << e;
    e = error_of([&] { parallelize_module(*model, mesh, {{"relu", RowwiseParallel()}}); });
    EXPECT_NE(e.find("RowwiseParallel applies to Linear and Embedding, but 'relu' is a torch::nn::ReLU"),
              std::string::npos)
        << e;
    e = error_of([&] { style_from_string("colwize"); });
    EXPECT_NE(e.find("unknown tensor-parallel style 'colwize'"), std::string::npos) << e;
    // Glob keys and string plans.
    auto paths = match_module_paths(*model, "*_proj");
    EXPECT_EQ(paths, (std::vector<std::string>{"in_proj", "out_proj"}));
    parallelize_module(*model, mesh, plan_from_strings({{"in_proj", "colwise"}, {"out_proj", "rowwise"}}));
    EXPECT_EQ(placements(model->out_proj->weight), Placements{Shard(1)});
  });
}

// HeadReplicatedColwiseParallel learns the TP degree from the mesh: heads that the degree divides neither way
// fail while parallelize_module validates the plan, before any entry applies; a degree that is a multiple of
// the heads replicates each head.
TEST(Parallelize, HeadReplicatedColwiseTakesTheDegreeFromTheMesh) {
  run_ranks(2, [](int, int world) {
    auto mesh = init_device_mesh("cpu", {world});
    ToyModel model;  // out_proj: Linear(.., 5)
    std::string e = error_of([&] {
      parallelize_module(*model, mesh, {{"in_proj", ColwiseParallel()},
                                        {"out_proj", HeadReplicatedColwiseParallel({.num_heads = 5, .head_dim = 1})}});
    });
    EXPECT_NE(e.find("HeadReplicatedColwiseParallel on 'out_proj': 5 key/value heads and TP degree 2 divide neither way"),
              std::string::npos)
        << e;
    EXPECT_FALSE(is_dtensor(model->in_proj->weight)) << "an entry applied before the plan was validated";
    parallelize_module(*model, mesh, {{"out_proj", HeadReplicatedColwiseParallel({.num_heads = 1, .head_dim = 5})}});
    EXPECT_EQ(placements(model->out_proj->weight), Placements{Replicate()});  // one head, on both ranks
  });
}

TEST(Parallelize, ToyTpProgramUnderTprun) {
  auto r = dtensor::testing::run_process(
      {dtensor::testing::bin_path("tprun"), "--nproc-per-node", "2", "--master-port", "0", "toy_tp"}, {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank0]: loss 9 "), std::string::npos) << r.output;
}

TEST(LossParallel, CrossEntropyOnVocabShardedLogitsEqualsReplicated) {
  // Logits [N, C] with C uneven over 4 ranks; targets with an ignored sample; weights; every reduction;
  // label smoothing. Forward and the logits' gradient equal the replicated computation, and the logits
  // are never gathered.
  at::Tensor logits = dtensor::testing::seeded_randn(31, {6, 11});
  at::Tensor labels = at::tensor({3, 10, 0, -100, 7, 5}, at::kLong);
  at::Tensor weight = dtensor::testing::seeded_randn(32, {11}).abs() + 0.5;
  struct Case {
    int64_t reduction;
    double smoothing;
    bool weighted;
  };
  for (Case c : {Case{1, 0.0, false}, Case{2, 0.0, true}, Case{0, 0.0, false}, Case{1, 0.1, false}, Case{1, 0.2, true}}) {
    SCOPED_TRACE("reduction " + std::to_string(c.reduction) + " smoothing " + std::to_string(c.smoothing));
    at::Tensor ref_in = logits.clone().set_requires_grad(true);
    at::Tensor w = c.weighted ? weight : at::Tensor();
    at::Tensor ref = at::cross_entropy_loss(ref_in, labels, w, c.reduction, -100, c.smoothing);
    ref.sum().backward();
    run_ranks(4, [&](int, int) {
      auto mesh = init_device_mesh("cpu", {4});
      at::Tensor x = distribute_tensor(logits, mesh, {Shard(1)}).set_requires_grad(true);
      at::Tensor t = distribute_tensor(labels, mesh, {Replicate()});
      at::Tensor dw = c.weighted ? distribute_tensor(weight, mesh, {Replicate()}) : at::Tensor();
      LossParallelGuard guard;
      CommDebugMode comm;
      at::Tensor loss = at::cross_entropy_loss(x, t, dw, c.reduction, -100, c.smoothing);
      EXPECT_EQ(comm.get_comm_counts().count("all_gather"), 0u) << comm.table();
      EXPECT_TRUE(at::allclose(full_tensor(loss), ref.detach(), 1e-5, 1e-6));
      loss.sum().backward();
      EXPECT_EQ(placements(x.grad()), Placements{Shard(1)});
      EXPECT_TRUE(at::allclose(full_tensor(x.grad()), ref_in.grad(), 1e-5, 1e-6));
    });
  }
}
