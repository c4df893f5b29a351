#include "harness/subprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace dtensor::testing {

namespace {
std::atomic<int64_t> started{0};
}  // namespace

int64_t processes_started() { return started.load(); }

int start_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                  const std::string& output_file) {
  ++started;
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    setpgid(0, 0);
    int fd = open(output_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    for (const auto& [k, v] : env) {
      if (v.empty()) unsetenv(k.c_str());
      else setenv(k.c_str(), v.c_str(), 1);
    }
    // A ReservedPort's socket (close-on-exec in the test) is inherited by the rank given it, and only by it.
    if (auto it = env.find("DTENSOR_MASTER_LISTEN_FD"); it != env.end() && !it->second.empty()) {
      fcntl(std::atoi(it->second.c_str()), F_SETFD, 0);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  return pid;
}

ProcessResult wait_process(int pid, const std::string& output_file, double timeout_seconds) {
  ProcessResult result;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  int status = 0;
  while (true) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      result.timed_out = true;
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(output_file);
  std::stringstream ss;
  ss << in.rdbuf();
  result.output = ss.str();
  std::remove(output_file.c_str());
  return result;
}

ProcessResult run_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                          double timeout_seconds) {
  static int counter = 0;
  std::string out = "/tmp/dtensor_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++) + ".log";
  return wait_process(start_process(argv, env, out), out, timeout_seconds);
}

std::string bin_path(const std::string& program) {
  std::string path = DTENSOR_BIN_DIR;
  path += '/';
  path += program;
  return path;
}

ReservedPort::ReservedPort(Mode mode) : mode_(mode) {
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);  // start_process makes it inheritable for rank 0 only
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      (mode == SERVED && listen(fd_, 2048) != 0) || getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    throw std::runtime_error("ReservedPort: cannot bind a loopback port");
  }
  port_ = ntohs(addr.sin_port);
}

ReservedPort::~ReservedPort() {
  if (fd_ >= 0) close(fd_);
}

std::map<std::string, std::string> ReservedPort::env(int rank) const {
  std::map<std::string, std::string> e{{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port_)}};
  if (rank == 0 && mode_ == SERVED) e["DTENSOR_MASTER_LISTEN_FD"] = std::to_string(fd_);
  return e;
}

}  // namespace dtensor::testing
