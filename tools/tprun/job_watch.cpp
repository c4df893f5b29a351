#include "job_watch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>

namespace tprun {
namespace {

void write_line(int fd, const std::string& line) {
  const std::string out = line + "\n";
  size_t off = 0;
  while (off < out.size()) {
    const ssize_t n = send(fd, out.data() + off, out.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the peer is gone: its loss is noticed by the reader
    off += static_cast<size_t>(n);
  }
}

// Complete lines received on a socket so far.
struct LineReader {
  std::string buffer;
  // Reads what is there; false on EOF or error. Complete lines go to `lines`.
  bool read(int fd, std::vector<std::string>& lines) {
    char chunk[512];
    const ssize_t n = recv(fd, chunk, sizeof chunk, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (n <= 0) return false;
    buffer.append(chunk, static_cast<size_t>(n));
    for (size_t nl; (nl = buffer.find('\n')) != std::string::npos; buffer.erase(0, nl + 1)) lines.push_back(buffer.substr(0, nl));
    return true;
  }
};

int open_socket(const std::string& host, long port, bool listen_on_it) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    const bool ok = listen_on_it ? (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0)
                                 : connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!ok) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  return fd;
}

}  // namespace

std::string JobWatch::hostname() {
  char name[256] = {0};
  gethostname(name, sizeof name - 1);
  return name;
}

JobWatch::JobWatch(const Options& options, long master_port, double rdzv_timeout_s)
    : opt_(options), watch_port_(master_port + 1), node_rank_(options.node_rank) {
  if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) wake_[0] = wake_[1] = -1;
  if (!opt_.rdzv_endpoint.empty()) {
    rendezvous(rdzv_timeout_s);
  } else if (node_rank_ == 0) {
    listener_ = open_socket(opt_.master_addr, watch_port_, /*listen=*/true);
    if (listener_ < 0) {
      std::fprintf(stderr, "tprun: warning: cannot listen on %s:%ld for the job watch (%s): other hosts will not "
                           "learn of failures here at once\n", opt_.master_addr.c_str(), watch_port_, std::strerror(errno));
    }
  }
  thread_ = std::thread([this] { run(); });
}

void JobWatch::rendezvous(double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  const std::string where = opt_.master_addr + ":" + std::to_string(watch_port_);
  listener_ = open_socket(opt_.master_addr, watch_port_, /*listen=*/true);
  if (listener_ >= 0) {  // the endpoint is one of this host's addresses: this tprun serves it
    node_rank_ = 0;
    return;
  }
  while ((leader_ = open_socket(opt_.master_addr, watch_port_, /*listen=*/false)) < 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      throw std::runtime_error("no tprun serves the rendezvous at " + where + " (tried for " +
                               std::to_string(static_cast<long>(timeout_s)) + " s; start one on the endpoint's host)");
    }
    usleep(200 * 1000);
  }
  write_line(leader_, "JOIN " + hostname());
  LineReader reader;
  std::vector<std::string> lines;
  while (lines.empty()) {
    pollfd p{leader_, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0 || !reader.read(leader_, lines)) {
      throw std::runtime_error("the rendezvous at " + where + " gave no node rank");
    }
  }
  if (lines[0].rfind("RANK ", 0) != 0) throw std::runtime_error("the rendezvous at " + where + " refused: " + lines[0]);
  node_rank_ = std::stol(lines[0].substr(5));
  pending_.assign(lines.begin() + 1, lines.end());  // GO may have come in the same read: follow() takes them
  pending_partial_ = reader.buffer;
}

JobWatch::~JobWatch() {
  stop_ = true;
  if (wake_[1] >= 0) (void)!write(wake_[1], "x", 1);
  if (thread_.joinable()) thread_.join();
  for (int fd : peers_) close(fd);
  if (listener_ >= 0) close(listener_);
  for (int fd : wake_) if (fd >= 0) close(fd);
}

long JobWatch::current_round() const {
  std::lock_guard<std::mutex> lock(mu_);
  return round_;
}

std::optional<std::string> JobWatch::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void JobWatch::record(const std::string& text) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_) failure_ = text;
  cv_.notify_all();
}

