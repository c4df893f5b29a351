// Generation (llama/generate.h) on randomly initialised weights, the same at every TP degree (built from one
// seed, then sharded by llama::inference_plan): greedy tokens identical at TP 1, 2 and 4 for a batch of
// left-padded prompts; every step's logits equal to the uncached full forward; collectives per decoded token
// equal to the plan's; the cache holds only this rank's heads and is allocated once; seeded sampling draws
// the same tokens on every rank; per-sequence stop at the end token.
#include <gtest/gtest.h>

#include <c10/core/GradMode.h>

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>

#include "dtensor/core/error.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/debug/comm_debug_mode.h"
#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"
#include "harness/subprocess.h"
#include "inference/generate.h"
#include "inference/kv_cache.h"
#include "llama/parallelize.h"
#include "models/llama_test_util.h"

namespace {

using dtensor::testing::error_of;
using dtensor::testing::run_ranks;

constexpr uint64_t kSeed = 11;

llama::LlamaConfig config() { return llama_test::small_options().model; }  // 2 kv heads: replicated at TP 4

// Prompts of lengths 5, 2 and 7 (left padding up to 7).
const std::vector<std::vector<int64_t>> kPrompts = {{72, 101, 108, 108, 111}, {84, 104}, {32, 116, 104, 101, 32, 109, 111}};

llama::LlamaForCausalLM make_model(int tp, const dtensor::DeviceMesh* mesh) {
  llama::LlamaForCausalLM model(config());
  model->init_weights(kSeed);
  if (tp > 1) llama::apply_inference_tp(model, *mesh);
  return model;
}

// Runs `body(model, rank)` at TP `tp` (ranks as threads; tp 1: the plain model, no mesh).
void at_tp(int tp, const std::function<void(llama::LlamaForCausalLM&, int)>& body) {
  if (tp == 1) {
    auto model = make_model(1, nullptr);
    body(model, 0);
    return;
  }
  run_ranks(tp, [&](int rank, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world});
    auto model = make_model(tp, &mesh);
    body(model, rank);
  }, {.run_timeout = std::chrono::milliseconds(300000)});
}

double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

// The uncached forward of the plain model over prompt + new tokens; logits [b, T, vocab].
struct FullForward {
  at::Tensor logits;
  int64_t prompt_length;
};
FullForward full_forward(const std::vector<std::vector<int64_t>>& prompts, const std::vector<std::vector<int64_t>>& out) {
  auto model = make_model(1, nullptr);
  at::NoGradGuard no_grad;
  inference::Decoder d(model, prompts, 1, 0, /*use_cache=*/false);
  at::Tensor tokens = d.tokens(), mask = d.attention_mask();
  std::vector<int64_t> cols(prompts.size());
  for (size_t j = 0; j + 1 < out[0].size(); ++j) {
    for (size_t i = 0; i < prompts.size(); ++i) cols[i] = out[i][j];
    at::Tensor c = at::tensor(cols, at::kLong).view({-1, 1});
    tokens = at::cat({tokens, c}, 1);
    mask = at::cat({mask, at::ones_like(c)}, 1);
  }
  return {model(tokens, mask), d.prompt_length()};
}

TEST(LlamaGenerate, GreedyTokensEqualAtTP124AndStepLogitsEqualTheUncachedForward) {
  inference::GenerateOptions options;
  options.max_new_tokens = 8;
  options.keep_logits = true;
  std::map<int, inference::GenerateResult> results;
  std::mutex mu;
  for (int tp : {1, 2, 4}) {
    at_tp(tp, [&](llama::LlamaForCausalLM& model, int rank) {
      auto r = inference::generate(model, kPrompts, options);
      std::lock_guard<std::mutex> lock(mu);
      if (rank == 0) results[tp] = r;
    });
  }
  const auto full = full_forward(kPrompts, results[1].new_tokens);
  for (int tp : {1, 2, 4}) {
    const auto& r = results[tp];
    EXPECT_EQ(r.new_tokens, results[1].new_tokens) << "TP " << tp;
    ASSERT_EQ(r.step_logits.size(), 8u);
    for (int64_t j = 0; j < 8; ++j) {
      at::Tensor want = full.logits.select(1, full.prompt_length - 1 + j);
      EXPECT_LE(rel_diff(r.step_logits[j], want), 1e-5) << "TP " << tp << " step " << j;
    }
  }
  // The naive reference (no cache: the whole sequence every step) draws the same tokens.
  inference::GenerateOptions naive = options;
  naive.use_cache = false;
  auto model = make_model(1, nullptr);
  EXPECT_EQ(inference::generate(model, kPrompts, naive).new_tokens, results[1].new_tokens);
}

