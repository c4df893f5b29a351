// PEFT's adapter directory (include/dtensor/peft/adapter.h).
#include "dtensor/peft/adapter.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/checkpoint/safetensors.h"
#include "dtensor/core/error.h"
#include "dtensor/mesh/process_group.h"
#include "dtensor/nn/materialize.h"

namespace dtensor::peft {
namespace fs = std::filesystem;
namespace {

const char* const kPrefix = "base_model.model.";  // PEFT's keys: the PeftModel's path to the base model's modules
const char* const kWeights = "adapter_model.safetensors";
const char* const kConfig = "adapter_config.json";

// The model's adapters by PEFT's key.
std::map<std::string, at::Tensor> adapter_parameters(torch::nn::Module& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : model.named_parameters()) {
    if (is_lora_parameter(p.key())) out[kPrefix + p.key()] = p.value();
  }
  return out;
}

int rank() { return dtensor::is_initialized() ? dtensor::current_world()->rank() : 0; }
void barrier() {
  if (dtensor::is_initialized()) dtensor::current_world()->world_group()->barrier();
}

}  // namespace

LoraConfig load_adapter_config(const std::string& dir) {
  const fs::path path = fs::path(dir) / kConfig;
  std::ifstream in(path);
  DTENSOR_CHECK(in.good(), "dtensor: LoRA adapter: no ", path.string(), " (PEFT's save_pretrained writes it)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw DTENSOR_ERROR("dtensor: LoRA adapter: ", path.string(), " is not JSON: ", e.what());
  }
  auto where = [&](const char* field) { return path.string() + ": '" + field + "'"; };
  const std::string type = j.value("peft_type", "");
  DTENSOR_CHECK(type == "LORA", "dtensor: LoRA adapter: ", where("peft_type"), " is '", type,
                "'; only LORA adapters are supported");
  // What PEFT can express and this does not implement: refused by name, never ignored.
  auto refuse_if = [&](bool unsupported, const char* field, const std::string& what) {
    DTENSOR_CHECK(!unsupported, "dtensor: LoRA adapter: ", where(field), " ", what, " is not supported");
  };
  auto non_empty = [&](const char* f) { return j.contains(f) && !j[f].is_null() && !j[f].empty() && j[f] != false; };
  refuse_if(j.value("use_dora", false), "use_dora", "true (DoRA)");
  refuse_if(j.value("bias", std::string("none")) != "none", "bias", "'" + j.value("bias", std::string()) + "'");
  refuse_if(j.value("fan_in_fan_out", false), "fan_in_fan_out", "true (Conv1D layers)");
  refuse_if(j.value("lora_bias", false), "lora_bias", "true");
  for (const char* f : {"modules_to_save", "rank_pattern", "alpha_pattern", "layers_to_transform", "layer_replication",
                        "exclude_modules", "target_parameters", "trainable_token_indices", "alora_invocation_tokens",
                        "use_qalora", "use_bdlora", "arrow_config"}) {
    refuse_if(non_empty(f), f, j.contains(f) ? j[f].dump() : "");
  }
  LoraConfig c;
  try {
    c.r = j.at("r").get<int64_t>();
    c.lora_alpha = j.at("lora_alpha").get<double>();
    c.lora_dropout = j.value("lora_dropout", 0.0);
    c.use_rslora = j.value("use_rslora", false);
    const auto& t = j.at("target_modules");
    if (t.is_string()) {
      const std::string s = t.get<std::string>();
      refuse_if(s != "all-linear", "target_modules", "as the regular expression '" + s + "'");
      c.target_modules = {s};
    } else {
      c.target_modules = t.get<std::vector<std::string>>();
    }
  } catch (const dtensor::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw DTENSOR_ERROR("dtensor: LoRA adapter: ", path.string(), ": ", e.what());
  }
  validate(c);
  return c;
}

