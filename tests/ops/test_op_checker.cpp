// Every covered op under every combination of input placements (world 4, 1-D mesh; a seeded sample on a
// 2x2 mesh): forward and gradients equal the single-process op. On the Gloo pass a smaller seeded sample (8 and 4
// combinations per op): the rules are the same code on either backend, and Gloo only carries their redistributions.
#include <gtest/gtest.h>

#include "harness/multi_rank.h"
#include "op_checker.h"

using namespace dtensor;
using namespace dtensor::testing;

TEST(OpChecker, EveryOpEveryPlacementCombination) {
  auto samples = op_samples();
  const bool gloo = on_gloo_pass();
  auto results = check_all_ops(samples, "cpu", gloo ? 8 : 64, gloo ? 4 : 12);
  int combos = 0, forward = 0, backward = 0, refused = 0;
  for (const auto& r : results) {
    combos += r.combinations;
    forward += r.forward_ok;
    backward += r.backward_ok;
    refused += r.refused;
    for (const auto& f : r.failures) ADD_FAILURE() << r.sample << " on " << r.mesh << ": " << f;
  }
  std::cout << "[op checker] " << samples.size() << " op samples, " << combos << " placement combinations: " << forward
            << " forward ok, " << backward << " backward ok, " << refused << " refused with a clear error" << std::endl;
}
