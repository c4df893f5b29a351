#include "dtensor/mesh/launch_env.h"
#include "dtensor/core/error.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>

namespace dtensor {
namespace {

const char* kHint = " (launch with `tprun --nproc-per-node N <program>` or `torchrun --no-python ...`, "
                    "which set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT)";

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

long parse_int(const char* name, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  long value = std::strtol(text.c_str(), &end, 10);
  DTENSOR_CHECK(!text.empty() && *end == '\0' && errno == 0, "dtensor: environment variable ", name, "='", text,
                "' is not an integer");
  return value;
}

long require_int(const char* name) {
  auto v = get(name);
  DTENSOR_CHECK(v, "dtensor: environment variable ", name, " is not set", kHint);
  return parse_int(name, *v);
}

}  // namespace

LaunchEnv LaunchEnv::from_environ() {
  LaunchEnv env;
  long world = require_int("WORLD_SIZE");
  long rank = require_int("RANK");
  DTENSOR_CHECK(world >= 1, "dtensor: WORLD_SIZE=", world, " must be >= 1");
  DTENSOR_CHECK(rank >= 0 && rank < world, "dtensor: RANK=", rank, " is outside [0, WORLD_SIZE=", world, ")");
  auto local_rank_s = get("LOCAL_RANK");
  auto local_world_s = get("LOCAL_WORLD_SIZE");
  long local_rank = local_rank_s ? parse_int("LOCAL_RANK", *local_rank_s) : rank;
  long local_world = local_world_s ? parse_int("LOCAL_WORLD_SIZE", *local_world_s) : world;
  DTENSOR_CHECK(local_world >= 1 && local_world <= world, "dtensor: LOCAL_WORLD_SIZE=", local_world,
                " must be in [1, WORLD_SIZE=", world, "]");
  DTENSOR_CHECK(local_rank >= 0 && local_rank < local_world, "dtensor: LOCAL_RANK=", local_rank,
                " is outside [0, LOCAL_WORLD_SIZE=", local_world, ")");
  auto addr = get("MASTER_ADDR");
  DTENSOR_CHECK(addr && !addr->empty(), "dtensor: environment variable MASTER_ADDR is not set", kHint);
  long port = require_int("MASTER_PORT");
  DTENSOR_CHECK(port >= 1 && port <= 65535, "dtensor: MASTER_PORT=", port, " is outside [1, 65535]");
  env.rank = static_cast<int>(rank);
  env.world_size = static_cast<int>(world);
  env.local_rank = static_cast<int>(local_rank);
  env.local_world_size = static_cast<int>(local_world);
  env.master_addr = *addr;
  env.master_port = static_cast<int>(port);
  if (auto fd_text = get("DTENSOR_MASTER_LISTEN_FD"); fd_text && rank == 0) {
    const long fd = parse_int("DTENSOR_MASTER_LISTEN_FD", *fd_text);
    int listening = 0;
    socklen_t size = sizeof listening;
    sockaddr_storage addr{};
    socklen_t addr_size = sizeof addr;
    DTENSOR_CHECK(fd >= 0 && fd <= INT32_MAX &&
                      getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) == 0 && listening &&
                      getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&addr), &addr_size) == 0,
                  "dtensor: DTENSOR_MASTER_LISTEN_FD=", *fd_text,
                  " is not a listening socket inherited from the launcher (it is set by tprun for rank 0 only)");
    const int bound_port = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                                            : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    DTENSOR_CHECK(bound_port == port, "dtensor: DTENSOR_MASTER_LISTEN_FD=", *fd_text, " listens on port ", bound_port,
                  ", not on MASTER_PORT=", port);
    fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);  // the store's, not for programs this rank starts
    env.master_listen_fd = static_cast<int>(fd);
  }
  return env;
}

LaunchEnv LaunchEnv::peek() {
  LaunchEnv env;
  const auto rank = get("RANK");
  const auto world = get("WORLD_SIZE");
  if (!rank || !world) return env;
  try {
    const long r = parse_int("RANK", *rank);
    const long w = parse_int("WORLD_SIZE", *world);
    if (w >= 1 && w <= INT32_MAX && r >= 0 && r < w) {
      env.rank = static_cast<int>(r);
      env.world_size = static_cast<int>(w);
    }
  } catch (const Error&) {
    // not integers: rank 0 of 1 until from_environ names them
  }
  return env;
}

double timeout_seconds_from_environ(double fallback) {
  auto v = get("DTENSOR_TIMEOUT_SEC");
  if (!v) return fallback;
  char* end = nullptr;
  double s = std::strtod(v->c_str(), &end);
  DTENSOR_CHECK(!v->empty() && *end == '\0' && s > 0, "dtensor: DTENSOR_TIMEOUT_SEC='", *v,
                "' must be a positive number of seconds");
  return s;
}

}  // namespace dtensor
