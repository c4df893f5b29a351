// Starting ranks: the signal self-pipe the supervisor polls, the torchrun environment, fork and exec.
#pragma once

#include <string>

#include "options.h"
#include "rank_io.h"

namespace tprun {

// Handlers for SIGINT, SIGTERM and SIGCHLD write the signal number into a non-blocking self-pipe; its read
// end is signal_pipe(). SIGPIPE is ignored (a closed stdout must not kill the launcher).
void install_signal_handlers();
int signal_pipe();

// The rendezvous store's listening socket, made by tprun and handed to rank 0 (DTENSOR_MASTER_LISTEN_FD, c10d's
// masterListenFd), as torchrun's agent makes its store's: between tprun's choice of the port and rank 0's start no
// other process (an outgoing connection given that ephemeral port, another job) can take it. Port 0: a free one.
struct StoreSocket {
  int fd = -1;     // listening, close-on-exec (rank 0's copy is made inheritable in the child only)
  long port = 0;
};
// Binds `addr`:`port` when `addr` is loopback, else the wildcard address (as c10d's server binds), and listens.
// Exits 1 with a message when the port is taken; fd -1 (rank 0 binds, as before) when the address is not this
// host's.
StoreSocket reserve_store_port(const std::string& addr, long port);
// A bare program name is looked up next to the tprun executable first, so tools installed alongside tprun
// win over PATH. Returns "" to mean "use PATH".
std::string resolve_program(const std::string& prog);
// Forks rank r (r.local and r.global set) in its own process group with the torchrun environment and its
// output on two pipes; with o.watchdog_timeout_s > 0 also a heartbeat pipe (heartbeats.h); global rank 0
// inherits store.fd. False (with a message) if fork or pipe failed.
bool spawn_rank(const Options& o, const std::string& path, const StoreSocket& store, Rank& r);

}  // namespace tprun
