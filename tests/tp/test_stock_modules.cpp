// LibTorch's own modules parallelized unchanged (the RFC's promise): torch::nn::Linear, Embedding, LayerNorm,
// Dropout, MultiheadAttention, TransformerEncoderLayer / DecoderLayer / Transformer, Sequential and ModuleList
// under Colwise / Rowwise plans and PairwiseParallel, at TP 1, 2 and 4, against the same module on one
// process: the output, the input gradients, every parameter's gradient, and the parameters after each of 5
// AdamW steps.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/debug/comm_debug_mode.h"
#include "dtensor/tp/parallelize.h"
#include "harness/multi_rank.h"
#include "stock_toy_model.h"

using namespace dtensor;
using dtensor::testing::error_of;
using dtensor::testing::run_ranks;
using dtensor::testing::seeded_randn;

namespace {

std::mutex& init_mutex() {
  static std::mutex m;
  return m;
}

// A module's forward (Sequential's holder has no operator() that returns), or Parallelized's call.
template <typename Holder, typename... Args>
auto fwd(Holder& m, Args&&... args) {
  return m->forward(std::forward<Args>(args)...);
}
template <typename Holder, typename... Args>
auto fwd(Parallelized<Holder>& m, Args&&... args) {
  return m(std::forward<Args>(args)...);
}

// Max |a - b| relative to the reference's scale: max|b| + 1.
double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / (1.0 + b.abs().max().item<double>());
}
at::Tensor whole(const at::Tensor& t) { return is_dtensor(t) ? full_tensor(t).detach() : t.detach(); }

struct Case {
  std::vector<std::vector<int64_t>> input_shapes;
  std::vector<at::Tensor> extra;  // plain, non-differentiable inputs (masks), passed after the inputs
  double tol = 2e-6;
};

// `make` builds the module (seeded, the same on every call); `parallelize` parallelizes it on the 1-D TP mesh;
// `forward(module_or_parallelized, inputs)` returns the output the loss uses.
template <typename Holder, typename Make, typename Parallelize, typename Forward>
void expect_like_plain(int world, const Case& c, Make make, Parallelize parallelize, Forward forward) {
  run_ranks(world, [&](int rank, int) {
    Holder plain{nullptr}, tp{nullptr};
    {
      std::lock_guard<std::mutex> lock(init_mutex());
      torch::manual_seed(7);
      plain = make();
      torch::manual_seed(7);
      tp = make();
    }
    auto mesh = init_device_mesh("cpu", {world});
    parallelize(tp, mesh);
    Parallelized<Holder> parallel(tp);
    std::vector<at::Tensor> inputs;
    for (size_t k = 0; k < c.input_shapes.size(); ++k) inputs.push_back(seeded_randn(100 + k, c.input_shapes[k]));
    auto run = [&](auto& module, std::vector<at::Tensor>& xs) {
      std::vector<at::Tensor> args;
      for (auto& x : xs) args.push_back(x.detach().requires_grad_(true));
      for (const auto& e : c.extra) args.push_back(e);
      at::Tensor out = forward(module, args);
      at::Tensor g = seeded_randn(99, out.sizes());
      at::Tensor loss = (out * g).sum();
      loss.backward();
      std::vector<at::Tensor> grads;
      for (size_t k = 0; k < xs.size(); ++k) grads.push_back(args[k].grad());
      return std::make_pair(out.detach(), grads);
    };
    torch::optim::AdamW plain_opt(plain->parameters(), torch::optim::AdamWOptions(0.01));
    torch::optim::AdamW tp_opt(tp->parameters(), torch::optim::AdamWOptions(0.01));
    for (int step = 0; step < 5; ++step) {
      plain_opt.zero_grad();
      tp_opt.zero_grad();
      auto [want, want_grads] = run(plain, inputs);
      auto [got, got_grads] = run(parallel, inputs);
      ASSERT_FALSE(is_dtensor(got)) << "Parallelized gives plain tensors";
      ASSERT_EQ(got.sizes(), want.sizes());
      EXPECT_LE(max_diff(got, want), c.tol) << "output, step " << step << ", rank " << rank;
      for (size_t k = 0; k < inputs.size(); ++k) {
        ASSERT_TRUE(got_grads[k].defined()) << "input " << k;
        EXPECT_FALSE(is_dtensor(got_grads[k]));
        EXPECT_LE(max_diff(got_grads[k], want_grads[k]), c.tol) << "grad of input " << k << ", step " << step;
      }
      auto plain_params = plain->named_parameters();
      for (const auto& p : tp->named_parameters()) {
        ASSERT_TRUE(is_dtensor(p.value())) << p.key() << " is not a DTensor";
        ASSERT_EQ(p.value().grad().defined(), plain_params[p.key()].grad().defined()) << p.key();
        if (!p.value().grad().defined()) continue;  // not used by this output (out_proj for the attention weights)
        EXPECT_LE(max_diff(whole(p.value().grad()), plain_params[p.key()].grad()), c.tol)
            << "grad of " << p.key() << ", step " << step;
      }
      plain_opt.step();
      tp_opt.step();
      for (const auto& p : tp->named_parameters()) {
        at::Tensor got_p = whole(p.value()), want_p = plain_params[p.key()];
        if (p.key().size() >= 12 && p.key().compare(p.key().size() - 12, 12, "in_proj_bias") == 0) {
          // The key bias's true gradient is 0 (softmax ignores a shift of every score): its computed gradient is
          // rounding noise, which AdamW turns into steps of about lr either way. Only q's and v's parts compare.
          const int64_t e = got_p.size(0) / 3;
          got_p = at::cat({got_p.slice(0, 0, e), got_p.slice(0, 2 * e)});
          want_p = at::cat({want_p.slice(0, 0, e), want_p.slice(0, 2 * e)});
        }
        EXPECT_LE(max_diff(got_p, want_p), 5 * c.tol) << p.key() << " after AdamW step " << step + 1;
      }
    }
  });
}


