#include "inference/serving/tool_parsers.h"

#include <stdexcept>

#include <nlohmann/json.hpp>

namespace serve {
namespace {

using json = nlohmann::ordered_json;

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r\n") - a + 1);
}

// {"name": string, <args_key>: object} -> a call; nullopt for anything else.
std::optional<ToolCall> call_of(const json& j, const char* args_key) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  json args = json::object();
  if (j.contains(args_key)) args = j[args_key];
  else if (j.contains("arguments")) args = j["arguments"];
  if (args.is_string()) args = json::parse(args.get<std::string>(), nullptr, false);  // some emit it as a string
  if (!args.is_object()) return std::nullopt;
  return ToolCall{j["name"].get<std::string>(), args.dump()};
}

json parse(const std::string& text) { return json::parse(text, nullptr, /*allow_exceptions=*/false); }

ParsedToolCalls hermes(const std::string& text) {
  const std::string open = "<tool_call>", close = "</tool_call>";
  ParsedToolCalls out;
  const size_t first = text.find(open);
  if (first == std::string::npos) return {trim(text), {}};
  std::string rest_content;
  size_t at = first;
  while (at != std::string::npos) {
    const size_t end = text.find(close, at + open.size());
    const std::string body = text.substr(at + open.size(), end == std::string::npos ? std::string::npos : end - at - open.size());
    auto call = call_of(parse(trim(body)), "arguments");
    if (!call) return {trim(text), {}};  // malformed: the text is content
    out.calls.push_back(*call);
    if (end == std::string::npos) break;
    const size_t next = text.find(open, end + close.size());
    rest_content += text.substr(end + close.size(), next == std::string::npos ? std::string::npos : next - end - close.size());
    at = next;
  }
  out.content = trim(text.substr(0, first) + rest_content);
  return out;
}

ParsedToolCalls llama3_json(const std::string& text) {
  std::string body = trim(text);
  const std::string tag = "<|python_tag|>";
  if (body.rfind(tag, 0) == 0) body = trim(body.substr(tag.size()));
  if (body.empty() || body[0] != '{') return {trim(text), {}};
  ParsedToolCalls out;
  // Calls joined by "; ": split where a ';' follows a complete object.
  size_t start = 0;
  while (start < body.size()) {
    size_t end = body.find("; {", start);
    const std::string one = trim(body.substr(start, end == std::string::npos ? std::string::npos : end - start));
    auto call = call_of(parse(one), "parameters");
    if (!call) return {trim(text), {}};
    out.calls.push_back(*call);
    if (end == std::string::npos) break;
    start = end + 2;
  }
  return out;
}

ParsedToolCalls mistral(const std::string& text) {
  const std::string tag = "[TOOL_CALLS]";
  const size_t at = text.find(tag);
  if (at == std::string::npos) return {trim(text), {}};
  const json calls = parse(trim(text.substr(at + tag.size())));
  if (!calls.is_array() || calls.empty()) return {trim(text), {}};
  ParsedToolCalls out{trim(text.substr(0, at)), {}};
  for (const auto& c : calls) {
    auto call = call_of(c, "arguments");
    if (!call) return {trim(text), {}};
    out.calls.push_back(*call);
  }
  return out;
}

}  // namespace

const std::vector<std::string>& tool_parser_names() {
  static const std::vector<std::string> names = {"hermes", "llama3_json", "mistral"};
  return names;
}

ParsedToolCalls parse_tool_calls(const std::string& name, const std::string& text) {
  if (name == "hermes") return hermes(text);
  if (name == "llama3_json") return llama3_json(text);
  if (name == "mistral") return mistral(text);
  throw std::invalid_argument("unknown tool-call parser '" + name + "' (hermes, llama3_json, mistral)");
}

}  // namespace serve
