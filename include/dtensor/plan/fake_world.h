// A world whose other ranks do not exist, for the plan dry run (dry_run.h).
#pragma once

#include <memory>

#include "dtensor/mesh/process_group.h"

namespace dtensor {

// Rank `rank` of a world of `size` ranks that do not exist: every group's backend is a fake one (as c10d's
// FakeProcessGroup) whose collectives complete at once without communicating and leave outputs correctly
// shaped (all_gather: the local input in every rank's slot; reduce_scatter: this rank's chunk of the input;
// all_reduce, broadcast: the tensor as it was). Collectives still pass the comm hooks, so they are counted
// as a real rank would issue them. Needs no store, no launcher and no peers (InitOptions::make_backend): the
// plan dry run builds a DeviceMesh of any shape over it. Not installed as the current world.
// What it cannot know: other ranks' sizes. An exchange of sizes (uneven shards) sees every rank as this one.
std::shared_ptr<World> fake_world(int size, int rank);

}  // namespace dtensor
