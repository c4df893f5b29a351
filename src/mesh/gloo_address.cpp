#include "mesh/gloo_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "dtensor/core/error.h"

namespace dtensor::detail {
namespace {

std::string this_hostname() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

// Whether `host` resolves to at least one address that is not loopback.
bool resolves_off_loopback(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (host.empty() || getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  bool off = false;
  for (addrinfo* a = found; a != nullptr && !off; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      off = (ntohl(reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr.s_addr) >> 24) != 127;
    } else if (a->ai_family == AF_INET6) {
      off = !IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
    }
  }
  freeaddrinfo(found);
  return off;
}

// The local address the kernel would send from to reach `host` (a connected UDP socket sends nothing).
std::string source_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), "9", &hints, &found);
  DTENSOR_CHECK(rc == 0, "dtensor: MASTER_ADDR '", host, "' does not resolve (", gai_strerror(rc), ")");
  std::string out, error = "no address";
  for (addrinfo* a = found; a != nullptr && out.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 && getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET6_ADDRSTRLEN] = {0};
      const void* addr = local.ss_family == AF_INET ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                                                    : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (inet_ntop(local.ss_family, addr, text, sizeof(text)) != nullptr) out = text;
    } else {
      error = std::strerror(errno);
    }
    close(fd);
  }
  freeaddrinfo(found);
  DTENSOR_CHECK(!out.empty(), "dtensor: no network route from this host to MASTER_ADDR ", host, " (", error,
                "); set GLOO_SOCKET_IFNAME to the interface that reaches it");
  return out;
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

std::optional<std::string> gloo_bind_address(const std::string& master_addr, std::string* why) {
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname != nullptr && *ifname != '\0') {
    *why = std::string("GLOO_SOCKET_IFNAME=") + ifname;
    return std::nullopt;
  }
  if (is_loopback_host(master_addr)) {
    *why = "MASTER_ADDR " + master_addr + " is loopback: a one-host job";
    return "127.0.0.1";
  }
  const std::string host = this_hostname();
  if (resolves_off_loopback(host)) {
    *why = "the hostname '" + host + "' resolves";
    return std::nullopt;
  }
  const std::string address = source_address_towards(master_addr);
  *why = "the hostname '" + host + "' does not resolve off loopback: the interface routing to MASTER_ADDR " +
         master_addr + " (" + address + ")";
  return address;
}

}  // namespace dtensor::detail