// "<round> <text>" -> the text, when it is of the current round (an older round's late news is dropped).
static std::optional<std::string> of_round(const std::string& message, long round) {
  const size_t sp = message.find(' ');
  if (sp == std::string::npos || message.substr(0, sp) != std::to_string(round)) return std::nullopt;
  return message.substr(sp + 1);
}

bool JobWatch::restart_barrier(long round, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (node_rank_ != 0) {
    for (int fd : peers_) write_line(fd, "STOPPED " + std::to_string(round));
    const bool ok = cv_.wait_for(lock, timeout, [&] { return lost_ || restart_ >= round; }) && !lost_;
    if (ok) {
      round_ = round + 1;
      failure_.reset();
    }
    return ok;
  }
  auto all_ready = [&] {
    for (long k = 1; k < opt_.nnodes; ++k) {
      const Host& h = hosts_[k];
      if (!h.present || (h.stopped < round && !h.fresh)) return false;
    }
    return true;
  };
  const bool ok = cv_.wait_for(lock, timeout, [&] { return lost_ || all_ready(); }) && !lost_;
  if (!ok) return false;
  round_ = round + 1;
  failure_.reset();
  for (auto& [_, h] : hosts_) h.fresh = false;
  for (int fd : peers_) write_line(fd, "RESTART " + std::to_string(round));
  return true;
}

std::optional<long> JobWatch::wait_go(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return lost_ || go_ >= 0; }) || lost_) return std::nullopt;
  round_ = go_;
  failure_.reset();  // what failed before this host (re)joined is the past round's
  return go_;
}

void JobWatch::send_all(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int fd : peers_) write_line(fd, line);
}

void JobWatch::fail(const std::string& text) {
  record(text);
  send_all("FAIL " + std::to_string(current_round()) + " " + *failure());
}

void JobWatch::done() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  send_all(node_rank_ == 0 ? "END" : "DONE");
}

void JobWatch::run() {
  if (node_rank_ == 0) {
    if (listener_ >= 0) serve();
  } else {
    follow();
  }
}

void JobWatch::serve() {
  const int listener = listener_;
  long next_rank = 1;  // --rdzv-endpoint: node ranks in order of arrival
  std::map<int, LineReader> readers;
  std::map<int, std::string> names;  // fd -> "host H (node k)"
  std::map<int, bool> finished;      // fd -> said DONE
  std::map<int, long> node_of;       // fd -> its node rank
  // A host (node k) is known: GO now, or, while a failure waits for the restart barrier, later with RESTART.
  auto joined = [&](int fd, long k) {
    node_of[fd] = k;
    std::lock_guard<std::mutex> lock(mu_);
    Host& h = hosts_[k];
    h.present = true;
    h.fresh = failure_.has_value();
    if (!failure_) write_line(fd, "GO " + std::to_string(round_));
    cv_.notify_all();
  };
  while (!stop_) {
    std::vector<pollfd> fds{{wake_[0], POLLIN, 0}, {listener, POLLIN, 0}};
    for (const auto& [fd, _] : readers) fds.push_back({fd, POLLIN, 0});
    if (poll(fds.data(), fds.size(), 200) <= 0) continue;
    if (fds[1].revents & POLLIN) {
      const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        readers[fd];
        names[fd] = "a host";
        std::lock_guard<std::mutex> lock(mu_);
        peers_.push_back(fd);
        if (failure_) write_line(fd, "FAIL " + std::to_string(round_) + " " + *failure_);  // a late joiner learns of it
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      const int fd = fds[i].fd;
      std::vector<std::string> lines;
      const bool open = readers[fd].read(fd, lines);
      for (const std::string& line : lines) {
        if (line.rfind("JOIN ", 0) == 0) {
          long k = next_rank < opt_.nnodes ? next_rank++ : -1;
          if (k < 0) {  // full: a host coming back takes the first node rank whose host is gone
            std::lock_guard<std::mutex> lock(mu_);
            for (long j = 1; j < opt_.nnodes && k < 0; ++j) if (!hosts_[j].present) k = j;
          }
          if (k < 0) {
            write_line(fd, "REFUSE the job already has its " + std::to_string(opt_.nnodes) + " nodes");
            continue;
          }
          names[fd] = "host " + line.substr(5) + " (node " + std::to_string(k) + ")";
          write_line(fd, "RANK " + std::to_string(k));
          joined(fd, k);
        } else if (line.rfind("HELLO ", 0) == 0) {
          const size_t sp = line.find(' ', 6);
          names[fd] = "host " + (sp == std::string::npos ? std::string("?") : line.substr(sp + 1)) + " (node " +
                      line.substr(6, sp - 6) + ")";
          joined(fd, std::stol(line.substr(6, sp - 6)));
        } else if (line.rfind("FAIL ", 0) == 0) {
          if (auto text = of_round(line.substr(5), current_round())) fail(*text);  // recorded (first wins), relayed to all
        } else if (line == "DONE") {
          finished[fd] = true;
        } else if (line.rfind("STOPPED ", 0) == 0 && node_of.contains(fd)) {
          std::lock_guard<std::mutex> lock(mu_);
          hosts_[node_of[fd]].stopped = std::stol(line.substr(8));
          cv_.notify_all();
        }
      }
      if (!open) {
        if (!finished[fd]) {
          bool restarts_left;
          {
            std::lock_guard<std::mutex> lock(mu_);
            restarts_left = round_ < opt_.max_restarts;
            if (node_of.contains(fd)) hosts_[node_of[fd]].present = false;
          }
          fail(names[fd] + ": its tprun exited or its connection to node 0 was lost" +
               (restarts_left ? " (the restart waits for a tprun to come back on it)" : ""));
          std::lock_guard<std::mutex> lock(mu_);
          if (!restarts_left) lost_ = true;
          cv_.notify_all();
        }
        node_of.erase(fd);
        readers.erase(fd);
        std::lock_guard<std::mutex> lock(mu_);
        std::erase(peers_, fd);
        close(fd);
      }
    }
  }
}

