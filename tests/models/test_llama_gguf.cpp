// GGUF files (llama.cpp's one-file format) through the one factory (llama::from_pretrained on a .gguf path, i.e.
// build_model with WeightSource::gguf), against transformers' own GGUF loading of the same file
// (from_pretrained(dir, gguf_file=...), which dequantizes through ggml's `gguf` package): tests/oracle/gguf_oracle.py
// writes a tiny Llama as convert_hf_to_gguf does (names, q/k rows permuted to ggml's rotary order) in each type mix.
// In fp32 the logits agree to fp32 rounding at TP 1 and TP 2: the same dequantized values, un-permuted, sharded.
// Llama 3's rope scaling, which a GGUF holds as its rope_freqs tensor, is applied as llama.cpp applies it; transformers
// drops that tensor, so its logits are compared with the original HF model's instead.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/checkpoint/safetensors.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/quant/int4_weight_only.h"
#include "dtensor/core/error.h"
#include "harness/multi_rank.h"
#include "harness/subprocess.h"
#include "harness/temp_dir.h"
#include "inference/gguf_tokenizer.h"
#include "llama/build.h"
#include "llama/gguf_weights.h"
#include "llama/hf_config.h"
#include "llama_test_util.h"

namespace ckpt = dtensor::checkpoint;

namespace {

double max_rel(const at::Tensor& got, const at::Tensor& want) {
  return ((got - want).abs().max() / want.abs().max()).item<double>();
}

struct Made {
  std::string dir, file;
  at::Tensor tokens, gguf_logits, hf_logits;
  bool ok = false;
};

Made make(const std::string& mix, std::vector<std::string> extra = {}) {
  const std::string root = dtensor::testing::temp_dir("gguf_" + mix);
  Made m{root + "/hf", root + "/model-" + mix + ".gguf"};
  const std::string ref_path = root + "/ref.safetensors";
  std::vector<std::string> argv = {DTENSOR_PYTHON, DTENSOR_SOURCE_DIR "/tests/oracle/gguf_oracle.py", "make", m.dir,
                                   m.file, ref_path, "--mix", mix};
  const bool oracle = std::find(extra.begin(), extra.end(), "--no-oracle") == extra.end();
  argv.insert(argv.end(), extra.begin(), extra.end());
  const auto made = dtensor::testing::run_process(
      argv, {{"OMP_NUM_THREADS", "1"}, {"HF_HUB_OFFLINE", "1"}, {"TRANSFORMERS_VERBOSITY", "error"}}, 300);
  EXPECT_EQ(made.exit_code, 0) << made.output;
  if (made.exit_code != 0) return m;
  m.ok = true;
  if (!oracle) return m;
  auto ref = ckpt::SafetensorsFile::open(ref_path);
  m.tokens = ref.view(*ref.find("tokens")).clone();
  m.gguf_logits = ref.view(*ref.find("gguf_logits")).clone();
  m.hf_logits = ref.view(*ref.find("hf_logits")).clone();
  return m;
}

const std::vector<std::pair<int, std::string>> kLayouts = {{1, "hf"}, {2, "hf"}, {2, "inference"}};

using dtensor::testing::error_of;

}  // namespace

TEST(LlamaGguf, EveryTypeMixGivesTransformersLogits) {
  for (const std::string mix : {"Q8_0", "Q4_0", "Q4_K_M", "Q5_K_M", "BF16", "F16"}) {
    const Made m = make(mix);
    ASSERT_TRUE(m.ok) << mix;
    for (const auto& [tp, plan] : kLayouts) {
      const double rel = max_rel(llama_test::pretrained_logits(m.file, tp, plan, m.tokens, {}, "float32"), m.gguf_logits);
      std::printf("gguf %s tp=%d plan=%s: logits vs transformers' GGUF load max_rel=%.3e\n", mix.c_str(), tp,
                  plan.c_str(), rel);
      EXPECT_LE(rel, 1e-5) << mix << " tp " << tp << " " << plan;
    }
  }
}

