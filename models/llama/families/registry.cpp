#include "llama/families/families.h"

namespace llama {

const std::vector<Family>& all_families() {
  static const std::vector<Family> all = {families::llama(), families::mistral(), families::qwen2(), families::qwen3()};
  return all;
}

}  // namespace llama
