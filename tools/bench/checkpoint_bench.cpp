// checkpoint_bench: save and load throughput of dtensor::checkpoint (MB/s per rank) for llama_train's default
// model and a larger one, each with its AdamW state (3x the parameters), beside the raw speed of writing and
// reading the same bytes with write()+fsync / read() in the same run (the floor of what a checkpoint can do).
//
//   tprun --nproc-per-node 2 checkpoint_bench [--iters N]
//
// Bytes per rank: save = the bytes of this rank's file (replicas are written once, by one rank); load = the
// bytes of this rank's shards. Load reads from the page cache (the files were just written), as does raw read.
#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "bench_util.h"
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/checkpoint/state_dict.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/api/dtensor_api.h"
#include "llama/model.h"
#include "llama/parallelize.h"

namespace fs = std::filesystem;
namespace ckpt = dtensor::checkpoint;

namespace {

int64_t local_bytes(const ckpt::StateDict& state) {
  int64_t n = 0;
  for (const auto& [_, t] : state) {
    const at::Tensor local = dtensor::is_dtensor(t) ? dtensor::to_local(t) : t;
    n += local.numel() * static_cast<int64_t>(local.element_size());
  }
  return n;
}

// Raw floor: write `bytes` to `path` in one stream and fsync; then read them back. Microseconds each.
std::pair<double, double> raw_write_read_us(const std::string& path, int64_t bytes) {
  std::vector<char> buf(static_cast<size_t>(bytes), 1);
  auto t0 = std::chrono::steady_clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (int64_t done = 0; done < bytes;) done += ::write(fd, buf.data() + done, static_cast<size_t>(bytes - done));
  ::fsync(fd);
  ::close(fd);
  auto t1 = std::chrono::steady_clock::now();
  fd = ::open(path.c_str(), O_RDONLY);
  for (int64_t done = 0; done < bytes;) {
    const ssize_t r = ::read(fd, buf.data() + done, static_cast<size_t>(bytes - done));
    if (r <= 0) break;
    done += r;
  }
  ::close(fd);
  auto t2 = std::chrono::steady_clock::now();
  return {std::chrono::duration<double, std::micro>(t1 - t0).count(), std::chrono::duration<double, std::micro>(t2 - t1).count()};
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 0;
  try {
    iters = dtensor::bench::parse_iters(argc, argv, 3, "checkpoint_bench");
  } catch (const tools_cli::UsageError& e) {  // a bad flag
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  auto world = dtensor::init_process_group();
  auto mesh = dtensor::init_device_mesh("cpu", {world->size()}, {"tp"});
  auto& group = *world->world_group();
  const int rank = world->rank();
  const std::string root = (fs::temp_directory_path() / ("checkpoint_bench_" + std::to_string(getppid()))).string();
  if (rank == 0) fs::create_directories(root);
  group.barrier();

  struct Config {
    std::string name;
    llama::LlamaConfig model;
  };
  llama::LlamaConfig larger;
  larger.hidden_size = 768;
  larger.num_hidden_layers = 8;
  larger.num_attention_heads = 12;
  larger.num_key_value_heads = 4;
  larger.intermediate_size = 2048;
  larger.vocab_size = 8192;
  const std::vector<Config> configs = {{"default", llama::LlamaConfig{}}, {"larger", larger}};

  if (rank == 0) {
    std::printf("checkpoint_bench: world %d, median of %d, MB/s per rank (MB = 1e6 bytes); raw = write()+fsync / read() of the same bytes\n",
                world->size(), iters);
    std::printf("%-8s %10s %10s %10s %10s %10s %10s %10s\n", "model", "params", "save_MB", "save_MB/s", "raw_w_MB/s",
                "load_MB", "load_MB/s", "raw_r_MB/s");
  }
  std::string summary;
  for (const auto& c : configs) {
    llama::LlamaForCausalLM model(c.model);
    if (world->size() > 1) llama::apply_tp(model, mesh);
    std::vector<at::Tensor> params;
    int64_t num_params = 0;
    for (const auto& p : model->parameters()) {
      params.push_back(p);
      num_params += p.numel();
    }
    torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(1e-3));
    ckpt::StateDict state = ckpt::module_state_dict(*model);
    for (auto& [k, v] : ckpt::adamw_state_dict(optimizer, *model)) state[k] = v;
    const std::string dir = root + "/" + c.name;

    const double save_us = dtensor::bench::synchronized_median_us(iters, group, [&] { ckpt::save(dir, state); });
    const std::string mine = dir + "/shard-0000" + std::to_string(rank + 1) + "-model-00001-of-00001.safetensors";
    const int64_t save_bytes = fs::exists(mine) ? static_cast<int64_t>(fs::file_size(mine)) : 0;
    const double load_us = dtensor::bench::synchronized_median_us(iters, group, [&] { ckpt::load(dir, state); });
    const int64_t load_bytes = local_bytes(state);
    std::vector<double> raw_w, raw_r;
    for (int i = 0; i < iters; ++i) {
      auto [w, r] = raw_write_read_us(root + "/raw_" + std::to_string(rank), std::max<int64_t>(save_bytes, load_bytes));
      raw_w.push_back(w);
      raw_r.push_back(r);
    }
    std::sort(raw_w.begin(), raw_w.end());
    std::sort(raw_r.begin(), raw_r.end());
    const double raw_bytes = static_cast<double>(std::max<int64_t>(save_bytes, load_bytes));
    const double save_mbs = save_bytes / save_us, load_mbs = load_bytes / load_us;  // bytes/µs = MB/s
    const double raw_w_mbs = raw_bytes / raw_w[raw_w.size() / 2], raw_r_mbs = raw_bytes / raw_r[raw_r.size() / 2];
    // Rank 0 prints its own numbers (each rank's file differs in size only by the replicas it writes).
    if (rank == 0) {
      std::printf("%-8s %10lld %10.1f %10.0f %10.0f %10.1f %10.0f %10.0f\n", c.name.c_str(), static_cast<long long>(num_params),
                  save_bytes / 1e6, save_mbs, raw_w_mbs, load_bytes / 1e6, load_mbs, raw_r_mbs);
      std::fflush(stdout);
    }
    char part[256];
    std::snprintf(part, sizeof(part), " %s_save_MBps=%.0f %s_load_MBps=%.0f %s_raw_write_MBps=%.0f %s_raw_read_MBps=%.0f",
                  c.name.c_str(), save_mbs, c.name.c_str(), load_mbs, c.name.c_str(), raw_w_mbs, c.name.c_str(), raw_r_mbs);
    summary += part;
  }
  group.barrier();
  if (rank == 0) {
    fs::remove_all(root);
    std::printf("summary world=%d%s\n", world->size(), summary.c_str());
  }
  return 0;
}
