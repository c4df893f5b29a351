// comm_bench: time and bandwidth of all_reduce, all_gather, reduce_scatter and all_to_all over the world
// group, for message sizes from 1 KiB to 64 MiB, in the columns nccl-tests users know, on the same-host
// shared-memory backend ("fast") and on Gloo, both in one run by default, then side by side.
//
//   tprun --nproc-per-node 2 comm_bench [--backend fast|gloo|both] [--min-bytes N] [--max-bytes N]
//                                       [--iters N] [--warmup N]
//
// size is the per-rank buffer in bytes as nccl-tests counts it (all_reduce: the tensor; all_gather: the
// output; reduce_scatter: the input; all_to_all: the buffer). Every call is timed on its own; time is the
// median call (robust on a shared, loaded host), mean is printed beside it; both are the max over ranks.
// algbw = size / median time; busbw = algbw times 2(n-1)/n for all_reduce and (n-1)/n for the others: the
// per-link traffic a ring would need. "all_reduce_async" is all_reduce issued as async and waited on at once:
// on the shared-memory backend it runs on the group's worker thread, so its difference from all_reduce is
// the cost of that hand-off (blocking calls run inline).
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "../common/cli.h"
#include "dtensor/mesh/process_group.h"

using namespace dtensor;

namespace {

struct Args {
  int64_t min_bytes = 1 << 10;
  int64_t max_bytes = 64 << 20;
  int iters = 0;  // 0: adaptive, fewer for big messages
  int warmup = -1;  // -1: a tenth of the timed iterations, at least 3
  std::vector<std::string> backends{"fast", "gloo"};
};

Args parse(int argc, char** argv) {
  Args a;
  CLI::App app;
  tools_cli::configure(app, "comm_bench");
  app.description("comm_bench: collective latency and bandwidth on the shared-memory backend and Gloo");
  app.add_option("--min-bytes", a.min_bytes, "smallest message")->check(CLI::Range(int64_t{4}, int64_t{1} << 40));
  app.add_option("--max-bytes", a.max_bytes, "largest message")->check(tools_cli::positive());
  app.add_option("--iters", a.iters, "timed iterations (0: adaptive, fewer for big messages)")->check(tools_cli::non_negative());
  app.add_option("--warmup", a.warmup, "untimed iterations (-1: a tenth of the timed ones, at least 3)");
  app.add_option_function<std::string>("--backend", [&](const std::string& b) {
    a.backends = b == "both" ? std::vector<std::string>{"fast", "gloo"} : std::vector<std::string>{b};
  }, "fast, gloo or both")->check(CLI::IsMember({"fast", "gloo", "both"}))->default_str("both");
  if (tools_cli::parse(app, std::vector<std::string>(argv + 1, argv + argc))) {
    std::fputs(app.help().c_str(), stdout);
    std::exit(0);
  }
  if (a.max_bytes < a.min_bytes) throw std::invalid_argument("comm_bench: --max-bytes is below --min-bytes");
  return a;
}

struct Collective {
  const char* name;
  double bus_factor;  // busbw / algbw
  std::function<void(at::Tensor&, at::Tensor&)> run;  // (buffer of `size` bytes, scratch)
};

struct Result {
  double us, busbw;
};

// One table per backend; returns (collective, size) -> result.
std::map<std::pair<std::string, int64_t>, Result> run_backend(const Args& args, World& world, const std::string& label) {
  auto group = world.world_group();
  const int n = group->size();
  std::vector<Collective> collectives{
      {"all_reduce", 2.0 * (n - 1) / n, [&](at::Tensor& buf, at::Tensor&) { group->all_reduce_(buf, ReduceOp::SUM); }},
      {"all_reduce_async", 2.0 * (n - 1) / n,
       [&](at::Tensor& buf, at::Tensor&) { group->all_reduce_async(buf, ReduceOp::SUM).wait(); }},
      {"all_gather", double(n - 1) / n, [&](at::Tensor& buf, at::Tensor& in) { group->all_gather_into(buf, in); }},
      {"reduce_scatter", double(n - 1) / n,
       [&](at::Tensor& buf, at::Tensor& out) { group->reduce_scatter_into(out, buf, ReduceOp::SUM); }},
      {"all_to_all", double(n - 1) / n,
       [&](at::Tensor& buf, at::Tensor& out) {
         std::vector<int64_t> splits(n, buf.numel() / n);
         group->all_to_all_single(out, buf, splits, splits);
       }},
  };
  std::map<std::pair<std::string, int64_t>, Result> results;
  if (world.rank() == 0) {
    std::printf("# dtensor comm_bench: world %d, backend %s (%s), float32; time is the median call, max over ranks\n",
                n, label.c_str(), group->backend_name().c_str());
  }
  for (const auto& c : collectives) {
    if (world.rank() == 0) {
      std::printf("\n# %s (%s)\n%12s %10s %8s %12s %12s %10s %10s\n", c.name, label.c_str(), "size(B)", "count",
                  "iters", "time(us)", "mean(us)", "algbw(GB/s)", "busbw(GB/s)");
    }
    for (int64_t bytes = args.min_bytes; bytes <= args.max_bytes; bytes *= 2) {
      int64_t count = std::max<int64_t>(n, (bytes / 4) / n * n);  // divisible by n
      at::Tensor buf = at::ones({count});
      at::Tensor scratch = std::strcmp(c.name, "all_to_all") == 0 ? at::empty({count}) : at::empty({count / n});
      int iters = args.iters > 0 ? args.iters : static_cast<int>(std::clamp<int64_t>((256LL << 20) / bytes, 5, 200));
      const int warmup = args.warmup >= 0 ? args.warmup : std::max(3, iters / 10);
      for (int i = 0; i < warmup; ++i) c.run(buf, scratch);
      group->barrier();
      std::vector<double> calls(iters);
      for (int i = 0; i < iters; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        c.run(buf, scratch);
        calls[i] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      }
      double mean = 0;
      for (double v : calls) mean += v / iters;
      std::sort(calls.begin(), calls.end());
      at::Tensor t = at::tensor({calls[iters / 2], mean}, at::kDouble);
      group->all_reduce_(t, ReduceOp::MAX);
      const double us = t[0].item<double>();
      mean = t[1].item<double>();
      double size = double(count) * 4;
      double algbw = size / us / 1e3;
      results[{c.name, bytes}] = {us, algbw * c.bus_factor};
      if (world.rank() == 0) {
        std::printf("%12lld %10lld %8d %12.1f %12.1f %10.3f %10.3f\n", (long long)size, (long long)count, iters, us,
                    mean, algbw, algbw * c.bus_factor);
        std::fflush(stdout);
      }
    }
  }
  return results;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 2;
  }
  try {
    auto process_world = init_process_group();
    std::map<std::string, std::map<std::pair<std::string, int64_t>, Result>> by_backend;
    for (const auto& b : args.backends) {
      // A world per backend over the job's store, so both run in one job on the same ranks.
      InitOptions options;
      options.timeout = process_world->timeout();
      options.backend = b == "fast" ? "shm" : "gloo";
      options.gloo_hostname = "127.0.0.1";
      World world(c10::make_intrusive<c10d::PrefixStore>("comm_bench/" + b, process_world->store()),
                  process_world->rank(), process_world->size(), options);
      by_backend[b] = run_backend(args, world, b);
      if (process_world->rank() == 0) std::printf("\n");
    }
    if (process_world->rank() == 0 && by_backend.size() == 2) {
      auto& fast = by_backend["fast"];
      auto& gloo = by_backend["gloo"];
      std::printf("# side by side: median time(us) and busbw(GB/s), fast vs gloo\n%-17s %12s %12s %12s %10s %10s %9s\n",
                  "collective", "size(B)", "fast(us)", "gloo(us)", "fast bw", "gloo bw", "speedup");
      for (auto& [key, f] : fast) {
        const Result& g = gloo[key];
        std::printf("%-17s %12lld %12.1f %12.1f %10.3f %10.3f %8.1fx\n", key.first.c_str(), (long long)key.second,
                    f.us, g.us, f.busbw, g.busbw, g.us / f.us);
      }
      auto pick = [&](auto& m, const char* c, int64_t b) { auto it = m.find({c, b}); return it == m.end() ? Result{0, 0} : it->second; };
      const int64_t big = [&] { int64_t b = args.min_bytes; while (b * 2 <= args.max_bytes) b *= 2; return b; }();
      std::printf("summary world=%d small_bytes=%lld big_bytes=%lld all_reduce_small_fast_us=%.1f "
                  "all_reduce_small_gloo_us=%.1f all_reduce_async_small_fast_us=%.1f",
                  process_world->size(), (long long)args.min_bytes, (long long)big,
                  pick(fast, "all_reduce", args.min_bytes).us, pick(gloo, "all_reduce", args.min_bytes).us,
                  pick(fast, "all_reduce_async", args.min_bytes).us);
      for (const char* c : {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}) {
        std::printf(" %s_big_fast_busbw=%.2f %s_big_gloo_busbw=%.2f %s_big_ratio=%.1f", c, pick(fast, c, big).busbw, c,
                    pick(gloo, c, big).busbw, c, pick(fast, c, big).busbw / std::max(pick(gloo, c, big).busbw, 1e-9));
      }
      std::printf("\n");
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
}
