// The Llama model without parallelism (names, shapes, config), DTENSOR_MODULE's hooks, the plans' errors,
// and llama_train's command line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "dtensor/core/error.h"
#include "dtensor/nn/hooked_module.h"
#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"
#include "harness/subprocess.h"
#include "llama/hf_config.h"
#include "llama/parallelize.h"
#include "llama_test_util.h"

namespace {

TEST(LlamaModel, HasHFParameterNamesAndShapes) {
  auto c = llama_test::small_options().model;
  llama::LlamaForCausalLM model(c);
  auto params = model->named_parameters();
  EXPECT_EQ(params.size(), static_cast<size_t>(3 + 9 * c.num_hidden_layers));
  EXPECT_EQ(params["model.embed_tokens.weight"].sizes(), at::IntArrayRef({256, 64}));
  EXPECT_EQ(params["model.layers.1.self_attn.k_proj.weight"].sizes(), at::IntArrayRef({32, 64}));  // 2 kv heads x 16
  EXPECT_EQ(params["model.layers.0.mlp.down_proj.weight"].sizes(), at::IntArrayRef({64, 128}));
  EXPECT_TRUE(params.contains("model.layers.0.post_attention_layernorm.weight"));
  EXPECT_TRUE(params.contains("model.norm.weight"));
  EXPECT_TRUE(params.contains("lm_head.weight"));
  at::Tensor logits = model(at::randint(256, {2, 8}, at::kLong));
  EXPECT_EQ(logits.sizes(), at::IntArrayRef({2, 8, 256}));
}

TEST(LlamaModel, TiedEmbeddingsShareOneTensor) {
  auto c = llama_test::small_options().model;
  c.tie_word_embeddings = true;
  llama::LlamaForCausalLM model(c);
  EXPECT_TRUE(model->lm_head->weight.is_same(model->model->embed_tokens->weight));
  EXPECT_TRUE(model->named_parameters()["lm_head.weight"].is_same(model->named_parameters()["model.embed_tokens.weight"]));
}

TEST(LlamaModel, InitIsDeterministicFromTheSeed) {
  auto c = llama_test::small_options().model;
  llama::LlamaForCausalLM a(c), b(c);
  a->init_weights(3);
  b->init_weights(3);
  for (const auto& item : a->named_parameters()) EXPECT_TRUE(item.value().equal(b->named_parameters()[item.key()])) << item.key();
}

// Rotary tables follow HF: angles = position * theta^(-2i/d), duplicated over the two halves.
TEST(LlamaModel, RotaryTablesAreHFs) {
  llama::LlamaConfig c;
  c.hidden_size = 64;
  c.num_attention_heads = 8;  // head_dim 8
  auto [cos, sin] = llama::rotary_tables(c, 5);
  EXPECT_EQ(cos.sizes(), at::IntArrayRef({5, 8}));
  const double angle = 3.0 * std::pow(500000.0, -2.0 / 8.0);  // position 3, i = 1
  EXPECT_NEAR(cos[3][1].item<double>(), std::cos(angle), 1e-6);
  EXPECT_NEAR(sin[3][5].item<double>(), std::sin(angle), 1e-6);
}

TEST(LlamaConfig, ReadsHFConfigJson) {
  const std::string path = testing::TempDir() + "llama_config.json";
  std::ofstream(path) << R"({"hidden_size": 128, "num_hidden_layers": 3, "num_attention_heads": 8,
    "num_key_value_heads": 2, "intermediate_size": 320, "vocab_size": 512, "rope_theta": 500000.0,
    "rms_norm_eps": 1e-05, "tie_word_embeddings": true, "architectures": ["LlamaForCausalLM"]})";
  auto c = llama::config_from_hf_json(path);
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.intermediate_size, 320);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_THROW(llama::config_from_hf_json(testing::TempDir() + "missing.json"), dtensor::Error);
}

// DTENSOR_MODULE: the holder's call runs the module's pre-hooks and hooks around Impl::forward.
struct TwoInputsImpl : torch::nn::Module {
  at::Tensor forward(const at::Tensor& x, const at::Tensor& y) { return y.defined() ? x + y : x; }
};
DTENSOR_MODULE(TwoInputs);

