#include "spawn.h"

#include "cpu_bind.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

extern char** environ;

namespace tprun {
namespace {

// The handlers only write the signal number into the self-pipe, which the supervisor's poll loop watches.
int g_sigpipe[2] = {-1, -1};

void on_signal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t r = write(g_sigpipe[1], &b, 1);
  errno = saved;
}

constexpr int kHandled[] = {SIGINT, SIGTERM, SIGCHLD};

}  // namespace

void install_signal_handlers() {
  if (pipe2(g_sigpipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    std::perror("tprun: error: pipe2");
    std::exit(1);
  }
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int s : kHandled) sigaction(s, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the launcher
}

namespace {

void block_handled_signals(int how) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : kHandled) sigaddset(&set, s);
  sigprocmask(how, &set, nullptr);
}

std::vector<std::string> rank_environment(const Options& o, long port, long local, int listen_fd, int heartbeat_fd) {
  long rank = o.node_rank * o.nproc + local;
  long world = o.nnodes * o.nproc;
  const std::pair<const char*, std::string> vars[] = {
      {"RANK", std::to_string(rank)},          {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_RANK", std::to_string(local)},   {"LOCAL_WORLD_SIZE", std::to_string(o.nproc)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"ROLE_RANK", std::to_string(rank)},     {"ROLE_WORLD_SIZE", std::to_string(world)},
      {"ROLE_NAME", "default"},                {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(port)},   {"TORCHELASTIC_RUN_ID", "none"},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(o.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)}};
  // Another launcher's (a tprun running this one) are never passed on: the fds are not this rank's.
  const char* ours[] = {"DTENSOR_MASTER_LISTEN_FD", "TPRUN_HEARTBEAT_FD", "TPRUN_HEARTBEAT_INTERVAL_MS", "TPRUN_CPUS"};
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    std::string key = kv.substr(0, kv.find('='));
    bool overridden = std::any_of(std::begin(vars), std::end(vars), [&](const auto& v) { return key == v.first; }) ||
                      std::any_of(std::begin(ours), std::end(ours), [&](const char* k) { return key == k; });
    if (!overridden) env.push_back(kv);
  }
  for (const auto& [k, v] : vars) env.push_back(std::string(k) + "=" + v);
  if (listen_fd >= 0) env.push_back("DTENSOR_MASTER_LISTEN_FD=" + std::to_string(listen_fd));
  if (heartbeat_fd >= 0) {
    // A tenth of the timeout, within [0.1 s, 1 s]: several heartbeats fit in any timeout.
    const long every = std::clamp(static_cast<long>(o.watchdog_timeout_s * 100), 100L, 1000L);
    env.push_back("TPRUN_HEARTBEAT_FD=" + std::to_string(heartbeat_fd));
    env.push_back("TPRUN_HEARTBEAT_INTERVAL_MS=" + std::to_string(every));
  }
  // torchrun's one thread a rank, or one a bound CPU (--cpu-bind), unless the user chose.
  const std::vector<int>& cpus = o.cpus[static_cast<size_t>(local)];
  if (o.nproc > 1 && !std::getenv("OMP_NUM_THREADS")) {
    env.push_back("OMP_NUM_THREADS=" + std::to_string(cpus.empty() ? 1 : cpus.size()));
  }
  if (!cpus.empty()) env.push_back("TPRUN_CPUS=" + cpu_list_string(cpus));
  // The ranks' stdout is a pipe to tprun; where tprun's own is a terminal, they are told (tools/common/terminal.h:
  // generated text then shows control bytes escaped).
  if (::isatty(1)) env.push_back("TPRUN_STDOUT_IS_TERMINAL=1");
  return env;
}

// Runs in the forked child: never returns.
[[noreturn]] void exec_rank(const Options& o, long local, const std::string& path,
                            std::vector<std::string>& env, int out_w, int err_w, const std::vector<int>& inherit) {
  for (int fd : inherit) fcntl(fd, F_SETFD, 0);  // the store's socket, the heartbeat pipe: this rank's only
  setpgid(0, 0);  // own process group, so kill(-pid) reaches the whole tree
  for (int s : kHandled) signal(s, SIG_DFL);
  signal(SIGPIPE, SIG_DFL);
  block_handled_signals(SIG_UNBLOCK);
  // Ranks are not in the terminal's foreground group: reading a tty would
  // stop them with SIGTTIN, so give them /dev/null instead of a terminal.
  if (isatty(0)) {
    int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, 0);
  }
  dup2(out_w, 1);
  dup2(err_w, 2);
  if (!bind_to_cpus(o.cpus[static_cast<size_t>(local)])) {
    std::fprintf(stderr, "tprun: warning: cannot bind local rank %ld to CPUs %s: %s\n", local,
                 cpu_list_string(o.cpus[static_cast<size_t>(local)]).c_str(), std::strerror(errno));
  }

  std::vector<char*> argv, envp;
  for (const auto& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  if (!path.empty()) execve(path.c_str(), argv.data(), envp.data());
  else execvpe(argv[0], argv.data(), envp.data());
  std::fprintf(stderr, "tprun: error: cannot execute '%s': %s\n",
               o.command[0].c_str(), std::strerror(errno));
  _exit(127);
}

}  // namespace

