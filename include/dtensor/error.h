// The library's one error type. Every error dtensor raises itself — a bad plan, placement, shape, flag or
// environment, an op without a sharding rule, a collective that failed or timed out — is a dtensor::Error,
// so a user can catch exactly ours:
//
//   try { parallelize_module(model, mesh, plan); } catch (const dtensor::Error& e) { ... }
//
// It derives from std::runtime_error (so existing `catch (const std::exception&)` code keeps working).
// Messages start with "dtensor: " and name what failed (op and placements, module path, collective and
// group). Errors from LibTorch itself (c10::Error) pass through unchanged.
#pragma once

#include <stdexcept>
#include <string>

namespace dtensor {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace dtensor
