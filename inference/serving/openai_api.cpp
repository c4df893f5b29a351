#include "inference/serving/openai_api.h"

#include <algorithm>
#include <charconv>
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
      "ignore_eos", "repetition_penalty", "min_tokens", "response_format", "return_token_ids"};
  static const std::set<std::string> chats = {
      "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "n", "stream",
      "stream_options", "stop", "seed", "user", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty",
      "logit_bias", "response_format", "tools", "tool_choice", "chat_template_kwargs", "ignore_eos",
      "repetition_penalty", "min_tokens", "return_token_ids"};
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

// OpenAI's tools: [{"type": "function", "function": {"name": N, "description": D, "parameters": {schema}}}]; null
// when absent or empty.
json checked_tools(const json& body) {
  if (!body.contains("tools") || body["tools"].is_null() || (body["tools"].is_array() && body["tools"].empty())) {
    return nullptr;
  }
  const json& tools = body["tools"];
  if (!tools.is_array()) throw bad("tools", "'tools' must be a list");
  for (const auto& t : tools) {
    if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") || !t["function"].is_object() ||
        !t["function"].contains("name") || !t["function"]["name"].is_string()) {
      throw bad("tools", "each tool must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": ...}}");
    }
  }
  return tools;
}

// tool_choice with tools given: "auto" (the default) parses the text with the server's parser; "none" leaves it
// content; "required" and a named function constrain the text to calls (structured_output.h).
void tool_choice(const json& body, const ApiLimits& limits, const json& tools, ApiRequest& r) {
  const json choice = body.contains("tool_choice") && !body["tool_choice"].is_null() ? body["tool_choice"] : json("auto");
  if (choice == "none") return;
  if (choice == "required" || choice.is_object()) {
    if (r.structured.grammar) {
      throw bad("tool_choice", "tool_choice " + choice.dump() + " and response_format both constrain the text: give one");
    }
    r.structured = forced_tool_choice(choice, tools);
    return;
  }
  if (choice == "auto") {
    if (limits.tool_parser.empty()) {
      throw bad("tool_choice", "\"auto\" tool choice needs the server started with --enable-auto-tool-choice and "
                               "--tool-call-parser (or send tool_choice \"none\")");
    }
    r.tool_parser = limits.tool_parser;
    return;
  }
  throw bad("tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                           "\"function\": {\"name\": ...}}");
}

std::vector<int64_t> chat_prompt(const json& body, const ApiLimits& limits, const json& tools) {
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
  options.tools = tools;
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

// logit_bias, min_tokens and the penalties, with OpenAI's and vLLM's ranges.
void logits_processing(const json& body, const ApiLimits& limits, inference::LogitsProcessing& p) {
  p.presence_penalty = number(body, "presence_penalty", 0.0);
  if (std::abs(p.presence_penalty) > 2) throw bad("presence_penalty", "'presence_penalty' must be in [-2, 2]");
  p.frequency_penalty = number(body, "frequency_penalty", 0.0);
  if (std::abs(p.frequency_penalty) > 2) throw bad("frequency_penalty", "'frequency_penalty' must be in [-2, 2]");
  p.repetition_penalty = number(body, "repetition_penalty", 1.0);
  if (!(p.repetition_penalty > 0)) throw bad("repetition_penalty", "'repetition_penalty' must be positive (1: off)");
  p.min_tokens = integer(body, "min_tokens").value_or(0);
  if (p.min_tokens < 0) throw bad("min_tokens", "'min_tokens' must not be negative");
  if (body.contains("logit_bias") && !body["logit_bias"].is_null()) {
    const json& bias = body["logit_bias"];
    if (!bias.is_object()) throw bad("logit_bias", "'logit_bias' must be an object of token id -> bias");
    if (bias.size() > 300) throw bad("logit_bias", "'logit_bias' takes at most 300 tokens");
    for (const auto& [key, value] : bias.items()) {
      int64_t id = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id >= limits.vocab_size) {
        throw bad("logit_bias", "'logit_bias' key '" + key + "' is not a token id in [0, " +
                                    std::to_string(limits.vocab_size) + ")");
      }
      if (!value.is_number() || !std::isfinite(value.get<double>()) || std::abs(value.get<double>()) > 100) {
        throw bad("logit_bias", "'logit_bias' values must be numbers in [-100, 100]");
      }
      p.logit_bias.emplace_back(id, value.get<double>());
    }
  }
}