// A Q4_0 file's Linear weights stay in their stored form (int4, group 32, the file's fp16 scales: the same numbers),
// every rank holding its rows (Colwise) or its whole blocks of columns (Rowwise) only; the logits above already are
// transformers' through them. dequantize (--gguf-dequantize) gives plain weights in the model's dtype, the same logits.
TEST(LlamaGguf, Q4_0LinearWeightsStayInTheirStoredForm) {
  const Made m = make("Q4_0", {"--no-oracle"});
  ASSERT_TRUE(m.ok);
  const llama::LlamaConfig config = llama::config_from_gguf(m.file);
  const at::Tensor tokens = at::arange(1, 9, at::kLong).view({1, 8});
  std::mutex mu;
  std::map<std::pair<int, bool>, at::Tensor> logits;
  std::map<std::pair<int, bool>, int64_t> bytes;  // rank 0's parameters and buffers
  for (const int tp : {1, 2}) {
    dtensor::testing::run_ranks(tp, [&](int rank, int world) {
      auto mesh = dtensor::init_device_mesh("cpu", {world});
      for (const bool dequantize : {false, true}) {
        llama::BuildOptions options;
        options.parallelize.plan = llama::TPPlan::inference;
        options.dtype = at::kFloat;
        llama::LlamaForCausalLM model = llama::build_model(config, world > 1 ? models::ParallelDims::from_mesh(mesh) : models::ParallelDims{},
                                                           llama::WeightSource::gguf(m.file, dequantize), options);
        auto modules = model->named_modules();
        const auto& q_proj = *modules["model.layers.0.self_attn.q_proj"];
        const auto& o_proj = *modules["model.layers.1.self_attn.o_proj"];
        const at::Tensor wq = q_proj.named_parameters(false)["weight"], wo = o_proj.named_parameters(false)["weight"];
        const at::Tensor lq = dtensor::is_dtensor(wq) ? dtensor::to_local(wq) : wq;
        const at::Tensor lo = dtensor::is_dtensor(wo) ? dtensor::to_local(wo) : wo;
        at::NoGradGuard no_grad;
        at::Tensor out = model(tokens);
        if (dtensor::is_dtensor(out)) out = dtensor::full_tensor(out);
        std::lock_guard<std::mutex> lock(mu);
        // Kept as stored where the int4 kernels run (AVX-512); a CPU without them loads Q4_0 dequantized.
        const bool stored = !dequantize && dtensor::quant::int4_kernels_available();
        EXPECT_EQ(dtensor::quant::is_int4_weight_only(q_proj), stored) << tp;
        if (stored) {
          // q_proj [256, 256] Colwise: 256 / tp rows of 128 bytes; o_proj Rowwise: every row, 256 / tp columns.
          EXPECT_EQ(lq.scalar_type(), at::kByte);
          EXPECT_EQ(lq.sizes(), (at::IntArrayRef{256 / tp, 128}));
          EXPECT_EQ(lo.sizes(), (at::IntArrayRef{256, 128 / tp}));
          EXPECT_EQ(q_proj.named_buffers(false)["weight_scale"].scalar_type(), at::kHalf);
        } else {
          EXPECT_EQ(lq.scalar_type(), at::kFloat);
        }
        if (rank == 0) {
          logits[{tp, dequantize}] = out.to(at::kFloat).clone();
          int64_t b = 0;
          for (const auto& t : model->parameters()) b += (dtensor::is_dtensor(t) ? dtensor::to_local(t) : t).nbytes();
          for (const auto& t : model->buffers()) b += (dtensor::is_dtensor(t) ? dtensor::to_local(t) : t).nbytes();
          bytes[{tp, dequantize}] = b;
        }
      }
    });
  }
  for (const int tp : {1, 2}) {
    EXPECT_LE(max_rel(logits[{tp, false}], logits[{1, true}]), 1e-5) << tp;
    // A rank holds the stored bytes (0.5625 a weight against fp32's 4): the Linear weights are most of the model.
    const int64_t stored = bytes[std::make_pair(tp, false)], plain = bytes[std::make_pair(tp, true)];
    if (dtensor::quant::int4_kernels_available()) EXPECT_LT(stored, 0.3 * plain) << tp << ": " << stored << " vs " << plain;
  }
}

