#include "llama/families/families.h"

namespace llama {

const std::vector<Family>& all_families() {
  static const std::vector<Family> all = {
      families::llama(),   families::mistral(), families::qwen2(),      families::qwen3(), families::gemma(),
      families::gemma2(),  families::gemma3(),  families::granite(),    families::starcoder2(),
      families::olmo(),    families::olmo2(),   families::cohere(),     families::cohere2(), families::phi3(),
      families::glm(),     families::mixtral(), families::qwen2_moe(),  families::qwen3_moe()};
  return all;
}

}  // namespace llama