// A batched sequence generates what it generates alone: left padding and the mask hide the others.
TEST(LlamaGenerate, BatchedPromptsGenerateWhatEachGeneratesAlone) {
  inference::GenerateOptions options;
  options.max_new_tokens = 6;
  auto model = make_model(1, nullptr);
  const auto batched = inference::generate(model, kPrompts, options).new_tokens;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EXPECT_EQ(inference::generate(model, {kPrompts[i]}, options).new_tokens[0], batched[i]) << "prompt " << i;
  }
}

// Each sequence stops at its end token; the others go on; the callback sees -1 for a finished sequence.
TEST(LlamaGenerate, SequenceStopsAtItsEndToken) {
  inference::GenerateOptions options;
  options.max_new_tokens = 6;
  auto model = make_model(1, nullptr);
  const auto free_run = inference::generate(model, kPrompts, options).new_tokens;
  options.eos_token_id = free_run[1][2];  // sequence 1's third token
  std::vector<std::vector<int64_t>> seen;
  const auto r = inference::generate(model, kPrompts, options, [&](int64_t, const std::vector<int64_t>& t) { seen.push_back(t); });
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    auto stop = std::find(free_run[i].begin(), free_run[i].end(), *options.eos_token_id);
    std::vector<int64_t> want(free_run[i].begin(), stop == free_run[i].end() ? stop : stop + 1);
    EXPECT_EQ(r.new_tokens[i], want) << "sequence " << i;
  }
  ASSERT_GE(seen.size(), 4u);
  EXPECT_EQ(seen[3][1], -1);
}

// Per decoded token under the inference plan: one all-reduce after attention and one after the
// feed-forward per layer (o_proj, down_proj: Partial -> Replicate), and the logits' all-gather (lm_head
// Shard(-1) -> Replicate) of [b, 1, vocab]. The cache holds only this rank's key/value heads, allocated once.
TEST(LlamaGenerate, CollectivesPerDecodedTokenAreThePlans) {
  const auto c = config();
  const int64_t L = c.num_hidden_layers, b = static_cast<int64_t>(kPrompts.size());
  at_tp(2, [&](llama::LlamaForCausalLM& model, int) {
    at::NoGradGuard no_grad;
    inference::Decoder decoder(model, kPrompts, 4);
    at::Tensor logits = decoder.prefill();
    const auto& cache = dynamic_cast<const inference::KVCache&>(*decoder.context().kv_caches.at(0));
    const at::Tensor keys = cache.keys();
    ASSERT_TRUE(dtensor::is_dtensor(keys));
    EXPECT_EQ(dtensor::placements(keys), dtensor::Placements{dtensor::Shard(1)});
    EXPECT_EQ(dtensor::to_local(keys).sizes(), (std::vector<int64_t>{b, c.num_key_value_heads / 2, 7 + 4, c.head_dim()}));
    const void* storage = dtensor::to_local(keys).data_ptr();
    for (int step = 0; step < 3; ++step) {
      dtensor::CommDebugMode comm;
      logits = decoder.step(logits.argmax(-1));
      auto counts = comm.get_comm_counts();
      EXPECT_EQ(counts["all_reduce"], 2 * L) << comm.table();
      EXPECT_EQ(counts["all_gather"], 1) << comm.table();
      EXPECT_EQ(comm.get_total_counts(), 2 * L + 1) << comm.table();
      EXPECT_EQ(comm.get_comm_bytes()["all_reduce"], 2 * L * b * c.hidden_size * 4);  // [b, 1, hidden] fp32
    }
    EXPECT_EQ(cache.length(), 7 + 3);
    EXPECT_EQ(dtensor::to_local(cache.keys()).data_ptr(), storage);  // no reallocation
    EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{b, c.vocab_size}));
    EXPECT_FALSE(dtensor::is_dtensor(logits));
  });
}

