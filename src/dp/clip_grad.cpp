// clip_grad_norm_ over DTensor and plain gradients (include/dtensor/dp/clip_grad.h).
//
// With p = norm_type, the total norm is ||(g_1, ..., g_k)||_p over full gradient values:
//   finite p != 0:  (sum_i sum |g_i|^p)^(1/p)   -- contributions are p-th power sums, combined by SUM
//   p == 0:         sum_i count_nonzero(g_i)     -- counts, combined by SUM
//   p == +-inf:     max / min_i max / min |g_i|  -- combined by MAX / MIN
// A DTensor gradient's full value is spread over the mesh. On a mesh with dims D, a gradient placed Shard on
// dims S and Replicate on D \ S holds each distinct shard on R = prod_{d not in S} size(d) ranks, so
//   sum over distinct shards = sum over all ranks of (local contribution / R)
// and one SUM all-reduce over the whole mesh combines every gradient on it at once, whatever its placements
// (MAX/MIN need no division: repeats do not change them). Partial gradients are all-reduced to Replicate
// first (Partial -> Replicate = all-reduce). Plain gradients are replicated on every rank: added after the
// reduction, once.
#include "dtensor/dp/clip_grad.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "dtensor/core/error.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/api/dtensor_api.h"

namespace dtensor {
namespace {

enum class Combine { SUM, MAX, MIN };

Combine combine_of(double p) {
  if (std::isinf(p)) return p > 0 ? Combine::MAX : Combine::MIN;
  return Combine::SUM;
}

double identity_of(Combine c) {
  switch (c) {
    case Combine::SUM: return 0.0;
    case Combine::MAX: return 0.0;  // norms are >= 0
    case Combine::MIN: return std::numeric_limits<double>::infinity();
  }
  return 0.0;
}

double combine(Combine c, double a, double b) {
  switch (c) {
    case Combine::SUM: return a + b;
    case Combine::MAX: return std::max(a, b);
    case Combine::MIN: return std::min(a, b);
  }
  return a;
}

// The norm of one local tensor, as a 0-dim double tensor on its device (no host synchronisation): its p-norm,
// count_nonzero (p = 0) or max/min |x|; empty tensors give the combination's identity.
at::Tensor local_norm(const at::Tensor& local, double p) {
  if (local.numel() == 0) return at::scalar_tensor(identity_of(combine_of(p)), local.options().dtype(at::kDouble));
  return at::linalg_vector_norm(local.detach(), p, /*dim=*/std::nullopt, /*keepdim=*/false, at::kDouble);
}

// A norm as a contribution to the total: sum |x|^p for p-norms, the norm itself otherwise.
double contribution(double norm, double p) {
  if (combine_of(p) != Combine::SUM || p == 0) return norm;
  return std::pow(norm, p);
}

// The norms on the host, with one synchronisation for all of them (on a GPU, one copy of one small tensor).
std::vector<double> to_host(const std::vector<at::Tensor>& norms) {
  if (norms.empty()) return {};
  const c10::Device device = norms.front().device();
  std::vector<at::Tensor> same;
  for (const auto& n : norms) same.push_back(n.to(device));
  at::Tensor host = at::stack(same).cpu().contiguous();
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
}

double finish(double combined, double p) {
  if (combine_of(p) != Combine::SUM || p == 0) return combined;
  return std::pow(combined, 1.0 / p);
}

// The whole mesh through this rank as one process group (the mesh's own group when it is 1-D).
ProcessGroup& whole_mesh_group(const DeviceMesh& mesh) {
  if (mesh.ndim() == 1) return mesh.get_group(0);
  return mesh.flatten().get_group(0);
}

struct MeshContributions {
  const DeviceMesh* mesh;
  std::vector<double> values;  // one per DTensor gradient on this mesh, already divided by its R
};

}  // namespace

double get_total_norm(const std::vector<at::Tensor>& tensors, double norm_type, bool error_if_nonfinite) {
  const double p = norm_type;
  const Combine c = combine_of(p);
  // First every local norm (kept on its device), then one transfer, then the reductions over meshes.
  std::vector<at::Tensor> norms;
  struct Slot {
    const void* mesh = nullptr;  // nullptr: a plain tensor
    double replicas = 1.0;       // R: ranks holding each distinct shard (sums divide by it)
  };
  std::vector<Slot> slots;
  std::map<const void*, MeshContributions> by_mesh;  // by mesh identity
  std::vector<const void*> mesh_order;                // first-seen: the same reduction order on every rank
  for (const at::Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (!is_dtensor(t)) {
      norms.push_back(local_norm(t, p));
      slots.push_back({});
      continue;
    }
    at::Tensor g = t;
    const DeviceMesh& mesh = device_mesh(g);
    Placements placements = dtensor::placements(g);
    bool partial = false;
    for (auto& pl : placements) {
      if (pl.is_partial()) {
        pl = Replicate();
        partial = true;
      }
    }
    if (partial) g = redistribute(g.detach(), mesh, placements);  // Partial -> Replicate: all-reduce
    double replicas = 1.0;
    for (int64_t d = 0; d < mesh.ndim(); ++d) {
      if (!placements[d].is_shard()) replicas *= static_cast<double>(mesh.size(d));
    }
    norms.push_back(local_norm(detail::local_tensor(g), p));
    slots.push_back({mesh.id(), replicas});
    auto [it, inserted] = by_mesh.try_emplace(mesh.id(), MeshContributions{&device_mesh(t), {}});
    if (inserted) mesh_order.push_back(mesh.id());
  }
  double plain = identity_of(c);
  const std::vector<double> host = to_host(norms);
  for (size_t i = 0; i < host.size(); ++i) {
    double v = contribution(host[i], p);
    if (slots[i].mesh == nullptr) {
      plain = combine(c, plain, v);
      continue;
    }
    if (c == Combine::SUM) v /= slots[i].replicas;
    by_mesh.at(slots[i].mesh).values.push_back(v);
  }
  double total = plain;
  for (const void* key : mesh_order) {
    MeshContributions& mc = by_mesh.at(key);
    // One all-reduce for every DTensor gradient on this mesh: their contributions side by side.
    at::Tensor local = at::tensor(mc.values, at::kDouble);
    ReduceOp op = c == Combine::SUM ? ReduceOp::SUM : c == Combine::MAX ? ReduceOp::MAX : ReduceOp::MIN;
    at::Tensor reduced = all_reduce(local, op, whole_mesh_group(*mc.mesh));
    auto values = reduced.contiguous();
    for (int64_t i = 0; i < values.numel(); ++i) total = combine(c, total, values.data_ptr<double>()[i]);
  }
  total = finish(total, p);
  if (error_if_nonfinite && !std::isfinite(total)) {
    std::ostringstream os;
    os << "dtensor: clip_grad_norm_: the total norm of order " << norm_type
       << " for gradients from `parameters` is non-finite (" << total
       << "), so it cannot be clipped. To disable this error and scale the gradients by the non-finite norm "
          "anyway, set error_if_nonfinite = false";
    throw dtensor::Error(os.str());
  }
  return total;
}

double clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : parameters) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return 0.0;
  double total = get_total_norm(grads, norm_type, error_if_nonfinite);
  // As torch: scale by the clamped coefficient (a no-op at 1); local on every gradient, whatever its
  // placement (x * c commutes with every placement, Partial(sum) included).
  double coef = max_norm / (total + 1e-6);
  if (coef > 1.0) coef = 1.0;  // not std::min: a nan norm scales by nan, as torch's clamp does
  c10::AutoGradMode no_grad(false);
  for (at::Tensor& g : grads) g.mul_(coef);
  return total;
}

double clip_grad_norm_(const at::Tensor& parameter, double max_norm, double norm_type, bool error_if_nonfinite) {
  return clip_grad_norm_(std::vector<at::Tensor>{parameter}, max_norm, norm_type, error_if_nonfinite);
}

}  // namespace dtensor
