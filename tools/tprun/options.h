// tprun's command line: torchrun's options that a static single- or multi-node launch needs.
#pragma once

#include <string>
#include <vector>

namespace tprun {

struct Options {
  long nproc = 1;
  long nnodes = 1;
  long node_rank = 0;
  std::string master_addr = "127.0.0.1";
  long master_port = 29500;
  double grace_seconds = 30;  // torchrun's: time for a preemption save (SIGTERM) before SIGKILL
  // The watchdog (heartbeats.h): a rank without a heartbeat, or without progress while others wait for it in a
  // collective, for this long is named and the job stopped (or restarted). 0: off.
  double watchdog_timeout_s = 30;
  // torchrun's --max-restarts: when a rank fails, every rank of the job (every host's) is stopped and started
  // again, up to this many times; ranks see TORCHELASTIC_RESTART_COUNT (and resume from their newest
  // checkpoint, e.g. llama_train --resume). restart_count: the round being run (set by the launcher).
  long max_restarts = 0;
  long restart_count = 0;
  // torchrun's c10d rendezvous: "HOST:PORT". The tprun on HOST serves it (node 0; the ranks' store is
  // HOST:PORT); the others are numbered as they join (job_watch.h). Replaces --node-rank / --master-addr /
  // --master-port.
  std::string rdzv_endpoint;
  bool prefix = true;
  // --cpu-bind (cpu_bind.h): "auto", "none" or one CPU list per local rank; cpus, one list per local rank (empty:
  // not bound), is computed from it once the options are parsed.
  std::string cpu_bind = "auto";
  std::vector<std::vector<int>> cpus;
  std::vector<std::string> command;  // program + its arguments
};

// Parses argv; --help prints the usage and exits 0, a bad option prints one error and exits 2.
Options parse_args(int argc, char** argv);

}  // namespace tprun
