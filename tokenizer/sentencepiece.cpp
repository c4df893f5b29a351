// A SentencePiece tokenizer.model (old Llama 2 / Mistral repositories ship only this), read and run by Debian's
// libsentencepiece, as the checkpoint's authors ran it: the pieces are sentencepiece's own (its normalizer,
// dummy prefix and byte fallback), with bos / eos added as tokenizer_config.json's add_bos_token (default true,
// LlamaTokenizer's) and add_eos_token (default false) ask. Text that spells a control token ("<s>") stays
// text, as in sentencepiece; decode is sentencepiece's (control tokens decode to nothing).
//
// transformers 5 has no SentencePiece backend: it converts tokenizer.model to a tokenizers pipeline whose
// Metaspace adds no "▁" before a text that starts with a space, and which matches "<s>" in text as the special
// token. docs/design/tokenizer.md records where the two differ.
#include <sentencepiece_processor.h>

#include <nlohmann/json.hpp>

#include "tokenizer/backend.h"
#include "tokenizer/error.h"

namespace tokenizer {
namespace {

class SentencePieceBackend final : public Backend {
 public:
  SentencePieceBackend(const std::string& path, const nlohmann::json& config) {
    const auto status = sp_.Load(path);
    if (!status.ok()) throw Error("tokenizer: cannot read SentencePiece model '" + path + "': " + status.ToString());
    const nlohmann::json c = config.is_object() ? config : nlohmann::json::object();
    add_bos_ = c.value("add_bos_token", true) && sp_.bos_id() >= 0;
    add_eos_ = c.value("add_eos_token", false) && sp_.eos_id() >= 0;
  }

  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens) const override {
    std::vector<int> pieces;
    const auto status = sp_.Encode(text, &pieces);
    if (!status.ok()) throw Error("tokenizer: SentencePiece encode failed: " + status.ToString());
    std::vector<int64_t> ids;
    ids.reserve(pieces.size() + 2);
    if (add_special_tokens && add_bos_) ids.push_back(sp_.bos_id());
    ids.insert(ids.end(), pieces.begin(), pieces.end());
    if (add_special_tokens && add_eos_) ids.push_back(sp_.eos_id());
    return ids;
  }

  std::string decode(const std::vector<int64_t>& ids, bool /*skip_special_tokens*/) const override {
    std::vector<int> pieces;
    pieces.reserve(ids.size());
    for (int64_t id : ids) {
      if (id < 0 || id >= sp_.GetPieceSize()) {
        throw Error("tokenizer: decode: id " + std::to_string(id) + " is not in the vocabulary");
      }
      pieces.push_back(static_cast<int>(id));
    }
    std::string text;
    const auto status = sp_.Decode(pieces, &text);
    if (!status.ok()) throw Error("tokenizer: SentencePiece decode failed: " + status.ToString());
    return text;
  }

  std::optional<int64_t> token_to_id(const std::string& token) const override {
    const int id = sp_.PieceToId(token);
    if (id < 0 || sp_.IdToPiece(id) != token) return std::nullopt;
    return id;
  }

  std::optional<std::string> id_to_token(int64_t id) const override {
    if (id < 0 || id >= sp_.GetPieceSize()) return std::nullopt;
    return sp_.IdToPiece(static_cast<int>(id));
  }

  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  const std::vector<AddedToken>& added_tokens() const override { return none_; }
  bool is_control(int64_t id) const override {
    const int i = static_cast<int>(id);
    return sp_.IsControl(i) || sp_.IsUnknown(i) || sp_.IsUnused(i);
  }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  bool add_bos_ = true, add_eos_ = false;
  std::vector<AddedToken> none_;
};

}  // namespace

std::unique_ptr<Backend> sentencepiece_backend(const std::string& model_path, const nlohmann::json& config) {
  return std::make_unique<SentencePieceBackend>(model_path, config);
}

}  // namespace tokenizer
