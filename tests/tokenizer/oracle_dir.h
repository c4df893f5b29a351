// The tokenizer tests' oracle fixtures: a fresh temporary directory filled by `python SCRIPT make DIR`
// (tests/oracle/hf_*_oracle.py), offline and on one thread. Throws with the script's output when it fails.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "harness/subprocess.h"
#include "harness/temp_dir.h"

namespace tokenizer_testing {

inline std::string make_oracle_dir(const std::string& script, const std::string& prefix) {
  const std::string dir = dtensor::testing::temp_dir(prefix);  // dtensor_<prefix>_XXXXXX, removed at exit
  const auto made = dtensor::testing::run_process(
      {DTENSOR_PYTHON, std::string(DTENSOR_SOURCE_DIR) + "/tests/oracle/" + script, "make", dir},
      {{"OMP_NUM_THREADS", "1"}, {"RAYON_NUM_THREADS", "1"}, {"TOKENIZERS_PARALLELISM", "false"},
       {"HF_HUB_OFFLINE", "1"}, {"TRANSFORMERS_VERBOSITY", "error"}},
      600);
  if (made.exit_code != 0) throw std::runtime_error(script + " make failed:\n" + made.output);
  return dir;
}

}  // namespace tokenizer_testing
