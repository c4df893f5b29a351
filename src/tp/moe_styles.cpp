#include "dtensor/tp/moe_styles.h"
#include "dtensor/core/error.h"

#include <ATen/ATen.h>

#include <numeric>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/chunking.h"
#include "dtensor/core/moe_combine.h"
#include "dtensor/mesh/autograd_collectives.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/nn/module_hooks.h"
#include "dtensor/tp/parallelize.h"
#include "dtensor/dp/gradient_sync.h"
#include "dtensor/nn/parameter_members.h"
#include "dtensor/nn/parameter_replacement.h"
#include "dtensor/tp/distribute_module.h"
#include "tp/distribute_params.h"
#include "tp/style_support.h"

namespace dtensor {
namespace {

// Megatron's f: the same tensor forward; in backward each rank's partial gradient is all-reduced. A Replicate
// DTensor made local with a Partial gradient placement: its backward reduces Partial -> Replicate.
at::Tensor identity_forward_all_reduce_backward(const at::Tensor& x, const DeviceMesh& mesh) {
  if (!x.defined() || !x.is_floating_point()) return x;
  return to_local(DTensor::from_local(x, mesh, {Replicate()}), Placements{Partial()});
}

void validate_experts(const torch::nn::Module& m, const std::string& path, const std::string& name) {
  const auto params = m.named_parameters(/*recurse=*/false);
  DTENSOR_CHECK(params.contains("gate_up_proj") && params.contains("down_proj") &&
                    params["gate_up_proj"].dim() == 3 && params["down_proj"].dim() == 3,
                detail::not_applicable(name, "a mixture of experts' module with 3-D gate_up_proj and down_proj", path, m));
  DTENSOR_CHECK(dynamic_cast<const nn::ParameterMembers*>(&m) != nullptr, "dtensor: ", name, " on '", path, "': ",
                m.name(), " does not name its parameter members (dtensor::nn::ParameterMembers), so its forward "
                "could not read the local shards");
}

// The forward reads the experts' local shards (to_local: their gradients come back with the DTensors'
// placements); after it, the DTensors again.
void forward_on_local_shards(torch::nn::Module& module, bool local) {
  for (const char* p : {"gate_up_proj", "down_proj"}) {
    const at::Tensor param = module.named_parameters(false)[p];
    nn::set_forward_parameter(module, p, local ? to_local(param) : param);
  }
}

}  // namespace

void MoeTensorParallel::validate(const torch::nn::Module& m, const std::string& path) const {
  validate_experts(m, path, name());
}

void MoeTensorParallel::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                              std::optional<int> src) const {
  detail::require_1d(mesh, name());
  validate(m, path);
  detail::distribute_params(m, mesh, {{"gate_up_proj", {_StridedShard(1, 2)}}, {"down_proj", {Shard(2)}}}, src);
  auto* group = &mesh.get_group(0);
  register_module_io(
      m, mesh,
      [](torch::nn::Module& module, nn::Args args, nn::KwArgs kwargs, const DeviceMesh& mesh) {
        forward_on_local_shards(module, true);
        if (!args.empty() && args[0].isTensor()) args[0] = identity_forward_all_reduce_backward(args[0].toTensor(), mesh);
        if (args.size() > 2 && args[2].isTensor()) args[2] = identity_forward_all_reduce_backward(args[2].toTensor(), mesh);
        return std::make_pair(std::move(args), std::move(kwargs));
      },
      [group](torch::nn::Module& module, c10::IValue out, const DeviceMesh&) -> c10::IValue {
        forward_on_local_shards(module, false);
        return all_reduce_autograd(out.toTensor(), ReduceOp::SUM, *group);  // the partial sums over features
      });
}

namespace {

// One forward's routing under expert parallelism, kept from the dispatch for the combine.
struct Routing {
  at::Tensor order;                    // this rank's (token, slot) pairs p = token * k + slot, sorted by expert
                                       // (replicated_tokens: the [N, 2] (token, slot) pairs of its experts)
  std::vector<int64_t> send, recv;     // rows to / from each ep rank
  at::Tensor weights;                  // [T, k], applied at home
  at::Tensor idx;                      // [T, k] expert ids: the order a token's shares are added in
  int64_t tokens = 0, k = 0;
  at::ScalarType dtype = at::kFloat;   // the output's (x's)
};

// The routing's start, for either path: the tokens, slots and weights, and the output's dtype.
void begin_routing(Routing& r, const at::Tensor& x, const at::Tensor& idx, const at::Tensor& w) {
  r.tokens = x.size(0);
  r.k = idx.size(1);
  r.dtype = x.scalar_type();
  r.weights = w;
  r.idx = idx;
}

// The experts of an ExpertParallel module, which must divide over the mesh's "ep" dim (experts are whole).
int64_t experts_over(const torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh) {
  const int64_t num_experts = m.named_parameters(false)["gate_up_proj"].size(0), ep = mesh.size(0);
  DTENSOR_CHECK(num_experts % ep == 0, "dtensor: ExpertParallel on '", path, "': ", num_experts,
                " experts do not divide over ", ep, " expert-parallel ranks (experts are not split)");
  return num_experts;
}

// Rows per expert of the flattened expert ids: their bincount; a meta tensor has no values, so balanced
// (torch.chunk of the rows over the experts), the dry run's assumption.
std::vector<int64_t> rows_per_expert(const at::Tensor& flat, int64_t num_experts) {
  if (flat.is_meta()) return chunk_sizes(flat.numel(), num_experts);
  const at::Tensor counts = at::bincount(flat, {}, num_experts).cpu();
  return std::vector<int64_t>(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + num_experts);
}

// Sums of consecutive groups of `per` entries.
std::vector<int64_t> group_sums(const std::vector<int64_t>& v, int64_t per) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < v.size(); i += per) out.push_back(std::accumulate(v.begin() + i, v.begin() + i + per, int64_t{0}));
  return out;
}

