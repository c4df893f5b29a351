// Mixtures of experts (llama/moe.h) against transformers and under every way to parallelize them:
//   - the router logits, the load-balancing loss and the loss with it equal transformers'; the grouped experts
//     equal the naive loop;
//   - TP inside the experts (transformers 5's moe_tp_experts): each rank a slice of every expert, one
//     all-reduce per block;
//   - expert parallelism (ExpertParallel): whole experts per rank, tokens to them and back by all_to_all
//     (3 per block forward: counts, dispatch, combine), output and gradients equal the plain block's, and
//     logits at EP 2 and 4, each rank with other rows of the batch, equal transformers'; on replicated tokens
//     (generation) one all-reduce per block;
//   - training: EP 2, EP 2 x TP 2, DP 2 x EP 2 and DP 2 x EP 2 x TP 2 give the losses of one rank on the whole
//     batch (the load-balancing statistics pooled over the dp ranks);
//   - the dry run's all_to_all bytes equal the real run's (summed over the ranks: routing decides each
//     rank's share, the sum is T·k rows each way);
//   - errors: experts that do not divide over ep, EP on a dense model, FSDP beside EP, llama_train flags.
// The logits and greedy tokens at EP 2 and 4 with the batch on every rank (generation's EP) are checked with
// every family in test_hf_families.cpp.
#include <gtest/gtest.h>

#include <mutex>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/checkpoint/safetensors.h"
#include "dtensor/debug/comm_debug_mode.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/functional_collectives.h"
#include "harness/multi_rank.h"
#include "harness/subprocess.h"
#include "hf_family_cases.h"
#include "llama/hf_config.h"
#include "llama/hf_weights.h"
#include "llama/parallelize.h"
#include "llama_test_util.h"
#include "train/plan_dry_run.h"

namespace ckpt = dtensor::checkpoint;
using namespace hf_cases;

