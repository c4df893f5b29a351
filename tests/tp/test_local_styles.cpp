// HF transformers' local_* and packed_* string styles, keyword inputs, user-defined styles and the error of
// every bad plan. Values are checked against the single-device module.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>

#include "dtensor/debug/comm_debug_mode.h"
#include "dtensor/tp/parallelize.h"
#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"
#include "harness/small_models.h"

using namespace dtensor;
using dtensor::testing::error_of;
using dtensor::testing::run_ranks;
using dtensor::testing::seeded_randn;

namespace {

// A fused gate/up projection: gate_up(8 -> 2 x 12) packed, then down(12 -> 8), both with bias.
struct PackedMlpImpl : torch::nn::Module {
  PackedMlpImpl() {
    gate_up = register_module("gate_up", nn::Linear(8, 24));
    down = register_module("down", nn::Linear(12, 8));
  }
  at::Tensor forward(const at::Tensor& x) {
    auto gu = gate_up(x).chunk(2, -1);
    return down(at::silu(gu[0]) * gu[1]);
  }
  nn::Linear gate_up{nullptr}, down{nullptr};
};
TORCH_MODULE(PackedMlp);

// up(8 -> 24), ReLU, down(24 -> 8): under packed_colwise / packed_rowwise the hidden dim is packed on both.
struct TwoLayerImpl : torch::nn::Module {
  TwoLayerImpl() {
    up = register_module("up", nn::Linear(8, 24));
    down = register_module("down", nn::Linear(24, 8));
  }
  at::Tensor forward(const at::Tensor& x) { return down(at::relu(up(x))); }
  nn::Linear up{nullptr}, down{nullptr};
};
TORCH_MODULE(TwoLayer);

// The FeedForward of small_models.h under a root module, so a plan can "gather" the feed-forward's output.
struct ExpertImpl : torch::nn::Module {
  ExpertImpl() { ffn = register_module("ffn", dtensor::testing::FeedForward()); }
  at::Tensor forward(const at::Tensor& x) { return ffn(x); }
  dtensor::testing::FeedForward ffn{nullptr};
};
TORCH_MODULE(Expert);

// Rank r's (packed) slice of `full` along `dim`, computed independently of the library: the dim is cut
// into parts in the proportions `parts`, each part is torch.chunk'ed, and rank r's chunks are concatenated.
at::Tensor slice_of(const at::Tensor& full, int64_t dim, const std::vector<int64_t>& parts, int world, int rank) {
  int64_t total = 0;
  for (int64_t p : parts) total += p;
  std::vector<int64_t> sizes;
  for (int64_t p : parts) sizes.push_back(full.size(dim) / total * p);
  std::vector<at::Tensor> pieces;
  for (const auto& part : full.split_with_sizes(sizes, dim)) pieces.push_back(part.chunk(world, dim)[rank]);
  return at::cat(pieces, dim);
}

// Runs `Model` single-device and under `plan` (string styles) on every rank with a replicated input; the
// output must be the single-device output on every rank, and every local parameter's gradient the slice
// `param_slices` names of the single-device gradient ({dim, parts}; absent: the whole gradient).
template <typename Model>
void check_local_plan(const std::vector<std::pair<std::string, std::string>>& plan,
                      const std::map<std::string, std::pair<int64_t, std::vector<int64_t>>>& param_slices, int world) {
  std::mutex m;
  run_ranks(world, [&](int rank, int) {
    Model ref{nullptr}, par{nullptr};
    {
      std::lock_guard<std::mutex> lock(m);
      torch::manual_seed(11);
      ref = Model();
      torch::manual_seed(11);
      par = Model();
    }
    at::Tensor x = seeded_randn(5, {2, 4, 8});
    at::Tensor w = seeded_randn(6, {2, 4, 8});
    (ref(x) * w).sum().backward();

    auto mesh = init_device_mesh("cpu", {world});
    parallelize_module(*par, mesh, plan_from_strings(plan));
    at::Tensor out = par(x);
    ASSERT_FALSE(is_dtensor(out));
    EXPECT_TRUE(at::allclose(out, ref(x), 1e-5, 1e-6)) << "rank " << rank;
    (out * w).sum().backward();
    auto ref_params = ref->named_parameters();
    for (const auto& p : par->named_parameters()) {
      at::Tensor expected = ref_params[p.key()].grad();
      if (is_dtensor(p.value())) {  // a DTensor style in the same plan
        EXPECT_TRUE(at::allclose(full_tensor(p.value().grad()), expected, 1e-5, 1e-6)) << p.key() << " rank " << rank;
        continue;
      }
      auto it = param_slices.find(p.key());
      if (it != param_slices.end()) expected = slice_of(expected, it->second.first, it->second.second, world, rank);
      ASSERT_TRUE(p.value().grad().defined()) << p.key();
      EXPECT_TRUE(at::allclose(p.value().grad(), expected, 1e-5, 1e-6)) << p.key() << " rank " << rank;
    }
  });
}

}  // namespace

