// Gradients reduced once (dtensor/dp/gradient_sync.h): under sequence parallel the norm weights'
// Partial gradients are all-reduced by one bucketed collective during backward, after which clipping and
// AdamW communicate nothing but the total norm; the numbers equal single-device training. Accumulation
// with sync off reduces once after the last micro-batch; a bucket left incomplete by an unused parameter is
// reduced when backward ends; disabling it gives PyTorch's Partial gradients back.
#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/dp/clip_grad.h"
#include "dtensor/debug/comm_debug_mode.h"
#include "dtensor/dp/gradient_sync.h"
#include "dtensor/tp/parallelize.h"
#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"
#include "harness/small_models.h"

using namespace dtensor;
using namespace dtensor::testing;

namespace {

// Deterministic weights, the same on every rank and in the reference.
void set_weights(torch::nn::Module& m) {
  c10::AutoGradMode no_grad(false);
  uint64_t seed = 1;
  for (auto& p : m.parameters()) p.copy_(seeded_randn(seed++, p.sizes()) * 0.5 + (p.dim() == 1 ? 1.0 : 0.0));
}

// torchtitan's sequence-parallel block: norm on sequence shards, ffn gathered in, reduce-scattered out.
ParallelizePlan sp_plan() {
  return {{"norm", SequenceParallel()},
          {"ffn", PrepareModuleInput({.input_layouts = {Shard(1)}, .desired_input_layouts = {Replicate()}})},
          {"ffn.w1", ColwiseParallel()},
          {"ffn.w3", ColwiseParallel()},
          {"ffn.w2", RowwiseParallel({.output_layouts = Shard(1), .use_local_output = false})}};
}

at::Tensor loss_of(Block& block, const at::Tensor& x, const DeviceMesh* mesh) {
  const at::Tensor w = seeded_randn(77, x.sizes());
  if (mesh == nullptr) return (block->forward(x) * w).sum();
  at::Tensor out = block->forward(distribute_tensor(x, *mesh, {Shard(1)}));
  return (full_tensor(out) * w).sum();
}

std::map<std::string, at::Tensor> full_grads(torch::nn::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.named_parameters()) {
    const at::Tensor& g = p.value().grad();
    out[p.key()] = is_dtensor(g) ? full_tensor(g) : g.clone();
  }
  return out;
}

int64_t all_reduces(const CommDebugMode& comm) {
  auto counts = comm.get_comm_counts();
  return counts.contains("all_reduce") ? counts.at("all_reduce") : 0;
}

TEST(GradientSync, SequenceParallelNormGradsReducedOnceThenStepIsFree) {
  for_each_world({2, 4}, [](int, int world) {
    const at::Tensor x = seeded_randn(50, {2, 8, 8});
    Block ref;
    set_weights(*ref);
    loss_of(ref, x, nullptr).backward();
    const auto ref_grads = full_grads(*ref);
    torch::nn::utils::clip_grad_norm_(ref->parameters(), 0.5);
    torch::optim::AdamW ref_opt(ref->parameters(), torch::optim::AdamWOptions(1e-2));
    ref_opt.step();

    auto mesh = init_device_mesh("cpu", {world});
    Block block;
    set_weights(*block);
    parallelize_module(*block, mesh, sp_plan());
    EXPECT_TRUE(has_gradient_sync(block->norm->weight));
    EXPECT_TRUE(has_gradient_sync(block->ffn->w1->weight));
    at::Tensor loss = loss_of(block, x, &mesh);
    {
      CommDebugMode comm;
      loss.backward();
      // norm.weight and norm.bias: Partial over the sequence shards, reduced together by one all-reduce.
      EXPECT_EQ(all_reduces(comm), 1);
    }
    EXPECT_EQ(placements(block->norm->weight.grad()), Placements{Replicate()});
    EXPECT_EQ(placements(block->norm->bias.grad()), Placements{Replicate()});
    EXPECT_EQ(placements(block->ffn->w1->weight.grad()), placements(block->ffn->w1->weight));
    for (const auto& [name, g] : full_grads(*block)) EXPECT_TRUE(at::allclose(g, ref_grads.at(name), 1e-4, 1e-5)) << name << " world " << world << " max diff " << (g - ref_grads.at(name)).abs().max().item<double>();

    torch::optim::AdamW opt(block->parameters(), torch::optim::AdamWOptions(1e-2));
    {
      CommDebugMode comm;
      dtensor::clip_grad_norm_(block->parameters(), 0.5);
      opt.step();
      EXPECT_EQ(comm.get_total_counts(), 1);  // the total norm, nothing else
    }
    auto ref_params = ref->named_parameters();
    for (const auto& p : block->named_parameters()) {
      EXPECT_TRUE(at::allclose(full_tensor(p.value()).detach(), ref_params[p.key()].detach(), 1e-5, 1e-6)) << p.key();
    }
  });
}

