#include "dtensor/nn/default_device.h"

namespace dtensor::nn {
namespace {
thread_local std::optional<at::Device> default_device;
}  // namespace

DefaultDeviceGuard::DefaultDeviceGuard(at::Device device) : previous_(default_device) { default_device = device; }
DefaultDeviceGuard::~DefaultDeviceGuard() { default_device = previous_; }
std::optional<at::Device> DefaultDeviceGuard::current() { return default_device; }

}  // namespace dtensor::nn
