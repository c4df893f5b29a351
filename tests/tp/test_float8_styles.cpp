// The float8 styles (dtensor/tp/float8_styles.h) on a sequence-parallel SwiGLU block of float8 Linear layers at TP 2:
// the same outputs and gradients as the plain styles on the same float8 layers (the float8 all-gather hands the layers
// the values they would cast to anyway), with every all-gather, forward (the input) and backward (the output's
// gradient), moving a quarter of the fp32 bytes. And the styles refuse a Linear that is not float8.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/debug/comm_debug_mode.h"
#include "dtensor/float8/float8_linear.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/nn/layers.h"
#include "dtensor/tp/float8_styles.h"
#include "dtensor/tp/parallelize.h"
#include "harness/multi_rank.h"

using namespace dtensor;
using namespace dtensor::testing;

namespace {

// w2(silu(w1(x)) * w3(x)), 32 -> 64 -> 32 (float8 needs multiples of 16), inside a wrapper so that a plan can prepare
// the block's input.
struct SwigluImpl : torch::nn::Module {
  SwigluImpl() {
    auto no_bias = [](int64_t in, int64_t out) { return torch::nn::LinearOptions(in, out).bias(false); };
    w1 = register_module("w1", dtensor::nn::Linear(no_bias(32, 64)));
    w3 = register_module("w3", dtensor::nn::Linear(no_bias(32, 64)));
    w2 = register_module("w2", dtensor::nn::Linear(no_bias(64, 32)));
    c10::AutoGradMode no_grad(false);
    uint64_t seed = 20;
    for (auto& p : parameters()) p.copy_(seeded_randn(seed++, p.sizes()) * 0.2);
  }
  at::Tensor forward(const at::Tensor& x) {
    return dtensor::nn::call_with_hooks(*this, {x}, [this](const dtensor::nn::Tensors& in) {
      return w2(at::silu(w1(in[0])) * w3(in[0]));
    });
  }
  dtensor::nn::Linear w1{nullptr}, w2{nullptr}, w3{nullptr};
};
TORCH_MODULE(Swiglu);

struct WrapImpl : torch::nn::Module {
  WrapImpl() { ffn = register_module("ffn", Swiglu()); }
  at::Tensor forward(const at::Tensor& x) { return ffn(x); }
  Swiglu ffn{nullptr};
};
TORCH_MODULE(Wrap);

ParallelizePlan plan(bool float8) {
  const PrepareModuleInputOptions in{.input_layouts = {Shard(1)}, .desired_input_layouts = {Replicate()}};
  if (!float8) {
    return {{"ffn", PrepareModuleInput(in)}, {"ffn.w1", ColwiseParallel()}, {"ffn.w3", ColwiseParallel()},
            {"ffn.w2", RowwiseParallel({.output_layouts = Shard(1)})}};
  }
  return {{"ffn", PrepareFloat8ModuleInput(in)}, {"ffn.w1", Float8ColwiseParallel()}, {"ffn.w3", Float8ColwiseParallel()},
          {"ffn.w2", Float8RowwiseParallel({.output_layouts = Shard(1)})}};
}

struct StyleRun {
  at::Tensor y, gx, gw1, gw2;
  std::map<std::string, int64_t> counts, bytes;
};

StyleRun run(bool float8_styles, int rank, const DeviceMesh& mesh) {
  Wrap model;
  convert_to_float8_training(*model);
  parallelize_module(*model, mesh, plan(float8_styles));
  const at::Tensor x = seeded_randn(1, {2, 8, 32}).chunk(2, 1)[rank].clone().requires_grad_(true);
  const at::Tensor g = seeded_randn(2, {2, 8, 32}).chunk(2, 1)[rank].contiguous();
  StyleRun r;
  CommDebugMode comm;
  r.y = model(x);
  r.y.backward(g);
  r.counts = comm.get_comm_counts();
  r.bytes = comm.get_comm_bytes();
  r.gx = x.grad();
  r.gw1 = full_tensor(model->ffn->w1->weight.grad());
  r.gw2 = full_tensor(model->ffn->w2->weight.grad());
  return r;
}

void expect_close(const at::Tensor& a, const at::Tensor& b, const char* what) {
  const double rel = ((a - b).abs().max() / b.abs().max()).item<double>();
  EXPECT_LT(rel, 1e-5) << what << ": relative difference " << rel;
}

}  // namespace

TEST(Float8Styles, GatherInFloat8WithThePlainStylesNumbers) {
  run_ranks(2, [](int rank, int world) {
    auto mesh = init_device_mesh("cpu", {world});
    StyleRun plain = run(false, rank, mesh), f8 = run(true, rank, mesh);
    expect_close(f8.y, plain.y, "output");
    expect_close(f8.gx, plain.gx, "input gradient");
    expect_close(f8.gw1, plain.gw1, "w1 gradient");
    expect_close(f8.gw2, plain.gw2, "w2 gradient");
    // One all-gather forward (the block's input, shared by w1 and w3) and one backward (w2's output gradient).
    EXPECT_EQ(f8.counts["all_gather"], 2);
    EXPECT_EQ(plain.counts["all_gather"], 2);
    EXPECT_EQ(4 * f8.bytes["all_gather"], plain.bytes["all_gather"]);
    EXPECT_EQ(f8.bytes["reduce_scatter"], plain.bytes["reduce_scatter"]);  // high precision, as PyTorch's
  });
}

TEST(Float8Styles, RefuseALinearThatIsNotFloat8) {
  run_ranks(2, [](int, int world) {
    auto mesh = init_device_mesh("cpu", {world});
    Wrap model;
    const std::string err = error_of([&] { parallelize_module(*model, mesh, plan(true)); });
    EXPECT_NE(err.find("Float8ColwiseParallel on 'ffn.w1': the module is not a float8 Linear"), std::string::npos) << err;
  });
}
