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

// A free loopback port ("right now": rank 0 binds it soon after, as torchrun).
long pick_free_port();
// A bare program name is looked up next to the tprun executable first, so tools installed alongside tprun
// win over PATH. Returns "" to mean "use PATH".
std::string resolve_program(const std::string& prog);
// Forks rank r (r.local and r.global set) in its own process group with the torchrun environment and its
// output on two pipes; false (with a message) if fork or pipe failed.
bool spawn_rank(const Options& o, const std::string& path, long port, Rank& r);

}  // namespace tprun