// A model of one's own: an embedding, a ModuleList of MLP blocks with residuals and LayerNorms, a head.
struct StackImpl : torch::nn::Module {
  StackImpl() {
    embed = register_module("embed", torch::nn::Embedding(20, 8));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < 2; ++i) {
      blocks->push_back(torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::GELU(), torch::nn::Dropout(0.0),
                                              torch::nn::Linear(16, 8)));
    }
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})));
    head = register_module("head", torch::nn::Linear(8, 6));
  }
  at::Tensor forward(const at::Tensor& ids) {
    at::Tensor h = embed(ids);
    for (const auto& block : *blocks) h = h + block->as<torch::nn::Sequential>()->forward(h);
    return head(norm(h));
  }
  torch::nn::Embedding embed{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Stack);

auto call1 = [](auto& m, const std::vector<at::Tensor>& in) { return fwd(m, in[0]); };
auto attention_output = [](auto& m, const std::vector<at::Tensor>& in) { return std::get<0>(fwd(m, in[0], in[0], in[0])); };
auto pairwise = [](auto& m, const DeviceMesh& mesh) { parallelize_module(*m, mesh, PairwiseParallel()); };

}  // namespace

TEST(StockModules, LinearColwiseAndRowwiseAlone) {
  Case c{{{4, 3, 8}}};
  for (int world : {1, 2, 4}) {
    expect_like_plain<torch::nn::Linear>(world, c, [] { return torch::nn::Linear(8, 12); },
        [](auto& m, const DeviceMesh& mesh) { parallelize_module(*m, mesh, ColwiseParallel()); }, call1);
    expect_like_plain<torch::nn::Linear>(world, c, [] { return torch::nn::Linear(8, 12); },
        [](auto& m, const DeviceMesh& mesh) { parallelize_module(*m, mesh, RowwiseParallel()); }, call1);
  }
}

TEST(StockModules, ToyModelUnderTheSeedsPlan) {
  Case c{{{20, 10}}};
  for (int world : {1, 2, 4}) {
    expect_like_plain<StockToyModel>(world, c, [] { return StockToyModel(); },
        [](auto& m, const DeviceMesh& mesh) {
          parallelize_module(*m, mesh, {{"in_proj", ColwiseParallel()}, {"out_proj", RowwiseParallel()}});
        }, call1);
    expect_like_plain<StockToyModel>(world, c, [] { return StockToyModel(); }, pairwise, call1);
  }
}