TEST(LocalStyles, LocalColwiseRowwiseWithGatherEqualSingleDevice) {
  // HF's MoE expert pattern: w1/w3 local_colwise, w2 local_rowwise (partial sums), "gather" all-reduces.
  check_local_plan<Expert>({{"ffn.w1", "local_colwise"}, {"ffn.w3", "local_colwise"}, {"ffn.w2", "local_rowwise"},
                            {"ffn", "gather"}},
                           {{"ffn.w1.weight", {0, {1}}}, {"ffn.w3.weight", {0, {1}}}, {"ffn.w2.weight", {1, {1}}}}, 2);
}

TEST(LocalStyles, PackedColwiseBeforeChunkEqualsSingleDevice) {
  // gate_up's output is chunked into gate and up locally: each rank holds its columns of both.
  for (int world : {2, 4}) {
    check_local_plan<PackedMlp>({{"gate_up", "packed_colwise"}, {"down", "rowwise"}},
                                {{"gate_up.weight", {0, {1, 1}}}, {"gate_up.bias", {0, {1, 1}}}}, world);
  }
}

TEST(LocalStyles, PackedColwiseIntoPackedRowwiseEqualsSingleDevice) {
  // The hidden dim is packed on both layers; down's bias is added once, after the all-reduce.
  for (int world : {2, 4}) {
    check_local_plan<TwoLayer>({{"up", "packed_colwise"}, {"down", "packed_rowwise"}},
                               {{"up.weight", {0, {1, 1}}}, {"up.bias", {0, {1, 1}}}, {"down.weight", {1, {1, 1}}}}, world);
  }
}

TEST(LocalStyles, PackedPartsAreCutPerPart) {
  run_ranks(2, [](int rank, int) {
    // A GQA-style fused qkv: q has 4 parts' worth of rows, k and v one each (24 = 16 + 4 + 4).
    nn::Linear qkv(4, 24);
    {
      at::NoGradGuard no_grad;
      qkv->weight.copy_(seeded_randn(7, {24, 4}));
    }
    at::Tensor full = qkv->weight.detach().clone();
    auto mesh = init_device_mesh("cpu", {2});
    LocalColwiseParallel style;
    style.packed_parts = {4, 1, 1};
    parallelize_module(*qkv, mesh, make_style(style));
    // Rank r: q rows [8r, 8r + 8), k rows 16 + [2r, 2r + 2), v rows 20 + [2r, 2r + 2).
    at::Tensor expected = at::cat({full.narrow(0, 8 * rank, 8), full.narrow(0, 16 + 2 * rank, 2), full.narrow(0, 20 + 2 * rank, 2)});
    EXPECT_TRUE(at::equal(qkv->weight, expected));
  });
}

TEST(LocalStyles, KeywordInputsArePrepared) {
  run_ranks(2, [](int rank, int) {
    dtensor::testing::KwModel model;
    auto mesh = init_device_mesh("cpu", {2});
    PrepareModuleInput prep;
    prep.input_layouts = {Replicate(), std::nullopt};
    prep.desired_input_layouts = {Replicate(), std::nullopt};
    prep.input_kwarg_layouts = {{"scale", Shard(0)}};
    prep.desired_input_kwarg_layouts = {{"scale", Replicate()}};
    prep.use_local_output = true;
    parallelize_module(*model, mesh, make_style(prep));
    at::Tensor x = seeded_randn(1, {2, 4, 8}), scale = seeded_randn(2, {2, 4, 8});
    at::Tensor expected = model->lin(x) * scale;
    CommDebugMode comm;
    at::Tensor out = model->forward(x, at::Tensor(), scale.chunk(2, 0)[rank]);  // scale arrives sharded, the module needs it whole
    EXPECT_EQ(comm.get_comm_counts()["all_gather"], 1);
    EXPECT_TRUE(at::allclose(out, expected));
    // With input_layouts given, the number of positional inputs must match (PyTorch's rule).
    nn::Tensors three(3, x);
    std::string e = error_of([&] {
      nn::call_with_hooks(*model, three, nn::Kwargs{}, [](const nn::Tensors& a, const nn::Kwargs&) { return a[0]; });
    });
    EXPECT_NE(e.find("the module got 3 positional inputs but input_layouts has 2"), std::string::npos) << e;
  });
}

