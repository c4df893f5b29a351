// The dtensor side of the config fuzz (tests/oracle/hf_config_fuzz.py): for each case of a manifest, greedy
// tokens from from_pretrained + generate at TP 1 and TP 2 (threads as ranks, the inference plan), or the error
// that refused the checkpoint; and the config's export (config_to_hf_json) in <case>/ours/config.json, read back
// by us (it must give the same LlamaConfig) and by transformers (the Python side compares).
//
//   hf_config_fuzz_runner MANIFEST      writes results.json beside MANIFEST; exit 0 unless the runner itself fails
#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>

#include "dtensor/mesh/device_mesh.h"
#include "harness/multi_rank.h"
#include "inference/generate.h"
#include "llama/hf_config.h"
#include "llama/hf_weights.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int64_t kNewTokens = 12;

json greedy(const std::string& dir, const std::vector<int64_t>& prompt, int tp) {
  std::vector<int64_t> tokens;
  std::mutex mu;
  dtensor::testing::RunOptions options;
  options.expect_all_succeed = false;
  const std::vector<std::string> errors = dtensor::testing::run_ranks(tp, [&](int rank, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world});
    llama::LlamaForCausalLM model = llama::from_pretrained(dir, &mesh, "inference");
    inference::GenerateOptions generate;
    generate.max_new_tokens = kNewTokens;
    const inference::GenerateResult result = inference::generate(model, {prompt}, generate);
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      tokens = result.new_tokens.at(0);
    }
  }, options);
  for (const std::string& e : errors) {
    if (!e.empty()) return {{"error", e}};
  }
  return {{"tokens", tokens}};
}

// Our export of the config read back by us: "" when it gives the same config, else what differs.
std::string self_roundtrip(const std::string& dir) {
  llama::LlamaConfig config;
  try {
    config = llama::config_from_hf_json((fs::path(dir) / "config.json").string());
  } catch (const std::exception&) {
    return "";  // refused: the greedy runs report it
  }
  const std::string exported = llama::config_to_hf_json(config);
  fs::create_directories(fs::path(dir) / "ours");
  std::ofstream(fs::path(dir) / "ours" / "config.json") << exported;
  try {
    const llama::LlamaConfig back = llama::config_from_hf_json_text(exported, dir + "/ours/config.json");
    if (back == config) return "";
    return "a different config: " + back.to_string() + " (read: " + config.to_string() + ")";
  } catch (const std::exception& e) {
    return std::string("an error: ") + e.what();
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: hf_config_fuzz_runner MANIFEST\n";
    return 2;
  }
  at::set_num_threads(1);
  json manifest;
  std::ifstream(argv[1]) >> manifest;
  json results = json::array();
  for (const json& c : manifest) {
    const std::string dir = c.at("dir");
    const std::vector<int64_t> prompt = c.at("prompt");
    json r = {{"name", c.at("name")}};
    r["tp1"] = greedy(dir, prompt, 1);
    r["tp2"] = greedy(dir, prompt, 2);
    r["self_roundtrip"] = self_roundtrip(dir);
    std::cout << c.at("name").get<std::string>() << (r["tp1"].contains("error") ? " refused" : " ran") << std::endl;
    results.push_back(std::move(r));
  }
  std::ofstream(fs::path(argv[1]).parent_path() / "results.json") << results.dump();
  return 0;
}
