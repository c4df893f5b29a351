// comm_bench: time and bandwidth of all_reduce, all_gather, reduce_scatter and all_to_all over the world
// group, for message sizes from 1 KiB to 64 MiB, in the columns nccl-tests users know.
//
//   tprun --nproc-per-node 2 comm_bench [--min-bytes N] [--max-bytes N] [--iters N] [--warmup N]
//
// size is the per-rank buffer in bytes as nccl-tests counts it (all_reduce: the tensor; all_gather: the
// output; reduce_scatter: the input; all_to_all: the buffer). algbw = size / time; busbw = algbw times
// 2(n-1)/n for all_reduce and (n-1)/n for the others: the per-link traffic a ring would need.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "dtensor/mesh/process_group.h"

using namespace dtensor;

namespace {

struct Args {
  int64_t min_bytes = 1 << 10;
  int64_t max_bytes = 64 << 20;
  int iters = 0;  // 0: adaptive, fewer for big messages
  int warmup = 3;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto value = [&]() -> int64_t {
      if (i + 1 >= argc) throw std::invalid_argument("comm_bench: " + k + " needs a value");
      return std::stoll(argv[++i]);
    };
    if (k == "--min-bytes") a.min_bytes = value();
    else if (k == "--max-bytes") a.max_bytes = value();
    else if (k == "--iters") a.iters = static_cast<int>(value());
    else if (k == "--warmup") a.warmup = static_cast<int>(value());
    else throw std::invalid_argument("comm_bench: unknown option " + k +
                                     " (options: --min-bytes, --max-bytes, --iters, --warmup)");
  }
  if (a.min_bytes < 4 || a.max_bytes < a.min_bytes) throw std::invalid_argument("comm_bench: bad byte range");
  return a;
}

struct Collective {
  const char* name;
  double bus_factor;  // busbw / algbw
  std::function<void(at::Tensor&, at::Tensor&)> run;  // (buffer of `size` bytes, scratch)
};

}  // namespace

int main(int argc, char** argv) {
  try {
    Args args = parse(argc, argv);
    auto world = init_process_group();
    auto group = world->world_group();
    const int n = group->size();
    std::vector<Collective> collectives{
        {"all_reduce", 2.0 * (n - 1) / n, [&](at::Tensor& buf, at::Tensor&) { group->all_reduce_(buf, ReduceOp::SUM); }},
        {"all_gather", double(n - 1) / n,
         [&](at::Tensor& buf, at::Tensor& in) { group->all_gather_into(buf, in); }},
        {"reduce_scatter", double(n - 1) / n,
         [&](at::Tensor& buf, at::Tensor& out) { group->reduce_scatter_into(out, buf, ReduceOp::SUM); }},
        {"all_to_all", double(n - 1) / n,
         [&](at::Tensor& buf, at::Tensor& out) {
           std::vector<int64_t> splits(n, buf.numel() / n);
           group->all_to_all_single(out, buf, splits, splits);
         }},
    };
    if (world->rank() == 0) {
      std::printf("# dtensor comm_bench: world %d, Gloo on CPU, float32; time is the mean over iterations, max over ranks\n", n);
    }
    for (const auto& c : collectives) {
      if (world->rank() == 0) {
        std::printf("\n# %s\n%12s %10s %8s %12s %10s %10s\n", c.name, "size(B)", "count", "iters", "time(us)",
                    "algbw(GB/s)", "busbw(GB/s)");
      }
      for (int64_t bytes = args.min_bytes; bytes <= args.max_bytes; bytes *= 2) {
        int64_t count = std::max<int64_t>(n, (bytes / 4) / n * n);  // divisible by n
        at::Tensor buf = at::ones({count});
        at::Tensor scratch = std::strcmp(c.name, "all_to_all") == 0 ? at::empty({count}) : at::empty({count / n});
        int iters = args.iters > 0 ? args.iters : static_cast<int>(std::clamp<int64_t>((256LL << 20) / bytes, 5, 100));
        for (int i = 0; i < args.warmup; ++i) c.run(buf, scratch);
        group->barrier();
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) c.run(buf, scratch);
        double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
        at::Tensor t = at::full({1}, us, at::kDouble);
        group->all_reduce_(t, ReduceOp::MAX);
        us = t.item<double>();
        double size = double(count) * 4;
        double algbw = size / us / 1e3;
        if (world->rank() == 0) {
          std::printf("%12lld %10lld %8d %12.1f %10.3f %10.3f\n", (long long)size, (long long)count, iters, us, algbw,
                      algbw * c.bus_factor);
          std::fflush(stdout);
        }
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
}
