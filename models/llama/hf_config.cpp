// The fields every family shares (transformers' PreTrainedConfig and LlamaConfig's sizes, norms and rope).
#include "llama/hf_config.h"

#include <fstream>

#include "dtensor/core/error.h"

namespace llama {
namespace {

// PreTrainedConfig's bookkeeping and generation defaults: none changes the model's numerics.
const char* const kIgnored[] = {
    "transformers_version", "torch_dtype", "dtype", "bos_token_id", "eos_token_id", "sep_token_id",
    "decoder_start_token_id", "use_cache", "initializer_range", "_name_or_path", "name_or_path", "output_attentions",
    "output_hidden_states", "return_dict", "use_return_dict", "torchscript", "id2label", "label2id", "problem_type",
    "tokenizer_class", "prefix", "task_specific_params", "finetuning_task", "is_decoder", "is_encoder_decoder",
    "add_cross_attention", "tie_encoder_decoder", "chunk_size_feed_forward", "pruned_heads",
    "cross_attention_hidden_size", "tf_legacy_loss", "use_bfloat16", "return_dict_in_generate", "output_scores",
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
    "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "output_router_logits", "_attn_implementation_autoset", "attn_implementation"};

// rope_parameters (transformers >= 5) or rope_scaling (before, with rope_theta at the top level).
void read_rope(HfConfigReader& r, LlamaConfig& c) {
  r.read("rope_theta", c.rotary.rope_theta);
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    r.ignore(key);
    if (!r.has(key)) continue;
    nlohmann::json rope = r.json().at(key);
    if (!rope.is_object()) r.fail(std::string(key) + " must be an object");
    bool nested = false;
    if (rope.contains("full_attention") || rope.contains("sliding_attention")) {
      // Per layer type (Gemma 3): the full layers' rope is the model's; the sliding layers' must be default,
      // their own base read as rope_local_theta.
      if (rope.contains("sliding_attention")) {
        HfConfigReader local(rope.at("sliding_attention"), r.path() + ": " + key + ".sliding_attention");
        std::string type = "default";
        local.read("rope_type", type);
        if (type != "default") local.fail("rope_type '" + type + "' is not supported for sliding layers (default)");
        local.read("rope_theta", c.rotary.local_theta);
        for (const auto& k : local.unread()) local.fail("field '" + k + "' is not known; it may change the rotary embedding");
      }
      for (const auto& item : rope.items()) {
        if (item.key() != "full_attention" && item.key() != "sliding_attention") {
          r.fail(std::string(key) + " has layer type '" + item.key() + "' (full_attention, sliding_attention)");
        }
      }
      rope = rope.value("full_attention", nlohmann::json::object());
      nested = true;
    }
    HfConfigReader p(rope, r.path() + ": " + key);
    RopeScaling& s = c.rotary.rope_scaling;
    p.read("rope_theta", c.rotary.rope_theta);
    std::string type = "default";
    if (!p.read("rope_type", type)) p.read("type", type);
    p.ignore("type");
    static const std::set<std::string> kTypes = {"default", "linear", "dynamic", "yarn", "longrope", "llama3"};
    if (!kTypes.count(type)) {
      p.fail("rope_type '" + type + "' is not supported (default, linear, dynamic, yarn, longrope, llama3)");
    }
    s.rope_type = type;
    // transformers reads factor (yarn, longrope), attention_factor, mscale, mscale_all_dim, beta_fast and
    // beta_slow with .get(): null is derived or the default, as absence is; truncate's null is falsy (no
    // truncation); the others' null fails in transformers and is refused here.
    double factor = 0;
    if (type == "yarn" || type == "longrope" ? p.read_null_as_absent("factor", factor) : p.read("factor", factor)) {
      s.factor = factor;
    }
    p.read("low_freq_factor", s.low_freq_factor);
    p.read("high_freq_factor", s.high_freq_factor);
    // Absent for llama3 / yarn / longrope: max_position_embeddings (transformers' standardize_rope_params).
    if (s.has_original_max()) s.original_max_position_embeddings = c.max_position_embeddings;
    p.read("original_max_position_embeddings", s.original_max_position_embeddings);
    double v = 0;
    if (p.read_null_as_absent("attention_factor", v)) s.attention_factor = v;
    if (p.read_null_as_absent("mscale", v)) s.mscale = v;
    if (p.read_null_as_absent("mscale_all_dim", v)) s.mscale_all_dim = v;
    p.read_null_as_absent("beta_fast", s.beta_fast);
    p.read_null_as_absent("beta_slow", s.beta_slow);
    p.read_or("truncate", s.truncate, false);
    // transformers reads truncate from config.rope_parameters itself, which for a per-layer-type rope is the outer
    // dict: it is always true there, whatever the full layers' dict says.
    if (nested) s.truncate = true;
    p.read("short_factor", s.short_factor);
    p.read("long_factor", s.long_factor);
    p.read("partial_rotary_factor", c.rotary.partial_rotary_factor);
    for (const auto& k : p.unread()) p.fail("field '" + k + "' is not known; it may change the rotary embedding");
    auto need = [&](bool ok, const char* field) {
      if (!ok) p.fail("rope_type '" + type + "' needs '" + field + "'");
    };
    if (type == "linear" || type == "dynamic" || type == "llama3") need(s.factor.has_value(), "factor");
    if (s.has_original_max()) {
      need(s.original_max_position_embeddings > 0, "original_max_position_embeddings");
    }
    if (type == "longrope") need(!s.short_factor.empty() && !s.long_factor.empty(), "short_factor and long_factor");
  }
}

void write_rope(const LlamaConfig& c, nlohmann::ordered_json& j) {
  const RopeScaling& s = c.rotary.rope_scaling;
  nlohmann::ordered_json rope = {{"rope_theta", c.rotary.rope_theta}, {"rope_type", s.rope_type}};
  if (s.factor) rope["factor"] = *s.factor;
  if (s.rope_type == "llama3") {
    rope["low_freq_factor"] = s.low_freq_factor;
    rope["high_freq_factor"] = s.high_freq_factor;
  }
  if (s.original_max_position_embeddings > 0) rope["original_max_position_embeddings"] = s.original_max_position_embeddings;
  if (s.attention_factor) rope["attention_factor"] = *s.attention_factor;
  if (s.rope_type == "yarn") {
    rope["beta_fast"] = s.beta_fast;
    rope["beta_slow"] = s.beta_slow;
    rope["truncate"] = s.truncate;
    if (s.mscale) rope["mscale"] = *s.mscale;
    if (s.mscale_all_dim) rope["mscale_all_dim"] = *s.mscale_all_dim;
  }
  if (s.rope_type == "longrope") {
    rope["short_factor"] = s.short_factor;
    rope["long_factor"] = s.long_factor;
  }
  if (c.rotary.partial_rotary_factor != 1.0) rope["partial_rotary_factor"] = c.rotary.partial_rotary_factor;
  if (c.rotary.local_theta > 0) {  // per layer type (Gemma 3)
    j["rope_parameters"] = {{"full_attention", rope},
                            {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", c.rotary.local_theta}}}};
    return;
  }
  j["rope_parameters"] = rope;
}

std::string supported() {
  std::string known;
  for (const Family& f : all_families()) known += (known.empty() ? "" : ", ") + f.model_type;
  return known;
}

}  // namespace

HfConfigReader::HfConfigReader(nlohmann::json json, std::string path) : json_(std::move(json)), path_(std::move(path)) {}

bool HfConfigReader::has(const std::string& key) const { return json_.contains(key) && !json_.at(key).is_null(); }
bool HfConfigReader::is_null(const std::string& key) const { return json_.contains(key) && json_.at(key).is_null(); }

void HfConfigReader::fail(const std::string& what) const {
  throw DTENSOR_ERROR("dtensor: config '", path_, "': ", what);
}

std::vector<std::string> HfConfigReader::unread() const {
  std::vector<std::string> out;
  for (const auto& item : json_.items()) {
    if (!seen_.count(item.key())) out.push_back(item.key());
  }
  return out;
}

const Family* find_family(const std::string& model_type) {
  for (const Family& f : all_families()) {
    if (f.model_type == model_type) return &f;
  }
  return nullptr;
}

const Family& family(const std::string& model_type) {
  if (const Family* f = find_family(model_type)) return *f;
  throw DTENSOR_ERROR("dtensor: model_type '", model_type, "' is not supported (supported: ", supported(), ")");
}

LlamaConfig config_from_hf_json_text(const std::string& text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw DTENSOR_ERROR("dtensor: config '", origin, "' is not valid JSON: ", e.what());
  }
  HfConfigReader r(std::move(j), origin);
  if (!r.json().is_object()) r.fail("not a JSON object");
  std::string model_type;
  std::vector<std::string> architectures;
  r.read("architectures", architectures);
  if (!r.read("model_type", model_type)) {
    // Older files may name only the architecture: the family whose it is.
    for (const Family& f : all_families()) {
      if (architectures.size() == 1 && architectures[0] == f.architecture) model_type = f.model_type;
    }
    if (model_type.empty()) r.fail("no model_type, and no supported architecture names the family");
  }
  const Family* fam = find_family(model_type);
  if (fam == nullptr) r.fail("model_type '" + model_type + "' is not supported (supported: " + supported() + ")");
  for (const auto& a : architectures) {
    if (a != fam->architecture) {
      r.fail("architectures names '" + a + "'; dtensor runs '" + fam->architecture + "' for model_type '" + model_type + "'");
    }
  }
  LlamaConfig c;
  c.model_type = model_type;
  const ClassDefaults& d = fam->defaults;
  c.rotary.rope_theta = d.rope_theta;
  c.norm.rms_norm_eps = d.rms_norm_eps;
  c.max_position_embeddings = d.max_position_embeddings;
  c.tie_word_embeddings = d.tie_word_embeddings;
  c.mlp.hidden_act = d.hidden_act;
  if (d.pad_token_id >= 0) c.pad_token_id = d.pad_token_id;
  r.read("vocab_size", c.vocab_size);
  r.read("hidden_size", c.hidden_size);
  r.read("num_hidden_layers", c.num_hidden_layers);
  r.read("num_attention_heads", c.num_attention_heads);
  // Absent: the class's default (most: the query heads); null: the query heads.
  c.num_key_value_heads = d.num_key_value_heads > 0 ? d.num_key_value_heads : c.num_attention_heads;
  r.read_or("num_key_value_heads", c.num_key_value_heads, c.num_attention_heads);
  r.read("intermediate_size", c.intermediate_size);
  r.read("max_position_embeddings", c.max_position_embeddings);
  r.read("rms_norm_eps", c.norm.rms_norm_eps);
  r.read("tie_word_embeddings", c.tie_word_embeddings);
  int64_t pad = 0;
  if (r.is_null("pad_token_id")) c.pad_token_id.reset();  // null: none
  if (r.read_null_as_absent("pad_token_id", pad)) c.pad_token_id = pad;
  read_rope(r, c);
  r.read("hidden_act", c.mlp.hidden_act);
  if (c.mlp.hidden_act != "silu" && c.mlp.hidden_act != "gelu_pytorch_tanh" && c.mlp.hidden_act != "gelu") {
    r.fail("hidden_act '" + c.mlp.hidden_act + "' is not supported (silu, gelu_pytorch_tanh, gelu)");
  }
  double dropout = 0.0;  // null: none (transformers' eval runs no dropout)
  if (r.read_null_as_absent("attention_dropout", dropout) && dropout != 0.0) {
    r.fail("attention_dropout " + std::to_string(dropout) + " is not supported (0.0: no dropout)");
  }
  if (r.has("quantization_config")) {
    const nlohmann::json& q = r.json().at("quantization_config");
    const std::string method = q.is_object() && q.contains("quant_method") && q.at("quant_method").is_string()
                                   ? q.at("quant_method").get<std::string>() : "unnamed";
    r.fail("quantization_config (quant_method '" + method + "'): quantized checkpoints are not read; dtensor loads "
           "bfloat16, float16 and float32 weights (and quantizes them on load with --quantize int8 or int4)");
  }
  for (const char* key : kIgnored) r.ignore(key);
  fam->read(r, c);
  // One spelling of a head_dim equal to hidden / heads (our export writes it), so that an export reads back equal.
  if (c.attention.head_dim > 0 && c.num_attention_heads > 0 && c.attention.head_dim * c.num_attention_heads == c.hidden_size) {
    c.attention.head_dim = 0;
  }
  const auto unread = r.unread();
  if (!unread.empty()) {
    r.fail("field '" + unread.front() + "' is not one dtensor knows for model_type '" + model_type +
           "'; it may change the numerics, so the checkpoint is refused rather than run differently");
  }
  c.validate();
  return c;
}

std::string checkpoint_dtype(const std::string& path) {
  std::ifstream in(path);
  DTENSOR_CHECK(in, "dtensor: config: cannot open '", path, "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw DTENSOR_ERROR("dtensor: config '", path, "' is not valid JSON: ", e.what());
  }
  for (const char* key : {"dtype", "torch_dtype"}) {  // transformers >= 5 writes "dtype", before "torch_dtype"
    if (j.is_object() && j.contains(key) && j.at(key).is_string()) return j.at(key).get<std::string>();
  }
  return "";
}

LlamaConfig config_from_hf_json(const std::string& path) {
  std::ifstream in(path);
  DTENSOR_CHECK(in, "dtensor: config: cannot open '", path, "'");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return config_from_hf_json_text(text, path);
}

std::string config_to_hf_json(const LlamaConfig& c, const std::string& dtype) {
  DTENSOR_CHECK(c.rotary.rope_scaling.freq_factors.empty(), "dtensor: config.json: the model's rope freq_factors (a GGUF's "
                "rope_freqs) have no config.json field; transformers would rotate without them");
  const Family& fam = family(c.model_type);
  nlohmann::ordered_json j = {{"architectures", {fam.architecture}},
                              {"model_type", fam.model_type},
                              {"vocab_size", c.vocab_size},
                              {"hidden_size", c.hidden_size},
                              {"intermediate_size", c.intermediate_size},
                              {"num_hidden_layers", c.num_hidden_layers},
                              {"num_attention_heads", c.num_attention_heads},
                              {"num_key_value_heads", c.num_key_value_heads},
                              {"hidden_act", c.mlp.hidden_act},
                              {"max_position_embeddings", c.max_position_embeddings},
                              {"rms_norm_eps", c.norm.rms_norm_eps},
                              {"attention_dropout", 0.0},
                              {"tie_word_embeddings", c.tie_word_embeddings}};
  j["pad_token_id"] = c.pad_token_id ? nlohmann::ordered_json(*c.pad_token_id) : nullptr;  // absent: the class's default
  write_rope(c, j);
  fam.write(c, j);
  j["dtype"] = dtype;        // transformers >= 5
  j["torch_dtype"] = dtype;  // before
  return j.dump(2);
}

}  // namespace llama