// Temperature / top-k / top-p with a seed: every rank draws the same tokens (no collective beyond the
// logits), the same as TP 1; another seed draws others; top_k 1 is greedy.
TEST(LlamaGenerate, SeededSamplingIsTheSameOnEveryRankAndTP) {
  inference::GenerateOptions options;
  options.max_new_tokens = 12;
  options.sampling = {.temperature = 1.0, .top_k = 50, .top_p = 0.95, .seed = 3};
  std::vector<std::vector<std::vector<int64_t>>> per_rank(2);
  at_tp(2, [&](llama::LlamaForCausalLM& model, int rank) { per_rank[rank] = inference::generate(model, kPrompts, options).new_tokens; });
  EXPECT_EQ(per_rank[0], per_rank[1]);
  auto model = make_model(1, nullptr);
  EXPECT_EQ(inference::generate(model, kPrompts, options).new_tokens, per_rank[0]);
  auto other = options;
  other.sampling.seed = 4;
  EXPECT_NE(inference::generate(model, kPrompts, other).new_tokens, per_rank[0]);
  auto top1 = options;
  top1.sampling.top_k = 1;
  inference::GenerateOptions greedy;
  greedy.max_new_tokens = 12;
  EXPECT_EQ(inference::generate(model, kPrompts, top1).new_tokens, inference::generate(model, kPrompts, greedy).new_tokens);
}