TEST(StockModules, SequentialMlpsUnderPairwise) {
  Case c{{{3, 5, 8}}};
  auto mlp2 = [] { return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 8)); };
  auto mlp4 = [] {
    return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Dropout(0.0), torch::nn::Linear(16, 8),
                                 torch::nn::GELU(), torch::nn::Linear(8, 12), torch::nn::ReLU(), torch::nn::Linear(12, 8),
                                 torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})));
  };
  // An odd count: the third Linear stays replicated (PyTorch's rule), and the result is still exact.
  auto mlp3 = [] {
    return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 8), torch::nn::Tanh(),
                                 torch::nn::Linear(8, 4));
  };
  for (int world : {1, 2, 4}) {
    expect_like_plain<torch::nn::Sequential>(world, c, mlp2, pairwise, call1);
    expect_like_plain<torch::nn::Sequential>(world, c, mlp4, pairwise, call1);
    expect_like_plain<torch::nn::Sequential>(world, c, mlp3, pairwise, call1);
  }
}

TEST(StockModules, EmbeddingModuleListAndNormsUnderPlans) {
  Case c{{}};
  c.extra = {at::randint(0, 20, {3, 7}, at::kLong)};
  auto ids_only = [](auto& m, const std::vector<at::Tensor>& in) { return fwd(m, in[0]); };
  for (int world : {1, 2, 4}) {
    // Rowwise embedding (vocab rows), Colwise / Rowwise pairs in each block, a Colwise head gathered at the root.
    expect_like_plain<Stack>(world, c, [] { return Stack(); },
        [](auto& m, const DeviceMesh& mesh) {
          parallelize_module(*m, mesh, {{"embed", RowwiseParallel({.input_layouts = Replicate()})},
                                        {"blocks.*.0", ColwiseParallel()}, {"blocks.*.3", RowwiseParallel()},
                                        {"head", ColwiseParallel()}});
        }, ids_only);
    // A Colwise embedding (embedding dims) and PairwiseParallel over the blocks.
    expect_like_plain<Stack>(world, c, [] { return Stack(); },
        [](auto& m, const DeviceMesh& mesh) {
          parallelize_module(*m, mesh, {{"embed", ColwiseParallel()}, {"blocks", PairwiseParallel()}});
        }, ids_only);
  }
}

TEST(StockModules, MultiheadAttentionHeadsPerRank) {
  auto mha = [] { return torch::nn::MultiheadAttention(16, 4); };
  for (int world : {1, 2, 4}) {
    expect_like_plain<torch::nn::MultiheadAttention>(world, Case{{{5, 3, 16}}}, mha, pairwise, attention_output);
    // The averaged attention weights (need_weights) too.
    expect_like_plain<torch::nn::MultiheadAttention>(world, Case{{{5, 3, 16}}}, mha, pairwise,
        [](auto& m, const std::vector<at::Tensor>& in) { return std::get<1>(fwd(m, in[0], in[0], in[0])); });
  }
}

TEST(StockModules, MultiheadAttentionMasksBiasKvAndCrossAttention) {
  at::Tensor causal = at::triu(at::full({5, 5}, -1e9), 1);
  at::Tensor padding = at::zeros({3, 5}, at::kBool);
  padding.index_put_({1, 4}, true);
  padding.index_put_({2, 3}, true);
  for (int world : {1, 2, 4}) {
    Case masked{{{5, 3, 16}}};
    masked.extra = {padding, causal};
    expect_like_plain<torch::nn::MultiheadAttention>(world, masked, [] { return torch::nn::MultiheadAttention(16, 4); },
        pairwise, [](auto& m, const std::vector<at::Tensor>& in) {
          return std::get<0>(fwd(m, in[0], in[0], in[0], in[1], true, in[2]));
        });
    // bias_k / bias_v, attending over a memory of another length (query 4, key = value 6).
    expect_like_plain<torch::nn::MultiheadAttention>(world, Case{{{4, 3, 16}, {6, 3, 16}}},
        [] { return torch::nn::MultiheadAttention(torch::nn::MultiheadAttentionOptions(16, 4).add_bias_kv(true)); }, pairwise,
        [](auto& m, const std::vector<at::Tensor>& in) { return std::get<0>(fwd(m, in[0], in[1], in[1])); });
    // kdim / vdim != embed_dim: separate q / k / v projection weights (LibTorch asks key and value of one shape).
    expect_like_plain<torch::nn::MultiheadAttention>(world, Case{{{4, 3, 16}, {6, 3, 12}, {6, 3, 12}}},
        [] { return torch::nn::MultiheadAttention(torch::nn::MultiheadAttentionOptions(16, 4).kdim(12).vdim(12)); }, pairwise,
        [](auto& m, const std::vector<at::Tensor>& in) { return std::get<0>(fwd(m, in[0], in[1], in[2])); });
  }
}