TEST(LlamaGguf, Llama3RopeFreqsAreAppliedAsLlamaCppDoes) {
  const Made m = make("F32", {"--llama3-rope"});
  ASSERT_TRUE(m.ok);
  const llama::LlamaConfig config = llama::config_from_gguf(m.file);
  EXPECT_EQ(config.rotary.rope_scaling.freq_factors.size(), 32u);  // head_dim 64 / 2
  for (const auto& [tp, plan] : kLayouts) {
    const at::Tensor ours = llama_test::pretrained_logits(m.file, tp, plan, m.tokens, {}, "float32");
    const double rel = max_rel(ours, m.hf_logits), dropped = max_rel(ours, m.gguf_logits);
    std::printf("gguf llama3 rope tp=%d plan=%s: vs the HF model max_rel=%.3e (transformers' GGUF load, which drops "
                "rope_freqs: %.3e away)\n", tp, plan.c_str(), rel, dropped);
    EXPECT_LE(rel, 1e-5) << tp << " " << plan;
    EXPECT_GE(dropped, 1e-2) << "the rope factors change the logits";
  }
  // No config.json holds the factors: saving such a model as HF's is refused, not written without them.
  EXPECT_NE(error_of([&] { llama::config_to_hf_json(config); }).find("freq_factors"), std::string::npos);
}

TEST(LlamaGguf, AutoDtypeIsBf16ForQuantizedFiles) {
  const Made m = make("Q8_0");
  ASSERT_TRUE(m.ok);
  EXPECT_EQ(llama::gguf_dtype(m.file), "bfloat16");
  const llama::LlamaForCausalLM model = llama::from_pretrained(m.file);
  EXPECT_EQ(model->lm_head->weight.scalar_type(), at::kBFloat16);
  // bf16: the dequantized values rounded once more, the forward in bf16.
  const double rel = max_rel(llama_test::pretrained_logits(m.file, 2, "inference", m.tokens, {}, "auto"), m.gguf_logits);
  std::printf("gguf Q8_0 in bf16 (auto) tp=2: vs transformers' fp32 max_rel=%.3e\n", rel);
  EXPECT_LE(rel, 5e-2);
}

TEST(LlamaGguf, RefusesWhatItDoesNotReadByName) {
  const Made arch = make("F32", {"--no-oracle", "--arch", "qwen2"});
  ASSERT_TRUE(arch.ok);
  EXPECT_NE(error_of([&] { llama::config_from_gguf(arch.file); }).find("general.architecture 'qwen2' is not read"),
            std::string::npos);
  const Made key = make("F32", {"--no-oracle", "--extra-kv", "llama.attention.sliding_window=8"});
  ASSERT_TRUE(key.ok);
  const std::string e = error_of([&] { llama::from_pretrained(key.file); });
  EXPECT_NE(e.find("metadata 'llama.attention.sliding_window' is not one dtensor knows"), std::string::npos) << e;
  EXPECT_FALSE(llama::is_gguf_file(key.dir + "/config.json"));
  EXPECT_TRUE(llama::is_gguf_file(key.file));
}