TEST(LlamaSampling, TopKAndTopPKeepTheExpectedTokens) {
  // probabilities 0.5, 0.25, 0.125, 0.125 (log-space logits)
  at::Tensor logits = at::log(at::tensor({0.125f, 0.5f, 0.125f, 0.25f})).view({1, 4});
  auto kept = [&](inference::SamplingOptions o) {
    at::Tensor f = inference::Sampler(o).filtered_logits(logits);
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < 4; ++i) if (std::isfinite(f[0][i].item<float>())) ids.push_back(i);
    return ids;
  };
  EXPECT_EQ(kept({.temperature = 1.0, .top_k = 2}), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(kept({.temperature = 1.0, .top_p = 0.7}), (std::vector<int64_t>{1, 3}));   // 0.5 + 0.25 reaches 0.7
  EXPECT_EQ(kept({.temperature = 1.0, .top_p = 0.4}), (std::vector<int64_t>{1}));      // the top token alone
  EXPECT_EQ(kept({.temperature = 1.0}), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_NE(error_of([] { inference::Sampler({.temperature = 1.0, .top_p = 0.0}); }).find("top_p"), std::string::npos);
  EXPECT_NE(error_of([] { inference::Sampler({.top_k = -1}); }).find("top_k"), std::string::npos);
}

// Greedy over a batch splits the rows over threads: the tokens are argmax's own, ties (the first maximum), NaN (taken
// as the max), -inf rows, bf16 and fp16 (widened to fp32 first) included, at 1, 3 and 64 rows.
TEST(LlamaSampling, GreedyIsArgmaxOnEveryRow) {
  at::Tensor logits = at::randint(0, 4, {64, 1000}, at::TensorOptions().dtype(at::kFloat));  // many ties
  logits[3][700] = std::numeric_limits<float>::quiet_NaN();
  logits[3][7] = std::numeric_limits<float>::quiet_NaN();
  logits[5].fill_(-std::numeric_limits<float>::infinity());
  logits[6][9] = std::numeric_limits<float>::infinity();
  inference::Sampler greedy({});
  const at::Tensor bf16 = logits.to(at::kBFloat16);
  for (const at::Tensor& l : {logits, bf16, logits.to(at::kHalf), logits.narrow(0, 0, 3), logits.narrow(0, 5, 1),
                              bf16.narrow(0, 3, 1), bf16.narrow(0, 5, 1)}) {
    const at::Tensor tokens = greedy.sample(l);
    ASSERT_EQ(tokens.sizes(), l.argmax(-1).sizes());
    EXPECT_TRUE(tokens.equal(l.argmax(-1)));
  }
  EXPECT_EQ(greedy.sample(logits)[3].item<int64_t>(), 7);
  EXPECT_EQ(greedy.sample(logits)[5].item<int64_t>(), 0);
}

TEST(LlamaGenerate, BadPromptsRaiseOneClearError) {
  auto model = make_model(1, nullptr);
  inference::GenerateOptions options;
  EXPECT_NE(error_of([&] { inference::generate(model, {{1, 256}}, options); }).find("token id 256"), std::string::npos);
  EXPECT_NE(error_of([&] { inference::generate(model, {{1}, {}}, options); }).find("prompt 1 is empty"), std::string::npos);
}

// llama_generate: bad values (and weights not available yet) print one error line on rank 0 and exit 2 on
// every rank before any communication; a run at TP 2 through tprun ends with the summary line and draws
// the tokens TP 1 draws.
TEST(LlamaGenerateCli, BadValuesExitTwoWithOneErrorLine) {
  using dtensor::testing::bin_path;
  using dtensor::testing::run_process;
  const std::vector<std::vector<std::string>> bad = {
      {"--random-init"},                                      // no prompt
      {"--prompt", "a"},                                      // no weights
      {"--random-init", "--prompt-ids", "1,x"},
      {"--random-init", "--prompt-ids", "300"},               // outside the vocabulary
      {"--random-init", "--prompt", "a", "--top-p", "0"},
      {"--random-init", "--prompt", "a", "--heads", "3"},
      {"--random-init", "--prompt", "a", "--kv-heads", "3", "--heads", "6", "--dim", "96"},  // 3 kv heads at TP 2
      {"--random-init", "--prompt", "a", "--prompt", "b", "--batch", "4"},
      {"--checkpoint", "/tmp", "--prompt", "a"},              // not wired yet
      {"--random-init", "--prompt", "a", "--dtype", "float64"},  // not a dtype we compute in
      {"--random-init", "--prompt", "a", "--quantize", "int3"},  // not a quantization we have
      {"--random-init", "--prompt", "a", "--bogus"}};
  for (const auto& args : bad) {
    std::vector<std::string> argv = {bin_path("llama_generate")};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = run_process(argv, {{"RANK", "0"}, {"WORLD_SIZE", "2"}}, 60);
    EXPECT_EQ(r.exit_code, 2) << args.back() << ": " << r.output;
    EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    auto r1 = run_process(argv, {{"RANK", "1"}, {"WORLD_SIZE", "2"}}, 60);
    EXPECT_EQ(r1.exit_code, 2) << args.back();
  }
  auto help = run_process({bin_path("llama_generate"), "--help"}, {{"RANK", "0"}, {"WORLD_SIZE", "1"}}, 60);
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("--top-p X"), std::string::npos);
}

// A model whose parameters cannot fit (a random init of 1.9 trillion parameters: 3.8 TB in bf16) is refused from the
// meta model's per-rank bytes before anything is allocated: exit 2 with one error naming the sizes, at once.
TEST(LlamaGenerateCli, AModelTooLargeForMemoryIsRefusedBeforeLoading) {
  using dtensor::testing::bin_path;
  using dtensor::testing::run_process;
  auto r = run_process({bin_path("tprun"), "--nproc-per-node", "1", "--master-port", "0", "/usr/bin/time", "-f",
                        "maxrss_kb=%M", bin_path("llama_generate"), "--random-init", "--dtype", "bfloat16", "--dim",
                        "65536", "--layers", "64", "--heads", "64", "--kv-heads", "64", "--ffn-dim", "65536",
                        "--prompt", "a"},
                       {{"OMP_NUM_THREADS", "1"}}, 120);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("error: the model does not fit in memory: its parameters in bfloat16 need 3848.37 GB per rank"), std::string::npos)
      << r.output;
  const auto at = r.output.find("maxrss_kb=");
  ASSERT_NE(at, std::string::npos) << r.output;
  EXPECT_LT(std::stoll(r.output.substr(at + 10)), 1024 * 1024) << "refused after allocating: " << r.output;
}

