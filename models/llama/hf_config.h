// HF config.json in and out. Reading dispatches on model_type to the family's file (llama/families/): the
// decoder fields every family shares are read here, the family reads its own, and any field left unread
// is an error naming it (a field we do not know may change the numerics: nothing loads silently wrong).
//
//   llama::LlamaConfig c = llama::config_from_hf_json(dir + "/config.json");  // llama, mistral, qwen2, qwen3
#pragma once

#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

#include "llama/config.h"

namespace llama {

// config.json's fields, each read at most once; what no one read is reported by unread().
//
// Null and absence are read as transformers reads them. An absent key leaves the field at the config class's
// default (the family sets it before reading). An explicit null is what the config class's __init__ makes of
// None: transformers >= 5 refuses None for most fields (strict dataclass validation), so read() refuses it,
// naming the key; a field whose class takes None says what None means with read_or() ("off", "derived",
// "none") or read_null_as_absent() (the class or the modeling code replaces None by its default).
class HfConfigReader {
 public:
  HfConfigReader(nlohmann::json json, std::string path);
  bool has(const std::string& key) const;      // present and not null
  bool is_null(const std::string& key) const;  // present and null
  // Sets `field` from the key when present and not null (a wrong JSON type is an error naming the key); an
  // explicit null is an error naming the key (transformers refuses it for this field).
  template <class T>
  bool read(const std::string& key, T& field) {
    if (is_null(key)) {
      seen_.insert(key);
      fail("field '" + key + "' is null; transformers' config class takes no null for it (leave it out for the "
           "default, or give a value)");
    }
    return read_null_as_absent(key, field);
  }
  // As read(), but null leaves `field` as absence does (the config class or the model replaces None by the
  // default).
  template <class T>
  bool read_null_as_absent(const std::string& key, T& field) {
    seen_.insert(key);
    if (!has(key)) return false;
    try {
      field = json_.at(key).get<T>();
    } catch (const std::exception& e) {
      fail("field '" + key + "' has the wrong type: " + e.what());
    }
    return true;
  }
  // As read(), but null sets `field` to `if_null` (what None means to the config class and the model code).
  template <class T, class U>
  bool read_or(const std::string& key, T& field, const U& if_null) {
    if (is_null(key)) {
      seen_.insert(key);
      field = if_null;
      return true;
    }
    return read_null_as_absent(key, field);
  }
  void ignore(const std::string& key) { seen_.insert(key); }  // known not to change the numerics
  const nlohmann::json& json() const { return json_; }
  const std::string& path() const { return path_; }
  [[noreturn]] void fail(const std::string& what) const;  // dtensor::Error naming the file
  std::vector<std::string> unread() const;

 private:
  nlohmann::json json_;
  std::string path_;
  std::set<std::string> seen_;
};

// The config class's defaults for the fields every family shares: what a key absent from config.json means.
struct ClassDefaults {
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;  // (the family's own key: norm_epsilon, layer_norm_eps)
  int64_t max_position_embeddings = 2048;
  int64_t num_key_value_heads = 0;  // 0: as many as the query heads
  bool tie_word_embeddings = false;
  const char* hidden_act = "silu";
  int64_t pad_token_id = -1;  // -1: none
};

// How a family's checkpoint names the weights the model keeps apart (llama/hf_weights.h splits them on load and
// packs them on export): the checkpoint's layout, not the model's numerics.
struct WeightNames {
  bool packed_qkv = false;       // self_attn.qkv_proj = [q_proj; k_proj; v_proj] rows (Phi-3)
  bool packed_gate_up = false;   // mlp.gate_up_proj = [gate_proj; up_proj] rows (Phi-3, GLM)
  bool mixtral_experts = false;  // block_sparse_moe.{gate, experts.E.w1 / w3 / w2} (Mixtral); else
                                 // mlp.{gate, experts.E.gate_proj / up_proj / down_proj} (Qwen-MoE)
};

// One model family: what transformers' modular_<family>.py changes relative to Llama, declared in one place (its
// file in llama/families/): the config fields it reads and writes (which select the decoder's parts: config.h's
// attention, norm, MLP, rotary and scaling groups), the config class's defaults, and its checkpoint's weight names.
// The plans follow from the parts (llama/parallelize.h), not from the family's name.
struct Family {
  std::string model_type;    // "mistral"
  std::string architecture;  // "MistralForCausalLM"
  void (*read)(HfConfigReader&, LlamaConfig&);                // the family's own fields
  void (*write)(const LlamaConfig&, nlohmann::ordered_json&);  // the same fields, as transformers saves them
  ClassDefaults defaults = {};
  WeightNames weights = {};
};
// The registered families, by model_type. Each file of llama/families/ registers its own at load time
// (DTENSOR_REGISTER_FAMILY), and the build compiles every file there: a new family is its file, with no edit
// elsewhere.
const std::vector<Family>& all_families();
struct FamilyRegistration {
  explicit FamilyRegistration(Family (*make)());
};
#define DTENSOR_REGISTER_FAMILY(make) static const ::llama::FamilyRegistration dtensor_family_##make{&make}
const Family* find_family(const std::string& model_type);  // null when no family has it
const Family& family(const std::string& model_type);       // dtensor::Error naming the supported ones

// Reads config.json: architectures / model_type name a supported family, every field is known (see above)
// and the values are ones we implement (hidden_act silu, no dropout, ...). Throws dtensor::Error.
LlamaConfig config_from_hf_json(const std::string& path);
LlamaConfig config_from_hf_json_text(const std::string& text, const std::string& origin = "config.json");
// The weights' dtype config.json names ("dtype"; "torch_dtype" before transformers 5), "" when it names none: what
// --dtype auto computes in (common/dtype.h). Not part of LlamaConfig: the same model runs in any dtype.
std::string checkpoint_dtype(const std::string& path);
// The config.json transformers' save_pretrained writes for `config`'s family (`dtype` is HF's name:
// "float32", "bfloat16", "float16").
std::string config_to_hf_json(const LlamaConfig& config, const std::string& dtype = "float32");

}  // namespace llama