// Completions: "logprobs": N (null or absent: none). Chat: "logprobs": true/false and "top_logprobs": N.
void log_probabilities(const json& body, bool chat, SamplingParams& p) {
  constexpr int64_t kMax = 20;  // OpenAI's (and vLLM's default max_logprobs)
  if (chat) {
    p.logprobs = boolean(body, "logprobs");
    p.top_logprobs = integer(body, "top_logprobs").value_or(0);
    if (p.top_logprobs < 0 || p.top_logprobs > kMax) throw bad("top_logprobs", "'top_logprobs' must be in [0, 20]");
    if (p.top_logprobs > 0 && !p.logprobs) throw bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    return;
  }
  if (body.contains("logprobs") && !body["logprobs"].is_null()) {
    const std::optional<int64_t> n = integer(body, "logprobs");
    if (*n < 0 || *n > kMax) throw bad("logprobs", "'logprobs' must be in [0, 20]");
    p.logprobs = true;
    p.top_logprobs = *n;
  }
}

}  // namespace

std::string error_body(const std::string& message, const std::string& type, const std::string& param, int code) {
  json e = {{"message", message}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)}, {"code", code}};
  return json_text(json{{"error", e}});
}

std::string json_text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

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
  r.return_token_ids = boolean(body, "return_token_ids");
  if (r.return_token_ids && r.stream) {
    throw bad("return_token_ids", "'return_token_ids' is supported without 'stream' only");
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
  p.n = integer(body, "n").value_or(1);
  if (p.n < 1 || p.n > 64) throw bad("n", "'n' must be in [1, 64]");
  if (auto best_of = integer(body, "best_of"); best_of && *best_of != p.n) {
    throw bad("best_of", "'best_of' is not supported by this server (it may only equal 'n')");
  }
  require_default(body, "echo", [](const json& v) { return v == false; }, "no echo");
  logits_processing(body, limits, p.processing);
  log_probabilities(body, chat, p);
  require_default(body, "suffix", [](const json& v) { return v == ""; }, "no suffix");
  const json tools = chat ? checked_tools(body) : json(nullptr);
  r.structured = response_format(body);
  if (chat && !tools.is_null()) tool_choice(body, limits, tools, r);
  if (body.contains("user") && !body["user"].is_null() && !body["user"].is_string()) throw bad("user", "'user' must be a string");

  r.prompt_ids = chat ? chat_prompt(body, limits, tools) : completion_prompt(body, limits);
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
  if (p.processing.min_tokens > p.max_tokens) {
    throw bad("min_tokens", "'min_tokens' (" + std::to_string(p.processing.min_tokens) + ") must not exceed " + max_field +
                                " (" + std::to_string(p.max_tokens) + ")");
  }
  if (n + p.max_tokens > limits.max_model_len) {
    throw bad(max_field, "this model's maximum context length is " + std::to_string(limits.max_model_len) +
                             " tokens; the prompt has " + std::to_string(n) + " and " + max_field + " asks for " +
                             std::to_string(p.max_tokens) + " more");
  }
  return r;
}

namespace {
json utf8_bytes(const std::string& text) {
  json out = json::array();
  for (unsigned char c : text) out.push_back(static_cast<int>(c));
  return out;
}
}  // namespace

// OpenAI's tool_calls list; in a stream each call carries its index.
static json calls_json(const std::string& id, size_t choice, const ParsedToolCalls& parsed, bool stream) {
  json out = json::array();
  for (size_t k = 0; k < parsed.calls.size(); ++k) {
    json call = {{"id", "call_" + id + "_" + std::to_string(choice) + "_" + std::to_string(k)},
                 {"type", "function"},
                 {"function", {{"name", parsed.calls[k].name}, {"arguments", parsed.calls[k].arguments}}}};
    if (stream) call["index"] = k;
    out.push_back(call);
  }
  return out;
}

