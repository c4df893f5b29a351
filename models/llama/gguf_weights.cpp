#include "llama/gguf_weights.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "dtensor/checkpoint/gguf.h"
#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"
#include "dtensor/tensor/dtensor.h"
#include "dtensor/tensor/shard_layout.h"
#include "dtensor/nn/materialize.h"
#include "dtensor/nn/layers.h"
#include "dtensor/peft/lora.h"
#include "dtensor/quant/int4_weight_only.h"
#include "llama/hf_config.h"

namespace llama {
namespace {

using dtensor::checkpoint::GgufFile;
using dtensor::checkpoint::GgufTensor;
using dtensor::checkpoint::GgufValue;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw DTENSOR_ERROR("dtensor: GGUF file '", path, "': ", what);
}

// The architecture's metadata keys (after "llama."), each with the config.json field it sets ("" : checked, not
// copied). Any other "llama.*" key is refused: it may change the numerics.
const std::map<std::string, std::string>& llama_keys() {
  static const std::map<std::string, std::string> keys = {
      {"context_length", "max_position_embeddings"},
      {"embedding_length", "hidden_size"},
      {"block_count", "num_hidden_layers"},
      {"feed_forward_length", "intermediate_size"},
      {"attention.head_count", "num_attention_heads"},
      {"attention.head_count_kv", "num_key_value_heads"},
      {"attention.layer_norm_rms_epsilon", "rms_norm_eps"},
      {"rope.freq_base", "rope_theta"},
      {"vocab_size", "vocab_size"},
      {"attention.key_length", "head_dim"},
      {"attention.value_length", ""},
      {"rope.dimension_count", ""},
      {"rope.scaling.type", ""},
      {"rope.scaling.factor", ""},
      {"expert_count", ""},
      {"expert_used_count", ""},
  };
  return keys;
}

nlohmann::json json_of(const GgufValue& v) {
  using T = GgufValue::Type;
  switch (v.type) {
    case T::f32: case T::f64: return v.number;
    case T::boolean: return v.boolean;
    case T::string: return v.string;
    case T::array: return nullptr;
    default: return v.integer;
  }
}

nlohmann::json config_json(const GgufFile& f) {
  const std::string& arch = f.string("general.architecture");
  if (arch != "llama") {
    fail(f.path(), "general.architecture '" + arch + "' is not read (the llama architecture is: Llama, Mistral)");
  }
  if (const GgufValue* split = f.find_metadata("split.count"); split != nullptr && split->integer > 1) {
    fail(f.path(), "one part of a split GGUF (" + std::to_string(split->integer) + " parts); merge them first "
                   "(llama-gguf-split --merge)");
  }
  nlohmann::json j = {{"model_type", "llama"}, {"hidden_act", "silu"}, {"rope_theta", 10000.0}};
  for (const auto& [key, value] : f.metadata()) {
    if (key.rfind("llama.", 0) != 0) continue;
    const std::string field = key.substr(6);
    auto it = llama_keys().find(field);
    if (it == llama_keys().end()) {
      fail(f.path(), "metadata '" + key + "' is not one dtensor knows for the llama architecture; it may change the "
                     "numerics, so the file is refused rather than run differently");
    }
    if (value.type == GgufValue::Type::array) {
      fail(f.path(), "metadata '" + key + "' holds one value per layer; per-layer values are not read");
    }
    if (!it->second.empty()) j[it->second] = json_of(value);
  }
  const int64_t hidden = f.integer("llama.embedding_length"), heads = f.integer("llama.attention.head_count");
  const int64_t head_dim = j.contains("head_dim") ? j["head_dim"].get<int64_t>() : (heads > 0 ? hidden / heads : 0);
  auto same = [&](const char* key, int64_t want, const char* what) {
    if (const GgufValue* v = f.find_metadata(key); v != nullptr && v->integer != want) {
      fail(f.path(), std::string(key) + " = " + std::to_string(v->integer) + " where " + what + " is " +
                         std::to_string(want) + " (" + what + " only is read)");
    }
  };
  same("llama.attention.value_length", head_dim, "the head dim");
  same("llama.rope.dimension_count", head_dim, "the head dim (full rotary)");
  same("llama.expert_count", 0, "no experts");
  if (const GgufValue* type = f.find_metadata("llama.rope.scaling.type"); type != nullptr && type->string != "none") {
    if (type->string != "linear") {
      fail(f.path(), "llama.rope.scaling.type '" + type->string + "' is not read (none, linear are)");
    }
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", f.number("llama.rope.scaling.factor")}};
  }
  if (!j.contains("vocab_size")) {  // transformers: the tokenizer's size, else the embedding's rows
    if (f.find_metadata("tokenizer.ggml.tokens") != nullptr) {
      j["vocab_size"] = f.array("tokenizer.ggml.tokens").size();
    } else if (const GgufTensor* e = f.find("token_embd.weight"); e != nullptr) {
      j["vocab_size"] = e->shape[0];
    }
  }
  j["tie_word_embeddings"] = f.find("output.weight") == nullptr;
  j["attention_bias"] = f.find("blk.0.attn_q.bias") != nullptr;
  for (const char* id : {"bos_token_id", "eos_token_id"}) {
    if (const GgufValue* v = f.find_metadata(std::string("tokenizer.ggml.") + id); v != nullptr) j[id] = v->integer;
  }
  return j;
}

// The HF parameter a GGUF tensor holds, or "" when it is none of the table's.
std::string hf_name(const std::string& gguf) {
  static const std::map<std::string, std::string> top = {{"token_embd.weight", "model.embed_tokens.weight"},
                                                         {"output_norm.weight", "model.norm.weight"},
                                                         {"output.weight", "lm_head.weight"}};
  static const std::map<std::string, std::string> layer = {
      {"attn_norm.weight", "input_layernorm.weight"}, {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},   {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},   {"attn_output.weight", "self_attn.o_proj.weight"},
      {"attn_q.bias", "self_attn.q_proj.bias"},       {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.bias", "self_attn.v_proj.bias"},       {"attn_output.bias", "self_attn.o_proj.bias"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},    {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"}};
  if (auto it = top.find(gguf); it != top.end()) return it->second;
  if (gguf.rfind("blk.", 0) != 0) return "";
  const size_t dot = gguf.find('.', 4);
  if (dot == std::string::npos) return "";
  const std::string index = gguf.substr(4, dot - 4);
  if (index.empty() || index.find_first_not_of("0123456789") != std::string::npos) return "";
  auto it = layer.find(gguf.substr(dot + 1));
  return it == layer.end() ? "" : "model.layers." + index + "." + it->second;
}

// convert_hf_to_gguf's LlamaModel.permute, undone (transformers' reverse_permute): each head's rows go from
// llama.cpp's rotary order [pairs of (2i, 2i+1)] back to HF's rotate-half order [first halves, second halves].
at::Tensor unpermute(const at::Tensor& w, int64_t heads) {
  std::vector<int64_t> shape = w.sizes().vec();
  std::vector<int64_t> split = {heads, w.size(0) / heads / 2, 2};
  split.insert(split.end(), shape.begin() + 1, shape.end());
  return w.reshape(split).transpose(1, 2).reshape(shape).contiguous();
}

// The dim-0 indices [begin, end) of `param`'s full value this rank's shard reads: its rows for a shard along dim 0
// alone (Colwise's weight, a vocab-sharded embedding), widened to whole groups of `group` rows (a q / k head, which
// the un-permutation reorders within); everything for a plain or 1-D tensor, a replica or any other layout.
std::pair<int64_t, int64_t> rows_read(const at::Tensor& param, int64_t group) {
  const int64_t n = param.size(0);
  if (!dtensor::is_dtensor(param) || param.dim() == 1) return {0, n};
  const dtensor::LocalShard s = dtensor::local_shard(dtensor::dtensor_spec(param));
  if (!s.box) return {0, n};
  for (size_t d = 1; d < s.shape.size(); ++d) {
    if (s.offset[d] != 0 || s.shape[d] != param.size(static_cast<int64_t>(d))) return {0, n};
  }
  if (s.shape[0] == 0) return {0, 0};
  const int64_t begin = s.offset[0] / group * group;
  const int64_t end = std::min(n, (s.offset[0] + s.shape[0] + group - 1) / group * group);
  return {begin, end};
}

// A Q4_0 weight's rows [begin, begin + values.size(0)) as this rank's part of `param` in the int4 layout
// (dtensor/quant/int4_weight_only.h: Q4_0's own, zero 0): its rows, and under a Shard(1) its columns on whole blocks of
// 32 (a degree that would cut a block is refused, naming those that do not).
dtensor::quant::Int4Weight q4_0_shard(const std::string& path, const std::string& tensor, const at::Tensor& param,
                                      int64_t begin, const at::Tensor& values, const at::Tensor& scales) {
  if (!dtensor::is_dtensor(param)) return {values, scales, at::Tensor(), 32};
  const dtensor::LocalShard s = dtensor::local_shard(dtensor::dtensor_spec(param));
  const int64_t K = param.size(1);
  if (!s.box || s.offset[1] % 32 != 0 || s.shape[1] % 32 != 0) {
    std::string degrees;
    for (int64_t d = 1; d <= std::min<int64_t>(K / 32, 64); ++d) {
      if ((K / 32) % d == 0) degrees += (degrees.empty() ? "" : ", ") + std::to_string(d);
    }
    fail(path, "tensor '" + tensor + "' (Q4_0, in_features " + std::to_string(K) + ") is split by this TP layout " +
                   "inside its blocks of 32; degrees that keep whole blocks: " + degrees);
  }
  const at::Tensor v = values.narrow(0, s.offset[0] - begin, s.shape[0]).narrow(1, s.offset[1] / 2, s.shape[1] / 2);
  const at::Tensor d = scales.narrow(0, s.offset[0] - begin, s.shape[0]).narrow(1, s.offset[1] / 32, s.shape[1] / 32);
  const dtensor::DeviceMesh& mesh = dtensor::device_mesh(param);
  const dtensor::Placements& p = dtensor::placements(param);
  return {dtensor::DTensor::from_local(v.contiguous(), mesh, p, false, std::vector<int64_t>{param.size(0), K / 2}),
          dtensor::DTensor::from_local(d.contiguous(), mesh, p, false, std::vector<int64_t>{param.size(0), K / 32}),
          at::Tensor(), 32};
}

}  // namespace