namespace {

// The mixtures of experts: the router logits of each sparse layer, the load-balancing loss over the real tokens
// and the training loss with it (cross-entropy + router_aux_loss_coef * aux) equal transformers'; the grouped
// experts (one matmul per expert) equal the naive loop.
TEST(Moe, RouterAuxLossAndLossEqualTransformers) {
  for (const std::string name : {"mixtral", "qwen2_moe", "qwen3_moe"}) {
    auto f = ckpt::SafetensorsFile::open(root() + "/" + name + ".ref.safetensors");
    auto get = [&](const char* key) { return f.view(*f.find(key)).clone(); };
    const at::Tensor tokens = get("tokens"), mask = get("mask");
    llama::LlamaForCausalLM model = llama::from_pretrained(root() + "/" + name);
    at::NoGradGuard no_grad;
    model(tokens, mask);  // keeps each sparse layer's router logits
    std::vector<at::Tensor> router;
    for (const auto& layer : model->model->layers->values()) {
      const auto& moe = layer->as<llama::DecoderLayerImpl>()->moe;
      if (moe) router.push_back(moe->router_logits);
    }
    const at::Tensor want_router = get("router_logits");
    ASSERT_EQ(static_cast<int64_t>(router.size()), want_router.size(0)) << name;
    const at::Tensor real = mask.reshape(-1).to(at::kBool);
    for (size_t l = 0; l < router.size(); ++l) {
      EXPECT_LE((router[l] - want_router[l]).index({real}).abs().max().item<double>(), 1e-5) << name << " layer " << l;
    }
    const at::Tensor aux = model->aux_loss(mask);
    const at::Tensor labels = at::where(mask.to(at::kBool), tokens, at::full_like(tokens, -100));
    // transformers' causal LM loss: logits at t predict labels at t + 1. A left-padded row's last padding
    // position predicts its first token, and HF's logits there are not ours (nor meaningful: the real positions
    // are compared in LogitsEqualTransformers), so the cross-entropy is taken of HF's logits; the aux term is ours.
    const at::Tensor hf_logits = get("logits");
    const at::Tensor ce = at::cross_entropy_loss(hf_logits.narrow(1, 0, hf_logits.size(1) - 1).flatten(0, 1),
                                                 labels.narrow(1, 1, labels.size(1) - 1).flatten(0, 1));
    const double loss = (ce + model->config.moe.router_aux_loss_coef * aux).item<double>();
    std::printf("%s aux_loss %.6f (HF %.6f) loss %.6f (HF %.6f)\n", name.c_str(), aux.item<double>(),
                get("aux_loss").item<double>(), loss, get("loss").item<double>());
    EXPECT_NEAR(aux.item<double>(), get("aux_loss").item<double>(), 1e-6) << name;
    EXPECT_NEAR(loss, get("loss").item<double>(), 1e-5) << name;
    // The grouped experts against the naive loop, on every sparse layer.
    for (const auto& layer : model->model->layers->values()) {
      auto& moe = layer->as<llama::DecoderLayerImpl>()->moe;
      if (!moe) continue;
      const at::Tensor x = at::randn({13, model->config.hidden_size});
      const at::Tensor idx = std::get<1>(at::topk(at::randn({13, model->config.moe.num_experts}), model->config.moe.top_k, -1));
      const at::Tensor w = at::rand({13, model->config.moe.top_k});
      const at::Tensor naive = moe->experts->forward_naive(x, idx, w);
      EXPECT_LE((moe->experts->forward_grouped(x, idx, w) - naive).abs().max().item<double>(),
                1e-6 * (1 + naive.abs().max().item<double>())) << name;
    }
  }
}

// transformers 5's expert TP (hf plan "moe_tp_experts"): each rank holds its slice of every expert's
// intermediate features, as honest DTensors, and a sparse block's forward costs one all-reduce (the experts'
// partial sums); the router stays whole on every rank.
TEST(Moe, ExpertsAreSplitByFeaturesUnderTp) {
  dtensor::testing::run_ranks(2, [&](int, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world});
    llama::LlamaForCausalLM model = llama::from_pretrained(root() + "/mixtral", &mesh, "hf");
    const auto& moe = model->model->layers["0"]->as<llama::DecoderLayerImpl>()->moe;
    const at::Tensor gate_up = moe->experts->named_parameters(false)["gate_up_proj"];
    const at::Tensor down = moe->experts->named_parameters(false)["down_proj"];
    EXPECT_EQ(dtensor::placements(gate_up)[0], dtensor::_StridedShard(1, 2));
    EXPECT_EQ(dtensor::placements(down)[0], dtensor::Shard(2));
    EXPECT_EQ(dtensor::to_local(gate_up).sizes(), (std::vector<int64_t>{4, 48, 64}));  // [E, 2 * 48 / 2, H]
    EXPECT_EQ(dtensor::to_local(down).sizes(), (std::vector<int64_t>{4, 64, 24}));
    EXPECT_FALSE(dtensor::is_dtensor(moe->gate->weight));  // the router: whole, plain, on every rank
    at::NoGradGuard no_grad;
    const at::Tensor x = at::randn({1, 5, 64});
    dtensor::CommDebugMode comm;
    llama::SparseMoeBlock block = moe;
    block(x);
    EXPECT_EQ(comm.get_comm_counts(), (std::map<std::string, int64_t>{{"all_reduce", 1}})) << comm.table();
  });
}