TEST(LlamaGenerateCli, RunsUnderTprunAndEndsWithTheSummary) {
  using dtensor::testing::bin_path;
  using dtensor::testing::run_process;
  auto run = [](int tp) {
    return run_process({bin_path("tprun"), "--nproc-per-node", std::to_string(tp), "--master-port", "0",
                        bin_path("llama_generate"), "--random-init", "--seed", "2", "--dim", "64", "--layers", "2",
                        "--heads", "4", "--kv-heads", "2", "--ffn-dim", "128", "--prompt", "Hello", "--max-new-tokens", "6"},
                       {{"OMP_NUM_THREADS", "1"}}, 120);
  };
  auto tp2 = run(2), tp1 = run(1);
  // --dtype bfloat16: the same run in bf16 (parameters, activations, KV cache, collectives).
  auto bf16 = run_process({bin_path("tprun"), "--nproc-per-node", "2", "--master-port", "0", bin_path("llama_generate"),
                           "--random-init", "--dtype", "bfloat16", "--seed", "2", "--dim", "64", "--layers", "2",
                           "--heads", "4", "--kv-heads", "2", "--ffn-dim", "128", "--prompt", "Hello",
                           "--max-new-tokens", "6"},
                          {{"OMP_NUM_THREADS", "1"}}, 120);
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  EXPECT_NE(bf16.output.find("summary prompt_tokens=5 new_tokens=6"), std::string::npos) << bf16.output;
  // --quantize int8: the same run with int8 weights (torchao's numbers: tests/models/test_llama_quantized.cpp).
  auto int8 = run_process({bin_path("tprun"), "--nproc-per-node", "2", "--master-port", "0", bin_path("llama_generate"),
                           "--random-init", "--dtype", "bfloat16", "--quantize", "int8", "--seed", "2", "--dim", "64",
                           "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ffn-dim", "128", "--prompt", "Hello",
                           "--max-new-tokens", "6"},
                          {{"OMP_NUM_THREADS", "1"}}, 120);
  ASSERT_EQ(int8.exit_code, 0) << int8.output;
  EXPECT_NE(int8.output.find("summary prompt_tokens=5 new_tokens=6"), std::string::npos) << int8.output;
  EXPECT_NE(int8.output.find(" quantize=int8"), std::string::npos) << int8.output;
  ASSERT_EQ(tp2.exit_code, 0) << tp2.output;
  ASSERT_EQ(tp1.exit_code, 0) << tp1.output;
  EXPECT_NE(tp2.output.find("summary prompt_tokens=5 new_tokens=6 prefill_ms="), std::string::npos) << tp2.output;
  EXPECT_NE(tp2.output.find("ms_per_token="), std::string::npos);
  // The collectives' count and time on rank 0: at TP 2 every layer all-reduces (2 per layer per forward: attention's
  // o_proj and the MLP's down_proj) and lm_head gathers; at TP 1 there are none.
  auto field = [](const std::string& out, const std::string& key) {
    const auto at = out.find(" " + key + "=");
    return at == std::string::npos ? -1.0 : std::stod(out.substr(at + key.size() + 2));
  };
  EXPECT_GE(field(tp2.output, "collectives"), 6 * (2 * 2 + 1)) << tp2.output;  // >= 6 forwards x (2 layers x 2 + 1)
  EXPECT_GT(field(tp2.output, "comm_ms"), 0.0) << tp2.output;
  EXPECT_EQ(field(tp1.output, "collectives"), 0.0) << tp1.output;
  EXPECT_EQ(field(tp1.output, "comm_ms"), 0.0) << tp1.output;
  auto line = [](const std::string& out) { auto at = out.find("[0] Hello|"); return out.substr(at, out.find('\n', at) - at); };
  EXPECT_EQ(line(tp2.output), line(tp1.output));
}

}  // namespace
