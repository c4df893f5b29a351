#include "harness/temp_dir.h"

#include <stdlib.h>

#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <system_error>
#include <vector>

namespace dtensor::testing {
namespace {

std::mutex mu;
std::vector<std::string> made;  // ranks as threads may make them concurrently

}  // namespace

std::string temp_dir(const std::string& tag) {
  std::string pattern = (std::filesystem::temp_directory_path() / ("dtensor_" + tag + "_XXXXXX")).string();
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("temp_dir: mkdtemp failed for " + pattern);
  std::lock_guard<std::mutex> lock(mu);
  made.push_back(pattern);
  return pattern;
}

void remove_temp_dirs() {
  std::lock_guard<std::mutex> lock(mu);
  for (const std::string& dir : made) {
    std::error_code ignored;  // a test may have removed its own already
    std::filesystem::remove_all(dir, ignored);
  }
  made.clear();
}

}  // namespace dtensor::testing
