// The library's one error type. Every error dtensor raises itself — a bad plan, placement, shape, flag or
// environment, an op without a sharding rule, a collective that failed or timed out — is a dtensor::Error,
// so a user can catch exactly ours:
//
//   try { parallelize_module(model, mesh, plan); } catch (const dtensor::Error& e) { ... }
//
// It derives from std::runtime_error (so existing `catch (const std::exception&)` code keeps working).
// Messages start with "dtensor: " and name what failed (op and placements, module path, collective and
// group). Errors from LibTorch itself (c10::Error) pass through unchanged.
//
// Raising one: DTENSOR_CHECK (TORCH_CHECK's form) streams its pieces into the message, only when it fails:
//
//   DTENSOR_CHECK(size % tp == 0, "dtensor: '", module, "' has ", size, " heads, not divisible by ", tp);
//   throw DTENSOR_ERROR("dtensor: ", op, " has no rule");   // where the throw itself is the branch
//
// Integers, strings and LibTorch's printable types (IntArrayRef, ScalarType, Device) stream as they print. A
// double streams with 6 significant digits; pass std::to_string(x) where a message wants "%f".
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace dtensor {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace detail {
template <typename... Pieces>
std::string error_message(const Pieces&... pieces) {
  std::ostringstream os;
  (os << ... << pieces);
  return os.str();
}
}  // namespace detail

}  // namespace dtensor

// The error DTENSOR_CHECK throws, for a throw that is not a check (a switch's default, a catch that rethrows).
#define DTENSOR_ERROR(...) ::dtensor::Error(::dtensor::detail::error_message(__VA_ARGS__))

#define DTENSOR_CHECK(cond, ...)                                                    \
  do {                                                                              \
    if (!(cond)) [[unlikely]] {                                                     \
      throw DTENSOR_ERROR(__VA_ARGS__);                                             \
    }                                                                               \
  } while (false)
