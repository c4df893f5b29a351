#include "ops/op_call.h"

#include <ATen/ATen.h>

#include <sstream>

#include "dtensor/core/error.h"
#include "dtensor/ops/dispatch_options.h"
#include "dtensor/api/dtensor_api.h"
#include "tensor/dtensor_impl.h"

namespace dtensor {

namespace {
thread_local bool implicit_replication = false;
}

ImplicitReplicationGuard::ImplicitReplicationGuard() : previous_(implicit_replication) { implicit_replication = true; }
ImplicitReplicationGuard::~ImplicitReplicationGuard() { implicit_replication = previous_; }
bool ImplicitReplicationGuard::active() { return implicit_replication; }


namespace ops {

// ------------------------------------------------------------------------------------------------- OpCall

namespace {
// Autograd's backward of split / chunk / unbind fills the gradients of unused outputs with plain zeros of
// the global shape and concatenates (cat / stack) them with the DTensor gradients; max.dim's backward
// scatters the gradient into plain zeros. A plain all-zero tensor
// there is a replicated zero, whatever the op's other inputs are; nothing else plain is accepted.
bool autograd_zeros(const c10::OperatorHandle& op, const at::Tensor& t) {
  const auto& name = op.operator_name().name;
  if (name != "aten::cat" && name != "aten::stack" && name.rfind("aten::scatter", 0) != 0) return false;
  // A meta tensor (a plan dry run) has no values: in these ops' backward it can only be autograd's zeros.
  if (t.is_meta()) return true;
  at::AutoDispatchBelowADInplaceOrView guard;
  if (!t.is_cpu()) {
    // No host synchronisation on a device: the check runs there and fails the stream if the tensor is not zeros.
    at::_assert_async(t.count_nonzero() == 0, "dtensor: " + name + ": a plain tensor mixed with DTensors must be zeros");
    return true;
  }
  return t.count_nonzero().item<int64_t>() == 0;
}
// Arguments that are taken as replicated when plain, as PyTorch's loss_parallel takes plain labels: the class
// targets and weights of nll_loss (cross_entropy's), which every rank holds whole.
bool replicated_when_plain(const c10::OperatorHandle& op, size_t arg) {
  const auto& name = op.operator_name().name;
  // A plain index of index_select / index_copy / index_fill (a paged KV cache's slots, built alike on every rank) is
  // read as replicated, as a loss's plain targets are.
  if (name == "aten::index_select" || name == "aten::index_copy" || name == "aten::index_copy_" ||
      name == "aten::index_fill" || name == "aten::index_fill_") {
    return op.schema().arguments()[arg].name() == "index";
  }
  if (name != "aten::nll_loss_forward" && name != "aten::nll_loss_backward" && name != "aten::nll_loss2d_forward" &&
      name != "aten::nll_loss2d_backward") {
    return false;
  }
  const std::string& arg_name = op.schema().arguments()[arg].name();
  return arg_name == "target" || arg_name == "weight" || arg_name == "total_weight";
}

// A plan dry run (plan/dry_run.h) holds DTensors whose locals are meta, and keeps the plain tensors the
// user's code makes beside them (token ids, rotary tables, targets) small and on the CPU: the Meta backend
// outranks ours in dispatch, so a plain meta tensor meeting a DTensor would skip this dispatch altogether.
// Once in here (an input DTensor's local is meta), those CPU tensors (plain, or a DTensor's local) become
// meta like the rest, so that the local computation runs the meta kernels (no values are read). CPU scalars
// (0-d) stay: meta kernels take them.
void unify_meta_inputs(torch::jit::Stack& stack, size_t first) {
  auto to_meta = [](const at::Tensor& t) -> at::Tensor {
    if (!t.defined()) return t;
    if (auto* impl = detail::get_impl(t)) {
      if (!impl->local().is_cpu()) return t;
      return detail::make_dtensor(impl->local().to(at::kMeta), impl->spec());
    }
    return t.is_cpu() && t.dim() > 0 ? t.to(at::kMeta) : t;
  };
  for (size_t i = first; i < stack.size(); ++i) {
    c10::IValue& v = stack[i];
    if (v.isTensor()) {
      v = to_meta(v.toTensor());
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> list = v.toTensorList().vec();
      for (auto& t : list) t = to_meta(t);
      v = c10::List<at::Tensor>(list);
    } else if (v.isList()) {  // Tensor?[] (index ops)
      c10::List<c10::IValue> list = v.toList();
      for (size_t k = 0; k < list.size(); ++k) {
        if (list.get(k).isTensor()) list.set(k, to_meta(list.get(k).toTensor()));
      }
    }
  }
}

}  // namespace

OpCall::OpCall(const c10::OperatorHandle& op_, torch::jit::Stack* stack_)
    : op(op_), stack(stack_), first_(stack_->size() - op_.schema().arguments().size()) {
  // Collects the tensor inputs; returns whether a DTensor's local is meta (a plan dry run).
  auto collect = [&] {
    bool meta_local = false;
    const size_t n = num_args();
    for (size_t i = 0; i < n; ++i) {
      const c10::IValue& v = (*stack)[first_ + i];
      auto add = [&](const at::Tensor& t, int list_index) {
        if (!t.defined()) return;
        const detail::DTensorImpl* impl = detail::get_impl(t);
        const DTensorSpec* spec = impl ? &impl->spec() : nullptr;
        if (spec && !mesh) mesh = &spec->mesh;
        meta_local = meta_local || (impl && impl->local().is_meta());
        tensors.push_back(TensorInput{static_cast<int>(i), list_index, t, spec});
      };
      if (v.isTensor()) {
        add(v.toTensor(), -1);
      } else if (v.isTensorList()) {
        auto list = v.toTensorList();
        for (size_t k = 0; k < list.size(); ++k) add(list.get(k), static_cast<int>(k));
      } else if (v.isList()) {
        // Tensor?[] (index ops)
        auto list = v.toListRef();
        for (size_t k = 0; k < list.size(); ++k) {
          if (list[k].isTensor()) add(list[k].toTensor(), static_cast<int>(k));
        }
      }
    }
    return meta_local;
  };
  if (collect()) {  // a dry run only: the CPU tensors beside meta ones become meta, then collected again
    unify_meta_inputs(*stack, first_);
    tensors.clear();
    mesh = nullptr;
    collect();
  }
  for (const auto& t : tensors) {
    if (t.spec && t.spec->mesh != *mesh) fail("got DTensors on different meshes");
    if (!t.spec && t.tensor.dim() != 0 && !ImplicitReplicationGuard::active() &&
        !replicated_when_plain(op, static_cast<size_t>(t.arg)) && !autograd_zeros(op, t.tensor)) {
      fail("got mixed plain at::Tensor and DTensor arguments; convert the plain tensor with distribute_tensor or "
           "DTensor::from_local first (or allow it with dtensor::ImplicitReplicationGuard). A stock torch::nn model "
           "parallelized by a plan is called with plain tensors through dtensor::Parallelized "
           "(dtensor/tp/parallelized.h), which converts its inputs and outputs");
    }
  }
}

std::string OpCall::describe() const { return describe_inputs(op, *stack); }
void OpCall::fail(const std::string& why) const { ops::fail(op, *stack, why); }

const TensorInput* OpCall::tensor_arg(size_t i) const {
  for (const auto& t : tensors) {
    if (t.arg == static_cast<int>(i) && t.list_index < 0) return &t;
  }
  return nullptr;
}

int64_t OpCall::ndim_of(size_t i) const {
  const TensorInput* t = tensor_arg(i);
  return t ? t->tensor.dim() : 0;
}

std::string op_name(const c10::OperatorHandle& op) {
  const auto& name = op.operator_name();
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

std::string describe_inputs(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& args = op.schema().arguments();
  auto inputs = torch::jit::last(stack, args.size());
  std::ostringstream os;
  bool first = true;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = inputs[i];
    auto describe = [&](const at::Tensor& t, const std::string& name) {
      os << (first ? "" : ", ") << name << ": ";
      first = false;
      if (is_dtensor(t)) os << to_string(dtensor_spec(t).placements);
      else if (t.defined()) os << "plain tensor " << t.sizes();
      else os << "undefined";
    };
    if (v.isTensor()) {
      describe(v.toTensor(), args[i].name());
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t k = 0; k < list.size(); ++k) describe(list.get(k), args[i].name() + "[" + std::to_string(k) + "]");
    }
  }
  return os.str();
}

void fail(const c10::OperatorHandle& op, const torch::jit::Stack& stack, const std::string& why) {
  throw DTENSOR_ERROR("dtensor: ", op_name(op), " ", why, " (inputs: ", describe_inputs(op, stack), ")");
}

int first_dtensor_input(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  size_t n = op.schema().arguments().size();
  auto inputs = torch::jit::last(stack, n);
  for (size_t i = 0; i < n; ++i) {
    if (inputs[i].isTensor() && is_dtensor(inputs[i].toTensor())) return static_cast<int>(i);
  }
  return -1;
}

void call_local(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::vector<at::Tensor>* locals) {
  size_t n = op.schema().arguments().size();
  size_t next = 0;
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (!v.isTensor() || !is_dtensor(v.toTensor())) continue;
    v = locals ? (*locals).at(next++) : detail::local_tensor(v.toTensor());
  }
  // Locals never record autograd history: the DTensor wrapper carries it.
  at::AutoDispatchBelowADInplaceOrView guard;
  op.callBoxed(stack);
}

}  // namespace ops
}  // namespace dtensor
