#include "dtensor/tp/parallelize.h"
#include "dtensor/core/error.h"

#include <fnmatch.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include <torch/nn/modules/activation.h>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/dp/gradient_sync.h"
#include "dtensor/nn/module_hooks.h"
#include "tp/style_support.h"

namespace dtensor {
namespace {

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> atoms;
  std::stringstream ss(path);
  std::string atom;
  while (std::getline(ss, atom, '.')) atoms.push_back(atom);
  return atoms;
}

bool path_matches(const std::string& pattern, const std::string& path) {
  auto p = split_path(pattern), q = split_path(path);
  if (p.size() != q.size()) return false;
  for (size_t i = 0; i < p.size(); ++i) {
    if (fnmatch(p[i].c_str(), q[i].c_str(), 0) != 0) return false;
  }
  return true;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_paths(torch::nn::Module& module, const std::string& key) {
  std::vector<std::pair<size_t, std::string>> scored;
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    scored.emplace_back(edit_distance(key, item.key()), item.key());
  }
  std::sort(scored.begin(), scored.end());
  std::string out;
  for (size_t i = 0; i < scored.size() && i < 3; ++i) out += (i ? ", '" : "'") + scored[i].second + "'";
  return out.empty() ? "(the module has no submodules)" : out;
}

// PyTorch's words for a mesh that is not 1-D.
void require_tp_mesh(const DeviceMesh& mesh) {
  DTENSOR_CHECK(mesh.ndim() == 1, "dtensor: Tensor Parallel only accepts a 1D DeviceMesh, but found ", mesh.ndim(),
                "D! If you have a 2-D or N-D device_mesh, consider passing in device_mesh[\"tp\"]");
}

// Stock layers run no hooks, so the whole forward must run on DTensors: once a parameter of one is a DTensor,
// every parameter still plain (an unplanned LayerNorm, embedding, ...) is replicated.
void replicate_rest_if_stock(torch::nn::Module& module, const DeviceMesh& mesh, std::optional<int> src) {
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    const torch::nn::Module& m = *item.value();
    if (!detail::is_stock_layer(m) && !dynamic_cast<const torch::nn::MultiheadAttentionImpl*>(&m)) continue;
    for (const auto& p : m.parameters(/*recurse=*/false)) {
      if (is_dtensor(p)) {
        distribute_module(module, mesh, nullptr, nullptr, nullptr, src);
        return;
      }
    }
  }
}

}  // namespace

std::vector<std::string> match_module_paths(torch::nn::Module& module, const std::string& pattern) {
  if (pattern.empty()) return {""};  // the module itself
  std::vector<std::string> out;
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    if (path_matches(pattern, item.key())) out.push_back(item.key());
  }
  return out;
}

void parallelize_module(torch::nn::Module& module, const DeviceMesh& mesh, const ParallelStyleRef& style,
                        std::optional<int> src_data_rank) {
  require_tp_mesh(mesh);
  DTENSOR_CHECK(style, "dtensor: parallelize_module got no style");
  style->apply(module, "", mesh, src_data_rank);
  replicate_rest_if_stock(module, mesh, src_data_rank);
  nn::link_enclosing_hooks(module);
  enable_gradient_sync(module);  // gradients reach their parameters' placements once per backward
}

void parallelize_module(torch::nn::Module& module, const DeviceMesh& mesh, const ParallelizePlan& plan,
                        std::optional<int> src_data_rank) {
  require_tp_mesh(mesh);
  // Resolve every key and validate every style before changing anything: a bad plan leaves the model
  // untouched.
  std::vector<std::vector<std::string>> matches;
  for (const auto& [key, style] : plan) {
    DTENSOR_CHECK(style, "dtensor: the plan's entry '", key, "' has no style");
    auto paths = match_module_paths(module, key);
    DTENSOR_CHECK(!paths.empty(), "dtensor: parallelize_module: the plan's key '", key,
                  "' matches no submodule; the closest module paths are ", closest_paths(module, key));
    matches.push_back(std::move(paths));
  }
  auto modules = module.named_modules("", /*include_self=*/true);
  for (size_t k = 0; k < plan.size(); ++k) {
    for (const auto& path : matches[k]) {
      plan[k].second->validate(*modules[path], path);
      plan[k].second->validate_mesh(path, mesh);
    }
  }
  for (size_t k = 0; k < plan.size(); ++k) {
    for (const auto& path : matches[k]) {
      nn::set_module_path(*modules[path], path);
      plan[k].second->apply(*modules[path], path, mesh, src_data_rank);
    }
  }
  replicate_rest_if_stock(module, mesh, src_data_rank);
  nn::link_enclosing_hooks(module);
  enable_gradient_sync(module);  // gradients reach their parameters' placements once per backward
}

