#include "dtensor/tp/pairwise.h"
#include "dtensor/core/error.h"

#include <c10/util/Exception.h>
#include <torch/nn/modules/activation.h>

#include "dtensor/tp/distribute_module.h"
#include "tp/distribute_params.h"
#include "tp/style_support.h"

namespace dtensor {
namespace {

using detail::is_linear;

std::string join(const std::string& path, const std::string& name) { return path.empty() ? name : path + "." + name; }
std::string shown(const std::string& path) { return path.empty() ? "(the root module)" : "'" + path + "'"; }

// Heads per rank: every MultiheadAttention under `m` must split its heads evenly. Checked before anything
// changes.
void check_heads(torch::nn::Module& m, const std::string& path, int64_t n) {
  for (const auto& item : m.named_modules("", /*include_self=*/true)) {
    auto* mha = dynamic_cast<torch::nn::MultiheadAttentionImpl*>(item.value().get());
    if (!mha) continue;
    const int64_t heads = mha->options.num_heads();
    DTENSOR_CHECK(heads % n == 0, "dtensor: PairwiseParallel on ", shown(join(path, item.key())), ": ", heads,
                  " attention heads do not split over ", n, " ranks (num_heads must be a multiple of the TP size)");
  }
}

void parallelize_mha(torch::nn::MultiheadAttentionImpl& mha, const std::string& path, const DeviceMesh& mesh,
                     std::optional<int> src) {
  // [Q; K; V] rows, heads contiguous in each: _StridedShard(0, 3) = the same slice of heads from each part.
  detail::distribute_params(mha, mesh,
                            {{"in_proj_weight", {_StridedShard(0, 3)}},
                             {"in_proj_bias", {_StridedShard(0, 3)}},
                             {"q_proj_weight", {Shard(0)}},
                             {"k_proj_weight", {Shard(0)}},
                             {"v_proj_weight", {Shard(0)}},
                             {"bias_k", {Shard(2)}},
                             {"bias_v", {Shard(2)}}},
                            src);
  RowwiseParallel().apply(*mha.out_proj, join(path, "out_proj"), mesh, src);
}

// Returns how many blocks (MLP pairs, attentions) it parallelized under `m`.
int pairwise(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh, std::optional<int> src) {
  if (auto* mha = dynamic_cast<torch::nn::MultiheadAttentionImpl*>(&m)) {
    parallelize_mha(*mha, path, mesh, src);
    return 1;
  }
  int found = 0;
  std::vector<std::pair<std::string, torch::nn::Module*>> linears;
  for (const auto& child : m.named_children()) {
    if (is_linear(*child.value())) linears.emplace_back(join(path, child.key()), child.value().get());
  }
  if (linears.size() >= 2) {
    const size_t paired = linears.size() / 2 * 2;
    if (paired < linears.size()) {
      TORCH_WARN("dtensor: PairwiseParallel on ", shown(path), ": ", linears.size(), " Linear layers, an odd number: the last, '",
                 linears.back().first, "', stays replicated (TP has no effect on it)");
    }
    for (size_t k = 0; k < paired; ++k) {
      if (k % 2 == 0) ColwiseParallel().apply(*linears[k].second, linears[k].first, mesh, src);
      else RowwiseParallel().apply(*linears[k].second, linears[k].first, mesh, src);
    }
    found += static_cast<int>(paired / 2);
  }
  for (const auto& child : m.named_children()) {
    if (!is_linear(*child.value())) found += pairwise(*child.value(), join(path, child.key()), mesh, src);
  }
  return found;
}

}  // namespace

void PairwiseParallel::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                             std::optional<int> src) const {
  detail::require_1d(mesh, name());
  check_heads(m, path, mesh.size(0));
  const int found = pairwise(m, path, mesh, src);
  DTENSOR_CHECK(found > 0, "dtensor: PairwiseParallel on ", shown(path), ": ", m.name(),
                " has no MultiheadAttention and no module with two or more Linear children to pair");
  // What is left (norms, embeddings, an odd Linear) is replicated, without hooks.
  distribute_module(m, mesh, nullptr, nullptr, nullptr, src);
}

}  // namespace dtensor
