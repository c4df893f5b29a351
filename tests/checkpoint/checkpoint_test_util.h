// Helpers shared by the checkpoint tests: fresh directories, and the full value of a state entry.
#pragma once

#include <ATen/ATen.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "dtensor/api/dtensor_api.h"
#include "harness/temp_dir.h"

namespace dtensor::testing {

// A new empty directory under the system's temp dir, removed when the test binary ends (harness/temp_dir.h).
inline std::string fresh_dir(const std::string& tag) { return temp_dir("ckpt_" + tag); }

// The global value of a DTensor (collective) or the tensor itself.
inline at::Tensor full_value(const at::Tensor& t) { return is_dtensor(t) ? full_tensor(t) : t; }

}  // namespace dtensor::testing
