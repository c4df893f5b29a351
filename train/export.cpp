#include "train/export.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "dtensor/core/error.h"
#include "dtensor/mesh/process_group.h"
#include "dtensor/peft/adapter.h"
#include "llama/hf_weights.h"
#include "tokenizer/byte_tokenizer.h"

namespace train {
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

void write_atomically(const std::string& dir, const std::string& name, const std::string& text) {
  fs::create_directories(dir);
  const fs::path tmp = fs::path(dir) / ("." + name + "." + std::to_string(::getpid()) + "." +
                                        std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id())));
  {
    std::ofstream out(tmp, std::ios::binary);
    out << text;
    DTENSOR_CHECK(out, "dtensor: llama_train: cannot write ", tmp.string());
  }
  fs::rename(tmp, fs::path(dir) / name);
}

bool bytes_are_tokens(const TrainOptions& o) {
  return o.tokenizer_dir.empty() && o.hf_dir.empty() && !o.data.ends_with(".bin");
}

void save_tokenizer(const TrainOptions& o, const std::string& dir) {
  if (bytes_are_tokens(o)) {
    write_atomically(dir, "tokenizer.json", tokenizer::byte_tokenizer_json());
    return;
  }
  if (o.tokenizer_dir.empty()) return;
  for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                           "chat_template.jinja", "generation_config.json"}) {
    const fs::path from = fs::path(o.tokenizer_dir) / name;
    if (fs::exists(from) && fs::absolute(from) != fs::absolute(fs::path(dir) / name)) {
      write_atomically(dir, name, read_file(from));
    }
  }
}

void save_hf(const TrainOptions& o, llama::LlamaForCausalLM& model, const std::string& dir) {
  if (o.lora() && !o.merge_lora) {
    dtensor::peft::save_adapter(dir, *model, {.base_model_name_or_path = o.hf_dir});
  } else {
    if (o.merge_lora) dtensor::peft::merge_adapter(*model);  // each rank its shards: W += scaling B A
    llama::save_hf_llama(dir, model);
  }
  const bool rank0 = !dtensor::is_initialized() || dtensor::current_world()->rank() == 0;
  if (rank0) save_tokenizer(o, dir);
  if (dtensor::is_initialized()) dtensor::current_world()->world_group()->barrier();
}

bool keeps_weights(const TrainOptions& o) {
  return !o.save_hf.empty() || (!o.checkpoint_dir.empty() && o.checkpoint_every > 0);
}

}  // namespace train
