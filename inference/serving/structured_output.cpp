#include "inference/serving/structured_output.h"

#include "inference/serving/openai_api.h"
#include "inference/structured/json_schema.h"

namespace serve {
namespace {

using ojson = nlohmann::ordered_json;

ApiError bad(const std::string& param, const std::string& message) { return ApiError(400, message, param); }

StructuredOutput held_to(structured::Grammar g, std::string forced_tool = "") {
  auto grammar = std::make_shared<const structured::Grammar>(std::move(g));
  return {grammar, std::make_shared<structured::GrammarStates>(*grammar), std::move(forced_tool)};
}

StructuredOutput compile(const ojson& schema, const std::string& param, const std::string& where,
                         std::string forced_tool = "") {
  try {
    return held_to(structured::json_schema_grammar(schema, where), std::move(forced_tool));
  } catch (const structured::SchemaError& e) {
    throw bad(param, e.what());
  }
}

}  // namespace

StructuredOutput response_format(const ojson& body) {
  if (!body.contains("response_format") || body["response_format"].is_null()) return {};
  const ojson& f = body["response_format"];
  if (!f.is_object() || !f.contains("type") || !f["type"].is_string()) {
    throw bad("response_format", "'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}");
  }
  const std::string type = f["type"].get<std::string>();
  for (const auto& [key, _] : f.items()) {
    if (key != "type" && !(type == "json_schema" && key == "json_schema")) {
      throw bad("response_format", "unknown field 'response_format." + key + "'");
    }
  }
  if (type == "text") return {};
  if (type == "json_object") return held_to(structured::json_object_grammar());
  if (type != "json_schema") {
    throw bad("response_format", "response_format type '" + type + "' is not one of text, json_object, json_schema");
  }
  if (!f.contains("json_schema") || !f["json_schema"].is_object()) {
    throw bad("response_format", "response_format json_schema needs 'json_schema': {\"name\": ..., \"schema\": {...}}");
  }
  const ojson& js = f["json_schema"];
  for (const auto& [key, v] : js.items()) {
    if (key != "name" && key != "schema" && key != "strict" && key != "description") {
      throw bad("response_format", "unknown field 'response_format.json_schema." + key + "'");
    }
  }
  if (js.contains("strict") && !js["strict"].is_null() && !js["strict"].is_boolean()) {
    throw bad("response_format", "'response_format.json_schema.strict' must be a boolean");
  }
  // OpenAI requires a schema; an absent one is any JSON value, as vLLM takes it.
  const ojson schema = js.contains("schema") ? js["schema"] : ojson::object();
  return compile(schema, "response_format", "response_format.json_schema.schema");
}

StructuredOutput forced_tool_choice(const ojson& choice, const ojson& tools) {
  auto parameters = [](const ojson& tool) {
    const ojson& fn = tool["function"];
    return fn.contains("parameters") && !fn["parameters"].is_null() ? fn["parameters"] : ojson{{"type", "object"}};
  };
  if (choice == "required") {
    // [{"name": N, "parameters": P}, ...] with at least one call, each of a listed function (vLLM's form).
    ojson calls = ojson::array();
    for (const ojson& t : tools) {
      calls.push_back({{"type", "object"},
                       {"properties", {{"name", {{"enum", {t["function"]["name"]}}}}, {"parameters", parameters(t)}}},
                       {"required", {"name", "parameters"}}});
    }
    const ojson schema = {{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", calls}}}};
    return compile(schema, "tools", "tools", "*");
  }
  if (!choice.is_object() || choice.value("type", "") != "function" || !choice.contains("function") ||
      !choice["function"].is_object() || !choice["function"].contains("name") || !choice["function"]["name"].is_string()) {
    throw bad("tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                             "\"function\": {\"name\": ...}}");
  }
  const std::string name = choice["function"]["name"].get<std::string>();
  for (const ojson& t : tools) {
    if (t["function"]["name"] == name) {
      return compile(parameters(t), "tools", "tools[" + name + "].function.parameters", name);
    }
  }
  throw bad("tool_choice", "tool_choice names the function '" + name + "', which is not among the tools");
}

ParsedToolCalls forced_tool_calls(const StructuredOutput& s, const std::string& text) {
  const ojson j = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return {text, {}};  // cut short (max_tokens)
  if (s.forced_tool != "*") return {"", {{s.forced_tool, text}}};  // the arguments as generated, as vLLM's
  ParsedToolCalls out;
  for (const ojson& call : j) out.calls.push_back({call["name"].get<std::string>(), call["parameters"].dump()});
  return out;
}

}  // namespace serve
