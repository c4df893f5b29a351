// dtensor::find_missing_meta_kernels (dtensor/plan/dry_run.h): run, stop at the op the meta device
// lacks, give that op a CPU stand-in kernel on Meta for the rest of the call, run again. (LibTorch already
// has a boxed fallback for Meta, the one raising "...: attempted to run this operator with Meta tensors",
// so the stand-ins are registered per op, on a torch::Library that lives as long as the call.)
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "dtensor/core/error.h"
#include "dtensor/plan/dry_run.h"
#include "ops/output_meta.h"

namespace dtensor {
namespace {

at::Tensor cpu_zeros_like(const at::Tensor& t) {
  if (!t.defined() || !t.is_meta()) return t;
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kCPU)).zero_();
}

at::Tensor meta_like(const at::Tensor& t) {
  if (!t.defined() || t.is_meta()) return t;
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
}

// Runs the op on CPU zeros; the results come back as meta tensors of the same shapes and strides (an
// in-place or out= result: the caller's meta tensor, resized as the CPU one).
void cpu_standin_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // The dispatch's shape inference keeps learning this op's shapes from the locals, as without a kernel.
  TORCH_CHECK(!ops::in_shape_inference(), op.schema().operator_name(), ": a stand-in, not for shape inference");
  const size_t n = op.schema().arguments().size(), base = stack->size() - n;
  const std::vector<c10::IValue> callers(stack->begin() + base, stack->end());
  for (size_t i = base; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isTensor()) {
      v = cpu_zeros_like(v.toTensor());
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorList().vec()) list.push_back(cpu_zeros_like(t));
      v = list;
    } else if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> list;
      for (const auto& t : v.toOptionalTensorList().vec()) list.push_back(t ? std::optional(cpu_zeros_like(*t)) : t);
      v = list;
    }
  }
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.callBoxed(stack);
  }
  const size_t num_returns = op.schema().returns().size();
  for (size_t r = 0; r < num_returns; ++r) {
    c10::IValue& v = (*stack)[stack->size() - num_returns + r];
    const int written = ops::written_input_for_return(op.schema(), r);
    if (written >= 0 && v.isTensor()) {
      at::Tensor meta = callers[written].toTensor();
      if (!meta.sizes().equals(v.toTensor().sizes())) meta.resize_(v.toTensor().sizes());
      v = meta;
    } else if (v.isTensor()) {
      v = meta_like(v.toTensor());
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorList().vec()) list.push_back(meta_like(t));
      v = list;
    }
  }
}

}  // namespace

std::vector<std::string> find_missing_meta_kernels(const std::function<void()>& run, int max_ops) {
  static const std::regex missing(R"(([A-Za-z_0-9]+::[A-Za-z_0-9.]+): attempted to run this operator with Meta tensors)");
  std::vector<std::string> found;
  std::vector<std::unique_ptr<torch::Library>> standins;
  while (true) {
    std::string message;
    std::exception_ptr error;
    try {
      run();
      return found;
    } catch (const std::exception& e) {
      message = e.what();
      error = std::current_exception();
    }
    std::smatch m;
    if (!std::regex_search(message, m, missing)) std::rethrow_exception(error);
    const std::string name = m[1];
    DTENSOR_CHECK(std::find(found.begin(), found.end(), name) == found.end() &&
                      static_cast<int>(found.size()) < max_ops,
                  "dtensor: find_missing_meta_kernels: still stopped at ", name, " after stand-ins for ", found.size(),
                  " ops: ", message);
    found.push_back(name);
    const auto ns_end = name.find("::");
    standins.push_back(std::make_unique<torch::Library>(torch::Library::IMPL, name.substr(0, ns_end),
                                                        c10::DispatchKey::Meta, __FILE__, __LINE__));
    const std::string op = name.substr(ns_end + 2);
    standins.back()->impl(op.c_str(), torch::CppFunction::makeFromBoxedFunction<&cpu_standin_kernel>());
  }
}

}  // namespace dtensor
