// A checkpoint's chat template, rendered as transformers' apply_chat_template(messages, tokenize=False) renders
// it: messages without their None-valued keys, reasoning under all of its names (reasoning_content, thinking),
// the variables messages, tools, documents, add_generation_prompt, the special tokens (bos_token, eos_token, ...)
// and the caller's extra variables, in the Jinja environment of tokenizer/jinja/template.h.
//
// The template is read from chat_template.jinja (transformers 5) or tokenizer_config.json's "chat_template" (a
// string, or a list of {name, template} whose "default" is taken).
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace tokenizer {

namespace jinja {
class Template;
}

struct ChatOptions {
  bool add_generation_prompt = false;
  nlohmann::ordered_json tools;                                   // a list of JSON schemas, or null
  nlohmann::ordered_json documents;                               // a list of {title, text}, or null
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();  // enable_thinking, date_string, ...
  std::optional<std::time_t> now;  // strftime_now's clock (default: the real one)
};

class ChatTemplate {
 public:
  // `special_tokens`: {"bos_token": "<s>", ...}, as transformers' special_tokens_map.
  ChatTemplate(const std::string& source, nlohmann::ordered_json special_tokens);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // `messages`: a JSON list of {"role", "content", ...}. Throws tokenizer::Error naming what is wrong, or
  // jinja::TemplateRaised with the template's own message (raise_exception).
  std::string apply(const nlohmann::ordered_json& messages, const ChatOptions& options = {}) const;
  const std::string& source() const { return source_; }

  // The template text of checkpoint `dir`, or nullopt when it has none.
  static std::optional<std::string> read_source(const std::string& dir);

 private:
  std::string source_;
  std::unique_ptr<jinja::Template> template_;
  nlohmann::ordered_json special_tokens_;
};

}  // namespace tokenizer
