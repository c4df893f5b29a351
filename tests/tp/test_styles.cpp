// Every parallel style alone on a standard layer: forward output and every parameter gradient equal the
// single-device module's, and the collectives per forward are the seeds' table (seed 001).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtensor/ops/dispatch_options.h"
#include "dtensor/debug/comm_debug_mode.h"
#include "dtensor/nn/layers.h"
#include "dtensor/tp/parallelize.h"
#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"

#include <mutex>

using namespace dtensor;
using dtensor::testing::run_ranks;
using dtensor::testing::seeded_randn;

namespace {

at::Tensor full_of(const at::Tensor& t) { return is_dtensor(t) ? full_tensor(t).detach() : t.detach(); }

// Runs `make()` single-device and parallelized with `style`; feeds `input` (the parallel side gets this
// rank's local piece of it under `input_placement`); compares output (made full) and parameter grads;
// returns the forward's collective counts.
std::map<std::string, int64_t> check_style(const std::function<std::shared_ptr<torch::nn::Module>()>& make,
                                           const std::function<at::Tensor(torch::nn::Module&, const at::Tensor&)>& forward,
                                           const ParallelStyleRef& style, const at::Tensor& input,
                                           const Placement& input_placement, int world) {
  std::map<std::string, int64_t> counts;
  std::mutex m;
  run_ranks(world, [&](int rank, int) {
    std::shared_ptr<torch::nn::Module> ref, par;
    {
      std::lock_guard<std::mutex> lock(m);  // LibTorch's generator is global: build both from one seed
      torch::manual_seed(3);
      ref = make();
      torch::manual_seed(3);
      par = make();
    }
    at::Tensor ref_out = forward(*ref, input);
    at::Tensor w = seeded_randn(9, ref_out.sizes());
    (ref_out * w).sum().backward();

    auto mesh = init_device_mesh("cpu", {world});
    parallelize_module(*par, mesh, style);
    at::Tensor local_in = to_local(distribute_tensor(input, mesh, {input_placement}));
    at::Tensor out;
    {
      CommDebugMode comm;
      out = forward(*par, local_in);
      if (rank == 0) counts = comm.get_comm_counts();
      if (rank == 0 && !comm.get_comm_counts().empty()) std::cout << comm.table();
    }
    EXPECT_TRUE(at::allclose(full_of(out), ref_out.detach(), 1e-5, 1e-6));
    (is_dtensor(out) ? (full_tensor(out) * w).sum() : (out * w).sum()).backward();
    auto ref_params = ref->named_parameters();
    for (const auto& p : par->named_parameters()) {
      ASSERT_TRUE(p.value().grad().defined()) << p.key();
      EXPECT_TRUE(at::allclose(full_of(p.value().grad()), ref_params[p.key()].grad(), 1e-5, 1e-6)) << p.key();
    }
  });
  return counts;
}

template <typename Style>
ParallelStylePtr local_output_off(Style s) {
  s.use_local_output = false;
  return make_style(s);
}

auto linear = [] { return std::static_pointer_cast<torch::nn::Module>(nn::Linear(8, 12).ptr()); };
auto linear_fwd = [](torch::nn::Module& m, const at::Tensor& x) { return dynamic_cast<nn::LinearImpl&>(m).forward(x); };

}  // namespace

TEST(Styles, ColwiseLinearWithReplicatedInputHasNoForwardCollective) {
  auto counts = check_style(linear, linear_fwd, local_output_off(ColwiseParallel{}), seeded_randn(1, {5, 8}), Replicate(), 2);
  EXPECT_TRUE(counts.empty());
}

TEST(Styles, RowwiseLinearToReplicateIsOneAllReduce) {
  auto counts = check_style(linear, linear_fwd, local_output_off(RowwiseParallel{}), seeded_randn(2, {5, 8}), Shard(-1), 2);
  EXPECT_EQ(counts, (std::map<std::string, int64_t>{{"all_reduce", 1}}));
}

TEST(Styles, RowwiseLinearToShard1IsOneReduceScatter) {
  RowwiseParallel s;
  s.output_layouts = Shard(1);
  auto counts = check_style(linear, linear_fwd, local_output_off(s), seeded_randn(3, {2, 6, 8}), Shard(-1), 2);
  EXPECT_EQ(counts, (std::map<std::string, int64_t>{{"reduce_scatter", 1}}));
}

TEST(Styles, EmbeddingColwiseAndRowwise) {
  auto emb = [] { return std::static_pointer_cast<torch::nn::Module>(nn::Embedding(10, 6).ptr()); };
  auto fwd = [](torch::nn::Module& m, const at::Tensor& ids) { return dynamic_cast<nn::EmbeddingImpl&>(m).forward(ids); };
  at::Tensor ids = at::tensor({1, 9, 4, 0, 4, 7}, at::kLong).reshape({2, 3});
  auto col = check_style(emb, fwd, local_output_off(ColwiseParallel{}), ids, Replicate(), 2);
  EXPECT_TRUE(col.empty());
  RowwiseParallel row;
  row.input_layouts = Replicate();
  // Vocab-sharded: each rank looks up what it owns (a masked Partial), then one all-reduce.
  auto counts = check_style(emb, fwd, local_output_off(row), ids, Replicate(), 4);
  EXPECT_EQ(counts, (std::map<std::string, int64_t>{{"all_reduce", 1}}));
}

