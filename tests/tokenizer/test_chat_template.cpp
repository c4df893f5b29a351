// Chat templates against transformers' apply_chat_template: tests/oracle/hf_chat_template_oracle.py saves
// checkpoints holding 14 real templates, verbatim (Llama 2 / 3.1 / 3.2, Mistral v0.1 / v0.3 / Nemo, Qwen2.5,
// Qwen3, Gemma / Gemma 3, Phi-3, Zephyr, SmolLM2, DeepSeek-R1), in both layouts (chat_template.jinja and
// tokenizer_config.json), and renders about 200 conversations with them: system prompts, multi-turn, tools and
// tool calls, reasoning, unicode, generation prompts, and the conversations the templates refuse. Ours, read by
// Tokenizer::from_pretrained, must render the same text, or raise the same template error.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>

#include "harness/multi_rank.h"  // error_of
#include "oracle_dir.h"
#include "tokenizer/error.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;

namespace {

const std::string& chat_root() {
  static const std::string dir = tokenizer_testing::make_oracle_dir("hf_chat_template_oracle.py", "chat_templates");
  return dir;
}

// "2025-03-15T12:00:00" as local time (the oracle's naive datetime.now()).
std::time_t local_time(const std::string& iso) {
  std::tm tm{};
  if (std::sscanf(iso.c_str(), "%d-%d-%dT%d:%d:%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
                  &tm.tm_sec) != 6) {
    throw std::runtime_error("bad time " + iso);
  }
  tm.tm_year -= 1900, tm.tm_mon -= 1, tm.tm_isdst = -1;
  return std::mktime(&tm);
}

TEST(ChatTemplate, RealTemplatesRenderAsTransformers) {
  std::ifstream in(chat_root() + "/cases.jsonl");
  std::map<std::string, tokenizer::Tokenizer> tokenizers;
  std::map<std::string, int> per_template;
  int rendered = 0, raised = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const auto row = nlohmann::ordered_json::parse(line);
    const std::string name = row.at("template").get<std::string>();
    const std::string label = name + "/" + row.at("case").get<std::string>();
    if (!tokenizers.count(name)) tokenizers.emplace(name, tokenizer::Tokenizer::from_pretrained(row.at("dir").get<std::string>()));
    const auto& tok = tokenizers.at(name);
    tokenizer::ChatOptions options;
    options.add_generation_prompt = row.at("add_generation_prompt").get<bool>();
    options.tools = row.at("tools");
    options.variables = row.at("kwargs");
    options.now = local_time(row.at("now").get<std::string>());
    ++per_template[name];
    if (row.contains("expected")) {
      std::string got;
      try {
        got = tok.apply_chat_template(row.at("messages"), options);
      } catch (const std::exception& e) {
        ADD_FAILURE() << label << " threw: " << e.what();
        continue;
      }
      EXPECT_EQ(got, row.at("expected").get<std::string>()) << label;
      ++rendered;
    } else {
      const std::string type = row.at("error_type").get<std::string>();
      const std::string want = row.at("error").get<std::string>();
      if (type == "TemplateError") {  // raise_exception: the template's own message, exactly
        try {
          tok.apply_chat_template(row.at("messages"), options);
          ADD_FAILURE() << label << ": no error; transformers raised " << want;
        } catch (const tokenizer::jinja::TemplateRaised& e) {
          EXPECT_EQ(std::string(e.what()), want) << label;
        } catch (const std::exception& e) {
          ADD_FAILURE() << label << ": " << e.what() << "; transformers raised " << want;
        }
      } else {  // Jinja2's own wording: an error is enough
        EXPECT_FALSE(dtensor::testing::error_of([&] { tok.apply_chat_template(row.at("messages"), options); }).empty())
            << label << ": no error; transformers raised " << type << ": " << want;
      }
      ++raised;
    }
  }
  EXPECT_GE(per_template.size(), 14u);
  EXPECT_GT(rendered, 150);
  EXPECT_GT(raised, 20);
  std::printf("%zu templates, %d conversations rendered and %d refused as transformers\n", per_template.size(),
              rendered, raised);
}

TEST(ChatTemplate, SpecialTokensAreTheTemplatesVariables) {
  for (const char* name : {"llama3_1_instruct", "qwen2_5_instruct", "gemma_it", "mistral_v0_1_instruct"}) {
    const std::string dir = chat_root() + "/" + name;
    const auto tok = tokenizer::Tokenizer::from_pretrained(dir);
    std::ifstream in(dir + "/expected_specials.json");
    EXPECT_EQ(tok.special_tokens_map(), nlohmann::ordered_json::parse(in)) << name;
    EXPECT_TRUE(tok.has_chat_template()) << name;
  }
}

TEST(ChatTemplate, MissingOrUnsupportedTemplatesAreNamed) {
  using dtensor::testing::error_of;
  const std::string dir = chat_root() + "/no_template";
  fs::create_directories(dir);
  fs::copy_file(chat_root() + "/zephyr_7b_beta/tokenizer.json", dir + "/tokenizer.json", fs::copy_options::overwrite_existing);
  const auto messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_NE(error_of([&] { tokenizer::Tokenizer::from_pretrained(dir).apply_chat_template(messages); }).find("no chat template"),
            std::string::npos);
  std::ofstream(dir + "/chat_template.jinja") << "{% include 'other.jinja' %}";
  const auto tok = tokenizer::Tokenizer::from_pretrained(dir);  // encode still works; the template is refused when used
  EXPECT_FALSE(tok.encode("hi").empty());
  const std::string err = error_of([&] { tok.apply_chat_template(messages); });
  EXPECT_NE(err.find("chat template"), std::string::npos) << err;
  EXPECT_NE(err.find("'{% include %}' is not supported"), std::string::npos) << err;
}

}  // namespace
