// A trial: spawn, watch the phase markers, signal the victim in its moment, wait for each survivor until
// timeout + slack after the later of the fault and its latest phase marker, classify how each ended, clean up
// (a frozen victim gets SIGKILL).
#include "trial.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <set>
#include <sstream>

#include "child.h"

namespace fault_soak {
namespace {

using std::chrono::milliseconds;

// The store's port, held by the trial (listening) until it ends and handed to rank 0 as its fd 3, so no other
// trial or connection can take it between the choice and rank 0's start (as tprun does: tools/tprun/spawn.h).
struct HeldPort {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int port = 0;
  HeldPort() {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd, 2048) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      throw std::runtime_error(std::string("cannot hold a loopback port: ") + std::strerror(errno));
    }
    port = ntohs(addr.sin_port);
  }
  ~HeldPort() { if (fd >= 0) close(fd); }
};

// "phase=all_reduce rank=1 pid=4242" (possibly after tprun's "[rank1]: " prefix).
bool parse_marker(const std::string& line, std::string& phase, int& rank, int& pid) {
  auto at = line.find("phase=");
  if (at == std::string::npos) return false;
  std::istringstream in(line.substr(at));
  std::string p, r, d;
  in >> p >> r >> d;
  if (r.rfind("rank=", 0) != 0 || d.rfind("pid=", 0) != 0) return false;
  phase = p.substr(6);
  rank = std::atoi(r.c_str() + 5);
  pid = std::atoi(d.c_str() + 4);
  return true;
}

std::string first_line_with(const std::string& text, const std::string& needle) {
  auto at = text.find(needle);
  if (at == std::string::npos) return "";
  auto end = text.find('\n', at);
  return text.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

// A clear error is one of ours: the worker caught a dtensor::Error (which names the operation, the group and
// the peers), or tprun reported the rank that died.
Survivor classify(const Child& c, bool hung, Clock::time_point fault, bool injected) {
  Survivor s;
  if (hung) {
    s.ending = Ending::HANG;
    s.error_line = first_line_with(c.err_text, "dtensor:");
  } else if (WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0) {
    s.ending = Ending::OK;
  } else if (WIFSIGNALED(c.status)) {
    s.ending = Ending::CRASH;
    s.error_line = "killed by signal " + std::to_string(WTERMSIG(c.status)) + " (" + strsignal(WTERMSIG(c.status)) + ")";
  } else {
    std::string ours = first_line_with(c.err_text, "soak_worker: error: dtensor");
    std::string launcher = first_line_with(c.err_text, "tprun: rank");
    s.ending = !ours.empty() || !launcher.empty() ? Ending::CLEAR_ERROR : Ending::UNCLEAR_ERROR;
    s.error_line = !ours.empty() ? ours : !launcher.empty() ? launcher : first_line_with(c.err_text, "error");
    if (s.error_line.empty()) s.error_line = "exit " + std::to_string(WEXITSTATUS(c.status)) + ", stderr: " + c.err_text.substr(0, 200);
  }
  if (injected && (c.exited || hung)) {
    auto end = hung ? Clock::now() : c.ended;
    s.exit_after_fault_s = std::max(0.0, std::chrono::duration<double>(end - fault).count());
  }
  return s;
}

}  // namespace