// ExpertParallel at EP 2 on Mixtral's first block: each rank holds 2 whole experts; each rank's own tokens
// (different on each) give the plain block's output and input gradient, the router's gradient, and the experts'
// gradients summed over both ranks' tokens; a forward costs 3 all_to_alls and nothing else.
TEST(Moe, ExpertParallelSplitsWholeExpertsAndMatchesThePlainBlock) {
  dtensor::testing::run_ranks(2, [&](int rank, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world}, {"ep"});
    llama::LlamaForCausalLM plain = llama::from_pretrained(root() + "/mixtral");
    llama::LlamaForCausalLM model = llama::from_pretrained(root() + "/mixtral");
    llama::apply_ep(model, mesh);
    auto block_of = [](llama::LlamaForCausalLM& m) { return m->model->layers["0"]->as<llama::DecoderLayerImpl>()->moe; };
    llama::SparseMoeBlock ep_block = block_of(model), ref_block = block_of(plain);
    const at::Tensor gate_up = ep_block->experts->named_parameters(false)["gate_up_proj"];
    EXPECT_EQ(dtensor::placements(gate_up)[0], dtensor::Shard(0));
    EXPECT_EQ(dtensor::to_local(gate_up).sizes(), (std::vector<int64_t>{2, 96, 64}));  // experts 2r, 2r + 1
    EXPECT_EQ(dtensor::to_local(ep_block->experts->named_parameters(false)["down_proj"]).sizes(),
              (std::vector<int64_t>{2, 64, 48}));
    // Different tokens on each rank (5 and 6 of them), as data-parallel ranks hold.
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(100 + rank);
    const at::Tensor x = at::randn({1, 5 + rank, 64}, gen);
    const at::Tensor x_ep = x.clone().requires_grad_(true), x_ref = x.clone().requires_grad_(true);
    at::Tensor out;
    {
      dtensor::CommDebugMode comm;
      out = ep_block(x_ep);
      EXPECT_EQ(comm.get_comm_counts(), (std::map<std::string, int64_t>{{"all_to_all", 3}})) << comm.table();
    }
    const at::Tensor want = ref_block(x_ref);
    auto rel = [](const at::Tensor& got, const at::Tensor& ref) {
      return ((got - ref).abs().max() / ref.abs().max()).item<double>();
    };
    EXPECT_LE(rel(out, want), 1e-6);
    const at::Tensor grad_out = at::randn(out.sizes(), gen);
    out.backward(grad_out);
    want.backward(grad_out);
    EXPECT_LE(rel(x_ep.grad(), x_ref.grad()), 1e-6);
    EXPECT_LE(rel(ep_block->gate->weight.grad(), ref_block->gate->weight.grad()), 1e-6);
    for (const char* p : {"gate_up_proj", "down_proj"}) {
      const at::Tensor got = dtensor::full_tensor(ep_block->experts->named_parameters(false)[p].grad());
      const at::Tensor summed = dtensor::all_reduce(ref_block->experts->named_parameters(false)[p].grad(),
                                                    dtensor::ReduceOp::SUM, mesh, 0);
      EXPECT_LE(rel(got, summed), 1e-6) << p;
    }
  });
}

// Expert parallelism with dispatch, as training runs it: each rank holds other rows of HF's reference batch
// (row rank % rows), its tokens travel to their experts by all_to_all, and its logits equal HF's for its row.
TEST(Moe, LogitsWithTokensDispatchedAtEp2Ep4EqualTransformers) {
  for (const std::string name : {"mixtral", "qwen2_moe", "qwen3_moe"}) {
    const Reference ref = reference(name);
    for (int ep : {2, 4}) {
      std::mutex mu;
      double worst = 0;
      dtensor::testing::run_ranks(ep, [&](int rank, int world) {
        auto mesh = dtensor::init_device_mesh("cpu", {world}, {"ep"});
        llama::LlamaForCausalLM model = llama::from_pretrained(root() + "/" + name);
        llama::apply_ep(model, mesh);
        const int64_t row = rank % ref.tokens.size(0);
        const at::Tensor tokens = ref.tokens.narrow(0, row, 1), mask = ref.mask.narrow(0, row, 1);
        at::NoGradGuard no_grad;
        const double rel = masked_rel(model(tokens, mask), ref.logits.narrow(0, row, 1), mask);
        std::lock_guard<std::mutex> lock(mu);
        worst = std::max(worst, rel);
      });
      std::printf("%s ep=%d (dispatch) max_rel=%.3e\n", name.c_str(), ep, worst);
      EXPECT_LE(worst, 1e-5) << name << " EP " << ep;
    }
  }
}

