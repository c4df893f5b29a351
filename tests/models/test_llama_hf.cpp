// Hugging Face weights in and out: transformers writes a tiny random LlamaForCausalLM (GQA, 2 layers) with
// save_pretrained; we load it at TP 1 and TP 2 (both plans) and get HF's logits on a fixed batch (<= 1e-5
// relative, fp32); sharded files with an index, bf16 files and tied embeddings load too; save_hf_llama's
// export loads back in transformers with the same logits. tests/oracle/hf_llama_oracle.py is HF's side.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <mutex>

#include "dtensor/checkpoint/safetensors.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/quant/weight_prepack.h"
#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"
#include "harness/subprocess.h"
#include "llama/hf_config.h"
#include "llama/hf_weights.h"
#include "llama/parallelize.h"
#include "alloc_counter.h"
#include "llama_test_util.h"
#include "harness/temp_dir.h"

namespace fs = std::filesystem;
namespace ckpt = dtensor::checkpoint;
using dtensor::testing::ProcessResult;
using dtensor::testing::run_process;

namespace {

std::string fresh(const std::string& tag) {
  return dtensor::testing::temp_dir("hf_" + tag);
}

ProcessResult oracle(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {DTENSOR_PYTHON, DTENSOR_SOURCE_DIR "/tests/oracle/hf_llama_oracle.py"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, {{"OMP_NUM_THREADS", "1"}, {"HF_HUB_OFFLINE", "1"}, {"TRANSFORMERS_VERBOSITY", "error"}}, 300);
}

struct Reference {
  at::Tensor tokens, logits;
};
Reference read_reference(const std::string& path) {
  auto f = ckpt::SafetensorsFile::open(path);
  return {f.view(*f.find("tokens")).clone(), f.view(*f.find("logits")).clone()};
}

double max_rel(const at::Tensor& got, const at::Tensor& want) {
  return ((got - want).abs().max() / want.abs().max()).item<double>();
}

}  // namespace

TEST(LlamaHF, LoadsTransformersWeightsAtTp1AndTp2WithHfLogits) {
  const std::string root = fresh("load");
  const std::string dir = root + "/model", ref_path = root + "/expected.safetensors";
  const ProcessResult made = oracle({"make", dir, ref_path});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const Reference ref = read_reference(ref_path);
  for (const auto& [tp, plan] :
       std::vector<std::pair<int, std::string>>{{1, "hf"}, {2, "hf"}, {2, "torchtitan"}, {2, "inference"}}) {
    const at::Tensor logits = llama_test::pretrained_logits(dir, tp, plan, ref.tokens);
    const double rel = max_rel(logits, ref.logits);
    std::printf("hf logits tp=%d plan=%s max_rel=%.3e\n", tp, plan.c_str(), rel);
    EXPECT_LE(rel, 1e-5) << "TP " << tp << " plan " << plan;
  }

  // Export at TP 2 (gathering one weight at a time) and let transformers load it.
  const std::string exported = root + "/exported";
  dtensor::testing::run_ranks(2, [&](int, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world});
    llama::LlamaForCausalLM model = llama::from_pretrained(dir, &mesh, "hf");
    llama::save_hf_llama(exported, model);
  });
  const ProcessResult checked = oracle({"check", exported, ref_path});
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
  EXPECT_NE(checked.output.find("hf_check max_rel="), std::string::npos) << checked.output;
}

