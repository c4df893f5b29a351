// A launched rank and its two output streams, relayed line by line to tprun's own stdout and stderr.
#pragma once

#include <sys/types.h>

#include <string>

#include "heartbeats.h"

namespace tprun {

struct Stream {
  int fd = -1;        // read end of the child's pipe; -1 once closed
  int out_fd = 1;     // where tprun relays it (1 or 2)
  std::string buf;    // bytes of an incomplete line
};

struct Rank {
  long global = 0, local = 0;
  pid_t pid = -1;     // also the child's process group id
  bool reaped = false;
  int status = 0;     // waitpid's, once reaped
  Stream out, err;
  Heartbeat hb;       // tprun's watchdog (heartbeats.h)
  bool streams_open() const { return out.fd >= 0 || err.fd >= 0; }
};

// Reads what is ready on s and relays its complete lines (closing s at EOF or error).
void read_stream(const Rank& r, Stream& s, bool prefix);
// Relays what is left in s (an incomplete last line too) and closes it.
void close_stream(const Rank& r, Stream& s, bool prefix);

}  // namespace tprun
