// Activation checkpointing (dtensor/nn/checkpoint.h) on a small block, plain and under a TP plan: the wrapped block
// keeps no intermediate (its output's one node is CheckpointBackward), runs its forward again in backward (an inner
// layer's hook counts two calls per step), and gives bit-equal gradients, dropout included (the generator's state is
// restored for the recompute). The whole model's case (every layout, FSDP and DDP) is tests/train.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/nn/checkpoint.h"
#include "dtensor/nn/hooked_module.h"
#include "dtensor/nn/layers.h"
#include "dtensor/nn/module_hooks.h"
#include "dtensor/tp/parallelize.h"
#include "dtensor/tp/style.h"
#include "harness/multi_rank.h"

using namespace dtensor;
using dtensor::testing::run_ranks;
using dtensor::testing::seeded_randn;

namespace {

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(double p) : dropout_p(p) {
    up = register_module("up", nn::Linear(torch::nn::LinearOptions(8, 16)));
    down = register_module("down", nn::Linear(torch::nn::LinearOptions(16, 8)));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = at::gelu(up(x));
    if (dropout_p > 0) h = at::dropout(h, dropout_p, /*train=*/true);
    return x + down(h);
  }
  double dropout_p;
  nn::Linear up{nullptr}, down{nullptr};
};
DTENSOR_MODULE(Mlp);

void set_weights(MlpImpl& m) {
  at::NoGradGuard g;
  m.up->weight.copy_(seeded_randn(1, {16, 8}) * 0.3);
  m.up->bias.copy_(seeded_randn(2, {16}) * 0.1);
  m.down->weight.copy_(seeded_randn(3, {8, 16}) * 0.3);
  m.down->bias.copy_(seeded_randn(4, {8}) * 0.1);
}

std::map<std::string, at::Tensor> grads_of(torch::nn::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.named_parameters()) {
    const at::Tensor& g = p.value().grad();
    out[p.key()] = (is_dtensor(g) ? full_tensor(g) : g).clone();
  }
  return out;
}

// One step of two stacked blocks (the second's input is the first's output) on x; returns x's gradient too.
struct StepResult {
  std::map<std::string, at::Tensor> grads;
  at::Tensor x_grad, loss;
  int calls = 0;  // forwards of the blocks' `up` layers
  std::string first_node;
};

StepResult step(bool checkpointed, double dropout_p, const DeviceMesh* mesh) {
  Mlp a(dropout_p), b(dropout_p);
  set_weights(*a);
  set_weights(*b);
  if (mesh) {
    const ParallelizePlan plan{{"up", ColwiseParallel()}, {"down", RowwiseParallel()}};
    parallelize_module(*a, *mesh, plan);
    parallelize_module(*b, *mesh, plan);
  }
  StepResult r;
  for (Mlp* m : {&a, &b}) {
    nn::register_forward_pre_hook(*(*m)->up, nn::TensorForwardPreHook([&r](torch::nn::Module&, nn::Tensors in) {
      ++r.calls;
      return in;
    }));
    if (checkpointed) nn::checkpoint_wrapper(**m);
  }
  at::Tensor x = seeded_randn(5, {4, 8}).requires_grad_(true);
  torch::manual_seed(11);
  at::Tensor out = b(a(x));
  r.first_node = out.grad_fn() ? out.grad_fn()->name() : "";
  r.loss = (out * out).sum();
  r.loss.backward();
  r.grads = grads_of(*a);
  for (const auto& [k, v] : grads_of(*b)) r.grads["b." + k] = v;
  r.x_grad = x.grad().clone();
  return r;
}

void expect_bit_equal(const StepResult& plain, const StepResult& ckpt) {
  EXPECT_TRUE(at::equal(plain.loss, ckpt.loss));
  EXPECT_TRUE(at::equal(plain.x_grad, ckpt.x_grad));
  ASSERT_EQ(plain.grads.size(), ckpt.grads.size());
  for (const auto& [k, g] : plain.grads) {
    EXPECT_TRUE(at::equal(g, ckpt.grads.at(k))) << k << ": max |diff| " << (g - ckpt.grads.at(k)).abs().max().item<double>();
  }
}

TEST(Checkpoint, RecomputesInBackwardAndGivesBitEqualGradients) {
  const StepResult plain = step(false, 0, nullptr), ckpt = step(true, 0, nullptr);
  EXPECT_EQ(plain.calls, 2);
  EXPECT_EQ(ckpt.calls, 4);  // each block's forward again in its backward
  EXPECT_EQ(ckpt.first_node, "CheckpointBackward");
  EXPECT_NE(plain.first_node, "CheckpointBackward");
  expect_bit_equal(plain, ckpt);
}

TEST(Checkpoint, DropoutDrawsTheSameMaskWhenRecomputed) {
  const StepResult plain = step(false, 0.3, nullptr), ckpt = step(true, 0.3, nullptr);
  EXPECT_EQ(ckpt.calls, 4);
  expect_bit_equal(plain, ckpt);
}

TEST(Checkpoint, UnderATensorParallelPlanTheRecomputeRunsTheStylesAgain) {
  run_ranks(2, [](int, int world) {
    const DeviceMesh mesh = init_device_mesh("cpu", {world});
    const StepResult plain = step(false, 0, &mesh), ckpt = step(true, 0, &mesh);
    EXPECT_EQ(ckpt.calls, 4);
    expect_bit_equal(plain, ckpt);
  });
}

// A module of the user's that reads its registered parameter directly (no layer member): the recompute reads the
// same leaf, and its gradient arrives as without checkpointing.
struct ScaleImpl : torch::nn::Module {
  ScaleImpl() { scale = register_parameter("scale", seeded_randn(6, {8})); }
  at::Tensor forward(const at::Tensor& x) { return at::tanh(x * scale) * scale; }
  at::Tensor scale;
};
DTENSOR_MODULE(Scale);

TEST(Checkpoint, AModuleThatReadsItsRegisteredParameterDirectly) {
  auto grad_of = [](bool checkpointed) {
    Scale m;
    if (checkpointed) nn::checkpoint_wrapper(*m);
    at::Tensor x = seeded_randn(5, {4, 8}).requires_grad_(true);
    m(x).pow(2).sum().backward();
    return std::make_pair(m->scale.grad().clone(), x.grad().clone());
  };
  const auto plain = grad_of(false), ckpt = grad_of(true);
  EXPECT_TRUE(at::equal(plain.first, ckpt.first));
  EXPECT_TRUE(at::equal(plain.second, ckpt.second));
}

TEST(Checkpoint, NoGradForwardKeepsNothingAndWrappingTwiceIsRefused) {
  Mlp m(0);
  set_weights(*m);
  nn::checkpoint_wrapper(*m);
  EXPECT_TRUE(nn::is_checkpointed(*m));
  EXPECT_THROW(nn::checkpoint_wrapper(*m), std::exception);
  at::NoGradGuard g;
  EXPECT_FALSE(m(seeded_randn(5, {4, 8})).requires_grad());
}

}  // namespace
