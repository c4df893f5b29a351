#include "inference/serving/openai_api.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <set>

namespace serve {
namespace {

using json = nlohmann::ordered_json;

ApiError bad(const std::string& param, const std::string& message) { return ApiError(400, message, param); }

const std::set<std::string>& known_fields(bool chat) {
  static const std::set<std::string> completions = {
      "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "n", "stream", "stream_options", "stop", "seed",
      "user", "echo", "logprobs", "presence_penalty", "frequency_penalty", "best_of", "logit_bias", "suffix",
      "ignore_eos"};
  static const std::set<std::string> chats = {
      "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "n", "stream",
      "stream_options", "stop", "seed", "user", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty",
      "logit_bias", "response_format", "tools", "tool_choice", "chat_template_kwargs", "ignore_eos"};
  return chat ? chats : completions;
}

double number(const json& body, const char* field, double fallback) {
  if (!body.contains(field) || body[field].is_null()) return fallback;
  if (!body[field].is_number()) throw bad(field, std::string("'") + field + "' must be a number");
  const double v = body[field].get<double>();
  if (!std::isfinite(v)) throw bad(field, std::string("'") + field + "' must be a finite number");
  return v;
}

std::optional<int64_t> integer(const json& body, const char* field) {
  if (!body.contains(field) || body[field].is_null()) return std::nullopt;
  const json& v = body[field];
  // An integral float (3.0) is an integer too; anything past int64's range is not (never cast: undefined).
  const bool in_range = v.is_number_integer() ? !(v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX)
                                              : v.is_number_float() && std::abs(v.get<double>()) < 9.2e18 &&
                                                    v.get<double>() == std::trunc(v.get<double>());
  if (!in_range) throw bad(field, std::string("'") + field + "' must be an integer within int64's range");
  return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
}

bool boolean(const json& body, const char* field) {
  if (!body.contains(field) || body[field].is_null()) return false;
  if (!body[field].is_boolean()) throw bad(field, std::string("'") + field + "' must be a boolean");
  return body[field].get<bool>();
}

// Options we do not implement are accepted only at the value that means "off".
void require_default(const json& body, const char* field, const std::function<bool(const json&)>& is_default,
                     const std::string& what) {
  if (body.contains(field) && !body[field].is_null() && !is_default(body[field])) {
    throw bad(field, std::string("'") + field + "' is not supported by this server (" + what + ")");
  }
}

std::vector<int64_t> ids_of(const json& list, const char* field, int64_t vocab) {
  std::vector<int64_t> ids;
  for (const auto& t : list) {
    if (!t.is_number_integer()) throw bad(field, std::string("'") + field + "' token ids must be integers");
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id >= vocab) {
      throw bad(field, "token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
    ids.push_back(id);
  }
  return ids;
}

std::vector<int64_t> completion_prompt(const json& body, const ApiLimits& limits) {
  if (!body.contains("prompt")) throw bad("prompt", "'prompt' is required");
  json prompt = body["prompt"];
  // A list of one prompt is that prompt; several make a batch, which this server does not take in one request.
  if (prompt.is_array() && !prompt.empty() && (prompt[0].is_string() || prompt[0].is_array())) {
    if (prompt.size() != 1) throw bad("prompt", "one prompt per request (send several requests: they are batched)");
    prompt = json(prompt[0]);
  }
  if (prompt.is_string()) {
    if (prompt.get<std::string>().empty()) throw bad("prompt", "'prompt' is empty");
    return limits.tokenizer->encode(prompt.get<std::string>(), /*add_special_tokens=*/true);
  }
  if (prompt.is_array()) {
    if (prompt.empty()) throw bad("prompt", "'prompt' is empty");
    return ids_of(prompt, "prompt", limits.vocab_size);
  }
  throw bad("prompt", "'prompt' must be a string, a list of token ids, or a list of one of those");
}

std::vector<int64_t> chat_prompt(const json& body, const ApiLimits& limits) {
  if (!body.contains("messages")) throw bad("messages", "'messages' is required");
  const json& messages = body["messages"];
  if (!messages.is_array() || messages.empty()) throw bad("messages", "'messages' must be a non-empty list");
  json rendered = json::array();
  for (const auto& m : messages) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      throw bad("messages", "each message must be an object with a string 'role'");
    }
    json msg = m;
    if (m.contains("content") && m["content"].is_array()) {  // [{"type": "text", "text": ...}, ...]
      std::string text;
      for (const auto& part : m["content"]) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string()) {
          throw bad("messages", "message content parts must be {\"type\": \"text\", \"text\": ...} (text only)");
        }
        text += part["text"].get<std::string>();
      }
      msg["content"] = text;
    } else if (m.contains("content") && !m["content"].is_string() && !m["content"].is_null()) {
      throw bad("messages", "message 'content' must be a string or a list of text parts");
    }
    rendered.push_back(msg);
  }
  if (!limits.tokenizer->has_chat_template()) {
    throw bad("messages", "this model's tokenizer has no chat template: use /v1/completions");
  }
  tokenizer::ChatOptions options;
  options.add_generation_prompt = true;
  if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null()) {
    if (!body["chat_template_kwargs"].is_object()) throw bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    options.variables = body["chat_template_kwargs"];
  }
  std::string text;
  try {
    text = limits.tokenizer->apply_chat_template(rendered, options);
  } catch (const std::exception& e) {
    throw bad("messages", std::string("the chat template refused the messages: ") + e.what());
  }
  return limits.tokenizer->encode(text, /*add_special_tokens=*/false);
}

