// Tool calls parsed back from a chat completion's text (vLLM's --tool-call-parser), for the formats the seeds'
// families are trained to emit:
//   hermes       Qwen2.5, Hermes:  [content] <tool_call>{"name": N, "arguments": {...}}</tool_call> (one or more)
//   llama3_json  Llama 3.1 / 3.2:  [<|python_tag|>]{"name": N, "parameters": {...}} (several joined by "; ")
//   mistral      Mistral:          [content] [TOOL_CALLS][{"name": N, "arguments": {...}}, ...]
// A text that does not hold a well-formed call of its format is plain content (as vLLM does), never an error.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace serve {

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object's text, as OpenAI's "function.arguments"
};

struct ParsedToolCalls {
  std::string content;  // the text outside the calls (trimmed); empty: none
  std::vector<ToolCall> calls;
};

// The parser names, in the order --help lists them.
const std::vector<std::string>& tool_parser_names();

// Parses `text` with the parser `name` (one of tool_parser_names(); throws std::invalid_argument otherwise).
ParsedToolCalls parse_tool_calls(const std::string& name, const std::string& text);

}  // namespace serve
