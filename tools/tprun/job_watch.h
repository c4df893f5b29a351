// Fail fast across hosts. With --nnodes > 1 each host's tprun joins a job watch: node 0's tprun listens on
// MASTER_ADDR:(master port + 1) and the others connect to it. A line protocol over those TCP connections:
//   node k -> node 0   "HELLO <k> <hostname>"   on connecting
//   host   -> node 0   "JOIN <hostname>"        with --rdzv-endpoint: asks for a node rank
//   node 0 -> host     "RANK <k>" / "REFUSE <why>"  the next node rank in order of arrival (or the job is full)
//   any    -> node 0   "FAIL <round> <text>"    a local rank failed (text names the host, node and rank)
//   node 0 -> all      "FAIL <round> <text>"    the first failure anywhere, relayed to every host
//   node k -> node 0   "STOPPED <round>"        --max-restarts: this host's ranks of that round are all gone
//   node 0 -> all      "RESTART <round>"        every host stopped: start the next round (a barrier, so that
//                                               no new rank meets an old round's store)
//   node 0 -> node k   "GO <round>"             after HELLO / RANK: start the ranks of that round now; a host
//                                               that (re)joins while a restart is pending waits for RESTART
//                                               (tprun waits for it only with --max-restarts)
// With restarts left, a host whose tprun died is waited for (the barrier, bounded): a tprun started again on it
// (by hand, or by the cluster's scheduler) rejoins as the same node and the job restarts with it.
//   node k -> node 0   "DONE"                   every local rank exited 0
//   node 0 -> all      "END"                    node 0's ranks exited 0 (its connection closing is no failure)
// A connection lost without DONE / END counts as a failure of that host (its tprun died or was killed), so
// every other host stops its ranks within a poll interval, naming the host that failed first. The ranks' own
// store and process groups are untouched: this runs beside them, in a thread of tprun.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "options.h"

namespace tprun {

class JobWatch {
 public:
  // Starts the watch thread (node 0: listening; others: connecting, retrying until the job ends). With
  // options.rdzv_endpoint, first the rendezvous: the tprun that can listen on its host is node 0, the others
  // join and get their node rank (bounded by rdzv_timeout_s; throws std::runtime_error saying why).
  JobWatch(const Options& options, long master_port, double rdzv_timeout_s = 300);
  long node_rank() const { return node_rank_; }
  ~JobWatch();
  JobWatch(const JobWatch&) = delete;
  JobWatch& operator=(const JobWatch&) = delete;

  // The first failure anywhere in the job, once known.
  std::optional<std::string> failure() const;
  // A local rank failed: tell the other hosts (through node 0). First failure wins.
  void fail(const std::string& text);
  // Every local rank exited 0 (node 0: END to every host).
  void done();
  // --max-restarts: this host's ranks of `round` are stopped; waits until every host's are (at most
  // `timeout`), then the failure is forgotten and the next round begins. False when a host is gone (its
  // tprun exited) or the wait timed out.
  bool restart_barrier(long round, std::chrono::milliseconds timeout);
  // Node k: waits for node 0's go-ahead (GO, or RESTART for a host rejoining a restart) and returns the round
  // to run; nullopt after `timeout` or when node 0 is gone.
  std::optional<long> wait_go(std::chrono::milliseconds timeout);
  static std::string hostname();

 private:
  void run();
  void serve();                 // node 0
  void follow();                // node k > 0
  void rendezvous(double timeout_s);
  void record(const std::string& text);
  long current_round() const;
  void send_all(const std::string& line);

  const Options opt_;
  const long watch_port_;
  long node_rank_ = 0;
  int listener_ = -1;       // node 0
  int leader_ = -1;         // node k: the connection to node 0 (made by the rendezvous, else by the thread)
  std::thread thread_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::optional<std::string> failure_;
  bool done_ = false;
  long round_ = 0;                 // the restart round being run
  bool lost_ = false;              // a host's tprun is gone: no restart can gather every host
  // Node 0: the other hosts by node rank: connected, the last round they said STOPPED for, and whether they
  // (re)joined while a restart was pending (no ranks running: ready for the barrier).
  struct Host {
    bool present = false;
    long stopped = -1;
    bool fresh = false;
  };
  std::map<long, Host> hosts_;
  long go_ = -1;                   // node k: the round node 0 said to run
  std::vector<std::string> pending_;  // node k: lines that arrived with the rendezvous' answer
  std::string pending_partial_;       // and a partial line after them
  long restart_ = -1;              // node k: the last RESTART round received
  std::condition_variable cv_;
  std::vector<int> peers_;  // node 0: the other hosts; node k: {node 0}
  int wake_[2] = {-1, -1};  // a pipe that wakes the thread's poll
};

}  // namespace tprun