// The dispatch (see moe_styles.h): returns the module's arguments on the receiving rank: the rows of its
// experts, their local expert ids [N, 1] and weights 1 [N, 1].
std::vector<at::Tensor> dispatch(const at::Tensor& x, const at::Tensor& idx, const at::Tensor& w, int64_t num_experts,
                                 ProcessGroup& group, Routing& r) {
  const int64_t ep = group.size(), local = num_experts / ep, me = group.rank();
  begin_routing(r, x, idx, w);
  const at::Tensor flat = idx.reshape(-1);
  r.order = at::argsort(flat, /*stable=*/true);  // by expert, so by owning rank, then by its local expert
  const std::vector<int64_t> counts = rows_per_expert(flat, num_experts);
  // The counts exchange: rank j gets this rank's counts of j's experts.
  const at::Tensor counts_out = x.is_meta() ? at::empty({num_experts}, x.options().dtype(at::kLong))
                                            : at::tensor(counts, at::kLong).to(x.device());
  const at::Tensor counts_in_t = all_to_all_single(counts_out, std::vector<int64_t>(ep, local),
                                                   std::vector<int64_t>(ep, local), group);
  std::vector<int64_t> counts_in;  // [ep * local]: from each source rank, its rows for each of my experts
  if (x.is_meta()) {  // every rank routes as this one (balanced): each sends me my experts' share
    for (int64_t s = 0; s < ep; ++s) counts_in.insert(counts_in.end(), counts.begin() + me * local, counts.begin() + (me + 1) * local);
  } else {
    const at::Tensor c = counts_in_t.cpu();
    counts_in.assign(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + num_experts);
  }
  r.send = group_sums(counts, local);
  r.recv = group_sums(counts_in, local);
  const at::Tensor rows = x.index_select(0, at::div(r.order, r.k, "floor"));
  at::Tensor received = all_to_all_single_autograd(rows, r.recv, r.send, group);
  // Local expert ids of the received rows: grouped by source, then by local expert.
  const int64_t n = received.size(0);
  at::Tensor ids;
  if (x.is_meta()) {
    ids = at::empty({n, 1}, idx.options());
  } else {
    std::vector<int64_t> id_rows;
    id_rows.reserve(n);
    for (int64_t s = 0; s < ep; ++s) {
      for (int64_t e = 0; e < local; ++e) id_rows.insert(id_rows.end(), counts_in[s * local + e], e);
    }
    ids = at::tensor(id_rows, at::kLong).view({n, 1}).to(idx.device());
  }
  return {received, ids, at::ones({n, 1}, w.options())};
}

// The combine: expert outputs [N, H] home, weighted, summed over the k slots -> [T, H] in x's dtype.
at::Tensor combine(const at::Tensor& y, ProcessGroup& group, const Routing& r) {
  const at::Tensor back = all_to_all_single_autograd(y.contiguous(), r.send, r.recv, group);  // in r.order
  const at::Tensor pairs = at::empty_like(back).index_copy_(0, r.order, back);
  return sum_expert_shares(pairs.view({r.tokens, r.k, back.size(-1)}) * r.weights.unsqueeze(-1), r.idx, r.dtype);
}

// replicated_tokens: every ep rank holds all T tokens, so nothing is dispatched. Each rank takes the (token,
// slot) pairs routed to its own experts; their outputs, weighted and summed over the slots at their places of
// [T, k, H] (the other ranks' slots 0), are this rank's partial sum of the block's output, and one all-reduce
// completes it (Megatron's f on x and w before: their gradients are partial per rank too).
std::vector<at::Tensor> local_pairs(const at::Tensor& x, const at::Tensor& idx, const at::Tensor& w, int64_t num_experts,
                                    int64_t ep, int64_t me, Routing& r) {
  const int64_t local = num_experts / ep;
  begin_routing(r, x, idx, w);
  const at::Tensor pairs = at::nonzero(at::div(idx, local, "floor") == me);  // [N, 2]: (token, slot)
  r.order = pairs;
  const at::Tensor token = pairs.select(1, 0), slot = pairs.select(1, 1);
  const at::Tensor ids = (idx.index({token, slot}) - me * local).unsqueeze(1);
  return {x.index_select(0, token), ids, at::ones({pairs.size(0), 1}, w.options())};
}