TEST(StockModules, TransformerLayersAndTransformerUnderPairwise) {
  using namespace torch::nn;
  for (int world : {1, 2, 4}) {
    expect_like_plain<TransformerEncoderLayer>(world, Case{{{5, 3, 16}}},
        [] { return TransformerEncoderLayer(TransformerEncoderLayerOptions(16, 4).dim_feedforward(32).dropout(0.0)); },
        pairwise, call1);
    expect_like_plain<TransformerEncoderLayer>(world, Case{{{5, 3, 16}}},
        [] {
          return TransformerEncoderLayer(
              TransformerEncoderLayerOptions(16, 4).dim_feedforward(32).dropout(0.0).activation(torch::kGELU));
        },
        pairwise, call1);
    expect_like_plain<TransformerDecoderLayer>(world, Case{{{4, 3, 16}, {5, 3, 16}}},
        [] { return TransformerDecoderLayer(TransformerDecoderLayerOptions(16, 4).dim_feedforward(32).dropout(0.0)); },
        pairwise, [](auto& m, const std::vector<at::Tensor>& in) { return fwd(m, in[0], in[1]); });
    Case both{{{5, 3, 16}, {4, 3, 16}}, {}, 4e-6};
    expect_like_plain<Transformer>(world, both,
        [] {
          return Transformer(TransformerOptions(16, 4, 2, 2).dim_feedforward(32).dropout(0.0));
        },
        pairwise, [](auto& m, const std::vector<at::Tensor>& in) { return fwd(m, in[0], in[1]); });
  }
}

TEST(StockModules, TpMeshDimOnATwoDimensionalMeshEqualsTheSlice) {
  // tp_mesh_dim 1 and 0 of a 2 x 2 mesh, and mesh["tp"]: the same outputs as the plain module.
  for (int tp_dim : {0, 1}) {
    run_ranks(4, [&](int, int) {
      torch::nn::Sequential plain{nullptr}, by_dim{nullptr}, by_name{nullptr};
      {
        std::lock_guard<std::mutex> lock(init_mutex());
        for (auto* m : {&plain, &by_dim, &by_name}) {
          torch::manual_seed(3);
          *m = torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 8));
        }
      }
      auto mesh = init_device_mesh("cpu", {2, 2}, {"a", "b"});
      parallelize_module(*by_dim, mesh, PairwiseParallel(), TpMeshDim{tp_dim});
      parallelize_module(*by_name, mesh[tp_dim == 0 ? "a" : "b"], PairwiseParallel());
      EXPECT_EQ(device_mesh(by_dim[0]->as<torch::nn::Linear>()->weight).ranks(),
                device_mesh(by_name[0]->as<torch::nn::Linear>()->weight).ranks());
      at::Tensor x = seeded_randn(5, {3, 8});
      at::Tensor want = plain->forward(x);
      EXPECT_LE(max_diff(Parallelized(by_dim)(x), want), 2e-6);
      EXPECT_LE(max_diff(Parallelized(by_name)(x), want), 2e-6);
    });
  }
}

TEST(StockModules, BadPlansAreClearErrorsAndChangeNothing) {
  run_ranks(4, [](int, int) {
    auto mesh = init_device_mesh("cpu", {4});
    torch::nn::MultiheadAttention six_heads(18, 6);
    EXPECT_NE(error_of([&] { parallelize_module(*six_heads, mesh, PairwiseParallel()); })
                  .find("PairwiseParallel on (the root module): 6 attention heads do not split over 4 ranks"),
              std::string::npos);
    torch::nn::Sequential one_linear(torch::nn::Linear(8, 8), torch::nn::ReLU());
    EXPECT_NE(error_of([&] { parallelize_module(*one_linear, mesh, PairwiseParallel()); })
                  .find("has no MultiheadAttention and no module with two or more Linear children to pair"),
              std::string::npos);
    for (const auto& p : six_heads->parameters()) EXPECT_FALSE(is_dtensor(p));
    for (const auto& p : one_linear->parameters()) EXPECT_FALSE(is_dtensor(p));
    EXPECT_NE(error_of([&] { Parallelized p(one_linear); }).find("has no DTensor parameters"), std::string::npos);
    // A parallelized stock module called directly with a plain tensor: the error names the way to call it.
    torch::nn::Linear linear(8, 12);
    parallelize_module(*linear, mesh, ColwiseParallel());
    const std::string mixed = error_of([&] { linear(at::ones({2, 8})); });
    EXPECT_NE(mixed.find("mixed plain at::Tensor and DTensor"), std::string::npos) << mixed;
    EXPECT_NE(mixed.find("dtensor::Parallelized"), std::string::npos) << mixed;
  });
}

