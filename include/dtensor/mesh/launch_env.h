// The variables a torchrun-compatible launcher (tprun, torchrun --no-python) sets for each rank.
#pragma once

#include <string>

namespace dtensor {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // DTENSOR_MASTER_LISTEN_FD (c10d's TCPStoreOptions::masterListenFd): a socket already listening on
  // MASTER_PORT, inherited from the launcher (tprun, the test harness) by rank 0, which serves the store on it
  // instead of binding the port itself; so no other process can take the port between the launcher's choice
  // and rank 0's start. -1: none.
  int master_listen_fd = -1;

  // Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and, on rank 0,
  // DTENSOR_MASTER_LISTEN_FD: it must be a listening socket on MASTER_PORT).
  // Throws dtensor::Error naming the variable when one is missing, not an integer, or inconsistent
  // (RANK >= WORLD_SIZE, LOCAL_RANK >= LOCAL_WORLD_SIZE, port out of range, ...).
  // LOCAL_RANK / LOCAL_WORLD_SIZE default to RANK / WORLD_SIZE when both are unset.
  static LaunchEnv from_environ();

  // What a program reads before it makes its process group, to print --help or a usage error on rank 0 only: RANK
  // and WORLD_SIZE (the other fields at their defaults), rank 0 of 1 when they are unset (no launcher). Never
  // throws: values that are not integers, or not consistent, read as rank 0 of 1, and from_environ names them when
  // the group is made.
  static LaunchEnv peek();
};

// Seconds from DTENSOR_TIMEOUT_SEC, or `fallback` when unset. Throws on a malformed value.
double timeout_seconds_from_environ(double fallback);

}  // namespace dtensor
