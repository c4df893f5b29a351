// Training steps with DTensor parameters distributed by hand (no parallel styles yet): a small MLP and a
// small attention block, torch::optim::AdamW and grad-norm clipping. After 5 steps every parameter equals
// the single-process run's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtensor/ops/dispatch_options.h"
#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"

using namespace dtensor;
using dtensor::testing::run_ranks;
using dtensor::testing::seeded_randn;

namespace {

// Runs `steps` AdamW steps of `loss_fn(params)` with clipping; returns the parameters' final values.
std::vector<at::Tensor> train(std::vector<at::Tensor> params,
                              const std::function<at::Tensor(const std::vector<at::Tensor>&)>& loss_fn, int steps,
                              std::vector<double>* losses) {
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(0.05).weight_decay(0.01));
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    at::Tensor loss = loss_fn(params);
    loss.backward();
    torch::nn::utils::clip_grad_norm_(params, 1.0);
    opt.step();
    losses->push_back(loss.item<double>());
  }
  return params;
}

at::Tensor full_of(const at::Tensor& t) { return is_dtensor(t) ? full_tensor(t).detach() : t.detach(); }

}  // namespace

TEST(Training, MlpWithShardedParametersMatchesSingleProcess) {
  at::Tensor x = seeded_randn(1, {8, 10}), target = seeded_randn(2, {8, 5});
  std::vector<at::Tensor> init{seeded_randn(3, {32, 10}) * 0.3, seeded_randn(4, {32}) * 0.1,
                               seeded_randn(5, {5, 32}) * 0.3, seeded_randn(6, {5}) * 0.1};
  auto mlp_loss = [](const at::Tensor& x, const at::Tensor& target) {
    return [x, target](const std::vector<at::Tensor>& p) {
      at::Tensor h = at::relu(at::linear(x, p[0], p[1]));
      at::Tensor out = at::linear(h, p[2], p[3]);
      return (out - target).pow(2).mean();
    };
  };
  std::vector<double> ref_losses;
  std::vector<at::Tensor> ref_params;
  for (const auto& t : init) ref_params.push_back(t.clone().set_requires_grad(true));
  auto ref = train(ref_params, mlp_loss(x, target), 5, &ref_losses);

  run_ranks(2, [&](int, int) {
    auto mesh = init_device_mesh("cpu", {2});
    // Megatron's MLP by hand: first weight and bias column-sharded, second weight row-sharded, its bias
    // replicated; the input replicated.
    std::vector<Placements> layouts{{Shard(0)}, {Shard(0)}, {Shard(1)}, {Replicate()}};
    std::vector<at::Tensor> params;
    for (size_t k = 0; k < init.size(); ++k) {
      params.push_back(distribute_tensor(init[k], mesh, layouts[k]).set_requires_grad(true));
    }
    at::Tensor dx = distribute_tensor(x, mesh, {Replicate()});
    at::Tensor dtarget = distribute_tensor(target, mesh, {Replicate()});
    std::vector<double> losses;
    auto out = train(params, mlp_loss(dx, dtarget), 5, &losses);
    for (size_t s = 0; s < losses.size(); ++s) EXPECT_NEAR(losses[s], ref_losses[s], 1e-5 * std::abs(ref_losses[s]) + 1e-6);
    for (size_t k = 0; k < out.size(); ++k) {
      EXPECT_EQ(placements(out[k]), layouts[k]) << "param " << k;
      EXPECT_TRUE(at::allclose(full_of(out[k]), ref[k].detach(), 1e-5, 1e-6)) << "param " << k;
    }
  });
}

TEST(Training, AttentionBlockWithShardedHeadsMatchesSingleProcess) {
  const int64_t B = 2, S = 5, D = 8, H = 4, hd = D / H;
  at::Tensor x = seeded_randn(11, {B, S, D}), target = seeded_randn(12, {B, S, D});
  std::vector<at::Tensor> init{seeded_randn(13, {D, D}) * 0.3, seeded_randn(14, {D, D}) * 0.3,
                               seeded_randn(15, {D, D}) * 0.3, seeded_randn(16, {D, D}) * 0.3,
                               at::ones({D}) + seeded_randn(17, {D}) * 0.1};
  // Pre-norm attention with a residual: params wq, wk, wv, wo, norm weight.
  auto block_loss = [=](const at::Tensor& x, const at::Tensor& target) {
    return [=](const std::vector<at::Tensor>& p) {
      at::Tensor h = at::layer_norm(x, {D}, p[4]);
      auto heads = [&](const at::Tensor& w) { return at::linear(h, w).view({B, S, H, hd}).transpose(1, 2); };
      at::Tensor a = at::scaled_dot_product_attention(heads(p[0]), heads(p[1]), heads(p[2]), {}, 0.0, true);
      at::Tensor out = at::linear(a.transpose(1, 2).reshape({B, S, D}), p[3]) + x;
      return (out - target).pow(2).mean();
    };
  };
  std::vector<double> ref_losses;
  std::vector<at::Tensor> ref_params;
  for (const auto& t : init) ref_params.push_back(t.clone().set_requires_grad(true));
  auto ref = train(ref_params, block_loss(x, target), 5, &ref_losses);

  run_ranks(2, [&](int, int) {
    auto mesh = init_device_mesh("cpu", {2});
    // Heads sharded: q/k/v projections column-wise, the output projection row-wise, the norm replicated.
    std::vector<Placements> layouts{{Shard(0)}, {Shard(0)}, {Shard(0)}, {Shard(1)}, {Replicate()}};
    std::vector<at::Tensor> params;
    for (size_t k = 0; k < init.size(); ++k) params.push_back(distribute_tensor(init[k], mesh, layouts[k]).set_requires_grad(true));
    std::vector<double> losses;
    auto out = train(params, block_loss(distribute_tensor(x, mesh, {Replicate()}), distribute_tensor(target, mesh, {Replicate()})),
                     5, &losses);
    for (size_t s = 0; s < losses.size(); ++s) EXPECT_NEAR(losses[s], ref_losses[s], 1e-5 * std::abs(ref_losses[s]) + 1e-6);
    for (size_t k = 0; k < out.size(); ++k) {
      EXPECT_EQ(placements(out[k]), layouts[k]) << "param " << k;
      EXPECT_TRUE(at::allclose(full_of(out[k]), ref[k].detach(), 1e-5, 1e-5)) << "param " << k;
    }
  });
}
