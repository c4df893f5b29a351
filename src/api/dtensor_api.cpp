// distribute_tensor, from_local, to_local, full_tensor, redistribute: the DTensor API and its autograd.
#include "dtensor/core/error.h"
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <numeric>
#include <sstream>
#include <stdexcept>

#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/redistribute/redistribute.h"
#include "dtensor/api/dtensor_api.h"
#include "mesh/autograd_comm_scope.h"
#include "tensor/dtensor_impl.h"

namespace dtensor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Specs travel through autograd contexts inside IValue capsules.
struct SpecHolder : torch::CustomClassHolder {
  explicit SpecHolder(DTensorSpec s) : spec(std::move(s)) {}
  DTensorSpec spec;
};

void save_spec(AutogradContext* ctx, const char* key, const DTensorSpec& spec) {
  ctx->saved_data[key] = c10::IValue::make_capsule(c10::make_intrusive<SpecHolder>(spec));
}

const DTensorSpec& load_spec(AutogradContext* ctx, const char* key) {
  auto holder = c10::static_intrusive_pointer_cast<SpecHolder>(ctx->saved_data[key].toCapsule());
  return holder->spec;
}

DTensorSpec with_placements(const DTensorSpec& spec, Placements placements) {
  return DTensorSpec(spec.mesh, std::move(placements), spec.meta);
}

const at::Tensor& require_dtensor(const at::Tensor& t, const char* what) {
  DTENSOR_CHECK(is_dtensor(t), "dtensor: ", what, " expects a DTensor, got a plain tensor");
  return t;
}

// Backward placements of a redistribute (PyTorch's Redistribute.backward): the gradient goes back to the
// source placements, except that where the source was Partial and the gradient is not, the gradient
// stays Replicate: splitting a replicated gradient into partial terms would only defer a reduction.
Placements backward_placements(const Placements& src, const Placements& grad) {
  Placements out;
  for (size_t i = 0; i < src.size(); ++i) {
    out.push_back(src[i].is_partial() && !grad[i].is_partial() ? Replicate() : src[i]);
  }
  return out;
}

struct RedistributeFn : torch::autograd::Function<RedistributeFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const Placements& dst) {
    const DTensorSpec& src = dtensor_spec(input);
    DTensorSpec out_spec = with_placements(src, dst);
    save_spec(ctx, "src", src);
    detail::save_comm_scope(ctx);
    return detail::make_dtensor(redistribute_local(detail::local_tensor(input), src, out_spec.placements), out_spec);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const CommScopeGuard scope = detail::restore_comm_scope(ctx);
    const DTensorSpec& src = load_spec(ctx, "src");
    const at::Tensor& grad = require_dtensor(grads[0], "redistribute backward");
    const DTensorSpec& grad_spec = dtensor_spec(grad);
    Placements target = backward_placements(src.placements, grad_spec.placements);
    at::Tensor local = redistribute_local(detail::local_tensor(grad), grad_spec, target);
    return {detail::make_dtensor(local, with_placements(grad_spec, target)), at::Tensor()};
  }
};

struct ToLocalFn : torch::autograd::Function<ToLocalFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const std::optional<Placements>& grad_placements) {
    const DTensorSpec& spec = dtensor_spec(input);
    save_spec(ctx, "spec", with_placements(spec, grad_placements.value_or(reduce_partials(spec.placements))));
    return detail::local_tensor(input).detach();  // shares storage with the shard, as PyTorch's to_local
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const DTensorSpec& spec = load_spec(ctx, "spec");
    DTensorSpec grad_spec(spec.mesh, spec.placements, TensorMeta{spec.meta.shape, {}, grads[0].scalar_type()});
    return {detail::make_dtensor(grads[0].contiguous(), grad_spec), at::Tensor()};
  }
};

struct FromLocalFn : torch::autograd::Function<FromLocalFn> {
  // `values`, when defined, replaces the local's values in the result (run_check's broadcast); the
  // gradient still flows to `local`.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& local, const DTensorSpec& spec,
                            const std::optional<at::Tensor>& values) {
    save_spec(ctx, "grad_spec", with_placements(spec, reduce_partials(spec.placements)));
    detail::save_comm_scope(ctx);
    return detail::make_dtensor((values ? *values : local).detach(), spec);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const CommScopeGuard scope = detail::restore_comm_scope(ctx);
    const DTensorSpec& target = load_spec(ctx, "grad_spec");
    const at::Tensor& grad = require_dtensor(grads[0], "from_local backward");
    at::Tensor local = redistribute_local(detail::local_tensor(grad), dtensor_spec(grad), target.placements);
    return {local, at::Tensor(), at::Tensor()};
  }
};

