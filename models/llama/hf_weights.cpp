#include "llama/hf_weights.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <fstream>
#include <sstream>

#include "common/dtype.h"
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/checkpoint/safetensors.h"
#include "dtensor/checkpoint/state_dict.h"
#include "dtensor/core/error.h"
#include "dtensor/mesh/process_group.h"
#include "dtensor/api/dtensor_api.h"
#include "dtensor/tensor/dtensor.h"
#include "dtensor/nn/materialize.h"
#include "dtensor/peft/lora.h"
#include "llama/hf_config.h"

namespace fs = std::filesystem;

namespace llama {
namespace {

// The fields that decide the weights' shapes and meaning must agree; the rest (max positions) may differ.
void check_config(const std::string& dir, const LlamaConfig& file, const LlamaConfig& model) {
  auto check = [&](const char* field, const auto& a, const auto& b) {
    if (a == b) return;
    std::ostringstream s;
    s << "dtensor: load_hf_llama('" << dir << "'): config.json has " << field << " = " << a << ", the model " << b;
    throw DTENSOR_ERROR(s.str());
  };
  check("model_type", file.model_type, model.model_type);
  check("vocab_size", file.vocab_size, model.vocab_size);
  check("hidden_size", file.hidden_size, model.hidden_size);
  check("num_hidden_layers", file.num_hidden_layers, model.num_hidden_layers);
  check("num_attention_heads", file.num_attention_heads, model.num_attention_heads);
  check("num_key_value_heads", file.num_key_value_heads, model.num_key_value_heads);
  check("head_dim", file.head_dim(), model.head_dim());
  check("intermediate_size", file.intermediate_size, model.intermediate_size);
  check("tie_word_embeddings", file.tie_word_embeddings, model.tie_word_embeddings);
  check("attention_bias", file.attention.attention_bias, model.attention.attention_bias);
  check("q/k/v bias", file.q_bias(), model.q_bias());
  check("mlp_bias", file.mlp.mlp_bias, model.mlp.mlp_bias);
  check("q/k norm", file.attention.qk_norm, model.attention.qk_norm);
  check("use_qk_norm", file.attention.qk_norm_per_head_weight, model.attention.qk_norm_per_head_weight);
  check("rms_norm_eps", file.norm.rms_norm_eps, model.norm.rms_norm_eps);
  check("rope_theta", file.rotary.rope_theta, model.rotary.rope_theta);
  check("rope_type", file.rotary.rope_scaling.rope_type, model.rotary.rope_scaling.rope_type);
  check("sliding_window", file.attention.sliding_window, model.attention.sliding_window);
}


// A weight the checkpoint packs (Phi-3's qkv_proj, Phi-3's and GLM's gate_up_proj) and the model keeps as
// parts: the parts' rows, in order, are the packed weight's.
struct Packed {
  std::string name;                // the checkpoint's
  std::vector<std::string> parts;  // the model's
};

std::vector<Packed> packed_weights(const LlamaConfig& c) {
  std::vector<Packed> out;
  const WeightNames& names = family(c.model_type).weights;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string layer = "model.layers." + std::to_string(i) + ".";
    if (names.packed_qkv) {
      out.push_back({layer + "self_attn.qkv_proj.weight",
                     {layer + "self_attn.q_proj.weight", layer + "self_attn.k_proj.weight", layer + "self_attn.v_proj.weight"}});
    }
    if (names.packed_gate_up) {
      out.push_back({layer + "mlp.gate_up_proj.weight", {layer + "mlp.gate_proj.weight", layer + "mlp.up_proj.weight"}});
    }
  }
  return out;
}

// A model parameter the checkpoint stores in pieces: the experts (gate_up_proj [E, 2I, H] is E gate and E up
// weights [I, H]; down_proj [E, H, I] is E down weights [H, I]), and Mixtral's router under its own name. Piece
// k is rows [row, row + rows) of param[expert] (expert -1: the whole parameter).
struct Piece {
  std::string name;  // the checkpoint's
  int64_t expert, row, rows;
};
struct Assembled {
  std::string param;  // the model's
  std::vector<Piece> pieces;
};

std::vector<Assembled> assembled_weights(const LlamaConfig& c) {
  std::vector<Assembled> out;
  const bool mixtral = family(c.model_type).weights.mixtral_experts;
  const int64_t inter = c.moe.intermediate_size;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (!c.layer_is_moe(i)) continue;
    const std::string layer = "model.layers." + std::to_string(i) + ".";
    const std::string disk = layer + (mixtral ? "block_sparse_moe." : "mlp.");
    Assembled gate_up{layer + "mlp.experts.gate_up_proj", {}}, down{layer + "mlp.experts.down_proj", {}};
    for (int64_t e = 0; e < c.moe.num_experts; ++e) {
      const std::string expert = disk + "experts." + std::to_string(e) + ".";
      gate_up.pieces.push_back({expert + (mixtral ? "w1" : "gate_proj") + ".weight", e, 0, inter});
      gate_up.pieces.push_back({expert + (mixtral ? "w3" : "up_proj") + ".weight", e, inter, inter});
      down.pieces.push_back({expert + (mixtral ? "w2" : "down_proj") + ".weight", e, 0, c.hidden_size});
    }
    out.push_back(std::move(gate_up));
    out.push_back(std::move(down));
    if (mixtral) out.push_back({layer + "mlp.gate.weight", {{disk + "gate.weight", -1, 0, c.moe.num_experts}}});
  }
  return out;
}