int signal_pipe() { return g_sigpipe[0]; }

StoreSocket reserve_store_port(const std::string& addr, long port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(addr.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) {
    std::fprintf(stderr, "tprun: warning: cannot resolve --master-addr '%s': rank 0 binds the store's port itself\n",
                 addr.c_str());
    return {};
  }
  sockaddr_storage where{};
  socklen_t size = 0;
  const int family = found->ai_family;
  if (family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&where);
    const bool loopback = (ntohl(reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr.s_addr) >> 24) == 127;
    in->sin_family = AF_INET;
    in->sin_addr = loopback ? reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr : in_addr{htonl(INADDR_ANY)};
    in->sin_port = htons(static_cast<uint16_t>(port));
    size = sizeof *in;
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&where);
    const in6_addr& a = reinterpret_cast<sockaddr_in6*>(found->ai_addr)->sin6_addr;
    in6->sin6_family = AF_INET6;
    in6->sin6_addr = IN6_IS_ADDR_LOOPBACK(&a) ? a : in6addr_any;
    in6->sin6_port = htons(static_cast<uint16_t>(port));
    size = sizeof *in6;
  }
  freeaddrinfo(found);
  const int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1, zero = 0;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as c10d: TIME_WAIT does not block
  if (fd >= 0 && family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&where), size) != 0 || listen(fd, 2048) != 0) {
    const int err = errno;
    if (fd >= 0) close(fd);
    if (err == EADDRINUSE) {
      std::fprintf(stderr, "tprun: error: cannot serve the rendezvous store on %s:%ld: the port is already in use "
                           "(another job? choose another --master-port, or 0 for a free one)\n", addr.c_str(), port);
      std::exit(1);
    }
    std::fprintf(stderr, "tprun: warning: cannot listen on %s:%ld for the store (%s): rank 0 binds it itself\n",
                 addr.c_str(), port, std::strerror(err));
    return {};
  }
  socklen_t len = sizeof where;
  getsockname(fd, reinterpret_cast<sockaddr*>(&where), &len);
  const long bound = ntohs(family == AF_INET ? reinterpret_cast<sockaddr_in*>(&where)->sin_port
                                             : reinterpret_cast<sockaddr_in6*>(&where)->sin6_port);
  return {fd, bound};
}

// A bare program name is looked up next to the tprun executable first, so
// tools installed alongside tprun win over PATH. Returns "" to mean "use PATH".
std::string resolve_program(const std::string& prog) {
  if (prog.find('/') != std::string::npos) return prog;
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  std::string dir(buf, static_cast<size_t>(n));
  std::string candidate = dir.substr(0, dir.rfind('/') + 1) + prog;
  struct stat st;
  if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
      access(candidate.c_str(), X_OK) == 0)
    return candidate;
  return "";
}

// Forks one rank; returns false (with a message) if fork or pipe failed.
bool spawn_rank(const Options& o, const std::string& path, const StoreSocket& store, Rank& r) {
  // Close-on-exec, so no rank inherits another rank's pipe (or EOF never
  // comes). On failure tprun stops anyway, so a leaked fd does not matter.
  int out_p[2], err_p[2], hb_p[2] = {-1, -1};
  if (pipe2(out_p, O_CLOEXEC) != 0 || pipe2(err_p, O_CLOEXEC) != 0 ||
      (o.watchdog_timeout_s > 0 && pipe2(hb_p, O_CLOEXEC) != 0)) {
    std::perror("tprun: error: pipe2");
    return false;
  }
  const int listen_fd = r.global == 0 ? store.fd : -1;
  std::vector<std::string> env = rank_environment(o, store.port, r.local, listen_fd, hb_p[1]);
  std::vector<int> inherit;
  for (int fd : {listen_fd, hb_p[1]}) if (fd >= 0) inherit.push_back(fd);
  block_handled_signals(SIG_BLOCK);  // no handler may run in the child
  pid_t pid = fork();
  if (pid == 0) exec_rank(o, r.local, path, env, out_p[1], err_p[1], inherit);
  int fork_errno = errno;
  if (pid > 0) setpgid(pid, pid);  // also in the parent, to avoid a race
  block_handled_signals(SIG_UNBLOCK);
  close(out_p[1]);
  close(err_p[1]);
  if (hb_p[1] >= 0) close(hb_p[1]);
  if (pid < 0) {
    std::fprintf(stderr, "tprun: error: fork: %s\n", std::strerror(fork_errno));
    close(out_p[0]); close(err_p[0]);
    if (hb_p[0] >= 0) close(hb_p[0]);
    return false;
  }
  if (hb_p[0] >= 0) fcntl(hb_p[0], F_SETFL, O_NONBLOCK);
  r.hb = Heartbeat{};
  r.hb.fd = hb_p[0];
  r.pid = pid;
  r.out = {out_p[0], 1, {}};
  r.err = {err_p[0], 2, {}};
  return true;
}

}  // namespace tprun