TEST(LlamaHF, ShardedIndexAndTiedEmbeddings) {
  const std::string root = fresh("tied");
  const std::string dir = root + "/model", ref_path = root + "/expected.safetensors";
  const ProcessResult made = oracle({"make", dir, ref_path, "--tied", "--max-shard-size", "40KB"});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  ASSERT_TRUE(fs::exists(dir + "/model.safetensors.index.json"));
  const Reference ref = read_reference(ref_path);
  // Tied at TP 2: embed_tokens and lm_head share one Shard(0) weight (llama/parallelize.h).
  for (const auto& [tp, plan] :
       std::vector<std::pair<int, std::string>>{{1, "hf"}, {2, "hf"}, {2, "torchtitan"}, {2, "inference"}}) {
    EXPECT_LE(max_rel(llama_test::pretrained_logits(dir, tp, plan, ref.tokens), ref.logits), 1e-5) << "TP " << tp << " plan " << plan;
  }
  const std::string exported = root + "/exported";
  dtensor::testing::run_ranks(1, [&](int, int) {
    llama::LlamaForCausalLM model = llama::from_pretrained(dir);
    llama::save_hf_llama(exported, model);
  });
  auto f = ckpt::SafetensorsFile::open(exported + "/model.safetensors");
  EXPECT_EQ(f.find("lm_head.weight"), nullptr);  // tied: stored once, as transformers does
  const ProcessResult checked = oracle({"check", exported, ref_path});
  EXPECT_EQ(checked.exit_code, 0) << checked.output;

  // Weights packed at load (llama_generate's default) with the tie: embed_tokens and lm_head share one packed tensor,
  // the lookup its rows; the bf16 logits are the unpacked model's (equal where the reference computes; within bf16
  // roundings of the sums where the packed kernel runs), at TP 1 and 2; saving the packed model is refused by name.
  for (int tp : {1, 2}) {
    std::mutex mu;
    dtensor::testing::run_ranks(tp, [&](int rank, int world) {
      auto mesh = dtensor::init_device_mesh("cpu", {world});
      llama::LlamaForCausalLM model = llama::from_pretrained(dir, &mesh, "inference", "bfloat16");
      at::NoGradGuard no_grad;
      auto full = [](at::Tensor t) { return (dtensor::is_dtensor(t) ? dtensor::full_tensor(t) : t).to(at::kFloat); };
      const at::Tensor unpacked = full(model(ref.tokens));
      const auto names = dtensor::quant::prepack_linear_weights_(*model, {}, /*only_where_fast=*/false);
      const at::Tensor packed = full(model(ref.tokens));
      const std::string refused = dtensor::testing::error_of([&] { llama::save_hf_llama(root + "/packed", model); });
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_NE(std::find(names.begin(), names.end(), "lm_head"), names.end()) << "TP " << tp;
      EXPECT_TRUE(dtensor::quant::is_prepacked(*model->model->embed_tokens)) << "TP " << tp;
      EXPECT_TRUE(model->lm_head->weight.is_same(model->model->embed_tokens->weight)) << "one packed tensor";
      const double rel = max_rel(packed, unpacked);
      if (rank == 0) std::printf("tied, packed vs unpacked bf16 logits tp=%d max_rel=%.3e\n", tp, rel);
      EXPECT_LE(rel, 5e-2) << "TP " << tp;  // the packed kernel rounds its sums once as at::linear does, in another order
      EXPECT_NE(refused.find("is packed for the batched GEMM"), std::string::npos) << refused;
    });
  }
}

TEST(LlamaHF, Bf16FilesLoadIntoAnFp32Model) {
  const std::string root = fresh("bf16");
  const std::string dir = root + "/model", ref_path = root + "/expected.safetensors";
  const ProcessResult made = oracle({"make", dir, ref_path, "--dtype", "bfloat16"});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const Reference ref = read_reference(ref_path);  // HF's fp32 logits of the bf16 weights
  for (int tp : {1, 2}) {
    const double rel = max_rel(llama_test::pretrained_logits(dir, tp, "hf", ref.tokens), ref.logits);
    EXPECT_LE(rel, 1e-5) << "TP " << tp;
  }
}