TEST(GradientSync, AccumulationReducesOnceAfterTheLastMicroBatch) {
  run_ranks(2, [](int, int world) {
    const at::Tensor x1 = seeded_randn(51, {2, 8, 8}), x2 = seeded_randn(52, {2, 8, 8});
    Block ref;
    set_weights(*ref);
    loss_of(ref, x1, nullptr).backward();
    loss_of(ref, x2, nullptr).backward();
    const auto ref_grads = full_grads(*ref);

    auto mesh = init_device_mesh("cpu", {world});
    Block block;
    set_weights(*block);
    parallelize_module(*block, mesh, sp_plan());
    CommDebugMode comm;
    set_requires_gradient_sync(*block, false);
    loss_of(block, x1, &mesh).backward();
    EXPECT_TRUE(placements(block->norm->weight.grad())[0].is_partial());  // left as backward made it
    set_requires_gradient_sync(*block, true);
    loss_of(block, x2, &mesh).backward();
    EXPECT_EQ(all_reduces(comm), 1);  // Partial + Partial added locally, reduced once
    EXPECT_EQ(placements(block->norm->weight.grad()), Placements{Replicate()});
    for (const auto& [name, g] : full_grads(*block)) EXPECT_TRUE(at::allclose(g, ref_grads.at(name), 1e-4, 1e-5)) << name << " world " << world << " max diff " << (g - ref_grads.at(name)).abs().max().item<double>();
  });
}

// Two sequence-parallel norms, only `a` used: the bucket holding both never fills, and is reduced when
// backward ends.
struct TwoNormsImpl : torch::nn::Module {
  TwoNormsImpl() {
    a = register_module("a", nn::LayerNorm(torch::nn::LayerNormOptions({8})));
    b = register_module("b", nn::LayerNorm(torch::nn::LayerNormOptions({8})));
  }
  nn::LayerNorm a{nullptr}, b{nullptr};
};
TORCH_MODULE(TwoNorms);

TEST(GradientSync, IncompleteBucketIsReducedAtTheEndOfBackward) {
  run_ranks(2, [](int, int world) {
    const at::Tensor x = seeded_randn(53, {2, 8, 8}), w = seeded_randn(54, {2, 8, 8});
    TwoNorms ref;
    set_weights(*ref);
    (ref->a->forward(x) * w).sum().backward();

    auto mesh = init_device_mesh("cpu", {world});
    TwoNorms m;
    set_weights(*m);
    parallelize_module(*m, mesh, {{"a", SequenceParallel()}, {"b", SequenceParallel()}});
    CommDebugMode comm;
    (full_tensor(m->a->forward(distribute_tensor(x, mesh, {Shard(1)}))) * w).sum().backward();
    EXPECT_EQ(all_reduces(comm), 1);
    EXPECT_EQ(placements(m->a->weight.grad()), Placements{Replicate()});
    EXPECT_FALSE(m->b->weight.grad().defined());
    EXPECT_TRUE(at::allclose(full_tensor(m->a->weight.grad()), ref->a->weight.grad(), 1e-5, 1e-6));
    EXPECT_TRUE(at::allclose(full_tensor(m->a->bias.grad()), ref->a->bias.grad(), 1e-5, 1e-6));
  });
}

TEST(GradientSync, DisabledLeavesPyTorchsPartialGradients) {
  run_ranks(2, [](int, int world) {
    const at::Tensor x = seeded_randn(55, {2, 8, 8});
    Block ref;
    set_weights(*ref);
    loss_of(ref, x, nullptr).backward();
    auto mesh = init_device_mesh("cpu", {world});
    Block block;
    set_weights(*block);
    parallelize_module(*block, mesh, sp_plan());
    disable_gradient_sync(*block);
    EXPECT_FALSE(has_gradient_sync(block->norm->weight));
    CommDebugMode comm;
    loss_of(block, x, &mesh).backward();
    EXPECT_EQ(all_reduces(comm), 0);
    EXPECT_EQ(placements(block->norm->weight.grad()), Placements{Partial()});
    EXPECT_TRUE(at::allclose(full_tensor(block->norm->weight.grad()), ref->norm->weight.grad(), 1e-5, 1e-6));
    EXPECT_NE(dtensor::testing::error_of([] { enable_gradient_sync(std::vector<at::Tensor>{}, {.bucket_cap_bytes = 0}); }), "");
  });
}

}  // namespace
