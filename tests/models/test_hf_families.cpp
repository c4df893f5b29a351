// Real Hugging Face checkpoints of each family and feature, run as transformers runs them.
// tests/oracle/hf_family_oracle.py makes them (once per process, all cases in one Python run) with
// transformers' own config classes and save_pretrained, and records HF's logits and greedy tokens. Checked:
//   - logits at TP 1, TP 2 (hf and torchtitan plans) and TP 4 (torchtitan: key/value heads replicated) equal
//     HF's to 1e-5 relative at every real (unpadded) position of a left-padded batch; the vocabulary (301) is
//     uneven at TP 2 and 4, so embed_tokens, lm_head and loss parallel run on uneven shards;
//   - greedy tokens at TP 1 and 2 (the inference plan), for one prompt and a left-padded batch, equal HF's;
//   - a mixture of experts also under expert parallelism (generation's: the batch on every rank): logits and
//     greedy tokens at EP 2 and 4;
//   - our export (save_hf_llama at TP 2) loads back in transformers with the same logits;
//   - a short fine-tune (llama_train --hf-dir) gives the same losses at TP 2 as at TP 1;
//   - config.json checks: unknown families, unknown fields, a wrong architecture are one clear error.
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <nlohmann/json.hpp>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/fast_kernels.h"
#include "dtensor/debug/comm_debug_mode.h"
#include "dtensor/checkpoint/safetensors.h"
#include "dtensor/mesh/device_mesh.h"
#include "harness/multi_rank.h"
#include "harness/subprocess.h"
#include "inference/generate.h"
#include "inference/kv_cache.h"
#include "llama/hf_config.h"
#include "llama/hf_weights.h"
#include "llama/parallelize.h"
#include "hf_family_cases.h"
#include "llama_test_util.h"
#include "alloc_counter.h"
#include "harness/temp_dir.h"

namespace fs = std::filesystem;
namespace ckpt = dtensor::checkpoint;
using dtensor::testing::ProcessResult;
using dtensor::testing::run_process;
using namespace hf_cases;

namespace {

class HfFamily : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFamily, LogitsEqualTransformersAtTp1Tp2Tp4) {
  const std::string dir = root() + "/" + GetParam();
  const Reference ref = reference(GetParam());
  const llama::LlamaConfig config = llama::config_from_hf_json(dir + "/config.json");
  std::vector<std::pair<int, std::string>> runs = {{1, "hf"}, {2, "hf"}, {2, "torchtitan"}, {4, "torchtitan"}};
  // A mixture of experts also under expert parallelism: experts split whole over 2 and 4 ranks, tokens sent
  // to them by all_to_all.
  if (config.moe.num_experts > 0) runs.insert(runs.end(), {{2, "ep"}, {4, "ep"}});
  for (const auto& [tp, plan] : runs) {
    if (plan == "hf" && config.num_key_value_heads % tp != 0) continue;  // HF's plan does not replicate kv heads
    const double rel = masked_rel(llama_test::pretrained_logits(dir, tp, plan, ref.tokens, ref.mask), ref.logits, ref.mask);
    std::printf("%s world=%d plan=%s max_rel=%.3e\n", GetParam().c_str(), tp, plan.c_str(), rel);
    EXPECT_LE(rel, 1e-5) << GetParam() << " TP " << tp << " plan " << plan;
  }
}

TEST_P(HfFamily, GreedyTokensEqualTransformersForOnePromptAndALeftPaddedBatch) {
  const std::string dir = root() + "/" + GetParam();
  const Reference ref = reference(GetParam());
  const int64_t n = ref.greedy_one.size(1);
  std::vector<std::pair<int, std::string>> runs = {{1, "inference"}, {2, "inference"}};
  if (llama::config_from_hf_json(dir + "/config.json").moe.num_experts > 0) runs.insert(runs.end(), {{2, "ep"}, {4, "ep"}});
  for (const auto& [world, plan] : runs) {
    EXPECT_TRUE(at::equal(greedy_at(dir, world, prompts_of(ref.prompt, at::ones_like(ref.prompt)), n, plan), ref.greedy_one))
        << GetParam() << " one prompt, " << plan << " on " << world;
    EXPECT_TRUE(at::equal(greedy_at(dir, world, prompts_of(ref.batch, ref.batch_mask), n, plan), ref.greedy_batch))
        << GetParam() << " left-padded batch, " << plan << " on " << world;
  }
}

