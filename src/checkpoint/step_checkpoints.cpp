#include "dtensor/checkpoint/step_checkpoints.h"

#include <cstdio>
#include <filesystem>

#include "dtensor/checkpoint/checkpoint.h"

namespace fs = std::filesystem;

namespace dtensor::checkpoint {

std::string step_checkpoint_path(const std::string& dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return (fs::path(dir) / name).string();
}

std::optional<StepCheckpoint> latest_step_checkpoint(const std::string& dir) {
  std::optional<StepCheckpoint> best;
  if (!fs::is_directory(dir)) return best;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    // "step-" and 8 digits, committed (a save in progress stages under ".step-....partial")
    if (name.rfind("step-", 0) != 0 || name.size() != 13 ||
        name.find_first_not_of("0123456789", 5) != std::string::npos || !is_checkpoint(e.path().string())) {
      continue;
    }
    const int64_t step = std::stoll(name.substr(5));
    if (!best || step > best->step) best = StepCheckpoint{step, e.path().string()};
  }
  return best;
}

}  // namespace dtensor::checkpoint
