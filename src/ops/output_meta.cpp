#include "ops/output_meta.h"

#include <ATen/ATen.h>

#include "dtensor/mesh/comm_hooks.h"
#include "dtensor/mesh/functional_collectives.h"

namespace dtensor::ops {
namespace {

at::Tensor meta_of(const at::Tensor& t) {
  if (!t.defined()) return t;
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
}

thread_local bool shape_inference = false;

}  // namespace

bool in_shape_inference() { return shape_inference; }

std::vector<OutputMeta> meta_outputs(const OpCall& call) {
  // Flagged from the first stand-in on: what shape inference allocates is the dispatcher's, not the program's (the
  // dry run's memory and FLOP counters skip it; a cache hit would skip it anyway).
  struct Flag {
    Flag() { shape_inference = true; }
    ~Flag() { shape_inference = false; }
  } inferring;
  torch::jit::Stack meta_stack;
  for (size_t i = 0; i < call.num_args(); ++i) {
    const c10::IValue& v = call.arg(i);
    if (v.isTensor()) {
      meta_stack.emplace_back(meta_of(v.toTensor()));
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      c10::List<at::Tensor> metas;
      for (size_t k = 0; k < list.size(); ++k) metas.push_back(meta_of(list.get(k)));
      meta_stack.emplace_back(metas);
    } else {
      meta_stack.push_back(v);
    }
  }
  call.op.callBoxed(&meta_stack);
  std::vector<OutputMeta> out;
  for (const auto& v : meta_stack) {
    auto add = [&](const at::Tensor& t) {
      // Undefined outputs (a backward's unneeded gradient) keep their slot.
      out.push_back(t.defined() ? OutputMeta{t.sizes().vec(), t.strides().vec(), t.scalar_type()}
                                : OutputMeta{{}, {}, at::ScalarType::Undefined});
    };
    if (v.isTensor()) add(v.toTensor());
    else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t k = 0; k < list.size(); ++k) add(list.get(k));
    }
  }
  return out;
}

int written_input_for_return(const c10::FunctionSchema& schema, size_t ret) {
  const auto& r = schema.returns()[ret];
  if (!r.alias_info() || !r.alias_info()->isWrite()) return -1;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const auto& a = schema.arguments()[i];
    if (a.alias_info() && a.alias_info()->isWrite() && a.alias_info()->beforeSets() == r.alias_info()->beforeSets()) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

std::vector<OutputMeta> global_outputs_from_locals(const DeviceMesh& mesh, const std::vector<Placements>& placements,
                                                   const torch::jit::Stack& stack, size_t num_returns) {
  std::vector<at::Tensor> locals;
  for (size_t r = 0; r < num_returns; ++r) {
    const c10::IValue& v = stack[stack.size() - num_returns + r];
    if (v.isTensor()) locals.push_back(v.toTensor());
    else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t k = 0; k < list.size(); ++k) locals.push_back(list.get(k));
    }
  }
  std::vector<OutputMeta> out;
  for (size_t o = 0; o < locals.size(); ++o) {
    if (!locals[o].defined()) {
      out.push_back({{}, {}, at::ScalarType::Undefined});
      continue;
    }
    std::vector<int64_t> shape = locals[o].sizes().vec();
    for (int64_t i = mesh.ndim() - 1; i >= 0; --i) {
      const Placement& p = placements.at(o)[i];
      if (!p.is_shard()) continue;
      detail::UncountedCollectivesGuard metadata_only;  // once per decision: not part of the plan's traffic
      auto sizes = exchange_sizes(shape[p.dim()], mesh.get_group(i));
      int64_t total = 0;
      for (int64_t s : sizes) total += s;
      shape[p.dim()] = total;
    }
    out.push_back({shape, contiguous_strides(shape), locals[o].scalar_type()});
  }
  return out;
}

}  // namespace dtensor::ops
