#include "dtensor/debug/comm_debug_mode.h"

#include <sstream>

#include "dtensor/nn/module_hooks.h"

namespace dtensor {

struct CommDebugMode::State {
  std::map<std::string, int64_t> counts, bytes;
  std::map<std::string, std::map<std::string, int64_t>> by_module;
};

CommDebugMode::CommDebugMode() : state_(std::make_shared<State>()) {
  auto state = state_;
  guard_ = std::make_unique<CommObserverGuard>([state](const CommEvent& e) {
    ++state->counts[e.collective];
    state->bytes[e.collective] += e.bytes;
    ++state->by_module[nn::current_module_path()][e.collective];
  });
}

CommDebugMode::~CommDebugMode() = default;

int64_t CommDebugMode::get_total_counts() const {
  int64_t total = 0;
  for (const auto& [_, n] : state_->counts) total += n;
  return total;
}
std::map<std::string, int64_t> CommDebugMode::get_comm_counts() const { return state_->counts; }
std::map<std::string, int64_t> CommDebugMode::get_comm_bytes() const { return state_->bytes; }
std::map<std::string, std::map<std::string, int64_t>> CommDebugMode::get_comm_module_counts() const {
  return state_->by_module;
}

std::string CommDebugMode::table() const {
  std::ostringstream os;
  os << "module                         collective          count        bytes\n";
  for (const auto& [module, counts] : state_->by_module) {
    for (const auto& [collective, n] : counts) {
      os.width(30);
      os << std::left << (module.empty() ? "(global)" : module) << " ";
      os.width(18);
      os << collective << " ";
      os.width(8);
      os << std::right << n << "\n";
    }
  }
  for (const auto& [collective, n] : state_->bytes) os << "total " << collective << " bytes: " << n << "\n";
  return os.str();
}

}  // namespace dtensor