// bfloat16 (--dtype bfloat16; fp32 files cast on load, as from_pretrained(dtype=torch.bfloat16)) against
// transformers in bfloat16 with its default attention (sdpa; eager for Gemma 2's soft-cap). At TP 1 with the reference
// kernels our ops are transformers' ops in the same order and dtypes: logits and greedy tokens equal bit for bit; the
// fast decode matmul (dtensor/core/fast_kernels.h: decode steps, and on AVX2 CPUs prefills of up to 64 rows too) sums
// the same products in another order, so its logits and tokens are held to the bound below. At TP 2 the
// row-parallel matmuls round each rank's partial sum to bf16 before the all-reduce adds them (as PyTorch's TP in
// bf16 does), so within a measured bound: max |ours - HF| over the real positions <= kBf16Rel x max |logit| (worst
// measured 3.0e-2, Gemma 2's soft-caps), and greedy tokens equal HF's on each row up to the first step whose HF
// top-1/top-2 margin is under 2 x that bound (where either token is a correct bf16 answer); the steps compared are
// printed.
constexpr double kBf16Rel = 5e-2;

TEST_P(HfFamily, Bf16LogitsAndGreedyTokensAgreeWithTransformersBf16) {
  const std::string dir = root() + "/" + GetParam();
  const Reference ref = reference(GetParam());
  const llama::LlamaConfig config = llama::config_from_hf_json(dir + "/config.json");
  for (int tp : {1, 2}) {
    // A mixture of experts at 2 ranks under expert parallelism: its dense layers run whole on each rank, so nothing
    // is rounded differently before a router. (Under TP, the row-parallel sums' rounding flips a near-tie route of
    // mixtral's fixture, routing gap 1e-3, and that position's logits move by 0.19 of the largest: bf16's answer
    // there is either expert.)
    const std::string plan = tp > 1 && config.moe.num_experts > 0 ? "ep" : config.num_key_value_heads % tp == 0 ? "hf" : "torchtitan";
    // With the fast kernels (the default), then at TP 1 with the reference kernels: PyTorch's ops, bit for bit.
    const double rel = masked_rel(llama_test::pretrained_logits(dir, tp, plan, ref.tokens, ref.mask, "bfloat16"),
                                  ref.logits_bf16, ref.mask);
    std::printf("%s bf16 TP %d max_rel=%.3e (fast kernels: %s)\n", GetParam().c_str(), tp, rel, dtensor::bf16_linear_kernel());
    EXPECT_LE(rel, kBf16Rel) << GetParam() << " bf16 TP " << tp;
    if (tp == 1) {
      const dtensor::FastKernelsGuard reference(false);
      EXPECT_EQ(masked_rel(llama_test::pretrained_logits(dir, tp, plan, ref.tokens, ref.mask, "bfloat16"), ref.logits_bf16,
                           ref.mask),
                0.0)
          << GetParam() << " bf16 TP 1, reference kernels";
    }
  }
  const double margin = 2 * kBf16Rel * (ref.logits_bf16 * ref.mask.unsqueeze(-1)).abs().max().item<double>();
  auto compare = [&](const at::Tensor& got, const at::Tensor& want, const at::Tensor& gaps, const std::string& what, bool exact) {
    int64_t compared = 0;
    for (int64_t r = 0; r < want.size(0); ++r) {
      // Exact: every step (the logits are HF's bit for bit); else while HF's margin exceeds the bound.
      for (int64_t s = 0; s < want.size(1) && (exact || gaps[r][s].item<double>() >= margin); ++s, ++compared) {
        ASSERT_EQ(got[r][s].item<int64_t>(), want[r][s].item<int64_t>()) << GetParam() << " " << what << " row " << r
                                                                         << " step " << s;
      }
    }
    std::printf("%s bf16 greedy %s: %lld of %lld steps compared (%s), all equal\n", GetParam().c_str(), what.c_str(),
                static_cast<long long>(compared), static_cast<long long>(want.numel()),
                exact ? "every step" : ("past the margin " + std::to_string(margin)).c_str());
  };
  const int64_t n = ref.greedy_one_bf16.size(1);
  // TP 1 with the reference kernels (PyTorch's, as transformers): bit-equal. TP 1 and 2 with the fast decode matmul
  // (dtensor/core/fast_kernels.h: the same products summed in another order): within the bound.
  for (const auto& [world, fast] : {std::pair{1, false}, {1, true}, {2, true}}) {
    dtensor::FastKernelsGuard kernels(fast);
    const std::string run = "TP " + std::to_string(world) + (fast ? " fast kernels" : " reference kernels");
    compare(greedy_at(dir, world, prompts_of(ref.prompt, at::ones_like(ref.prompt)), n, "inference", "bfloat16"),
            ref.greedy_one_bf16, ref.gaps_one_bf16, "one prompt, " + run, !fast);
    compare(greedy_at(dir, world, prompts_of(ref.batch, ref.batch_mask), n, "inference", "bfloat16"),
            ref.greedy_batch_bf16, ref.gaps_batch_bf16, "left-padded batch, " + run, !fast);
  }
}

