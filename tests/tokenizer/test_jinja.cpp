// The Jinja subset against Jinja2 itself: tests/oracle/jinja_oracle.py renders small templates, one construct
// each (whitespace control, trim/lstrip_blocks, operators, literals, str methods, filters, tests, loops, scopes,
// namespace, macros, errors), in transformers' own chat-template environment. Ours must give the same text, or
// an error where Jinja2 raises (with the same message for raise_exception and undefined names).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "harness/multi_rank.h"  // error_of
#include "harness/subprocess.h"
#include "tokenizer/error.h"
#include "tokenizer/jinja/template.h"
#include "harness/temp_dir.h"

namespace fs = std::filesystem;
using tokenizer::jinja::Template;

namespace {

std::vector<nlohmann::ordered_json> jinja_cases() {
  static const std::vector<nlohmann::ordered_json> rows = [] {
    const std::string out = dtensor::testing::temp_dir("jinja") + "/cases.jsonl";
    const auto made = dtensor::testing::run_process(
        {DTENSOR_PYTHON, DTENSOR_SOURCE_DIR "/tests/oracle/jinja_oracle.py", out},
        {{"HF_HUB_OFFLINE", "1"}, {"TRANSFORMERS_VERBOSITY", "error"}}, 300);
    if (made.exit_code != 0) throw std::runtime_error("jinja_oracle.py failed:\n" + made.output);
    std::ifstream in(out);
    std::vector<nlohmann::ordered_json> parsed;
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) parsed.push_back(nlohmann::ordered_json::parse(line));
    }
    fs::remove(out);
    return parsed;
  }();
  return rows;
}

TEST(Jinja, EveryConstructRendersAsJinja2) {
  const auto rows = jinja_cases();
  ASSERT_GT(rows.size(), 60u);
  int rendered = 0, raised = 0;
  for (const auto& row : rows) {
    const std::string source = row.at("template").get<std::string>();
    if (row.contains("expected")) {
      std::string got;
      try {
        got = Template(source).render(row.at("context"));
      } catch (const std::exception& e) {
        ADD_FAILURE() << source << "\n  threw: " << e.what();
        continue;
      }
      EXPECT_EQ(got, row.at("expected").get<std::string>()) << source;
      ++rendered;
    } else {
      const std::string want = row.at("error").get<std::string>();
      const std::string got = dtensor::testing::error_of([&] { Template(source).render(row.at("context")); });
      EXPECT_NE(got.find(want), std::string::npos) << source << "\n  jinja2: " << want << "\n  ours: " << got;
      ++raised;
    }
  }
  std::printf("%d templates rendered, %d raised, as Jinja2\n", rendered, raised);
}

TEST(Jinja, RaiseExceptionCarriesTheTemplatesMessage) {
  try {
    Template("{{ raise_exception('roles must alternate') }}").render(nlohmann::ordered_json::object());
    FAIL() << "no exception";
  } catch (const tokenizer::jinja::TemplateRaised& e) {
    EXPECT_STREQ(e.what(), "roles must alternate");
  }
}

TEST(Jinja, StrftimeNowUsesTheGivenClock) {
  std::tm tm{};
  tm.tm_year = 2024 - 1900, tm.tm_mon = 6, tm.tm_mday = 26, tm.tm_hour = 12, tm.tm_isdst = -1;
  EXPECT_EQ(Template("{{ strftime_now('%d %b %Y') }}").render(nlohmann::ordered_json::object(), std::mktime(&tm)),
            "26 Jul 2024");
}

TEST(Jinja, WhatIsOutsideTheSubsetIsNamed) {
  using dtensor::testing::error_of;
  auto parse_error = [&](const std::string& source) { return error_of([&] { Template t(source); }); };
  EXPECT_NE(parse_error("{% include 'x.jinja' %}").find("template construct '{% include %}' is not supported"), std::string::npos);
  EXPECT_NE(parse_error("{% extends 'base' %}").find("'{% extends %}' is not supported"), std::string::npos);
  EXPECT_NE(parse_error("{% for x in y recursive %}{% endfor %}").find("'for ... recursive' is not supported"), std::string::npos);
  EXPECT_NE(parse_error("{% if x %}never closed").find("missing {% endif %}"), std::string::npos);
  EXPECT_NE(parse_error("{{ x ").find("line 1"), std::string::npos);
  EXPECT_NE(parse_error("\n\n{% endfor %}").find("line 3: unexpected '{% endfor %}'"), std::string::npos);
  const auto render_error = [&](const std::string& source) {
    return error_of([&] { Template(source).render(nlohmann::ordered_json::object()); });
  };
  EXPECT_NE(render_error("{{ 'x' | frobnicate }}").find("filter 'frobnicate' is not supported"), std::string::npos);
  EXPECT_NE(render_error("{{ 1 is frobnicated }}").find("test 'frobnicated' is not supported"), std::string::npos);
  EXPECT_NE(render_error("{{ nope() }}").find("'nope' is undefined"), std::string::npos);
  EXPECT_NE(render_error("{{ 'x'.frobnicate() }}").find("'str object' has no attribute 'frobnicate'"), std::string::npos);
  EXPECT_NE(render_error("{% set ns = 1 %}{% set ns.a = 2 %}").find("non-namespace"), std::string::npos);
}

}  // namespace