// Piece `p` of the full value of its parameter, and its shape.
at::Tensor piece_of(const at::Tensor& full, const Piece& p) {
  return p.expert < 0 ? full : full[p.expert].narrow(0, p.row, p.rows);
}
template <class Params>
std::vector<int64_t> piece_shape(const Params& params, const Assembled& a, const Piece& p) {
  std::vector<int64_t> shape = params[a.param].sizes().vec();
  if (p.expert < 0) return shape;
  shape.erase(shape.begin());
  shape[0] = p.rows;
  return shape;
}

// The packed weight's shape: its parts' rows stacked.
template <class Params>
std::vector<int64_t> packed_shape(const Params& params, const Packed& p) {
  std::vector<int64_t> shape = params[p.parts[0]].sizes().vec();
  shape[0] = 0;
  for (const auto& part : p.parts) shape[0] += params[part].size(0);
  return shape;
}

// The model's parameters under the checkpoint's names, except the packed parts and the assembled ones.
dtensor::checkpoint::StateDict hf_state(LlamaForCausalLM& model, const std::vector<Packed>& packed,
                                        const std::vector<Assembled>& assembled) {
  std::set<std::string> parts;
  for (const auto& p : packed) parts.insert(p.parts.begin(), p.parts.end());
  for (const auto& a : assembled) parts.insert(a.param);
  const auto params = model->named_parameters();
  dtensor::checkpoint::StateDict state;
  for (const auto& [name, t] : dtensor::checkpoint::module_state_dict(*model)) {
    // Adapters (dtensor/peft) are no weights of the checkpoint: PEFT's adapter files hold them.
    if (params.contains(name) && !parts.count(name) && !dtensor::peft::is_lora_parameter(name)) state[name] = t;
  }
  return state;
}

at::Tensor full_value(const at::Tensor& t) { return dtensor::is_dtensor(t) ? dtensor::full_tensor(t.detach()) : t.detach(); }

}  // namespace

void load_hf_llama(const std::string& dir, LlamaForCausalLM& model, bool map_in_place) {
  check_config(dir, config_from_hf_json((fs::path(dir) / "config.json").string()), model->config);
  // Parameters only: HF files hold no buffers of ours. A tied lm_head.weight is embed_tokens' tensor, listed
  // once (module_state_dict) under model.embed_tokens.weight; a file may still store lm_head.weight.
  std::vector<Packed> packed = packed_weights(model->config);
  std::vector<Assembled> assembled = assembled_weights(model->config);
  // A pipeline stage (parallelize_pipeline.h) reads the tensors of what it holds: the file's others stay unread.
  std::vector<std::string> absent;
  for (int64_t i = 0; i < model->config.num_hidden_layers; ++i) {
    if (!model->model->layers->contains(std::to_string(i))) absent.push_back("model.layers." + std::to_string(i) + ".*");
  }
  if (!model->model->embed_tokens) absent.push_back("model.embed_tokens.*");
  if (!model->model->norm) absent.push_back("model.norm.*");
  if (!model->lm_head) absent.push_back("lm_head.*");
  {
    const auto held = model->named_parameters();
    std::erase_if(packed, [&](const Packed& p) { return !held.contains(p.parts[0]); });
    std::erase_if(assembled, [&](const Assembled& a) { return !held.contains(a.param); });
  }
  dtensor::checkpoint::StateDict state = hf_state(model, packed, assembled);
  // First every weight the model holds as it is (each rank reads its slices). Every other tensor of the file must be
  // a packed weight, an expert's piece, or (tied embeddings) lm_head.weight: exactly those may stay unread here.
  std::vector<std::string> later = absent;
  if (model->config.tie_word_embeddings) later.push_back("lm_head.weight");
  for (const auto& p : packed) later.push_back(p.name);
  for (const auto& a : assembled) {
    for (const auto& piece : a.pieces) later.push_back(piece.name);
  }
  dtensor::checkpoint::load(dir, state, {.allow_unused_names = later, .allow_dtype_cast = true, .map_in_place = map_in_place});
  // Then a packed weight, or one parameter's pieces, at a time: each is read whole on every rank and cut into its
  // parts' shards, so a rank holds at most one such whole tensor beside its own parameters.
  const auto params = model->named_parameters();
  at::NoGradGuard no_grad;
  const dtensor::checkpoint::LoadOptions rest{.allow_unused = true, .allow_dtype_cast = true};
  for (const auto& p : packed) {
    dtensor::checkpoint::StateDict one;
    one[p.name] = at::empty(packed_shape(params, p), at::TensorOptions().dtype(params[p.parts[0]].scalar_type()));
    dtensor::checkpoint::load(dir, one, rest);
    int64_t row = 0;
    for (const auto& part : p.parts) {
      const int64_t n = params[part].size(0);
      dtensor::nn::copy_from_full_(params[part], one[p.name].narrow(0, row, n));
      row += n;
    }
  }
  for (const auto& a : assembled) {
    dtensor::checkpoint::StateDict pieces;
    for (const auto& piece : a.pieces) {
      pieces[piece.name] = at::empty(piece_shape(params, a, piece), at::TensorOptions().dtype(params[a.param].scalar_type()));
    }
    dtensor::checkpoint::load(dir, pieces, rest);
    at::Tensor full = at::empty(params[a.param].sizes(), at::TensorOptions().dtype(params[a.param].scalar_type()));
    for (const auto& piece : a.pieces) piece_of(full, piece).copy_(pieces[piece.name]);
    dtensor::nn::copy_from_full_(params[a.param], full);
  }
}

