// Structured output's engine (inference/structured): the JSON-schema grammar against a corpus of schemas
// (tests/data/structured/schemas.json: texts each grammar must take whole, and texts it must refuse), the schemas it
// refuses by name (bad_schemas.json), the token mask's trie walk against the naive per-token reference on random walks
// through each grammar, and every text those walks complete checked by the `jsonschema` package
// (tests/oracle/jsonschema_oracle.py), as are the corpus's valid texts.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <random>

#include "harness/subprocess.h"
#include "harness/temp_dir.h"
#include "inference/structured/json_schema.h"
#include "inference/structured/token_mask.h"

namespace {

using json = nlohmann::ordered_json;  // a schema's properties are generated in their order
using structured::Grammar;
using structured::Matcher;

json read_json(const std::string& name) {
  std::ifstream in(std::string(DTENSOR_SOURCE_DIR) + "/tests/data/structured/" + name);
  return json::parse(in);
}

Grammar grammar_of(const json& c) {
  return c.value("json_object", false) ? structured::json_object_grammar() : structured::json_schema_grammar(c["schema"]);
}

bool takes_whole(const Grammar& g, const std::string& text) {
  Matcher m(g);
  return m.accept(text) && m.can_end();
}

// A vocabulary like a byte-level BPE's: every byte, then JSON's pieces, words, whitespace runs, multi-byte characters
// and tokens that split one (東 = e6 9d b1), and last a special token (never allowed) and the end-of-sequence token.
std::vector<std::optional<std::string>> vocabulary(int64_t& eos) {
  std::vector<std::optional<std::string>> v;
  for (int b = 0; b < 256; ++b) v.emplace_back(std::string(1, static_cast<char>(b)));
  for (const char* s : {"{\"", "\":", "\": ", "\",", "\", \"", "\"}", "},", "}]", "[{", "[]", "{}", "true", "false", "null",
                        "tr", "ue", "nu", "ll", "12", "345", "0.", "e+", "-1", "1e", "name", "age", "ok", "color", "red",
                        "green", "tags", "items", "sku", "qty", "note", "children", "\"v\"", "Ann", " the", " a", "hello",
                        "  ", "    ", "\n", "\n  ", "\n    ", "\t", ",\n", "ü", "東", "🙂", "\xe6\x9d", "\xb1", "\\n", "\\u00",
                        "e9", "\\\"", "\"\"", "\": {\"", "\": [", "]}", ", ", " \"", "\"k\"", "\"s\"", "\"a\"", "\"x\""}) {
    v.emplace_back(std::string(s));
  }
  v.emplace_back(std::nullopt);  // a special token
  eos = static_cast<int64_t>(v.size());
  v.emplace_back(std::nullopt);
  return v;
}

TEST(StructuredOutput, SchemaGrammarsTakeTheValidTextsAndRefuseTheRest) {
  int64_t checked = 0;
  for (const json& c : read_json("schemas.json")) {
    const Grammar g = grammar_of(c);
    for (const auto& text : c["valid"]) {
      EXPECT_TRUE(takes_whole(g, text.get<std::string>())) << c["name"] << ": " << text;
      ++checked;
    }
    for (const auto& text : c["invalid"]) {
      EXPECT_FALSE(takes_whole(g, text.get<std::string>())) << c["name"] << ": " << text;
      ++checked;
    }
  }
  EXPECT_GE(checked, 70);
}

TEST(StructuredOutput, UnsupportedSchemasAreRefusedNamingTheKeyword) {
  for (const json& c : read_json("bad_schemas.json")) {
    try {
      structured::json_schema_grammar(c[0]);
      ADD_FAILURE() << "accepted " << c[0].dump();
    } catch (const structured::SchemaError& e) {
      EXPECT_NE(std::string(e.what()).find(c[1].get<std::string>()), std::string::npos) << e.what();
    }
  }
}

TEST(StructuredOutput, MatcherFollowsBytesAndEndsOnlyWhenComplete) {
  const Grammar g = structured::json_schema_grammar(json::parse(R"({"enum": ["ab", "abc"]})"));
  Matcher m(g);
  EXPECT_FALSE(m.accept(std::string("\"ax")));  // refused whole: the matcher is unchanged
  EXPECT_TRUE(m.accept(std::string("\"ab")));
  EXPECT_FALSE(m.can_end());
  Matcher shorter = m;
  EXPECT_TRUE(shorter.accept('"'));
  EXPECT_TRUE(shorter.can_end());
  EXPECT_TRUE(shorter.finished());
  EXPECT_TRUE(m.accept(std::string("c\"")));
  EXPECT_TRUE(m.finished());
  EXPECT_FALSE(m.accept(' '));
  // Valid UTF-8 only, a character split over tokens included.
  const Grammar s = structured::json_schema_grammar(json::parse(R"({"type": "string"})"));
  Matcher u(s);
  EXPECT_TRUE(u.accept(std::string("\"\xe6\x9d")));
  EXPECT_FALSE(Matcher(u).accept('"'));  // not mid-character
  EXPECT_TRUE(u.accept('\xb1'));
  EXPECT_FALSE(Matcher(s).accept(std::string("\"\xc0\x80")));  // an overlong encoding
  EXPECT_FALSE(Matcher(s).accept(std::string("\"\xed\xa0\x80")));  // a surrogate
}

// Random walks through each grammar over the vocabulary above: at every step the trie walk's mask (through the
// grammar's DFA, or the matcher when the DFA's table is full) equals the naive one
// (each token tried alone); a walk that draws the end-of-sequence token (or reaches a grammar's end) has produced a
// text that the jsonschema oracle then validates against the schema.
TEST(StructuredOutput, TrieMaskEqualsNaiveMaskAndCompletedTextsValidate) {
  int64_t eos = 0;
  const auto vocab = vocabulary(eos);
  const structured::TokenMask mask(vocab, {eos});
  const std::string cases = dtensor::testing::temp_dir("structured") + "/cases.jsonl";
  std::ofstream out(cases);
  std::mt19937 rng(2026);
  int64_t steps = 0, completed = 0, valid_texts = 0;
  for (const json& c : read_json("schemas.json")) {
    const Grammar g = grammar_of(c);
    const json schema = c.value("json_object", false) ? json(nullptr) : c["schema"];
    for (const auto& text : c["valid"]) {
      out << json{{"label", c["name"].get<std::string>() + " (corpus)"}, {"schema", schema}, {"text", text}}.dump() << "\n";
      ++valid_texts;
    }
    // Each walk's DFA kept between its steps, as a request's; every third one with a table of 3 states, so that its
    // walks go on through the matcher when it is full.
    for (int walk = 0; walk < 12; ++walk) {
      structured::GrammarStates states(g, walk % 3 == 2 ? 3 : 8192);
      Matcher m(g);
      std::string text;
      for (int step = 0; step < 300; ++step, ++steps) {
        const auto fast = mask.allowed(states, m);
        ASSERT_EQ(fast, mask.allowed_naive(m)) << c["name"] << " after " << json(text).dump();
        std::vector<int64_t> ids;
        for (size_t id = 0; id < fast.size(); ++id) {
          if (fast[id]) ids.push_back(static_cast<int64_t>(id));
        }
        ASSERT_FALSE(ids.empty()) << c["name"] << ": nothing continues " << json(text).dump();
        EXPECT_EQ(fast[static_cast<size_t>(eos)] != 0, m.can_end());
        EXPECT_EQ(fast[static_cast<size_t>(eos) - 1], 0);  // the special token
        // Stop once the text is complete, now and then; else a uniformly drawn allowed token.
        if (m.can_end() && (rng() % 4 == 0 || step > 200 || ids.size() == 1)) {
          out << json{{"label", c["name"].get<std::string>() + " (walk)"}, {"schema", schema}, {"text", text}}.dump() << "\n";
          ++completed;
          break;
        }
        int64_t id = ids[rng() % ids.size()];
        if (id == eos) continue;
        ASSERT_TRUE(m.accept(*vocab[static_cast<size_t>(id)]));
        text += *vocab[static_cast<size_t>(id)];
      }
    }
  }
  out.close();
  EXPECT_GT(completed, 60);
  const auto r = dtensor::testing::run_process(
      {DTENSOR_PYTHON, std::string(DTENSOR_SOURCE_DIR) + "/tests/oracle/jsonschema_oracle.py", cases}, {}, 120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("cases=" + std::to_string(completed + valid_texts) + " failures=0"), std::string::npos) << r.output;
  std::printf("structured: %lld mask steps compared, %lld walks completed, %lld corpus texts validated\n",
              static_cast<long long>(steps), static_cast<long long>(completed), static_cast<long long>(valid_texts));
}

}  // namespace