void load_adapter_weights(const std::string& dir, torch::nn::Module& model) {
  const fs::path path = fs::path(dir) / kWeights;
  DTENSOR_CHECK(fs::exists(path), "dtensor: LoRA adapter: no ", path.string());
  const checkpoint::SafetensorsFile file = checkpoint::SafetensorsFile::open(path.string());
  const auto params = adapter_parameters(model);
  DTENSOR_CHECK(!params.empty(), "dtensor: LoRA adapter ", dir, ": the model has no adapters (inject_adapter first)");
  for (const auto& [key, p] : params) {
    const checkpoint::StoredTensor* s = file.find(key);
    DTENSOR_CHECK(s != nullptr, "dtensor: LoRA adapter: ", path.string(), " has no '", key, "'");
    DTENSOR_CHECK(s->info.shape == p.sizes().vec(), "dtensor: LoRA adapter: ", path.string(), ": '", key, "' has shape ",
                  c10::IntArrayRef(s->info.shape), ", the model's adapter ", p.sizes());
  }
  for (const auto& s : file.tensors()) {
    DTENSOR_CHECK(params.count(s.info.name), "dtensor: LoRA adapter: ", path.string(), " holds '", s.info.name,
                  "', which is no adapter of the model (another base model, or target_modules differ)");
  }
  at::NoGradGuard no_grad;
  for (const auto& [key, p] : params) nn::copy_from_full_(p, file.view(*file.find(key)).to(p.scalar_type()));
}

void save_adapter(const std::string& dir, torch::nn::Module& model, const AdapterInfo& info) {
  const LoraConfig c = adapter_config(model);
  const auto params = adapter_parameters(model);
  std::unique_ptr<checkpoint::SafetensorsWriter> writer;
  if (rank() == 0) {
    fs::create_directories(dir);
    std::vector<checkpoint::TensorInfo> layout;
    for (const auto& [key, p] : params) layout.push_back({key, p.scalar_type(), p.sizes().vec()});
    writer = std::make_unique<checkpoint::SafetensorsWriter>((fs::path(dir) / kWeights).string(), layout,
                                                             std::map<std::string, std::string>{{"format", "pt"}});
  }
  {
    at::NoGradGuard no_grad;
    for (const auto& [key, p] : params) {  // the same order on every rank: one gather each
      const at::Tensor full = is_dtensor(p) ? full_tensor(p.detach()) : p.detach();
      if (writer) writer->write(full.cpu());
    }
  }
  if (writer) {
    writer->finish();
    // target_modules as given; "all-linear" as the layers' names it found (what PEFT saves).
    std::vector<std::string> targets = c.target_modules;
    if (targets.size() == 1 && targets[0] == "all-linear") {
      std::set<std::string> names;
      for (const auto& [key, p] : params) {
        const std::string module = key.substr(0, key.rfind(".lora_"));
        names.insert(module.substr(module.rfind('.') + 1));
      }
      targets.assign(names.begin(), names.end());
    }
    const nlohmann::json j = {{"peft_type", "LORA"},
                              {"task_type", info.task_type},
                              {"base_model_name_or_path", info.base_model_name_or_path},
                              {"r", c.r},
                              {"lora_alpha", c.lora_alpha == std::floor(c.lora_alpha) ? nlohmann::json(static_cast<int64_t>(c.lora_alpha))
                                                                                      : nlohmann::json(c.lora_alpha)},
                              {"lora_dropout", c.lora_dropout},
                              {"target_modules", targets},
                              {"bias", "none"},
                              {"fan_in_fan_out", false},
                              {"use_rslora", c.use_rslora},
                              {"use_dora", false},
                              {"init_lora_weights", true},
                              {"inference_mode", true},
                              {"modules_to_save", nullptr},
                              {"layers_to_transform", nullptr},
                              {"layers_pattern", nullptr},
                              {"rank_pattern", nlohmann::json::object()},
                              {"alpha_pattern", nlohmann::json::object()},
                              {"revision", nullptr}};
    std::ofstream(fs::path(dir) / kConfig) << j.dump(2) << "\n";
  }
  barrier();
}

}  // namespace dtensor::peft