// Generation's expert parallelism (replicated tokens: the same on every rank): each rank computes its experts'
// pairs, and one all-reduce per block sums them; the output equals the plain block's.
TEST(Moe, ExpertParallelOnReplicatedTokensCostsOneAllReducePerBlock) {
  dtensor::testing::run_ranks(2, [&](int, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world}, {"ep"});
    llama::LlamaForCausalLM plain = llama::from_pretrained(root() + "/qwen2_moe");
    llama::LlamaForCausalLM model = llama::from_pretrained(root() + "/qwen2_moe", &mesh, "ep");
    llama::SparseMoeBlock block = model->model->layers["0"]->as<llama::DecoderLayerImpl>()->moe;
    llama::SparseMoeBlock ref = plain->model->layers["0"]->as<llama::DecoderLayerImpl>()->moe;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);  // the same tokens on both ranks
    const at::Tensor x = at::randn({2, 3, 64}, gen);
    at::NoGradGuard no_grad;
    dtensor::CommDebugMode comm;
    const at::Tensor out = block(x);
    EXPECT_EQ(comm.get_comm_counts(), (std::map<std::string, int64_t>{{"all_reduce", 1}})) << comm.table();
    const at::Tensor want = ref(x);
    EXPECT_LE(((out - want).abs().max() / want.abs().max()).item<double>(), 1e-6);
  });
}

// llama_train's losses under expert parallelism, composed with TP and DP on 2-D and 3-D meshes, equal one
// rank's on the whole batch.
TEST(Moe, TrainingLossesUnderExpertParallelismEqualOneRank) {
  struct Layout {
    int dp, ep, tp;
  };
  for (const std::string name : {"mixtral", "qwen2_moe"}) {
    train::TrainOptions o = llama_test::small_options();
    o.hf_dir = root() + "/" + name;
    o.model = llama::config_from_hf_json(o.hf_dir + "/config.json");
    o.steps = 4;
    const auto one = llama_test::run_tp(o, 1);
    std::vector<Layout> layouts = {{2, 2, 1}, {2, 2, 2}, {4, 2, 1}};
    if (name == "mixtral") layouts.push_back({4, 2, 2});  // 8 ranks: ("dp", "ep", "tp") = (2, 2, 2)
    for (const Layout& l : layouts) {
      o.ep = l.ep;
      const auto got = llama_test::run_dp_tp(o, l.dp, l.tp);
      const double rel = llama_test::max_rel_diff(one.losses, got.losses);
      std::printf("%s dp=%d ep=%d tp=%d losses %.6f .. %.6f max_rel %.3e\n", name.c_str(), l.dp, l.ep, l.tp,
                  got.losses.front(), got.losses.back(), rel);
      EXPECT_LE(rel, 1e-5) << name << " dp " << l.dp << " ep " << l.ep << " tp " << l.tp;
    }
  }
}

