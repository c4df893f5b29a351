// tp_step_bench: what tensor parallelism costs beyond its compute and its one collective, for one training
// step (forward + backward) of an MLP under {in_proj: Colwise, out_proj: Rowwise}:
//
//   overhead = TP step - the same step on this rank's shard as plain tensors - one raw all_reduce of the output
//
// Sizes are small so that the framework's cost (hooks, dispatch, sharding propagation, redistribute
// planning, autograd of DTensors) shows. tools/bench/tp_step_bench.py measures PyTorch's parallelize_module
// the same way.
//
//   tprun --nproc-per-node 2 tp_step_bench [--iters N]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/nn/module.h>

#include <cstdio>
#include <functional>
#include <string>

#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/debug/comm_debug_mode.h"
#include "dtensor/nn/layers.h"
#include "dtensor/tp/parallelize.h"
#include "bench_util.h"
#include "dtensor/api/dtensor_api.h"

using namespace dtensor;

namespace {

constexpr int64_t kBatch = 8, kIn = 64, kHidden = 256, kOut = 64;

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(int64_t hidden) {
    in_proj = register_module("in_proj", nn::Linear(kIn, hidden));
    out_proj = register_module("out_proj", nn::Linear(hidden, kOut));
  }
  at::Tensor forward(const at::Tensor& x) { return out_proj(at::relu(in_proj(x))); }
  nn::Linear in_proj{nullptr}, out_proj{nullptr};
};
TORCH_MODULE(Mlp);

void step(Mlp& model, const at::Tensor& x) {
  for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
  model(x).sum().backward();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int iters = bench::parse_iters(argc, argv, 200, "tp_step_bench");
    at::set_num_threads(1);  // as the Python twin: one intra-op thread per rank on this 2-core machine
    auto world = init_process_group();
    const int n = world->size();
    auto mesh = init_device_mesh("cpu", {n});
    at::manual_seed(0);
    at::Tensor x = at::randn({kBatch, kIn});
    Mlp shard(kHidden / n);  // this rank's part of the work, as plain tensors
    Mlp tp(kHidden);
    parallelize_module(*tp, mesh, {{"in_proj", ColwiseParallel()}, {"out_proj", RowwiseParallel()}});
    at::Tensor out = at::randn({kBatch, kOut});

    std::string comms;
    {
      CommDebugMode comm;
      step(tp, x);
      for (const auto& [name, count] : comm.get_comm_counts()) comms += " " + name + " x" + std::to_string(count);
    }
    const double t_shard = bench::batched_median_us(iters, [&] { step(shard, x); });
    const double t_comm = bench::batched_median_us(iters, [&] { all_reduce(out, ReduceOp::SUM, mesh.get_group(0)); });
    const double t_tp = bench::batched_median_us(iters, [&] { step(tp, x); });
    if (world->rank() == 0) {
      std::printf("# dtensor TP step (forward + backward) of Linear(%lld,%lld)-ReLU-Linear(%lld,%lld), batch %lld, "
                  "world %d: median of 15 batches of %d steps (us per step)\n",
                  (long long)kIn, (long long)kHidden, (long long)kHidden, (long long)kOut, (long long)kBatch, n, iters);
      std::printf("%-12s %12s %12s %12s\n", "TP step", "shard step", "all_reduce", "overhead");
      std::printf("%-12.1f %12.1f %12.1f %12.1f\n", t_tp, t_shard, t_comm, t_tp - t_shard - t_comm);
      std::printf("collectives per TP step:%s\n", comms.empty() ? " none" : comms.c_str());
    }
    return 0;
  } catch (const tools_cli::UsageError& e) {  // a bad flag
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