// The partial output of local_pairs' rows y [N, H]: [T, H] in x's dtype (the other ranks' shares 0).
at::Tensor partial_output(const at::Tensor& y, const Routing& r) {
  at::Tensor placed = at::zeros({r.tokens, r.k, y.size(-1)}, y.options());
  placed = placed.index_put({r.order.select(1, 0), r.order.select(1, 1)}, y);
  return sum_expert_shares(placed * r.weights.unsqueeze(-1), r.idx, r.dtype);
}

}  // namespace

void ExpertParallel::validate(const torch::nn::Module& m, const std::string& path) const {
  validate_experts(m, path, name());
}

void ExpertParallel::validate_mesh(const std::string& path, const DeviceMesh& mesh) const {
  DTENSOR_CHECK(mesh.ndim() == 1 || mesh.ndim() == 2, "dtensor: ", name(), " on '", path,
                "' takes a 1-D (\"ep\") or 2-D (\"ep\", \"tp\") mesh, got ", mesh.to_string());
}

void ExpertParallel::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                           std::optional<int> src) const {
  validate(m, path);
  validate_mesh(path, mesh);
  const int64_t num_experts = experts_over(m, path, mesh);
  const bool tp = mesh.ndim() == 2;
  Placements gate_up = {Shard(0)}, down = {Shard(0)};
  if (tp) {
    gate_up.push_back(_StridedShard(1, 2));  // as MoeTensorParallel, inside each expert
    down.push_back(Shard(2));
  }
  detail::distribute_params(m, mesh, {{"gate_up_proj", gate_up}, {"down_proj", down}}, src);
  auto routing = std::make_shared<Routing>();
  ProcessGroup* ep_group = &mesh.get_group(0);
  const DeviceMesh ep_mesh = mesh.submesh(0);
  const DeviceMesh tp_mesh = mesh.submesh(tp ? 1 : 0);  // used only when tp
  const bool replicated = replicated_tokens;
  std::vector<DeviceMesh> replicated_over = {ep_mesh};  // replicated_tokens: the dims whose partial sums meet
  if (tp) replicated_over.push_back(tp_mesh);
  register_module_io(
      m, mesh,
      [=](torch::nn::Module& module, nn::Args args, nn::KwArgs kwargs, const DeviceMesh&) {
        DTENSOR_CHECK(args.size() == 3 && args[0].isTensor() && args[1].isTensor() && args[2].isTensor(),
                      "dtensor: ExpertParallel on '", path, "': the forward takes (x, expert ids, weights)");
        at::Tensor x = args[0].toTensor(), idx = args[1].toTensor(), w = args[2].toTensor();
        std::vector<at::Tensor> local;
        if (replicated) {
          for (const auto& m : replicated_over) {
            x = identity_forward_all_reduce_backward(x, m);
            w = identity_forward_all_reduce_backward(w, m);
          }
          local = local_pairs(x, idx, w, num_experts, ep_group->size(), ep_group->rank(), *routing);
        } else {
          local = dispatch(x, idx, w, num_experts, *ep_group, *routing);
          if (tp) local[0] = identity_forward_all_reduce_backward(local[0], tp_mesh);  // Megatron's f
        }
        forward_on_local_shards(module, true);
        return std::make_pair(nn::Args(local.begin(), local.end()), std::move(kwargs));
      },
      [=](torch::nn::Module& module, c10::IValue out, const DeviceMesh&) -> c10::IValue {
        forward_on_local_shards(module, false);
        at::Tensor y = out.toTensor();
        if (replicated) {  // g: the partial sums over experts (and features) completed
          at::Tensor home = partial_output(y, *routing);
          for (const auto& m : replicated_over) home = all_reduce_autograd(home, ReduceOp::SUM, m.get_group(0));
          return home.to(routing->dtype);
        }
        if (tp) y = all_reduce_autograd(y, ReduceOp::SUM, tp_mesh.get_group(0));  // g: features summed
        return combine(y, *ep_group, *routing);
      });
}

void parallelize_experts(torch::nn::Module& root, const DeviceMesh& mesh, const std::vector<std::string>& keys,
                         ExpertParallelOptions options) {
  const ExpertParallel style(options);
  auto modules = root.named_modules("", /*include_self=*/true);
  std::vector<std::string> paths;
  for (const std::string& key : keys) {
    const auto matched = match_module_paths(root, key);
    DTENSOR_CHECK(!matched.empty(), "dtensor: parallelize_experts: the key '", key, "' matches no submodule");
    for (const auto& path : matched) {
      style.validate(*modules[path], path);
      style.validate_mesh(path, mesh);
      experts_over(*modules[path], path, mesh);
      paths.push_back(path);
    }
  }
  for (const auto& path : paths) {
    nn::set_module_path(*modules[path], path);
    style.apply(*modules[path], path, mesh, 0);
  }
  nn::link_enclosing_hooks(root);
  enable_gradient_sync(root);
}

}  // namespace dtensor
