// A run's checkpoints, one per saved step, as torchtitan's CheckpointManager keeps them:
//
//   <dir>/step-00000100, <dir>/step-00000200, ...   each a dtensor::checkpoint directory (checkpoint.h)
//
// The trainer saves into step_checkpoint_path(dir, step); resuming, and every loader given such a directory
// (llama_generate --checkpoint, serve --checkpoint), takes latest_step_checkpoint(dir). Staging directories of a
// save in progress (".step-....partial") are never taken.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dtensor::checkpoint {

struct StepCheckpoint {
  int64_t step = 0;  // the steps done when it was saved
  std::string path;  // <dir>/step-00000100
};

std::string step_checkpoint_path(const std::string& dir, int64_t step);
// The committed step checkpoint with the largest step under `dir`; nullopt when there is none (or no `dir`).
std::optional<StepCheckpoint> latest_step_checkpoint(const std::string& dir);

}  // namespace dtensor::checkpoint