// The cases are the oracle's (hf_family_oracle.py list), read when the tests are registered.
INSTANTIATE_TEST_SUITE_P(Cases, HfFamily, ::testing::ValuesIn(case_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// Mistral's window (5) in the KV cache: each layer keeps the last 4 positions, under TP 2 too, and the cached
// decode's logits equal the naive reference's (the whole sequence every step, no cache).
TEST(HfFamilies, SlidingWindowCacheKeepsTheWindowOnly) {
  const std::string dir = root() + "/mistral";
  const Reference ref = reference("mistral");
  const auto prompts = prompts_of(ref.batch, ref.batch_mask);
  dtensor::testing::run_ranks(2, [&](int, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world});
    llama::LlamaForCausalLM model = llama::from_pretrained(dir, &mesh, "inference");
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> got;
    {
      inference::Decoder cached(model, prompts, 6, 0, /*use_cache=*/true);
      got.push_back(cached.prefill());
      for (int step = 0; step < 5; ++step) got.push_back(cached.step(got.back().argmax(-1)));
      ASSERT_EQ(cached.context().kv_caches.size(), model->model->layers->size());
      for (const auto& layer_cache : cached.context().kv_caches) {
        const auto& cache = dynamic_cast<const inference::KVCache&>(*layer_cache);
        EXPECT_EQ(cache.keys().size(2), 4);  // window - 1
        EXPECT_EQ(cache.length(), ref.batch.size(1) + 5);
      }
    }  // the decoder's caches go with it (the model holds none)
    inference::Decoder naive(model, prompts, 6, 0, /*use_cache=*/false);
    at::Tensor want = naive.prefill();
    for (int step = 0; step < 5; ++step) {
      EXPECT_LE((got[step] - want).abs().max().item<double>(), 1e-5 * want.abs().max().item<double>()) << step;
      want = naive.step(got[step].argmax(-1));
    }
  });
}

// The training forward (no cache, no padding) builds no mask: a sliding layer's window goes to the kernel as a
// keyword (dtensor::nn::AttentionKwargs), as under context parallelism. On the unpadded prompt (row 0: 20 tokens,
// windows of 5) its logits equal transformers' at TP 1 and TP 2.
TEST(HfFamilies, SlidingLayersWithoutAMaskEqualTransformers) {
  for (const std::string name : {"mistral", "qwen2_sliding", "gemma2", "gemma3", "cohere2", "phi3", "starcoder2"}) {
    const Reference ref = reference(name);
    ASSERT_EQ(ref.mask[0].sum().item<int64_t>(), ref.mask.size(1)) << name << ": row 0 is the unpadded prompt";
    for (const auto& [tp, plan] : std::vector<std::pair<int, std::string>>{{1, "hf"}, {2, "torchtitan"}}) {
      const at::Tensor got = llama_test::pretrained_logits(root() + "/" + name, tp, plan, ref.tokens.narrow(0, 0, 1));
      const double rel = masked_rel(got, ref.logits.narrow(0, 0, 1), ref.mask.narrow(0, 0, 1));
      EXPECT_LE(rel, 1e-5) << name << " TP " << tp;
    }
  }
}