std::vector<std::string> stops(const json& body) {
  std::vector<std::string> out;
  if (!body.contains("stop") || body["stop"].is_null()) return out;
  const json& s = body["stop"];
  if (s.is_string()) {
    out.push_back(s.get<std::string>());
  } else if (s.is_array()) {
    for (const auto& x : s) {
      if (!x.is_string()) throw bad("stop", "'stop' must be a string or a list of strings");
      out.push_back(x.get<std::string>());
    }
  } else {
    throw bad("stop", "'stop' must be a string or a list of strings");
  }
  if (out.size() > 4) throw bad("stop", "at most 4 stop sequences");
  for (const auto& x : out) {
    if (x.empty()) throw bad("stop", "stop sequences must not be empty");
  }
  return out;
}

}  // namespace

std::string error_body(const std::string& message, const std::string& type, const std::string& param, int code) {
  json e = {{"message", message}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)}, {"code", code}};
  return json{{"error", e}}.dump();
}

ApiRequest parse_request(const std::string& body_text, bool chat, const ApiLimits& limits) {
  // Depth is bounded while parsing, before anything deeper exists: every later walk of the body (copies, the
  // chat template) is then bounded too. (100,000 nested '[' once overflowed rank 0's stack in a copy.)
  const int max_depth = limits.max_json_depth;
  const json::parser_callback_t bounded = [max_depth](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) && depth >= max_depth) {
      throw bad("", "the body nests arrays and objects deeper than " + std::to_string(max_depth) + " levels");
    }
    return true;
  };
  json body = json::parse(body_text, bounded, /*allow_exceptions=*/false);
  if (body.is_discarded()) throw bad("", "the body is not valid JSON");
  if (!body.is_object()) throw bad("", "the body must be a JSON object");
  const auto& known = known_fields(chat);
  for (const auto& [key, _] : body.items()) {
    if (!known.contains(key)) throw bad(key, "unknown field '" + key + "'");
  }
  if (body.contains("model") && !body["model"].is_null()) {
    if (!body["model"].is_string()) throw bad("model", "'model' must be a string");
    if (body["model"].get<std::string>() != limits.model_name) {
      throw ApiError(404, "the model '" + body["model"].get<std::string>() + "' does not exist (this server has '" +
                              limits.model_name + "')", "model", "not_found_error");
    }
  }
  ApiRequest r;
  r.chat = chat;
  r.stream = boolean(body, "stream");
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const json& so = body["stream_options"];
    if (!so.is_object()) throw bad("stream_options", "'stream_options' must be an object");
    if (!r.stream) throw bad("stream_options", "'stream_options' needs 'stream': true");
    for (const auto& [key, _] : so.items()) {
      if (key != "include_usage") throw bad("stream_options", "unknown field 'stream_options." + key + "'");
    }
    r.include_usage = boolean(so, "include_usage");
  }
  SamplingParams& p = r.params;
  p.temperature = number(body, "temperature", 1.0);
  if (p.temperature < 0) throw bad("temperature", "'temperature' must not be negative");
  p.top_p = number(body, "top_p", 1.0);
  if (!(p.top_p > 0 && p.top_p <= 1)) throw bad("top_p", "'top_p' must be in (0, 1]");
  p.top_k = integer(body, "top_k").value_or(0);
  if (p.top_k == -1) p.top_k = 0;
  if (p.top_k < 0) throw bad("top_k", "'top_k' must be -1, 0 (off) or positive");
  if (auto seed = integer(body, "seed")) p.seed = static_cast<uint64_t>(*seed);
  p.stop = stops(body);
  p.ignore_eos = boolean(body, "ignore_eos");
  require_default(body, "n", [](const json& v) { return v == 1; }, "one choice per request");
  require_default(body, "best_of", [](const json& v) { return v == 1; }, "one choice per request");
  require_default(body, "echo", [](const json& v) { return v == false; }, "no echo");
  require_default(body, "logprobs", [](const json& v) { return v == false || v == 0; }, "no log-probabilities");
  require_default(body, "top_logprobs", [](const json& v) { return v == 0; }, "no log-probabilities");
  require_default(body, "presence_penalty", [](const json& v) { return v == 0; }, "no penalties");
  require_default(body, "frequency_penalty", [](const json& v) { return v == 0; }, "no penalties");
  require_default(body, "logit_bias", [](const json& v) { return v.is_object() && v.empty(); }, "no logit bias");
  require_default(body, "suffix", [](const json& v) { return v == ""; }, "no suffix");
  require_default(body, "tools", [](const json& v) { return v.is_array() && v.empty(); }, "no tool calls");
  require_default(body, "tool_choice", [](const json& v) { return v == "none"; }, "no tool calls");
  require_default(body, "response_format", [](const json& v) { return v.is_object() && v.value("type", "") == "text"; },
                  "text responses only");
  if (body.contains("user") && !body["user"].is_null() && !body["user"].is_string()) throw bad("user", "'user' must be a string");

  r.prompt_ids = chat ? chat_prompt(body, limits) : completion_prompt(body, limits);
  const int64_t n = static_cast<int64_t>(r.prompt_ids.size());
  if (n >= limits.max_model_len) {
    throw bad(chat ? "messages" : "prompt", "this model's maximum context length is " + std::to_string(limits.max_model_len) +
                                                " tokens; the prompt has " + std::to_string(n) + " tokens, leaving no room to generate");
  }
  std::optional<int64_t> max_tokens = integer(body, "max_tokens");
  if (chat && !max_tokens) max_tokens = integer(body, "max_completion_tokens");
  const char* max_field = chat && !body.contains("max_tokens") ? "max_completion_tokens" : "max_tokens";
  if (max_tokens && *max_tokens < 1) throw bad(max_field, std::string("'") + max_field + "' must be at least 1");
  // Unset: chat takes what the context leaves; completions OpenAI's 16, within what it leaves.
  p.max_tokens = max_tokens.value_or(chat ? limits.max_model_len - n : std::min<int64_t>(16, limits.max_model_len - n));
  if (n + p.max_tokens > limits.max_model_len) {
    throw bad(max_field, "this model's maximum context length is " + std::to_string(limits.max_model_len) +
                             " tokens; the prompt has " + std::to_string(n) + " and " + max_field + " asks for " +
                             std::to_string(p.max_tokens) + " more");
  }
  return r;
}

json completion_response(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model,
                         const std::string& text, const std::string& finish_reason, int64_t prompt_tokens,
                         int64_t completion_tokens) {
  json choice = {{"index", 0}};
  if (r.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
    choice["logprobs"] = nullptr;
  } else {
    choice["text"] = text;
    choice["logprobs"] = nullptr;
  }
  choice["finish_reason"] = finish_reason;
  return {{"id", id},
          {"object", r.chat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({choice})},
          {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
                     {"total_tokens", prompt_tokens + completion_tokens}}}};
}

json stream_chunk(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model,
                  const std::string& text, const std::string& finish_reason, bool role_chunk) {
  json choice = {{"index", 0}};
  if (r.chat) {
    json delta = json::object();
    if (role_chunk) delta["role"] = "assistant";
    if (role_chunk || !text.empty()) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(finish_reason);
  return {{"id", id},
          {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({choice})}};
}

json usage_chunk(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model,
                 int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"id", id},
          {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array()},
          {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
                     {"total_tokens", prompt_tokens + completion_tokens}}}};
}

}  // namespace serve
