// Continuous batching's paged forward (inference/paged_kv_cache.h; the step in the forward's context,
// common/forward_context.h) against the naive
// reference, inference::generate of each prompt alone: three sequences that join at different steps, one prefilled in
// chunks, sharing steps with others' decoding, their blocks interleaved and out of order in the pool; every
// step's logits equal generate's and the greedy tokens are the same, at TP 1, 2 and 4 (2 key/value heads:
// replicated at TP 4). A sliding-window config (Mistral's) and Gemma 2's soft-capping and alternating layers
// take the same check at TP 2. Each by both routes of the step's attention (paged_attention.h).
#include <gtest/gtest.h>

#include <c10/core/GradMode.h>

#include <map>

#include "../cuda/cuda_test_util.h"
#include "dtensor/core/error.h"
#include "dtensor/core/fast_kernels.h"
#include "dtensor/mesh/device_mesh.h"
#include "harness/multi_rank.h"
#include "inference/generate.h"
#include "inference/kv_cache.h"
#include "inference/paged_kv_cache.h"
#include "llama/parallelize.h"
#include "models/llama_test_util.h"

namespace {

using dtensor::testing::run_ranks;

constexpr uint64_t kSeed = 11;
constexpr int64_t kBlock = 4, kNew = 6;
const std::vector<std::vector<int64_t>> kPrompts = {{72, 101, 108, 108, 111, 32, 119}, {84, 104}, {32, 116, 104, 101, 32}};

llama::LlamaConfig plain_config() { return llama_test::small_options().model; }

llama::LlamaConfig sliding_config() {
  llama::LlamaConfig c = plain_config();
  c.attention.sliding_window = 3;  // shorter than the prompts: the window hides keys
  return c;
}

llama::LlamaConfig softcap_config() {  // Gemma 2's parts: soft-capping, sliding on every other layer, sandwich norms
  llama::LlamaConfig c = plain_config();
  c.attention.sliding_window = 4;
  c.attention.sliding_layers = {true, false};
  c.attention.attn_logit_softcapping = 30.0;
  c.scaling.final_logit_softcapping = 20.0;
  c.norm.placement = llama::LayerKind::sandwich;
  return c;
}

struct Reference {
  std::vector<std::vector<int64_t>> tokens;   // per prompt: greedy new tokens
  std::vector<std::vector<at::Tensor>> logits;  // per prompt, per step: [vocab]
};

Reference reference(const llama::LlamaConfig& config) {
  llama::LlamaForCausalLM model(config);
  model->init_weights(kSeed);
  Reference ref;
  for (const auto& prompt : kPrompts) {
    auto r = inference::generate(model, {prompt}, {.max_new_tokens = kNew, .keep_logits = true});
    ref.tokens.push_back(r.new_tokens[0]);
    std::vector<at::Tensor> steps;
    for (const auto& l : r.step_logits) steps.push_back(l[0]);
    ref.logits.push_back(steps);
  }
  return ref;
}

// A scheduler written out by hand: sequence 0 starts alone and is prefilled in two chunks (4 + 3 tokens);
// sequence 1 joins at step 1 beside sequence 0's second chunk; sequence 2 joins at step 2 while 0 and 1 decode.
// Blocks are handed out from the pool's end, so each sequence's blocks are interleaved with the others'.
// Returns per sequence the drawn tokens and the logits of each draw.
Reference paged_run(llama::LlamaForCausalLM& model, c10::Device device = c10::kCPU) {
  at::NoGradGuard no_grad;
  constexpr int64_t kBlocks = 16;
  auto cache = std::make_shared<inference::PagedKVCache>(model->config.num_hidden_layers, kBlocks, kBlock);
  const auto layers = cache->layers();
  int64_t next_block = kBlocks - 1;
  struct Seq {
    std::vector<int64_t> all;  // prompt + drawn
    int64_t computed = 0, prompt = 0, joins = 0;
    std::vector<int64_t> blocks;
  };
  std::vector<Seq> seqs;
  const int64_t joins[] = {0, 1, 2};
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    seqs.push_back({kPrompts[i], 0, static_cast<int64_t>(kPrompts[i].size()), joins[i], {}});
  }
  Reference out;
  out.tokens.resize(kPrompts.size());
  out.logits.resize(kPrompts.size());
  for (int64_t step = 0; step < 20; ++step) {
    std::vector<inference::PagedChunk> chunks;
    std::vector<size_t> who;
    for (size_t i = 0; i < seqs.size(); ++i) {
      Seq& s = seqs[i];
      if (step < s.joins || static_cast<int64_t>(out.tokens[i].size()) == kNew) continue;
      // Sequence 0's prompt in chunks of 4 tokens; everyone else computes all it has.
      const int64_t total = static_cast<int64_t>(s.all.size());
      const int64_t n = (i == 0 && s.computed < s.prompt) ? std::min<int64_t>(4, total - s.computed) : total - s.computed;
      while (static_cast<int64_t>(s.blocks.size()) * kBlock < s.computed + n) s.blocks.push_back(next_block--);
      std::vector<int64_t> toks(s.all.begin() + s.computed, s.all.begin() + s.computed + n);
      chunks.push_back({toks, s.computed, s.blocks, s.computed + n == total});
      who.push_back(i);
      s.computed += n;
    }
    if (chunks.empty()) break;
    inference::PagedStep packed = inference::pack_step(chunks, kBlock);
    for (at::Tensor* t : {&packed.tokens, &packed.positions, &packed.query_seq, &packed.write_slots, &packed.key_slots,
                          &packed.key_pos, &packed.key_seq, &packed.logit_rows}) {
      *t = t->to(device);
    }
    const models::ForwardContext context{layers, &packed};
    const models::ForwardContextGuard on(context);
    at::Tensor hidden = model->model(packed.tokens.view({1, -1}));                     // [1, T, hidden]
    at::Tensor logits = model->logits(hidden.index_select(1, packed.logit_rows))[0];  // [n_out, vocab]
    int64_t row = 0;
    for (size_t j = 0; j < chunks.size(); ++j) {
      if (!chunks[j].logits) continue;
      const size_t i = who[j];
      at::Tensor l = logits[row++].to(at::kCPU);
      const int64_t token = l.argmax().item<int64_t>();
      out.logits[i].push_back(l.clone());
      out.tokens[i].push_back(token);
      seqs[i].all.push_back(token);
    }
  }
  return out;
}