TEST(StockModules, AttentionRunsItsHeadsOnEachRankWithOneAllReducePerBlock) {
  // Heads per rank: the packed in_proj's _StridedShard(0, 3) flows through chunk, the head views ([T, B, E] ->
  // [T, B*H, hd] as _StridedShard(1, B)), bmm, softmax and back, with no all-gather. The encoder layer's
  // forward costs two all-reduces, attention's and the MLP's, as Megatron's block does; so does its backward.
  using namespace torch::nn;
  run_ranks(2, [](int, int) {
    TransformerEncoderLayer layer{nullptr};
    {
      std::lock_guard<std::mutex> lock(init_mutex());
      torch::manual_seed(11);
      layer = TransformerEncoderLayer(TransformerEncoderLayerOptions(16, 4).dim_feedforward(32).dropout(0.0));
    }
    auto mesh = init_device_mesh("cpu", {2});
    parallelize_module(*layer, mesh, PairwiseParallel());
    Parallelized parallel(layer);
    at::Tensor x = seeded_randn(1, {5, 3, 16}).requires_grad_(true);
    at::Tensor y;
    {
      CommDebugMode comm;
      y = parallel(x);
      EXPECT_EQ(comm.get_comm_counts(), (std::map<std::string, int64_t>{{"all_reduce", 2}})) << comm.table();
    }
    {
      CommDebugMode comm;
      y.sum().backward();
      EXPECT_EQ(comm.get_comm_counts().count("all_gather"), 0u) << comm.table();
      EXPECT_EQ(comm.get_comm_counts()["all_reduce"], 2) << comm.table();
    }
    // The local shards are each rank's heads: in_proj_weight holds 3 x 8 of its 48 rows.
    EXPECT_EQ(to_local(layer->self_attn->in_proj_weight).size(0), 24);
    EXPECT_EQ(placements(layer->self_attn->in_proj_weight)[0], _StridedShard(0, 3));
  });
}

TEST(StockModules, CrossAttentionKeepsItsHeadsTooForwardAndBackward) {
  // The decoder layer's cross-attention takes in_proj's q rows and its k / v rows as slices of the
  // _StridedShard(0, 3) weight: whole pieces, no communication; their backward writes the gradient back into
  // the same layout. Three all-reduces forward (self-attention, cross-attention, MLP), no all-gather either way.
  using namespace torch::nn;
  run_ranks(2, [](int, int) {
    TransformerDecoderLayer layer{nullptr};
    {
      std::lock_guard<std::mutex> lock(init_mutex());
      torch::manual_seed(12);
      layer = TransformerDecoderLayer(TransformerDecoderLayerOptions(16, 4).dim_feedforward(32).dropout(0.0));
    }
    auto mesh = init_device_mesh("cpu", {2});
    parallelize_module(*layer, mesh, PairwiseParallel());
    Parallelized parallel(layer);
    at::Tensor tgt = seeded_randn(1, {4, 3, 16}), memory = seeded_randn(2, {5, 3, 16});
    at::Tensor y;
    {
      CommDebugMode comm;
      y = parallel(tgt, memory);
      EXPECT_EQ(comm.get_comm_counts(), (std::map<std::string, int64_t>{{"all_reduce", 3}})) << comm.table();
    }
    {
      CommDebugMode comm;
      y.sum().backward();
      EXPECT_EQ(comm.get_comm_counts().count("all_gather"), 0u) << comm.table();
    }
    EXPECT_EQ(placements(layer->multihead_attn->in_proj_weight.grad())[0], _StridedShard(0, 3));
  });
}