// Every rank's (local shape..., dtype) over the whole mesh, as a [mesh size, ndim + 1] table in mesh order.
at::Tensor gather_local_info(const at::Tensor& local, const DeviceMesh& mesh) {
  std::vector<int64_t> info(local.sizes().begin(), local.sizes().end());
  info.push_back(static_cast<int64_t>(local.scalar_type()));
  at::Tensor table = at::tensor(info, at::kLong).unsqueeze(0);
  // Gathering along mesh dims from the innermost out leaves the rows in row-major mesh order.
  for (int64_t i = mesh.ndim() - 1; i >= 0; --i) table = all_gather(table, 0, mesh.get_group(i));
  return table;
}

// As PyTorch's distribute_tensor / from_local: a CPU tensor given to a mesh of another device type moves to the
// mesh's device (differentiably); tensors already on a device, and meta tensors, stay where they are.
at::Tensor on_mesh_device(const at::Tensor& t, const DeviceMesh& mesh) {
  if (t.is_cpu() && !mesh.device().is_cpu()) return t.to(mesh.device());
  return t;
}

std::vector<int64_t> unravel(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> coord(shape.size());
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    coord[d] = flat % shape[d];
    flat /= shape[d];
  }
  return coord;
}

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

// from_local's run_check: infers the exact global shape from all local shapes and checks that every
// rank's shard is the one that shape implies. The table is the same on every rank, so every rank raises
// the same error.
std::vector<int64_t> check_and_infer_shape(const at::Tensor& local, const DeviceMesh& mesh, const Placements& placements,
                                           const std::optional<std::vector<int64_t>>& shape) {
  at::Tensor table = gather_local_info(local, mesh);
  const int64_t ndim = local.dim();
  auto row = [&](int64_t r) { return table[r]; };
  for (int64_t r = 0; r < table.size(0); ++r) {
    DTENSOR_CHECK(row(r)[ndim].item<int64_t>() == static_cast<int64_t>(local.scalar_type()),
                  "dtensor: from_local: local tensors have different dtypes across the mesh (rank ", mesh.ranks()[r],
                  " has ", c10::toString(static_cast<c10::ScalarType>(row(r)[ndim].item<int64_t>())), ", rank ",
                  mesh.get_rank(), " has ", c10::toString(local.scalar_type()), ")");
  }
  std::vector<int64_t> global;
  if (shape) {
    global = *shape;
  } else {
    // Sum the local sizes over the coordinates of the mesh dims that shard each tensor dim, holding the
    // other mesh coordinates at 0. Unsharded dims come from the first rank's table row, so every rank
    // infers the same shape (and reports the same offender).
    for (int64_t d = 0; d < ndim; ++d) global.push_back(row(0)[d].item<int64_t>());
    for (int64_t d = 0; d < ndim; ++d) {
      bool sharded = false;
      for (const auto& p : placements) sharded = sharded || p.is_shard(d);
      if (!sharded) continue;
      int64_t total = 0;
      for (int64_t r = 0; r < table.size(0); ++r) {
        auto c = unravel(r, mesh.shape());
        bool on_axis = true;
        for (int64_t i = 0; i < mesh.ndim(); ++i) on_axis = on_axis && (placements[i].is_shard(d) || c[i] == 0);
        if (on_axis) total += row(r)[d].item<int64_t>();
      }
      global[d] = total;
    }
  }
  for (int64_t r = 0; r < table.size(0); ++r) {
    auto expected = local_shard(global, mesh, placements, unravel(r, mesh.shape())).shape;
    std::vector<int64_t> got(ndim);
    for (int64_t d = 0; d < ndim; ++d) got[d] = row(r)[d].item<int64_t>();
    DTENSOR_CHECK(got == expected, "dtensor: from_local: inconsistent local shapes across the mesh: rank ",
                  mesh.ranks()[r], " has ", shape_str(got), " but global shape ", shape_str(global),
                  " with placements ", to_string(placements), " gives it ", shape_str(expected));
  }
  return global;
}

}  // namespace