void parallelize_module(torch::nn::Module& module, const DeviceMesh& mesh, const ParallelizePlan& plan,
                        TpMeshDim tp_mesh_dim, std::optional<int> src_data_rank) {
  parallelize_module(module, mesh.submesh(tp_mesh_dim.dim), plan, src_data_rank);
}

void parallelize_module(torch::nn::Module& module, const DeviceMesh& mesh, const ParallelStyleRef& style,
                        TpMeshDim tp_mesh_dim, std::optional<int> src_data_rank) {
  parallelize_module(module, mesh.submesh(tp_mesh_dim.dim), style, src_data_rank);
}

ParallelStylePtr style_from_string(const std::string& name) {
  auto shared = [](auto style) { return ParallelStyleRef(std::move(style)).ptr(); };
  if (name == "colwise") return shared(ColwiseParallel());
  if (name == "rowwise") return shared(RowwiseParallel());
  // (transformers' newer names for the same two: colwise_gather_output, rowwise_split_input)
  if (name == "colwise_rep" || name == "colwise_gather_output") return shared(ColwiseParallel({.output_layouts = Replicate()}));
  if (name == "rowwise_rep" || name == "rowwise_split_input") return shared(RowwiseParallel({.input_layouts = Replicate()}));
  if (name == "sequence_parallel") return shared(SequenceParallel());
  if (name == "replicate") return shared(ReplicateParallel());
  // The module's output is a partial sum on each rank (e.g. of local_rowwise experts): all-reduce it. A
  // DTensor output is made Replicate whatever its placement.
  if (name == "gather") return shared(PrepareModuleOutput({.output_layouts = Partial(), .desired_output_layouts = Replicate()}));
  if (name == "local_colwise") return shared(LocalColwiseParallel());
  if (name == "local_rowwise") return shared(LocalRowwiseParallel());
  if (name == "packed_colwise") return shared(LocalColwiseParallel({.packed_parts = {1, 1}}));
  if (name == "packed_rowwise") return shared(LocalRowwiseParallel({.packed_parts = {1, 1}, .output_layouts = Replicate()}));
  if (name == "moe_tp_experts") return shared(MoeTensorParallel());
  // transformers 4.x's MoE strings were written for Llama 4's transposed experts ([E, H, 2I]); transformers 5
  // dropped them. Applied to transformers 5's [E, 2I, H] experts they would mean something else: refused.
  DTENSOR_CHECK(name != "local" && name != "local_packed_rowwise", "dtensor: tensor-parallel style '", name,
                "' is transformers 4.x's (IsolatedParallel / PackedRowwiseParallel on Llama 4's transposed experts), "
                "which transformers 5 replaced: use 'moe_tp_experts' on the experts module (TP inside each expert, "
                "the gate_up_proj packed), or ExpertParallel (dtensor/tp/moe_styles.h) for expert parallelism");
  throw DTENSOR_ERROR("dtensor: unknown tensor-parallel style '", name,
                      "' (known: colwise, rowwise, colwise_rep, rowwise_rep, colwise_gather_output, rowwise_split_input, "
                      "sequence_parallel, replicate, "
                      "gather, local_colwise, local_rowwise, packed_colwise, packed_rowwise, moe_tp_experts)");
}

ParallelizePlan plan_from_strings(const std::vector<std::pair<std::string, std::string>>& plan) {
  ParallelizePlan out;
  for (const auto& [key, name] : plan) out.emplace_back(key, style_from_string(name));
  return out;
}

}  // namespace dtensor