bool is_gguf_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  char magic[4] = {};
  const bool ok = std::fread(magic, 1, 4, f) == 4 && std::string(magic, 4) == "GGUF";
  std::fclose(f);
  return ok;
}

std::string gguf_dtype(const std::string& path) {
  const GgufFile f = GgufFile::open(path);
  const GgufTensor* e = f.find("token_embd.weight");
  if (e == nullptr) fail(path, "no token_embd.weight");
  using dtensor::checkpoint::GgmlType;
  switch (static_cast<GgmlType>(e->type)) {
    case GgmlType::F32: return "float32";
    case GgmlType::F16: return "float16";
    default: return "bfloat16";
  }
}

std::string hf_config_json_from_gguf(const std::string& path) { return config_json(GgufFile::open(path)).dump(2); }

namespace {
// config_from_gguf of an open file.
LlamaConfig config_of(const GgufFile& f) {
  LlamaConfig c = config_from_hf_json_text(config_json(f).dump(), f.path());
  if (const GgufTensor* t = f.find("rope_freqs.weight"); t != nullptr) {
    const at::Tensor factors = f.dequantize(*t, at::kDouble).reshape(-1);
    c.rotary.rope_scaling.freq_factors.assign(factors.data_ptr<double>(), factors.data_ptr<double>() + factors.numel());
    c.validate();
  }
  return c;
}
}  // namespace