void JobWatch::follow() {
  int fd = leader_;
  while (!stop_ && fd < 0) {  // node 0's tprun may start later: retry until it listens (or the job ends)
    fd = open_socket(opt_.master_addr, watch_port_, /*listen=*/false);
    if (fd < 0) {
      pollfd wake{wake_[0], POLLIN, 0};
      poll(&wake, 1, 200);
    }
  }
  if (fd < 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    peers_.push_back(fd);
    if (leader_ < 0) write_line(fd, "HELLO " + std::to_string(node_rank_) + " " + hostname());
    if (failure_) write_line(fd, "FAIL " + std::to_string(round_) + " " + *failure_);
    if (done_) write_line(fd, "DONE");
  }
  LineReader reader;
  reader.buffer = pending_partial_;
  std::vector<std::string> early = std::move(pending_);
  bool ended = false;
  while (!stop_) {
    std::vector<std::string> lines = std::move(early);
    early.clear();
    bool open = true;
    if (lines.empty()) {
      std::vector<pollfd> fds{{wake_[0], POLLIN, 0}, {fd, POLLIN, 0}};
      if (poll(fds.data(), fds.size(), 200) <= 0 || !fds[1].revents) continue;
      open = reader.read(fd, lines);
    }
    for (const std::string& line : lines) {
      if (line.rfind("FAIL ", 0) == 0) {
        if (auto text = of_round(line.substr(5), current_round())) record(*text);
      }
      if (line.rfind("RESTART ", 0) == 0) {
        std::lock_guard<std::mutex> lock(mu_);
        restart_ = std::stol(line.substr(8));
        if (go_ < 0) go_ = restart_ + 1;  // a host that rejoined during the restart starts with the others
        cv_.notify_all();
      }
      if (line.rfind("GO ", 0) == 0) {
        std::lock_guard<std::mutex> lock(mu_);
        go_ = std::stol(line.substr(3));
        cv_.notify_all();
      }
      if (line == "END") ended = true;
    }
    if (!open) {
      if (!ended) {
        record("host of node 0 (" + opt_.master_addr + "): its tprun exited or the connection to it was lost");
        std::lock_guard<std::mutex> lock(mu_);
        lost_ = true;
        cv_.notify_all();
      }
      return;
    }
  }
}

}  // namespace tprun
