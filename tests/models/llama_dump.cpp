// llama_dump: what the PyTorch side of the Llama oracles needs to train the same model on the same data
// (tests/oracle/llama_oracle.py, tools/bench/async_tp_bench.py, fsdp_tp_bench.py):
//
//   llama_dump --out DIR/llama [llama_train options]
//
// writes DIR/llama.bin and DIR/llama.json: the initial (unparallelized) weights that llama_train's seed gives,
// every step's global batch, and the config and training hyper-parameters. One process, no communication.
// A bad command line prints one `error:` line and exits 2, as llama_train does.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <stdexcept>
#include <vector>

#include "dtensor/core/error.h"
#include "train/loop.h"
#include "tools/llama_train/options.h"

namespace {

void write_dump(llama::LlamaForCausalLM& model, const train::TrainOptions& o, const train::Corpus& corpus,
                const std::string& out) {
  std::ofstream bin(out + ".bin", std::ios::binary);
  if (!bin) throw dtensor::Error("llama_dump: cannot write '" + out + ".bin'");
  int64_t offset = 0;
  auto write = [&](const at::Tensor& t) {
    at::Tensor c = t.detach().contiguous();
    const auto bytes = static_cast<int64_t>(c.numel() * c.element_size());
    bin.write(static_cast<const char*>(c.data_ptr()), bytes);
    nlohmann::json entry = {{"offset", offset}, {"shape", c.sizes().vec()}, {"dtype", c.scalar_type() == at::kFloat ? "float32" : "int64"}};
    offset += bytes;
    return entry;
  };
  nlohmann::json j;
  const auto& c = o.model;
  j["config"] = {{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size}, {"num_hidden_layers", c.num_hidden_layers},
                 {"num_attention_heads", c.num_attention_heads}, {"num_key_value_heads", c.num_key_value_heads},
                 {"intermediate_size", c.intermediate_size}, {"rope_theta", c.rotary.rope_theta}, {"rms_norm_eps", c.norm.rms_norm_eps}};
  j["train"] = {{"seq_len", o.seq_len}, {"batch", o.batch}, {"steps", o.steps}, {"lr", o.lr}, {"warmup", o.warmup},
                {"max_norm", o.max_norm}, {"weight_decay", 0.1}, {"betas", {0.9, 0.95}}, {"eps", 1e-8}};
  for (const auto& item : model->named_parameters()) j["params"][item.key()] = write(item.value());
  for (int64_t step = 0; step < o.steps; ++step) {
    const train::Batch b = train::sample_batch(corpus, o.batch, o.seq_len, o.seed, step);
    j["batches"].push_back({{"inputs", write(b.inputs)}, {"labels", write(b.labels)}});
  }
  std::ofstream(out + ".json") << j.dump(1);
}

}  // namespace

int main(int argc, char** argv) {
  std::string out;
  std::vector<std::string> rest;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else {
      rest.push_back(a);
    }
  }
  train::TrainOptions options;
  train::Corpus corpus;
  try {
    if (out.empty()) throw std::invalid_argument("llama_dump needs --out PATH");
    bool help = false;
    options = llama_train::parse_options(rest, help);
    corpus = train::load_corpus(options.data);
    train::fit_to_corpus(options, corpus);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  try {
    llama::LlamaForCausalLM model = train::make_model(options);
    write_dump(model, options, corpus, out);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
