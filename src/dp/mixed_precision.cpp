// mixed_precision (include/dtensor/dp/mixed_precision.h): fp32 masters, compute copies by one differentiable cast
// per parameter and forward, made in the module's forward pre-hook and dropped in its forward hook.
#include "dtensor/dp/mixed_precision.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "dtensor/core/error.h"
#include "dtensor/nn/module_hooks.h"
#include "dtensor/nn/parameter_replacement.h"
#include "dp/taken_parameters.h"

namespace dtensor {
namespace {

struct Taken {
  at::Tensor master;
  std::vector<std::pair<torch::nn::Module*, std::string>> uses;  // (owner, name): tied weights have two
};

detail::TakenRegistry<bool> registry;  // every master taken

std::string dtype_text(const std::optional<at::ScalarType>& d) { return d ? c10::toString(*d) : "unset"; }

}  // namespace

namespace detail {
c10::IValue cast_floating(const c10::IValue& v, at::ScalarType dtype) {
  if (!v.isTensor()) return v;
  const at::Tensor& t = v.toTensor();
  return t.defined() && at::isFloatingType(t.scalar_type()) && t.scalar_type() != dtype ? c10::IValue(t.to(dtype)) : v;
}
}  // namespace detail

bool has_mixed_precision(const at::Tensor& parameter) { return registry.contains(parameter); }

void mixed_precision(torch::nn::Module& module, const MixedPrecisionPolicy& policy) {
  DTENSOR_CHECK(policy.param_dtype && at::isFloatingType(*policy.param_dtype),
                "dtensor: mixed_precision: param_dtype must be a floating dtype, got ", dtype_text(policy.param_dtype));
  auto params = std::make_shared<std::vector<Taken>>();
  for (const detail::ParameterUses& u :
       detail::untaken_parameters(module, [](const at::Tensor& p) { return registry.contains(p); })) {
    const at::Tensor& p = u.tensor;
    DTENSOR_CHECK(at::isFloatingType(p.scalar_type()), "dtensor: mixed_precision: parameter '", u.path, "' is ",
                  c10::toString(p.scalar_type()), ", not floating");
    DTENSOR_CHECK(!policy.reduce_dtype || *policy.reduce_dtype == p.scalar_type(),
                  "dtensor: mixed_precision: reduce_dtype ", dtype_text(policy.reduce_dtype), " differs from parameter '",
                  u.path, "''s ", c10::toString(p.scalar_type()),
                  ": without FSDP gradients are reduced where they accumulate, in the masters' dtype "
                  "(FullyShardOptions::mp_policy reduces in another)");
    params->push_back(Taken{p, u.uses});
  }
  DTENSOR_CHECK(!params->empty(), "dtensor: mixed_precision: module ", module.name(), " has no parameters left to take");
  for (const Taken& t : *params) registry.add(t.master, true);
  const at::ScalarType compute = *policy.param_dtype;
  // Forward reads the compute copies: master.to(compute) records the cast, whose backward brings the copy's gradient
  // back to the master's dtype, accumulated into master.grad (and its hooks: TP's gradient sync, DDP's buckets).
  nn::register_forward_pre_hook(module, nn::ForwardPreHook([params, compute, policy](torch::nn::Module&, nn::Args args,
                                                                                     nn::KwArgs kwargs) {
    for (const Taken& t : *params) {
      const at::Tensor copy = t.master.scalar_type() == compute ? t.master : t.master.to(compute);
      for (const auto& [owner, name] : t.uses) nn::set_forward_parameter(*owner, name, copy);
    }
    if (policy.cast_forward_inputs) {
      for (auto& a : args) a = detail::cast_floating(a, compute);
      for (auto& [_, v] : kwargs) v = detail::cast_floating(v, compute);
    }
    return std::make_pair(std::move(args), std::move(kwargs));
  }));
  // After forward the layers read their masters again (what a user, eval or a checkpoint sees); backward keeps the
  // copies it saved.
  nn::register_forward_hook(module, nn::ForwardHook([params, policy](torch::nn::Module&, const nn::Args&, c10::IValue output) {
    for (const Taken& t : *params) {
      for (const auto& [owner, name] : t.uses) nn::set_forward_parameter(*owner, name, t.master);
    }
    if (policy.output_dtype) output = detail::cast_floating(output, *policy.output_dtype);
    return output;
  }));
}

}  // namespace dtensor