// llama_generate --gguf under tprun at TP 2, in fp32: transformers' greedy tokens from the same file.
TEST(LlamaGguf, LlamaGenerateGivesTransformersGreedyTokensAtTp2) {
  const std::string root = dtensor::testing::temp_dir("gguf_generate");
  const std::string file = root + "/model.gguf", ref_path = root + "/ref.safetensors";
  const auto made = dtensor::testing::run_process(
      {DTENSOR_PYTHON, DTENSOR_SOURCE_DIR "/tests/oracle/gguf_oracle.py", "make", root + "/hf", file, ref_path, "--mix",
       "Q4_K_M"},
      {{"OMP_NUM_THREADS", "1"}, {"HF_HUB_OFFLINE", "1"}, {"TRANSFORMERS_VERBOSITY", "error"}}, 300);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  auto ref = ckpt::SafetensorsFile::open(ref_path);
  const at::Tensor prompt = ref.view(*ref.find("tokens"))[0], greedy = ref.view(*ref.find("greedy"));
  auto ids = [](const at::Tensor& t, const char* sep) {
    std::string s;
    for (int64_t i = 0; i < t.numel(); ++i) s += (i ? sep : "") + std::to_string(t[i].item<int64_t>());
    return s;
  };
  using dtensor::testing::bin_path;
  const auto r = dtensor::testing::run_process(
      {bin_path("tprun"), "--nproc-per-node", "2", "--master-port", "0", bin_path("llama_generate"), "--gguf", file,
       "--dtype", "float32", "--prompt-ids", ids(prompt, ","), "--max-new-tokens", "8"},
      {{"OMP_NUM_THREADS", "1"}}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("|" + std::string(" ") + ids(greedy, " ") + "\n"), std::string::npos)
      << "want " << ids(greedy, " ") << " in:\n" << r.output;
  // A text prompt needs a tokenizer, and this file carries none (llama.cpp's no_vocab): exit 2, one error line.
  const auto text = dtensor::testing::run_process({bin_path("llama_generate"), "--gguf", file, "--prompt", "Hello"},
                                                  {{"OMP_NUM_THREADS", "1"}}, 60);
  EXPECT_EQ(text.exit_code, 2) << text.output;
  EXPECT_NE(text.output.find("--gguf with a text prompt needs a tokenizer"), std::string::npos) << text.output;
}

// The file's own vocabulary (a byte-level BPE with Llama 3's split, two control tokens, BOS added) encodes as
// transformers' AutoTokenizer.from_pretrained(dir, gguf_file=...) encodes, with and without special tokens, and
// decodes back; llama_generate --gguf takes a text prompt with it.
TEST(LlamaGguf, VocabularyEncodesAsTransformersTokenizer) {
  const std::string root = dtensor::testing::temp_dir("gguf_vocab");
  const std::string file = root + "/model.gguf", ref_path = root + "/ref.safetensors";
  const auto made = dtensor::testing::run_process(
      {DTENSOR_PYTHON, DTENSOR_SOURCE_DIR "/tests/oracle/gguf_oracle.py", "make", root + "/hf", file, ref_path, "--mix",
       "Q8_0", "--tokenizer"},
      {{"OMP_NUM_THREADS", "1"}, {"HF_HUB_OFFLINE", "1"}, {"TRANSFORMERS_VERBOSITY", "error"}}, 300);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  auto ref = ckpt::SafetensorsFile::open(ref_path);
  ASSERT_TRUE(inference::gguf_has_tokenizer(file));
  const tokenizer::Tokenizer tok = inference::load_gguf_tokenizer(file);
  auto ids_of = [&](const std::string& key) {
    const at::Tensor t = ref.view(*ref.find(key));
    std::vector<int64_t> v(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
    if (v == std::vector<int64_t>{-1}) v.clear();
    return v;
  };
  int compared = 0;
  for (int i = 0; ref.find("text." + std::to_string(i)) != nullptr; ++i) {
    const at::Tensor bytes = ref.view(*ref.find("text." + std::to_string(i)));
    const std::string text(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), bytes.numel());
    EXPECT_EQ(tok.encode(text), ids_of("ids." + std::to_string(i))) << text;
    const auto plain = tok.encode(text, /*add_special_tokens=*/false);
    EXPECT_EQ(plain, ids_of("plain_ids." + std::to_string(i))) << text;
    EXPECT_EQ(tok.decode(plain), text);
    ++compared;
  }
  EXPECT_EQ(compared, 7);
  EXPECT_EQ(tok.bos_token_id(), std::optional<int64_t>(0));
  EXPECT_EQ(tok.eos_token_id(), std::optional<int64_t>(1));
  using dtensor::testing::bin_path;
  const auto r = dtensor::testing::run_process(
      {bin_path("tprun"), "--nproc-per-node", "2", "--master-port", "0", bin_path("llama_generate"), "--gguf", file,
       "--prompt", "Everyone is permitted", "--max-new-tokens", "4"},
      {{"OMP_NUM_THREADS", "1"}}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("summary prompt_tokens=" + std::to_string(tok.encode("Everyone is permitted").size()) +
                          " new_tokens="), std::string::npos) << r.output;
}
