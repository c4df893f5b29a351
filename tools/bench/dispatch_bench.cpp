// dispatch_bench: per-op overhead of the DTensor dispatcher in the cached, no-communication case: time of
// the op on DTensors minus the same op on their local tensors. tools/bench/dispatch_bench.py measures
// PyTorch's Python DTensor the same way.
//
//   tprun --nproc-per-node 2 dispatch_bench [--iters N] [--device cpu|cuda]
//
// With --device cuda the tensors live on the GPU and the time is the host's: dispatch plus the kernel
// launch (nothing waits for the GPU), as it is for PyTorch's twin.
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
    std::string device = "cpu";
    const int iters = bench::parse_iters(argc, argv, 2000, "dispatch_bench", [&](CLI::App& app) {
      app.add_option("--device", device, "the mesh's device type")->check(CLI::IsMember({"cpu", "cuda"}));
    });
    auto world = init_process_group();
    const int n = world->size();
    auto mesh = init_device_mesh(device, {n});
    at::Tensor a = distribute_tensor(at::randn({64 * n}), mesh, {Shard(0)});
    at::Tensor b = distribute_tensor(at::randn({64 * n}), mesh, {Shard(0)});
    at::Tensor m = distribute_tensor(at::randn({8 * n, 8}), mesh, {Shard(0)});
    at::Tensor w = distribute_tensor(at::randn({8, 8}), mesh, {Replicate()});
    at::Tensor la = to_local(a), lb = to_local(b), lm = to_local(m), lw = to_local(w);
    struct Case {
      const char* name;
      std::function<void()> dt, local;
    };
    std::vector<Case> cases{
        {"add (Shard(0) + Shard(0), 64 elems/rank)", [&] { at::add(a, b); }, [&] { at::add(la, lb); }},
        {"mul", [&] { at::mul(a, b); }, [&] { at::mul(la, lb); }},
        {"relu", [&] { at::relu(a); }, [&] { at::relu(la); }},
        {"sum(dim) of Shard(0) rows, dim 1", [&] { m.sum(1); }, [&] { lm.sum(1); }},
        {"mm Shard(0) x Replicate", [&] { at::mm(m, w); }, [&] { at::mm(lm, lw); }},
        {"view", [&] { m.view({-1}); }, [&] { lm.view({-1}); }},
        {"t", [&] { w.t(); }, [&] { lw.t(); }},
        {"detach", [&] { a.detach(); }, [&] { la.detach(); }},
    };
    if (world->rank() == 0) {
      std::printf("# dtensor dispatch overhead on %s: world %d, median of 15 batches of %d calls (us per call)\n", mesh.device().str().c_str(), n, iters);
      std::printf("%-42s %10s %10s %10s\n", "op", "DTensor", "local", "overhead");
    }
    for (const auto& c : cases) {
      double dt = bench::batched_median_us(iters, c.dt), local = bench::batched_median_us(iters, c.local);
      if (world->rank() == 0) std::printf("%-42s %10.2f %10.2f %10.2f\n", c.name, dt, local, dt - local);
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
