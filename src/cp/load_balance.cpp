// The shards of context parallelism: which chunks of the sequence a rank holds (context_parallel.h).
#include <ATen/ATen.h>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"
#include "dtensor/cp/context_parallel.h"
#include "dtensor/mesh/functional_collectives.h"
#include "cp/layout.h"

namespace dtensor::cp {
namespace {

using internal::chunks_of;

int64_t chunk_length(int64_t seq_len, int64_t cp, bool load_balance) {
  const int64_t n = load_balance ? 2 * cp : cp;
  DTENSOR_CHECK(seq_len % n == 0, "dtensor: context parallel: sequence length ", seq_len, " is not divisible by ",
                load_balance ? "2 * cp = " : "cp = ", n, load_balance ? " (load balancing cuts it into 2 * cp chunks)" : "");
  return seq_len / n;
}

}  // namespace

std::string to_string(RotateMethod m) { return m == RotateMethod::alltoall ? "alltoall" : "allgather"; }

RotateMethod rotate_method_from_string(const std::string& name) {
  if (name == "allgather") return RotateMethod::allgather;
  if (name == "alltoall") return RotateMethod::alltoall;
  throw DTENSOR_ERROR("dtensor: context parallel rotate method '", name, "' is not allgather or alltoall");
}

at::Tensor context_parallel_shard(const at::Tensor& buffer, int64_t seq_dim, const DeviceMesh& cp_mesh, bool load_balance) {
  DTENSOR_CHECK(cp_mesh.ndim() == 1, "dtensor: context parallel needs a 1-D mesh, got ", cp_mesh.to_string());
  const int64_t d = seq_dim < 0 ? seq_dim + buffer.dim() : seq_dim;
  const int64_t cp = cp_mesh.size(), r = cp_mesh.get_local_rank(0);
  const int64_t m = chunk_length(buffer.size(d), cp, load_balance);
  std::vector<at::Tensor> parts;
  for (int64_t c : chunks_of(r, cp, load_balance)) parts.push_back(buffer.narrow(d, c * m, m));
  return parts.size() == 1 ? parts[0].contiguous() : at::cat(parts, d);
}

at::Tensor context_parallel_unshard(const at::Tensor& local, int64_t seq_dim, const DeviceMesh& cp_mesh, bool load_balance) {
  const int64_t d = seq_dim < 0 ? seq_dim + local.dim() : seq_dim;
  const int64_t cp = cp_mesh.size();
  const int64_t per_rank = load_balance ? 2 : 1;
  DTENSOR_CHECK(local.size(d) % per_rank == 0, "dtensor: context parallel: a load-balanced shard of odd length ",
                local.size(d));
  const at::Tensor all = all_gather(local.contiguous(), d, cp_mesh, 0);  // rank 0's chunks, then rank 1's, ...
  const int64_t m = local.size(d) / per_rank;
  std::vector<at::Tensor> ordered(static_cast<size_t>(cp * per_rank));
  for (int64_t r = 0; r < cp; ++r) {
    const auto chunks = chunks_of(r, cp, load_balance);
    for (size_t i = 0; i < chunks.size(); ++i) {
      ordered[static_cast<size_t>(chunks[i])] = all.narrow(d, (r * per_rank + static_cast<int64_t>(i)) * m, m);
    }
  }
  return at::cat(ordered, d);
}

at::Tensor context_parallel_positions(int64_t seq_len, const DeviceMesh& cp_mesh, bool load_balance) {
  return context_parallel_shard(at::arange(seq_len, at::TensorOptions(at::kLong).device(cp_mesh.device())), 0, cp_mesh,
                                load_balance);
}

ContextParallel::ContextParallel(const DeviceMesh& cp_mesh, RingAttentionOptions options)
    : guard_([cp_mesh, options](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                                bool is_causal, std::optional<double> scale, const nn::AttentionKwargs& kwargs) {
        DTENSOR_CHECK(!mask.defined(), "dtensor: context parallel: attention with a mask (padding) is not supported under "
                      "ring attention; only causal or full attention, within a sliding window or not");
        auto ring = [&](const std::vector<at::Tensor>& in) {
          return ring_attention(in[0], in[1], in[2], is_causal, scale, cp_mesh, options, kwargs);
        };
        // Under TP the heads are DTensors sharded over "tp": each rank's heads meet the same heads of its cp peers,
        // and the output keeps the queries' placements.
        if (is_dtensor(q)) return local_map(ring, {q, k, v}, {std::nullopt, std::nullopt, std::nullopt}, placements(q));
        return ring({q, k, v});
      }) {
  DTENSOR_CHECK(cp_mesh.ndim() == 1, "dtensor: context parallel needs a 1-D mesh, got ", cp_mesh.to_string());
}

}  // namespace dtensor::cp
