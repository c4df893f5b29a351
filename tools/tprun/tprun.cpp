// tprun: a torchrun-compatible launcher for non-Python programs
// (roughly `torchrun --no-python`), POSIX/Linux only.
//
//   tprun [options] <program> [program args...]
//
// Starts --nproc-per-node copies of <program> with the torchrun environment
// (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...), relays their stdout and
// stderr line by line with a "[rank<N>]: " prefix, forwards SIGINT/SIGTERM,
// and tears the whole group down as soon as one rank fails.
//
// Exit status: 0 if every rank exited 0; 1 if a rank failed (or could not be
// started); 128+signo if tprun was stopped by SIGINT/SIGTERM; 2 on bad usage.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

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
    "                       port, single-node only)\n"
    "  --grace-seconds S    wait before SIGKILL after SIGTERM (default 5)\n"
    "  --no-prefix          do not prefix output lines with [rank<N>]:\n"
    "  -h, --help           show this help\n";

struct Options {
  long nproc = 1;
  long nnodes = 1;
  long node_rank = 0;
  std::string master_addr = "127.0.0.1";
  long master_port = 29500;
  double grace_seconds = 5;
  bool prefix = true;
  std::vector<std::string> command;  // program + its arguments
};

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
    } else if (name == "--grace-seconds") {
      o.grace_seconds = parse_number(name, value(), 0.0, 86400.0);
    } else {
      usage_error("unknown option '" + arg + "'");
    }
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

// Asks the kernel for a free port by binding 127.0.0.1:0. The port is only
// free "right now"; rank 0 is expected to bind it soon after (as torchrun).
long pick_free_port() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::fprintf(stderr, "tprun: error: cannot pick a free port: %s\n",
                 std::strerror(errno));
    std::exit(1);
  }
  close(fd);
  return ntohs(addr.sin_port);
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

// ---------------------------------------------------------------------------
// Signals: handlers only write the signal number into a non-blocking
// self-pipe, which the poll loop watches.

int g_sigpipe[2] = {-1, -1};

void on_signal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t r = write(g_sigpipe[1], &b, 1);
  errno = saved;
}

constexpr int kHandled[] = {SIGINT, SIGTERM, SIGCHLD};

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

void block_handled_signals(int how) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : kHandled) sigaddset(&set, s);
  sigprocmask(how, &set, nullptr);
}

// ---------------------------------------------------------------------------
// Ranks and their output streams.

struct Stream {
  int fd = -1;        // read end of the child's pipe; -1 once closed
  int out_fd = 1;     // where tprun relays it (1 or 2)
  std::string buf;    // bytes of an incomplete line
};

struct Rank {
  long global = 0, local = 0;
  pid_t pid = -1;     // also the child's process group id
  bool reaped = false;
  Stream out, err;
  bool streams_open() const { return out.fd >= 0 || err.fd >= 0; }
};

// Writes all of s with as few write() calls as possible (one, for anything
// a pipe or terminal accepts at once), so lines never interleave.
void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // e.g. EPIPE: nobody is listening, drop the output
    off += static_cast<size_t>(n);
  }
}

void emit_line(const Rank& r, const Stream& s, const char* data, size_t len,
               bool prefix) {
  std::string line;
  if (prefix) line = "[rank" + std::to_string(r.global) + "]: ";
  line.append(data, len);
  if (line.empty() || line.back() != '\n') line += '\n';
  write_all(s.out_fd, line);
}

// Relays complete lines in s.buf; at EOF (flush=true) the remainder too.
// Overlong lines are cut so a rank cannot grow the buffer without bound.
void relay_lines(const Rank& r, Stream& s, bool flush, bool prefix) {
  constexpr size_t kMaxLine = 64 * 1024;
  size_t start = 0;
  for (;;) {
    size_t nl = s.buf.find('\n', start);
    if (nl == std::string::npos) {
      if (s.buf.size() - start < kMaxLine) break;
      nl = start + kMaxLine - 1;
    }
    emit_line(r, s, s.buf.data() + start, nl + 1 - start, prefix);
    start = nl + 1;
  }
  if (flush && start < s.buf.size())
    emit_line(r, s, s.buf.data() + start, s.buf.size() - start, prefix);
  s.buf.erase(0, flush ? s.buf.size() : start);
}

void close_stream(const Rank& r, Stream& s, bool prefix) {
  relay_lines(r, s, /*flush=*/true, prefix);
  close(s.fd);
  s.fd = -1;
}

void read_stream(const Rank& r, Stream& s, bool prefix) {
  char buf[65536];
  ssize_t n;
  do n = read(s.fd, buf, sizeof buf); while (n < 0 && errno == EINTR);
  if (n <= 0) { close_stream(r, s, prefix); return; }  // EOF or error
  s.buf.append(buf, static_cast<size_t>(n));
  relay_lines(r, s, /*flush=*/false, prefix);
}