// Phi-3's generate() recomputes the whole sequence once it passes original_max_position_embeddings (16 in
// phi3_longrope; the batch's width 9 plus 11 steps crosses it): with that, every cached step's logits equal
// the naive reference's (no cache: all positions with the frequencies of the current length, which is what
// transformers' recomputation gives); without it, the keys cached before the crossing keep the short factors.
TEST(HfFamilies, Phi3RecomputesPastOriginalMaxAsTransformers) {
  const Reference ref = reference("phi3_longrope");
  const auto prompts = prompts_of(ref.batch, ref.batch_mask);
  llama::LlamaForCausalLM model = llama::from_pretrained(root() + "/phi3_longrope");
  ASSERT_EQ(model->config.rotary.recompute_original_max, 16);
  at::NoGradGuard no_grad;
  auto run = [&](bool use_cache, bool recompute) {
    model->config.rotary.recompute_original_max = recompute ? 16 : 0;
    inference::Decoder decoder(model, prompts, 12, 0, use_cache);
    std::vector<at::Tensor> logits = {decoder.prefill()};
    for (int step = 0; step < 11; ++step) logits.push_back(decoder.step(ref.greedy_batch.select(1, step)));
    return logits;
  };
  const auto naive = run(false, true), with = run(true, true), without = run(true, false);
  double rel_with = 0, rel_without = 0;
  for (size_t i = 0; i < naive.size(); ++i) {
    const double scale = naive[i].abs().max().item<double>();
    rel_with = std::max(rel_with, (with[i] - naive[i]).abs().max().item<double>() / scale);
    rel_without = std::max(rel_without, (without[i] - naive[i]).abs().max().item<double>() / scale);
  }
  std::printf("phi3_longrope cached vs naive: with recomputation %.3e, without %.3e\n", rel_with, rel_without);
  EXPECT_LE(rel_with, 1e-5);
  EXPECT_GT(rel_without, 1e-2);
}

// save_hf_llama at TP 2 (each weight gathered once) for the cases whose config.json carries the most:
// transformers loads each export back and gets the reference logits.
TEST(HfFamilies, ExportLoadsBackInTransformers) {
  std::vector<std::string> args = {"check"};
  const std::string exports = dtensor::testing::temp_dir("hf_export");
  for (const std::string name : {"llama_tied", "llama_bias", "rope_llama3", "rope_yarn", "rope_longrope", "mistral",
                                 "qwen2_sliding", "qwen3", "gemma", "gemma2", "gemma3", "granite", "starcoder2", "olmo",
                                 "olmo2", "cohere", "cohere2", "phi3", "phi3_longrope", "glm", "mixtral", "qwen2_moe",
                                 "qwen3_moe"}) {
    const std::string exported = exports + "/export_" + name;  // root() is shared: read-only
    dtensor::testing::run_ranks(2, [&](int, int world) {
      auto mesh = dtensor::init_device_mesh("cpu", {world});
      llama::LlamaForCausalLM model = llama::from_pretrained(root() + "/" + name, &mesh, "hf");
      llama::save_hf_llama(exported, model);
    });
    // Our reader takes our export back as the same config.
    const auto back = llama::config_from_hf_json(exported + "/config.json");
    EXPECT_EQ(back.to_string(), llama::config_from_hf_json(root() + "/" + name + "/config.json").to_string()) << name;
    args.push_back(exported);
    args.push_back(root() + "/" + name + ".ref.safetensors");
  }
  const ProcessResult checked = oracle(args);
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
  std::printf("%s", checked.output.c_str());
}