void save_hf_llama(const std::string& dir, LlamaForCausalLM& model, std::optional<at::ScalarType> as) {
  for (const auto& item : model->named_parameters()) {  // a packed weight's values are in the kernel's order, not HF's
    DTENSOR_CHECK(item.value().scalar_type() != at::kUInt16, "dtensor: save_hf_llama: ", item.key(), " is packed for the "
                  "batched GEMM (weights prepack): save the model before packing it (--no-weights-prepack)");
  }
  const at::ScalarType dtype = as.value_or(model->model->embed_tokens->weight.scalar_type());  // default: the model's
  const std::string dtype_name = models::dtype_name(dtype);
  const int rank = dtensor::is_initialized() ? dtensor::current_world()->rank() : 0;
  const std::vector<Packed> packed = packed_weights(model->config);
  const std::vector<Assembled> assembled = assembled_weights(model->config);
  const auto params = model->named_parameters();
  // Each stored weight, its shape and how to get its full value: a parameter gathered, a packed weight's
  // parts gathered and stacked, or a piece of an assembled parameter (gathered once).
  struct Weight {
    std::string name;
    std::vector<int64_t> shape;
    std::function<at::Tensor()> full;
  };
  std::vector<Weight> weights;
  for (const auto& [name, t] : hf_state(model, packed, assembled)) {
    weights.push_back({name, t.sizes().vec(), [t] { return full_value(t); }});
  }
  std::map<std::string, at::Tensor> gathered;  // assembled parameters' full values
  for (const auto& a : assembled) {
    for (const auto& piece : a.pieces) {
      weights.push_back({piece.name, piece_shape(params, a, piece), [&params, &gathered, &a, &piece] {
                           auto it = gathered.find(a.param);
                           if (it == gathered.end()) it = gathered.emplace(a.param, full_value(params[a.param])).first;
                           return piece_of(it->second, piece);
                         }});
    }
  }
  for (const auto& p : packed) {
    weights.push_back({p.name, packed_shape(params, p), [&params, &p] {
                         std::vector<at::Tensor> parts;
                         for (const auto& part : p.parts) parts.push_back(full_value(params[part]));
                         return at::cat(parts, 0);
                       }});
  }
  std::sort(weights.begin(), weights.end(), [](const Weight& a, const Weight& b) { return a.name < b.name; });
  std::vector<dtensor::checkpoint::TensorInfo> layout;
  for (const auto& w : weights) layout.push_back({w.name, dtype, w.shape});
  std::unique_ptr<dtensor::checkpoint::SafetensorsWriter> writer;
  if (rank == 0) {
    fs::create_directories(dir);
    writer = std::make_unique<dtensor::checkpoint::SafetensorsWriter>((fs::path(dir) / "model.safetensors").string(), layout,
                                                                      std::map<std::string, std::string>{{"format", "pt"}});
  }
  {
    at::NoGradGuard no_grad;
    for (const auto& w : weights) {
      // One weight at a time: Shard -> Replicate = all-gather, on every rank; only rank 0 keeps and writes it.
      const at::Tensor full = w.full();
      if (writer) writer->write(full.to(dtype));
    }
  }
  if (writer) {
    writer->finish();
    std::ofstream(fs::path(dir) / "config.json") << config_to_hf_json(model->config, dtype_name);
  }
  if (dtensor::is_initialized()) dtensor::current_world()->world_group()->barrier();  // the files are there for all
}

}  // namespace llama
