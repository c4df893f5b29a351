#include "tokenizer/chat_template.h"

#include <filesystem>

#include "tokenizer/backend.h"
#include "tokenizer/error.h"
#include "tokenizer/jinja/template.h"

namespace fs = std::filesystem;

namespace tokenizer {
namespace {

using json = nlohmann::ordered_json;

// transformers' _normalize_chat_messages and _alias_reasoning_fields.
json normalize_messages(const json& messages) {
  if (!messages.is_array()) throw Error("chat template: messages must be a JSON list of objects");
  json out = json::array();
  for (const auto& m : messages) {
    if (!m.is_object()) throw Error("chat template: each message must be a JSON object, got " + m.dump());
    json message = json::object();
    for (const auto& [key, value] : m.items()) {
      if (!value.is_null()) message[key] = value;
    }
    for (const char* field : {"reasoning_content", "thinking", "reasoning"}) {
      if (!message.contains(field)) continue;
      const json reasoning = message.at(field);
      json aliased = json::object();
      aliased["thinking"] = reasoning;
      for (const auto& [key, value] : message.items()) aliased[key] = value;
      aliased["reasoning_content"] = reasoning;
      message = std::move(aliased);
      break;
    }
    out.push_back(std::move(message));
  }
  return out;
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& source, json special_tokens)
    : source_(source), template_(std::make_unique<jinja::Template>(source)), special_tokens_(std::move(special_tokens)) {}
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::apply(const json& messages, const ChatOptions& options) const {
  json context = special_tokens_.is_object() ? special_tokens_ : json::object();
  if (!options.variables.is_object()) throw Error("chat template: variables must be a JSON object");
  for (const auto& [key, value] : options.variables.items()) context[key] = value;  // they win, as in transformers
  context["messages"] = normalize_messages(messages);
  context["tools"] = options.tools;
  context["documents"] = options.documents;
  context["add_generation_prompt"] = options.add_generation_prompt;
  return template_->render(context, options.now);
}

std::optional<std::string> ChatTemplate::read_source(const std::string& dir) {
  const fs::path d(dir);
  if (fs::exists(d / "chat_template.jinja")) return read_file((d / "chat_template.jinja").string());
  if (fs::exists(d / "chat_template.json")) {  // processors' layout: {"chat_template": "..."}
    const json j = json::parse(read_file((d / "chat_template.json").string()), nullptr, false);
    if (j.is_object() && j.contains("chat_template") && j.at("chat_template").is_string()) {
      return j.at("chat_template").get<std::string>();
    }
  }
  if (!fs::exists(d / "tokenizer_config.json")) return std::nullopt;
  const json config = json::parse(read_file((d / "tokenizer_config.json").string()), nullptr, false);
  if (config.is_discarded()) throw Error("tokenizer: '" + (d / "tokenizer_config.json").string() + "' is not valid JSON");
  if (!config.contains("chat_template") || config.at("chat_template").is_null()) return std::nullopt;
  const json& t = config.at("chat_template");
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {  // named templates: the default one
    for (const auto& entry : t) {
      if (entry.is_object() && entry.value("name", "") == "default") return entry.at("template").get<std::string>();
    }
    throw Error("tokenizer: '" + dir + "' has named chat templates but none called 'default'");
  }
  throw Error("tokenizer: chat_template of '" + dir + "' is neither a string nor a list of named templates");
}

}  // namespace tokenizer