// llama_train --hf-dir: a few steps of fine-tuning under the torchtitan plan (sequence parallel, loss parallel
// on the uneven vocabulary) give TP 1's losses at TP 2: tied embeddings, biases, q/k norms (per head and over
// all heads), sliding windows, soft-capping, sandwich / post / parallel norms, multipliers, clipping.
TEST(HfFamilies, FineTuneLossesAtTp2EqualTp1) {
  for (const std::string name : {"llama_tied", "llama_bias", "qwen2_sliding", "qwen3", "rope_yarn", "gemma2", "gemma3",
                                 "granite", "starcoder2", "olmo", "olmo2", "cohere2", "phi3", "glm", "mixtral",
                                 "qwen2_moe"}) {
    train::TrainOptions o = llama_test::small_options();
    o.hf_dir = root() + "/" + name;
    o.model = llama::config_from_hf_json(o.hf_dir + "/config.json");
    o.steps = 6;
    const auto tp1 = llama_test::run_tp(o, 1);
    const auto tp2 = llama_test::run_tp(o, 2);
    std::printf("%s fine-tune first loss %.6f last %.6f, tp2 max_rel %.3e\n", name.c_str(), tp1.losses.front(),
                tp1.losses.back(), llama_test::max_rel_diff(tp1.losses, tp2.losses));
    EXPECT_LE(llama_test::max_rel_diff(tp1.losses, tp2.losses), 1e-5) << name;
  }
}

std::string config_error(const std::string& json) {
  return dtensor::testing::error_of([&] { llama::config_from_hf_json_text(json, "test/config.json"); });
}

TEST(HfConfig, UnknownFamiliesFieldsAndArchitecturesAreOneClearError) {
  const std::string sizes = R"("vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "intermediate_size": 48)";
  EXPECT_NE(config_error(R"({"model_type": "dbrx", )" + sizes + "}").find("model_type 'dbrx' is not supported"),
            std::string::npos);
  EXPECT_NE(config_error(R"({"model_type": "mixtral", "num_local_experts": 4, "router_jitter_noise": 0.1, )" + sizes + "}")
                .find("router_jitter_noise"),
            std::string::npos);
  EXPECT_NE(config_error("{" + sizes + "}").find("no model_type"), std::string::npos);
  EXPECT_EQ(llama::config_from_hf_json_text(R"({"architectures": ["Qwen2ForCausalLM"], )" + sizes + "}").model_type, "qwen2");
  const std::string unknown = config_error(R"({"model_type": "llama", "logit_scale": 0.5, )" + sizes + "}");
  EXPECT_NE(unknown.find("'logit_scale'"), std::string::npos) << unknown;
  const std::string arch = config_error(R"({"model_type": "llama", "architectures": ["MistralForCausalLM"], )" + sizes + "}");
  EXPECT_NE(arch.find("MistralForCausalLM"), std::string::npos) << arch;
  EXPECT_NE(config_error(R"({"model_type": "llama", "hidden_act": "relu2", )" + sizes + "}").find("hidden_act 'relu2'"),
            std::string::npos);
  // The families' own refusals: what we do not implement is named, never run differently.
  EXPECT_NE(config_error(R"({"model_type": "gemma2", "use_bidirectional_attention": true, )" + sizes + "}")
                .find("'use_bidirectional_attention'"),
            std::string::npos);
  EXPECT_NE(config_error(R"({"model_type": "starcoder2", "residual_dropout": 0.1, )" + sizes + "}").find("'residual_dropout'"),
            std::string::npos);
  EXPECT_NE(config_error(R"({"model_type": "gemma3_text", "rope_parameters": {"full_attention": {"rope_type": "default",
            "rope_theta": 1e6}, "sliding_attention": {"rope_type": "linear", "factor": 2.0}}, )" + sizes + "}")
                .find("not supported for sliding layers"),
            std::string::npos);
  EXPECT_NE(config_error(R"({"model_type": "llama", "rope_parameters": {"rope_type": "su", "rope_theta": 1e4}, )" + sizes + "}")
                .find("rope_type 'su'"),
            std::string::npos);
  EXPECT_NE(config_error(R"({"model_type": "llama", "rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4}, )" + sizes + "}")
                .find("needs 'factor'"),
            std::string::npos);
  EXPECT_NE(config_error(R"({"model_type": "llama", "quantization_config": {"bits": 4}, )" + sizes + "}").find("quantization_config"),
            std::string::npos);
  // Known fields that do not change the numerics load.
  const auto ok = llama::config_from_hf_json_text(
      R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "pretraining_tp": 1, "use_cache": true,
          "torch_dtype": "bfloat16", "rope_scaling": {"type": "linear", "factor": 2.0}, "rope_theta": 5e5, )" + sizes + "}");
  EXPECT_EQ(ok.rotary.rope_scaling.rope_type, "linear");
  EXPECT_EQ(ok.rotary.rope_theta, 5e5);
}