TEST(HookedModule, CallRunsHooksAroundForward) {
  TwoInputs m;
  EXPECT_TRUE(m(at::ones({2}), at::ones({2})).equal(at::full({2}, 2.0)));
  EXPECT_TRUE(m(at::ones({2}), at::Tensor()).equal(at::ones({2})));  // an absent optional input
  dtensor::nn::register_forward_pre_hook(*m, [](torch::nn::Module&, dtensor::nn::Tensors xs) {
    xs[1] = xs[1] * 10;
    return xs;
  });
  dtensor::nn::register_forward_hook(*m, [](torch::nn::Module&, const dtensor::nn::Tensors&, at::Tensor y) { return y + 1; });
  EXPECT_TRUE(m(at::ones({2}), at::ones({2})).equal(at::full({2}, 12.0)));
}

// A TP degree that divides neither way: one error naming the module and the sizes, before any weight moves.
TEST(LlamaPlans, IndivisibleTPDegreeFailsAtPlanTime) {
  auto c = llama_test::small_options().model;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 3;
  c.hidden_size = 48;
  std::string err = dtensor::testing::error_of([&] { llama::torchtitan_plan(c, 4); });
  EXPECT_NE(err.find("'model.layers.*.self_attn.q_proj' has 6 query heads, not divisible by the TP degree 4"), std::string::npos) << err;
  c.num_attention_heads = 12;  // 12 % 4 == 0, but 3 kv heads and 4 divide neither way
  err = dtensor::testing::error_of([&] { llama::torchtitan_plan(c, 4); });
  EXPECT_NE(err.find("'model.layers.*.self_attn.k_proj' has 3 key/value heads and the TP degree is 4"), std::string::npos) << err;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 1;  // 1 kv head, TP 2: replicated, fine; HF's plan refuses it
  EXPECT_NO_THROW(llama::torchtitan_plan(c, 2));
  err = dtensor::testing::error_of([&] { llama::hf_plan(c, 2); });
  EXPECT_NE(err.find("k_proj' has 1 key/value heads, not divisible by the TP degree 2"), std::string::npos) << err;
  // Nothing moved: apply_tp on ranks fails before distributing a weight.
  c.num_key_value_heads = 3;
  c.num_attention_heads = 12;
  dtensor::testing::run_ranks(4, [&](int, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world});
    llama::LlamaForCausalLM model(c);
    EXPECT_THROW(llama::apply_tp(model, mesh), dtensor::Error);
    for (const auto& p : model->parameters()) EXPECT_FALSE(dtensor::is_dtensor(p));
  });
}

// Bad values: one error line on rank 0, exit 2 on every rank (tprun reports the first), no hang.
TEST(LlamaTrainCli, BadValuesExitTwoWithOneErrorLine) {
  using dtensor::testing::bin_path;
  using dtensor::testing::run_process;
  const std::vector<std::vector<std::string>> bad = {{"--steps", "0"}, {"--heads", "3"}, {"--data", "/nonexistent/file.txt"},
                                                     {"--seq-len", "7"}, {"--plan", "megatron"}, {"--bogus"},
                                                     {"--mixed-precision", "fp16"}, {"--mixed-precision", "fp8"},
                                                     {"--dtype", "bfloat16"},  // bf16 masters under mixed precision
                                                     {"--float8-recipe", "rowwise"},  // needs --float8
                                                     {"--float8", "--async-tp"},
                                                     {"--float8", "--float8-matmul", "fast"},
                                                     {"--float8-matmul", "emulated"}};  // needs --float8
  for (const auto& args : bad) {
    std::vector<std::string> argv = {bin_path("llama_train")};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = run_process(argv, {{"RANK", "0"}, {"WORLD_SIZE", "2"}}, 60);
    EXPECT_EQ(r.exit_code, 2) << args[0] << ": " << r.output;
    EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    auto r1 = run_process(argv, {{"RANK", "1"}, {"WORLD_SIZE", "2"}}, 60);
    EXPECT_EQ(r1.exit_code, 2) << args[0];
    EXPECT_EQ(r1.output, "") << args[0];
  }
  auto help = run_process({bin_path("llama_train"), "--help"}, {{"RANK", "0"}, {"WORLD_SIZE", "1"}}, 60);
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("--kv-heads N"), std::string::npos);
}

}  // namespace