TEST(Styles, SequenceParallelNorms) {
  auto ln = [] { return std::static_pointer_cast<torch::nn::Module>(nn::LayerNorm(torch::nn::LayerNormOptions({8})).ptr()); };
  auto ln_fwd = [](torch::nn::Module& m, const at::Tensor& x) { return dynamic_cast<nn::LayerNormImpl&>(m).forward(x); };
  auto counts = check_style(ln, ln_fwd, SequenceParallel(), seeded_randn(4, {2, 6, 8}), Shard(1), 2);
  EXPECT_TRUE(counts.empty());
  auto rms = [] { return std::static_pointer_cast<torch::nn::Module>(nn::RMSNorm(8).ptr()); };
  auto rms_fwd = [](torch::nn::Module& m, const at::Tensor& x) { return dynamic_cast<nn::RMSNormImpl&>(m).forward(x); };
  counts = check_style(rms, rms_fwd, SequenceParallel(), seeded_randn(5, {2, 6, 8}), Shard(1), 2);
  EXPECT_TRUE(counts.empty());
}

TEST(Styles, PrepareModuleInputShard1ToReplicateIsOneAllGather) {
  PrepareModuleInput s;  // in front of a module with plain parameters: hand it plain tensors
  s.input_layouts = {Shard(1)};
  s.desired_input_layouts = {Replicate()};
  s.use_local_output = true;
  auto counts = check_style(linear, linear_fwd, make_style(s), seeded_randn(6, {2, 6, 8}), Shard(1), 2);
  EXPECT_EQ(counts, (std::map<std::string, int64_t>{{"all_gather", 1}}));
}

TEST(Styles, SequenceParallelDropoutIsTheSameMaskAtAnyShardingAndItsGradientFollows) {
  // Dropout under SequenceParallel draws one mask for the global tensor (dtensor::manual_seed), so the
  // full output does not depend on the TP degree, and the backward uses the forward's mask.
  const double p = 0.25;
  at::Tensor x = seeded_randn(7, {2, 8, 6}), g = seeded_randn(8, {2, 8, 6});
  std::map<int, at::Tensor> outputs;
  std::mutex m;
  for (int world : {2, 4}) {
    run_ranks(world, [&](int rank, int) {
      nn::Dropout dropout(p);
      dropout->train();
      auto mesh = init_device_mesh("cpu", {world});
      parallelize_module(*dropout, mesh, SequenceParallel());
      dtensor::manual_seed(7);
      at::Tensor local_x = to_local(distribute_tensor(x, mesh, {Shard(1)})).detach().requires_grad_(true);
      at::Tensor out = dropout(local_x);
      ASSERT_EQ(placements(out), Placements{Shard(1)});
      at::Tensor full = full_tensor(out).detach();
      to_local(out).backward(to_local(distribute_tensor(g, mesh, {Shard(1)})));
      at::Tensor expected_grad = at::where(full != 0, g / (1 - p), at::zeros_like(g)).chunk(world, 1)[rank];
      EXPECT_TRUE(at::allclose(local_x.grad(), expected_grad));
      EXPECT_TRUE(at::allclose(full.masked_select(full != 0), (x / (1 - p)).masked_select(full != 0)));
      std::lock_guard<std::mutex> lock(m);
      outputs[world] = full;
    });
  }
  EXPECT_TRUE(at::equal(outputs[2], outputs[4]));
  const double kept = (outputs[2] != 0).to(at::kDouble).mean().item<double>();
  EXPECT_GT(kept, 0.5);  // 96 values, 3/4 kept on average
  EXPECT_LT(kept, 0.95);
}

// Colwise -> Rowwise over features that do not divide by the ranks (10 over 3: 4, 4, 2; over 4: 3, 3, 3, 1).
// The Colwise output is made local, so the Rowwise layer takes the global size of its input's last dim from
// its weight's in_features (PyTorch assumes even shards there and fails). Output and every gradient equal the
// single-device model's; an input whose last dim is not this rank's chunk of in_features is refused.
TEST(Styles, ColwiseThenRowwiseWithUnevenFeatures) {
  for (int world : {3, 4}) {
    run_ranks(world, [&](int rank, int) {
      auto make = [] {
        return torch::nn::Sequential(nn::Linear(8, 10), nn::Linear(10, 8));
      };
      torch::nn::Sequential ref = make(), par = make();
      {
        at::NoGradGuard no_grad;
        int64_t seed = 40;
        auto ref_params = ref->parameters();
        auto par_params = par->parameters();
        for (size_t i = 0; i < ref_params.size(); ++i) {
          ref_params[i].copy_(seeded_randn(seed, ref_params[i].sizes()));
          par_params[i].copy_(seeded_randn(seed++, par_params[i].sizes()));
        }
      }
      const at::Tensor x = seeded_randn(41, {2, 5, 8}), w = seeded_randn(42, {2, 5, 8});
      (ref->forward(x) * w).sum().backward();
      auto mesh = init_device_mesh("cpu", {world});
      parallelize_module(*par, mesh, ParallelizePlan{{"0", ColwiseParallel()}, {"1", RowwiseParallel()}});
      at::Tensor y = par->forward(x);
      EXPECT_TRUE(at::allclose(y, ref->forward(x).detach(), 1e-5, 1e-6));
      (y * w).sum().backward();
      auto ref_params = ref->named_parameters();
      for (const auto& p : par->named_parameters()) {
        EXPECT_TRUE(at::allclose(full_of(p.value().grad()), ref_params[p.key()].grad(), 1e-5, 1e-6)) << p.key();
      }
      // The whole 10 features handed to the Rowwise layer, as if its input were not Colwise's output.
      auto* row = par[1]->as<nn::Linear>();
      try {
        row->forward(at::ones({2, 10}));
        ADD_FAILURE() << "a full input was taken as a shard";
      } catch (const std::exception& e) {
        const std::string expected = "RowwiseParallel on '1': the input's dim 1 has 10 local entries, but Shard(1) of 10 over " +
                                     std::to_string(world) + " ranks gives rank " + std::to_string(rank);
        EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
      }
    });
  }
}