TEST(LocalStyles, UserDefinedStyle) {
  // A style of the user's own: parameters replicated, output doubled. parallelize_module applies it to
  // every glob match with the module's path.
  struct DoubleOutput : ParallelStyle {
    mutable std::vector<std::string> paths;
    void apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh, std::optional<int> src) const override {
      paths.push_back(path);
      ReplicateParallel().apply(m, path, mesh, src);
      nn::register_forward_hook(m, [](torch::nn::Module&, const nn::Tensors&, at::Tensor y) { return y * 2; });
    }
    std::string name() const override { return "DoubleOutput"; }
  };
  run_ranks(2, [](int, int) {
    dtensor::testing::Mlp model;
    {
      at::NoGradGuard no_grad;
      uint64_t seed = 20;
      for (auto& p : model->parameters()) p.copy_(seeded_randn(seed++, p.sizes()));
    }
    at::Tensor x = seeded_randn(3, {2, 8});
    at::Tensor expected = model->out_proj(at::relu(model->in_proj(x) * 2)) * 2;
    auto style = std::make_shared<DoubleOutput>();
    parallelize_module(*model, init_device_mesh("cpu", {2}), {{"*_proj", style}});
    EXPECT_EQ(style->paths, (std::vector<std::string>{"in_proj", "out_proj"}));
    EXPECT_EQ(placements(model->in_proj->weight), Placements{Replicate()});
    at::Tensor out = model(distribute_tensor(x, init_device_mesh("cpu", {2}), {Replicate()}));
    EXPECT_TRUE(at::allclose(full_tensor(out), expected));
  });
}

TEST(LocalStyles, EveryBadPlanGivesAClearErrorAndLeavesTheModelUntouched) {
  run_ranks(2, [](int, int) {
    auto mesh = init_device_mesh("cpu", {2});
    auto expect_error = [](const std::function<void()>& f, const std::string& words) {
      std::string e = error_of(f);
      EXPECT_NE(e.find(words), std::string::npos) << "expected '" << words << "' in: " << e;
    };
    dtensor::testing::Block block;
    at::Tensor w1_before = block->ffn->w1->weight.detach().clone();
    // Styles that do not fit the module: named with the path and the module type. The good first entry
    // is not applied either.
    expect_error([&] { parallelize_module(*block, mesh, plan_from_strings({{"ffn.w1", "colwise"}, {"norm", "colwise"}})); },
                 "ColwiseParallel applies to Linear and Embedding, but 'norm' is a dtensor::nn::LayerNormImpl");
    EXPECT_FALSE(is_dtensor(block->ffn->w1->weight));
    EXPECT_TRUE(at::equal(block->ffn->w1->weight, w1_before));
    expect_error([&] { parallelize_module(*block, mesh, plan_from_strings({{"ffn", "rowwise"}})); },
                 "RowwiseParallel applies to Linear and Embedding, but 'ffn' is a");
    expect_error([&] { parallelize_module(*block, mesh, plan_from_strings({{"norm", "packed_colwise"}})); },
                 "PackedColwiseParallel applies to Linear, but 'norm' is a");
    expect_error([&] { parallelize_module(*block, mesh, plan_from_strings({{"norm", "local_rowwise"}})); },
                 "LocalRowwiseParallel applies to Linear, but 'norm' is a");
    // Keys that match nothing: the closest paths.
    expect_error([&] { parallelize_module(*block, mesh, plan_from_strings({{"ffn.w4", "colwise"}})); },
                 "the plan's key 'ffn.w4' matches no submodule; the closest module paths are 'ffn.w1'");
    expect_error([&] { parallelize_module(*block, mesh, ParallelizePlan{{"ffn", nullptr}}); }, "the plan's entry 'ffn' has no style");
    expect_error([&] { style_from_string("packed"); }, "unknown tensor-parallel style 'packed'");
    // transformers 4.x's MoE strings, dropped by transformers 5: refused, naming the replacement.
    expect_error([&] { style_from_string("local"); }, "use 'moe_tp_experts' on the experts module");
    expect_error([&] { style_from_string("local_packed_rowwise"); }, "is transformers 4.x's");
    // Meshes of more than one dim.
    expect_error([&] { parallelize_module(*block, init_device_mesh("cpu", {1, 2}), plan_from_strings({{"ffn.w1", "colwise"}})); },
                 "Tensor Parallel only accepts a 1D DeviceMesh, but found 2D");
    // local_rowwise leaves partial sums: a bias would be counted once per rank.
    dtensor::testing::Mlp mlp;
    expect_error([&] { parallelize_module(*mlp, mesh, plan_from_strings({{"out_proj", "local_rowwise"}})); },
                 "LocalRowwiseParallel on 'out_proj': the output is left a partial sum on each rank, so a bias would be added");
    // Packed weights whose dim does not split into the parts.
    LocalColwiseParallel thirds;
    thirds.packed_parts = {1, 1, 1};
    expect_error([&] { parallelize_module(*mlp, mesh, {{"in_proj", make_style(thirds)}}); },
                 "a dim of size 16 does not split into packed parts in the proportions {1, 1, 1}");
    // PrepareModuleInput layouts that do not pair up.
    PrepareModuleInput prep;
    prep.input_layouts = {Shard(1)};
    prep.desired_input_layouts = {Replicate(), Replicate()};
    expect_error([&] { parallelize_module(*block, mesh, {{"ffn", make_style(prep)}}); },
                 "PrepareModuleInput for 'ffn': input_layouts has 1 entries but desired_input_layouts has 2");
    prep.input_layouts = {std::nullopt};
    prep.desired_input_layouts = {Replicate()};
    expect_error([&] { parallelize_module(*block, mesh, {{"ffn", make_style(prep)}}); },
                 "input 0 has a desired layout Replicate() but no input layout");
    PrepareModuleInputOutput prep_io;
    prep_io.desired_input_kwarg_layouts = {{"mask", Replicate()}};
    expect_error([&] { parallelize_module(*block, mesh, {{"ffn", make_style(prep_io)}}); },
                 "PrepareModuleInputOutput for 'ffn': keyword input 'mask' has a desired layout Replicate() but no "
                 "input_kwarg_layouts entry");
    // torch::nn's own layers run no forward hooks: styles that act only through hooks, or a sequence-parallel
    // layout of Colwise / Rowwise, would do nothing at run time there (tests/tp/test_stock_modules.cpp has the
    // styles they take).
    torch::nn::Sequential plain_layers(torch::nn::Linear(8, 8), torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})));
    expect_error([&] { parallelize_module(*plain_layers, mesh, plan_from_strings({{"1", "sequence_parallel"}})); },
                 "SequenceParallel on '1': torch::nn::LayerNormImpl is LibTorch's own layer, whose forward runs no hooks, "
                 "and SequenceParallel works only through its input and output hooks. Stock layers take ColwiseParallel, "
                 "RowwiseParallel and PairwiseParallel, whose sharded parameters carry the parallelism; for "
                 "SequenceParallel use dtensor::nn::LayerNorm");
    expect_error([&] { parallelize_module(*plain_layers, mesh, {{"0", RowwiseParallel({.output_layouts = Shard(1)})}}); },
                 "RowwiseParallel on '0': output_layouts Shard(dim=1) cannot apply to torch::nn::LinearImpl, LibTorch's "
                 "own layer, whose forward runs no hooks to move its activations");
    expect_error([&] { parallelize_module(*plain_layers, mesh, plan_from_strings({{"0", "local_colwise"}})); },
                 "LocalColwiseParallel on '0': torch::nn::LinearImpl is LibTorch's own layer");
    // Nothing above changed the model.
    for (const auto& p : block->named_parameters()) EXPECT_FALSE(is_dtensor(p.value())) << p.key();
    EXPECT_FALSE(nn::has_hooks(*block->ffn));
  });
}