json logprobs_json(const ApiRequest& r, const std::vector<TokenLogprob>& logprobs, int64_t text_offset) {
  if (!r.params.logprobs) return nullptr;
  // Token texts may be partial UTF-8 (a byte-level token alone): dumped with replacement, as vLLM shows them.
  if (r.chat) {
    json content = json::array();
    for (const TokenLogprob& t : logprobs) {
      json top = json::array();
      for (const auto& [text, lp] : t.top) top.push_back({{"token", text}, {"logprob", lp}, {"bytes", utf8_bytes(text)}});
      content.push_back({{"token", t.text}, {"logprob", t.logprob}, {"bytes", utf8_bytes(t.text)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), token_logprobs = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprob& t : logprobs) {
    tokens.push_back(t.text);
    token_logprobs.push_back(t.logprob);
    if (r.params.top_logprobs == 0) {
      tops.push_back(nullptr);
    } else {
      json top = json::object();
      for (const auto& [text, lp] : t.top) top[text] = lp;
      tops.push_back(top);
    }
    offsets.push_back(text_offset);
    text_offset += static_cast<int64_t>(t.text.size());
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json completion_response(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model,
                         const std::vector<Choice>& choices, int64_t prompt_tokens, int64_t completion_tokens) {
  json out = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    json choice = {{"index", i}};
    std::string finish_reason = choices[i].finish_reason;
    if (r.parses_tool_calls()) {
      const ParsedToolCalls parsed = parsed_choice(r, choices[i]);
      choice["message"] = {{"role", "assistant"}, {"content", parsed.content.empty() && !parsed.calls.empty()
                                                                  ? json(nullptr) : json(parsed.content)}};
      if (!parsed.calls.empty()) {
        choice["message"]["tool_calls"] = calls_json(id, i, parsed, false);
        finish_reason = "tool_calls";
      }
    } else if (r.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", choices[i].text}};
    } else {
      choice["text"] = choices[i].text;
    }
    choice["logprobs"] = logprobs_json(r, choices[i].logprobs, 0);
    choice["finish_reason"] = finish_reason;
    if (r.return_token_ids) choice["token_ids"] = choices[i].token_ids;
    out.push_back(choice);
  }
  if (r.return_token_ids) {
    json o = {{"id", id}, {"object", r.chat ? "chat.completion" : "text_completion"}, {"created", created}, {"model", model},
              {"choices", out}, {"prompt_token_ids", r.prompt_ids},
              {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
                         {"total_tokens", prompt_tokens + completion_tokens}}}};
    return o;
  }
  return {{"id", id},
          {"object", r.chat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", out},
          {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
                     {"total_tokens", prompt_tokens + completion_tokens}}}};
}

json stream_chunk(const ApiRequest& r, const std::string& id, int64_t created, const std::string& model,
                  const std::string& text, const std::string& finish_reason, bool role_chunk,
                  const std::vector<TokenLogprob>& logprobs, int64_t text_offset, int64_t index) {
  json choice = {{"index", index}};
  if (r.chat) {
    json delta = json::object();
    if (role_chunk) delta["role"] = "assistant";
    if (role_chunk || !text.empty()) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = role_chunk ? json(nullptr) : logprobs_json(r, logprobs, text_offset);
  choice["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(finish_reason);
  return {{"id", id},
          {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({choice})}};
}

ParsedToolCalls parsed_choice(const ApiRequest& r, const Choice& choice) {
  if (r.structured.forces_tool_call()) return forced_tool_calls(r.structured, choice.text);
  return parse_tool_calls(r.tool_parser, choice.text);
}

json tool_calls_chunk(const ApiRequest& /*request: chat only*/, const std::string& id, int64_t created, const std::string& model, int64_t index,
                      const ParsedToolCalls& parsed, const std::string& finish_reason) {
  json delta = json::object();
  if (!parsed.content.empty()) delta["content"] = parsed.content;
  if (!parsed.calls.empty()) delta["tool_calls"] = calls_json(id, static_cast<size_t>(index), parsed, true);
  json choice = {{"index", index}, {"delta", delta}, {"logprobs", nullptr},
                 {"finish_reason", parsed.calls.empty() ? finish_reason : std::string("tool_calls")}};
  return {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
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
