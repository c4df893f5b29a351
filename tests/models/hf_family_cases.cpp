#include "hf_family_cases.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "dtensor/checkpoint/safetensors.h"
#include "dtensor/mesh/device_mesh.h"
#include "harness/multi_rank.h"
#include "inference/generate.h"
#include "llama/hf_weights.h"
#include "harness/subprocess.h"
#include "harness/temp_dir.h"

namespace fs = std::filesystem;
namespace ckpt = dtensor::checkpoint;

namespace hf_cases {

dtensor::testing::ProcessResult oracle(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {DTENSOR_PYTHON, DTENSOR_SOURCE_DIR "/tests/oracle/hf_family_oracle.py"};
  argv.insert(argv.end(), args.begin(), args.end());
  return dtensor::testing::run_process(argv, {{"OMP_NUM_THREADS", "1"}, {"HF_HUB_OFFLINE", "1"}, {"TRANSFORMERS_VERBOSITY", "error"}}, 600);
}

std::vector<std::string> case_names() {
  const dtensor::testing::ProcessResult listed = oracle({"list"});
  if (listed.exit_code != 0) throw std::runtime_error("hf_family_oracle.py list failed:\n" + listed.output);
  std::vector<std::string> names;
  std::istringstream lines(listed.output);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) names.push_back(line);
  }
  if (names.empty()) throw std::runtime_error("hf_family_oracle.py list gave no cases");
  if (dtensor::testing::on_gloo_pass()) {
    // The families differ in their math, which the first pass checks; on Gloo the cases whose collectives differ:
    // tied vocab-parallel embeddings, replicated key/value heads, the full-width q/k norm's all-reduce, per-head
    // norm weights, experts dispatched by all-to-all (and a shared expert), bf16 traffic.
    const std::set<std::string> sample = {"llama_tied", "llama_kv1", "olmo2", "cohere_qk_norm", "mixtral", "qwen2_moe",
                                          "llama_bf16"};
    std::vector<std::string> kept;
    for (const auto& n : names) {
      if (sample.count(n)) kept.push_back(n);
    }
    if (kept.size() != sample.size()) throw std::runtime_error("hf_family_cases: a Gloo sample case is not listed");
    return kept;
  }
  return names;
}

const std::string& root() {
  // The cases depend only on the oracle script and the Python that runs it: made once per build (about 45 s) into
  // build/oracle/hf_families_<key>, and read by every later process (both passes of scripts/test.sh, each ctest
  // entry). Made beside it and renamed into place whole, so a reader never sees half of them. Read-only to tests.
  static const std::string dir = [] {
    std::ifstream script(DTENSOR_SOURCE_DIR "/tests/oracle/hf_family_oracle.py", std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(script)), std::istreambuf_iterator<char>());
    std::ostringstream key;
    key << std::hex << std::hash<std::string>{}(text + DTENSOR_PYTHON);
    const fs::path cache = fs::path(dtensor::testing::bin_path("")).parent_path().parent_path() / "oracle" /
                           ("hf_families_" + key.str());
    if (fs::exists(cache / "COMPLETE")) return cache.string();
    const fs::path making = cache.string() + ".making." + std::to_string(getpid());
    fs::remove_all(making);
    fs::create_directories(making);
    const dtensor::testing::ProcessResult made = oracle({"make", making.string()});
    if (made.exit_code != 0) {
      fs::remove_all(making);
      throw std::runtime_error("hf_family_oracle.py make failed:\n" + made.output);
    }
    std::ofstream(making / "COMPLETE") << "made by hf_family_oracle.py\n";
    std::error_code ec;
    fs::rename(making, cache, ec);  // another process may have renamed its own first: then use that one
    if (ec) fs::remove_all(making);
    return cache.string();
  }();
  return dir;
}

Reference reference(const std::string& name) {
  auto f = ckpt::SafetensorsFile::open(root() + "/" + name + ".ref.safetensors");
  auto get = [&](const char* key) { return f.view(*f.find(key)).clone(); };
  return {get("tokens"),          get("mask"),           get("logits"),        get("prompt"),
          get("greedy_one"),      get("batch"),          get("batch_mask"),    get("greedy_batch"),
          get("logits_bf16"),     get("greedy_one_bf16"), get("gaps_one_bf16"), get("greedy_batch_bf16"),
          get("gaps_batch_bf16")};
}

// max |got - want| / max |want| over the real positions (HF's rows on left padding are not meaningful).
double masked_rel(const at::Tensor& got, const at::Tensor& want, const at::Tensor& mask) {
  const at::Tensor real = mask.to(at::kFloat).unsqueeze(-1);
  return (((got - want) * real).abs().max() / (want * real).abs().max()).item<double>();
}

// The unpadded prompts of a left-padded batch.
std::vector<std::vector<int64_t>> prompts_of(const at::Tensor& ids, const at::Tensor& mask) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t i = 0; i < ids.size(0); ++i) {
    std::vector<int64_t> p;
    for (int64_t j = 0; j < ids.size(1); ++j) {
      if (mask[i][j].item<int64_t>() != 0) p.push_back(ids[i][j].item<int64_t>());
    }
    out.push_back(p);
  }
  return out;
}

at::Tensor greedy_at(const std::string& dir, int tp, const std::vector<std::vector<int64_t>>& prompts, int64_t new_tokens,
                     const std::string& plan, const std::string& dtype) {
  at::Tensor out;
  std::mutex mu;
  dtensor::testing::run_ranks(tp, [&](int rank, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world});
    llama::LlamaForCausalLM model = llama::from_pretrained(dir, &mesh, plan, dtype);
    inference::GenerateOptions options;
    options.max_new_tokens = new_tokens;
    const inference::GenerateResult result = inference::generate(model, prompts, options);
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      std::vector<at::Tensor> rows;
      for (const auto& t : result.new_tokens) rows.push_back(at::tensor(t, at::kLong));
      out = at::stack(rows);
    }
  });
  return out;
}

}  // namespace hf_cases
