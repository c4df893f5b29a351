// JSON Schema to grammar (grammar.h): the text structured output may produce for response_format
// {"type": "json_schema", "json_schema": {"schema": S}} and {"type": "json_object"}, and for tool_choice
// "required" or a named function.
//
// Supported (anything else is a SchemaError naming the keyword and where it is, never ignored):
//   type (one or a list): object, array, string, integer, number, boolean, null
//   object: properties (generated in their order), required, additionalProperties false (properties not listed are
//           never generated, as OpenAI's strict mode); without properties: any members, of additionalProperties'
//           schema when it gives one
//   array:  items, minItems, maxItems;  string: minLength, maxLength (in characters)
//   enum, const, anyOf, allOf of one schema, $ref to #, #/$defs/NAME or #/definitions/NAME (recursion included)
//   annotations, ignored: title, description, default, examples, $schema, $id, $comment, deprecated, readOnly,
//   writeOnly
// What is generated: compact JSON with optional whitespace between tokens (none, a space, or a newline and up to 20
// spaces or tabs, as llama.cpp's), strings of valid UTF-8 (escapes: \" \\ \/ \b \f \n \r \t \uXXXX), integers of
// at most 16 digits, numbers with at most 16 fraction and 3 exponent digits: every value parses as a double / int64,
// and a random model cannot run on forever inside one number.
#pragma once

#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "inference/structured/grammar.h"

namespace structured {

struct SchemaError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// JSON text matching `schema` (ordered: its properties come in the order it lists them). `where` prefixes the errors' paths (e.g. "response_format.json_schema.schema").
Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const std::string& where = "schema");
// Any JSON object (response_format json_object).
Grammar json_object_grammar();

// Limits of what one schema may ask (each SchemaError past them): lengths and item counts, and the grammar's size.
constexpr int64_t kMaxRepeat = 4096;
constexpr size_t kMaxRules = 200000;

}  // namespace structured