at::Tensor distribute_tensor(const at::Tensor& tensor, const DeviceMesh& mesh, Placements placements,
                             std::optional<int> src_data_rank) {
  if (is_dtensor(tensor)) {
    const DTensorSpec& spec = dtensor_spec(tensor);
    DTensorSpec wanted(mesh, std::move(placements), spec.meta);
    if (spec.mesh == mesh && spec.placements == wanted.placements) return tensor;
    throw DTENSOR_ERROR("dtensor: distribute_tensor got a DTensor with placements ", to_string(spec.placements),
                        "; use redistribute to change them");
  }
  DTENSOR_CHECK(tensor.is_leaf(),
                "dtensor: distribute_tensor should be used on leaf tensors; detach() the input first");
  TensorMeta meta{tensor.sizes().vec(), {}, tensor.scalar_type()};
  DTensorSpec spec(mesh, std::move(placements), meta);
  auto coord = mesh.get_coordinate();
  DTENSOR_CHECK(coord, "dtensor: distribute_tensor on rank ", mesh.get_rank(), " which is not in ", mesh.to_string());
  if (src_data_rank) {
    for (int64_t i = 0; i < mesh.ndim(); ++i) {
      DTENSOR_CHECK(*src_data_rank >= 0 && *src_data_rank < mesh.size(i), "dtensor: src_data_rank ",
                    *src_data_rank, " is not a rank of mesh dim ", i, " (size ", mesh.size(i),
                    "); as in PyTorch it is the source's index along every mesh dim, not a global rank");
    }
  }
  // A meta tensor holds no data to send: every rank cuts its own part's shape (a model built on the meta device and
  // parallelized before its parameters exist: dtensor/nn/materialize.h).
  if (tensor.is_meta()) src_data_rank.reset();
  // Mesh dims in order, each acting on what the previous left (PyTorch's order): Shard scatters from the
  // source (or cuts locally without one), Replicate and Partial broadcast, Partial then splits the value.
  // src_data_rank is the source's index along each mesh dim, so the data of the rank at coordinate
  // (s, s, ...) ends up distributed.
  at::Tensor local = on_mesh_device(tensor.detach(), mesh);
  for (int64_t i = 0; i < mesh.ndim(); ++i) {
    ProcessGroup& group = mesh.get_group(i);
    const int64_t n = mesh.size(i);
    const Placement& p = spec.placements[i];
    if (p.is_strided_shard()) {
      // _StridedShard: the source's value to the group, then each rank's strided piece cut locally (PyTorch
      // scatters the pieces; the same values, more bytes: the naive path, as for every _StridedShard).
      const int64_t d = p.dim();
      if (src_data_rank) local = broadcast(local.contiguous(), *src_data_rank, group);
      local = select_runs(local, d, split_runs(Runs{{0, local.size(d)}}, p, n, (*coord)[i]));
    } else if (p.is_shard()) {
      int64_t d = p.dim();
      if (src_data_rank) {
        // The region's size along d, known everywhere: the shape the outer mesh dims leave.
        local = scatter(local, d, *src_data_rank, group, region_size(meta.shape, mesh, spec.placements, i, d, *coord));
      } else {
        local = narrow_chunk(local, d, chunk_sizes(local.size(d), n), (*coord)[i]);
      }
    } else {
      if (src_data_rank) local = broadcast(local, *src_data_rank, group);
      if (p.is_partial()) local = partition_value(local, p.reduce_op(), (*coord)[i], n);
    }
  }
  local = local.clone(at::MemoryFormat::Contiguous);
  return detail::make_dtensor(local, spec, tensor.requires_grad());
}

at::Tensor to_local(const at::Tensor& dtensor, std::optional<Placements> grad_placements) {
  require_dtensor(dtensor, "to_local");
  return ToLocalFn::apply(dtensor, grad_placements);
}

