// A Jinja2 template in the environment transformers renders chat templates in: ImmutableSandboxedEnvironment
// with trim_blocks, lstrip_blocks and loop controls; globals raise_exception, strftime_now, namespace, dict and
// range; its tojson filter. The subset is what real chat templates use (docs/design/tokenizer.md lists it);
// anything outside it is a tokenizer::Error naming the construct, at parse time where it can be.
//
//   jinja::Template t("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}");
//   std::string text = t.render(nlohmann::ordered_json{{"messages", ...}});
//
// raise_exception(message) in the template throws jinja::TemplateRaised with the template's message.
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/jinja/builtins.h"

namespace tokenizer::jinja {

struct Stmt;

class Template {
 public:
  explicit Template(const std::string& source);
  // `context` is a JSON object; its keys are the template's variables, beside the globals. `now` is
  // strftime_now's clock (default: the real one; local time either way), for reproducible renders.
  std::string render(const nlohmann::ordered_json& context, std::optional<std::time_t> now = std::nullopt) const;
  std::string render(const Dict& context, std::optional<std::time_t> now = std::nullopt) const;

 private:
  std::shared_ptr<const std::vector<std::shared_ptr<Stmt>>> body_;
};

}  // namespace tokenizer::jinja
