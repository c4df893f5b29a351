// The family registry: each llama/families/*.cpp registers its Family at load time (DTENSOR_REGISTER_FAMILY in
// llama/hf_config.h), so adding a family touches no list. Kept sorted by model_type: error messages and tests list
// the families in a stable order whatever the link order.
#include <algorithm>

#include "llama/hf_config.h"

namespace llama {
namespace {

std::vector<Family>& registry() {
  static std::vector<Family> families;
  return families;
}

}  // namespace

FamilyRegistration::FamilyRegistration(Family (*make)()) {
  std::vector<Family>& all = registry();
  all.push_back(make());
  std::sort(all.begin(), all.end(), [](const Family& a, const Family& b) { return a.model_type < b.model_type; });
}

const std::vector<Family>& all_families() { return registry(); }

}  // namespace llama
