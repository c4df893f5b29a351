// The tokenizer against Hugging Face's: tests/oracle/hf_tokenizer_oracle.py trains BPE tokenizers with the
// `tokenizers` package on the Debian license texts plus a multilingual, emoji and whitespace-heavy sample, in
// the pipelines of GPT-2, Llama 3, Qwen2, Llama 2 / Mistral (byte fallback) and Gemma, saves them as
// transformers does and records AutoTokenizer's ids and decodes for every test line. The `spm` kind is a
// SentencePiece-only checkpoint (tokenizer.model), its ids and decodes from the sentencepiece library itself. Checked for every line: the ids (with the
// post-processor's special tokens), the decode with and without special tokens, and decode(encode(x)) == x
// wherever HF's own round trip holds; plus the special ids, and the errors for what we cannot read.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "harness/multi_rank.h"  // error_of
#include "oracle_dir.h"
#include "tokenizer/error.h"
#include "tokenizer/streamer.h"
#include "tokenizer/text.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kKinds = {"gpt2", "llama3", "qwen2", "llama2", "gemma", "spm"};

const std::string& root() {
  static const std::string dir = tokenizer_testing::make_oracle_dir("hf_tokenizer_oracle.py", "tokenizers");
  return dir;
}

std::vector<nlohmann::json> expected(const std::string& kind) {
  std::ifstream in(root() + "/" + kind + "/expected.jsonl");
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  }
  return rows;
}

class HfTokenizer : public ::testing::TestWithParam<std::string> {};

TEST_P(HfTokenizer, IdsAndDecodesEqualTransformersOnEveryLine) {
  const auto tok = tokenizer::Tokenizer::from_pretrained(root() + "/" + GetParam());
  const auto rows = expected(GetParam());
  ASSERT_GT(rows.size(), 300u);
  int64_t round_trips = 0, tokens = 0;
  for (const auto& row : rows) {
    const std::string text = row.at("text").get<std::string>();
    const auto want = row.at("ids").get<std::vector<int64_t>>();
    const auto ids = tok.encode(text);
    tokens += static_cast<int64_t>(ids.size());
    EXPECT_EQ(ids, want) << GetParam() << ": " << text;
    EXPECT_EQ(tok.decode(want), row.at("decoded").get<std::string>()) << GetParam() << ": " << text;
    EXPECT_EQ(tok.decode(want, /*skip_special_tokens=*/true), row.at("decoded_skip").get<std::string>()) << text;
    if (row.at("decoded_skip").get<std::string>() == text) {  // HF's round trip holds: ours must too
      EXPECT_EQ(tok.decode(tok.encode(text, /*add_special_tokens=*/false), true), text) << GetParam();
      ++round_trips;
    }
  }
  // Batch encode is the per-line encode.
  std::vector<std::string> texts;
  for (size_t i = 0; i < 20; ++i) texts.push_back(rows[i].at("text").get<std::string>());
  const auto batch = tok.encode_batch(texts);
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(batch[i], tok.encode(texts[i]));
  std::printf("%s: %zu lines, %lld tokens, %lld round trips\n", GetParam().c_str(), rows.size(),
              static_cast<long long>(tokens), static_cast<long long>(round_trips));
  EXPECT_GT(round_trips, static_cast<int64_t>(rows.size()) / 2);
}

TEST_P(HfTokenizer, SpecialIdsAreTransformers) {
  const auto tok = tokenizer::Tokenizer::from_pretrained(root() + "/" + GetParam());
  std::ifstream in(root() + "/" + GetParam() + "/expected_meta.json");
  const auto meta = nlohmann::json::parse(in);
  auto id = [](const std::optional<int64_t>& v) { return v ? nlohmann::json(*v) : nlohmann::json(); };
  EXPECT_EQ(id(tok.bos_token_id()), meta.at("bos_token_id")) << GetParam();
  EXPECT_EQ(id(tok.eos_token_id()), meta.at("eos_token_id")) << GetParam();
  EXPECT_EQ(id(tok.pad_token_id()), meta.at("pad_token_id")) << GetParam();
  EXPECT_EQ(tok.vocab_size(), meta.at("vocab_size").get<int64_t>()) << GetParam();
}

