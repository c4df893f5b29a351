// Which address this rank's Gloo device binds, when nothing says (PyTorch's Gloo binds the address its
// hostname resolves to, and falls back to loopback with a warning when it does not resolve; a host whose name
// resolves nowhere, as a container's or a network namespace's, then cannot be reached by the others).
#pragma once

#include <optional>
#include <string>

namespace dtensor::detail {

// The address Gloo should bind for a job whose store is at master_addr, or nullopt for Gloo's own choice:
//   - GLOO_SOCKET_IFNAME set: nullopt (Gloo takes that interface, PyTorch's override);
//   - master_addr on loopback: "127.0.0.1" (a one-host job);
//   - this host's name resolves to an address that is not loopback: nullopt (Gloo's default finds it);
//   - else: the address of the interface that routes to master_addr (the source address the kernel picks for a
//     UDP socket connected to it; no packet is sent). Throws naming master_addr when there is no route.
// `why` receives one line saying which rule chose it, for errors.
std::optional<std::string> gloo_bind_address(const std::string& master_addr, std::string* why);

bool is_loopback_host(const std::string& host);

}  // namespace dtensor::detail
