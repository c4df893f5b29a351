// CommDebugMode (PyTorch's torch.distributed.tensor.debug.CommDebugMode): counts the collectives issued on
// this thread while it is alive, by type, bytes and the module (its path in the model) that issued them.
//
//   dtensor::CommDebugMode comm;
//   model(x);
//   comm.get_comm_counts();   // {"all_reduce": 1}
//   std::cout << comm.table();
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "dtensor/mesh/comm_hooks.h"

namespace dtensor {

class CommDebugMode {
 public:
  CommDebugMode();
  ~CommDebugMode();
  CommDebugMode(const CommDebugMode&) = delete;
  CommDebugMode& operator=(const CommDebugMode&) = delete;

  int64_t get_total_counts() const;
  std::map<std::string, int64_t> get_comm_counts() const;  // collective -> count
  std::map<std::string, int64_t> get_comm_bytes() const;   // collective -> bytes this rank sent in
  // module path ("" outside any hooked module) -> collective -> count
  std::map<std::string, std::map<std::string, int64_t>> get_comm_module_counts() const;
  std::string table() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
  std::unique_ptr<CommObserverGuard> guard_;
};

}  // namespace dtensor
