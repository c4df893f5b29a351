// Helpers shared by the checkpoint tests: fresh directories, and the full value of a state entry.
#pragma once

#include <ATen/ATen.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "dtensor/api/dtensor_api.h"

namespace dtensor::testing {

// A new empty directory under the system's temp dir (not removed: gtest runs are short-lived).
inline std::string fresh_dir(const std::string& tag) {
  std::string pattern = (std::filesystem::temp_directory_path() / ("dtensor_ckpt_" + tag + "_XXXXXX")).string();
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  return pattern;
}

// The global value of a DTensor (collective) or the tensor itself.
inline at::Tensor full_value(const at::Tensor& t) { return is_dtensor(t) ? full_tensor(t) : t; }

}  // namespace dtensor::testing