const std::vector<std::string>& phases() {
  static const std::vector<std::string> all = {"start",      "rendezvous", "group",     "all_reduce",
                                               "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                                               "barrier",    "shutdown"};
  return all;
}

const char* ending_name(Ending e) {
  switch (e) {
    case Ending::OK: return "ok";
    case Ending::CLEAR_ERROR: return "clear_error";
    case Ending::UNCLEAR_ERROR: return "unclear_error";
    case Ending::CRASH: return "crash";
    case Ending::HANG: return "HANG";
  }
  return "?";
}

TrialResult run_trial(const TrialSpec& spec, const Settings& settings) {
  TrialResult result;
  result.spec = spec;
  std::vector<Child> procs;  // by hand: one per rank; under tprun: tprun alone
  std::unique_ptr<HeldPort> held;  // by hand: the store's port
  std::map<std::string, std::string> env = {{"DTENSOR_TIMEOUT_SEC", std::to_string(settings.timeout_s)},
                                            {"DTENSOR_BACKEND", spec.backend}};
  const std::vector<std::string> launcher_vars = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                  "MASTER_ADDR", "MASTER_PORT"};
  try {
    if (spec.under_tprun) {
      procs.push_back(spawn_child({settings.tprun, "--nproc-per-node", std::to_string(spec.world), "--master-port", "0",
                                   "--grace-seconds", "1", settings.worker},
                                  env, launcher_vars));
    } else {
      held = std::make_unique<HeldPort>();
      env["MASTER_ADDR"] = "127.0.0.1";
      env["MASTER_PORT"] = std::to_string(held->port);
      env["WORLD_SIZE"] = env["LOCAL_WORLD_SIZE"] = std::to_string(spec.world);
      for (int r = 0; r < spec.world; ++r) {
        env["RANK"] = env["LOCAL_RANK"] = std::to_string(r);
        auto rank_env = env;
        if (r == 0) rank_env["DTENSOR_MASTER_LISTEN_FD"] = "3";
        procs.push_back(spawn_child({settings.worker}, rank_env, {"DTENSOR_MASTER_LISTEN_FD"}, r == 0 ? held->fd : -1));
      }
    }
  } catch (const std::exception& e) {
    result.setup_error = e.what();
    for (auto& c : procs) kill(c.pid, SIGKILL), waitpid(c.pid, nullptr, 0), close_pipes(c);
    return result;
  }
  std::vector<Child*> watched;
  for (auto& c : procs) watched.push_back(&c);

  const auto start = Clock::now();
  const auto timeout = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(settings.timeout_s));
  const auto slack = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(settings.slack_s));
  const auto delay = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(spec.delay_s));
  std::map<int, int> pid_of;  // rank → pid, from the markers
  std::map<int, Clock::time_point> marked;  // rank → when its latest phase marker came
  std::string victim_phase = "unstarted";
  Clock::time_point aimed_phase_began{}, fault{};
  bool aimed_seen = false;
  // Survivors: every rank but the victim (by hand), or tprun. A job that never sees its fault still ends.
  // A survivor is overdue (a hang) once it runs past timeout + slack from the later of the fault and its own
  // latest phase marker: every blocking wait it enters is bounded by the timeout, so one that began after the
  // fault (a rank still loading LibTorch under load when its peer died) has the whole timeout from its start.
  // Phases are few and each ends, so a survivor cannot push its deadline on forever. Under tprun the survivor is
  // the launcher, and its progress the latest marker of any rank but the victim.
  std::vector<bool> overdue(procs.size(), false);
  auto survivor = [&](size_t i) { return spec.under_tprun || static_cast<int>(i) != spec.victim; };
  auto progress_of = [&](size_t i) {
    Clock::time_point latest{};
    for (auto& [rank, when] : marked) {
      if (rank != spec.victim && (spec.under_tprun || rank == static_cast<int>(i))) latest = std::max(latest, when);
    }
    return latest;
  };
  auto survivors_running = [&] {
    for (size_t i = 0; i < procs.size(); ++i) {
      if (survivor(i) && !procs[i].exited && !overdue[i]) return true;
    }
    return false;
  };
  auto victim_exited = [&] {
    if (!spec.under_tprun) return procs[spec.victim].exited;
    return procs[0].exited || (pid_of.count(spec.victim) && kill(pid_of[spec.victim], 0) != 0);
  };
  bool hung = false, frozen_victim_killed = false;
  while (true) {
    pump(watched, milliseconds(5));
    for (auto& c : procs) {
      for (const auto& line : c.new_lines) {
        std::string phase;
        int rank = -1, pid = -1;
        if (!parse_marker(line, phase, rank, pid)) continue;
        pid_of[rank] = pid;
        marked[rank] = Clock::now();
        if (rank != spec.victim) continue;
        victim_phase = phase;
        if (phase == spec.aim && !aimed_seen) aimed_seen = true, aimed_phase_began = Clock::now();
      }
      c.new_lines.clear();
    }
    const auto now = Clock::now();
    if (!result.injected && pid_of.count(spec.victim) && !victim_exited()) {
      bool due = spec.aim == "random" ? now - start >= delay : aimed_seen && now - aimed_phase_began >= delay;
      if (due && kill(pid_of[spec.victim], spec.signal) == 0) {
        result.injected = true;
        result.phase_hit = victim_phase;
        fault = now;
      }
    }
    if (!survivors_running()) break;
    // Under tprun, a frozen victim whose peers all ended (they finished, or failed and were stopped) keeps
    // tprun waiting as it would any slow rank: the soak then kills it, as an operator would, and counts
    // tprun's exit from there on.
    if (spec.under_tprun && result.injected && spec.signal == SIGSTOP && !frozen_victim_killed &&
        static_cast<int>(pid_of.size()) == spec.world) {
      bool peers_gone = true;
      for (auto& [rank, pid] : pid_of) peers_gone &= rank == spec.victim || kill(pid, 0) != 0;
      if (peers_gone) kill(pid_of[spec.victim], SIGKILL), frozen_victim_killed = true;
    }
    for (size_t i = 0; i < procs.size(); ++i) {
      if (!survivor(i) || procs[i].exited || overdue[i]) continue;
      const auto limit = result.injected ? std::max(fault, progress_of(i)) + timeout + slack
                                         : start + 3 * timeout + 2 * slack + std::chrono::seconds(10);
      if (now >= limit) overdue[i] = hung = true;
    }
  }
  if (!result.injected) result.phase_hit = "exited";

  for (size_t i = 0; i < procs.size(); ++i) {
    if (!spec.under_tprun && static_cast<int>(i) == spec.victim) continue;
    result.survivors.push_back(classify(procs[i], overdue[i] && !procs[i].exited, fault, result.injected));
  }
  // Clean up: the hung, the frozen victim, and the ranks of a tprun that hung (killed while tprun, their
  // parent, still lives, so their pids cannot have been reused). Only unreaped children get signals.
  if (spec.under_tprun && !procs[0].exited) {
    for (auto& [rank, pid] : pid_of) kill(pid, SIGKILL);
  }
  for (auto& c : procs) {
    if (!c.exited) {
      kill(c.pid, SIGKILL);
      waitpid(c.pid, &c.status, 0);
      c.exited = true;
    }
    close_pipes(c);
  }
  return result;
}

std::string describe(const TrialResult& r) {
  std::ostringstream os;
  os << "trial " << r.spec.index << ": world=" << r.spec.world << " launch=" << (r.spec.under_tprun ? "tprun" : "hand")
     << " backend=" << r.spec.backend << " fault=" << (r.spec.signal == SIGKILL ? "SIGKILL" : "SIGSTOP")
     << " victim=" << r.spec.victim << " aim=" << r.spec.aim << " delay_s=" << r.spec.delay_s
     << " hit=" << r.phase_hit;
  if (!r.setup_error.empty()) os << " setup_error=\"" << r.setup_error << "\"";
  for (const auto& s : r.survivors) {
    os << "\n    " << ending_name(s.ending) << " after " << s.exit_after_fault_s << " s";
    if (!s.error_line.empty()) os << ": " << s.error_line.substr(0, 400);
  }
  return os.str();
}

}  // namespace fault_soak
