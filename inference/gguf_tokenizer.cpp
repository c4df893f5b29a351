#include "inference/gguf_tokenizer.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <stdlib.h>

#include "dtensor/checkpoint/gguf.h"
#include "dtensor/core/error.h"
#include "tokenizer/text.h"

namespace inference {
namespace {

using dtensor::checkpoint::GgufFile;
using dtensor::checkpoint::GgufValue;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw DTENSOR_ERROR("dtensor: GGUF file '", path, "': its tokenizer: ", what);
}

// transformers' GGUF_PRE_TOKENIZER_SPLITS for the pre-tokenizers read here.
const char* const kLlama3Split =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
const char* const kQwen2Split =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

const std::map<std::string, const char*>& splits() {
  static const std::map<std::string, const char*> m = {
      {"llama3", kLlama3Split},   {"llama-v3", kLlama3Split}, {"llama-bpe", kLlama3Split}, {"falcon3", kLlama3Split},
      {"smaug-bpe", kLlama3Split}, {"dbrx", kLlama3Split},    {"qwen2", kQwen2Split},     {"deepseek-r1-qwen", kQwen2Split}};
  return m;
}

// A token in GPT-2's byte alphabet as it is; another respelled from its UTF-8 bytes (transformers' byte_level_tokenizer).
std::string byte_level_spelling(const std::string& token, bool& in_alphabet) {
  std::string bytes;
  in_alphabet = tokenizer::unicode_to_bytes(token, bytes);
  if (in_alphabet) return token;
  std::string out;
  for (unsigned char b : token) out += tokenizer::byte_to_unicode(b);
  return out;
}

}  // namespace

bool gguf_has_tokenizer(const std::string& gguf_path) {
  return GgufFile::open(gguf_path).find_metadata("tokenizer.ggml.tokens") != nullptr;
}

void save_gguf_tokenizer(const std::string& gguf_path, const std::string& dir) {
  const GgufFile f = GgufFile::open(gguf_path);
  if (f.find_metadata("tokenizer.ggml.tokens") == nullptr) fail(gguf_path, "the file has no vocabulary (tokenizer.ggml.tokens)");
  const std::string& model = f.string("tokenizer.ggml.model");
  if (model != "gpt2") fail(gguf_path, "tokenizer.ggml.model '" + model + "' is not read (gpt2, a byte-level BPE, is)");
  const GgufValue* pre = f.find_metadata("tokenizer.ggml.pre");
  const std::string pre_name = pre != nullptr ? pre->string : "";
  auto split = splits().find(pre_name);
  if (split == splits().end()) {
    std::string names;
    for (const auto& [name, _] : splits()) names += (names.empty() ? "" : ", ") + name;
    fail(gguf_path, "tokenizer.ggml.pre '" + pre_name + "' is not read (" + names + " are)");
  }
  const auto& tokens = f.array("tokenizer.ggml.tokens");
  const GgufValue* types = f.find_metadata("tokenizer.ggml.token_type");
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object(), added = nlohmann::ordered_json::array();
  std::vector<std::string> spelled(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    bool in_alphabet = false;
    spelled[i] = byte_level_spelling(tokens[i].string, in_alphabet);
    vocab[spelled[i]] = i;
    const int64_t type = types != nullptr && i < types->array.size() ? types->array[i].integer : 1;
    // 3: control (special; one spelled outside the alphabet is llama.cpp's mislabel, skipped as transformers does);
    // 4: user-defined (a plain added token, matched whole).
    if ((type == 3 && in_alphabet) || type == 4) {
      added.push_back({{"id", i}, {"content", spelled[i]}, {"single_word", false}, {"lstrip", false},
                       {"rstrip", false}, {"normalized", false}, {"special", type == 3}});
    }
  }
  nlohmann::ordered_json merges = nlohmann::ordered_json::array();
  if (f.find_metadata("tokenizer.ggml.merges") == nullptr) fail(gguf_path, "a gpt2 vocabulary without tokenizer.ggml.merges");
  for (const GgufValue& m : f.array("tokenizer.ggml.merges")) merges.push_back(m.string);
  auto token_of = [&](const char* key) -> std::optional<std::string> {
    const GgufValue* v = f.find_metadata(std::string("tokenizer.ggml.") + key);
    if (v == nullptr) return std::nullopt;
    if (v->integer < 0 || static_cast<size_t>(v->integer) >= spelled.size()) {
      fail(gguf_path, std::string("tokenizer.ggml.") + key + " " + std::to_string(v->integer) + " is outside the vocabulary");
    }
    return spelled[static_cast<size_t>(v->integer)];
  };
  const auto bos = token_of("bos_token_id"), eos = token_of("eos_token_id"), pad = token_of("padding_token_id");
  const GgufValue* add_bos = f.find_metadata("tokenizer.ggml.add_bos_token");
  nlohmann::ordered_json post = nullptr;
  if (add_bos != nullptr && add_bos->boolean && bos) {  // BOS, then the text
    const int64_t bos_id = f.integer("tokenizer.ggml.bos_token_id");
    post = {{"type", "TemplateProcessing"},
            {"single", {{{"SpecialToken", {{"id", *bos}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
            {"pair", {{{"SpecialToken", {{"id", *bos}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                      {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
            {"special_tokens", {{*bos, {{"id", *bos}, {"ids", {bos_id}}, {"tokens", {*bos}}}}}}};
  }
  const nlohmann::ordered_json json = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", split->second}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}}},
      {"post_processor", post},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", vocab}, {"merges", merges}}}};
  nlohmann::ordered_json config = {{"tokenizer_class", "PreTrainedTokenizerFast"}};
  if (bos) config["bos_token"] = *bos;
  if (eos) config["eos_token"] = *eos;
  if (pad) config["pad_token"] = *pad;
  if (const GgufValue* t = f.find_metadata("tokenizer.chat_template"); t != nullptr) config["chat_template"] = t->string;
  std::filesystem::create_directories(dir);
  std::ofstream(std::filesystem::path(dir) / "tokenizer.json") << json.dump();
  std::ofstream(std::filesystem::path(dir) / "tokenizer_config.json") << config.dump(2);
}

tokenizer::Tokenizer load_gguf_tokenizer(const std::string& gguf_path) {
  std::string dir = (std::filesystem::temp_directory_path() / "dtensor-gguf-tokenizer-XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) throw DTENSOR_ERROR("dtensor: cannot make a temporary directory for the GGUF tokenizer");
  struct Remove {
    std::string dir;
    ~Remove() {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  } remove{dir};
  save_gguf_tokenizer(gguf_path, dir);
  return tokenizer::Tokenizer::from_pretrained(dir);
}

}  // namespace inference
