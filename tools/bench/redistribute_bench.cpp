// redistribute_bench: what redistribute costs beyond the raw collective it issues, per transition and size.
//
//   tprun --nproc-per-node 2 redistribute_bench [--iters N]
//
// For each transition on a 1-D mesh over all ranks: median time of dtensor::redistribute (planning,
// DTensor wrapping, autograd node, collective), median time of the bare c10d collective moving the same
// bytes, and their difference: the overhead. tools/bench/redistribute_bench.py measures PyTorch's Python
// DTensor the same way.
#include <ATen/ATen.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "dtensor/api/dtensor_api.h"

using namespace dtensor;

int main(int argc, char** argv) {
  try {
    const int iters = bench::parse_iters(argc, argv, 200, "redistribute_bench");
    auto world = init_process_group();
    const int n = world->size();
    auto mesh = init_device_mesh("cpu", {n});
    ProcessGroup& group = mesh.get_group(0);
    if (world->rank() == 0) {
      std::printf("# dtensor redistribute overhead: world %d, float32, median of %d iterations (us)\n", n, iters);
      std::printf("%-26s %10s %12s %12s %12s\n", "transition", "elements", "redistribute", "raw", "overhead");
    }
    struct Transition {
      const char* name;
      Placements src, dst;
    };
    const std::vector<Transition> transitions{
        {"Shard(0)->Replicate", {Shard(0)}, {Replicate()}},
        {"Partial->Replicate", {Partial()}, {Replicate()}},
        {"Partial->Shard(0)", {Partial()}, {Shard(0)}},
        {"Shard(0)->Shard(1)", {Shard(0)}, {Shard(1)}},
        {"Replicate->Shard(0)", {Replicate()}, {Shard(0)}},
    };
    for (int64_t rows : {8, 256, 4096}) {
      const int64_t cols = 64;
      at::Tensor full = at::randn({rows * n, cols});
      for (const auto& t : transitions) {
        at::Tensor dt = distribute_tensor(full, mesh, t.src);
        double ours = bench::synchronized_median_us(iters, group, [&] { redistribute(dt, mesh, t.dst); });
        at::Tensor local = to_local(dt).contiguous();
        at::Tensor out_full = at::empty_like(full), out_shard = at::empty({rows, cols});
        std::vector<int64_t> splits(n, local.size(0) / n);  // rows per rank
        at::Tensor a2a_out = at::empty_like(local);
        std::function<void()> raw;
        std::string name = t.name;
        if (name == "Shard(0)->Replicate") raw = [&] { group.all_gather_into(out_full, local); };
        else if (name == "Partial->Replicate") raw = [&] { at::Tensor x = local.clone(); group.all_reduce_(x, ReduceOp::SUM); };
        else if (name == "Partial->Shard(0)") raw = [&] { group.reduce_scatter_into(out_shard, local, ReduceOp::SUM); };
        else if (name == "Shard(0)->Shard(1)") raw = [&] { group.all_to_all_single(a2a_out, local, splits, splits); };
        else raw = [&] { local.narrow(0, 0, rows).clone(); };
        double bare = bench::synchronized_median_us(iters, group, raw);
        if (world->rank() == 0) {
          std::printf("%-26s %10lld %12.1f %12.1f %12.1f\n", t.name, (long long)full.numel(), ours, bare, ours - bare);
          std::fflush(stdout);
        }
      }
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
