// The OpenAI API's requests and responses (the completions and chat completions endpoints, as vLLM and TGI
// serve them): parsing with every check a request needs before it is queued, and the JSON the server returns.
// A request that fails a check is an ApiError: HTTP 400 with OpenAI's error body, naming the field.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "inference/logits_processors.h"
#include "inference/serving/structured_output.h"
#include "inference/serving/tool_parsers.h"
#include "tokenizer/tokenizer.h"

namespace serve {

struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string param = "", std::string type = "invalid_request_error")
      : std::runtime_error(message), status(status), param(std::move(param)), type(std::move(type)) {}
  int status;
  std::string param, type;
};

// A response's JSON text. Text the model produced may end in an incomplete UTF-8 sequence (a byte-level token
// alone, the last bytes at max_tokens): replaced by U+FFFD, as transformers' decode does, never an exception.
std::string json_text(const nlohmann::ordered_json& j);

// {"error": {"message", "type", "param", "code"}}, OpenAI's.
std::string error_body(const std::string& message, const std::string& type, const std::string& param, int code);

struct SamplingParams {
  double temperature = 1.0;  // 0: greedy
  double top_p = 1.0;
  int64_t top_k = 0;  // 0: off (vLLM's extension; -1 is accepted for off too)
  int64_t max_tokens = 16;
  std::vector<std::string> stop;  // the text ends before the first of these; it is not returned
  std::optional<uint64_t> seed;
  bool ignore_eos = false;  // vLLM's: go on past the end-of-sequence token
  // logit_bias, min_tokens (vLLM's), repetition_penalty (vLLM's), frequency_penalty, presence_penalty
  // (inference/logits_processors.h; the end-of-sequence token is filled in by the serving loop).
  inference::LogitsProcessing processing;
  // Log-probabilities of each drawn token (of the model's raw logits, as vLLM's default "raw_logprobs") and of the
  // `top_logprobs` most likely tokens at its position. Completions: "logprobs": N; chat: "logprobs": true and
  // "top_logprobs": N. N in [0, 20].
  bool logprobs = false;
  int64_t top_logprobs = 0;
  int64_t n = 1;  // choices per request: n sequences of one prompt, sampled independently ([1, 64])
};

// One drawn token's log-probability and the most likely tokens at its position (most likely first).
struct TokenLogprob {
  int64_t token = 0;
  std::string text;  // the token decoded alone
  double logprob = 0;
  std::vector<std::pair<std::string, double>> top;
};

struct ApiRequest {
  bool chat = false;
  // Chat with `tools`: the tools go to the chat template; with tool_choice "auto" (the default when tools are
  // given; needs --enable-auto-tool-choice --tool-call-parser) the text is parsed for calls by `tool_parser`.
  std::string tool_parser;  // empty: the text is content
  // response_format, or tool_choice "required" / a named function: the grammar the text is held to
  // (structured_output.h); a forced call comes back in tool_calls.
  StructuredOutput structured;
  bool parses_tool_calls() const { return chat && (!tool_parser.empty() || structured.forces_tool_call()); }
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
  // vLLM's return_token_ids: each choice's generated ids ("token_ids", the end-of-sequence token included when it
  // ended the choice) and the prompt's ("prompt_token_ids"). Without stream only.
  bool return_token_ids = false;
  std::vector<int64_t> prompt_ids;
  SamplingParams params;
};

// What the server knows that a request is checked against.
struct ApiLimits {
  const tokenizer::Tokenizer* tokenizer = nullptr;
  std::string model_name;
  int64_t max_model_len = 0;  // prompt + max_tokens
  int64_t vocab_size = 0;     // the model's: prompt token ids below it
  int max_json_depth = 64;    // nesting of the body's arrays and objects, checked while parsing
  std::string tool_parser;    // --tool-call-parser with --enable-auto-tool-choice; empty: tool_choice "auto" refused
};

// Parses and checks a POST body. Throws ApiError (400) for malformed JSON (invalid UTF-8 included), nesting deeper
// than max_json_depth (refused while parsing: nothing deeper is ever built or walked), an unknown field, a wrong type, a
// value out of range (max_tokens < 1, temperature < 0, top_p outside (0, 1], ...), an unsupported option (n > 1,
// logprobs, ...), a model other than ours, or a prompt that does not fit max_model_len.
ApiRequest parse_request(const std::string& body, bool chat, const ApiLimits& limits);

// The response of a finished request, and the chunks of a streamed one (data: lines without the prefix).
// One choice of a finished request: its text, why it ended, and its tokens' logprobs (when asked for).
struct Choice {
  std::string text;
  std::string finish_reason;
  std::vector<TokenLogprob> logprobs;
  std::vector<int64_t> token_ids;  // the drawn tokens (return_token_ids)
};
// A chat choice whose text the request's tool parser reads: its content and calls ("tool_calls" finish).
ParsedToolCalls parsed_choice(const ApiRequest& request, const Choice& choice);
// A streamed chat choice with a tool parser, sent whole when it finishes: content and tool_calls deltas.
nlohmann::ordered_json tool_calls_chunk(const ApiRequest& request, const std::string& id, int64_t created,
                                        const std::string& model, int64_t index, const ParsedToolCalls& parsed,
                                        const std::string& finish_reason);
// The response of a finished request: choices[i] has "index" i.
nlohmann::ordered_json completion_response(const ApiRequest& request, const std::string& id, int64_t created,
                                           const std::string& model, const std::vector<Choice>& choices,
                                           int64_t prompt_tokens, int64_t completion_tokens);
// A chunk of choice `index`. finish_reason empty: an intermediate chunk; role_chunk: chat's first chunk ({"role":
// "assistant"}). `text_offset`: where the chunk's first token starts in the choice's text (completions' logprobs).
nlohmann::ordered_json stream_chunk(const ApiRequest& request, const std::string& id, int64_t created,
                                    const std::string& model, const std::string& text, const std::string& finish_reason,
                                    bool role_chunk = false, const std::vector<TokenLogprob>& logprobs = {},
                                    int64_t text_offset = 0, int64_t index = 0);
// The "logprobs" object of a choice: completions' {tokens, token_logprobs, top_logprobs, text_offset}, chat's
// {content: [{token, logprob, bytes, top_logprobs}]}; null when the request asked for none.
nlohmann::ordered_json logprobs_json(const ApiRequest& request, const std::vector<TokenLogprob>& logprobs,
                                     int64_t text_offset);
nlohmann::ordered_json usage_chunk(const ApiRequest& request, const std::string& id, int64_t created,
                                   const std::string& model, int64_t prompt_tokens, int64_t completion_tokens);

}  // namespace serve