std::vector<std::string> rank_environment(const Options& o, long port, long local) {
  long rank = o.node_rank * o.nproc + local;
  long world = o.nnodes * o.nproc;
  const std::pair<const char*, std::string> vars[] = {
      {"RANK", std::to_string(rank)},          {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_RANK", std::to_string(local)},   {"LOCAL_WORLD_SIZE", std::to_string(o.nproc)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"ROLE_RANK", std::to_string(rank)},     {"ROLE_WORLD_SIZE", std::to_string(world)},
      {"ROLE_NAME", "default"},                {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(port)},   {"TORCHELASTIC_RUN_ID", "none"}};
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    std::string key = kv.substr(0, kv.find('='));
    bool overridden = std::any_of(std::begin(vars), std::end(vars),
                                  [&](const auto& v) { return key == v.first; });
    if (!overridden) env.push_back(kv);
  }
  for (const auto& [k, v] : vars) env.push_back(std::string(k) + "=" + v);
  if (o.nproc > 1 && !std::getenv("OMP_NUM_THREADS")) env.push_back("OMP_NUM_THREADS=1");
  return env;
}

// Runs in the forked child: never returns.
[[noreturn]] void exec_rank(const Options& o, const std::string& path,
                            std::vector<std::string>& env, int out_w, int err_w) {
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

// Forks one rank; returns false (with a message) if fork or pipe failed.
bool spawn_rank(const Options& o, const std::string& path, long port, Rank& r) {
  // Close-on-exec, so no rank inherits another rank's pipe (or EOF never
  // comes). On failure tprun stops anyway, so a leaked fd does not matter.
  int out_p[2], err_p[2];
  if (pipe2(out_p, O_CLOEXEC) != 0 || pipe2(err_p, O_CLOEXEC) != 0) {
    std::perror("tprun: error: pipe2");
    return false;
  }
  std::vector<std::string> env = rank_environment(o, port, r.local);
  block_handled_signals(SIG_BLOCK);  // no handler may run in the child
  pid_t pid = fork();
  if (pid == 0) exec_rank(o, path, env, out_p[1], err_p[1]);
  int fork_errno = errno;
  if (pid > 0) setpgid(pid, pid);  // also in the parent, to avoid a race
  block_handled_signals(SIG_UNBLOCK);
  close(out_p[1]);
  close(err_p[1]);
  if (pid < 0) {
    std::fprintf(stderr, "tprun: error: fork: %s\n", std::strerror(fork_errno));
    close(out_p[0]); close(err_p[0]);
    return false;
  }
  r.pid = pid;
  r.out = {out_p[0], 1, {}};
  r.err = {err_p[0], 2, {}};
  return true;
}

// ---------------------------------------------------------------------------
// The supervisor loop.

class Launcher {
 public:
  explicit Launcher(const Options& o) : opt_(o) {}

  int run(const std::string& path, long port) {
    ranks_.resize(static_cast<size_t>(opt_.nproc));
    for (long l = 0; l < opt_.nproc; ++l) {
      Rank& r = ranks_[static_cast<size_t>(l)];
      r.local = l;
      r.global = opt_.node_rank * opt_.nproc + l;
      if (!spawn_rank(opt_, path, port, r)) {
        ranks_.resize(static_cast<size_t>(l));  // only the ones started
        spawn_failed_ = true;
        begin_stop(SIGTERM);
        break;
      }
    }
    loop();
    if (failed_rank_ >= 0)
      std::fprintf(stderr, "tprun: stopping: rank %ld failed first\n", failed_rank_);
    if (stop_signal_) return 128 + stop_signal_;  // like torchrun: signal wins
    return (failed_rank_ >= 0 || spawn_failed_) ? 1 : 0;
  }

 private:
  // Signals every rank's process group that may still have members. A group
  // whose leader was reaped can live on while its pipes are held open.
  void signal_all(int sig) {
    for (const Rank& r : ranks_)
      if (!r.reaped || r.streams_open()) kill(-r.pid, sig);
  }

  void begin_stop(int sig) {
    if (stopping_) return;
    stopping_ = true;
    kill_deadline_ = Clock::now() + grace();
    signal_all(sig);
  }

  Clock::duration grace() const {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(opt_.grace_seconds));
  }

  void on_exit_status(Rank& r, int status) {
    r.reaped = true;
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (ok || stopping_) return;  // ranks we stopped ourselves are no cause
    if (WIFSIGNALED(status))
      std::fprintf(stderr,
                   "tprun: rank %ld (local rank %ld, pid %d) was killed by signal %d (%s)\n",
                   r.global, r.local, r.pid, WTERMSIG(status), strsignal(WTERMSIG(status)));
    else
      std::fprintf(stderr, "tprun: rank %ld (local rank %ld, pid %d) exited with status %d\n",
                   r.global, r.local, r.pid, WEXITSTATUS(status));
    failed_rank_ = r.global;
    begin_stop(SIGTERM);
  }

  // Relays what is already buffered in r's pipes (bounded: a grandchild
  // could keep writing forever).
  void drain_ready(Rank& r) {
    for (Stream* s : {&r.out, &r.err})
      for (int i = 0; i < 64 && s->fd >= 0; ++i) {
        pollfd p{s->fd, POLLIN, 0};
        if (poll(&p, 1, 0) <= 0) break;
        read_stream(r, *s, opt_.prefix);
      }
  }

  void reap() {
    for (Rank& r : ranks_) {
      if (r.reaped) continue;
      int status = 0;
      pid_t p;
      do p = waitpid(r.pid, &status, WNOHANG); while (p < 0 && errno == EINTR);
      if (p == r.pid) {
        drain_ready(r);  // relay its last words before reporting its exit
        on_exit_status(r, status);
      } else if (p < 0) {
        r.reaped = true;  // ECHILD: should not happen
      }
    }
  }

  void drain_signal_pipe() {
    unsigned char sigs[64];
    ssize_t n;
    while ((n = read(g_sigpipe[0], sigs, sizeof sigs)) > 0 || (n < 0 && errno == EINTR)) {
      for (ssize_t i = 0; i < n; ++i) {
        int sig = sigs[i];
        if (sig != SIGINT && sig != SIGTERM) continue;  // SIGCHLD: reap() runs anyway
        if (!stop_signal_) {
          std::fprintf(stderr, "tprun: received signal %d (%s), stopping ranks\n", sig,
                       strsignal(sig));
          stop_signal_ = sig;
        }
        if (stopping_) signal_all(sig);  // forward repeats (e.g. a second ^C)
        else begin_stop(sig);
      }
    }
  }

  bool all_reaped() const {
    return std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.reaped; });
  }

  void loop() {
    std::optional<Clock::time_point> drain_deadline;
    for (;;) {
      reap();
      auto now = Clock::now();
      if (stopping_ && !killed_ && now >= kill_deadline_) {
        killed_ = true;
        signal_all(SIGKILL);
      }
      if (all_reaped()) {
        // Leftover grandchildren may hold a pipe open: drain for a bounded time.
        if (!drain_deadline)
          drain_deadline = now + std::max(grace(), Clock::duration(std::chrono::seconds(1)));
        bool open = std::any_of(ranks_.begin(), ranks_.end(),
                                [](const Rank& r) { return r.streams_open(); });
        if (!open || now >= *drain_deadline) break;
      }
      poll_once();
    }
    for (Rank& r : ranks_)
      for (Stream* s : {&r.out, &r.err})
        if (s->fd >= 0) close_stream(r, *s, opt_.prefix);
  }

  // Waits (at most 100 ms: SIGCHLD and deadlines are re-checked by the
  // caller) for output or signals and handles whatever is ready.
  void poll_once() {
    std::vector<pollfd> fds{{g_sigpipe[0], POLLIN, 0}};
    std::vector<std::pair<Rank*, Stream*>> owners{{nullptr, nullptr}};
    for (Rank& r : ranks_)
      for (Stream* s : {&r.out, &r.err})
        if (s->fd >= 0) { fds.push_back({s->fd, POLLIN, 0}); owners.emplace_back(&r, s); }
    if (poll(fds.data(), fds.size(), 100) <= 0) return;  // timeout or EINTR
    if (fds[0].revents) drain_signal_pipe();
    for (size_t i = 1; i < fds.size(); ++i)
      if (fds[i].revents) read_stream(*owners[i].first, *owners[i].second, opt_.prefix);
  }

  const Options& opt_;
  std::vector<Rank> ranks_;
  bool stopping_ = false, killed_ = false, spawn_failed_ = false;
  int stop_signal_ = 0;
  long failed_rank_ = -1;
  Clock::time_point kill_deadline_{};
};

}  // namespace

int main(int argc, char** argv) {
  // Make sure fds 0-2 exist, so no pipe we create can land on them.
  for (int fd = 0; fd <= 2; ++fd)
    if (fcntl(fd, F_GETFD) < 0) open("/dev/null", O_RDWR);
  Options opt = parse_args(argc, argv);
  long port = opt.master_port == 0 ? pick_free_port() : opt.master_port;
  if (opt.nproc > 1 && !std::getenv("OMP_NUM_THREADS"))
    std::fprintf(stderr, "tprun: note: setting OMP_NUM_THREADS=1 for each rank to avoid "
                         "overloading the system; tune it for your application as needed\n");
  install_signal_handlers();
  Launcher launcher(opt);
  return launcher.run(resolve_program(opt.command[0]), port);
}
