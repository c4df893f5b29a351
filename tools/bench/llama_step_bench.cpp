// llama_step_bench: is tensor parallelism on one host worth its communication? One Llama-style training step
// (llama_train: forward, backward, clipping, AdamW; torchtitan's TP + SP plan with loss parallel) with the same
// two cores spent two ways:
//
//   TP=1, one process with 2 intra-op threads        (OMP_NUM_THREADS=2)
//   TP=2, two processes with 1 thread each, on the same-host shared-memory backend, then on Gloo
//
// and the ratio TP=2 / TP=1 of the median step time (1.0: TP costs nothing beyond its compute split). Each
// configuration runs --repeats times (llama_train's own median_step_ms, first 3 steps excluded); the table
// shows the median over repeats. tools/bench/llama_step_bench.py measures PyTorch's Python TP the same way
// (./scripts/bench_vs_pytorch.sh llama_step runs both).
//
//   llama_step_bench [--dim 512] [--layers 4] [--seq-len 256] [--batch 8] [--steps 12] [--repeats 3]
//                    [--mixed-precision bf16|off]
//
// Needs tprun and llama_train beside it. Prints progress, the table, then a `summary` line.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <regex>
#include <string>
#include <vector>

#include "../common/cli.h"

namespace {

struct Args {
  int64_t dim = 512, layers = 4, seq_len = 256, batch = 8, steps = 12, repeats = 3;
  std::string mixed_precision = "bf16";  // llama_train's --mixed-precision (its default); off: fp32
};

struct Config {
  const char* label;
  int nproc;
  int threads;
  const char* backend;  // DTENSOR_BACKEND ("" for TP=1: no communication)
};

std::string bin_dir() {
  std::array<char, 4096> buf{};
  ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  std::string exe = n > 0 ? std::string(buf.data(), static_cast<size_t>(n)) : "./llama_step_bench";
  return exe.substr(0, exe.rfind('/'));
}

// One llama_train run; returns its median_step_ms (throws with its output if it has none).
double run_once(const Args& a, const Config& c, const std::string& dir) {
  const int64_t ffn = 3 * a.dim;  // the default config's ratio (dim 256, ffn 768)
  std::string cmd = "OMP_NUM_THREADS=" + std::to_string(c.threads) + " DTENSOR_BACKEND=" +
                    (*c.backend ? c.backend : "auto") + " timeout 1200 " + dir + "/tprun --nproc-per-node " +
                    std::to_string(c.nproc) + " --master-port 0 " + dir + "/llama_train --dim " + std::to_string(a.dim) +
                    " --layers " + std::to_string(a.layers) + " --heads 8 --kv-heads 4 --ffn-dim " + std::to_string(ffn) +
                    " --seq-len " + std::to_string(a.seq_len) + " --batch " + std::to_string(a.batch) + " --steps " +
                    std::to_string(a.steps) + " --log-every " + std::to_string(a.steps) + " --mixed-precision " +
                    a.mixed_precision + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run " + cmd);
  std::string out;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), pipe)) out += buf.data();
  const int status = pclose(pipe);
  std::smatch m;
  static const std::regex re("median_step_ms=([0-9.]+)");
  if (status != 0 || !std::regex_search(out, m, re)) {
    throw std::runtime_error(std::string("llama_train (") + c.label + ") failed, exit status " +
                             std::to_string(status) + ":\n" + out);
  }
  return std::stod(m[1]);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    CLI::App app;
    tools_cli::configure(app, "llama_step_bench");
    app.description("llama_step_bench: llama_train's step time at TP=1 (2 threads) and TP=2 (1 thread per rank, shm "
                    "and Gloo), through tprun");
    app.add_option("--dim", a.dim, "hidden size")->check(tools_cli::positive());
    app.add_option("--layers", a.layers, "decoder layers")->check(tools_cli::positive());
    app.add_option("--seq-len", a.seq_len, "tokens per sequence")->check(tools_cli::positive());
    app.add_option("--batch", a.batch, "sequences per step")->check(tools_cli::positive());
    app.add_option("--steps", a.steps, "steps per run (at least 5: llama_train skips 3 warm-up steps)")
        ->check(tools_cli::positive());
    app.add_option("--repeats", a.repeats, "runs per configuration (the table gives their median)")
        ->check(tools_cli::positive());
    app.add_option("--mixed-precision", a.mixed_precision, "llama_train's --mixed-precision: bf16 (its default) or off (fp32)")
        ->check(CLI::IsMember({"bf16", "off"}))->capture_default_str();
    if (tools_cli::parse(app, std::vector<std::string>(argv + 1, argv + argc))) {
      std::fputs(app.help().c_str(), stdout);
      return 0;
    }
    if (a.steps < 5) throw tools_cli::UsageError("--steps must be at least 5 (llama_train skips 3 warm-up steps)");
  } catch (const tools_cli::UsageError& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 2;
  }
  const std::vector<Config> configs{{"TP=1, 2 threads", 1, 2, ""},
                                    {"TP=2, 1 thread/rank, shm", 2, 1, "shm"},
                                    {"TP=2, 1 thread/rank, gloo", 2, 1, "gloo"}};
  try {
    const std::string dir = bin_dir();
    std::vector<double> ms;
    for (const auto& c : configs) {
      std::vector<double> runs;
      for (int64_t r = 0; r < a.repeats; ++r) {
        runs.push_back(run_once(a, c, dir));
        std::printf("progress %s run %lld/%lld: median step %.1f ms\n", c.label, static_cast<long long>(r + 1),
                    static_cast<long long>(a.repeats), runs.back());
        std::fflush(stdout);
      }
      ms.push_back(median(runs));
    }
    std::printf("\n# Llama step (llama_train: dim %lld, %lld layers, seq %lld, batch %lld, SP + loss parallel), two cores\n",
                static_cast<long long>(a.dim), static_cast<long long>(a.layers), static_cast<long long>(a.seq_len),
                static_cast<long long>(a.batch));
    std::printf("%-28s %14s %14s\n", "configuration", "step (ms)", "vs TP=1");
    for (size_t i = 0; i < configs.size(); ++i) {
      std::printf("%-28s %14.1f %13.2fx\n", configs[i].label, ms[i], ms[i] / ms[0]);
    }
    std::printf("summary tp1_ms=%.1f tp2_shm_ms=%.1f tp2_gloo_ms=%.1f ratio_shm=%.3f ratio_gloo=%.3f\n", ms[0], ms[1],
                ms[2], ms[1] / ms[0], ms[2] / ms[0]);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
}