std::set<std::string> q4_0_linear_weights(const std::string& path) {
  std::set<std::string> names;
  const GgufFile file = GgufFile::open(path);  // alive through the loop: a range-for over open(path).tensors() read
                                              // the freed file's list (the CI's SIGSEGV in llama_generate --gguf)
  for (const GgufTensor& t : file.tensors()) {
    const std::string name = hf_name(t.name);
    const bool linear = name == "lm_head.weight" || name.find("_proj.weight") != std::string::npos;
    if (linear && t.type == static_cast<uint32_t>(dtensor::checkpoint::GgmlType::Q4_0)) names.insert(name);
  }
  return names;
}

LlamaConfig config_from_gguf(const std::string& path) { return config_of(GgufFile::open(path)); }

void load_gguf_llama(const std::string& path, LlamaForCausalLM& model, bool keep_q4_0) {
  const GgufFile f = GgufFile::open(path);
  const LlamaConfig file = config_of(f);  // the header read once
  const LlamaConfig& want = model->config;
  if (!(file.vocab_size == want.vocab_size && file.hidden_size == want.hidden_size &&
        file.num_hidden_layers == want.num_hidden_layers && file.num_attention_heads == want.num_attention_heads &&
        file.num_key_value_heads == want.num_key_value_heads && file.intermediate_size == want.intermediate_size &&
        file.head_dim() == want.head_dim() && file.tie_word_embeddings == want.tie_word_embeddings &&
        file.rotary == want.rotary && file.norm.rms_norm_eps == want.norm.rms_norm_eps)) {
    fail(path, "its config (" + file.to_string() + ") is not the model's (" + want.to_string() + ")");
  }
  // Every tensor of the file is a parameter's (or rope_freqs, read into the config), with the parameter's shape;
  // every parameter of the model (adapters aside) comes from one tensor. All checked before anything is copied.
  auto params = model->named_parameters();
  std::vector<std::pair<const GgufTensor*, std::string>> plan;
  std::set<std::string> covered;
  for (const GgufTensor& t : f.tensors()) {
    if (t.name == "rope_freqs.weight") continue;
    const std::string name = hf_name(t.name);
    if (name.empty()) fail(path, "tensor '" + t.name + "' is not one of the llama architecture's");
    if (!dtensor::checkpoint::ggml_type_supported(t.type)) {
      fail(path, "tensor '" + t.name + "' is of type " + dtensor::checkpoint::ggml_type_name(t.type) +
                     ", which is not read (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K are)");
    }
    const at::Tensor* p = params.find(name);
    if (p == nullptr) continue;  // a layer this pipeline stage does not hold; tied lm_head is checked below
    if (p->sizes().vec() != t.shape) {
      std::ostringstream s;
      s << "tensor '" << t.name << "' has shape " << at::IntArrayRef(t.shape) << ", the model's " << name << " "
        << p->sizes();
      fail(path, s.str());
    }
    plan.emplace_back(&t, name);
    covered.insert(name);
  }
  for (const auto& item : params) {
    if (dtensor::peft::is_lora_parameter(item.key()) || covered.count(item.key())) continue;
    if (item.key() == "lm_head.weight" && want.tie_word_embeddings) continue;
    fail(path, "no tensor for the model's " + item.key());
  }
  // Each weight: this rank's rows dequantized into the parameter's dtype, in place in an otherwise untouched full
  // tensor (its other pages never written), which copy_from_full_ cuts to the shard; a Q4_0 Linear weight kept in its
  // stored form (the parameter's pages never written at all).
  at::NoGradGuard no_grad;
  auto modules = model->named_modules();
  for (const auto& [t, name] : plan) {
    const at::Tensor& param = params[name];
    const bool q = t->name.find(".attn_q.") != std::string::npos, k = t->name.find(".attn_k.") != std::string::npos;
    const auto [begin, end] = rows_read(param, q || k ? want.head_dim() : 1);
    const std::string fqn = name.substr(0, name.size() - std::string(".weight").size());
    if (keep_q4_0 && t->type == static_cast<uint32_t>(dtensor::checkpoint::GgmlType::Q4_0) && modules.contains(fqn) &&
        dynamic_cast<dtensor::nn::LinearImpl*>(modules[fqn].get()) != nullptr) {
      auto [values, scales] = f.q4_0_parts(*t, begin, end);
      if (q || k) {
        values = unpermute(values, (end - begin) / want.head_dim());
        scales = unpermute(scales, (end - begin) / want.head_dim());
      }
      dtensor::quant::set_int4_weight(*modules[fqn], fqn, q4_0_shard(path, t->name, param, begin, values, scales));
      f.release(*t);  // copied out: the file's pages leave this process's RSS
      continue;
    }
    at::Tensor full = at::empty(param.sizes(), at::TensorOptions().dtype(param.scalar_type()));
    if (end > begin) {
      at::Tensor rows = f.dequantize(*t, param.scalar_type(), begin, end);
      // convert_hf_to_gguf's permutation is within each head: the rows of whole heads un-permute alone.
      if (q || k) rows = unpermute(rows, (end - begin) / want.head_dim());
      full.narrow(0, begin, end - begin).copy_(rows);
    }
    dtensor::nn::copy_from_full_(param, full);
    f.release(*t);
  }
}

}  // namespace llama
