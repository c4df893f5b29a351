// Linear weights packed at load for the batched GEMM (include/dtensor/quant/weight_prepack.h): which layers can run
// packed, the packing of each rank's shard, and the forward on local shards.
#include "dtensor/quant/weight_prepack.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"
#include "dtensor/core/packed_linear.h"
#include "dtensor/nn/layers.h"
#include "dtensor/nn/parameter_replacement.h"
#include "dtensor/tensor/dtensor.h"
#include "dtensor/tensor/shard_layout.h"
#include "nn/forward_override.h"
#include "quant/converted_linears.h"

namespace dtensor::quant {
namespace {

at::Tensor local_of(const at::Tensor& t) { return is_dtensor(t) ? to_local(t) : t; }

// The storage a weight's local shard lies in (null: none).
const void* storage_of(const at::Tensor& t) {
  const at::Tensor local = local_of(t);
  return local.defined() && local.has_storage() ? local.storage().data() : nullptr;
}

// How many parameters of `model` hold each storage (2 for a tied lm_head and its embedding).
std::map<const void*, int> storage_counts(torch::nn::Module& model) {
  std::map<const void*, int> counts;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) {
    if (const void* storage = storage_of(p.value())) ++counts[storage];
  }
  return counts;
}

// w's local shard packed, as a DTensor placed as w where w is one (each rank packs its own shard); no gradient.
at::Tensor packed_like(const at::Tensor& w) {
  const at::Tensor packed = bf16_pack_weight(local_of(w).detach());
  const at::Tensor weight = is_dtensor(w) ? DTensor::from_local(packed, device_mesh(w), placements(w),
                                                                /*run_check=*/false, w.sizes().vec())
                                          : packed;
  return weight.requires_grad_(false);
}

// Whether the weight's layout is one the packed forwards compute in: on each mesh dim Replicate or a plain Shard of
// dim 0 or 1.
bool packable_layout(const at::Tensor& w) {
  if (!is_dtensor(w)) return true;
  for (const Placement& p : placements(w)) {
    if (!(p.is_replicate() || (p.is_shard() && !p.is_strided_shard() && (p.dim() == 0 || p.dim() == 1)))) return false;
  }
  return true;
}

// A layer another pass computes (int8 / int4, float8, async TP: each registered a forward override) or with an
// adapter stays as it is, as does a weight that is not bf16 or not laid out as a style lays it; a weight another
// parameter shares too (`shared_ok` false), unless the tied pair is packed together (pack_tied_pairs).
bool can_pack(nn::LinearImpl& linear, const std::map<const void*, int>& counts, bool shared_ok) {
  if (nn::detail::has_forward_override(linear) || !detail::other_parameter(linear).empty()) return false;
  const at::Tensor& w = linear.weight;
  if (!w.defined() || w.scalar_type() != at::kBFloat16 || w.dim() != 2 || !packable_layout(w)) return false;
  const at::Tensor local = local_of(w);
  const auto count = counts.find(storage_of(w));
  return local.device().is_cpu() && bf16_packable(local.size(0), local.size(1)) &&
         (shared_ok || count == counts.end() || count->second == 1);
}

// y = x . W^T on the local shards, the output's placements from x's and W's (converted_linears.h).
at::Tensor packed_forward(const at::Tensor& x, const at::Tensor& w) {
  if (!is_dtensor(x) && !is_dtensor(w)) return bf16_packed_linear(x, w);
  DTENSOR_CHECK(is_dtensor(x) && is_dtensor(w), "dtensor: prepacked linear: the input and the packed weight must "
                "both be DTensors or both plain tensors");
  const Placements py = detail::output_placements(x, w, detail::Scheme::bf16_prepacked);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = w.size(0);
  return DTensor::from_local(bf16_packed_linear(to_local(x), to_local(w)), device_mesh(w), py, /*run_check=*/false,
                             shape);
}

// The embedding lookup on the packed weight it shares with lm_head. Per mesh dim:
//   W Shard(0) (vocab), ids Replicate -> Partial: each rank looks up the ids in its rows [off, off + n) and writes
//                                        zeros for the others; the style's one reduction sums one nonzero part per
//                                        id (the masked lookup's MaskPartial, as a sum)
//   W Replicate, ids p                -> p, p Replicate or a Shard of an id dim
// Any other pair (or plain ids against a DTensor weight) runs the embedding op on the weight unpacked: the DTensor
// rule, as before packing.
at::Tensor packed_embedding(const at::Tensor& ids, const at::Tensor& w) {
  if (!is_dtensor(w) && !is_dtensor(ids)) return bf16_packed_rows(w, ids);
  bool fast = is_dtensor(ids) && is_dtensor(w);
  Placements out;
  if (fast) {
    const Placements& pw = placements(w);
    const Placements& pi = placements(ids);
    for (size_t d = 0; d < pw.size() && fast; ++d) {
      if (pw[d].is_shard(0) && !pw[d].is_strided_shard() && pi[d].is_replicate()) {
        out.push_back(Partial());
      } else if (pw[d].is_replicate() && (pi[d].is_replicate() || (pi[d].is_shard() && !pi[d].is_strided_shard()))) {
        out.push_back(pi[d]);
      } else {
        fast = false;
      }
    }
  }
  if (!fast) {
    const at::Tensor unpacked = bf16_unpack_weight(local_of(w));
    return at::embedding(is_dtensor(w) ? DTensor::from_local(unpacked, device_mesh(w), placements(w),
                                                             /*run_check=*/false, w.sizes().vec())
                                       : unpacked,
                         ids);
  }
  const LocalShard s = local_shard(dtensor_spec(w));
  DTENSOR_CHECK(s.box, "dtensor: prepacked embedding: the weight's shard is not one block of rows");
  const at::Tensor local_ids = to_local(ids), local = to_local(w);
  const int64_t lo = s.offset[0], n = s.shape[0];
  const at::Tensor outside = local_ids.lt(lo).logical_or(local_ids.ge(lo + n));
  at::Tensor y = bf16_packed_rows(local, (local_ids - lo).masked_fill(outside, 0));
  if (lo > 0 || n < w.size(0)) y.masked_fill_(outside.unsqueeze(-1), 0);
  std::vector<int64_t> shape = ids.sizes().vec();
  shape.push_back(w.size(1));
  return DTensor::from_local(y, device_mesh(w), out, /*run_check=*/false, shape);
}

// The Linear's weight replaced by `weight` (packed) and its forward by the packed one.
void pack_linear(nn::LinearImpl& linear, const at::Tensor& weight) {
  nn::replace_parameter(linear, "weight", weight);
  nn::detail::register_forward_override(linear, [](torch::nn::Module& m, const nn::Args& args,
                                                   const nn::KwArgs&) -> std::optional<c10::IValue> {
    auto& l = static_cast<nn::LinearImpl&>(m);
    at::Tensor y = packed_forward(args.at(0).toTensor(), l.weight);
    if (l.bias.defined()) y = y + l.bias;
    return c10::IValue(y);
  });
  detail::mark_converted(linear, detail::Scheme::bf16_prepacked);
}

// The tied pairs: an Embedding and a Linear that hold one bf16 weight and nothing else does (Llama 3.2's lm_head),
// the Linear packable but for the tie and accepted by `filter`. Packed once, both read the packed tensor: the lookup
// gathers its rows (bf16_packed_rows), the head multiplies by it. Returns the Linears' names.
std::vector<std::string> pack_tied_pairs(torch::nn::Module& model, const ModuleFilter& filter,
                                         const std::map<const void*, int>& counts) {
  struct Holders {
    std::vector<std::pair<std::string, nn::LinearImpl*>> linears;
    std::vector<nn::EmbeddingImpl*> embeddings;
  };
  std::map<const void*, Holders> by_storage;
  for (const auto& item : model.named_modules("", /*include_self=*/true)) {
    torch::nn::Module* m = item.value().get();
    if (auto* linear = dynamic_cast<nn::LinearImpl*>(m); linear && linear->weight.defined()) {
      if (const void* st = storage_of(linear->weight)) by_storage[st].linears.emplace_back(item.key(), linear);
    } else if (auto* emb = dynamic_cast<nn::EmbeddingImpl*>(m); emb && emb->weight.defined()) {
      if (const void* st = storage_of(emb->weight)) by_storage[st].embeddings.push_back(emb);
    }
  }
  std::vector<std::string> names;
  for (auto& [storage, h] : by_storage) {
    if (counts.at(storage) != 2 || h.linears.size() != 1 || h.embeddings.size() != 1) continue;
    auto& [name, linear] = h.linears[0];
    nn::EmbeddingImpl& emb = *h.embeddings[0];
    const at::Tensor w = linear->weight;
    const bool same = emb.weight.sizes() == w.sizes() && local_of(emb.weight).data_ptr() == local_of(w).data_ptr() &&
                      local_of(emb.weight).strides() == local_of(w).strides() &&
                      (is_dtensor(w) ? is_dtensor(emb.weight) && placements(w) == placements(emb.weight)
                                     : !is_dtensor(emb.weight));
    if (!same || !can_pack(*linear, counts, /*shared_ok=*/true) || (filter && !filter(name, *linear)) ||
        nn::detail::has_forward_override(emb) || emb.options.max_norm().has_value()) {
      continue;
    }
    const at::Tensor weight = packed_like(w);
    pack_linear(*linear, weight);
    nn::replace_parameter(emb, "weight", weight);
    nn::detail::register_forward_override(emb, [](torch::nn::Module& m, const nn::Args& args,
                                                  const nn::KwArgs&) -> std::optional<c10::IValue> {
      return c10::IValue(packed_embedding(args.at(0).toTensor(), static_cast<nn::EmbeddingImpl&>(m).weight));
    });
    detail::mark_converted(emb, detail::Scheme::bf16_prepacked);
    names.push_back(name);
  }
  return names;
}

}  // namespace

bool is_prepacked(const torch::nn::Module& module) { return detail::is_converted(module, detail::Scheme::bf16_prepacked); }

std::vector<std::string> prepack_linear_weights_(torch::nn::Module& model, const ModuleFilter& filter,
                                                 bool only_where_fast) {
  std::vector<std::string> names;
  if (only_where_fast && !bf16_packed_linear_available()) return names;
  at::NoGradGuard no_grad;
  const std::map<const void*, int> counts = storage_counts(model);  // before packing: the weights as loaded
  const std::vector<std::string> tied = pack_tied_pairs(model, filter, counts);
  for (const auto& item : model.named_modules("", /*include_self=*/true)) {
    auto* linear = dynamic_cast<nn::LinearImpl*>(item.value().get());
    if (std::find(tied.begin(), tied.end(), item.key()) != tied.end()) {
      names.push_back(item.key());
      continue;
    }
    if (linear == nullptr || (filter && !filter(item.key(), *linear)) || !can_pack(*linear, counts, /*shared_ok=*/false)) {
      continue;
    }
    pack_linear(*linear, packed_like(linear->weight));
    names.push_back(item.key());
  }
  return names;
}

}  // namespace dtensor::quant