llama::LlamaConfig read_config(const std::string& json) { return llama::config_from_hf_json_text(json, "test/config.json"); }

// Explicit nulls and absent keys read as transformers reads them (config_fuzz_vs_hf draws every field of every
// family; these are the cases that once loaded and answered differently).
TEST(HfConfig, NullsAndAbsentKeysReadAsTransformersReadsThem) {
  const std::string sizes = R"("vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                               "intermediate_size": 48)";
  // Gemma 2: a null soft-cap is off, an absent one the class default; our export of a cap-less model reads back
  // cap-less.
  const auto capless = read_config(R"({"model_type": "gemma2", "attn_logit_softcapping": null,
                                       "final_logit_softcapping": null, )" + sizes + "}");
  EXPECT_EQ(capless.attention.attn_logit_softcapping, 0.0);
  EXPECT_EQ(capless.scaling.final_logit_softcapping, 0.0);
  const auto defaults = read_config(R"({"model_type": "gemma2", )" + sizes + "}");
  EXPECT_EQ(defaults.attention.attn_logit_softcapping, 50.0);
  EXPECT_EQ(defaults.scaling.final_logit_softcapping, 30.0);
  EXPECT_TRUE(read_config(llama::config_to_hf_json(capless)) == capless);
  // null num_key_value_heads: the query heads; null head_dim (Llama): hidden / heads.
  const auto nulls = read_config(R"({"model_type": "llama", "num_key_value_heads": null, "head_dim": null, )" + sizes + "}");
  EXPECT_EQ(nulls.num_key_value_heads, 4);
  EXPECT_EQ(nulls.head_dim(), 8);
  // A field transformers' strict config refuses as null is refused, naming it.
  const std::string strict = config_error(R"({"model_type": "llama", "rms_norm_eps": null, )" + sizes + "}");
  EXPECT_NE(strict.find("'rms_norm_eps' is null"), std::string::npos) << strict;
  // Qwen2: use_sliding_window with sliding_window absent is a window of 4096 from max_window_layers on.
  const auto qwen = read_config(R"({"model_type": "qwen2", "use_sliding_window": true, "max_window_layers": 1,
                                    "num_key_value_heads": 2, )" + sizes + "}");
  EXPECT_EQ(qwen.attention.sliding_window, 4096);
  EXPECT_FALSE(qwen.layer_slides(0));
  EXPECT_TRUE(qwen.layer_slides(1));
  // StarCoder2: use_bias covers the linear layers; the LayerNorms keep their bias.
  const auto coder = read_config(R"({"model_type": "starcoder2", "use_bias": false, )" + sizes + "}");
  EXPECT_FALSE(coder.attention.attention_bias);
  EXPECT_TRUE(coder.norm.bias);
  // llama3 / yarn / longrope without original_max_position_embeddings: max_position_embeddings.
  const auto yarn = read_config(R"({"model_type": "llama", "max_position_embeddings": 256,
                                    "rope_parameters": {"rope_type": "yarn", "factor": 4.0}, )" + sizes + "}");
  EXPECT_EQ(yarn.rotary.rope_scaling.original_max_position_embeddings, 256);
}

// Our export read back gives the same config, family by family (every field: LlamaConfig::operator==).
TEST(HfConfig, ExportThenImportGivesTheSameConfigForEveryFamily) {
  for (const llama::Family& f : llama::all_families()) {
    std::string json = R"({"model_type": ")" + f.model_type + R"(", "vocab_size": 64, "hidden_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48)";
    static const std::set<std::string> kHeadDim = {"llama", "mistral", "qwen3", "gemma", "gemma2", "gemma3_text",
                                                   "cohere2", "glm", "mixtral", "qwen3_moe"};  // classes with head_dim
    if (kHeadDim.count(f.model_type)) json += R"(, "head_dim": 8)";
    const llama::LlamaConfig c = read_config(json + "}");
    const llama::LlamaConfig back = read_config(llama::config_to_hf_json(c));
    EXPECT_TRUE(back == c) << f.model_type << ": " << c.to_string() << " came back as " << back.to_string();
  }
}