void expect_matches(const Reference& got, const Reference& want, const std::string& label, double tol = 2e-5) {
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EXPECT_EQ(got.tokens[i], want.tokens[i]) << label << " sequence " << i;
    ASSERT_EQ(got.logits[i].size(), want.logits[i].size()) << label;
    for (size_t j = 0; j < want.logits[i].size(); ++j) {
      const double diff = (got.logits[i][j] - want.logits[i][j]).abs().max().item<double>() /
                          want.logits[i][j].abs().max().item<double>();
      EXPECT_LT(diff, tol) << label << " sequence " << i << " step " << j;
    }
  }
}

void check_route_at_tp(const llama::LlamaConfig& config, int tp, const std::string& label, const Reference& want);

// Both routes of a paged step's attention (inference/paged_attention.h): from the pool, each sequence over its own
// blocks (fast kernels on: the AVX2 kernel for these short chunks), and the reference's gather under a block-diagonal
// mask (fast kernels off).
void check_at_tp(const llama::LlamaConfig& config, int tp, const std::string& label) {
  const Reference want = reference(config);
  for (bool fast : {true, false}) {
    const dtensor::FastKernelsGuard route(fast);
    check_route_at_tp(config, tp, label + (fast ? " (attention from the pool)" : " (reference mask)"), want);
  }
}

void check_route_at_tp(const llama::LlamaConfig& config, int tp, const std::string& label, const Reference& want) {
  if (tp == 1) {
    llama::LlamaForCausalLM model(config);
    model->init_weights(kSeed);
    expect_matches(paged_run(model), want, label + " tp=1");
    return;
  }
  std::map<int, Reference> got;
  std::mutex mu;
  run_ranks(tp, [&](int rank, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world});
    llama::LlamaForCausalLM model(config);
    model->init_weights(kSeed);
    llama::apply_inference_tp(model, mesh);
    Reference r = paged_run(model);
    std::lock_guard<std::mutex> lock(mu);
    got[rank] = r;
  }, {.run_timeout = std::chrono::milliseconds(300000)});
  for (const auto& [rank, r] : got) expect_matches(r, want, label + " tp=" + std::to_string(tp) + " rank " + std::to_string(rank));
}

