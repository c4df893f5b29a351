#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace dtensor::nn {

// A layer of your own whose forward reads its parameters through members (as layers.h's do): say which
// member holds each parameter, so that when a style or fully_shard replaces a parameter (a DTensor, a
// gathered tensor), forward reads the new one. Derive from it beside torch::nn::Module.
class ParameterMembers {
 public:
  virtual ~ParameterMembers() = default;
  // The member holding parameter `name`, or null.
  virtual at::Tensor* parameter_member(const std::string& name) = 0;
};

}  // namespace dtensor::nn