// The dry run of an EP step counts the real run's all_to_alls, and their bytes summed over the ranks (each
// rank's share depends on the routing; the sum is T·k rows each way, plus the counts).
TEST(Moe, DryRunAllToAllBytesEqualTheRealRun) {
  train::TrainOptions o = llama_test::small_options();
  o.hf_dir = root() + "/mixtral";
  o.model = llama::config_from_hf_json(o.hf_dir + "/config.json");
  o.steps = 1;
  o.max_norm = 0;
  o.ep = 2;
  for (int tp : {1, 2}) {
    o.dp = 2;
    o.tp = tp;
    std::mutex mu;
    std::map<std::string, int64_t> real_counts;
    int64_t real_bytes = 0;
    dtensor::testing::run_ranks(2 * tp, [&](int rank, int world) {
      const dtensor::DeviceMesh mesh = train::parallel_dims(o, world).build_mesh();
      llama::LlamaForCausalLM model = train::make_model(o);
      const models::ParallelDims dims = train::parallelize(model, o, mesh);
      const auto result = train::run(model, o, llama_test::test_corpus(), dims);
      std::lock_guard<std::mutex> lock(mu);
      real_bytes += result.steps.at(0).fwd_bwd_bytes.at("all_to_all");
      if (rank == 0) real_counts = result.steps.at(0).fwd_bwd_counts;
    });
    train::PlanOptions p = train::plan_options_of(o, tp);  // the real run's options, as llama_plan takes them
    for (int r = 0; r < 2 * tp; ++r) p.ranks.push_back(r);
    const dtensor::DryRunReport dry = train::dry_run_llama(p);
    int64_t dry_bytes = 0;
    for (const auto& rank : dry.ranks) {
      dry_bytes += rank.bytes(dtensor::StepPhase::FORWARD)["all_to_all"] + rank.bytes(dtensor::StepPhase::BACKWARD)["all_to_all"];
    }
    auto counts = dry.ranks.front().counts(dtensor::StepPhase::FORWARD);
    for (const auto& [k, v] : dry.ranks.front().counts(dtensor::StepPhase::BACKWARD)) counts[k] += v;
    std::printf("ep 2 tp %d: all_to_all bytes per step over the ranks: dry run %lld, real %lld\n", tp,
                static_cast<long long>(dry_bytes), static_cast<long long>(real_bytes));
    EXPECT_EQ(counts, real_counts) << "tp " << tp;
    EXPECT_EQ(dry_bytes, real_bytes) << "tp " << tp;
    // 2 sparse layers x (counts + dispatch + combine forward, combine + dispatch backward)
    EXPECT_EQ(real_counts.at("all_to_all"), 2 * 5);
  }
}

// Bad input: one clear error, the model untouched.
TEST(Moe, ExpertParallelErrorsNameTheCause) {
  dtensor::testing::run_ranks(3, [&](int, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world}, {"ep"});
    llama::LlamaForCausalLM model = llama::from_pretrained(root() + "/mixtral");
    const std::string err = dtensor::testing::error_of([&] { llama::apply_ep(model, mesh); });
    EXPECT_NE(err.find("4 experts do not divide over 3 expert-parallel ranks"), std::string::npos) << err;
    EXPECT_FALSE(dtensor::is_dtensor(model->model->layers["0"]->as<llama::DecoderLayerImpl>()->moe->experts->gate_up_proj));
    llama::LlamaForCausalLM dense = llama::from_pretrained(root() + "/llama");
    const std::string dense_err = dtensor::testing::error_of([&] { llama::apply_ep(dense, mesh); });
    EXPECT_NE(dense_err.find("needs a mixture of experts"), std::string::npos) << dense_err;
  });
  dtensor::testing::run_ranks(2, [&](int, int world) {
    train::TrainOptions o = llama_test::small_options();
    o.model = llama::config_from_hf_json(root() + "/mixtral/config.json");
    o.ep = 2;
    o.dp = 2;
    o.data_parallel = models::DataParallel::fsdp;
    const dtensor::DeviceMesh mesh = train::parallel_dims(o, world).build_mesh();
    llama::LlamaForCausalLM model(o.model);
    const std::string err = dtensor::testing::error_of([&] { train::parallelize(model, o, mesh); });
    EXPECT_NE(err.find("FSDP beside expert parallelism is not supported"), std::string::npos) << err;
  });
  const std::string mixtral = root() + "/mixtral";
  for (const auto& [args, want] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--ep", "2", "--fsdp", "--hf-dir", mixtral}, "--fsdp with --ep"},
           {{"--ep", "3", "--hf-dir", mixtral}, "does not divide the 4 experts"},
           {{"--ep", "2", "--dp", "3", "--hf-dir", mixtral}, "--ep 2 does not divide --dp 3"},
           {{"--ep", "2"}, "--ep needs a mixture of experts"}}) {
    std::vector<std::string> argv = {dtensor::testing::bin_path("llama_train")};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto r = dtensor::testing::run_process(argv, {{"RANK", "0"}, {"WORLD_SIZE", "2"}}, 60);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(want), std::string::npos) << r.output;
  }
}

}  // namespace