TEST(PagedGenerate, ContinuousBatchingLogitsEqualGenerateAloneAtTP124) {
  for (int tp : {1, 2, 4}) check_at_tp(plain_config(), tp, "llama");
}

TEST(PagedGenerate, SlidingWindowAndSoftcappingEqualGenerateAlone) {
  check_at_tp(sliding_config(), 2, "sliding window");
  check_at_tp(softcap_config(), 2, "gemma2 parts");
}

// On the GPU (TP 1): the paged cache's index_copy_ / index_select on CUDA tensors, against generate on the CPU
// (cuBLAS against the CPU's kernels: fp32 rounding apart). Skipped (not passed) where no GPU is usable.
TEST(PagedGenerate, OnTheGpuEqualsGenerateOnTheCpu) {
  DTENSOR_REQUIRE_GPU();
  const Reference want = reference(plain_config());
  llama::LlamaForCausalLM model(plain_config());
  model->init_weights(kSeed);
  model->to(c10::Device(c10::kCUDA, 0));
  expect_matches(paged_run(model, c10::Device(c10::kCUDA, 0)), want, "cuda", 1e-4);
}

TEST(PagedGenerate, PackStepRefusesShortBlockTablesAndRopeThatFollowsLength) {
  EXPECT_THROW(inference::pack_step({{{1, 2, 3, 4, 5}, 0, {0}, true}}, kBlock), dtensor::Error);
  EXPECT_THROW(inference::pack_step({{{}, 0, {0}, true}}, kBlock), dtensor::Error);
  llama::LlamaConfig c = plain_config();
  c.rotary.rope_scaling.rope_type = "dynamic";
  c.rotary.rope_scaling.factor = 2.0;
  llama::LlamaForCausalLM model(c);
  auto cache = std::make_shared<inference::PagedKVCache>(c.num_hidden_layers, 4, kBlock);
  try {
    const inference::PagedStep step = inference::pack_step({{{1, 2}, 0, {0}, true}}, kBlock);
    const models::ForwardContext context{cache->layers(), &step};
    const models::ForwardContextGuard on(context);
    model->model(step.tokens.view({1, -1}));
    FAIL() << "no error";
  } catch (const dtensor::Error& e) {
    EXPECT_NE(std::string(e.what()).find("continuous batching"), std::string::npos) << e.what();
  }
}

// The model holds no cache: a forward's context brings it, and one that does not fit the model is one clear error.
TEST(PagedGenerate, AForwardContextThatDoesNotFitTheModelIsOneClearError) {
  at::NoGradGuard no_grad;
  llama::LlamaConfig c = plain_config();
  llama::LlamaForCausalLM model(c);
  const at::Tensor tokens = at::tensor({1, 2, 3}, at::kLong).view({1, 3});
  auto expect_error = [&](const models::ForwardContext& context, const std::string& needle) {
    const models::ForwardContextGuard on(context);
    try {
      model->model(tokens);
      FAIL() << "no error for " << needle;
    } catch (const dtensor::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto dense = inference::make_kv_caches(c, 8);
  expect_error({{dense.begin(), dense.end() - 1}}, "KV caches for");
  auto cache = std::make_shared<inference::PagedKVCache>(c.num_hidden_layers, 4, kBlock);
  expect_error({cache->layers()}, "paged (or missing) KV caches without a PagedStep");
  const inference::PagedStep step = inference::pack_step({{{1, 2, 3}, 0, {0}, true}}, kBlock);
  expect_error({dense, &step}, "PagedStep beside dense");
  expect_error({{}, &step}, "a PagedStep but no paged KV caches");
  // The same model, no context: the training forward; with dense caches, generation (outside any context afterwards).
  const at::Tensor plain = model->model(tokens);
  {
    const models::ForwardContext context{dense};
    const models::ForwardContextGuard on(context);
    EXPECT_TRUE(at::allclose(model->model(tokens), plain, 1e-5, 1e-6));
    EXPECT_EQ(context.past(), 3);
  }
  EXPECT_EQ(models::forward_context(), nullptr);
}

}  // namespace