TEST(LocalStyles, ACustomModuleThatSkipsCallWithHooksIsAnErrorNotASilentlyUnpreparedInput) {
  // Rule 2 broken: this block's forward does not go through call_with_hooks, so PrepareModuleInput's
  // Shard(1) -> Replicate never runs and w1 would take a sequence shard as the whole input.
  struct ForgetfulImpl : torch::nn::Module {
    ForgetfulImpl() { w1 = register_module("w1", nn::Linear(8, 16)); }
    at::Tensor forward(const at::Tensor& x) { return w1(x); }
    nn::Linear w1{nullptr};
  };
  struct ModelImpl : torch::nn::Module {
    ModelImpl() { block = register_module("block", std::make_shared<ForgetfulImpl>()); }
    std::shared_ptr<ForgetfulImpl> block;
  };
  run_ranks(2, [](int rank, int) {
    auto model = std::make_shared<ModelImpl>();
    PrepareModuleInput prep;
    prep.input_layouts = {Shard(1)};
    prep.desired_input_layouts = {Replicate()};
    parallelize_module(*model, init_device_mesh("cpu", {2}), {{"block", make_style(prep)}, {"block.w1", ColwiseParallel()}});
    std::string e = error_of([&] { model->block->forward(seeded_randn(1, {2, 4, 8}).chunk(2, 1)[rank]); });
    EXPECT_NE(e.find("'block.w1' ran outside the forward of 'block', which has parallel-style hooks"), std::string::npos) << e;
    EXPECT_NE(e.find("must run its body through dtensor::nn::call_with_hooks"), std::string::npos) << e;
  });
}