at::Tensor redistribute(const at::Tensor& dtensor, const DeviceMesh& mesh, Placements placements) {
  const DTensorSpec& spec = dtensor_spec(require_dtensor(dtensor, "redistribute"));
  DTENSOR_CHECK(mesh == spec.mesh, "dtensor: redistribute to ", mesh.to_string(), " but the DTensor lives on ",
                spec.mesh.to_string(), " (cross-mesh redistribute is not supported)");
  Placements dst = with_placements(spec, std::move(placements)).placements;  // validates and normalizes
  if (dst == spec.placements) return dtensor;
  return RedistributeFn::apply(dtensor, dst);
}

at::Tensor redistribute(const at::Tensor& dtensor, Placements placements) {
  return redistribute(dtensor, dtensor_spec(require_dtensor(dtensor, "redistribute")).mesh, std::move(placements));
}

at::Tensor full_tensor(const at::Tensor& dtensor, std::optional<Placements> grad_placements) {
  const DTensorSpec& spec = dtensor_spec(require_dtensor(dtensor, "full_tensor"));
  at::Tensor replicated = redistribute(dtensor, spec.mesh, Placements(spec.mesh.ndim(), Replicate()));
  return to_local(replicated, std::move(grad_placements));
}

at::Tensor DTensor::from_local(const at::Tensor& given, const DeviceMesh& mesh, Placements placements, bool run_check,
                               std::optional<std::vector<int64_t>> shape, std::optional<std::vector<int64_t>> stride) {
  DTENSOR_CHECK(!is_dtensor(given), "dtensor: from_local expects a plain local tensor, got a DTensor");
  const at::Tensor local = on_mesh_device(given, mesh);
  // Validate placements against the local tensor's rank before any communication.
  DTensorSpec probe(mesh, placements, TensorMeta{local.sizes().vec(), {}, local.scalar_type()});
  placements = probe.placements;
  DTENSOR_CHECK(!shape || static_cast<int64_t>(shape->size()) == local.dim(), "dtensor: from_local: shape has ",
                shape->size(), " dims, the local tensor ", local.dim());
  std::vector<int64_t> global;
  if (run_check) {
    global = check_and_infer_shape(local, mesh, placements, shape);
  } else if (shape) {
    global = *shape;
  } else {
    global = local.sizes().vec();
    for (int64_t i = 0; i < mesh.ndim(); ++i) {
      if (placements[i].is_shard()) global[placements[i].dim()] *= mesh.size(i);
    }
  }
  DTensorSpec spec(mesh, placements, TensorMeta{global, stride.value_or(std::vector<int64_t>{}), local.scalar_type()});
  auto expected = local_shard(spec).shape;
  DTENSOR_CHECK(local.sizes().vec() == expected, "dtensor: from_local: this rank's local shape ",
                shape_str(local.sizes()), " is not its shard of global shape ", shape_str(global), " under ",
                to_string(placements), " (expected ", shape_str(expected), ")");
  std::optional<at::Tensor> values;  // run_check: what the shard holds instead of `local`'s values
  if (run_check) {
    // As PyTorch: a Replicate mesh dim takes coordinate 0's data, so the replicas agree from here on.
    for (int64_t i = 0; i < mesh.ndim(); ++i) {
      if (placements[i].is_replicate()) values = broadcast(values ? *values : local.detach(), 0, mesh.get_group(i));
    }
  }
  return FromLocalFn::apply(local.contiguous(), spec, values);
}

at::Tensor local_map(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& fn,
                     const std::vector<at::Tensor>& inputs, const std::vector<std::optional<Placements>>& in_placements,
                     Placements out_placements) {
  DTENSOR_CHECK(in_placements.size() == inputs.size(), "dtensor: local_map got ", in_placements.size(),
                " input placements for ", inputs.size(), " inputs");
  const DeviceMesh* mesh = nullptr;
  std::vector<at::Tensor> locals;
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!is_dtensor(inputs[k])) {
      locals.push_back(inputs[k]);
      continue;
    }
    const DTensorSpec& spec = dtensor_spec(inputs[k]);
    if (!mesh) mesh = &spec.mesh;
    at::Tensor moved = in_placements[k] ? redistribute(inputs[k], spec.mesh, *in_placements[k]) : inputs[k];
    locals.push_back(to_local(moved));
  }
  DTENSOR_CHECK(mesh, "dtensor: local_map needs at least one DTensor input");
  DeviceMesh out_mesh = *mesh;
  return DTensor::from_local(fn(locals), out_mesh, std::move(out_placements));
}

}  // namespace dtensor
