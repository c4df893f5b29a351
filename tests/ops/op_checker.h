// The op checker, in the spirit of PyTorch's DTensorConverter: runs an op sample under every combination of
// input placements (all of them on a 1-D mesh; a seeded sample of them on a 2-D mesh) and compares the
// DTensor result and gradients with the single-process ones. Free of gtest so that the coverage tool can
// print its results too.
#pragma once

#include <string>
#include <vector>

#include "dtensor/mesh/device_mesh.h"
#include "op_samples.h"

namespace dtensor::testing {

struct CheckResult {
  std::string sample;
  std::string mesh;          // "1-D (4)" or "2-D (2, 2)"
  int combinations = 0;
  int forward_ok = 0;
  int backward_ok = 0;       // among combinations with a differentiable input
  int refused = 0;           // clear "dtensor:" errors where the sample allows them
  std::vector<std::string> failures;  // "[Shard(dim=0)] x [Replicate()]: <what went wrong>"
  std::vector<std::string> placements_ok;  // the input placements that passed, for the coverage table
};

// Runs on this rank (inside run_ranks); every rank must call it with the same arguments.
CheckResult check_op(const OpSample& sample, const DeviceMesh& mesh, int max_combinations, uint64_t seed);

// Every sample on a 1-D mesh of 4 ranks (all combinations up to 64) and a 2x2 mesh (12 sampled), world 4
// as threads; rank 0's results, two rows per sample. On a "cuda" mesh the inputs move to the GPU and the
// results are compared with the same CPU reference.
// combos_1d, combos_2d: the most placement combinations checked per op on the 1-D mesh of 4 and on the 2x2 mesh
// (a seeded sample when an op has more).
std::vector<CheckResult> check_all_ops(const std::vector<OpSample>& samples, const std::string& device_type = "cpu",
                                       int combos_1d = 64, int combos_2d = 12);

}  // namespace dtensor::testing
