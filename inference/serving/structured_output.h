// Structured output (vLLM's guided decoding through the OpenAI API): what a request's text is held to, from
//   response_format {"type": "json_object"}                          any JSON object
//   response_format {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}   JSON of that schema
//   tool_choice "required"          a JSON list of calls [{"name": one of the tools, "parameters": its schema}, ...]
//   tool_choice {"type": "function", "function": {"name": N}}   the arguments of N: JSON of its parameters' schema
// The grammar (inference/structured) masks each step's logits to the tokens that keep the text a prefix of a
// sentence; the end-of-sequence token comes once the text is complete, and a choice whose grammar admits nothing
// more ends there ("stop"). As vLLM's, the forced tool calls come back in message.tool_calls, finish_reason
// "tool_calls" (the text is parsed by the shape above, not by a --tool-call-parser).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "inference/serving/tool_parsers.h"
#include "inference/structured/grammar.h"
#include "inference/structured/token_mask.h"

namespace serve {

struct StructuredOutput {
  std::shared_ptr<const structured::Grammar> grammar;  // null: free text
  std::shared_ptr<structured::GrammarStates> states;   // the grammar's DFA for the mask, shared by the n choices
  std::string forced_tool;                             // "": none; "*": tool_choice "required"; else the function
  bool forces_tool_call() const { return !forced_tool.empty(); }
};

// response_format of a request (chat or completions; "text" or absent: none). Throws ApiError 400 naming
// response_format for a malformed value or a schema structured output does not support (the keyword named).
StructuredOutput response_format(const nlohmann::ordered_json& body);

// tool_choice "required" or a named function, given the request's checked tools (a list of {"type": "function",
// "function": {...}}). Throws ApiError 400 naming tool_choice (an unknown function, a malformed choice) or tools (a
// function's parameters that are no supported schema).
StructuredOutput forced_tool_choice(const nlohmann::ordered_json& choice, const nlohmann::ordered_json& tools);

// The calls in the text of a choice decoded under forced_tool_choice (the grammar made it well-formed; a text cut
// by max_tokens is not, and comes back as content).
ParsedToolCalls forced_tool_calls(const StructuredOutput& s, const std::string& text);

}  // namespace serve