// Tied embeddings allow exactly lm_head.weight to stay unread: any other tensor of the file that the config
// does not use (here StarCoder2's linear biases under use_bias false) is an error naming it.
TEST(HfFamilies, TheLoaderIgnoresNoCheckpointTensor) {
  const std::string dir = dtensor::testing::temp_dir("unused") + "/starcoder2";
  fs::copy(root() + "/starcoder2", dir, fs::copy_options::recursive);
  std::ifstream in(dir + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  in.close();
  ASSERT_TRUE(config.value("tie_word_embeddings", true));
  config["use_bias"] = false;
  std::ofstream(dir + "/config.json") << config.dump();
  const std::string err = dtensor::testing::error_of([&] { llama::from_pretrained(dir, nullptr); });
  EXPECT_NE(err.find("in the checkpoint but not in the state"), std::string::npos) << err;
  EXPECT_NE(err.find(".bias'"), std::string::npos) << err;  // the linear layers' biases, named
  fs::remove_all(dir);
}

// A rank never holds the whole model: from_pretrained builds it on the meta device, parallelizes it there, and each
// rank allocates only its shards and replicas and reads them from the file. At TP 2 a rank's peak allocation while
// loading is its own parameters plus at most one whole tensor (a packed or assembled weight read whole); the model
// built whole first (before) peaked at all of it. The logits stay transformers' (the family tests above).
TEST(HfFamilies, FromPretrainedAllocatesOnlyTheRanksShards) {
  for (const std::string name : {"llama", "phi3"}) {  // plain weights; packed q/k/v and gate/up (read whole, then cut)
    const std::string dir = root() + "/" + name;
    auto bytes = [](const at::Tensor& t) {
      const at::Tensor& local = dtensor::is_dtensor(t) ? dtensor::to_local(t) : t;
      return static_cast<int64_t>(local.nbytes());
    };
    int64_t model_bytes = 0, largest = 0;
    {
      llama::LlamaForCausalLM whole = llama::from_pretrained(dir, nullptr);
      for (const auto& p : whole->parameters()) model_bytes += bytes(p), largest = std::max(largest, bytes(p));
    }
    llama_test::CountingAllocator::install();
    static std::array<llama_test::AllocCounter, 2> counters;  // outlive every tensor they count
    std::array<int64_t, 2> own{0, 0};
    counters = {};
    dtensor::testing::run_ranks(2, [&](int rank, int world) {
      auto mesh = dtensor::init_device_mesh("cpu", {world});
      llama::LlamaForCausalLM model{nullptr};
      {
        llama_test::CountingAllocator::Scope scope(counters[rank]);
        model = llama::from_pretrained(dir, &mesh, "inference");
      }
      for (const auto& p : model->parameters()) own[rank] += bytes(p);
    });
    for (int r = 0; r < 2; ++r) {
      std::printf("%s from_pretrained tp=2 rank %d: peak %lld bytes, its parameters %lld, the model %lld, largest %lld\n",
                  name.c_str(), r, static_cast<long long>(counters[r].peak), static_cast<long long>(own[r]),
                  static_cast<long long>(model_bytes), static_cast<long long>(largest));
      EXPECT_LT(own[r], model_bytes) << name << " rank " << r;
      EXPECT_LE(counters[r].peak, own[r] + largest) << name << " rank " << r;
      EXPECT_LT(counters[r].peak, model_bytes) << name << " rank " << r;
    }
  }
}

TEST(HfConfig, HeadsThatCannotBeSplitNameTheDegreesThatWork) {
  llama::LlamaConfig c;
  c.num_attention_heads = 6, c.num_key_value_heads = 2, c.hidden_size = 96;
  const std::string err = dtensor::testing::error_of([&] { llama::torchtitan_plan(c, 4); });
  EXPECT_NE(err.find("TP degrees that work: 1, 2, 6"), std::string::npos) << err;
  const std::string hf = dtensor::testing::error_of([&] { llama::hf_plan(c, 3); });
  EXPECT_NE(hf.find("TP degrees that work: 1, 2"), std::string::npos) << hf;
  // An uneven vocabulary or feed-forward is no reason to refuse.
  c.vocab_size = 301, c.intermediate_size = 100;
  EXPECT_NO_THROW(llama::torchtitan_plan(c, 6));
}

}  // namespace
