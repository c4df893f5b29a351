#include "options.h"

#include "../common/cli.h"
#include "cpu_bind.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>

namespace tprun {
namespace {

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "tprun: error: %s\n", msg.c_str());
  std::exit(2);
}

// torchrun's underscore spellings (--nproc_per_node): the name of an option before the program, with dashes.
std::vector<std::string> dashed_options(int argc, char** argv) {
  std::vector<std::string> args;
  bool program = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (!program && a.rfind("--", 0) == 0 && a != "--") {
      const size_t eq = a.find('=');
      std::replace(a.begin(), a.begin() + static_cast<long>(eq == std::string::npos ? a.size() : eq), '_', '-');
    } else if (!program && (a == "--" || a.empty() || a[0] != '-')) {
      program = true;  // the program and its arguments are passed as they are
    }
    args.push_back(a);
  }
  return args;
}

// The options, defined once: parse_args reads them, --help prints them.
void define(CLI::App& app, Options& o) {
  constexpr long kMaxCount = 1L << 20;
  tools_cli::configure(app, "tprun");
  app.description("Launch <program> once per local rank with the torchrun environment: tprun [options] <program> [args...]");
  app.footer("Underscores may replace dashes (--nproc_per_node, as torchrun spells them).");
  app.prefix_command();  // the first argument that is not an option is the program; the rest is its
  app.add_option("--nproc-per-node", o.nproc, "processes on this node")->check(CLI::Range(1L, kMaxCount));
  app.add_option("--nnodes", o.nnodes, "number of nodes, static only")
      ->check(CLI::Validator(
          [](std::string& v) {
            return v.find(':') == std::string::npos
                       ? std::string()
                       : "elastic ranges ('" + v + "') are not supported; give a single number of nodes";
          },
          ""))
      ->check(CLI::Range(1L, kMaxCount));
  app.add_option("--node-rank", o.node_rank, "rank of this node in [0, nnodes)")->check(CLI::Range(0L, kMaxCount));
  app.add_option("--master-addr", o.master_addr, "rendezvous address")->check(tools_cli::non_empty());
  app.add_option("--master-port", o.master_port,
                 "rendezvous port (0 = pick a free port, single-node only; the default on one node, as torchrun's "
                 "--standalone; 29500 with --nnodes > 1). With --nnodes > 1, node 0's tprun also "
                 "listens on P + 1: the job watch, through which a failure on any host stops every host's ranks")
      ->check(CLI::Range(0L, 65535L));
  app.add_option("--rdzv-endpoint", o.rdzv_endpoint,
                 "rendezvous at H:P instead of numbering nodes by hand (torchrun's c10d rendezvous): the tprun on host "
                 "H serves it and is node 0, the others take node ranks as they join; the ranks' store is H:P (needs "
                 "--nnodes > 1)");
  app.add_option("--rdzv-backend", "torchrun's spelling: c10d is the only backend")->default_str("c10d");
  app.add_option("--rdzv-id", "torchrun's spelling: one job per endpoint")->default_str("");
  app.add_option("--max-restarts", o.max_restarts,
                 "when a rank fails, stop every rank (on every host) and start them all again, up to N times; ranks "
                 "see TORCHELASTIC_RESTART_COUNT")
      ->check(CLI::Range(0L, 1000L));
  app.add_option("--grace-seconds", o.grace_seconds, "after SIGTERM (a failure elsewhere, or preemption: llama_train saves a checkpoint), wait this long before SIGKILL (torchrun's 30 s)")->check(CLI::Range(0.0, 86400.0));
  app.add_option("--watchdog-timeout", o.watchdog_timeout_s,
                 "stop the job (or restart it, --max-restarts) when a rank sends no heartbeat for S seconds (frozen: "
                 "SIGSTOP, stuck in the kernel), or makes no progress outside a collective for S seconds while another "
                 "rank waits for it in one (long phases such as checkpoint saves get more); 0: off")
      ->check(CLI::Range(0.0, 86400.0));
  app.add_option("--cpu-bind", o.cpu_bind,
                 "the CPUs of each local rank (vLLM CPU's VLLM_CPU_OMP_THREADS_BIND): auto splits this process's CPUs "
                 "into one group of whole cores per rank (when there are at least as many cores as ranks, and more than "
                 "one rank), none binds nothing, '0-3|4-7' gives each rank its list; a bound rank's OMP_NUM_THREADS "
                 "defaults to its number of CPUs")
      ->check(tools_cli::non_empty());
  app.add_flag_callback("--no-prefix", [&] { o.prefix = false; }, "do not prefix output lines with [rank<N>]:");
}

}  // namespace

Options parse_args(int argc, char** argv) {
  Options o;
  CLI::App app;
  define(app, o);
  const std::vector<std::string> args = dashed_options(argc, argv);
  try {
    if (tools_cli::parse(app, args)) {
      std::fputs(app.help().c_str(), stdout);
      std::exit(0);
    }
  } catch (const tools_cli::UsageError& e) {
    usage_error(e.what());
  }
  std::vector<std::string> command = app.remaining();
  if (!command.empty() && command[0] == "--") command.erase(command.begin());
  else if (!command.empty() && command[0].size() > 1 && command[0][0] == '-') usage_error("unknown option '" + command[0] + "'");
  if (!o.rdzv_endpoint.empty()) {
    const size_t colon = o.rdzv_endpoint.rfind(':');
    if (colon == std::string::npos || colon == 0) usage_error("--rdzv-endpoint '" + o.rdzv_endpoint + "' is not HOST:PORT");
    const std::string port = o.rdzv_endpoint.substr(colon + 1);
    long p = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
    if (port.empty() || ec != std::errc() || end != port.data() + port.size() || p < 1 || p > 65534) {
      usage_error("--rdzv-endpoint: '" + port + "' is not a number in [1, 65534]");
    }
    for (const char* hand : {"--node-rank", "--master-addr", "--master-port"}) {
      if (app.count(hand) > 0) usage_error(std::string(hand) + " with --rdzv-endpoint: the rendezvous numbers the nodes and gives the address");
    }
    o.master_addr = o.rdzv_endpoint.substr(0, colon);
    o.master_port = p;
    if (o.nnodes < 2) usage_error("--rdzv-endpoint needs --nnodes > 1");
  }
  if (o.node_rank >= o.nnodes)
    usage_error("--node-rank " + std::to_string(o.node_rank) +
                " must be in [0, " + std::to_string(o.nnodes) + ")");
  if (o.master_port == 0 && o.nnodes > 1)
    usage_error("--master-port 0 (pick a free port) needs --nnodes 1; "
                "other nodes could not know the port");
  // One host and no --master-port: a free port (torchrun's --standalone), so another job on 29500 is no obstacle.
  if (o.nnodes == 1 && app.count("--master-port") == 0) o.master_port = 0;
  std::string bind_error;
  o.cpus = rank_cpus(o.cpu_bind, o.nproc, &bind_error);
  if (!bind_error.empty()) usage_error(bind_error);
  if (command.empty()) usage_error("no program given");
  o.command = std::move(command);
  return o;
}

}  // namespace tprun