// The incremental stream against its naive reference: decode(prompt) followed by every put() and end() is
// decode(prompt + new ids), and no piece ends inside a UTF-8 character.
TEST_P(HfTokenizer, StreamedTextIsTheWholeDecode) {
  const auto tok = tokenizer::Tokenizer::from_pretrained(root() + "/" + GetParam());
  const auto rows = expected(GetParam());
  int64_t streams = 0;
  for (const auto& row : rows) {
    const auto ids = row.at("ids").get<std::vector<int64_t>>();
    if (ids.size() < 4) continue;
    for (size_t split : {size_t{0}, size_t{1}, ids.size() / 2}) {
      const std::vector<int64_t> prompt(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(split));
      const std::string prompt_text = tok.decode(prompt, true);
      if (prompt_text.size() >= 3 && prompt_text.compare(prompt_text.size() - 3, 3, "\xEF\xBF\xBD") == 0) continue;  // a prompt is whole text
      tokenizer::TextStreamer streamer(tok);
      streamer.prime(prompt);
      std::string streamed = prompt_text;
      for (size_t i = split; i < ids.size(); ++i) {
        const std::string piece = streamer.put(ids[i]);
        for (const auto& ch : tokenizer::utf8_chars(piece)) {
          EXPECT_EQ(ch.size(), tokenizer::utf8_length(static_cast<unsigned char>(ch[0]))) << "split character in " << row.at("text");
        }
        streamed += piece;
      }
      streamed += streamer.end();
      EXPECT_EQ(streamed, tok.decode(ids, true)) << GetParam() << ": " << row.at("text") << " split " << split;
      ++streams;
    }
  }
  EXPECT_GT(streams, 500);
}

// Whole UTF-8 characters only (a byte-level token may hold part of one).
bool whole_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

// token_bytes (what structured output masks by) against the decoder: for every token of the vocabulary whose bytes are
// whole UTF-8, the decode of [anchor, token] is the decode of [anchor] followed by them; added and control tokens
// have none.
TEST_P(HfTokenizer, TokenBytesAreWhatEachTokenAddsToTheDecode) {
  const auto tok = tokenizer::Tokenizer::from_pretrained(root() + "/" + GetParam());
  const int64_t anchor = tok.encode("a", /*add_special_tokens=*/false).at(0);
  const std::string before = tok.decode({anchor});
  int64_t checked = 0, partial = 0, none = 0;
  for (int64_t id = 0; id < tok.vocab_size(); ++id) {
    const auto bytes = tok.token_bytes(id);
    bool added = false;
    for (const auto& a : tok.added_tokens()) added = added || a.id == id;
    if (added) EXPECT_FALSE(bytes.has_value()) << GetParam() << " id " << id;
    if (!bytes) {
      ++none;
      continue;
    }
    if (!whole_utf8(*bytes)) {
      ++partial;  // part of a character: its decode alone is U+FFFD
      continue;
    }
    EXPECT_EQ(tok.decode({anchor, id}), before + *bytes) << GetParam() << " id " << id;
    ++checked;
  }
  EXPECT_GT(checked, tok.vocab_size() / 2) << GetParam() << ": " << partial << " partial";
  EXPECT_LT(none, 300) << GetParam();  // the added and control tokens only
}

INSTANTIATE_TEST_SUITE_P(Kinds, HfTokenizer, ::testing::ValuesIn(kKinds),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(TokenizerErrors, WhatWeCannotReadIsNamed) {
  using dtensor::testing::error_of;
  const std::string dir = root() + "/errors";
  fs::create_directories(dir);
  EXPECT_NE(error_of([&] { tokenizer::Tokenizer::from_pretrained(dir); }).find("no tokenizer.json or tokenizer.model"),
            std::string::npos);
  std::ofstream(dir + "/tokenizer.model") << "x";
  EXPECT_NE(error_of([&] { tokenizer::Tokenizer::from_pretrained(dir); }).find("cannot read SentencePiece model"),
            std::string::npos);
  const std::string bpe = R"("model": {"type": "BPE", "vocab": {"a": 0}, "merges": []})";
  EXPECT_NE(error_of([&] { tokenizer::Tokenizer::from_json(R"({"model": {"type": "WordPiece", "vocab": {}}})"); })
                .find("model type 'WordPiece'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { tokenizer::Tokenizer::from_json(R"({"normalizer": {"type": "BertNormalizer"}, )" + bpe + "}"); })
                .find("normalizer type 'BertNormalizer'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { tokenizer::Tokenizer::from_json(R"({"pre_tokenizer": {"type": "Whitespace"}, )" + bpe + "}"); })
                .find("pre_tokenizer type 'Whitespace'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { tokenizer::Tokenizer::from_json(R"({"decoder": {"type": "WordPiece"}, )" + bpe + "}"); })
                .find("decoder type 'WordPiece'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { tokenizer::Tokenizer::from_json("{" + bpe + "}").encode("b"); }).find("'b' is not in the vocabulary"),
            std::string::npos);
  EXPECT_NE(error_of([&] { tokenizer::Tokenizer::from_json("{nope"); }).find("not valid JSON"), std::string::npos);
}

}  // namespace
