#include "options.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>

namespace tprun {
namespace {

constexpr const char* kUsage =
    "usage: tprun [options] <program> [program args...]\n"
    "\n"
    "Launch <program> once per local rank with the torchrun environment.\n"
    "\n"
    "options (underscores may replace dashes, e.g. --nproc_per_node):\n"
    "  --nproc-per-node N   processes on this node (default 1)\n"
    "  --nnodes N           number of nodes, static only (default 1)\n"
    "  --node-rank R        rank of this node in [0, nnodes) (default 0)\n"
    "  --master-addr HOST   rendezvous address (default 127.0.0.1)\n"
    "  --master-port P      rendezvous port (default 29500; 0 = pick a free\n"
    "                       port, single-node only). With --nnodes > 1, node 0's\n"
    "                       tprun also listens on P + 1: the job watch, through\n"
    "                       which a failure on any host stops every host's ranks\n"
    "  --rdzv-endpoint H:P  rendezvous at H:P instead of numbering nodes by hand\n"
    "                       (torchrun's c10d rendezvous): the tprun on host H serves\n"
    "                       it and is node 0, the others take node ranks as they\n"
    "                       join; the ranks' store is H:P (needs --nnodes > 1)\n"
    "  --max-restarts N     when a rank fails, stop every rank (on every host) and\n"
    "                       start them all again, up to N times (default 0);\n"
    "                       ranks see TORCHELASTIC_RESTART_COUNT\n"
    "  --grace-seconds S    wait before SIGKILL after SIGTERM (default 5)\n"
    "  --no-prefix          do not prefix output lines with [rank<N>]:\n"
    "  -h, --help           show this help\n";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "tprun: error: %s\n", msg.c_str());
  std::exit(2);
}

// Parses all of s as a number in [lo, hi]; anything else is a usage error.
template <typename T>
T parse_number(const std::string& opt, const std::string& s, T lo, T hi) {
  T v{};
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !(v >= lo && v <= hi)) {
    char range[64];
    std::snprintf(range, sizeof range, "[%.10g, %.10g]", double(lo), double(hi));
    usage_error(opt + ": '" + s + "' is not a number in " + range);
  }
  return v;
}

}  // namespace

Options parse_args(int argc, char** argv) {
  constexpr long kMaxCount = 1L << 20;
  Options o;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") { ++i; break; }
    if (arg.size() < 2 || arg[0] != '-') break;  // first non-option: program
    if (arg == "-h" || arg == "--help") { std::fputs(kUsage, stdout); std::exit(0); }

    // Split "--name=value" and normalise torchrun's underscore spellings.
    size_t eq = arg.find('=');
    std::string name = arg.substr(0, eq);
    std::replace(name.begin(), name.end(), '_', '-');
    auto value = [&]() -> std::string {
      if (eq != std::string::npos) return arg.substr(eq + 1);
      if (i + 1 >= argc) usage_error(name + " requires a value");
      return argv[++i];
    };

    if (arg == "--no-prefix" || arg == "--no_prefix") {
      o.prefix = false;
    } else if (name == "--nproc-per-node") {
      o.nproc = parse_number(name, value(), 1L, kMaxCount);
    } else if (name == "--nnodes") {
      std::string v = value();
      if (v.find(':') != std::string::npos)
        usage_error("--nnodes: elastic ranges ('" + v +
                    "') are not supported; give a single number of nodes");
      o.nnodes = parse_number(name, v, 1L, kMaxCount);
    } else if (name == "--node-rank") {
      o.node_rank = parse_number(name, value(), 0L, kMaxCount);
    } else if (name == "--master-addr") {
      o.master_addr = value();
      if (o.master_addr.empty()) usage_error("--master-addr must not be empty");
    } else if (name == "--master-port") {
      o.master_port = parse_number(name, value(), 0L, 65535L);
    } else if (name == "--rdzv-endpoint") {
      o.rdzv_endpoint = value();
      size_t colon = o.rdzv_endpoint.rfind(':');
      if (colon == std::string::npos || colon == 0)
        usage_error("--rdzv-endpoint '" + o.rdzv_endpoint + "' is not HOST:PORT");
      o.master_addr = o.rdzv_endpoint.substr(0, colon);
      o.master_port = parse_number(name, o.rdzv_endpoint.substr(colon + 1), 1L, 65534L);
    } else if (name == "--rdzv-backend" || name == "--rdzv-id") {
      value();  // torchrun's spellings: c10d is the only backend, one job per endpoint
    } else if (name == "--max-restarts") {
      o.max_restarts = parse_number(name, value(), 0L, 1000L);
    } else if (name == "--grace-seconds") {
      o.grace_seconds = parse_number(name, value(), 0.0, 86400.0);
    } else {
      usage_error("unknown option '" + arg + "'");
    }
  }
  if (!o.rdzv_endpoint.empty()) {
    for (int k = 1; k < i; ++k) {
      const std::string a = argv[k];
      for (const char* hand : {"--node-rank", "--node_rank", "--master-addr", "--master_addr", "--master-port", "--master_port"})
        if (a.rfind(hand, 0) == 0) usage_error(std::string(hand) + " with --rdzv-endpoint: the rendezvous numbers the nodes and gives the address");
    }
    if (o.nnodes < 2) usage_error("--rdzv-endpoint needs --nnodes > 1");
  }
  if (o.node_rank >= o.nnodes)
    usage_error("--node-rank " + std::to_string(o.node_rank) +
                " must be in [0, " + std::to_string(o.nnodes) + ")");
  if (o.master_port == 0 && o.nnodes > 1)
    usage_error("--master-port 0 (pick a free port) needs --nnodes 1; "
                "other nodes could not know the port");
  if (i >= argc) usage_error("no program given");
  o.command.assign(argv + i, argv + argc);
  return o;
}

}  // namespace tprun
