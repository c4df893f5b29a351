// A child process of the soak with its stdout and stderr on pipes: spawned with posix_spawn (the soak runs
// trials on several threads, so no fork-and-do-things), read without blocking, reaped without waiting.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace fault_soak {

using Clock = std::chrono::steady_clock;

struct Child {
  pid_t pid = -1;
  int out_fd = -1, err_fd = -1;
  std::string out_partial;           // stdout after its last newline
  std::vector<std::string> new_lines;  // complete stdout lines not yet taken by the caller
  std::string err_text;              // all of stderr
  bool exited = false;
  int status = 0;                    // waitpid status once exited
  Clock::time_point ended{};
};

// Starts argv[0] with the soak's environment, `set` added or replaced and `unset` removed. Pipes are
// close-on-exec in the parent, so a child of one trial never holds another trial's pipe open.
// `pass_fd` >= 0 is given to the child as its fd 3 (the store's listening socket, for rank 0).
// Throws std::runtime_error when it cannot start.
Child spawn_child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& set,
                  const std::vector<std::string>& unset, int pass_fd = -1);

// Reads what the children wrote, waiting at most `wait` for something to read, then reaps the ones that
// exited (recording when).
void pump(std::vector<Child*>& children, std::chrono::milliseconds wait);

void close_pipes(Child& c);

}  // namespace fault_soak
