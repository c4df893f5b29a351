#include "child.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

extern char** environ;

namespace fault_soak {
namespace {

void read_available(int& fd, std::string& into) {
  char buf[4096];
  while (fd >= 0) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      into.append(buf, static_cast<size_t>(n));
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      return;
    } else {  // EOF or error: the writer is gone
      close(fd);
      fd = -1;
    }
  }
}

void take_lines(Child& c) {
  size_t nl;
  while ((nl = c.out_partial.find('\n')) != std::string::npos) {
    c.new_lines.push_back(c.out_partial.substr(0, nl));
    c.out_partial.erase(0, nl + 1);
  }
}

}  // namespace

Child spawn_child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& set,
                  const std::vector<std::string>& unset, int pass_fd) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e, key = kv.substr(0, kv.find('='));
    if (set.count(key) || std::find(unset.begin(), unset.end(), key) != unset.end()) continue;
    env.push_back(kv);
  }
  for (const auto& [k, v] : set) env.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]), close(out[1]);
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);  // dup2 clears close-on-exec on 1 and 2
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  if (pass_fd >= 0) posix_spawn_file_actions_adddup2(&actions, pass_fd, 3);  // inheritable there
  // The soak itself ignores SIGPIPE, and an ignored signal stays ignored across exec: a job must start with the
  // default, as from a shell, or a rank's death by SIGPIPE (status 141) could never show here.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
  Child c;
  int rc = posix_spawn(&c.pid, args[0], &actions, &attr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(out[1]);
  close(err[1]);
  if (rc != 0) {
    close(out[0]), close(err[0]);
    throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
  }
  c.out_fd = out[0];
  c.err_fd = err[0];
  fcntl(c.out_fd, F_SETFL, O_NONBLOCK);
  fcntl(c.err_fd, F_SETFL, O_NONBLOCK);
  return c;
}

void pump(std::vector<Child*>& children, std::chrono::milliseconds wait) {
  std::vector<pollfd> fds;
  for (Child* c : children) {
    if (c->out_fd >= 0) fds.push_back({c->out_fd, POLLIN, 0});
    if (c->err_fd >= 0) fds.push_back({c->err_fd, POLLIN, 0});
  }
  if (!fds.empty()) poll(fds.data(), fds.size(), static_cast<int>(wait.count()));
  for (Child* c : children) {
    read_available(c->out_fd, c->out_partial);
    read_available(c->err_fd, c->err_text);
    take_lines(*c);
    if (!c->exited) {
      pid_t p;
      do p = waitpid(c->pid, &c->status, WNOHANG); while (p < 0 && errno == EINTR);
      if (p == c->pid) {
        c->exited = true;
        c->ended = Clock::now();
      }
    }
  }
  if (fds.empty()) poll(nullptr, 0, static_cast<int>(wait.count()));
}

void close_pipes(Child& c) {
  if (c.out_fd >= 0) close(c.out_fd);
  if (c.err_fd >= 0) close(c.err_fd);
  c.out_fd = c.err_fd = -1;
}

}  // namespace fault_soak