TEST(LlamaHF, ConfigMismatchIsOneClearError) {
  const std::string root = fresh("mismatch");
  const std::string dir = root + "/model", ref_path = root + "/expected.safetensors";
  ASSERT_EQ(oracle({"make", dir, ref_path}).exit_code, 0);
  llama::LlamaConfig other = llama::config_from_hf_json(dir + "/config.json");
  other.intermediate_size = 128;
  llama::LlamaForCausalLM model(other);
  const std::string err = dtensor::testing::error_of([&] { llama::load_hf_llama(dir, model); });
  EXPECT_NE(err.find("intermediate_size"), std::string::npos) << err;
}

// from_pretrained maps in place (dtensor::checkpoint::LoadOptions::map_in_place): a weight whose slice on this rank is
// one contiguous range of the file in the model's dtype keeps the file's private mapping as its storage. At TP 1 no
// weight is copied (what stays allocated after the load is < 1% of the parameters); at TP 2 under the hf plan the
// Shard(1) slices (o_proj, down_proj) are copied, the rest mapped. The logits equal a copying load's, and a write to a
// mapped weight copies its page: the file is unchanged (a new load gives the copying load's logits again).
TEST(LlamaHF, WeightsMapInPlaceAndWritesNeverReachTheFile) {
  const std::string root = fresh("mapped");
  const std::string dir = root + "/model", ref_path = root + "/expected.safetensors";
  ASSERT_EQ(oracle({"make", dir, ref_path}).exit_code, 0);
  const Reference ref = read_reference(ref_path);
  llama_test::CountingAllocator::install();
  static std::array<llama_test::AllocCounter, 3> counters;  // outlive every tensor they count: tp 1, tp 2's two ranks
  for (int tp : {1, 2}) {
    dtensor::testing::run_ranks(tp, [&](int rank, int world) {
      auto mesh = dtensor::init_device_mesh("cpu", {world});
      llama::LlamaForCausalLM mapped{nullptr};
      {
        llama_test::CountingAllocator::Scope scope(counters[tp == 1 ? 0 : 1 + rank]);
        mapped = llama::from_pretrained(dir, &mesh, "hf");
      }
      llama::LlamaForCausalLM copied(llama::config_from_hf_json(dir + "/config.json"));
      if (tp > 1) llama::apply_hf_tp(copied, mesh);
      llama::load_hf_llama(dir, copied, /*map_in_place=*/false);
      int64_t param_bytes = 0, shard1_bytes = 0;
      for (const auto& item : mapped->named_parameters()) {
        const at::Tensor local = dtensor::is_dtensor(item.value()) ? dtensor::to_local(item.value()) : item.value();
        param_bytes += static_cast<int64_t>(local.nbytes());
        if (dtensor::is_dtensor(item.value()) && dtensor::placements(item.value())[0].is_shard(1)) {
          shard1_bytes += static_cast<int64_t>(local.nbytes());
        }
      }
      const int64_t kept = counters[tp == 1 ? 0 : 1 + rank].current;
      if (tp == 1) {
        EXPECT_LT(kept, param_bytes / 100) << "TP 1: " << kept << " of " << param_bytes << " bytes copied";
      } else {
        EXPECT_GE(kept, shard1_bytes) << "rank " << rank;
        EXPECT_LT(kept, shard1_bytes + param_bytes / 100) << "rank " << rank << ": " << kept << " bytes copied, "
                                                          << shard1_bytes << " in Shard(1) slices";
      }
      at::NoGradGuard no_grad;
      auto full = [](const at::Tensor& t) { return dtensor::is_dtensor(t) ? dtensor::full_tensor(t) : t; };
      const at::Tensor want = full(copied(ref.tokens));
      EXPECT_TRUE(at::equal(full(mapped(ref.tokens)), want)) << "TP " << tp;
      for (const auto& item : mapped->named_parameters()) item.value().add_(1.0);  // copy-on-write, never the file
      EXPECT_FALSE(at::equal(full(mapped(ref.tokens)), want)) << "TP " << tp;
      llama::LlamaForCausalLM again = llama::from_pretrained(dir, &mesh, "hf");
      EXPECT_TRUE(at::equal(full(again(ref.tokens)), want)) << "TP " << tp;
    });
  }
}
