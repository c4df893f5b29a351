// Reading what the PyTorch oracles (tests/oracle/*.py) write: tensors as {"shape", "values"[, "dtype"]}
// and placements as PyTorch's reprs.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "dtensor/tensor/placement.h"

namespace dtensor::testing {

inline at::Tensor tensor_of(const nlohmann::json& j) {
  auto shape = j["shape"].get<std::vector<int64_t>>();
  if (j.value("dtype", std::string("float32")) == "int64") {
    return at::tensor(j["values"].get<std::vector<int64_t>>(), at::kLong).reshape(shape);
  }
  return at::tensor(j["values"].get<std::vector<double>>(), at::kDouble).to(at::kFloat).reshape(shape);
}

inline Placements placements_of(const nlohmann::json& list) {
  Placements out;
  for (const auto& p : list) out.push_back(Placement::parse(p.get<std::string>()));
  return out;
}

// The oracle file: $`env_var` if set, else build/oracle/`file`.
inline std::string oracle_file(const char* env_var, const std::string& file) {
  const char* env = std::getenv(env_var);
  return env ? env : std::string(DTENSOR_BIN_DIR) + "/../oracle/" + file;
}

}  // namespace dtensor::testing
