// The tokenizer's one error type: a missing or unsupported file, model, component or template construct,
// named in the message.
#pragma once

#include <stdexcept>
#include <string>

namespace tokenizer {

struct Error : std::runtime_error {
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace tokenizer
